"""Frozen, validated configuration of each decoding method and of sampling.

Every config checks its own fields in ``__post_init__`` and raises a ``ValueError`` that names
the argument and the range it expects, so bad input never reaches the decode loop.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from importlib import import_module
from types import MappingProxyType

# Bounds that catch typos ("window=700") long before they would exhaust memory.
MAX_WINDOW = 64
MAX_NGRAM = 16
MAX_GUESS = 64
MAX_DRAFT_TOKENS = 64

_WORKLOAD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_int(name: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an int in ``[low, high]``, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_number(name: str, value: object, low: float, high: float) -> float:
    """Return ``value`` if it is a number (not a bool) in ``[low, high]``, else raise naming
    ``name``."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not low <= value <= high):
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
    return value


def option(default, low, high, help: str | None = None, metavar: str | None = None) -> Field:
    """A config field whose value must lie in ``[low, high]`` (ints for int bounds, numbers
    for float bounds; None passes where it is the default).

    ``help`` and ``metavar``: the field is also a command-line flag (``--name-with-dashes``,
    built by ``lookahead.cli.options``), whose range, default and text all come from here.
    """
    meta = {"range": (low, high)}
    if help is not None:
        meta.update(help=help, metavar=metavar or "X")
    return field(default=default, metadata=MappingProxyType(meta))


def check_ranges(config) -> None:
    """Check every field of the dataclass ``config`` that ``option`` gave a range."""
    for spec in fields(config):
        bounds = spec.metadata.get("range")
        value = getattr(config, spec.name)
        if bounds is None or (value is None and spec.default is None):
            continue
        if isinstance(bounds[0], int):
            check_int(spec.name, value, *bounds)
        else:
            check_number(spec.name, value, *bounds)


def check_step_tokens(step_tokens: object) -> int | None:
    """Return ``step_tokens`` (``max_step_tokens``: the most tokens a step feeds) if it is a
    positive int or None (no cap), else raise ValueError naming it."""
    if step_tokens is not None and (isinstance(step_tokens, bool)
                                    or not isinstance(step_tokens, int) or step_tokens < 1):
        raise ValueError(f"max_step_tokens must be a positive int or None, got {step_tokens!r}")
    return step_tokens


def check_workload(workload: object) -> str:
    """Return ``workload`` if it is a name of a tuned profile (letters, digits, ``_``, ``-``: it
    becomes part of a file name), else raise naming the argument."""
    if not isinstance(workload, str) or not _WORKLOAD.fullmatch(workload):
        raise ValueError(
            f"workload must be a name of letters, digits, '_' or '-' (e.g. code), got {workload!r}"
        )
    return workload


def check_step_costs(costs: object) -> tuple[float, ...]:
    """``costs`` as a tuple of floats if it is a non-empty sequence of finite numbers that
    starts at 1.0 and never decreases (what steps of 1, 2, ... tokens cost, relative to
    one), else raise naming the argument."""
    expected = "a non-empty list of numbers from 1.0, never decreasing"
    if isinstance(costs, (str, bytes)) or not hasattr(costs, "__len__") or not costs:
        raise ValueError(f"step_costs must be {expected}, got {costs!r}")
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in costs):
        raise ValueError(f"step_costs must be {expected}, got {costs!r}")
    values = tuple(float(c) for c in costs)
    if values[0] != 1.0 or not all(math.isfinite(c) for c in values) or any(
            b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"step_costs must be {expected}, got {costs!r}")
    return values


