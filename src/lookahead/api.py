"""The public entry points: ``generate`` and ``stream``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lookahead.config import (
    METHOD_OPTIONS,
    METHODS,
    SAMPLING_OPTIONS,
    DraftConfig,
    LookaheadConfig,
    PromptLookupConfig,
    SamplingConfig,
    check_int,
    check_step_tokens,
)
from lookahead.sources.datastore import Datastore
from lookahead.decode import Decoder
from lookahead.sources.memory import TextMemory
from lookahead.kernels.packing import packing_of
from lookahead.profiles import find_shape
from lookahead.proposers.base import NoProposer, Proposer
from lookahead.proposers.draft import DraftProposer
from lookahead.proposers.lookahead import LookaheadProposer
from lookahead.proposers.prompt_lookup import PromptLookupProposer
from lookahead.stats import GenerationStats

logger = logging.getLogger(__name__)

# ``GenerationStats.shape_source`` of a lookahead call that gave its window.
GIVEN_SOURCE = "given"

@dataclass(frozen=True)
class GenerationResult:
    """sequences: LongTensor [B, prompt_len + new_tokens]; stats: what the decoding did (all
    rows together); row_stats: each row's, for a batch (else empty)."""

    sequences: torch.Tensor
    stats: GenerationStats
    row_stats: tuple[GenerationStats, ...] = ()

    @property
    def new_tokens(self) -> torch.Tensor:
        """LongTensor [B, new_tokens]."""
        return self.sequences[:, self.stats.prompt_tokens :]


class Stream:
    """Iterate to get the tokens committed at each step (list[int]); ``stats`` fills as it goes."""

    def __init__(self, decoder: Decoder) -> None:
        self._decoder = decoder

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._decoder)

    @property
    def stats(self) -> GenerationStats:
        return self._decoder.stats

    @property
    def sequences(self) -> torch.Tensor:
        return torch.tensor([self._decoder.context], dtype=torch.long)


def stream(model, input_ids, max_new_tokens: int = 256, method: str = "lookahead", **options):
    """Like ``generate`` but returns a ``Stream`` that yields each step's tokens as decoded."""
    return Stream(make_decoder(model, input_ids, max_new_tokens, method, **options))


def make_decoder(model, input_ids, max_new_tokens, method, *, controls=None, logprobs=None,
                 **options) -> Decoder:
    """Validate every argument and build the per-request ``Decoder`` (``controls``: logits
    processors and stopping criteria, see ``lookahead.controls``; ``logprobs``: see
    ``Decoder``)."""
    _check_inputs(model, input_ids, max_new_tokens)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    eos = options.pop("eos_token_id", None)
    sampling = SamplingConfig(**_pop(options, SAMPLING_OPTIONS))
    unknown = set(options) - set(METHOD_OPTIONS[method])
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)} for method {method!r}; "
            f"it takes {list(METHOD_OPTIONS[method]) or 'none'}"
        )
    generator = None
    if sampling.do_sample:
        generator = torch.Generator(device=model.device)  # draws where the logits are
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
    shape_source = None
    if method == "lookahead":
        options, shape_source = auto_shape(model, options)
    memory = _check_memory(options.pop("memory", None))
    step_tokens = check_step_tokens(options.pop("max_step_tokens", None))
    datastore = _check_datastore(options.pop("datastore", None))
    proposer = make_proposer(model, method, options, sampling, generator, memory, datastore)
    decoder = Decoder(
        model,
        input_ids,
        proposer,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        eos_token_ids=eos_token_ids(model, eos),
        generator=generator,
        method=method,
        memory=memory,
        step_tokens=step_tokens,
        controls=controls,
        logprobs=logprobs,
    )
    decoder.stats.shape_source = shape_source
    return decoder


def resolve_auto_shape(model, options: dict) -> dict:
    """``auto_shape``'s options alone."""
    return auto_shape(model, options)[0]


