"""Bfloat16 linear layers summed in float32 by a small compiled kernel (``csrc/stream_linear.cpp``).

On an AVX-512 CPU without AMX, oneDNN's bfloat16 product runs at about half the rate of
float32 fused multiply-adds. A forward pass of a few tokens through a 1.5B model is then
bound by arithmetic: on a 2-core Intel Xeon (AVX512-BF16, no AMX), Qwen2.5-Coder-1.5B's pass
of 1 / 8 / 16 tokens took 151 / 260 / 391 ms on oneDNN's packed weights. This kernel widens
each bfloat16 weight to float32 once, multiplies it into every token's row and reads the
weights ahead: 123 / 152 / 250 ms on the same machine, in the same process
(``docs/cpu-kernels.md``); taking 12 rows at a time, as it now does, passes of 12 / 16
tokens cost 180 / 236 ms.

The sums run in another order than oneDNN's, so the logits differ from plain bfloat16 in the
last bits, as packed float32's do; and so the kernel is used only when asked for
(``linear_kernel="stream"``). Each output sums its inputs in one fixed order whatever the
number of rows, so a row's result does not depend on the rows beside it: a pass of k tokens
gives the bits of k one-token passes, which oneDNN does not.

The kernel is compiled on first use with PyTorch's C++ extension builder (a C++ compiler and
``ninja`` are needed; the build is cached in PyTorch's extensions folder). It needs AVX-512
(:func:`stream_kernel_problem` says why it cannot run, when it cannot).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

import torch

from lookahead.kernels.build import compile_kernel

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "stream_linear.cpp"
# Output features are taken 32 at a time (two AVX-512 registers), input features 2 at a time.
OUT_MULTIPLE, IN_MULTIPLE = 32, 2


def load_stream_kernel() -> ModuleType:
    """Compile (first time) or load the kernel; PyTorch caches the build by its source's hash.

    Raises:
        RuntimeError: when this CPU lacks AVX-512 or the build fails (no compiler, say).
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        raise RuntimeError(f"the stream kernel needs AVX-512; this CPU's best is {capability}")
    logger.info("loading the stream kernel (compiled on first use, some 15 s)")
    return compile_kernel("lookahead_stream_linear", [SOURCE], ["-O3", "-mavx512f"])


def stream_kernel_problem() -> str | None:
    """Why the stream kernel cannot run here, or None when it can."""
    try:
        load_stream_kernel()
    except (RuntimeError, OSError, ImportError) as error:
        return f"the stream kernel cannot run here ({error})"
    return None


def fits_stream_kernel(linear: torch.nn.Linear) -> bool:
    """Whether ``linear``'s shape suits the kernel (other layers stay on oneDNN)."""
    return (linear.out_features % OUT_MULTIPLE == 0
            and linear.in_features % IN_MULTIPLE == 0)


class StreamLinear(torch.nn.Module):
    """``y = x @ W.T + b`` in bfloat16, summed in float32 by the stream kernel;
    x: [..., in_features]."""

    def __init__(self, linear: torch.nn.Linear, kernel: ModuleType) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self._linear = kernel.linear  # a builtin function: copy.deepcopy keeps it as it is
        self.register_buffer("packed_weight", kernel.pack(linear.weight.detach()),
                             persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features]."""
        rows = x.reshape(-1, self.in_features).contiguous()
        y = self._linear(rows, self.packed_weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, stream kernel")
