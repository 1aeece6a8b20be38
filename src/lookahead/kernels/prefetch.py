"""How far ahead of its reads the quantized kernel asks for the weights: measured per CPU.

``QuantLinear`` asks memory for the records ``ahead`` bytes before it multiplies them (the
kernel's ``kAhead`` note): to L1, or, where ``near`` is not 0, to L2 there and to L1 only
``near`` bytes ahead (``kNear``). Which reads fastest depends on the CPU and on the model's
layer sizes. On an Intel Xeon (family 6, model 167; 2026-12-07, 2 threads) the 196 linears
of Qwen2.5-Coder-1.5B Q4_K_M took 37.8 ms for one token row at 2048 bytes to L1, 46.6 ms at
the kernel's 4096, and 33.9 ms at 4096 to L2 and 512 to L1, while SmolLM2-135M's took 4.1 ms
at 4096 against 4.5 ms at 2048 (docs/quantized-kernel.md). So the first load of a quantized
model on a CPU times passes of one and of two rows through all of its linears at each of
``SETTINGS`` (alternating, the fastest of a few rounds: about 4 s for the 1.5B model), keeps
the first listed within 2 % of the fastest (``TOLERANCE``), and caches the choice per model,
CPU, thread count and kernel build in ``<cache_dir>/prefetch/<model>-<cpu>-<threads>t-<isa>.json``;
later loads read it. The results are the same bits at every setting; only the speed changes.

Weights that fit in the caches (under ``MEASURED_BYTES``) are not measured: they are read
from there, whatever the distance, and keep the kernel's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lookahead import cache_files
from lookahead.kernels.quant_linear import QuantLinear, cpu_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prefetch:
    """Where the kernel asks for the records: ``ahead`` bytes on, to L1 where ``near`` is 0,
    else to L2 there and to L1 ``near`` bytes on (``0 <= near < ahead``, or both 0)."""

    ahead: int
    near: int = 0

    def __post_init__(self) -> None:
        for name in ("ahead", "near"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected a whole number of bytes >= 0, "
                                 f"got {value!r}")
        if self.near and self.near >= self.ahead:
            raise ValueError(f"near: expected fewer bytes than ahead ({self.ahead}), "
                             f"got {self.near}")

    def __str__(self) -> str:
        return f"{self.ahead}" if not self.near else f"{self.ahead} to L2, {self.near} to L1"


# What the first load times, the first listed kept among the fastest (TOLERANCE): L1 alone
# at 1 to 4 KiB (the kernel's own 4096 among them, so that the choice is never one it would
# not have made by itself but for the timings), then L2 far and L1 near. Where a step's records
# are asked for as non-temporal (``QuantLinear.nontemporal``, AMD), ``near`` is not used.
SETTINGS = (Prefetch(1024), Prefetch(2048), Prefetch(3072), Prefetch(4096),
            Prefetch(3072, 512), Prefetch(4096, 512), Prefetch(8192, 1024))
# Token rows a timed pass has: plain decoding's one, and the two a lookahead step feeds on
# text where little is accepted (where the base's speed is most of the result).
ROWS = (1, 2)
ROUNDS = 5  # timed, after one to warm up
# Seconds after which no further round starts (at least two are timed): a busy machine.
BUDGET = 5.0
# Smaller models are read from the caches after the first pass and not measured.
MEASURED_BYTES = 32 << 20
# The first setting within this fraction of the fastest is kept: timed alone, the linears of
# Qwen2.5-Coder-1.5B read as fast at 2 and 3 KiB to L1 (88.3 against 89.4 ms for passes of
# one and two rows), but decoding, where attention and Python run between them, was 4 %
# faster at 2 KiB (19.2 against 18.4 tok/s, 4 chat-mix prompts; docs/quantized-kernel.md):
# fewer lines in flight leave more of the caches to the rest of the pass.
TOLERANCE = 0.02
VERSION = 2
# The source of a setting that was not measured (small weights, or no kernel).
KERNEL_DEFAULT = "the kernel's default"


def quant_layers(model: torch.nn.Module) -> list[QuantLinear]:
    """``model``'s ``QuantLinear`` layers that run on the compiled kernel, in module order."""
    return [m for m in model.modules() if isinstance(m, QuantLinear) and m.isa is not None]


def prefetch_of(model: torch.nn.Module) -> Prefetch | None:
    """Where ``model``'s quantized layers ask for their records (the first one's), or None
    where it has none on the kernel."""
    layers = quant_layers(model)
    return Prefetch(layers[0].ahead, layers[0].near) if layers else None


def set_prefetch(model: torch.nn.Module, setting: Prefetch) -> None:
    """Make every quantized layer of ``model`` ask for its records as ``setting`` says (ahead
    0: not at all); the fused layers take their kernel calls again."""
    if not isinstance(setting, Prefetch):
        raise ValueError(f"setting: expected a Prefetch, got {setting!r}")
    layers = quant_layers(model)
    _apply(layers, setting)
    if layers:  # fused layers take ``kernel_call()`` again after ``_apply``
        model.to(layers[0].records.device)


