"""Linear layers that keep a GGUF file's quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) and multiply them by integer dot products in a
small compiled kernel (``csrc/quant_linear.cpp``).

Decoding is bound by reading the weights: Qwen2.5-Coder-1.5B Q4_K_M is 1.04 GiB, a third of
its bfloat16 size. The kernel reads each weight once per pass and multiplies it into up to
``rows`` token rows, so checking a few guessed tokens costs little more than decoding one
(``docs/quantized-kernel.md`` has the figures).

Activations are quantized per row to int8, one scale per GGUF block (256 inputs for the
K-types and IQ4_XS, 32 for the others), as llama.cpp does; the weights are GGUF's exact
values. Each row's result does not depend on the rows beside it, and ``reference`` (PyTorch,
no compiled code) gives the kernel's bits.

The kernel is compiled on first use with PyTorch's C++ extension builder (a C++ compiler and
``ninja``; the build is cached in PyTorch's extensions folder), in an AVX512-VNNI build where
the CPU has it and an AVX2 build otherwise. Where neither can run, :func:`quant_kernel_problem`
says why and :class:`QuantLinear` computes the same values in PyTorch, slowly.
"""

from __future__ import annotations

import functools
import logging
import platform
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from lookahead.kernels.build import compile_kernel

from lookahead.kernels import quant_formats
from lookahead.kernels.quant_formats import FORMATS

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "quant_linear.cpp"
# included by SOURCE: the instruction-set traits and the kernels for blocks of 256
HEADERS = (SOURCE.parent / "quant_isa.h", SOURCE.parent / "quant_blocks.h")
ISA_FLAGS = {
    "avx512vnni": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c"],
    "avx2": ["-mavx2", "-mf16c"],
}


def supported_qtypes() -> frozenset[int]:
    """The ``gguf.GGMLQuantizationType`` values QuantLinear takes."""
    return frozenset(FORMATS)


def _cpu_features() -> dict[str, bool]:
    """The CPU's instruction sets as numpy detects them (empty when it cannot say)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__  # numpy 2
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__  # numpy 1
        except ImportError:
            return {}
    return dict(__cpu_features__)


def cpuinfo_field(name: str) -> str:
    """The first non-empty value of the field ``name`` ("model name", "vendor_id") in
    /proc/cpuinfo, or "" where there is none (not Linux, say)."""
    return cpuinfo_fields(name)[0]


def cpuinfo_fields(*names: str) -> tuple[str, ...]:
    """``cpuinfo_field`` of each of ``names``, from one read of /proc/cpuinfo."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in names and key not in found and value.strip():
                    found[key] = value.strip()
                    if len(found) == len(set(names)):
                        break
    except OSError:
        pass
    return tuple(found.get(name, "") for name in names)


# Cached: each request prices its steps on a curve named by it, and the CPU does not change.
@functools.cache
def cpu_name() -> str:
    """This CPU's name ("AMD EPYC 9R14 (family 25, model 17)"): /proc/cpuinfo's "model name",
    "cpu family" and "model" on Linux (``cpu_label``), else what ``platform`` says of the
    processor."""
    name, family, model = cpuinfo_fields("model name", "cpu family", "model")
    return cpu_label(name or platform.processor() or platform.machine() or "cpu", family, model)


def cpu_label(name: str, family: str = "", model: str = "") -> str:
    """``name`` with the CPU's family and model where known: a virtual machine often names
    different CPUs alike ("Intel(R) Xeon(R) Processor" for models 167 and 207), and what
    was measured on one (step costs, the prefetch distance) must not be taken for the other."""
    known = [f"{field} {value}" for field, value in (("family", family), ("model", model))
             if value]
    return f"{name} ({', '.join(known)})" if known else name


# Cached: every QuantLinear of a model asks, and /proc/cpuinfo runs long on a large machine.
@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor as the CPU names itself ("GenuineIntel", "AuthenticAMD"):
    /proc/cpuinfo's ``vendor_id`` on Linux, else what ``platform`` says ("" when neither)."""
    return cpuinfo_field("vendor_id") or next(
        (v for v in ("GenuineIntel", "AuthenticAMD") if v in platform.processor()), "")


