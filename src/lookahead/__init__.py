"""lookahead: several tokens per forward pass, output identical to the model's own decoding.

    import lookahead
    model, tokenizer = lookahead.load_model("smollm2-135m", dtype="bfloat16")
    result = lookahead.generate(model, input_ids, max_new_tokens=256, method="lookahead")

The names below are imported from their modules on first use, so that ``import lookahead``
(and ``lookahead --help``) does not load torch and transformers before they are needed.
"""

from importlib import import_module
from importlib.util import find_spec
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lookahead-exact")  # the distribution's name
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

# Public name: the module that defines it.
_EXPORTS = {
    "GenerationResult": "lookahead.api",
    "Stream": "lookahead.api",
    "generate": "lookahead.api",
    "custom_generate": "lookahead.api",
    "stream": "lookahead.api",
    "METHODS": "lookahead.config",
    "DraftConfig": "lookahead.config",
    "LookaheadConfig": "lookahead.config",
    "PromptLookupConfig": "lookahead.config",
    "SamplingConfig": "lookahead.config",
    "Datastore": "lookahead.sources.datastore",
    "TextMemory": "lookahead.sources.memory",
    "SuccessorTable": "lookahead.proposers.recycling",
    "use_grouped_attention": "lookahead.kernels.grouped_attention",
    "use_invariant_attention": "lookahead.kernels.invariant_attention",
    "Kernel": "lookahead.kernels.choice",
    "pack_weights": "lookahead.kernels.packing",
    "packing_problem": "lookahead.kernels.packing",
    "GenerationStats": "lookahead.stats",
    "load_model": "lookahead.models.load",
    "Detokenizer": "lookahead.detokenize",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is not None:
        return getattr(import_module(module), name)
    if not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        return import_module(f"{__name__}.{name}")  # a submodule: ``lookahead.api`` after
        # ``import lookahead``, as when this module imported them all
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted([*_EXPORTS, "__version__"])
