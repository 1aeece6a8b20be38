"""The float32 operations between a quantized model's linear layers, one call each, row by
row: RMS normalisation and the SiLU-gated MLP (``csrc/row_ops.cpp``).

At one token a pass, a 1.5B model's step is bound by reading its weights (about 25 ms on
2 cores), and what runs between the linear layers becomes a large share of what is left:
transformers' RMSNorm is eight PyTorch operations, a gated MLP two linear calls and two
elementwise operations, each with a few microseconds of dispatch. :func:`fuse_row_ops` swaps
such modules, where it finds them, for :class:`RowRMSNorm` (one call) and :class:`GatedMLP`
(one call for silu(gate) * up). Both compute each row alone in a fixed order, so the
quantized path's rows stay independent of each other. (Gate and up stacked into one linear
call were not faster: 11.3 against 10.5 ms for the 28 pairs of the 1.5B model.)

A module is swapped only when it is of the kind it looks like: the new module must give the
old one's output on a random input (a norm to float32 rounding; an MLP, whose int8
activations may round one step apart, to 1e-3 of its size). Anything else is left as it is.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from lookahead.kernels.build import compile_kernel
from lookahead.kernels.quant_linear import ISA_FLAGS, QuantLinear, best_isa

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).parent / "csrc" / "row_ops.cpp"]
EXP_APPROX = Path(__file__).parent / "csrc" / "exp_approx.h"


@functools.cache  # the build is per process anyway: a loaded extension stays imported
def load_row_ops() -> ModuleType:
    """Compile (first time) or load ``csrc/row_ops.cpp`` for this CPU's best ISA.

    Raises:
        RuntimeError / OSError / ImportError: the build failed, or the CPU has neither
        AVX-512 nor AVX2.
    """
    isa = best_isa()
    return compile_kernel(f"lookahead_row_ops_{isa}", SOURCES,
                          ["-O3", "-ffp-contract=off", *ISA_FLAGS[isa]],
                          headers=(EXP_APPROX,))


def built_argmax() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The compiled argmax (float32 [N, V], rows contiguous -> int64 [N], torch.argmax's
    answer) where this process has already built the row operations (loading a quantized
    model does), else None. It never starts a build: a first one takes some 15 s, which a
    de-quantised model's decoding should not wait for."""
    if load_row_ops.cache_info().currsize == 0:
        return None
    return load_row_ops().argmax


def built_top_k() -> Callable[[torch.Tensor, int], torch.Tensor] | None:
    """The compiled top k (float32 [N, V], rows contiguous, and k in 1 .. min(V, 64) -> int64
    [N, k], largest first; equal ones by index) where this process has already built the row
    operations, else None (see :func:`built_argmax`)."""
    if load_row_ops.cache_info().currsize == 0:
        return None
    return load_row_ops().top_k


def row_ops_problem() -> str | None:
    """Why the row operations cannot be compiled here, or None when they can."""
    try:
        load_row_ops()
    except (RuntimeError, OSError, ImportError) as error:
        return f"the row operations cannot be built here ({error})"
    return None


class PlainCalls(torch.nn.Module):
    """A module that keeps what its forward calls as plain attributes, made by ``_bind``.

    nn.Module finds parameters, buffers and children through ``__getattr__`` (about 0.7 us
    each) and wraps every call (about 3 us); a 28-layer pass makes hundreds of both. ``_bind``
    runs again after ``_apply`` (``.to()``, ``.float()``), which may replace the tensors.
    """

    def _bind(self) -> None:
        raise NotImplementedError

    def _apply(self, fn, recurse: bool = True):
        module = super()._apply(fn, recurse)
        self._bind()
        return module


