"""What the quantized kernel costs for k token rows: every linear of Qwen2.5-Coder-1.5B Q4_K_M
(28 layers x q, k, v, o, gate, up, down; not attention, not the output head) as QuantLinear,
timed for k rows in alternating rounds, medians; and, with --baselines, what PyTorch's own
int8 / int4 / bfloat16 products cost for one 8960 x 1536 layer.

    PYTHONPATH=$PWD/src python -m lookahead install-model qwen2.5-coder-1.5b   # once
    PYTHONPATH=$PWD/src python benchmarks/quant_linear_cost.py --rounds 7
    PYTHONPATH=$PWD/src python benchmarks/quant_linear_cost.py --baselines --rounds 7

The memory floor is the packed records' bytes over --bandwidth (GB/s); llama.cpp's small-batch
curve (1.0 / 1.5 / 2.4 / 5.1 times one row for 1 / 2 / 4 / 8 rows, llama-bench on this CPU)
is printed beside ours. On a shared machine the timings are noisy: read the medians with the
spread printed beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from lookahead.kernels.quant_linear import QuantLinear

GGUF = Path.home() / ".cache" / "lookahead" / "gguf" / "qwen2.5-coder-1.5b.gguf"
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LLAMA_CPP = {1: 1.0, 2: 1.5, 4: 2.4, 8: 5.1}


def load_linears(path: Path, layers: int | None, **kwargs) -> list[QuantLinear]:
    """Every layer's seven linears as QuantLinear, in the model's order."""
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    count = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    modules = []
    for layer in range(count if layers is None else layers):
        for name in LINEARS:
            t = tensors[f"blk.{layer}.{name}.weight"]
            bias = tensors.get(f"blk.{layer}.{name}.bias")
            modules.append(QuantLinear(
                torch.from_numpy(np.array(t.data)), int(t.tensor_type), int(t.shape[0]),
                None if bias is None else torch.from_numpy(np.array(bias.data)), **kwargs))
    return modules


def time_rounds(run, rows: list, rounds: int, repeat: int, cpu: dict | None = None
                ) -> dict:
    """ms per call of run(k) for each k, rows taken in turn within each round; the
    process's CPU ms per call go to ``cpu`` (on a busy machine, wall time waits for others)."""
    times: dict = {k: [] for k in rows}
    for _ in range(rounds):
        for k in rows:
            run(k)   # warm: caches, threads
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(repeat):
                run(k)
            times[k].append((time.perf_counter() - start) / repeat * 1e3)
            if cpu is not None:
                cpu.setdefault(k, []).append((time.process_time() - start_cpu) / repeat * 1e3)
    return times


def model_cost(args: argparse.Namespace) -> None:
    modules = load_linears(args.gguf, args.layers)
    size = sum(m.records.numel() for m in modules)
    floor = size / args.bandwidth / 1e6
    inputs = {k: {m.in_features: torch.randn(k, m.in_features) for m in modules}
              for k in args.rows}

    def run(key: tuple[int, int]) -> None:
        k, tile = key
        for m in modules:
            m.tile = tile
            m(inputs[k][m.in_features])

    keys = [(k, tile) for tile in args.tiles for k in args.rows]
    cpu: dict = {}
    times = time_rounds(run, keys, args.rounds, args.repeat, cpu)
    print(f"{len(modules)} linears, {size / 2**30:.3f} GiB packed, floor {floor:.1f} ms at "
          f"{args.bandwidth:g} GB/s; {torch.get_num_threads()} threads, "
          f"{modules[0].extra_repr().split(', ')[-1]}; {args.rounds} rounds")
    print(" tile rows  median ms  (min - max)     x 1 row  llama.cpp  CPU ms")
    for k, tile in keys:
        med = statistics.median(times[k, tile])
        one = statistics.median(times[args.rows[0], tile])
        ref = f"{LLAMA_CPP[k]:.1f}" if k in LLAMA_CPP else ""
        print(f"{tile:5d} {k:4d}  {med:9.1f}  ({min(times[k, tile]):6.1f} - "
              f"{max(times[k, tile]):6.1f})  {med / one:7.2f}  {ref:>9s}  "
              f"{statistics.median(cpu[k, tile]):6.1f}")


