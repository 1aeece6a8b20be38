"""The server's prefill lengths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lookahead.server.shapes import prefill_length, prefill_lengths

pytestmark = pytest.mark.usefixtures("one_thread")


@given(st.integers(1, 100_000))
def test_prefill_length_pads_by_at_most_a_quarter_to_few_lengths(tokens):
    """The server's prefill shapes: never shorter than the prompt, at most 7 tokens or 25 %
    longer, and four lengths per doubling (so few kernels are compiled and kept)."""
    length = prefill_length(tokens)
    assert tokens <= length <= max(tokens + 7, tokens * 5 // 4)
    assert prefill_length(length) == length
    assert prefill_lengths(length)[-1] == length


def test_prefill_lengths_examples():
    assert prefill_lengths(100) == [8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112]
    assert len(prefill_lengths(4096)) == 8 + 4 * 6
