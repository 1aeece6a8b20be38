"""Prompt-lookup matching (find_continuation)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.proposers.prompt_lookup import find_continuation, longest_match

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


# --- the longest, latest match (lookahead's copy when priced on step costs) -----------------


def test_longest_match_examples():
    assert longest_match([5, 1, 2, 7, 1, 2, 8, 2], 3, 2) == ([8, 2], 1)  # the docstring's
    assert longest_match([5, 1, 2, 7, 1, 2, 8, 1, 2], 3, 2) == ([8, 1], 2)  # latest of 2
    assert longest_match([9, 1, 2, 4, 8, 1, 2, 5, 9, 1, 2], 3, 3) == ([4, 8, 1], 3)  # longest
    assert longest_match([9, 1, 2, 4, 8, 1, 2, 5, 9, 1, 2], 2, 3) == ([5, 9, 1], 2)
    assert longest_match([3, 3], 8, 4) == ([3], 1)  # the last token itself is no match
    assert longest_match([1, 2, 3], 8, 4) == ([], 0)
    assert longest_match([3], 8, 4) == ([], 0)
    assert longest_match([1, 2, 1, 2], 0, 4) == ([], 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 6), st.integers(1, 5))
def test_longest_match_is_the_latest_of_the_longest(tokens, max_context, length):
    """Against a brute force over every earlier occurrence of the last token."""
    best, where = 0, None
    for i in range(len(tokens) - 1):
        matched = 0
        while (matched < max_context and i - matched >= 0
               and tokens[i - matched] == tokens[len(tokens) - 1 - matched]):
            matched += 1
        if matched and matched >= best:
            best, where = matched, i
    expected = ([], 0) if where is None else (tokens[where + 1 : where + 1 + length], best)
    assert longest_match(tokens, max_context, length) == expected
