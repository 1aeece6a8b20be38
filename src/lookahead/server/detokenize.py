"""Incremental detokenization with OpenAI ``stop`` strings.

Tokens arrive a few at a time; the text sent so far must never change and must never contain
a stop string. So each ``push`` decodes the output again (a few prompt tokens in front, so that
the first word gets its leading space the way the tokenizer would write it), then

* cuts at the earliest stop string, if one appeared (the stop string itself is not sent);
* otherwise holds back a trailing U+FFFD (a multi-byte character split between tokens) and the
  longest tail that could still grow into a stop string.

Example: stop ``["\\n\\n"]``; pushes giving the texts ``"a\\n"``, ``"a\\nb"``, ``"a\\nb\\n\\nc"``
send ``"a"``, ``"\\nb"`` and stop with nothing more: the caller gets ``"a\\nb"``.

Decoding the whole output on every push costs O(n) per step; at the server's output lengths
(hundreds of tokens) that is well under a millisecond with a fast tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

_PROMPT_CONTEXT = 4  # prompt tokens decoded in front of the output


class Detokenizer:
    """Turns one request's committed tokens into text deltas, honouring ``stop`` strings."""

    def __init__(self, tokenizer, prompt: Sequence[int], stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.text = ""  # everything sent so far
        self.stopped = False
        self._prefix = list(prompt[-_PROMPT_CONTEXT:])
        self._prefix_text = self._decode(self._prefix)

    def push(self, tokens: Sequence[int], final: bool = False) -> str:
        """Add ``tokens``; return the new text that is safe to send (maybe empty).

        ``final``: no more tokens will come, so send whatever is held back.
        Sets ``stopped`` when a stop string appeared; later pushes return "".
        """
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        full = self._output_text()
        cut = self._find_stop(full)
        if cut is not None:
            self.stopped = True
            return self._send(full[:cut])
        if not final:
            full = full[: len(full) - self._held_back(full)]
        return self._send(full)

    def _send(self, text: str) -> str:
        if len(text) <= len(self.text) or not text.startswith(self.text):
            return ""
        delta = text[len(self.text) :]
        self.text = text
        return delta

    def _output_text(self) -> str:
        both = self._decode(self._prefix + self.tokens)
        if both.startswith(self._prefix_text):
            return both[len(self._prefix_text) :]
        return self._decode(self.tokens)  # the prompt's tail merged with the output: rare

    def _find_stop(self, text: str) -> int | None:
        # Only text after what was sent can hold a new stop string (sent text never held one).
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        found = [i for s in self.stop if (i := text.find(s, start)) >= 0]
        return min(found) if found else None

    def _held_back(self, text: str) -> int:
        """Length of the tail that must wait: an incomplete character or a stop string's prefix."""
        held = 0
        if text.endswith("\ufffd"):
            held = len(text) - len(text.rstrip("\ufffd"))
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    held = max(held, k)
                    break
        return held

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
