"""OpenAI's ``logprobs`` objects from the ``Decoder``'s records (``lookahead.logprobs``).

Chat (``logprobs: true, top_logprobs: k``)::

    {"content": [{"token": " the", "logprob": -0.31, "bytes": [32, 116, 104, 101],
                  "top_logprobs": [{"token": " the", "logprob": -0.31, "bytes": [...]}, ...]}],
     "refusal": null}

Completions (``logprobs: k``)::

    {"tokens": [" the", ...], "token_logprobs": [-0.31, ...],
     "top_logprobs": [{" the": -0.31, " a": -1.9}, ...], "text_offset": [0, ...]}

A completion's ``top_logprobs`` also holds the chosen token (up to k + 1 entries), as
OpenAI's does; ``text_offset`` is where each token's text starts in the answer's text, counted
as the streamed text grows (a character spread over several byte-level tokens counts at the
token that completes it). A token's text is its own bytes decoded alone (``bytes`` is exact:
a byte-level token holding part of a character has its raw bytes there and U+FFFD in
``token``). A log-probability of -inf (a token a bias or penalty ruled out) is reported as
-9999.0, as vLLM does: JSON has no infinity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from transformers.convert_slow_tokenizer import bytes_to_unicode

from lookahead.detokenize import Detokenizer
from lookahead.logprobs import TokenLogprob

FLOOR = -9999.0
_BYTE_OF_CHAR = {char: byte for byte, char in bytes_to_unicode().items()}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer writes bytes as GPT-2's printable characters (byte-level BPE)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)


def token_bytes(tokenizer: Any, token_id: int, is_byte_level: bool) -> bytes:
    """The bytes token ``token_id`` stands for (its text alone, for other tokenizers)."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if piece is None:
        return b""
    if is_byte_level and all(char in _BYTE_OF_CHAR for char in piece):
        return bytes(_BYTE_OF_CHAR[char] for char in piece)
    match = _BYTE_TOKEN.fullmatch(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")  # SentencePiece's word boundary


def _number(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


class LogprobFormatter:
    """One choice's records as OpenAI objects; ``format`` is called with them in order.

    prompt: the prompt's token ids (the text offsets are counted after it, as the answer is).
    """

    def __init__(self, tokenizer: Any, prompt: Sequence[int], chat: bool) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self._byte_level = byte_level(tokenizer)
        self._text = Detokenizer(tokenizer, prompt)  # where each token's text starts
        self._offset = 0
        self._pieces: dict[int, tuple[str, list[int]]] = {}

    def _piece(self, token: int) -> tuple[str, list[int]]:
        """(text, bytes) of ``token``, each worked out once."""
        found = self._pieces.get(token)
        if found is None:
            raw = token_bytes(self.tokenizer, token, self._byte_level)
            found = self._pieces[token] = (raw.decode("utf-8", errors="replace"), list(raw))
        return found

    def format(self, records: Sequence[TokenLogprob]) -> dict:
        if self.chat:
            return {"content": [self._chat_entry(r) for r in records], "refusal": None}
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": []}
        for record in records:
            out["tokens"].append(self._piece(record.token)[0])
            out["token_logprobs"].append(_number(record.logprob))
            top = {self._piece(t)[0]: _number(v) for t, v in record.top}
            top.setdefault(self._piece(record.token)[0], _number(record.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            self._offset += len(self._text.push([record.token]))
        return out

    def _chat_entry(self, record: TokenLogprob) -> dict:
        text, raw = self._piece(record.token)
        top = []
        for token, value in record.top:
            top_text, top_raw = self._piece(token)
            top.append({"token": top_text, "logprob": _number(value), "bytes": top_raw})
        return {"token": text, "logprob": _number(record.logprob), "bytes": raw,
                "top_logprobs": top}

