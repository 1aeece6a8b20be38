"""benchmarks/source_rates.py counts hits by DepthGauge's own rule, while the proposer it
wraps decodes exactly."""

from __future__ import annotations

import runpy
import sys
from collections import defaultdict
from pathlib import Path

import torch

from lookahead import generate

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_counts_follow_the_gauges_rule_and_the_text_is_exact(tiny_lm, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports ab_options beside it
    script = runpy.run_path(str(BENCHMARKS / "source_rates.py"))
    totals = defaultdict(lambda: [0, 0])
    model = tiny_lm("llama")
    ids = torch.tensor([[3, 5, 7, 3, 5, 7, 3, 5]])
    plain = generate(model, ids, max_new_tokens=12, method="autoregressive")
    with script["proposer"](script["counting_proposer"](totals)):
        result = generate(model, ids, max_new_tokens=12, method="lookahead", step_costs=(1.0,))
    assert torch.equal(result.new_tokens, plain.new_tokens)
    assert totals and all(0 <= hits <= samples for hits, samples in totals.values())
    # a depth is sampled only where the one before it was
    for (source, depth), (_, samples) in totals.items():
        if depth:
            assert totals[(source, depth - 1)][1] >= samples
    sys.modules.pop("ab_options", None)
