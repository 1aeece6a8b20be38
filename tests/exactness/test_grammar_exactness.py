"""Constrained generation under speculation: the grammar's greedy output is the model's
constrained greedy text whatever the method, and every sample is valid."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import METHOD_CASES, run, smollm2_llama, smollm2_tokenizer

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from lookahead.grammar import GrammarCompiler

EOS = 2
# Bounded: enums, booleans, fixed keys and a short array, so that a random model's
# constrained text ends within the token limit.
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue", "light grey"]},
        "size": {"enum": [1, 2, 3, 10]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 3},
        "inner": {"type": "object", "properties": {"x": {"type": "boolean"},
                                                   "y": {"enum": ["p", "q"]}},
                  "required": ["x", "y"], "additionalProperties": False},
    },
    "required": ["color", "size", "ok", "tags", "inner"],
    "additionalProperties": False,
}
EXAMPLE = {"color": "red", "size": 2, "ok": False, "tags": ["a", "bb"],
           "inner": {"x": True, "y": "p"}}
MAX_NEW = 120
METHODS = ["autoregressive", "lookahead", "prompt_lookup", "draft-other"]


@pytest.fixture(scope="module")
def setup():
    tokenizer = smollm2_tokenizer()
    model, other = smollm2_llama(seed=0), smollm2_llama(seed=1)
    grammar = GrammarCompiler(tokenizer, vocab_size=model.config.vocab_size,
                              stop_token_ids=[EOS]).json_schema(SCHEMA, any_whitespace=False)
    # JSON in the prompt: prompt lookup and lookahead find candidates to verify there.
    text = "Answer in JSON. " + json.dumps(EXAMPLE, separators=(",", ":")) * 2
    prompts = {"json": torch.tensor([tokenizer.encode(text)]),
               "plain": torch.tensor([tokenizer.encode("Describe a thing:")])}
    return tokenizer, model, {"self": model, "other": other}, grammar, prompts


def constrained_greedy(model, grammar, ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """One token at a time: the full forward pass, the allowed set from a matcher that has
    seen the generated tokens, the best allowed token."""
    generated: list[int] = []
    bitmask = xgr.allocate_token_bitmask(1, model.config.vocab_size)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            sequence = torch.cat([ids, torch.tensor([generated], dtype=torch.long)], dim=1)
            logits = model(sequence).logits[0, -1]
            matcher = xgr.GrammarMatcher(grammar.compiled)
            for token in generated:
                assert matcher.accept_token(token)
            matcher.fill_next_token_bitmask(bitmask)
            bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
            allowed = bits.reshape(-1)[: logits.shape[0]].bool()
            # The first of the best allowed tokens, as argmax breaks ties.
            token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
            generated.append(token)
            if token == EOS:
                break
    return generated


def check_valid(tokenizer, tokens: list[int]) -> None:
    """Text that ended on EOS parses and validates against the schema."""
    assert tokens[-1] == EOS, "the schema is bounded: generation ends by completing it"
    value = json.loads(tokenizer.decode(tokens[:-1]))
    jsonschema.validate(value, SCHEMA)


@pytest.mark.parametrize("prompt", ["json", "plain"])
def test_greedy_under_a_schema_is_the_constrained_greedy_text(setup, prompt):
    tokenizer, model, drafts, grammar, prompts = setup
    ids = prompts[prompt]
    expected = constrained_greedy(model, grammar, ids, MAX_NEW)
    check_valid(tokenizer, expected)
    accepted = 0
    for method in METHODS:
        result = run(model, ids, MAX_NEW, method, drafts, logits_processor=[grammar.processor()])
        tokens = result.new_tokens[0].tolist()
        assert tokens == expected, f"{method}: {tokenizer.decode(tokens)!r}"
        accepted += sum(result.stats.accepted_per_step)
    assert accepted > 0  # speculation verified candidates through the grammar
    with torch.no_grad():
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=MAX_NEW, logits_processor=[grammar.processor()])
    assert hf[0, ids.shape[1]:].tolist() == expected


@pytest.mark.parametrize("method", ["lookahead", "prompt_lookup"])
def test_every_sample_validates(setup, method):
    tokenizer, model, drafts, grammar, prompts = setup
    texts = set()
    for seed in range(2):
        result = run(model, prompts["json"], MAX_NEW, method, drafts, do_sample=True,
                     temperature=1.5, seed=seed, logits_processor=[grammar.processor()])
        tokens = result.new_tokens[0].tolist()
        check_valid(tokenizer, tokens)
        texts.add(tuple(tokens))
    assert len(texts) > 1  # the samples differ: the mask did not collapse the distribution


def test_method_case_names_exist():
    assert set(METHODS) <= set(METHOD_CASES)
