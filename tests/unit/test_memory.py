"""``TextMemory``: earlier requests' texts that lookahead and prompt lookup copy from."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import reference

import lookahead
from lookahead import TextMemory
from lookahead.config import LookaheadConfig, PromptLookupConfig
from lookahead.proposers.lookahead import LookaheadProposer
from lookahead.proposers.prompt_lookup import PromptLookupProposer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_find_takes_the_latest_occurrence_of_the_longest_ngram() -> None:
    memory = TextMemory()
    memory.add([5, 1, 2, 3, 4])
    assert memory.find([9, 1, 2], 2) == [3, 4]  # the docstring's example
    memory.add([1, 2, 7, 8])
    assert memory.find([9, 1, 2], 2) == [7, 8]  # the latest text wins
    assert memory.find([5, 1, 2], 3) == [3, 4]  # the 3-gram 5 1 2 before the 2-gram 1 2
    assert memory.find([6, 6], 3) == []
    assert len(memory) == 9


def test_a_continuation_never_runs_into_another_text() -> None:
    memory = TextMemory()
    memory.add([7, 1, 2])  # 1 2 ends its text: nothing follows it
    memory.add([3, 4, 5])
    assert memory.find([1, 2], 4) == []
    assert memory.find([3, 4], 4) == [5]


def test_the_oldest_texts_go_beyond_capacity() -> None:
    memory = TextMemory(capacity=6)
    memory.add([1, 2, 3, 4])
    memory.add([5, 6, 7])
    assert len(memory) == 3
    assert memory.find([1, 2], 2) == []  # forgotten
    assert memory.find([5, 6], 2) == [7]
    memory.add(list(range(20, 30)))  # longer than the memory: its tail is kept
    assert len(memory) == 6 and memory.find([24, 25], 2) == [26, 27]


def _kept(texts: list[list[int]], capacity: int) -> list[list[int]]:
    """The texts a memory of ``capacity`` must keep, newest first: each cut to its last
    ``capacity`` tokens, as many of the newest as fit."""
    kept, total = [], 0
    for text in reversed([t[-capacity:] for t in texts]):
        if total + len(text) > capacity:
            break
        kept.append(text)
        total += len(text)
    return kept


def _reference_find(kept: list[list[int]], context: list[int], length: int) -> list[int]:
    """What ``find`` must answer, by brute force: the longest n (3 down to 1) first, then the
    newest text, the last position in it."""
    for n in range(min(3, len(context)), 0, -1):
        for text in kept:
            for start in range(len(text) - n - 1, -1, -1):
                if text[start : start + n] == context[-n:]:
                    return text[start + n : start + n + length]
    return []


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(st.lists(st.integers(0, 4), max_size=9), min_size=1, max_size=12),
    capacity=st.integers(1, 20),
    contexts=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), min_size=1,
                      max_size=5),
)
def test_find_equals_a_brute_force_scan_of_the_texts_kept(texts, capacity, contexts) -> None:
    memory = TextMemory(capacity=capacity, max_ngram=3, min_ngram=1)
    for count in range(1, len(texts) + 1):
        memory.add(texts[count - 1])
        kept = _kept(texts[:count], capacity)
        assert len(memory) == sum(map(len, kept))
        for context in contexts:
            assert memory.find(context, 3) == _reference_find(kept, context, 3)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"capacity": 0}, "capacity"), ({"max_ngram": 0}, "max_ngram"),
     ({"max_ngram": 2, "min_ngram": 3}, "min_ngram")],
)  # fmt: skip
def test_bad_memory_settings_name_the_argument(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        TextMemory(**kwargs)


@pytest.mark.parametrize("tokens", [5, ["a", "b"], [[1, 2], [3, 4]]])
def test_adding_anything_but_token_ids_names_tokens(tokens) -> None:
    with pytest.raises(TypeError, match="tokens must be a sequence of token ids"):
        TextMemory().add(tokens)


def test_proposers_copy_from_memory_when_their_own_text_has_no_match() -> None:
    memory = TextMemory()
    memory.add([40, 41, 42, 43, 44, 45])
    context = [1, 2, 3, 41, 42]  # nothing repeats within it
    for proposer in (
        PromptLookupProposer(PromptLookupConfig(num_draft_tokens=3), memory=memory),
        LookaheadProposer(LookaheadConfig(window=2, ngram=3, guess=2), memory=memory),
    ):
        proposer.start(context[:3])
        assert [43, 44, 45] in proposer.propose(context, max_tokens=3).candidates
        without = type(proposer)(proposer.config)
        without.start(context[:3])
        assert [43, 44, 45] not in without.propose(context, max_tokens=3).candidates


@pytest.mark.parametrize("method", ["lookahead", "prompt_lookup"])
def test_a_second_request_copies_the_first_and_keeps_the_exact_output(tiny_lm, method) -> None:
    model = tiny_lm("llama")
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(3))
    expected = reference(model, ids, 24)
    memory = TextMemory()
    first = lookahead.generate(model, ids, 24, method, memory=memory)
    assert len(memory) == expected.shape[1]  # the finished text, prompt and output
    second = lookahead.generate(model, ids, 24, method, memory=memory)
    for result in (first, second):
        assert result.sequences.tolist() == expected.tolist()
    # The whole answer is in memory now: the second request copies it in a few steps.
    assert second.stats.steps < first.stats.steps
    assert sum(second.stats.accepted_per_step) > sum(first.stats.accepted_per_step)


def test_memory_must_be_a_text_memory_and_only_for_copying_methods(tiny_lm) -> None:
    model = tiny_lm("llama")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(TypeError, match="memory must be a lookahead.TextMemory"):
        lookahead.generate(model, ids, 4, "lookahead", memory=[1, 2])
    with pytest.raises(TypeError, match="unknown option.*memory"):
        lookahead.generate(model, ids, 4, "autoregressive", memory=TextMemory())
