"""The serving engine in-process (no HTTP): tokens/s by method, concurrency and step budget.

    python benchmarks/loadtest_engine.py --model smollm2-135m --concurrency 1,8 \
        --budgets 16,64 --methods lookahead,autoregressive --requests 8 --max-tokens 128

Each cell submits ``--requests`` HumanEval prompts, ``concurrency`` at a time (a new one as soon
as any one ends), greedy, and prints completion tokens / wall seconds and the mean time to first
token. Also checks that every output equals ``lookahead.generate`` alone when ``--check``.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time

import lookahead
from lookahead.api import make_decoder
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.server.engine import Engine, EngineConfig, FinishEvent


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def run_cell(engine, model, prompts, method, concurrency, requests, max_tokens):
    """Keep ``concurrency`` requests running: a new one as soon as any one ends."""
    done: queue.Queue = queue.Queue()

    def wait(i, handle):
        done.put((i, next(e for e in handle.events(timeout=600) if isinstance(e, FinishEvent))))

    pending, active, results = list(range(requests)), 0, []
    start = time.perf_counter()
    while pending or active:
        while pending and active < concurrency:
            i = pending.pop(0)
            handle = engine.submit(make_decoder(model, prompts[i % len(prompts)], max_tokens, method))
            threading.Thread(target=wait, args=(i, handle), daemon=True).start()
            active += 1
        results.append(done.get())
        active -= 1
    seconds = time.perf_counter() - start
    tokens = sum(f.completion_tokens for _, f in results)
    ttft = sum(f.stats.time_to_first_token for _, f in results) / len(results)
    tps = sum(f.stats.tokens_per_step for _, f in results) / len(results)
    return tokens / seconds, ttft, tps, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--concurrency", type=_ints, default=[1, 8])
    parser.add_argument("--budgets", type=_ints, default=[64])
    parser.add_argument("--methods", default="lookahead,autoregressive")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--check", action="store_true", help="compare with generate alone")
    args = parser.parse_args()
    model, tokenizer = lookahead.load_model(args.model, dtype=args.dtype)
    prompts = [encode_prompt(tokenizer, p) for p in load_prompts(args.dataset, args.requests)]
    print(f"{'method':>15} {'budget':>6} {'conc':>4} {'tok/s':>7} {'TTFT ms':>8} {'tok/step':>8}")
    for budget in args.budgets:
        engine = Engine(model, tokenizer, EngineConfig(step_token_budget=budget)).start()
        engine.submit(make_decoder(model, prompts[0], 8, "autoregressive"))  # warm-up
        for method in args.methods.split(","):
            for concurrency in args.concurrency:
                tps, ttft, per_step, results = run_cell(
                    engine, model, prompts, method, concurrency, args.requests, args.max_tokens
                )
                print(
                    f"{method:>15} {budget:>6} {concurrency:>4} {tps:7.1f} {ttft * 1e3:8.0f} "
                    f"{per_step:8.2f}",
                    flush=True,
                )
                if args.check:
                    for i, finish in results:
                        alone = lookahead.generate(
                            model, prompts[i % len(prompts)], args.max_tokens, method
                        )
                        same = alone.new_tokens[0].tolist() == finish.token_ids
                        print(f"    request {i}: {'identical' if same else 'DIFFERENT'}")
        engine.stop()


if __name__ == "__main__":
    main()
