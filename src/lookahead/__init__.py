"""lookahead: several tokens per forward pass, output identical to the model's own decoding.

    import lookahead
    model, tokenizer = lookahead.load_model("smollm2-135m", dtype="bfloat16")
    result = lookahead.generate(model, input_ids, max_new_tokens=256, method="lookahead")
"""

from lookahead.api import GenerationResult, Stream, generate, stream
from lookahead.config import (
    METHODS,
    DraftConfig,
    LookaheadConfig,
    PromptLookupConfig,
    SamplingConfig,
)
from lookahead.grouped_attention import use_grouped_attention
from lookahead.memory import TextMemory
from lookahead.stats import GenerationStats


def load_model(*args, **kwargs):
    """Load a bundled name, HF id, local folder or .gguf path: see ``lookahead.models``."""
    from lookahead.models import load_model as _load

    return _load(*args, **kwargs)


__all__ = [
    "METHODS",
    "DraftConfig",
    "GenerationResult",
    "GenerationStats",
    "LookaheadConfig",
    "PromptLookupConfig",
    "SamplingConfig",
    "Stream",
    "TextMemory",
    "generate",
    "load_model",
    "stream",
    "use_grouped_attention",
]
