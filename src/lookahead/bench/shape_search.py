"""Which shapes ``lookahead tune`` tries, and which one it keeps.

``choose_shape`` keeps the default shape unless another is predicted faster by more than a
margin, no slower on any data set, and faster on most sample prompts; ``versus_default``
says by how much a shape leads the default.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from lookahead.profiles import (
    DEFAULT_LOOKUP_TOKENS,
    DEFAULT_SHAPE,
    DEFAULT_TOKEN_COST,
    STEP_KEY,
    shape_dict,
)

logger = logging.getLogger(__name__)


# On a CPU a forward of 8-16 tokens costs little more than one, while 64 costs two to three
# times as much (without AMX the curve is steeper still): the set is dense in small windows
# around the default, and keeps the paper's wider shapes for machines where they pay. A
# longer copied continuation (the 4th number, lookup_tokens; 8 when left out) costs forward
# tokens only when the text repeats itself, and then often pays: SmolLM2 on HumanEval went
# from 3.13 to 3.42 tokens/step with 24 in place of 8. Where a pass of 8 tokens costs clearly
# more than one of 4 (float32 taken weight first on an AVX2 CPU), a shorter one pays instead:
# 1x4x2x4 won GSM8K there; once one-token passes got cheaper too, 1x3x2x4 won HumanEval and
# GSM8K, and 1x4x3 MT-Bench.
DEFAULT_SHAPES = (
    (1, 5, 3), (1, 4, 6), (1, 4, 3), (2, 4, 4), (2, 5, 4), (2, 5, 6), (2, 6, 6), (3, 5, 5),
    (4, 5, 4), (7, 5, 7), (15, 5, 15), (2, 5, 4, 16), (2, 5, 4, 24), (2, 4, 4, 16),
    (1, 5, 3, 16), (1, 4, 2, 4), (1, 3, 2, 4),
)


SELECT = ("predicted", "measured")


def scaled_costs(token_cost: float, scales) -> list[float]:
    """The token costs ``token_cost`` times each of ``scales``, at most 1, rounded, distinct and
    ascending."""
    return sorted({round(min(token_cost * x, 1.0), 4) for x in scales})


def shape_runs(shapes, costs: list[float], caps=(None,)
          ) -> list[tuple[tuple[int, ...], float | None, int | None]]:
    """(shape, token cost, step cap) to measure: every shape at each of ``costs`` with each
    of ``caps``, and before the default shape's rows, where the shapes have it, the default at
    the shipped cost (None) and uncapped, as a user gets it untuned.

    The shipped default is what the tuner must beat: a profile must not differ from what a
    user gets untuned without having beaten it. One MT-Bench profile kept the default
    shape, found no better, but at the curve's cost (0.064 against 0.025), and ran slower on
    the held-out prompts (0.96x on 12; 1.01x on the 5 where both wrote the same text).
    """
    runs: list[tuple[tuple[int, ...], float | None, int | None]] = []
    for shape in shapes:
        if _is_default(shape_dict(shape)) and (DEFAULT_TOKEN_COST not in costs
                                               or None not in caps):
            runs.append((shape, None, None))
        runs += [(shape, cost, cap) for cost in costs for cap in caps]
    return runs


def choose_shape(rows: list[dict], select: str = "predicted", margin: float = 0.0) -> dict:
    """The row of the fastest shape; the default shape's row instead when it is among them and
    no other clearly leads it.

    With ``select="predicted"`` and per-prompt predictions in the rows, shapes are ranked
    against the default prompt by prompt (``versus_default``): by the geometric mean of their
    predicted speed ratios. A sum over the sample weighs each prompt by its output's length,
    and in bf16 a shape's output can part from the default's after a near tie and run to
    another length (SmolLM2, HumanEval/114: 63 tokens in the default shape, 238 in W1 N5 G3):
    that prompt then decides the sum. A shape replaces the default only if its ratio is above
    ``1 + margin``, at least 1 on every data set (a shape that wins on chat by more than it
    loses on code would make code slower for whoever decodes code), above 1 on more than
    half of the prompts (a lead won on one or two prompts is theirs, not the data set's), and
    its sum leads the default's by more than ``margin`` too: the default is a good shape, and
    is left only where every reading of the sample agrees (SmolLM2 on HumanEval: W1 N4 G6 led
    on all 5 sample prompts, by 12 %, but not in sum, and lost on prompts it had not seen).

    Otherwise (measured timing, or rows without per-prompt figures) the fastest by
    ``{select}_tokens_per_second``, if it leads the default by more than ``margin`` and, when
    predicted, is no slower on any data set (``predicted_per_dataset``).
    """
    default = default_row(rows)
    versus = {id(row): versus_default(row, default) for row in rows} if default else {}
    if select == "predicted" and versus and all(versus.values()):
        eligible = [row for row in rows if versus[id(row)].replaces_default(margin)
                    and _leads(row, default, "predicted_tokens_per_second", margin)]
        return max(eligible, key=lambda row: versus[id(row)].speedup, default=default)
    key = f"{select}_tokens_per_second"
    if default is not None and select == "predicted":
        rows = [row for row in rows if row is default or _no_set_slower(row, default)]
    best = max(rows, key=lambda row: row[key])
    return default if default is not None and not _leads(best, default, key, margin) else best


def _leads(row: Mapping, default: Mapping, key: str, margin: float) -> bool:
    return row[key] > default[key] * (1.0 + margin)


@dataclass(frozen=True)
class Versus:
    """A shape's predicted speed against the default's, prompt by prompt: ``speedup``, the
    geometric mean of the per-prompt ratios; ``per_dataset``, the same within each data set;
    ``won`` of ``prompts``, the prompts on which it is predicted faster."""

    speedup: float
    per_dataset: Mapping[str, float]
    won: int
    prompts: int

    def replaces_default(self, margin: float) -> bool:
        return (self.speedup > 1.0 + margin and 2 * self.won > self.prompts
                and all(ratio >= 1.0 for ratio in self.per_dataset.values()))


def versus_default(row: Mapping, default: Mapping) -> Versus | None:
    """``row`` against ``default`` prompt by prompt (``predicted_per_prompt``: data set ->
    predicted tok/s of each sample prompt), or None where either lacks those figures (a
    profile saved before they were kept) or a rate is 0."""
    ours, theirs = row.get("predicted_per_prompt"), default.get("predicted_per_prompt")
    if not isinstance(ours, Mapping) or not isinstance(theirs, Mapping) or not theirs:
        return None
    ratios: dict[str, list[float]] = {}
    for name, rates in theirs.items():
        if len(ours.get(name, ())) != len(rates) or not all(rates) or not all(ours[name]):
            return None
        ratios[name] = [a / b for a, b in zip(ours[name], rates, strict=True)]
    every = [ratio for values in ratios.values() for ratio in values]
    return Versus(
        speedup=statistics.geometric_mean(every),
        per_dataset={name: statistics.geometric_mean(values) for name, values in ratios.items()},
        won=sum(ratio > 1.0 for ratio in every),
        prompts=len(every),
    )


def _is_default(row: Mapping) -> bool:
    """Whether a shape or tuning row is the default shape at the shipped token cost, with
    no step cap."""
    return all(row[k] == v for k, v in DEFAULT_SHAPE.items()) and (
        row.get("lookup_tokens", DEFAULT_LOOKUP_TOKENS) == DEFAULT_LOOKUP_TOKENS
    ) and row.get("token_cost", DEFAULT_TOKEN_COST) == DEFAULT_TOKEN_COST and (
        row.get(STEP_KEY) is None
    )


def _no_set_slower(row: dict, default: dict) -> bool:
    ours, theirs = row.get("predicted_per_dataset", {}), default.get("predicted_per_dataset", {})
    return all(ours.get(name, 0.0) >= rate for name, rate in theirs.items())


def default_row(rows: list[dict]) -> dict | None:
    """The row of the default shape among tuning rows, or None."""
    return next((row for row in rows if _is_default(row)), None)
