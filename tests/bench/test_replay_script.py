"""benchmarks/replay_text_proposers.py's oracles, on texts small enough to work out by hand:
the bounds the README quotes for the text sources must count what they say they count."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from lookahead import Datastore

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "replay_text_proposers.py"


def _script():
    spec = importlib.util.spec_from_file_location("replay_text_proposers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_source_feeds_each_sources_copy_and_commits_the_longest_match() -> None:
    replay = _script()
    prompt, output = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # x0 = 1: the copy after the 1-gram "1" is 2..8 and the context's last 1 (8 tokens); the
    # pool's 4-gram 1 2 3 4 shares its path. 2..8 are accepted, 9 is the bonus token.
    tokens, fed = replay.every_source([(prompt, output)], 8, None)
    assert (tokens, fed) == (8, [1 + 8])
    # Nothing repeats: each step feeds x0 alone and commits one token.
    assert replay.every_source([([1, 2, 3], [4, 5, 6])], 8, None) == (2, [1, 1])


def test_every_source_adds_the_datastore_and_the_memory_of_earlier_outputs() -> None:
    replay = _script()
    store = Datastore(np.array([20, 21, 22, 23, 0, 20, 21, 22, 23, 0]), separator=0)
    # The first text's 20 is followed by 21 22 in the corpus (a third candidate token, 23,
    # is the corpus's too); the second text repeats the first one's output from memory.
    texts = [([10, 11], [20, 21, 22, 30]), ([12, 13], [30, 31, 32]), ([14], [30, 31, 32])]
    tokens, fed = replay.every_source(texts, 3, store)
    assert tokens == 3 + 2 + 2  # a step commits no bonus token past its text's end
    assert fed[0] == 1 + 3  # x0 = 20; the datastore's 21 22 23: two accepted, 30 the bonus
    assert fed[1:3] == [1, 1]  # the second text: nothing anywhere
    # The third: after 30 31 the memory copies 32 from the second text's output.
    assert fed[3:] == [1, 1 + 1]


def test_the_text_oracle_commits_no_token_past_the_end() -> None:
    replay = _script()
    # x0 = 1 matches the prompt's 1 2 3: all of the rest, and no bonus token after it.
    assert replay.oracle([([1, 2, 3], [1, 2, 3])]) == (2, [3])
