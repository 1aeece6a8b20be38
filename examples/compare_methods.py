"""One prompt, every method: speed, tokens per forward pass, and whether the output is that of
``model.generate`` (greedy). Draft-model decoding uses the target itself as its own draft here
(the only bundled pair is the Qwen one): every draft is accepted, so it shows the mechanics
and the tokens per step, not a speed-up.

Run:  python examples/compare_methods.py [--max-new-tokens 128]
"""

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

import lookahead

PROMPT = '''def bubble_sort(items: list[int]) -> list[int]:
    """Sort items in place with bubble sort and return them.

    >>> bubble_sort([3, 1, 2])
    [1, 2, 3]
    """
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    model, tokenizer = lookahead.load_model(args.model, dtype=args.dtype)
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    runs = {
        "autoregressive": {},
        "lookahead": {"window": 7, "ngram": 5, "guess": 7},
        "prompt_lookup": {"num_draft_tokens": 10},
        "draft (itself)": {"draft_model": model, "num_draft_tokens": 4},
    }

    def hf_generate(max_new_tokens: int) -> torch.Tensor:
        mask = torch.ones_like(input_ids)
        return model.generate(
            input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False
        )

    hf_generate(4)  # warm up once: first calls pay for one-off allocations
    started = time.perf_counter()
    reference = hf_generate(args.max_new_tokens)
    hf_speed = (reference.shape[1] - input_ids.shape[1]) / (time.perf_counter() - started)

    table = Table(title=f"{args.model} ({args.dtype}), {args.max_new_tokens} new tokens, greedy")
    for column in ("method", "tokens/s", "speed-up", "tokens/step", "same as model.generate"):
        table.add_column(column)
    table.add_row("model.generate", f"{hf_speed:.1f}", "1.00x", "1.00", "-")
    for label, options in runs.items():
        method = label.split()[0]
        lookahead.generate(model, input_ids, 4, method, **options)  # warm-up
        result = lookahead.generate(model, input_ids, args.max_new_tokens, method, **options)
        stats = result.stats
        same = torch.equal(result.sequences, reference)
        table.add_row(
            label,
            f"{stats.tokens_per_second:.1f}",
            f"{stats.tokens_per_second / hf_speed:.2f}x",
            f"{stats.tokens_per_step:.2f}",
            "yes" if same else "no",
        )
    console = Console()
    console.print(table)
    console.print(
        "Greedy output should be model.generate's, token for token. In bfloat16 a forward pass "
        "over several tokens can round a near-tie the other way; --dtype float32 makes that rare."
    )


if __name__ == "__main__":
    main()
