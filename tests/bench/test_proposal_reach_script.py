"""benchmarks/proposal_reach.py: how far each step's candidates reached, fed and proposed,
while the proposer it wraps decodes exactly."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

from lookahead import generate

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports ab_options beside it
    yield runpy.run_path(str(BENCHMARKS / "proposal_reach.py"))
    sys.modules.pop("ab_options", None)


def test_a_step_counts_what_was_fed_what_was_proposed_and_what_the_cut_lost(script):
    step = script["Step"](position=10, proposed=[([1, 2, 3], "text"), ([1, 2, 4, 5], "pool"),
                                                 ([9], "recycled@1.1")],
                          fed=[[1, 2], [9]], committed=3)
    totals = script["Reach"]()
    totals.add(step, [1, 2, 4, 5, 6])
    assert (totals.steps, totals.committed, totals.fed_reach, totals.proposed_reach) == (
        1, 3, 2, 4)
    assert totals.nodes == 3  # 1, (1, 2) and 9
    assert totals.alone == {"text": 2, "pool": 4, "recycled@": 0}
    assert totals.lost == {"pool": 2}  # the pool reached 4, the fed candidates 2
    assert totals.report()[0].startswith("steps 1: committed 3.000 tokens a step, reachable "
                                         "with what was fed 3.000, with all that was proposed "
                                         "5.000")


def test_the_logged_steps_are_the_decoders_and_the_text_is_exact(script, tiny_lm):
    model = tiny_lm("llama")
    ids = torch.tensor([[3, 5, 7, 3, 5, 7, 3, 5]])
    plain = generate(model, ids, max_new_tokens=12, method="autoregressive")
    steps = []
    with script["proposer"](script["logging_proposer"](steps)):
        result = generate(model, ids, max_new_tokens=12, method="lookahead", step_costs=(1.0,))
    assert torch.equal(result.new_tokens, plain.new_tokens)
    text = result.sequences[0].tolist()
    totals = script["Reach"]()
    for step in steps:
        totals.add(step, text[step.position:])
    assert totals.steps == len(steps) > 0
    # every step commits what its fed candidates reached plus one (less at the token limit)
    assert sum(step.committed for step in steps) == result.new_tokens.shape[1] - 1
    assert totals.committed <= totals.steps + totals.fed_reach <= (
        totals.steps + totals.proposed_reach)
