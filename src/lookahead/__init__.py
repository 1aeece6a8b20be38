"""lookahead: several tokens per forward pass, output identical to the model's own decoding.

    import lookahead
    model, tokenizer = lookahead.load_model("smollm2-135m", dtype="bfloat16")
    result = lookahead.generate(model, input_ids, max_new_tokens=256, method="lookahead")
"""

from importlib.metadata import PackageNotFoundError, version

from lookahead.api import GenerationResult, Stream, stream
from lookahead.config import (
    METHODS,
    DraftConfig,
    LookaheadConfig,
    PromptLookupConfig,
    SamplingConfig,
)
from lookahead.datastore import Datastore
from lookahead.grouped_attention import use_grouped_attention
from lookahead.hf_generate import custom_generate, generate
from lookahead.memory import TextMemory
from lookahead.packing import pack_weights, packing_problem
from lookahead.stats import GenerationStats

try:
    __version__ = version("lookahead")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


def load_model(*args, **kwargs):
    """Load a bundled name, HF id, local folder or .gguf path: see ``lookahead.models``."""
    from lookahead.models import load_model as _load

    return _load(*args, **kwargs)


__all__ = [
    "METHODS",
    "Datastore",
    "DraftConfig",
    "GenerationResult",
    "GenerationStats",
    "LookaheadConfig",
    "PromptLookupConfig",
    "SamplingConfig",
    "Stream",
    "TextMemory",
    "__version__",
    "custom_generate",
    "generate",
    "load_model",
    "pack_weights",
    "packing_problem",
    "stream",
    "use_grouped_attention",
]
