"""Prompt-lookup matching (find_continuation)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.proposers.prompt_lookup import find_continuation

pytestmark = pytest.mark.usefixtures("one_thread")


# --- prompt-lookup matching ----------------------------------------------------------------


def test_find_continuation_examples():
    assert find_continuation([1, 2, 3, 4, 9, 2, 3], 2, 1, 2) == [4, 9]  # the docstring's
    # The first earlier occurrence wins, never the suffix itself.
    assert find_continuation([1, 2, 7, 1, 2, 8, 1, 2], 2, 1, 2) == [7, 1]
    # Longest n first: "9 4 2" first occurred followed by 7; "4 2" first by 8.
    assert find_continuation([4, 2, 8, 9, 4, 2, 7, 9, 4, 2], 3, 1, 2) == [7, 9]
    assert find_continuation([4, 2, 8, 9, 4, 2, 7, 9, 4, 2], 2, 1, 2) == [8, 9]
    assert find_continuation([5, 4, 2, 8, 2, 7, 1, 4, 2], 2, 1, 3) == [8, 2, 7]
    assert find_continuation([5, 4, 2, 8, 2, 7, 1, 4, 2], 1, 1, 3) == [8, 2, 7]
    assert find_continuation([5, 2, 6, 4, 2, 8, 1, 4, 2], 2, 1, 2) == [8, 1]
    assert find_continuation([5, 2, 6, 4, 2, 8, 1, 4, 2], 1, 1, 2) == [6, 4]
    # min_ngram bounds the fallback.
    assert find_continuation([5, 2, 9, 4, 2], 3, 2, 3) == []
    assert find_continuation([5, 2, 9, 4, 2], 3, 1, 3) == [9, 4, 2]
    # No earlier occurrence at all; the suffix never matches itself.
    assert find_continuation([1, 2, 3], 3, 1, 4) == []
    assert find_continuation([7], 2, 1, 4) == []
    # The continuation may be shorter than asked, at the end of the text.
    assert find_continuation([1, 2, 1], 1, 1, 5) == [2, 1]


def brute_force_continuation(tokens, max_ngram, min_ngram, length):
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - n):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + length]
    return []


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=30),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 6),
)
def test_find_continuation_follows_an_earlier_occurrence(tokens, a, b, length):
    max_ngram, min_ngram = max(a, b), min(a, b)
    result = find_continuation(tokens, max_ngram, min_ngram, length)
    assert isinstance(result, list) and len(result) <= length
    if result:
        # Some n-gram suffix occurred earlier (not as the suffix itself) followed by result.
        assert any(
            tokens[i : i + n] == tokens[-n:]
            and tokens[i + n : i + n + len(result)] == result
            and i + n < len(tokens)
            for n in range(min_ngram, max_ngram + 1)
            if n < len(tokens)
            for i in range(len(tokens) - n)
        )
        assert len(result) == length or result[-1:] == tokens[-1:]
    else:
        assert not any(
            tokens[i : i + n] == tokens[-n:]
            for n in range(min_ngram, max_ngram + 1)
            if n < len(tokens)
            for i in range(len(tokens) - n)
        )
    assert result == brute_force_continuation(tokens, max_ngram, min_ngram, length)
