"""How a model's linear layers and attention run on the CPU.

``choice``             ``Kernel``: which kernel runs the linear layers, as one value (no torch)
``packing``            choosing and applying a weight layout for the linear layers
``stream_linear``      bfloat16 weights summed in float32 by the compiled ``csrc/stream_linear.cpp``
``quant_formats``      GGUF blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K): parsing, repacking, reference
``quant_linear``       quantized GGUF weights multiplied by the compiled ``csrc/quant_linear.cpp``
``huge_pages``         an arena on transparent huge pages for the quantized weights
``row_ops``            RMS norm and gated MLP product between quantized linears, one call each
``build``              compiling the C++ kernels on first use
``grouped_attention``  grouped-query attention without repeating the key/value heads
``invariant_attention`` attention whose rows do not depend on the rest of the pass (float32)
"""

# Here, so that the command line's parsers can name the choices without loading torch.
from lookahead.kernels.choice import Kernel, as_kernel

__all__ = ["Kernel", "as_kernel"]
