"""Streamed text: tokens arriving a few at a time turned into the new text to print or send,
with OpenAI ``stop`` strings.

Decoding each token alone breaks characters spread over several byte-level tokens (and drops
the leading spaces of SentencePiece tokens); decoding the whole output at every step costs
O(n) per step, O(n²) per answer. A fast tokenizer's ``tokenizers.decoders.DecodeStream``
decodes each token in O(1), holding back a character until its last byte arrives; other
tokenizers get a short window decoded again (the tokens since the text last grew, against
the same window without the new ones; text ending in U+FFFD waits for the next token).
``finish`` sends what is still held back (bytes that never formed a character come out as
U+FFFD, as ``tokenizer.decode`` writes them): the streamed text is then
``tokenizer.decode(tokens)``, or with a prompt, the text the output adds after it.

Stop strings: text that could be the start of a stop string is held back until it is known
not to be; a stop string ends the text (it is not sent). One Knuth-Morris-Pratt matcher per
stop string keeps the longest prefix of it that the text ends with, so each character costs
O(1) per stop string, not a scan of every prefix at every step.

Example: stop ``["\\n\\n"]``; pushes giving the texts ``"a\\n"``, ``"a\\nb"``, ``"a\\nb\\n\\nc"``
send ``"a"``, ``"\\nb"`` and stop with nothing more: the caller gets ``"a\\nb"``.

    detokenizer = Detokenizer(tokenizer, prompt=input_ids[0].tolist())
    for tokens in lookahead.stream(model, input_ids, 64):
        print(detokenizer.push(tokens), end="", flush=True)
    print(detokenizer.finish())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

# Prompt tokens decoded in front of the output, so that its first word gets the leading space
# it has after the prompt (how the tokenizer writes it), not the one it has at a text's start.
PROMPT_CONTEXT = 4


class Detokenizer:
    """One output's tokens as text deltas, honouring ``stop`` strings.

    ``prompt``: the prompt's token ids (its last ``PROMPT_CONTEXT`` are decoded in front of the
    output, not part of it). ``tokens``: the output tokens pushed so far; ``text``: the text
    sent so far; ``stopped``: a stop string appeared (later pushes return "").
    """

    def __init__(self, tokenizer: Any, prompt: Sequence[int] = (), stop: Sequence[str] = (),
                 *, skip_special_tokens: bool = True) -> None:
        context = [int(t) for t in list(prompt)[-PROMPT_CONTEXT:]]
        self.tokens: list[int] = []
        self.text = ""
        self.stopped = False
        self._source = (_StreamSource if _streams(tokenizer) else _WindowSource)(
            tokenizer, context, skip_special_tokens)
        self._stops = StopMatcher(stop)
        self._pending = ""  # decoded but not sent: it could start a stop string

    def push(self, tokens: Sequence[int], final: bool = False) -> str:
        """Add ``tokens``; return the new text that is safe to send (maybe empty).
        ``final``: no more tokens will come, so send whatever is held back."""
        if self.stopped:
            return ""
        tokens = [int(t) for t in tokens]
        self.tokens.extend(tokens)
        new = self._source.push(tokens)
        if final:
            new += self._source.finish()
        return self._emit(new, final)

    def finish(self) -> str:
        """The text still held back: no more tokens will come."""
        return self.push([], final=True)

    def _emit(self, new: str, final: bool) -> str:
        pending = self._pending + new
        if not self._stops:
            sent, self._pending = pending, ""
        else:
            offset = len(self._pending)
            cut = self._stops.feed(new)
            if cut is not None:  # ``cut``: where the stop string starts within ``new``
                self.stopped = True
                sent, self._pending = pending[: offset + cut], ""
            else:
                hold = 0 if final else self._stops.partial
                sent, self._pending = pending[: len(pending) - hold], pending[len(pending) - hold:]
        self.text += sent
        return sent


class StopMatcher:
    """Finds the first of several stop strings in a text fed a piece at a time.

    ``partial``: the length of the longest stop-string prefix the text fed so far ends with
    (what must be held back). Each character costs O(1) per stop string, amortised.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stops if s))
        self._fail = [_failure(s) for s in self._stops]
        self._state = [0] * len(self._stops)

    def __bool__(self) -> bool:
        return bool(self._stops)

    @property
    def partial(self) -> int:
        return max(self._state, default=0)

    def feed(self, text: str) -> int | None:
        """Consume ``text``; return the index in ``text`` (possibly negative: it began in an
        earlier piece) where the first stop string to end starts, or None. Of stop strings
        ending at the same character, the longest wins."""
        for i, char in enumerate(text):
            found = None
            for k, stop in enumerate(self._stops):
                state, fail = self._state[k], self._fail[k]
                while state and stop[state] != char:
                    state = fail[state - 1]
                if stop[state] == char:
                    state += 1
                if state == len(stop):
                    found = max(found or 0, len(stop))
                    state = fail[state - 1]
                self._state[k] = state
            if found is not None:
                return i + 1 - found
        return None