def nontemporal_default(vendor: str | None = None) -> bool:
    """Whether the kernel asks for the weights it reads once a pass (a decoding step's) as
    non-temporal (``prefetchnta``) on a CPU of ``vendor`` (None: this one's).

    Not on an Intel CPU: there the hint keeps the records out of L2, and a one-token pass of
    Qwen2.5-Coder-1.5B Q4_K_M took 64 ms against 47 ms fetched as usual (Xeon, Emerald
    Rapids, 2 threads). Elsewhere yes: on an AMD EPYC (Zen 4) a gigabyte of weights fetched
    as usual pushed the rest of the pass out of the caches, and the hint was never slower
    (docs/quantized-kernel.md). Either way the results are the same bits.
    """
    return (cpu_vendor() if vendor is None else vendor) != "GenuineIntel"


def best_isa() -> str:
    """'avx512vnni' or 'avx2': the kernel build this CPU runs best.

    Raises:
        RuntimeError: when the CPU has neither (not x86-64, or older than AVX2).
    """
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        raise RuntimeError(f"the quantized kernel needs an x86-64 CPU; this is {machine}")
    features = _cpu_features()
    if all(features.get(f) for f in ("AVX512F", "AVX512BW", "AVX512VL", "AVX512VNNI", "F16C")):
        return "avx512vnni"
    if all(features.get(f) for f in ("AVX2", "FMA3", "F16C")):
        return "avx2"
    raise RuntimeError("the quantized kernel needs AVX2, FMA and F16C; numpy finds "
                       f"{sorted(f for f, on in features.items() if on) or 'neither'}")


# Cached: the build is per process anyway (a loaded extension stays imported), and every
# QuantLinear of a model asks for it.
@functools.cache
def load_quant_kernel(isa: str | None = None) -> ModuleType:
    """Compile (first time) or load the kernel built for ``isa`` (None: :func:`best_isa`).

    Raises:
        RuntimeError: when this CPU cannot run it or the build fails (no compiler, say).
        ValueError: for an ``isa`` not in ``ISA_FLAGS``.
    """
    isa = best_isa() if isa is None else isa
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa: expected one of {sorted(ISA_FLAGS)}, got {isa!r}")
    logger.info("loading the %s quantized kernel (compiled on first use, about half a minute)", isa)
    # -ffp-contract=off: no fused multiply-adds, so the float steps round as the reference's
    return compile_kernel(f"lookahead_quant_linear_{isa}", [SOURCE],
                          ["-O3", "-ffp-contract=off", *ISA_FLAGS[isa]], headers=HEADERS)


def quant_kernel_problem(isa: str | None = None) -> str | None:
    """Why the compiled quantized kernel cannot run here, or None when it can."""
    try:
        load_quant_kernel(isa)
    except (RuntimeError, OSError, ImportError) as error:
        return f"the quantized kernel cannot run here ({error})"
    return None


