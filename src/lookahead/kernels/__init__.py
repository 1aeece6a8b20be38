"""How a model's linear layers and attention run on the CPU.

``packing``            choosing and applying a weight layout for the linear layers
``stream_linear``      bfloat16 weights summed in float32 by the compiled ``csrc/stream_linear.cpp``
``grouped_attention``  grouped-query attention without repeating the key/value heads
"""

# ``packed_weights="stream"``: bfloat16 linears on the stream kernel (``stream_linear``); here,
# not in ``packing``, so that the command line's parsers can name it without loading torch.
STREAM = "stream"
