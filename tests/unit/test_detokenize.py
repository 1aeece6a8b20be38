"""``lookahead.detokenize``: streamed text is the text ``tokenizer.decode`` gives, however the
tokens are cut into pushes, and a stop string ends it wherever it falls."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers import models as tokenizer_models
from transformers import PreTrainedTokenizerFast

from lookahead.detokenize import Detokenizer, StopMatcher, _StreamSource, _WindowSource

TEXTS = ["naïve café: 日本語 ✓ ok 🙂!", "def f(x):\n    return x + 1\n\n", "größer als ½ — ça va"]


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with every byte a token and a few merges: multi-byte characters are cut
    across tokens, some tokens hold several characters."""
    backend = Tokenizer(tokenizer_models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["</s>"], show_progress=False)
    backend.train_from_iterator(TEXTS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")


TOKENIZER = bpe_tokenizer()
VOCAB = len(TOKENIZER)


class SlowTokenizer:
    """Only ``decode``: the fallback path, as for a tokenizer without ``DecodeStream``."""

    def __init__(self, tokenizer) -> None:
        self.decode = tokenizer.decode


def stream(detokenizer: Detokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    """The pieces sent for ``ids`` pushed in chunks of the sizes in ``cuts`` (cycled)."""
    pieces, i, k = [], 0, 0
    while i < len(ids):
        size = cuts[k % len(cuts)]
        pieces.append(detokenizer.push(ids[i: i + size]))
        i, k = i + size, k + 1
    pieces.append(detokenizer.finish())
    return pieces


def test_the_fast_tokenizer_streams_and_a_decode_only_one_falls_back() -> None:
    assert isinstance(Detokenizer(TOKENIZER)._source, _StreamSource)
    assert isinstance(Detokenizer(SlowTokenizer(TOKENIZER))._source, _WindowSource)


@pytest.mark.parametrize("slow", [False, True])
@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, VOCAB - 1), max_size=40),
       cuts=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_streamed_text_is_the_decoded_text_for_any_ids(slow, ids, cuts) -> None:
    tokenizer = SlowTokenizer(TOKENIZER) if slow else TOKENIZER
    detokenizer = Detokenizer(tokenizer)
    assert "".join(stream(detokenizer, ids, cuts)) == TOKENIZER.decode(ids, skip_special_tokens=True)
    assert detokenizer.tokens == ids


@pytest.mark.parametrize("slow", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_multibyte_characters_cut_across_tokens_come_out_whole(slow, text) -> None:
    ids = TOKENIZER(text)["input_ids"]
    tokenizer = SlowTokenizer(TOKENIZER) if slow else TOKENIZER
    for size in (1, 2, 3):
        pieces = stream(Detokenizer(tokenizer), ids, [size])
        assert "".join(pieces) == text
        assert not any("\ufffd" in piece for piece in pieces)


@pytest.mark.parametrize("slow", [False, True])
def test_the_prompt_gives_the_first_word_its_text_after_it(slow) -> None:
    prompt, answer = TOKENIZER("x = ")["input_ids"], TOKENIZER("größer")["input_ids"]
    tokenizer = SlowTokenizer(TOKENIZER) if slow else TOKENIZER
    text = "".join(stream(Detokenizer(tokenizer, prompt), answer, [1]))
    assert text == TOKENIZER.decode(prompt + answer)[len(TOKENIZER.decode(prompt)):]


def first_stop(text: str, stops: list[str]) -> str:
    """``text`` up to the stop string that ends first (the longest of those ending together)."""
    ends = [(text.find(s) + len(s), -len(s)) for s in stops if s in text]
    if not ends:
        return text
    end, minus_length = min(ends)
    return text[: end + minus_length]


@pytest.mark.parametrize("slow", [False, True])
@settings(max_examples=60, deadline=None)
@given(text=st.sampled_from(TEXTS), cuts=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       stops=st.lists(st.sampled_from(["\n\n", "x +", "ok", "ça", "本語", "🙂!", "zzz", "é"]),
                      max_size=3))
def test_a_stop_string_across_tokens_ends_the_text(slow, text, cuts, stops) -> None:
    ids = TOKENIZER(text)["input_ids"]
    tokenizer = SlowTokenizer(TOKENIZER) if slow else TOKENIZER
    detokenizer = Detokenizer(tokenizer, stop=stops)
    pieces = stream(detokenizer, ids, cuts)
    assert "".join(pieces) == detokenizer.text == first_stop(text, stops)
    assert detokenizer.stopped == any(s in text for s in stops)
    sent = ""
    for piece in pieces:  # no stop string is ever sent, even in part and then taken back
        sent += piece
        assert not any(s in sent for s in stops)


def test_a_possible_stop_string_is_held_back_until_it_is_not_one() -> None:
    detokenizer = Detokenizer(TOKENIZER, stop=["\n\n"])
    pieces = [detokenizer.push(TOKENIZER(t)["input_ids"]) for t in ("a\n", "b", "\n\nc")]
    assert pieces == ["a", "\nb", ""] and detokenizer.stopped and detokenizer.text == "a\nb"
    assert detokenizer.push(TOKENIZER("more")["input_ids"]) == ""


def test_stop_matcher_keeps_the_longest_partial_prefix() -> None:
    matcher = StopMatcher(["abab", "b!"])
    assert matcher.feed("xaba") is None and matcher.partial == 3
    assert matcher.feed("b") == -3  # "abab" began 3 characters before this piece
    matcher = StopMatcher(["aab"])
    assert matcher.feed("aaaa") is None and matcher.partial == 2
    assert matcher.feed("b") == -2
    assert not StopMatcher(["", ""]) and StopMatcher(["", "x"]).feed("yx") == 1