def _failure(pattern: str) -> list[int]:
    """KMP's table: ``fail[i]``, the longest proper prefix of ``pattern[: i + 1]`` that is
    also its suffix."""
    fail = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        fail[i] = k
    return fail


def _streams(tokenizer: Any) -> bool:
    """Whether ``DecodeStream`` gives what ``tokenizer.decode`` does: a fast tokenizer that does
    not clean up spaces after decoding (a step cannot take back a space it sent)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)


class _StreamSource:
    """New text per push from ``tokenizers``' ``DecodeStream``: O(1) per token."""

    def __init__(self, tokenizer: Any, context: list[int], skip: bool) -> None:
        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip)
        self._context = context
        self._skip = skip
        self._tokens: list[int] = []
        self._text = ""

    def push(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        self._tokens.extend(tokens)
        text = self._stream.step(self._backend, tokens) or ""
        self._text += text
        return text

    def finish(self) -> str:
        """Bytes that never completed a character: the whole output decoded once, at the end."""
        full = _decode_after(self._tokenizer, self._context, self._tokens, self._skip)
        return full[len(self._text):] if full.startswith(self._text) else ""


class _WindowSource:
    """New text per push for tokenizers without ``DecodeStream``: the tokens since the text
    last grew whole, decoded with and without the new ones (like vLLM's incremental
    detokenizer). A window whose text ends in U+FFFD (a character not yet complete) gives the
    text before it and stays open until a token completes it."""

    def __init__(self, tokenizer: Any, context: list[int], skip: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip
        self._all = list(context)
        self._prefix = 0  # start of the decoded window
        self._read = len(context)  # end of the tokens whose text was returned whole
        self._given = ""  # the text of the open window already returned

    def push(self, tokens: list[int], final: bool = False) -> str:
        self._all.extend(tokens)
        done = self._decode(self._all[self._prefix: self._read])
        text = self._decode(self._all[self._prefix:])
        if len(text) <= len(done) or not text.startswith(done):
            return ""
        new = text[len(done):]
        complete = final or not new.endswith("\ufffd")
        safe = new if complete else new.rstrip("\ufffd")
        out = safe[len(self._given):] if safe.startswith(self._given) else ""
        if complete:
            self._prefix, self._read, self._given = self._read, len(self._all), ""
        else:
            self._given = safe if safe.startswith(self._given) else self._given
        return out

    def finish(self) -> str:
        return self.push([], final=True)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""


def _decode_after(tokenizer: Any, context: list[int], tokens: list[int], skip: bool) -> str:
    """The text ``tokens`` add after ``context``."""
    both = tokenizer.decode(context + tokens, skip_special_tokens=skip)
    before = tokenizer.decode(context, skip_special_tokens=skip) if context else ""
    return both[len(before):] if both.startswith(before) else tokenizer.decode(
        tokens, skip_special_tokens=skip)
