"""One request, from checked arguments to its ``Decoder``.

``make_decoder`` is where every entry point (``lookahead.generate`` and ``stream``, a batch's
rows, the server's requests, the benchmark) turns a method's name and keyword options into a
``Decoder``: the method's row of ``lookahead.config.METHOD_SPECS`` says which options it takes
and what builds its proposer; a lookahead call without a window gets this machine's tuned shape
(``auto_shape``); the stop ids come from the model's generation config (``eos_token_ids``).
"""

from __future__ import annotations

import logging

import torch

from lookahead.config import (
    SAMPLING_OPTIONS,
    SamplingConfig,
    check_int,
    check_step_tokens,
    method_spec,
)
from lookahead.decode import Decoder
from lookahead.kernels.packing import packing_of
from lookahead.prefix_cache import CachedPrefix
from lookahead.profiles import DEFAULT_SOURCE, find_shape
from lookahead.proposers.base import NoProposer, Proposer, ProposerInputs, vocab_size
from lookahead.sources.datastore import Datastore
from lookahead.sources.memory import TextMemory
from lookahead.proposers.recycling import SuccessorTable
from lookahead.step_costs import measured_shape

logger = logging.getLogger(__name__)

# ``GenerationStats.shape_source`` of a lookahead call that gave its window.
GIVEN_SOURCE = "given"


def make_decoder(model, input_ids, max_new_tokens, method, *, controls=None,
                 prefix: CachedPrefix | None = None, logprobs: int | None = None,
                 **options) -> Decoder:
    """Validate every argument and build the per-request ``Decoder``.

    input_ids: LongTensor [1, prompt_len]; ``options``: the method's options
    (``MethodSpec.options``), the sampling options and ``eos_token_id``; ``controls``: logits
    processors and stopping criteria (``lookahead.controls.Controls``); ``prefix``: the KV
    entries of the prompt's first tokens, computed before (``lookahead.prefix_cache``);
    ``logprobs``: record each committed token's log-probability and this many alternatives
    (see ``Decoder``).
    """
    if prefix is not None and not isinstance(prefix, CachedPrefix):
        raise TypeError(f"prefix must be a lookahead.prefix_cache.CachedPrefix or None, got "
                        f"{describe(prefix)}")
    check_inputs(model, input_ids, max_new_tokens)
    spec = method_spec(method)
    eos = options.pop("eos_token_id", None)
    sampling = SamplingConfig(**_pop(options, SAMPLING_OPTIONS))
    unknown = set(options) - set(spec.options)
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)} for method {method!r}; "
            f"it takes {list(spec.options) or 'none'}"
        )
    generator = None
    if sampling.do_sample:
        generator = torch.Generator(device=model.device)  # draws where the logits are
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
    shape_source = None
    if spec.tuned:
        options, shape_source = auto_shape(model, options)
    memory = _check_memory(options.pop("memory", None))
    step_tokens = check_step_tokens(options.pop("max_step_tokens", None))
    inputs = ProposerInputs(model, sampling, generator, memory,
                            _check_datastore(options.pop("datastore", None)),
                            options.pop("draft_model", None),
                            _check_successors(options.pop("successors", None)))
    decoder = Decoder(
        model,
        input_ids,
        make_proposer(method, options, inputs),
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        eos_token_ids=eos_token_ids(model, eos),
        generator=generator,
        method=method,
        memory=memory,
        step_tokens=step_tokens,
        controls=controls,
        prefix=prefix,
        logprobs=logprobs,
    )
    decoder.stats.shape_source = shape_source
    return decoder


def make_proposer(method: str, options: dict, inputs: ProposerInputs) -> Proposer:
    """The proposer of ``method``, its config made from ``options`` (its config's fields)."""
    spec = method_spec(method)
    factory = spec.proposer_factory()
    if factory is None:
        return NoProposer()
    config = spec.config(**options) if spec.config is not None else None
    return factory(config, inputs)


