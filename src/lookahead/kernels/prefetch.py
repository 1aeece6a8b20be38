"""How far ahead of its reads the quantized kernel asks for the weights: measured per CPU.

``QuantLinear`` asks memory for the records ``ahead`` bytes before it multiplies them (the
kernel's ``kAhead`` note). Which distance reads fastest depends on the CPU and on the model's
layer sizes. On an Intel Xeon (family 6, model 167; 2026-12-07, 2 threads) the 196 linears of
Qwen2.5-Coder-1.5B Q4_K_M took 39.6 ms for one token row at 2048 bytes against 48.1 ms at
the kernel's 4096, while SmolLM2-135M's took 4.1 ms at 4096 against 4.5 ms at 2048
(docs/quantized-kernel.md). So the first load of a quantized model on a CPU times passes of
one and of two rows through all of its linears at each of ``DISTANCES`` (alternating, the
fastest of a few rounds: about 2 s for the 1.5B model), keeps the shortest distance within
2 % of the fastest (``TOLERANCE``), and caches
the choice per model, CPU, thread count and kernel build in
``<cache_dir>/prefetch/<model>-<cpu>-<threads>t-<isa>.json``; later loads read it. The
results are the same bits at every distance; only the speed changes.

Weights that fit in the caches (under ``MEASURED_BYTES``) are not measured: they are read
from there, whatever the distance, and keep the kernel's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from lookahead import cache_files
from lookahead.kernels.quant_linear import QuantLinear, cpu_name

logger = logging.getLogger(__name__)

# Bytes ahead the first load times; the kernel's own 4096 among them, so that the choice is
# never one it would not have made by itself but for the timings.
DISTANCES = (1024, 2048, 3072, 4096)
# Token rows a timed pass has: plain decoding's one, and the two a lookahead step feeds on
# text where little is accepted (where the base's speed is most of the result).
ROWS = (1, 2)
ROUNDS = 5  # timed, after one to warm up
# Seconds after which no further round starts (at least two are timed): a busy machine.
BUDGET = 4.0
# Smaller models are read from the caches after the first pass and not measured.
MEASURED_BYTES = 32 << 20
# The shortest distance within this fraction of the fastest is kept: timed alone, the linears
# of Qwen2.5-Coder-1.5B read as fast at 2 and 3 KiB (88.3 against 89.4 ms for passes of one
# and two rows), but decoding, where attention and Python run between them, was 4 % faster
# at 2 KiB (19.2 against 18.4 tok/s, 4 chat-mix prompts; docs/quantized-kernel.md): fewer
# lines in flight leave more of the caches to the rest of the pass.
TOLERANCE = 0.02
VERSION = 1
# The source of a distance that was not measured (small weights, or no kernel).
KERNEL_DEFAULT = "the kernel's default"


def quant_layers(model: torch.nn.Module) -> list[QuantLinear]:
    """``model``'s ``QuantLinear`` layers that run on the compiled kernel, in module order."""
    return [m for m in model.modules() if isinstance(m, QuantLinear) and m.isa is not None]


def prefetch_of(model: torch.nn.Module) -> int | None:
    """The bytes ahead ``model``'s quantized layers ask for their records (the first one's),
    or None where it has none on the kernel."""
    layers = quant_layers(model)
    return layers[0].ahead if layers else None


def set_prefetch(model: torch.nn.Module, distance: int) -> None:
    """Make every quantized layer of ``model`` ask for its records ``distance`` bytes ahead
    (0: not at all); the fused layers take their kernel calls again."""
    if not isinstance(distance, int) or isinstance(distance, bool) or distance < 0:
        raise ValueError(f"distance: expected a whole number of bytes >= 0, got {distance!r}")
    layers = quant_layers(model)
    for layer in layers:
        layer.ahead = distance
    if layers:  # fused layers take ``kernel_call()`` again after ``_apply``
        model.to(layers[0].records.device)


