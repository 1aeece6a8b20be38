"""Two commits of lookahead in one process, alternating prompt by prompt: speed and texts.

    python benchmarks/ab_commits.py --old fbdde05 --new HEAD --model smollm2-135m \
        --dataset humaneval --limit 10 --max-new-tokens 128 --methods autoregressive,lookahead

Each commit's ``src/`` is checked out into a temporary folder and imported in turn; each keeps
its own modules (``sys.modules``' ``lookahead.*`` entries are swapped in before each of its
calls, so imports made inside functions find that commit's code) and its own loaded model.
For every prompt and method the two commits run one after the other, the first of the pair
alternating, so that the machine's drift falls on both alike. Prints per method the tok/s of
each commit, their ratio and whether every text was the same.

Both commits share one process's transformers: the attention implementation registered last
under a name serves both, which is right only where the two commits' attention code is the
same (check ``git diff OLD NEW -- src/lookahead/kernels``).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def checkout(commit: str, folder: Path) -> Path:
    """``commit``'s tree written into ``folder`` (git archive, no worktree left behind)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


class Tree:
    """One commit's ``lookahead`` package, imported from ``src``, and its loaded model."""

    def __init__(self, src: Path, model_name: str) -> None:
        for name in [n for n in sys.modules if n == "lookahead" or n.startswith("lookahead.")]:
            del sys.modules[name]
        sys.path.insert(0, str(src))
        try:
            self.package = importlib.import_module("lookahead")
            self.generate_fn = self.package.generate  # its module imported now, from ``src``
            self.model, self.tokenizer = self.package.load_model(model_name)
        finally:
            sys.path.remove(str(src))
        self.modules = {n: m for n, m in sys.modules.items()
                        if n == "lookahead" or n.startswith("lookahead.")}

    def activate(self) -> None:
        """Make this commit's modules the ones ``import lookahead...`` finds."""
        for name in [n for n in sys.modules if n == "lookahead" or n.startswith("lookahead.")]:
            if name not in self.modules:
                del sys.modules[name]
        sys.modules.update(self.modules)

    def generate(self, ids, max_new_tokens: int, method: str):
        self.activate()
        start = time.perf_counter()
        result = self.generate_fn(self.model, ids, max_new_tokens, method=method,
                                  do_sample=False)
        seconds = time.perf_counter() - start
        self.modules = {n: m for n, m in sys.modules.items()  # with those imported on the way
                        if n == "lookahead" or n.startswith("lookahead.")}
        return seconds, result.new_tokens[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default="autoregressive,lookahead")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as old_dir, tempfile.TemporaryDirectory() as new_dir:
        trees = {"old": Tree(checkout(args.old, Path(old_dir)), args.model),
                 "new": Tree(checkout(args.new, Path(new_dir)), args.model)}
        trees["new"].activate()
        from lookahead.bench.datasets import encode_prompt, load_prompts

        prompts = load_prompts(args.dataset, limit=args.limit)
        tokenizer = trees["new"].tokenizer
        rows = {(m, side): [] for m in args.methods.split(",") for side in trees}
        same = {m: True for m in args.methods.split(",")}
        for index, prompt in enumerate(prompts):
            ids = encode_prompt(tokenizer, prompt)
            for method in args.methods.split(","):
                order = ("old", "new") if index % 2 == 0 else ("new", "old")
                outs = {side: trees[side].generate(ids, args.max_new_tokens, method)
                        for side in order}
                for side, (seconds, tokens) in outs.items():
                    rows[method, side].append((seconds, len(tokens)))
                same[method] &= outs["old"][1] == outs["new"][1]
            print(f"prompt {index + 1}/{len(prompts)} done", flush=True)
    for method in args.methods.split(","):
        speed = {side: sum(n for _, n in rows[method, side]) / sum(s for s, _ in rows[method, side])
                 for side in trees}
        ratios = [o[0] / n[0] for o, n in zip(rows[method, "old"], rows[method, "new"])]
        print(f"{method}: old {speed['old']:.1f} tok/s, new {speed['new']:.1f} tok/s, "
              f"new/old {speed['new'] / speed['old']:.3f} (per-prompt median "
              f"{statistics.median(ratios):.3f}), identical texts: {same[method]}")


if __name__ == "__main__":
    main()
