"""Linear layers whose weights are laid out once for oneDNN: the same sums, in less time.

On a CPU, ``torch.nn.functional.linear`` in bfloat16 runs oneDNN's matrix product from the
weight's plain row-major layout on every call. Reordering each weight once into the blocked
layout oneDNN prefers (``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile``'s
CPU "freezing" does) and calling the product on it (``torch.ops.mkldnn._linear_pointwise``)
gives the same logits, bit for bit, in less time. Measured on an AMD EPYC, 2 threads, bf16:
Qwen2.5-Coder-1.5B's forward pass of 1 / 8 / 16 tokens over a 300-token cache took
195 / 215 / 274 ms with plain weights and 145 / 147 / 190 ms packed (``docs/packed-weights.md``).

Packing needs a CPU whose bfloat16 products oneDNN can run from a packed layout (AVX512 BW/VL/DQ
or AVX-NE-CONVERT): on an AVX2-only CPU (an AMD EPYC 7003) the default is plain weights, and
asking for packed ones is an error that says why (:func:`cpu_packing_problem`).

Packing is for inference, and only in bfloat16: float32 products take another path (MKL),
whose sums differ from oneDNN's in the last bits, so a packed float32 model would not write
exactly what the plain one does. A packed model stays on the CPU (its packed weights are not
parameters, ``model.to`` does not move them). A weight tied to the input embeddings (the
output layer of many small models) gets a packed copy: Qwen2.5-Coder-1.5B needs 0.47 GB more.
The weights left unpacked are copied off the model file's memory map, so that the map (the
whole file) can be released: packed, Qwen2.5-Coder-1.5B's process holds 4.1 GB, not 6.7 GB.

Example::

    model, tokenizer = lookahead.load_model("qwen2.5-coder-1.5b", packed_weights=True)
    # or, on a model already loaded:  lookahead.pack_weights(model)
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

# The batch size oneDNN is told to expect when it chooses the packed layout. On the CPUs
# measured the layout was the same for 1, 8 and 32, and so was the speed at every size.
_BATCH_HINT = 1


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


def is_packed(model: torch.nn.Module) -> bool:
    """Whether any linear layer of ``model`` holds packed weights."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def packing_problem(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot have its weights packed, or None when it can."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    devices = {m.weight.device.type for m in linears}
    if devices - {"cpu"}:
        return f"packed weights are for the CPU; the model's weights are on {sorted(devices)}"
    dtypes = {m.weight.dtype for m in linears}
    if dtypes - {torch.bfloat16}:
        names = sorted(str(d).removeprefix("torch.") for d in dtypes)
        return (f"packed weights keep the output exact in bfloat16 only; the model's linear "
                f"weights are {', '.join(names)} (load it with dtype='bfloat16')")
    return cpu_packing_problem()


def cpu_packing_problem() -> str | None:
    """Why this CPU cannot hold bfloat16 weights packed for oneDNN, or None when it can.

    oneDNN's bfloat16 reorder needs AVX512 (BW, VL, DQ) or AVX-NE-CONVERT: on an AVX2-only
    CPU (an AMD EPYC 7003, say) it raises. Rather than keep a list of CPU flags in step with
    oneDNN's, reorder one small weight and see.
    """
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(32, 32, dtype=torch.bfloat16),
                                                _BATCH_HINT)
    except RuntimeError as error:
        return f"this CPU cannot run oneDNN's packed bfloat16 products ({error})"
    return None


def pack_weights(model: torch.nn.Module) -> int:
    """Swap each ``torch.nn.Linear`` of ``model`` (bfloat16, on the CPU) for a
    :class:`PackedLinear`, in place; return how many were swapped (0 when already packed).

    Raises:
        ValueError: naming ``model``, when it is not on the CPU, not in bfloat16, or this
            PyTorch has no oneDNN.
    """
    problem = packing_problem(model)
    if problem is not None:
        raise ValueError(f"model: cannot pack its weights: {problem}")
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    if swapped:
        _own_remaining_weights(model)
    logger.info("packed the weights of %d linear layers for oneDNN", swapped)
    return swapped


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
        if isinstance(module, PackedLinear):
            continue  # its packed weight is already its own
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = buffer.clone()


def apply_packing(model: torch.nn.Module, packed: bool | None) -> bool:
    """Pack ``model``'s weights when ``packed`` is True, never when False, and where it can be
    done when None (the command line's default); return whether they are packed.

    Raises:
        ValueError: naming ``packed_weights``, when True and the model cannot be packed.
    """
    if packed is False:
        return False
    problem = packing_problem(model)
    if problem is None:
        pack_weights(model)
        return True
    if packed:
        raise ValueError(f"packed_weights: {problem}")
    logger.info("weights not packed: %s", problem)
    return False
