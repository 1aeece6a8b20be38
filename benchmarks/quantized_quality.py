"""Quality and memory of a GGUF model run three ways: de-quantised bfloat16 (the reference),
our default quantized path (``load_model`` of the GGUF: its linears kept as GGUF blocks) and
llama.cpp on the same file.

Quality: top-1 agreement of each engine's next-token predictions with the bfloat16 model's,
teacher-forced over the bench data sets' prompts followed by their reference texts (HumanEval's
canonical solutions, GSM8K's worked answers, MT-Bench's GPT-4 reference answers where it has
one), a few thousand positions in all. Memory: each engine runs in a process of its own,
which reports its peak RSS (Linux's VmHWM) after loading the model and after a short greedy
decode (before the teacher-forced passes, whose long inputs would hide what decoding needs).

The quantized path is what ``lookahead.load_model`` gives a GGUF model on the CPU
(``QuantLinear`` layers, float32 between them). llama.cpp runs through llama-cpp-python
(``logits_all``); without it its row says so.

    python benchmarks/quantized_quality.py --model smollm2-135m --tokens 3000 --threads 2 \\
        --out quality.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ENGINES = ("bfloat16", "quantized", "llamacpp")
DATASETS = ("humaneval", "gsm8k", "mtbench")
# Greedy tokens decoded before the decode-time RSS is read (few: the reference linears
# de-quantise the whole model at every step).
DECODE_TOKENS = 8


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a bundled name or .gguf path")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--tokens", type=int, default=3000, help="teacher-forced positions")
    parser.add_argument("--max-sequence", type=int, default=768, help="tokens per sequence")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--threads", type=int, default=None, help="threads of every engine")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--sequences", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def peak_rss_mb() -> float:
    """This process's peak resident set so far: Linux's VmHWM, which starts afresh with the
    program (``ru_maxrss`` keeps the peak of the parent a child was forked from)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------- the texts


def _rows(dataset: str) -> list[dict]:
    from lookahead.bench.datasets import BUNDLED_DATASETS, _dataset_file

    path = _dataset_file(BUNDLED_DATASETS[dataset])
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    if dataset == "mtbench":
        answers = path.parent / "reference_answer" / "gpt-4.jsonl"
        found = {}
        if answers.is_file():
            for line in answers.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                found[row["question_id"]] = row["choices"][0]["turns"][0]
        rows = [dict(row, answer=found[row["question_id"]]) for row in rows
                if row["question_id"] in found]
    return rows


def sequences(tokenizer, datasets: list[str], tokens: int, longest: int) -> list[list[int]]:
    """Prompt-plus-reference token sequences, taken from the data sets in turn, ``tokens``
    positions in all; each is cut to ``longest``."""
    from lookahead.models.load import chat_prompt

    made: dict[str, list[list[int]]] = {}
    for dataset in datasets:
        made[dataset] = []
        for row in _rows(dataset):
            if dataset == "humaneval":
                ids = tokenizer(row["prompt"] + row["canonical_solution"])["input_ids"]
            else:
                question = row["prompt"] if dataset == "gsm8k" else row["turns"][0]
                answer = row["upstream_answer"] if dataset == "gsm8k" else row["answer"]
                ids = chat_prompt(tokenizer, question)[0].tolist()
                ids += tokenizer(answer, add_special_tokens=False)["input_ids"]
            made[dataset].append(ids[:longest])
    chosen, total, index = [], 0, 0
    while total < tokens and any(index < len(items) for items in made.values()):
        for items in made.values():
            if index < len(items) and total < tokens:
                chosen.append(items[index][:tokens - total + 1])
                total += len(chosen[-1]) - 1
        index += 1
    return chosen


# ----------------------------------------------------------------------------- one engine


def _torch_engine(name: str, model_name: str, cache_dir):
    from lookahead.models.load import load_model

    if name == "bfloat16":
        model, _ = load_model(model_name, "bfloat16", cache_dir=cache_dir)
        return model, "de-quantised, bfloat16"
    # the default path of a GGUF model on the CPU: QuantLinear, float32 between the linears
    model, _ = load_model(model_name, cache_dir=cache_dir)
    return model, "QuantLinear (default quantized path), float32"