def _apply(layers: Sequence[QuantLinear], setting: Prefetch) -> None:
    for layer in layers:
        layer.ahead, layer.near = setting.ahead, setting.near


def measure_prefetch(layers: Sequence[QuantLinear], settings: Sequence[Prefetch] = SETTINGS,
                     rows: Sequence[int] = ROWS, rounds: int = ROUNDS, budget: float = BUDGET,
                     clock: Callable[[], float] = time.perf_counter) -> dict:
    """Time passes through ``layers`` (each called once on random rows [k, in_features], k in
    ``rows``) at each prefetch setting, the settings in turn within each round, and return
    ``dict(setting=the one kept, seconds={setting: its time})``: a setting's time is the sum
    over ``rows`` of its fastest round (another job only ever adds time), and the one kept
    the first of ``settings`` within ``TOLERANCE`` of the fastest."""
    if not layers:
        raise ValueError("layers: expected at least one QuantLinear on the compiled kernel")
    if not settings or any(not isinstance(p, Prefetch) for p in settings):
        raise ValueError(f"settings: expected Prefetch settings, got {list(settings)!r}")
    before = [Prefetch(layer.ahead, layer.near) for layer in layers]
    inputs = {k: {layer.in_features: torch.randn(k, layer.in_features) for layer in layers}
              for k in rows}
    best = {(p, k): float("inf") for p in settings for k in rows}
    started = clock()
    try:
        with torch.inference_mode():
            for round_ in range(rounds + 1):  # the first warms up
                if round_ > 2 and clock() - started > budget:
                    break
                for p in settings:
                    _apply(layers, p)
                    for k in rows:
                        start = clock()
                        for layer in layers:
                            layer(inputs[k][layer.in_features])
                        if round_:
                            best[p, k] = min(best[p, k], clock() - start)
    finally:
        for layer, setting in zip(layers, before):
            _apply([layer], setting)
    seconds = {p: sum(best[p, k] for k in rows) for p in settings}
    fastest = min(seconds.values())
    kept = next(p for p in settings if seconds[p] <= fastest * (1 + TOLERANCE))
    return dict(setting=kept, seconds=seconds)


def prefetch_path(model_name: str, cpu: str, threads: int, isa: str, cache_dir) -> Path:
    """``<cache_dir>/prefetch/<model>-<cpu>-<threads>t-<isa>.json``."""
    name = "-".join(cache_files.safe_name(part, "x") for part in (model_name, cpu))
    return (Path(cache_dir).expanduser() / "prefetch"
            / f"{name}-{threads}t-{cache_files.safe_name(isa, 'x')}.json")


def choose_prefetch(model: torch.nn.Module, cache_dir, cpu: str | None = None,
                    threads: int | None = None) -> tuple[Prefetch | None, str]:
    """Set ``model``'s quantized layers to this CPU's fastest prefetch setting: read from the
    cache, else measured now (``measure_prefetch``) and cached. Returns ``(setting,
    source)``: ``"measured: <file>"``, or (None, ``KERNEL_DEFAULT``) where the model has no
    layer on the kernel or weights small enough to stay in the caches."""
    layers = quant_layers(model)
    size = sum(layer.records.numel() for layer in layers)
    if size < MEASURED_BYTES:
        return None, KERNEL_DEFAULT
    cpu = cpu_name() if cpu is None else cpu
    threads = torch.get_num_threads() if threads is None else threads
    described = dict(version=VERSION, model=str(model.name_or_path), layers=len(layers),
                     bytes=size, cpu=cpu, threads=threads, isa=layers[0].isa)
    path = prefetch_path(str(model.name_or_path) or f"unnamed-{size}", cpu, threads,
                         layers[0].isa, cache_dir)
    setting = _read_choice(path, described)
    if setting is None:
        started = time.perf_counter()
        measured = measure_prefetch(layers)
        setting = measured["setting"]
        logger.info("measured the prefetch setting in %.1f s: %s (%s)",
                    time.perf_counter() - started, setting,
                    "; ".join(f"{p}: {s * 1e3:.1f} ms" for p, s in measured["seconds"].items()))
        _write_choice(path, described | dict(ahead=setting.ahead, near=setting.near, seconds={
            str(p): s for p, s in measured["seconds"].items()}))
    set_prefetch(model, setting)
    return setting, f"measured: {path}"


def _read_choice(path: Path, described: dict) -> Prefetch | None:
    """The setting cached at ``path`` if it is there, readable and chosen as ``described``."""
    if not path.is_file():
        return None
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        setting = Prefetch(cached["ahead"], cached["near"])
    except (OSError, ValueError, TypeError, KeyError) as error:
        logger.warning("measuring again: the cached prefetch setting %s cannot be read (%s)",
                       path, error)
        return None
    if any(cached.get(key) != value for key, value in described.items()):
        return None  # another model, build or version: measured again
    return setting


def _write_choice(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically; a read-only cache only logs a warning."""
    try:
        cache_files.write_json(path, record)
    except OSError as error:
        logger.warning("could not cache the prefetch setting in %s (%s)", path, error)
