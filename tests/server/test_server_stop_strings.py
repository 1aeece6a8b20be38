"""Stop strings: the detokenizer holds back text that may start one, and the engine cuts the
text where one begins."""

from __future__ import annotations

from tiny import collect_events, prompt_ids

from lookahead.request import make_decoder
from lookahead.detokenize import Detokenizer
from lookahead.server.engine import Engine


class _CharTokenizer:
    """Token i decodes to chr(i); 0xFF stands for half a character (shown as U+FFFD)."""

    def decode(self, tokens, skip_special_tokens=True):
        return "".join("\ufffd" if t == 0xFF else chr(t) for t in tokens)


def _push_all(stop, pieces):
    detok = Detokenizer(_CharTokenizer(), [ord("p")], stop)
    sent = [detok.push([ord(c) if c != "?" else 0xFF for c in piece]) for piece in pieces]
    return sent, detok


def test_detokenizer_holds_back_a_possible_stop_string() -> None:
    sent, detok = _push_all(["\n\n"], ["a\n", "b", "\n\nc"])
    assert sent == ["a", "\nb", ""]
    assert detok.stopped and detok.text == "a\nb"


def test_detokenizer_flushes_when_final_and_holds_incomplete_characters() -> None:
    sent, detok = _push_all(["xyz"], ["ab?", "xy"])
    assert sent == ["ab", "\ufffd"]  # held while it ended the text, sent once followed
    assert detok.push([], final=True) == "xy"


def test_stop_string_cuts_the_text(model, tokenizer) -> None:
    ids = prompt_ids(5, 12)
    engine = Engine(model, tokenizer).start()
    try:
        full, _ = collect_events(engine.submit(make_decoder(model, ids, 30, "autoregressive")))
        stop = " ".join(full.split()[3:5])
        handle = engine.submit(make_decoder(model, ids, 30, "autoregressive"), stop=[stop, "zz"])
        text, finish = collect_events(handle)
    finally:
        engine.stop()
    assert finish.reason == "stop"
    assert text == full[: full.index(stop)]
