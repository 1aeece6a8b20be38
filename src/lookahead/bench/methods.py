"""How each benchmarked method generates one prompt, and what is measured about it.

Hugging Face methods (the baselines)::

    hf                model.generate greedy
    hf_prompt_lookup  model.generate(prompt_lookup_num_tokens=10)
    hf_assisted       model.generate(assistant_model=draft)

Ours (``lookahead.generate``): ``autoregressive``, ``lookahead``, ``prompt_lookup``, ``draft``.

Other engines on the same GGUF file, run only when named (their ``model`` is the engine):
``llamacpp`` (llama.cpp greedy in-process or by ``llama-completion``, ``bench/llamacpp.py``);
``llamacpp_server``, ``llamacpp_ngram``, ``llamacpp_draft`` (llama.cpp's greedy, its n-gram
speculation and its draft-model speculation, each on a ``llama-server``,
``bench/llamacpp_server.py``).

Every method returns a ``Measurement``: the new tokens, wall time, time to first token and the
number of target forward passes. For HF methods the steps and the first token's time come from
a streamer: ``generate`` hands it the prompt once, then the tokens of each forward pass.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field

import torch
from transformers.generation.streamers import BaseStreamer

import lookahead
from lookahead.attention import decoding_attention
from lookahead.config import (DraftConfig, LookaheadConfig, PromptLookupConfig,
                              method_names, method_spec, method_specs)
from lookahead.bench.datasets import encode_prompt
from lookahead.sources.datastore import Datastore
from lookahead.sources.memory import TextMemory

HF_METHODS = ("hf", "hf_prompt_lookup", "hf_assisted")
# Run only when named: llama.cpp in-process or by llama-completion, then by llama-server.
EXTERNAL_METHODS = ("llamacpp", "llamacpp_server", "llamacpp_ngram", "llamacpp_draft")
EXTERNAL_DRAFT_METHODS = ("llamacpp_draft",)  # llama.cpp drafting with the draft GGUF


def bench_methods() -> tuple[str, ...]:
    """The methods a benchmark runs when none are named: Hugging Face's, then every one of
    ours (``lookahead.config.METHOD_SPECS``)."""
    return HF_METHODS + method_names()


def all_methods() -> tuple[str, ...]:
    """Every method a benchmark can run, the external engines too."""
    return bench_methods() + EXTERNAL_METHODS


def draft_methods() -> tuple[str, ...]:
    """The methods that need a draft model."""
    return ("hf_assisted", *(spec.name for spec in method_specs() if spec.needs_draft),
            *EXTERNAL_DRAFT_METHODS)


# Greedy methods whose output should be token-for-token the baseline's.
BASELINE = "hf"


@dataclass
class Measurement:
    """One timed generation. ``stats`` is ``GenerationStats.as_dict()`` for our methods."""

    tokens: list[int]
    seconds: float
    time_to_first_token: float
    steps: int
    stats: dict | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def forward_tokens(self) -> float:
        """Input tokens of all its forward passes (one a step for HF's, which do not say)."""
        return self.stats["mean_forward_tokens"] * self.steps if self.stats else self.steps


@dataclass(frozen=True)
class MethodOptions:
    """Settings of the methods that take any (one object for the whole benchmark).

    memory: our lookahead and prompt lookup copy from their own earlier outputs in the run
        (a ``TextMemory`` per method, filled after the warm-up, so a prompt never sees its
        own answer).
    datastore: our lookahead and prompt lookup also copy from this corpus ("stdlib", "python" or
        a file or folder of text, see ``lookahead.sources.datastore.load_datastore``); None: none.
    max_step_tokens: the most tokens a step of ours feeds the model; None: no cap.
    lookahead_step_tokens: the same for lookahead alone where ``max_step_tokens`` is None
        (the cap a tuned profile chose with its shape).
    measured_step_costs: no tuned profile chose lookahead's shape: on a CPU, price it on this
        CPU's step costs, measured once (``lookahead.step_costs``), as a call without a
        window is priced.
    llamacpp_bin: the llama.cpp binary (or its folder) of ``llamacpp`` (None: the bindings)
        and of the ``llama-server`` methods (None: the one on ``PATH``).
    """

    lookahead: LookaheadConfig = field(default_factory=LookaheadConfig)
    prompt_lookup: PromptLookupConfig = field(default_factory=PromptLookupConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    hf_prompt_lookup_tokens: int = 10
    memory: bool = False
    datastore: str | None = None
    max_step_tokens: int | None = None
    lookahead_step_tokens: int | None = None
    measured_step_costs: bool = False
    llamacpp_bin: str | None = None

    @property
    def lookahead_cap(self) -> int | None:
        """The most tokens a lookahead step feeds: ``max_step_tokens``, else the tuned cap."""
        return self.max_step_tokens if self.max_step_tokens is not None else (
            self.lookahead_step_tokens)


class _StepClock(BaseStreamer):
    """Counts ``generate``'s streamer calls and notes when the first new token arrived."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call hands over the prompt
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


def measure(
    method: str,
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    options: MethodOptions,
    draft_model=None,
    pad_token_id: int | None = None,
    memory: TextMemory | None = None,
    datastore: Datastore | None = None,
    successors=None,
) -> Measurement:
    """Generate ``input_ids`` ([1, L]) greedily with ``method`` and time it (``memory``: the
    method's ``TextMemory``, ``datastore`` and ``successors``, for the methods that take
    them)."""
    if method in EXTERNAL_METHODS:  # ``model`` is that engine (bench/llamacpp.py)
        return model.measure(input_ids, max_new_tokens)
    if method in HF_METHODS:
        return _measure_hf(
            method, model, input_ids, max_new_tokens, options, draft_model, pad_token_id
        )
    kwargs = _our_options(method, options)
    spec = method_spec(method)
    if spec.needs_draft:
        kwargs["draft_model"] = draft_model
    if memory is not None:
        kwargs["memory"] = memory
    if datastore is not None and spec.copies_text:
        kwargs["datastore"] = datastore
    if successors is not None and spec.recycles:
        kwargs["successors"] = successors
    return _measure_ours(method, model, input_ids, max_new_tokens, kwargs)


def _measure_ours(method, model, input_ids, max_new_tokens, kwargs: dict) -> Measurement:
    # Greedy, as the baselines are, whatever the model's generation config says.
    result = lookahead.generate(model, input_ids, max_new_tokens, method, do_sample=False,
                                **kwargs)
    stats = result.stats
    return Measurement(
        tokens=result.new_tokens[0].tolist(),
        seconds=stats.seconds,
        time_to_first_token=stats.time_to_first_token,
        steps=stats.steps,
        stats=stats.as_dict(),
    )


def _our_options(method: str, options: MethodOptions) -> dict:
    """Every field of the method's config that ``lookahead.generate`` takes for it: the
    benchmark's settings where ``MethodOptions`` has a field named after the method, else the
    config's defaults."""
    spec = method_spec(method)
    if spec.config is None:
        return {}
    fields = dataclasses.asdict(getattr(options, method, None) or spec.config())
    cap = options.lookahead_cap if method == "lookahead" else options.max_step_tokens
    if cap is not None:
        fields["max_step_tokens"] = cap
    return {name: fields[name] for name in spec.options if name in fields}


def _measure_hf(
    method, model, input_ids, max_new_tokens, options, draft_model, pad_token_id
) -> Measurement:
    kwargs: dict = dict(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        attention_mask=torch.ones_like(input_ids),
        pad_token_id=pad_token_id,
    )
    if method == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = options.hf_prompt_lookup_tokens
    elif method == "hf_assisted":
        kwargs["assistant_model"] = draft_model
    restore = _freeze_assistant(draft_model) if method == "hf_assisted" else None
    start = time.perf_counter()
    clock = _StepClock(start)
    try:
        # The same attention kernels as ours (a no-op off CUDA): the comparison is of methods.
        with torch.inference_mode(), decoding_attention(model.device):
            output = model.generate(input_ids, streamer=clock, **kwargs)
    finally:
        if restore is not None:
            restore()
    seconds = time.perf_counter() - start
    first = clock.first_token_at if clock.first_token_at is not None else start + seconds
    return Measurement(
        tokens=output[0, input_ids.shape[1] :].tolist(),
        seconds=seconds,
        time_to_first_token=first - start,
        steps=max(clock.calls - 1, 0),
    )


def _freeze_assistant(draft_model):
    """HF adapts the assistant's ``num_assistant_tokens`` / confidence threshold and keeps them
    in ``assistant_model.generation_config`` across calls, so each run would start where the
    previous one ended. Restore the original after every run: every prompt starts equal."""
    saved = copy.deepcopy(draft_model.generation_config)

    def restore() -> None:
        draft_model.generation_config = copy.deepcopy(saved)

    return restore


@dataclass(frozen=True)
class Totals:
    """One run's sums over some prompts."""

    tokens: int
    seconds: float
    steps: int
    forward: float  # input tokens of every forward pass

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def forward_per_step(self) -> float:
        return self.forward / self.steps if self.steps else 0.0


# (data set, run label) -> that run's Measurement of each of the data set's prompts, in order
Runs = dict[tuple[str, str], list[Measurement]]


def total(measurements: list[Measurement], keep: list[int] | None = None) -> Totals:
    """Sums over ``measurements`` (only those at indices ``keep`` when given)."""
    chosen = measurements if keep is None else [measurements[i] for i in keep]
    return Totals(
        tokens=sum(m.new_tokens for m in chosen),
        seconds=sum(m.seconds for m in chosen),
        steps=sum(m.steps for m in chosen),
        forward=sum(m.forward_tokens for m in chosen),
    )


def agreeing(runs: Runs, dataset: str, labels: list[str]) -> list[int]:
    """Indices of the data set's prompts on which every run of ``labels`` wrote the same tokens.

    In bf16 a near tie can go either way in passes of different sizes, and once two runs'
    texts part, the rest of each is easier or harder to guess: comparing proposers on the
    prompts where they wrote the same text leaves that out.
    """
    first, *others = (runs[dataset, label] for label in labels)
    return [i for i, m in enumerate(first) if all(o[i].tokens == m.tokens for o in others)]


def measure_in_turn(model, tokenizer, prompts: dict, runs: dict, max_new_tokens: int,
                    progress=None, datastore: Datastore | None = None) -> Runs:
    """Each prompt by every run in turn, prompt-major, so that a slow spell of the machine hits
    every run alike (it drifts by tens of percent within minutes).

    prompts: data set -> ``lookahead.bench.datasets.Prompt`` list. runs: data set -> label ->
    (method, ``MethodOptions``); each distinct run is warmed up once, on the first prompt.
    ``progress(dataset, prompt)`` is called after each prompt. ``datastore``: a corpus our
    copying methods also copy from.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    warm = encode_prompt(tokenizer, next(iter(prompts.values()))[0])
    warmed = set()
    for run in (run for by_label in runs.values() for run in by_label.values()):
        if run not in warmed:
            measure(run[0], model, warm, 32, run[1], pad_token_id=pad, datastore=datastore)
            warmed.add(run)
    measured: Runs = {(d, label): [] for d in prompts for label in runs[d]}
    for dataset, items in prompts.items():
        for prompt in items:
            ids = encode_prompt(tokenizer, prompt)
            for label, (method, options) in runs[dataset].items():
                measured[dataset, label].append(measure(
                    method, model, ids, max_new_tokens, options, pad_token_id=pad,
                    datastore=datastore))
            if progress is not None:
                progress(dataset, prompt)
    return measured