@dataclass(frozen=True)
class LookaheadConfig:
    """Shape of lookahead decoding (Fu et al., "Break the Sequential Dependency of LLM Inference
    Using Lookahead Decoding", ICML 2024).

    window: W, how many future positions the Jacobi window guesses at once.
    ngram: N, the length of the n-grams collected from the window's trajectory; the window keeps
        N - 1 levels of past guesses and each candidate verifies N - 1 tokens.
    guess: G, at most this many candidate n-grams are verified per step.
    prompt_pool: seed the n-gram pool with the prompt's own n-grams.
    output_pool: also add the n-grams of the accepted output as it grows.
    lookup_ngram: besides the pool's n-grams keyed by the last token alone, also verify the
        tokens that followed an earlier occurrence of the text's last ``lookup_ngram`` (down
        to 2) tokens: the first such occurrence, or, priced on ``step_costs``, the latest of
        those that match longest, and there also a match of the last token alone; below 2
        turns this off. A longer match predicts better than one token of context.
    lookup_tokens: how many tokens that continuation may have (a repeated passage can be
        accepted whole, so it may be longer than the pool's N - 1).
    lookup_max_tokens: while copies are accepted whole, each next copy is twice as long, up to
        this many tokens (a passage being repeated tends to go on); the first copy that is not
        brings the length back to ``lookup_tokens``. ``lookup_tokens`` or less (0) keeps the
        length fixed.
    token_cost: what one more token in a step's forward pass costs, as a fraction of a
        one-token pass. The window runs while the tokens its n-grams add per step pay for its
        W x (N - 1) tokens at that price (``WindowGauge``, measured per request). 0 runs it at
        every step, as the paper does: right where a few more tokens are free, as on a GPU.
    window_probe: while the window does not pay, it still runs every this many steps, so that
        its gain is measured again as the text changes (not where ``step_costs`` prices it:
        there it runs only where its full levels pay, ``proposers.gauges.WindowGauge``).
    trim_candidates: cut each candidate (a copy, a pool n-gram) before the first depth at
        which candidates from its source are accepted too rarely to pay for the token at
        ``token_cost`` (``DepthGauge``, measured per request). False feeds them whole.
    recycle: Token Recycling (Luo et al., 2024), on (8) by default (0: off): keep, for each
        token, the ``recycle`` tokens the model ranked highest after it at the last step
        it was verified in, and propose the tree read off that table from x0 (its top
        successor's chain, and the 2nd-4th at the first depth, 2nd at the next two).
    recycle_depth: how many tokens the recycled chains have.
    step_costs: what a step of 1, 2, 3, ... tokens costs, relative to a step of one (the
        first is 1.0), as ``lookahead tune`` measured on this machine (a tuned profile
        supplies it); past the last, each token costs what the last one did. Where given,
        candidates are cut on it instead of ``token_cost``: a token goes in while the
        tokens the step is expected to commit grow faster than its cost. Each request then
        moves the costs to what its own passes measure (``proposers.step_clock``). On a CPU
        the cost grows faster past a few tokens (the linear layers become bound by
        arithmetic), which a single ``token_cost`` does not capture. None: ``token_cost``.
    """

    # The default is small: on a 2-core CPU (bf16) a step of ~16 tokens costs ~1.2x a
    # one-token step and one of ~40 tokens ~1.6x, while the wider paper shape W=7 N=5 G=7
    # gained under 0.5 tokens per step over this one on HumanEval with SmolLM2 (`lookahead
    # tune` measures both sides on your machine).
    window: int = option(2, 1, MAX_WINDOW, "window size W: future positions the Jacobi window "
                         "guesses at once", "W")
    ngram: int = option(5, 2, MAX_NGRAM, "n-gram length N", "N")
    guess: int = option(4, 1, MAX_GUESS, "candidate n-grams verified per step", "G")
    prompt_pool: bool = True
    output_pool: bool = True
    # A longer match predicts better: replayed on HumanEval outputs of Qwen2.5-Coder-1.5B,
    # matching up to 8 tokens committed more per step than up to 3, never fewer.
    lookup_ngram: int = option(8, 0, MAX_NGRAM)
    lookup_tokens: int = option(8, 1, MAX_DRAFT_TOKENS, "length of the continuation copied "
                                "from earlier text after the last n-gram", "L")
    lookup_max_tokens: int = option(32, 0, MAX_DRAFT_TOKENS, "the copy doubles up to this "
                                    "length while accepted whole (0 keeps it fixed)", "L")
    # SmolLM2-135M bf16 on a 2-core CPU: 16 tokens cost ~1.4x one, 32 ~1.8x. There the
    # window's n-grams added 0.03-0.3 tokens per step for its 8 tokens, which paid on prose
    # with little to copy and not on code that repeats itself (`lookahead tune` measures
    # this machine's price).
    token_cost: float = option(0.025, 0.0, 1.0, "what one more token in a forward pass "
                               "costs, as a fraction of a one-token pass; the window runs while "
                               "its n-grams pay for its tokens at that price (0 runs it at every "
                               "step, as on a GPU)", "C")
    window_probe: int = option(16, 1, 1 << 20)
    trim_candidates: bool = True
    step_costs: tuple[float, ...] | None = None
    # Token Recycling: the model's own top-k at every verified node, kept per token and read
    # back as a tree of candidates (``proposers.recycling``). On by default since its top-k is
    # compiled (0.06 against 0.7 ms a step of 4 rows of Qwen's logits): on an Intel Xeon (2
    # threads) a shared table decoded Qwen2.5-Coder-1.5B 2-7 % faster on chat, HumanEval and
    # MT-Bench prompts, SmolLM2-135M within 1 % (``benchmarks/ab_options.py``;
    # docs/methods.md).
    recycle: int = option(8, 0, 32, "successors kept per token from the model's own top-k "
                          "at each verified node, read back as candidates (0: off)", "K")
    recycle_depth: int = option(6, 1, MAX_DRAFT_TOKENS, "how deep the recycled candidates "
                                "go", "D")

    def __post_init__(self) -> None:
        check_ranges(self)
        if not isinstance(self.trim_candidates, bool):
            raise TypeError(f"trim_candidates must be a bool, got {self.trim_candidates!r}")
        if self.step_costs is not None:
            object.__setattr__(self, "step_costs", check_step_costs(self.step_costs))

    @property
    def levels(self) -> int:
        """Number of trajectory levels kept in the window (N - 1)."""
        return self.ngram - 1


