"""GenerationStats' figures."""


from __future__ import annotations

import json

import pytest

from lookahead.stats import GenerationStats

pytestmark = pytest.mark.usefixtures("one_thread")


# --- statistics ----------------------------------------------------------------------------


def test_generation_stats_numbers():
    stats = GenerationStats(method="lookahead", prompt_tokens=12)
    for forward, proposed, accepted in [(12, 0, 0), (8, 4, 2), (8, 4, 0), (6, 3, 3), (5, 0, 0)]:
        stats.record_step(forward, proposed, accepted)
    stats.new_tokens = 1 + 3 + 1 + 4 + 1
    stats.seconds = 2.0
    assert stats.steps == 5
    assert stats.accepted_per_step == [0, 2, 0, 3, 0]
    assert stats.proposed_per_step == [0, 4, 4, 3, 0]
    assert stats.forward_tokens_per_step == [12, 8, 8, 6, 5]
    assert stats.accepted_per_position == [2, 2, 1]  # steps accepting >= 1, >= 2, >= 3
    assert stats.tokens_per_step == pytest.approx(10 / 5)
    assert stats.tokens_per_second == pytest.approx(5.0)
    assert stats.mean_accepted == pytest.approx((2 + 0 + 3) / 3)  # steps that proposed
    assert stats.mean_forward_tokens == pytest.approx((8 + 8 + 6 + 5) / 4)  # prefill excluded
    data = json.loads(json.dumps(stats.as_dict()))
    assert data["tokens_per_step"] == pytest.approx(2.0)
    assert data["mean_accepted"] == pytest.approx(5 / 3)
    assert data["accepted_per_position"] == [2, 2, 1] and data["method"] == "lookahead"


def test_generation_stats_empty():
    stats = GenerationStats(method="autoregressive")
    assert stats.tokens_per_step == 0.0 and stats.tokens_per_second == 0.0
    assert stats.mean_accepted == 0.0 and stats.mean_forward_tokens == 0.0
