"""lookahead.grammar: the grammar processor's masks at every node of a candidate tree."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from tiny import SMOLLM2_VOCAB, smollm2_tokenizer

from lookahead.attention import TokenTree
from lookahead.controls import Controls

xgr = pytest.importorskip("xgrammar")

from lookahead.grammar import GrammarCompiler, GrammarLogitsProcessor

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                  "required": ["ok"], "additionalProperties": False},
    },
    "required": ["color", "tags", "inner"],
    "additionalProperties": False,
}
VALID = {"color": "green", "tags": ["a", "b"], "inner": {"ok": True}}
EOS = 2
PROMPT = [1, 30, 31, 32]


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, vocab_size=SMOLLM2_VOCAB, stop_token_ids=[EOS])


@pytest.fixture(scope="module")
def schema_grammar(compiler):
    return compiler.json_schema(SCHEMA, any_whitespace=False)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def allowed_after(grammar, generated: list[int]) -> set[int]:
    """The allowed next tokens after ``generated``, from a matcher that saw nothing else."""
    matcher = xgr.GrammarMatcher(grammar.compiled)
    for token in generated:
        if not matcher.accept_token(token):
            return {EOS}  # the processor's rule for a rejected sequence
    if matcher.is_terminated():
        return {EOS}
    bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(torch.nonzero(bits.reshape(-1)[: grammar.vocab_size]).flatten().tolist())


def finite(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row)).flatten().tolist())


def test_every_tree_node_gets_the_mask_of_its_own_sequence(tokenizer, schema_grammar):
    """Steps of candidate trees (valid branches, a branch through a forbidden token, a branch
    past the committed text) over one processor: each node's row allows exactly what a
    fresh matcher allows after that node's sequence, and committing a path that was not the
    last one visited leaves the state right."""
    valid = encode(tokenizer, json.dumps(VALID, separators=(",", ":"))) + [EOS]
    bad = encode(tokenizer, "xyz")[0]
    controls = Controls([schema_grammar.processor()])
    generator = torch.Generator().manual_seed(0)
    committed, live = 0, 0
    for accept in (1, 3, 2, 4, 1, 5, 100):
        context = PROMPT + valid[:committed]
        rest = valid[committed:] + [EOS, EOS]
        candidates = [rest[:5], rest[:2] + [bad, rest[2]], [bad] + rest[:2], rest[:1] + [EOS, 7],
                      rest[:1] + [rest[2]]]
        tree = TokenTree(context[-1], candidates)
        logits = torch.randn(len(tree), SMOLLM2_VOCAB, generator=generator, dtype=torch.float64)
        scores = controls.scores(context, tree, logits)
        paths = [[]]
        for node in range(1, len(tree)):
            paths.append(paths[tree.parents[node]] + [tree.tokens[node]])
        for node, path in enumerate(paths):
            expected = allowed_after(schema_grammar, context[len(PROMPT):] + path)
            assert finite(scores[node]) == expected, f"node {node}, path {path}"
            kept = scores[node][sorted(expected)]
            assert torch.equal(kept, logits[node, sorted(expected)].float())
            live += expected != {EOS}
        committed = min(committed + accept, len(valid) - 1)
    assert live > 30  # most nodes are inside the grammar: the masks are not the dead rows'
    assert committed == len(valid) - 1  # the walk reached the end of the text


def test_a_complete_grammar_allows_only_the_stop_tokens(tokenizer, schema_grammar):
    processor = schema_grammar.processor(prompt_length=len(PROMPT))
    text = encode(tokenizer, json.dumps(VALID, separators=(",", ":")))
    scores = processor(torch.tensor([PROMPT + text]), torch.zeros(1, SMOLLM2_VOCAB))
    assert finite(scores[0]) == {EOS}
    assert schema_grammar.matches(text) and schema_grammar.matches(text + [EOS])
    assert not schema_grammar.matches(text[:-1])
    # After the stop token (or through a forbidden token) nothing but the stop tokens.
    scores = processor(torch.tensor([PROMPT + text + [EOS, 5]]), torch.zeros(1, SMOLLM2_VOCAB))
    assert finite(scores[0]) == {EOS}


def test_batch_rows_and_copies_follow_their_own_text(tokenizer, schema_grammar):
    """Rows of one call are separate sequences; ``copy.copy`` (a batch row's processor)
    starts afresh and shares no state with the original."""
    text = encode(tokenizer, json.dumps(VALID, separators=(",", ":")))
    processor = schema_grammar.processor()
    ids = torch.tensor([PROMPT + text[:3], [9, 9, 9, 9] + text[:1] + [text[5]] * 2])
    scores = processor(ids[:, :4], torch.zeros(2, SMOLLM2_VOCAB))  # the prompts: fixes length
    assert finite(scores[0]) == finite(scores[1]) == allowed_after(schema_grammar, [])
    scores = processor(ids, torch.zeros(2, SMOLLM2_VOCAB))
    assert finite(scores[0]) == allowed_after(schema_grammar, text[:3])
    assert finite(scores[1]) == allowed_after(schema_grammar, ids[1, 4:].tolist())
    clone = copy.copy(processor)
    assert isinstance(clone, GrammarLogitsProcessor) and clone._tokens == []
    scores = clone(torch.tensor([PROMPT[:2]]), torch.zeros(1, SMOLLM2_VOCAB))
    assert finite(scores[0]) == allowed_after(schema_grammar, [])
    processor.reset()
    scores = processor(torch.tensor([PROMPT[:1]]), torch.zeros(1, SMOLLM2_VOCAB))
    assert finite(scores[0]) == allowed_after(schema_grammar, [])


def test_ebnf_regex_and_json_mode_masks(tokenizer, compiler):
    """Every allowed first token of a grammar starts a text of its language."""
    cases = {
        "ebnf": (compiler.ebnf('root ::= "yes" | "no" | "maybe " [0-9]'), ("yes", "no", "maybe")),
        "regex": (compiler.regex(r"(cat|dog)s?"), ("cat", "dog")),
        "json": (compiler.json(), ("{",)),
    }
    for name, (grammar, starts) in cases.items():
        scores = grammar.processor()(torch.tensor([PROMPT]), torch.zeros(1, SMOLLM2_VOCAB))
        allowed = finite(scores[0])
        assert allowed, name
        for token in allowed:
            piece = tokenizer.decode([token]).lstrip() if name == "json" else tokenizer.decode(
                [token])
            assert any(s.startswith(piece) or piece.startswith(s) for s in starts), (name, piece)
        assert grammar.matches(encode(tokenizer, starts[0] + ("s" if name == "regex" else
                                                              "" if name != "json" else "}")))


def test_response_format(compiler):
    assert compiler.response_format(None) is None
    assert compiler.response_format({"type": "text"}) is None
    assert compiler.response_format({"type": "json_object"}) is not None
    grammar = compiler.response_format({"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "boolean"}},
                                "required": ["a"]}, "strict": True}})
    tokenizer = smollm2_tokenizer()
    assert grammar.matches(encode(tokenizer, '{"a": true}'))
    assert not grammar.matches(encode(tokenizer, '{"a": 1}'))
    for bad, word in [({"type": "xml"}, "response_format.type"), ("json", "response_format"),
                      ({"type": "json_schema", "json_schema": {"schema": 3}}, "json_schema")]:
        with pytest.raises(ValueError, match=word):
            compiler.response_format(bad)


def test_bad_arguments_are_named(tokenizer, compiler, schema_grammar):
    with pytest.raises(ValueError, match="schema must be a JSON object"):
        compiler.json_schema("[1, 2")
    with pytest.raises(ValueError, match="cannot compile the EBNF grammar"):
        compiler.ebnf("root ::= undefined_rule")
    with pytest.raises(ValueError, match="pattern must be a non-empty string"):
        compiler.regex("")
    with pytest.raises(ValueError, match="stop_token_ids"):
        GrammarCompiler(tokenizer, stop_token_ids=[])
    processor = schema_grammar.processor()
    with pytest.raises(ValueError, match="vocab_size=49152"):
        processor(torch.tensor([PROMPT]), torch.zeros(1, 100))
    processor(torch.tensor([PROMPT]), torch.zeros(1, SMOLLM2_VOCAB))
    with pytest.raises(ValueError, match="reset"):
        processor(torch.tensor([PROMPT[:2]]), torch.zeros(1, SMOLLM2_VOCAB))


def test_wider_logits_mask_the_ids_past_the_vocabulary(compiler):
    """A model's logits may be wider than the tokenizer (Qwen2.5: 151936 rows): the extra ids
    are never allowed."""
    grammar = compiler.json()
    scores = grammar.processor()(torch.tensor([PROMPT]), torch.zeros(1, SMOLLM2_VOCAB + 64))
    assert finite(scores[0]) and max(finite(scores[0])) < SMOLLM2_VOCAB


def test_missing_library_names_the_install(monkeypatch, tokenizer):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ImportError, match=r"pip install 'lookahead-exact\[structured\]'"):
        GrammarCompiler(tokenizer)