def auto_shape(model, options: dict) -> tuple[dict, str]:
    """Lookahead ``options`` with no ``window``, or ``window="auto"``, given this machine's
    tuned shape, and where the shape came from.

    The shape comes from the profile ``lookahead tune`` saved for the model (by its
    ``name_or_path``: a bundled name, a folder or a hub id), dtype and device -- the profile of
    ``options["workload"]`` if that is given and saved -- else the default shape; ``ngram``,
    ``guess`` and ``max_step_tokens`` given beside it are kept (a profile's shape can bring a
    step cap of its own, which one given here replaces). An explicit int ``window`` keeps the
    shape as given. The source is the profile's path, ``profiles.DEFAULT_SOURCE`` ("default")
    or ``GIVEN_SOURCE`` ("given", the caller's window).
    """
    options = dict(options)
    workload = options.pop("workload", None)
    # Whoever ran `lookahead tune` gets its shape without asking for it again.
    options.setdefault("window", "auto")
    if options.get("window") != "auto":
        if workload is not None:
            raise ValueError(f"workload={workload!r} chooses a tuned shape: it needs "
                             f"window='auto', not window={options.get('window')!r}")
        return options, GIVEN_SOURCE
    shape, source = find_shape(model.name_or_path, model.dtype, device=model.device.type,
                               workload=workload, packed=packing_of(model))
    logger.info("window='auto': the shape %s for %s from %s", shape, model.name_or_path, source)
    return {**shape, **{k: v for k, v in options.items() if k != "window"}}, source


def make_proposer(
    model, method: str, options: dict, sampling, generator, memory: TextMemory | None = None,
    datastore: Datastore | None = None,
) -> Proposer:
    """The proposer object for ``method``, configured from ``options``."""
    if method == "lookahead":
        return LookaheadProposer(LookaheadConfig(**options), memory=memory, datastore=datastore)
    if method == "prompt_lookup":
        return PromptLookupProposer(PromptLookupConfig(**options), memory=memory,
                                    datastore=datastore)
    if method == "draft":
        draft_model = options.pop("draft_model", None)
        check_draft_model(model, draft_model)
        return DraftProposer(draft_model, DraftConfig(**options), sampling, generator)
    return NoProposer()


def check_draft_model(model, draft_model) -> None:
    """The draft must be a model whose vocabulary is the target's."""
    if not isinstance(draft_model, torch.nn.Module):
        raise TypeError(f"draft_model must be a loaded model for method 'draft', got {draft_model!r}")
    ours, theirs = _vocab_size(model), _vocab_size(draft_model)
    if ours != theirs:
        raise ValueError(
            f"draft_model must share the target's vocabulary: its vocab_size is {theirs}, "
            f"the target's is {ours}"
        )


def eos_token_ids(model, override=None) -> list[int]:
    """The ids that end a generation: ``override``, else the model's generation config's."""
    eos = override
    if eos is None and getattr(model, "generation_config", None) is not None:
        eos = model.generation_config.eos_token_id
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in ([eos] if isinstance(eos, int) else eos)]


def _check_inputs(model, input_ids, max_new_tokens) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
        raise TypeError(f"input_ids must be a LongTensor [1, prompt_len], got {_describe(input_ids)}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [1, prompt_len], got {list(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"input_ids must hold one sequence (batch size 1), got batch size {input_ids.shape[0]};"
            " serve several requests with `lookahead serve`"
        )
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids must not be empty: the prompt needs at least one token")
    vocab = _vocab_size(model)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:
        raise ValueError(
            f"input_ids must hold token ids in [0, {vocab}) for this model's vocabulary, "
            f"got ids from {low} to {high}"
        )
    check_int("max_new_tokens", max_new_tokens, 1, 1 << 30)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's context of {limit} tokens"
        )


def _check_memory(memory) -> TextMemory | None:
    if memory is not None and not isinstance(memory, TextMemory):
        raise TypeError(f"memory must be a lookahead.TextMemory or None, got {_describe(memory)}")
    return memory


def _check_datastore(datastore) -> Datastore | None:
    if datastore is not None and not isinstance(datastore, Datastore):
        raise TypeError(f"datastore must be a lookahead.Datastore or None, got "
                        f"{_describe(datastore)}")
    return datastore


def _vocab_size(model) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def _pop(options: dict, names: tuple[str, ...]) -> dict:
    return {name: options.pop(name) for name in names if name in options}


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__