@dataclass(frozen=True)
class PromptLookupConfig:
    """Prompt lookup decoding: copy the tokens that followed the first earlier occurrence of the
    text's last n-gram (n from ``max_ngram`` down to ``min_ngram``).

    num_draft_tokens: how many tokens the copy has.
    max_draft_tokens: while copies are accepted whole, each next one is twice as long, up to
        this many tokens; a copy that is not brings the length back to ``num_draft_tokens``.
        ``num_draft_tokens`` or less (0) keeps the length fixed, as Hugging Face's does.
    """

    num_draft_tokens: int = option(10, 1, MAX_DRAFT_TOKENS, "tokens proposed per step", "K")
    max_ngram: int = option(3, 1, MAX_NGRAM, "longest n-gram matched", "N")
    min_ngram: int = option(1, 1, MAX_NGRAM)
    max_draft_tokens: int = option(0, 0, MAX_DRAFT_TOKENS, "the copy doubles up to this length "
                                   "while accepted whole (0: fixed at --num-draft-tokens)", "K")

    def __post_init__(self) -> None:
        check_ranges(self)
        check_int("min_ngram", self.min_ngram, 1, self.max_ngram)


@dataclass(frozen=True)
class DraftConfig:
    """Draft-model speculative decoding: a small model proposes ``num_draft_tokens`` per step.

    When greedy, the draft model speeds up its own drafting with prompt lookup: each draft
    forward also checks up to ``lookup_tokens`` tokens copied from earlier text after a matching
    n-gram (``lookup_ngram`` down to 1), so several draft tokens can come from one draft forward.
    The drafted tokens are exactly those of plain greedy drafting; 0 turns this off.

    ``draft_vocab``: the draft scores only the first ``draft_vocab`` token ids, and those of
    the text (``lookahead.proposers.shortlist``); 0: all of them; None: 32,768 on a CPU, where
    the output layer is a large share of a small draft's pass, and all on a GPU, where it is
    not. Which tokens the draft proposes changes how many the target accepts, never the text.
    """

    # 4, not 8: each drafted token costs a draft pass and a wider target pass, and the last
    # ones are accepted least. With Qwen2.5-Coder 0.5B drafting for 1.5B on a 2-core CPU, K=4
    # ran 1.13-1.15x as fast as K=8 on 8 HumanEval prompts, in both orders, and K=3 slower
    # (`lookahead bench --methods hf,draft --draft-tokens K` for each K, Intel Xeon, 2026-11-25).
    num_draft_tokens: int = option(4, 1, MAX_DRAFT_TOKENS, "tokens proposed per step", "K")
    lookup_tokens: int = option(8, 0, MAX_DRAFT_TOKENS, "length of the copy each draft pass "
                                "also checks (0 turns the copy off)", "L")
    lookup_ngram: int = option(3, 1, MAX_NGRAM)
    draft_vocab: int | None = option(None, 0, 1 << 24, "the draft scores only the first S token "
                                     "ids, the commonest in a BPE vocabulary, and those of the "
                                     "text; the text stays the same (default: 32768 on a CPU, "
                                     "all on a GPU; 0: all)", "S")

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from the target's logits.

    ``do_sample=False`` is greedy (argmax). Otherwise logits are divided by ``temperature``, cut to
    the ``top_k`` most likely tokens (0 = off) and to the smallest set whose probability reaches
    ``top_p`` (1.0 = off), in that order, as Hugging Face's warpers do.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, bool):
            raise TypeError(f"do_sample must be a bool, got {self.do_sample!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature > 0:
            raise ValueError(f"temperature must be a number > 0, got {self.temperature!r}")
        check_int("top_k", self.top_k, 0, 1 << 30)
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None:
            check_int("seed", self.seed, 0, (1 << 63) - 1)


def field_names(config: type) -> tuple[str, ...]:
    """The keyword names of a config dataclass, in declaration order."""
    return tuple(f.name for f in fields(config))


# What every proposing method takes besides its config's fields: the cap on a step's forward
# tokens; and what the copying methods take: the texts they copy from.
STEP_OPTIONS = ("max_step_tokens",)
COPY_SOURCES = ("memory", "datastore")
# The sampling options every method takes (``SamplingConfig``'s fields).
SAMPLING_OPTIONS = field_names(SamplingConfig)


@dataclass(frozen=True)
class MethodSpec:
    """One decoding method: the row of ``METHOD_SPECS`` from which the library, the command
    line, the benchmark and the server derive its name, its options and their checks.

    name: what ``method=`` says.
    config: the frozen dataclass of its options (its fields are keywords of ``generate`` and,
        where ``option`` gave them a help text, flags), or None for none.
    proposer: what builds its proposer from ``(config, lookahead.proposers.base.ProposerInputs)``:
        a callable, or ``"module:attribute"`` imported on first use (so that this table, which
        the command line reads before torch is loaded, imports nothing heavy); None: proposes
        nothing (one token per pass).
    copies_text: copies from earlier text, so it takes ``memory`` and ``datastore``.
    needs_draft: takes ``draft_model``, a loaded model sharing the target's vocabulary.
    recycles: takes ``successors``, a ``lookahead.proposers.recycling.SuccessorTable`` shared
        by the requests of one model (its own top-k predictions, kept across requests).
    tuned: its shape may come from a profile ``lookahead tune`` saved (``window="auto"``,
        ``workload``).
    """

    name: str
    config: type | None = None
    proposer: str | object | None = None
    copies_text: bool = False
    needs_draft: bool = False
    tuned: bool = False
    recycles: bool = False

    @property
    def options(self) -> tuple[str, ...]:
        """The keyword options ``generate`` takes for this method, besides sampling's."""
        return (*(("draft_model",) if self.needs_draft else ()),
                *(field_names(self.config) if self.config is not None else ()),
                *(COPY_SOURCES if self.copies_text else ()),
                *(("successors",) if self.recycles else ()),
                *(("workload",) if self.tuned else ()),
                *(STEP_OPTIONS if self.proposer is not None else ()))

    def proposer_factory(self):
        """The callable that builds this method's proposer (None: it proposes nothing)."""
        if self.proposer is None or callable(self.proposer):
            return self.proposer
        module, _, attribute = self.proposer.partition(":")
        target = import_module(module)
        for part in attribute.split("."):
            target = getattr(target, part)
        return target


# Adding a method: its proposer module, one row here, and its docs (docs/methods.md).
METHOD_SPECS: tuple[MethodSpec, ...] = (
    MethodSpec("autoregressive"),
    MethodSpec("lookahead", LookaheadConfig, "lookahead.proposers.lookahead:LookaheadProposer.build",
               copies_text=True, tuned=True, recycles=True),
    MethodSpec("prompt_lookup", PromptLookupConfig,
               "lookahead.proposers.prompt_lookup:PromptLookupProposer.build", copies_text=True),
    MethodSpec("draft", DraftConfig, "lookahead.proposers.draft:DraftProposer.build",
               needs_draft=True),
)


def method_specs() -> tuple[MethodSpec, ...]:
    """The table's rows, read when called (a caller that imported ``METHOD_SPECS`` by name
    would keep the table as it was then)."""
    return METHOD_SPECS


def method_names() -> tuple[str, ...]:
    """Every method's name, in table order."""
    return tuple(spec.name for spec in METHOD_SPECS)


def method_spec(method: object) -> MethodSpec:
    """The row of ``method``; a ValueError naming the argument and the choices otherwise."""
    for spec in METHOD_SPECS:
        if spec.name == method:
            return spec
    raise ValueError(f"method must be one of {', '.join(method_names())}; got {method!r}")


def options_by_method() -> Mapping[str, tuple[str, ...]]:
    """Each method's options (read-only), as ``MethodSpec.options`` derives them."""
    return MappingProxyType({spec.name: spec.options for spec in METHOD_SPECS})


def copying_methods() -> tuple[str, ...]:
    """The methods that copy from earlier text (a ``memory``, a ``datastore``)."""
    return tuple(spec.name for spec in METHOD_SPECS if spec.copies_text)


def __getattr__(name: str):
    # ``METHODS`` and ``METHOD_OPTIONS`` as names, derived from the table when read.
    if name == "METHODS":
        return method_names()
    if name == "METHOD_OPTIONS":
        return options_by_method()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
