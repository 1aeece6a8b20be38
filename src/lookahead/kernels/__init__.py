"""How a model's linear layers and attention run on the CPU.

``packing``            choosing and applying a weight layout for the linear layers
``stream_linear``      bfloat16 weights summed in float32 by the compiled ``csrc/stream_linear.cpp``
``grouped_attention``  grouped-query attention without repeating the key/value heads
"""