def baselines(args: argparse.Namespace) -> None:
    """PyTorch's CPU products for one [8960, 1536] weight, k rows of float32."""
    torch.manual_seed(0)
    out, width, group = 8960, 1536, 32
    w = torch.randn(out, width) * 0.02
    linear = torch.nn.Linear(width, out, bias=False)
    linear.weight.data = w.clone()
    dynamic = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)
    scale8 = w.abs().amax(1) / 127
    w8 = torch.round(w / scale8[:, None]).to(torch.int8)
    grouped = w.reshape(out, -1, group)
    low, high = grouped.amin(-1), grouped.amax(-1)
    scale4 = (high - low).clamp(min=1e-8) / 15
    q4 = torch.round((grouped - low[..., None]) / scale4[..., None]).clamp(0, 15)
    q4 = q4.to(torch.int32).reshape(out, width)
    # torch's convention: w = (q - 8) * scale + zero
    scales_zeros = torch.stack([scale4.t(), (low + 8 * scale4).t()], -1).contiguous()
    packed4 = torch._convert_weight_to_int4pack_for_cpu(q4, 1)
    wb = w.bfloat16()
    cases = {
        "bfloat16 F.linear": lambda x: torch.nn.functional.linear(x.bfloat16(), wb),
        "float32 F.linear": lambda x: torch.nn.functional.linear(x, w),
        "dynamic int8 (FBGEMM)": dynamic,
        "_weight_int8pack_mm": lambda x: torch._weight_int8pack_mm(
            x.bfloat16(), w8, scale8.bfloat16()),
        "_weight_int4pack_mm_for_cpu g32": lambda x: torch._weight_int4pack_mm_for_cpu(
            x.bfloat16(), packed4, group, scales_zeros.bfloat16()),
    }
    raw = torch.from_numpy(_q4k_blocks(w))
    cases["QuantLinear Q4_K"] = QuantLinear(raw, 12, width)
    inputs = {k: torch.randn(k, width) for k in args.rows}
    print(f"[{out}, {width}] weight, {torch.get_num_threads()} threads, rows {args.rows}: "
          f"ms per call (median of {args.rounds} rounds), x 1 row, CPU ms per call")
    for name, fn in cases.items():
        cpu: dict = {}
        times = time_rounds(lambda k, fn=fn: fn(inputs[k]), args.rows, args.rounds,
                            args.repeat * 4, cpu)
        med = [statistics.median(times[k]) for k in args.rows]
        print(f"{name:32s}" + "".join(f" {v:7.3f}" for v in med) + "  x"
              + " ".join(f"{v / med[0]:.2f}" for v in med) + "  CPU"
              + "".join(f" {statistics.median(cpu[k]):.3f}" for k in args.rows))


def _q4k_blocks(w: torch.Tensor) -> np.ndarray:
    """A Q4_K tensor of w's shape from the real model's first gate rows (gguf.quants cannot
    quantize Q4_K): the cost depends on the shape, not on the values."""
    import gguf

    reader = gguf.GGUFReader(GGUF)
    gate = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    return np.array(gate.data)[: w.shape[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=GGUF)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 6, 8, 12])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tiles", type=int, nargs="+", default=[0],
                        help="rows per weight read to try (0: the kernel's default)")
    parser.add_argument("--repeat", type=int, default=3, help="passes per timing")
    parser.add_argument("--layers", type=int, default=None, help="only the first layers")
    parser.add_argument("--bandwidth", type=float, default=33.0, help="GB/s for the floor")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--baselines", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    baselines(args) if args.baselines else model_cost(args)


if __name__ == "__main__":
    main()
