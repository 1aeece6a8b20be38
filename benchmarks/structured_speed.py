"""Structured output against plain output, per method: tok/s and the grammar's cost per token.

    python benchmarks/structured_speed.py --model smollm2-135m --prompts 4 --max-new-tokens 96

Each prompt asks for a JSON object; every method decodes it greedily twice, plain and under a
JSON schema (``lookahead.grammar``, compact JSON), alternating which goes first. Prints per
method the tok/s of both, their ratio, tokens per step, and the grammar processor's own time
per generated token (``Controls`` calls it once per verified tree node).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import lookahead
from lookahead.grammar import GrammarCompiler
from lookahead.models.load import chat_prompt

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "rating": {"enum": ["good", "bad", "unknown"]}},
    "required": ["title", "year", "tags", "rating"], "additionalProperties": False}
QUESTIONS = ["Describe a famous film as JSON.", "Describe a classic novel as JSON.",
             "Describe a well-known album as JSON.", "Describe a video game as JSON.",
             "Describe a painting as JSON.", "Describe a TV series as JSON."]


class Timed:
    """A logits processor wrapped to add up the seconds it takes."""

    def __init__(self, inner, tally: Timed | None = None) -> None:
        self.inner, self.seconds, self.tally = inner, 0.0, tally

    def __copy__(self):  # Controls copies each processor per row: keep one tally
        return Timed(copy.copy(self.inner), self)

    def __call__(self, input_ids, scores):
        start = time.perf_counter()
        out = self.inner(input_ids, scores)
        (self.tally or self).seconds += time.perf_counter() - start
        return out


def run(model, ids, method: str, max_new_tokens: int, grammar) -> tuple[float, int, int, float]:
    """(seconds, new tokens, steps, seconds in the grammar processor)."""
    processor = Timed(grammar.processor()) if grammar is not None else None
    start = time.perf_counter()
    result = lookahead.generate(model, ids, max_new_tokens, method=method, do_sample=False,
                                logits_processor=[processor] if processor else None)
    seconds = time.perf_counter() - start
    return (seconds, result.stats.new_tokens, result.stats.steps,
            processor.seconds if processor else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--methods", default="autoregressive,lookahead,prompt_lookup")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = lookahead.load_model(args.model)
    compiler = GrammarCompiler(tokenizer, vocab_size=model.config.vocab_size,
                               stop_token_ids=lookahead.request.eos_token_ids(model))
    grammar = compiler.json_schema(SCHEMA, any_whitespace=False)
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS[: args.prompts]]
    methods = args.methods.split(",")
    totals = {(m, g): [0.0, 0, 0, 0.0] for m in methods for g in (False, True)}
    run(model, prompts[0], methods[0], 8, grammar)  # warm-up: first calls allocate
    for index, ids in enumerate(prompts):
        for method in methods:
            for constrained in ((False, True) if index % 2 == 0 else (True, False)):
                out = run(model, ids, method, args.max_new_tokens,
                          grammar if constrained else None)
                totals[method, constrained] = [a + b for a, b in
                                               zip(totals[method, constrained], out)]
    for method in methods:
        plain, json_ = totals[method, False], totals[method, True]
        print(f"{method}: plain {plain[1] / plain[0]:.1f} tok/s ({plain[1] / plain[2]:.2f} "
              f"tokens/step), JSON schema {json_[1] / json_[0]:.1f} tok/s ({json_[1] / json_[2]:.2f}"
              f" tokens/step), ratio {(json_[1] / json_[0]) / (plain[1] / plain[0]):.2f}; "
              f"grammar {json_[3] / json_[1] * 1e3:.2f} ms per token")


if __name__ == "__main__":
    main()