class RowRMSNorm(PlainCalls):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, float32, one compiled
    call. weight: float32 [D]."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().float().contiguous(),
                                         requires_grad=False)
        self.eps = float(eps)
        self._rms_norm = load_row_ops().rms_norm  # the builtin: deepcopy keeps it
        self._bind()

    def _bind(self) -> None:
        self._call = (self._rms_norm, self.weight, self.eps)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x: contiguous float32 [N, D] -> [N, D]."""
        norm, weight, eps = self._call
        return norm(x, weight, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 [..., D] -> [..., D]."""
        return self.rows(x.reshape(-1, x.shape[-1]).contiguous()).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class GatedMLP(PlainCalls):
    """``down(silu(gate(x)) * up(x))``, the product in one compiled call.

    Args:
        gate, up: hidden size -> I; down: I -> hidden size (:class:`QuantLinear` each).
    """

    def __init__(self, gate: QuantLinear, up: QuantLinear, down: QuantLinear) -> None:
        super().__init__()
        if not gate.out_features == up.out_features == down.in_features:
            raise ValueError(f"gate, up, down: expected I outputs, I outputs and I inputs, got "
                             f"{gate.out_features}, {up.out_features}, {down.in_features}")
        self.gate_proj, self.up_proj, self.down_proj = gate, up, down
        self._silu_mul = load_row_ops().silu_mul
        self._bind()

    def _bind(self) -> None:
        self._calls = (self._silu_mul, *(layer.kernel_call() for layer in
                                         (self.gate_proj, self.up_proj, self.down_proj)))

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 [N, H] -> [N, H]."""
        silu_mul, (gate, gate_args), (up, up_args), (down, down_args) = self._calls
        return down(silu_mul(gate(x, *gate_args), up(x, *up_args)), *down_args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 [..., H] -> [..., H]."""
        out = self.rows(x.reshape(-1, x.shape[-1]))
        return out.reshape(*x.shape[:-1], out.shape[-1])


def fuse_row_ops(model: torch.nn.Module) -> dict[str, int]:
    """Swap ``model``'s RMS norms and SiLU-gated MLPs on quantized linears for
    :class:`RowRMSNorm` and :class:`GatedMLP`, where each gives the same output (see the
    module's text). Returns how many of each were swapped (nothing where the kernel cannot be
    built: logged)."""
    problem = row_ops_problem()
    if problem is not None:
        logger.info("norms and MLPs left as they are: %s", problem)
        return {"norms": 0, "mlps": 0}
    new = swap_children(model, lambda child: _row_norm(child) or _gated_mlp(child))
    norms = sum(isinstance(module, RowRMSNorm) for module in new)
    swapped = {"norms": norms, "mlps": len(new) - norms}
    logger.info("row operations: %(norms)d norms and %(mlps)d MLPs swapped", swapped)
    return swapped


def swap_children(model: torch.nn.Module, make) -> list[torch.nn.Module]:
    """Replace every module below ``model`` for which ``make(module)`` gives a module (not
    None) by that module; returns the new modules, in the order they were made."""
    made = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = make(child)
            if new is not None:
                setattr(parent, name, new)
                made.append(new)
    return made


def _row_norm(module: torch.nn.Module) -> RowRMSNorm | None:
    """A ``RowRMSNorm`` that computes what ``module`` does, or None."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if (not type(module).__name__.endswith("RMSNorm") or not isinstance(eps, float)
            or not isinstance(weight, torch.Tensor) or weight.dim() != 1
            or weight.dtype != torch.float32 or list(module.children())):
        return None
    new = RowRMSNorm(weight, eps)
    x = torch.randn(3, weight.shape[0], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        same = torch.allclose(new(x), module(x), rtol=1e-5, atol=1e-6)
    return new if same else None


def _gated_mlp(module: torch.nn.Module) -> GatedMLP | None:
    """A ``GatedMLP`` that computes what ``module`` does, or None."""
    gate, up, down = (getattr(module, name, None) for name in ("gate_proj", "up_proj",
                                                               "down_proj"))
    act = getattr(module, "act_fn", None)
    if not (all(isinstance(layer, QuantLinear) for layer in (gate, up, down))
            and type(act).__name__ in ("SiLU", "SiLUActivation")
            and set(dict(module.named_children())) == {"gate_proj", "up_proj", "down_proj",
                                                       "act_fn"}):
        return None
    new = GatedMLP(gate, up, down)
    x = torch.randn(2, gate.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, ours = module(x), new(x)
    same = (ours - theirs).norm() <= 1e-3 * theirs.norm()
    return new if same else None
