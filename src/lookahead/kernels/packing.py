"""Linear layers swapped for faster ones on a CPU: bfloat16 weights laid out once for oneDNN,
float32 products taken weight first.

On a CPU, ``torch.nn.functional.linear`` in bfloat16 runs oneDNN's matrix product from the
weight's plain row-major layout on every call. Reordering each weight once into the blocked
layout oneDNN prefers (``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile``'s
CPU "freezing" does) and calling the product on it (``torch.ops.mkldnn._linear_pointwise``)
gives the same logits, bit for bit, in less time. Measured on an AMD EPYC, 2 threads, bf16:
Qwen2.5-Coder-1.5B's forward pass of 1 / 8 / 16 tokens over a 300-token cache took
195 / 215 / 274 ms with plain weights and 145 / 147 / 190 ms packed (``docs/cpu-kernels.md``).

Float32 "packing" lays nothing out: it swaps each linear layer for a
:class:`WeightFirstLinear`, which runs a pass of several rows as ``W @ x.T`` rather than
``F.linear``'s ``x @ W.T``. MKL takes the first as a product with a tall left operand and
runs it near the speed of memory; the second, with a few rows on the left, runs slowly on an
AVX2-only AMD EPYC: there SmolLM2-135M's float32 pass of 2 tokens took 1.5x a pass of one plain
and about 1.0x weight first (``docs/cpu-kernels.md``). One row goes through W in blocks, one
batched product, which reads the weight on both threads where MKL's matrix-vector product
reads it at one thread's speed: a one-token pass of SmolLM2-135M took 49 ms, against 73 ms
plain. Both sum in another order than plain float32, so the logits differ in the last bits:
the same kind of difference, and of about the same size, as plain float32's own between
feeding tokens in one pass and one by one, which every verifying decoder lives with (on
SmolLM2-135M's logits, 8.2e-5 packed against plain, and 8.2e-5 plain against itself). So
float32 is swapped only when asked for (``packed_weights=Kernel.PACKED``); the default changes no
float32 sum.

Bfloat16 packing needs a CPU whose bfloat16 products oneDNN can run from a packed layout
(AVX512 BW/VL/DQ or AVX-NE-CONVERT): on an AVX2-only CPU the default is plain weights, and
asking for packed ones is an error that says why (:func:`cpu_packing_problem`).

A packed model stays on the CPU and is for inference (its packed weights are not parameters,
``model.to`` does not move them). A weight tied to the input embeddings (the output layer of
many small models) gets a packed copy: Qwen2.5-Coder-1.5B needs 0.47 GB more in bfloat16.
The weights left unpacked are copied off the model file's memory map, so that the map (the
whole file) can be released: packed, Qwen2.5-Coder-1.5B's process holds 4.1 GB, not 6.7 GB.

On an AVX-512 CPU without AMX, oneDNN's bfloat16 product is bound by arithmetic for passes of
a few tokens; ``packed_weights=Kernel.STREAM`` swaps the bfloat16 linears for
:class:`lookahead.kernels.stream_linear.StreamLinear` instead, which sums in float32 (the last bits
change, as packed float32's do) at about the cost of one token for up to 8, and under 1.5x
that for 12.

Which of these a model runs on is one value, :class:`lookahead.kernels.choice.Kernel`
(``PLAIN``, ``PACKED``, ``STREAM``; ``QUANTIZED`` for a GGUF model's quantized layers),
None where the choice is left to :func:`apply_packing`.

Example::

    model, tokenizer = lookahead.load_model("qwen2.5-coder-1.5b", packed_weights=Kernel.PACKED)
    # or, on a model already loaded:  lookahead.pack_weights(model)
"""

from __future__ import annotations

import logging

import torch

from lookahead.kernels.choice import Kernel, as_kernel
from lookahead.kernels.quant_linear import QuantLinear
from lookahead.kernels.stream_linear import (StreamLinear, fits_stream_kernel, load_stream_kernel,
                                     stream_kernel_problem)

logger = logging.getLogger(__name__)

# The batch size oneDNN is told to expect when it chooses the packed layout. On the CPUs
# measured the layout was the same for 1, 8 and 32, and so was the speed at every size.
_BATCH_HINT = 1

