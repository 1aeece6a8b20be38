"""Why ``lookahead serve`` runs the model on its main thread: a forward pass on a second thread.

PyTorch's OpenMP (GNU libgomp) gives each thread that starts parallel work a team of its own.
Once two teams exist and there are more OpenMP threads than cores, libgomp spins far less
before a waiting worker sleeps, and every parallel region pays for waking it. Each case runs
in ``--processes`` fresh processes (a process's speed varies by itself, up to ~20 %) and times
a forward pass of ``--tokens`` tokens:

- main: load and run on the main thread;
- second thread: load on the main thread (no parallel work there), run on a second thread;
- second thread after main's pass: the same, after one forward pass on the main thread, as in
  the server once did (it loaded and packed the weights, parallel work, on the main thread
  and ran the engine on another).

    python benchmarks/openmp_threads.py --model smollm2-135m --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

CASES = ("main", "second thread", "second thread after main's pass")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per pass (default: 64)")
    parser.add_argument("--passes", type=int, default=20, help="timed passes (default: 20)")
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes per case (default: 3)")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # in the child
    return parser.parse_args(argv)


def time_passes(model, args) -> float:
    """Median ms of a forward pass of ``args.tokens`` tokens."""
    import torch

    ids = torch.randint(0, 1000, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    seconds = []
    with torch.inference_mode():
        for index in range(args.passes + 3):  # 3 to warm up
            started = time.perf_counter()
            model(ids)
            if index >= 3:
                seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


def run_case(args) -> float:
    """This process's case; returns its median ms."""
    import torch

    import lookahead

    torch.set_num_threads(args.threads)
    model, _ = lookahead.load_model(args.model, "bfloat16")
    if args.case == "main":
        return time_passes(model, args)
    if args.case == "second thread after main's pass":
        with torch.inference_mode():
            model(torch.zeros(1, args.tokens, dtype=torch.long))
    result = {}
    thread = threading.Thread(target=lambda: result.update(ms=time_passes(model, args)))
    thread.start()
    thread.join()
    return result["ms"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.case:
        print(json.dumps({"ms": run_case(args)}))
        return 0
    print(f"{args.model} bf16, {args.threads} threads, median ms of a forward pass of "
          f"{args.tokens} tokens, in {args.processes} fresh processes per case (in turn)\n")
    child = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads),
             "--tokens", str(args.tokens), "--passes", str(args.passes), "--case"]
    ms: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.processes):
        for case in CASES:
            out = subprocess.run(child + [case], capture_output=True, text=True,
                                 check=True).stdout
            ms[case].append(json.loads(out.splitlines()[-1])["ms"])
    print("| case | ms in each process | median |\n|---|---|--:|")
    for case, values in ms.items():
        print(f"| {case} | {', '.join(f'{v:.1f}' for v in values)} | "
              f"{statistics.median(values):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