def resolve_auto_shape(model, options: dict, cache_dir=None) -> dict:
    """``auto_shape``'s options alone."""
    return auto_shape(model, options, cache_dir)[0]


def auto_shape(model, options: dict, cache_dir=None) -> tuple[dict, str]:
    """Lookahead ``options`` with no ``window``, or ``window="auto"``, given this machine's
    tuned shape, and where the shape came from.

    The shape comes from the profile ``lookahead tune`` saved for the model (by its
    ``name_or_path``: a bundled name, a folder or a hub id), dtype and device -- the profile of
    ``options["workload"]`` if that is given and saved -- else, on the CPU, the default shape
    priced on this CPU's step costs, measured once and cached (``step_costs.measured_shape``),
    else (on a GPU) the default shape; ``ngram``, ``guess`` and ``max_step_tokens`` given
    beside it are kept (a profile's or measured shape can bring a step cap of its own, which
    one given here replaces). An explicit int ``window`` keeps the shape as given, and
    measures nothing. The source is the profile's path, "measured: <the cached curve's path>",
    ``profiles.DEFAULT_SOURCE`` ("default") or ``GIVEN_SOURCE`` ("given", the caller's
    window). ``cache_dir``: the cache holding profiles and curves (None: the user's).
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
    device = model.device.type
    shape, source = find_shape(model.name_or_path, model.dtype, cache_dir, device=device,
                               workload=workload, packed=packing_of(model))
    # On a CPU the step costs take seconds to measure and decide how far a step pays; a GPU
    # step's tokens come nearly free, and its default shape runs the window at every step.
    if source == DEFAULT_SOURCE and device == "cpu":
        try:
            shape, source = measured_shape(model, cache_dir)
        except (RuntimeError, ValueError, TypeError) as error:  # a model it cannot time
            logger.warning("could not measure the step costs of %s (%s); using the default "
                           "shape", model.name_or_path, error)
    logger.info("window='auto': the shape %s for %s from %s", shape, model.name_or_path, source)
    return {**shape, **{k: v for k, v in options.items() if k != "window"}}, source


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


def check_input_ids(input_ids, rows: str = "batch") -> None:
    """``input_ids`` must be a LongTensor [B, W] with B, W >= 1 (``rows``: how the message
    names B, "batch" or "1")."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
        raise TypeError(f"input_ids must be a LongTensor [{rows}, prompt_len], got "
                        f"{describe(input_ids)}")
    if input_ids.dim() != 2 or 0 in input_ids.shape:
        raise ValueError(f"input_ids must have shape [{rows}, prompt_len] with at least one "
                         f"token, got {list(input_ids.shape)}")


def check_inputs(model, input_ids, max_new_tokens) -> None:
    """One request's prompt (LongTensor [1, prompt_len] of the model's ids) and token limit,
    which must fit in the model's context."""
    check_input_ids(input_ids, rows="1")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"input_ids must hold one sequence (batch size 1), got batch size {input_ids.shape[0]};"
            " serve several requests with `lookahead serve`"
        )
    vocab = vocab_size(model)
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


def describe(value) -> str:
    """How an error message names a value of the wrong kind: a tensor's dtype and shape, or
    the type's name."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


def _check_memory(memory) -> TextMemory | None:
    if memory is not None and not isinstance(memory, TextMemory):
        raise TypeError(f"memory must be a lookahead.TextMemory or None, got {describe(memory)}")
    return memory


def _check_successors(successors) -> SuccessorTable | None:
    if successors is not None and not isinstance(successors, SuccessorTable):
        raise TypeError(f"successors must be a lookahead.SuccessorTable or None, got "
                        f"{describe(successors)}")
    return successors


def _check_datastore(datastore) -> Datastore | None:
    if datastore is not None and not isinstance(datastore, Datastore):
        raise TypeError(f"datastore must be a lookahead.Datastore or None, got "
                        f"{describe(datastore)}")
    return datastore


def _pop(options: dict, names: tuple[str, ...]) -> dict:
    return {name: options.pop(name) for name in names if name in options}