class QuantLinear(torch.nn.Module):
    """``y = x @ W.T + b`` for W kept as GGUF blocks.

    Args:
        raw: uint8 [out_features, row_bytes], the GGUF tensor's rows as stored in the file
            (row_bytes = in_features / block_size * type_size).
        qtype: a ``gguf.GGMLQuantizationType`` value in :func:`supported_qtypes`.
        in_features: the inputs per row.
        bias: float [out_features] or None.
        kernel: None: the compiled kernel where it runs, else PyTorch (logged once per
            layer); True: the compiled kernel or RuntimeError saying why not; False: PyTorch.
        isa: the kernel build, 'avx512vnni' or 'avx2' (None: the best this CPU runs).
        tile: rows multiplied per weight read, 1 to the build's ``rows`` (0: its default).
        records: the packed records of this same ``raw`` from an earlier ``QuantLinear``
            (``.records``): skips the repacking, which takes about half a minute for a 1.5B
            model (:mod:`lookahead.models.quantized` caches them).
        nontemporal: ask for the records a decoding step reads once as non-temporal (None:
            :func:`nontemporal_default`, by the CPU's vendor); the speed changes, the bits
            do not.
    """

    def __init__(self, raw: torch.Tensor, qtype: int, in_features: int,
                 bias: torch.Tensor | None = None, *, kernel: bool | None = None,
                 isa: str | None = None, tile: int = 0,
                 records: torch.Tensor | None = None, nontemporal: bool | None = None) -> None:
        super().__init__()
        qtype = int(qtype)
        if qtype not in FORMATS:
            names = ", ".join(f"{f.name} ({t})" for t, f in sorted(FORMATS.items()))
            raise ValueError(f"qtype: expected one of {names}, got {qtype}")
        fmt = FORMATS[qtype]
        if not (isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and raw.dim() == 2):
            raise ValueError("raw: expected a uint8 tensor [out_features, row_bytes], got "
                             f"{getattr(raw, 'dtype', type(raw))} {tuple(getattr(raw, 'shape', ()))}")
        if in_features <= 0 or in_features % fmt.block:
            raise ValueError(f"in_features: expected a positive multiple of {fmt.name}'s "
                             f"block of {fmt.block}, got {in_features}")
        row_bytes = in_features // fmt.block * fmt.type_size
        if raw.shape[1] != row_bytes:
            raise ValueError(f"raw: expected {row_bytes} bytes a row for {in_features} "
                             f"{fmt.name} inputs, got {raw.shape[1]}")
        if nontemporal is not None and not isinstance(nontemporal, bool):
            raise ValueError(f"nontemporal: expected True, False or None, got {nontemporal!r}")
        if bias is not None and tuple(bias.shape) != (raw.shape[0],):
            raise ValueError(f"bias: expected shape ({raw.shape[0]},), got {tuple(bias.shape)}")
        self.qtype, self.in_features, self.out_features = qtype, in_features, raw.shape[0]
        if records is None:
            records = quant_formats.pack(quant_formats.parse(raw.contiguous().numpy(), qtype),
                                         qtype)
        elif records.dtype != torch.uint8:  # packed before, by this class (a load's cache)
            raise ValueError(f"records: expected uint8 records packed by QuantLinear, got "
                             f"{records.dtype}")
        self.register_buffer("records", records, persistent=False)
        self.bias = None if bias is None else torch.nn.Parameter(
            bias.detach().float(), requires_grad=False)
        chosen = self._choose_kernel(kernel, isa)
        # the builtin function, not the module: copy.deepcopy keeps a builtin as it is
        self._linear = None if chosen is None else chosen.linear
        self.isa: str | None = None if chosen is None else chosen.isa
        self.tile = tile
        self.nontemporal = nontemporal_default() if nontemporal is None else nontemporal
        # the prefetch distances, passed on so that ``nontemporal`` can follow them: ``ahead``
        # bytes on, and where ``near`` is not 0, to L2 there and to L1 ``near`` bytes on
        self.ahead = None if chosen is None else chosen.ahead
        self.near = 0 if chosen is None else chosen.near

    @staticmethod
    def _choose_kernel(kernel: bool | None, isa: str | None) -> ModuleType | None:
        if kernel is False:
            return None
        problem = quant_kernel_problem(isa)
        if problem is None:
            return load_quant_kernel(isa)
        if kernel:
            raise RuntimeError(problem)
        logger.warning("%s; QuantLinear computes in PyTorch instead (same values, slower)",
                       problem)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] float32 or bfloat16 -> [..., out_features], x's dtype."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected [..., {self.in_features}], got {tuple(x.shape)}")
        if self._linear is not None:  # the kernel takes the leading dimensions and the bias
            return self._linear(x, self.records, self.qtype, self.out_features, self.bias,
                                False, self.tile, self.ahead, self.nontemporal, self.near)
        y = self.reference(x.reshape(-1, self.in_features))
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def kernel_call(self) -> tuple[Callable[..., torch.Tensor], tuple]:
        """``(function, args)`` with ``function(x, *args)`` equal to ``self(x)``, x
        [..., in_features], without nn.Module's call and attribute lookups (about 5 us a
        layer, which adds up to ~1 ms in a 1.5B model's one-token pass of ~30 ms).

        The args hold this layer's tensors themselves: a holder takes the call again after
        ``_apply`` (``.to()``, ``.float()``), which may replace them.
        """
        if self._linear is None:
            return self.forward, ()
        return self._linear, (self.records, self.qtype, self.out_features, self.bias, False,
                              self.tile, self.ahead, self.nontemporal, self.near)

    def first_outputs(self, count: int) -> QuantLinear:
        """This layer cut to its first ``count`` outputs (a positive multiple of 16, at most
        ``out_features``), sharing its records: nothing is copied, as the records hold 16
        outputs each. A draft model's output layer over the commonest token ids, say.
        """
        if (not isinstance(count, int) or isinstance(count, bool)
                or not 0 < count <= self.out_features or count % quant_formats.LANES):
            raise ValueError(f"count: expected a positive multiple of {quant_formats.LANES} "
                             f"up to {self.out_features}, got {count!r}")
        bias = None if self.bias is None else self.bias[:count]
        return self._with_records(self.records[:count // quant_formats.LANES], bias)

    def output_groups(self, groups: torch.Tensor) -> QuantLinear:
        """A layer of the outputs ``16 g .. 16 g + 15`` of each group g in ``groups`` (int64
        [G']), in that order: [..., in_features] -> [..., 16 G'] (a copy of those records).
        Outputs past ``out_features`` in the last group come out as the records' padding."""
        lanes = quant_formats.LANES
        if groups.dim() != 1 or groups.numel() == 0 or int(groups.min()) < 0 or \
                int(groups.max()) >= self.records.shape[0]:
            raise ValueError(f"groups: expected a non-empty 1-D tensor of groups below "
                             f"{self.records.shape[0]}, got {groups.tolist()}")
        bias = None
        if self.bias is not None:
            padded = torch.nn.functional.pad(self.bias, (0, self.records.shape[0] * lanes
                                                         - self.out_features))
            bias = padded.view(-1, lanes)[groups].flatten()
        return self._with_records(self.records[groups], bias)

    def _with_records(self, records: torch.Tensor, bias: torch.Tensor | None) -> QuantLinear:
        """A layer like this one on ``records`` (uint8 [G', blocks, record])."""
        fmt = FORMATS[self.qtype]
        row_bytes = self.in_features // fmt.block * fmt.type_size
        count = records.shape[0] * quant_formats.LANES if bias is None else bias.shape[0]
        shape_only = torch.empty(1, row_bytes, dtype=torch.uint8).expand(count, row_bytes)
        layer = QuantLinear(shape_only, self.qtype, self.in_features, bias,
                            kernel=self._linear is not None, isa=self.isa, tile=self.tile,
                            records=records, nontemporal=self.nontemporal)
        layer.ahead, layer.near = self.ahead, self.near
        return layer

    def kernel_sums(self, rows: torch.Tensor) -> torch.Tensor:
        """The compiled kernel's float32 sums (before the bias): rows [N, in_features] ->
        [N, out_features], the bits of :meth:`reference`.

        Raises:
            RuntimeError: when this layer has no compiled kernel.
        """
        if self._linear is None:
            raise RuntimeError("kernel_sums: this QuantLinear computes in PyTorch (no kernel)")
        return self._linear(rows, self.records, self.qtype, self.out_features, None, True,
                            self.tile, self.ahead, self.nontemporal, self.near)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel's float32 sums (before the bias), in PyTorch: rows [N, in_features]
        -> [N, out_features]."""
        parts = quant_formats.unpack(self.records, self.qtype, self.out_features)
        return quant_formats.reference_linear(parts, self.qtype, rows.float())

    def dequantized(self) -> torch.Tensor:
        """The weight's exact values as float64 [out_features, in_features], from the
        packed records."""
        return quant_formats.dequantize(
            quant_formats.unpack(self.records, self.qtype, self.out_features), self.qtype)

    def extra_repr(self) -> str:
        how = f"{self.isa} kernel" if self.isa is not None else "PyTorch"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={FORMATS[self.qtype].name}, bias={self.bias is not None}, {how}")