def measure_distance(layers: Sequence[QuantLinear], distances: Sequence[int] = DISTANCES,
                     rows: Sequence[int] = ROWS, rounds: int = ROUNDS, budget: float = BUDGET,
                     clock: Callable[[], float] = time.perf_counter) -> dict:
    """Time passes through ``layers`` (each called once on random rows [k, in_features], k in
    ``rows``) at each prefetch distance, the distances in turn within each round, and return
    ``dict(distance=the fastest, seconds={distance: its time})``: a distance's time is the
    sum over ``rows`` of its fastest round (another job only ever adds time), and the one
    kept the shortest within ``TOLERANCE`` of the fastest."""
    if not layers:
        raise ValueError("layers: expected at least one QuantLinear on the compiled kernel")
    if not distances or any(not isinstance(d, int) or d < 0 for d in distances):
        raise ValueError(f"distances: expected byte counts >= 0, got {list(distances)!r}")
    before = [layer.ahead for layer in layers]
    inputs = {k: {layer.in_features: torch.randn(k, layer.in_features) for layer in layers}
              for k in rows}
    best = {(d, k): float("inf") for d in distances for k in rows}
    started = clock()
    try:
        with torch.inference_mode():
            for round_ in range(rounds + 1):  # the first warms up
                if round_ > 2 and clock() - started > budget:
                    break
                for d in distances:
                    for layer in layers:
                        layer.ahead = d
                    for k in rows:
                        start = clock()
                        for layer in layers:
                            layer(inputs[k][layer.in_features])
                        if round_:
                            best[d, k] = min(best[d, k], clock() - start)
    finally:
        for layer, ahead in zip(layers, before):
            layer.ahead = ahead
    seconds = {d: sum(best[d, k] for k in rows) for d in distances}
    fastest = min(seconds.values())
    kept = min(d for d in distances if seconds[d] <= fastest * (1 + TOLERANCE))
    return dict(distance=kept, seconds=seconds)


def prefetch_path(model_name: str, cpu: str, threads: int, isa: str, cache_dir) -> Path:
    """``<cache_dir>/prefetch/<model>-<cpu>-<threads>t-<isa>.json``."""
    name = "-".join(cache_files.safe_name(part, "x") for part in (model_name, cpu))
    return (Path(cache_dir).expanduser() / "prefetch"
            / f"{name}-{threads}t-{cache_files.safe_name(isa, 'x')}.json")


def choose_prefetch(model: torch.nn.Module, cache_dir, cpu: str | None = None,
                    threads: int | None = None) -> tuple[int | None, str]:
    """Set ``model``'s quantized layers to this CPU's fastest prefetch distance: read from the
    cache, else measured now (``measure_distance``) and cached. Returns ``(distance,
    source)``: ``"measured: <file>"``, or (None, ``KERNEL_DEFAULT``) where the model has no
    layer on the kernel or weights small enough to stay in the caches."""
    layers = quant_layers(model)
    size = sum(layer.records.numel() for layer in layers)
    if size < MEASURED_BYTES:
        return None, KERNEL_DEFAULT
    cpu = cpu_name() if cpu is None else cpu
    threads = torch.get_num_threads() if threads is None else threads
    setting = dict(version=VERSION, model=str(model.name_or_path), layers=len(layers),
                   bytes=size, cpu=cpu, threads=threads, isa=layers[0].isa)
    path = prefetch_path(str(model.name_or_path) or f"unnamed-{size}", cpu, threads,
                         layers[0].isa, cache_dir)
    distance = _read_choice(path, setting)
    if distance is None:
        started = time.perf_counter()
        measured = measure_distance(layers)
        distance = measured["distance"]
        logger.info("measured the prefetch distance in %.1f s: %d bytes (%s)",
                    time.perf_counter() - started, distance,
                    ", ".join(f"{d}: {s * 1e3:.1f} ms" for d, s in measured["seconds"].items()))
        _write_choice(path, setting | dict(distance=distance, seconds={
            str(d): s for d, s in measured["seconds"].items()}))
    set_prefetch(model, distance)
    return distance, f"measured: {path}"


def _read_choice(path: Path, setting: dict) -> int | None:
    """The distance cached at ``path`` if it is there, readable and chosen in ``setting``."""
    if not path.is_file():
        return None
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        distance = cached["distance"]
        if not isinstance(distance, int) or isinstance(distance, bool) or distance < 0:
            raise ValueError(f"distance {distance!r}")
    except (OSError, ValueError, TypeError, KeyError) as error:
        logger.warning("measuring again: the cached prefetch distance %s cannot be read (%s)",
                       path, error)
        return None
    if any(cached.get(key) != value for key, value in setting.items()):
        return None  # another model, build or version: measured again
    return distance


def _write_choice(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically; a read-only cache only logs a warning."""
    try:
        cache_files.write_json(path, record)
    except OSError as error:
        logger.warning("could not cache the prefetch distance in %s (%s)", path, error)