# The kernels pack_weights swaps linear layers for.
KERNELS = (Kernel.PACKED, Kernel.STREAM)

# The weight dtypes that can be packed, and those packed by default: in bfloat16 the plain
# product is oneDNN's own, so packing keeps every sum; in float32 the products sum in another
# order (WeightFirstLinear).
PACKABLE = (torch.bfloat16, torch.float32)
PACKED_BY_DEFAULT = (torch.bfloat16,)

# Rows of W per block of WeightFirstLinear's one-row product: small enough that the blocks
# share out evenly between threads (a 192-row layer is 3 blocks), big enough that each is
# one product worth its call. On SmolLM2's layers 16 to 64 timed within a few per cent of
# each other; 192 was up to a third slower on the 192-row ones (docs/cpu-kernels.md).
BLOCK_ROWS = 64


class PackedLinear(torch.nn.Module):
    """``y = x @ W.T + b`` with W held in oneDNN's blocked layout; x: [..., in_features]."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.register_buffer(
            "packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT),
            persistent=False,
        )
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features]."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [],
                                                  "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, packed for oneDNN")


class WeightFirstLinear(torch.nn.Module):
    """``y = x @ W.T + b`` taken weight first, ``W @ x.T``; x: [..., in_features].

    Several rows: one product ``W @ x.T`` (MKL's fast case of a tall left operand). One row:
    W's rows in blocks of ``BLOCK_ROWS``, one batched product ``[blocks, B, in] @ [in, 1]``,
    which keeps both threads reading the weight, where MKL's matrix-vector product (what
    ``F.linear`` runs for one row) reads it at about one thread's speed on an AVX2-only EPYC
    (the output layer of SmolLM2-135M: 6.3 ms, against 12.1). It holds the linear layer's own
    weight and bias (no copy: a weight tied to the input embeddings stays tied).
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # W's first rows that fill whole blocks; the rest (and a strided W) go to F.linear.
        whole = self.out_features // BLOCK_ROWS * BLOCK_ROWS
        self.blocked_rows = whole if self.weight.is_contiguous() else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features], contiguous."""
        rows = x.reshape(-1, self.in_features)  # [R, in]
        if rows.shape[0] == 1:
            y = self._one_row(rows)
        else:
            y = torch.mm(self.weight, rows.t()).t().contiguous()  # [R, out]
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _one_row(self, row: torch.Tensor) -> torch.Tensor:
        """row: [1, in] -> [1, out], without the bias."""
        whole = self.blocked_rows
        if whole == 0:
            return torch.nn.functional.linear(row, self.weight)
        blocks = self.weight[:whole].view(-1, BLOCK_ROWS, self.in_features)  # [n, B, in]
        column = row.t().expand(blocks.shape[0], -1, -1)  # [n, in, 1], no copy
        y = torch.bmm(blocks, column).view(1, whole)
        if whole == self.out_features:
            return y
        return torch.cat([y, torch.nn.functional.linear(row, self.weight[whole:])], dim=1)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight first")


def is_packed(model: torch.nn.Module) -> bool:
    """Whether any linear layer of ``model`` was swapped by :func:`pack_weights`."""
    return any(isinstance(m, (PackedLinear, WeightFirstLinear, StreamLinear))
               for m in model.modules())


def packing_of(model: torch.nn.Module) -> Kernel:
    """The kernel ``model``'s linear layers run on: ``STREAM`` (any on the stream kernel),
    ``QUANTIZED`` (any kept as GGUF blocks), ``PACKED`` (oneDNN's layout or weight first) or
    ``PLAIN``."""
    kinds = {type(m) for m in model.modules()}
    if StreamLinear in kinds:
        return Kernel.STREAM
    if QuantLinear in kinds:
        return Kernel.QUANTIZED
    return Kernel.PACKED if kinds & {PackedLinear, WeightFirstLinear} else Kernel.PLAIN


def linear_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``model``'s plain linear weights; None when they have none or several."""
    dtypes = {m.weight.dtype for m in model.modules() if type(m) is torch.nn.Linear}
    return dtypes.pop() if len(dtypes) == 1 else None


def packing_problem(model: torch.nn.Module, packed: Kernel | bool | str | None = Kernel.PACKED
                    ) -> str | None:
    """Why ``model`` cannot have its weights packed for the kernel ``packed`` (``PACKED``,
    None alike; ``STREAM``; the older spellings ``as_kernel`` reads), or None when it can."""
    kernel = as_kernel(packed, "packed", (*KERNELS, Kernel.PLAIN))
    if packing_of(model) is Kernel.QUANTIZED:
        return ("the model's linear layers are quantized (GGUF blocks); packing is for "
                "de-quantised weights (load it with quantized=False)")
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    devices = {m.weight.device.type for m in linears}
    if devices - {"cpu"}:
        return f"packed weights are for the CPU; the model's weights are on {sorted(devices)}"
    if not linears:
        return None  # packed already, or nothing to pack
    dtype = linear_dtype(model)
    if dtype not in PACKABLE:
        names = sorted({str(m.weight.dtype).removeprefix("torch.") for m in linears})
        return (f"packed weights are bfloat16 or float32; the model's linear weights are "
                f"{', '.join(names)} (load it with dtype='bfloat16' or 'float32')")
    if kernel is Kernel.STREAM:
        if dtype != torch.bfloat16:
            return "the stream kernel is for bfloat16 weights (load the model in bfloat16)"
        return stream_kernel_problem() or cpu_packing_problem(dtype)
    return cpu_packing_problem(dtype)


def check_packable_dtype(packed_weights: Kernel | None, dtype: torch.dtype) -> None:
    """Raise ValueError naming ``packed_weights`` when it packs (``PACKED``, ``STREAM``) a
    ``dtype`` that cannot be packed so; the CPU is asked only when the model is packed.
    ``packed_weights`` is a ``Kernel`` or None, or a spelling ``as_kernel`` reads."""
    name = str(dtype).removeprefix("torch.")
    kernel = as_kernel(packed_weights, "packed_weights")
    if kernel is not None and kernel.packs and dtype not in PACKABLE:
        raise ValueError(f"packed_weights applies to dtype bfloat16 or float32, got {name}")
    if kernel is Kernel.STREAM and dtype != torch.bfloat16:
        raise ValueError(f"packed_weights={kernel.value!r} applies to dtype bfloat16, got {name}")


def cpu_packing_problem(dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why this CPU cannot hold ``dtype`` weights packed, or None when it can.

    Float32 needs only PyTorch's own matrix product (:class:`WeightFirstLinear`). oneDNN's
    bfloat16 reorder needs AVX512 (BW, VL, DQ) or AVX-NE-CONVERT: on an AVX2-only CPU (an AMD
    EPYC 7003, say) it raises. Rather than keep a list of CPU flags in step with oneDNN's,
    reorder one small weight and see.
    """
    if dtype == torch.float32:
        return None
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    name = str(dtype).removeprefix("torch.")
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(32, 32, dtype=dtype), _BATCH_HINT)
    except RuntimeError as error:
        return f"this CPU cannot run oneDNN's packed {name} products ({error})"
    return None


def pack_weights(model: torch.nn.Module, kernel: Kernel | str = Kernel.PACKED) -> int:
    """Swap each ``torch.nn.Linear`` of ``model`` (on the CPU) for a :class:`PackedLinear` in
    bfloat16 or a :class:`WeightFirstLinear` in float32, in place; return how many were
    swapped (0 when already packed). In float32 the sums change in the last bits (see the
    module's docstring). ``kernel=Kernel.STREAM``: bfloat16 layers go to the stream kernel
    (:class:`lookahead.kernels.stream_linear.StreamLinear`; those of a shape it does not take, to
    oneDNN), whose sums change in the last bits too. ``kernel`` may also be spelled "packed"
    (or "onednn", as it once was) or "stream"; None is ``PACKED``.

    Raises:
        ValueError: naming ``kernel`` when it is not one of ``KERNELS``; naming ``model`` when
            it is not on the CPU, not in bfloat16 or float32, or this PyTorch or CPU cannot run
            the products asked for.
    """
    kernel = as_kernel(kernel, "kernel", KERNELS) or Kernel.PACKED
    problem = packing_problem(model, kernel)
    if problem is not None:
        raise ValueError(f"model: cannot pack its weights: {problem}")
    dtype = linear_dtype(model)
    make = _layer_maker(dtype, kernel)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, make(child))
                swapped += 1
    if swapped and dtype != torch.float32:  # WeightFirstLinear keeps the weights it was given
        _own_remaining_weights(model)
    logger.info("swapped %d linear layers (%s)", swapped, kernel)
    return swapped


def _layer_maker(dtype: torch.dtype | None, kernel: Kernel):
    """The function that makes a packed layer from a ``torch.nn.Linear`` of ``dtype``."""
    if dtype == torch.float32:
        return WeightFirstLinear
    if kernel is not Kernel.STREAM:
        return PackedLinear
    compiled = load_stream_kernel()
    return lambda linear: (StreamLinear(linear, compiled) if fits_stream_kernel(linear)
                           else PackedLinear(linear))


@torch.no_grad()
def _own_remaining_weights(model: torch.nn.Module) -> None:
    """Copy the parameters and buffers left after packing into memory of their own.

    Loaded from safetensors, every weight is a view of the model file's memory map, and the
    map lives as long as any view does: the embeddings and norms alone would keep the whole
    file (3.1 GB for Qwen2.5-Coder-1.5B) resident beside the packed copy. Assigning ``.data``
    keeps each Parameter object, so weights tied to each other stay tied.
    """
    for parameter in model.parameters():
        parameter.data = parameter.data.clone()
    for module in model.modules():
        if isinstance(module, (PackedLinear, StreamLinear)):
            continue  # its packed weight is already its own
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = buffer.clone()


def resolve_kernel(dtype: torch.dtype | None, packed: Kernel | None) -> Kernel:
    """The kernel the commands run weights of ``dtype`` on, given ``packed``: the kernel
    asked for (``--packed-weights`` ``PACKED``, ``--no-packed-weights`` ``PLAIN``,
    ``--stream-kernel`` ``STREAM``), or for None (the default) ``PACKED`` where that keeps
    every sum (bfloat16, on a CPU that can pack it) and ``PLAIN`` elsewhere."""
    kernel = as_kernel(packed, "packed_weights")
    if kernel is not None:
        return kernel
    if dtype in PACKED_BY_DEFAULT and cpu_packing_problem(dtype) is None:
        return Kernel.PACKED
    return Kernel.PLAIN


def apply_packing(model: torch.nn.Module, packed: Kernel | bool | str | None) -> Kernel:
    """Pack ``model``'s weights for ``packed`` (``PACKED``; ``STREAM``: on the stream
    kernel), never for ``PLAIN``, and for None (the command line's default) where that keeps
    every sum: bfloat16, on a CPU that can pack it. ``QUANTIZED`` is chosen when a model
    loads: here it only checks the model is so. Return the kernel the layers run on
    (:func:`packing_of`). ``packed`` may be spelled as ``as_kernel`` reads (True, False,
    "stream", ...).

    Raises:
        ValueError: naming ``packed_weights``: a value ``as_kernel`` does not read, a model
            that cannot be packed as asked, or ``QUANTIZED`` for a model that is not.
    """
    kernel = as_kernel(packed, "packed_weights")
    current = packing_of(model)
    if kernel is Kernel.QUANTIZED and current is not Kernel.QUANTIZED:
        raise ValueError(f"packed_weights: {Kernel.QUANTIZED.value!r} is chosen when the model "
                         f"loads (load_model(..., quantized=True)); this one runs on {current}")
    if kernel in (Kernel.PLAIN, Kernel.QUANTIZED) or current.packs:
        return current
    problem = packing_problem(model, kernel)
    if problem is None and resolve_kernel(linear_dtype(model), kernel).packs:
        pack_weights(model, kernel or Kernel.PACKED)
        return packing_of(model)
    if kernel is not None:
        raise ValueError(f"packed_weights: {problem}")
    logger.info("weights not packed: %s", problem or "float32 is packed only when asked for")
    return current