def run_child(args: argparse.Namespace) -> dict:
    """Load one engine, decode a little, predict every position; peak RSS at each stage."""
    import lookahead

    seqs = json.loads(args.sequences.read_text())
    started, base = time.perf_counter(), peak_rss_mb()
    report: dict = {"engine": args.child, "rss_start_mb": base}
    if args.child == "llamacpp":
        from lookahead.bench.llamacpp import BindingsEngine, gguf_of, have_bindings

        if not have_bindings():
            return report | {"skipped": "llama-cpp-python is not installed"}
        engine = BindingsEngine(gguf_of(args.model, args.cache_dir), [],
                                args.threads or torch.get_num_threads(), logits_all=True)
        report |= {"load_seconds": time.perf_counter() - started, "rss_load_mb": peak_rss_mb(),
                   "kind": "llama.cpp (llama-cpp-python)"}
        engine.measure(torch.tensor([seqs[0][:64]]), DECODE_TOKENS)
        report["rss_decode_mb"] = peak_rss_mb()
        predictions = [engine.prompt_logits(ids).argmax(-1).tolist() for ids in seqs]
    else:
        model, kind = _torch_engine(args.child, args.model, args.cache_dir)
        report |= {"load_seconds": time.perf_counter() - started, "rss_load_mb": peak_rss_mb(),
                   "kind": kind}
        lookahead.generate(model, torch.tensor([seqs[0][:64]]), DECODE_TOKENS, "autoregressive")
        report["rss_decode_mb"] = peak_rss_mb()
        with torch.inference_mode():
            predictions = [model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
                           for ids in seqs]
    report["rss_end_mb"] = peak_rss_mb()
    report["predictions"] = predictions
    return report


# ----------------------------------------------------------------------------- the parent


def run_parent(args: argparse.Namespace) -> dict:
    from lookahead.models.gguf_quantized import DequantisingLinear, load_quantized_model

    _, tokenizer = load_quantized_model(args.model, DequantisingLinear, cache_dir=args.cache_dir)
    seqs = sequences(tokenizer, args.datasets.split(","), args.tokens, args.max_sequence)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sequences.json"
        path.write_text(json.dumps(seqs))
        for engine in args.engines.split(","):
            out = Path(folder) / f"{engine}.json"
            command = [sys.executable, __file__, "--child", engine, "--model", args.model,
                       "--sequences", str(path), "--result", str(out)]
            command += ["--threads", str(args.threads)] if args.threads else []
            command += ["--cache-dir", args.cache_dir] if args.cache_dir else []
            subprocess.run(command, check=True)
            results[engine] = json.loads(out.read_text())
    reference = results.get("bfloat16", {}).get("predictions")
    for report in results.values():
        predictions = report.pop("predictions", None)
        if reference is not None and predictions is not None:
            same = sum(int(np.sum(np.equal(a[:-1], b[:-1])))
                       for a, b in zip(predictions, reference, strict=True))
            report["positions"] = sum(len(ids) - 1 for ids in seqs)
            report["top1_agreement"] = same / report["positions"]
    return {"model": args.model, "sequences": len(seqs), "threads": args.threads,
            "engines": results}


def table(results: dict) -> str:
    lines = [f"{results['model']}: {results['sequences']} sequences, "
             f"{results['threads'] or 'default'} threads", "",
             "| engine | kind | load s | peak RSS load MB | peak RSS decode MB | top-1 = bf16 |",
             "|---|---|--:|--:|--:|--:|"]
    for name, row in results["engines"].items():
        if "skipped" in row:
            lines.append(f"| {name} | skipped: {row['skipped']} | | | | |")
            continue
        agree = row.get("top1_agreement")
        lines.append(f"| {name} | {row['kind']} | {row['load_seconds']:.1f} | "
                     f"{row['rss_load_mb']:.0f} | {row['rss_decode_mb']:.0f} | "
                     + ("-" if agree is None else f"{agree:.1%} of {row['positions']}") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        args.result.write_text(json.dumps(run_child(args)))
        return 0
    results = run_parent(args)
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
