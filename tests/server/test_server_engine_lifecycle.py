"""The engine's life: cancelling, a full queue, a failing request, serving on the calling
thread, and stopping on SIGTERM."""

from __future__ import annotations

import threading
import time

import pytest
from tiny import collect_events, prompt_ids, wait_idle

import lookahead
from lookahead.request import make_decoder
from lookahead.server.engine import (
    Engine,
    EngineClosedError,
    EngineConfig,
    ErrorEvent,
    FinishEvent,
    QueueFullError,
)


def test_cancel_frees_the_row(model, tokenizer) -> None:
    engine = Engine(model, tokenizer).start()
    try:
        long = engine.submit(make_decoder(model, prompt_ids(1, 10), 140, "autoregressive",
                                          eos_token_id=[]))
        short = engine.submit(make_decoder(model, prompt_ids(2, 10), 5, "autoregressive"))
        next(long.events(timeout=30))  # it is running
        long.cancel()
        collect_events(short)
        events = list(long.events(timeout=30))
        assert isinstance(events[-1], FinishEvent) and events[-1].reason == "cancelled"
        assert events[-1].completion_tokens < 140
        assert wait_idle(engine)
        assert engine._cache.cache is None  # memory freed
    finally:
        engine.stop()


def test_queue_limit(model, tokenizer) -> None:
    engine = Engine(model, tokenizer, EngineConfig(max_queue=2))  # not started: nothing drains
    ids = prompt_ids(0, 4)
    engine.submit(make_decoder(model, ids, 4, "autoregressive"))
    engine.submit(make_decoder(model, ids, 4, "autoregressive"))
    with pytest.raises(QueueFullError, match="max_queue=2"):
        engine.submit(make_decoder(model, ids, 4, "autoregressive"))
    assert engine.metrics.requests.value("rejected", "queue_full") == 1


def test_a_failing_request_does_not_stop_the_others(model, tokenizer) -> None:
    engine = Engine(model, tokenizer).start()
    try:
        bad = make_decoder(model, prompt_ids(3, 8), 20, "autoregressive")
        bad.plan = lambda past, budget=None: (_ for _ in ()).throw(RuntimeError("boom"))
        good_ids = prompt_ids(4, 8)
        want = lookahead.generate(model, good_ids, 20, "lookahead").new_tokens[0].tolist()
        h_bad = engine.submit(bad)
        h_good = engine.submit(make_decoder(model, good_ids, 20, "lookahead"))
        assert isinstance(list(h_bad.events(timeout=30))[-1], ErrorEvent)
        assert collect_events(h_good)[1].token_ids == want
        assert engine.alive
    finally:
        engine.stop()


def test_run_serves_in_the_calling_thread_until_stopped(model, tokenizer) -> None:
    """``lookahead serve`` runs the loop on the thread that loaded the model (Engine.run) and
    submits from the HTTP thread."""
    engine = Engine(model, tokenizer)
    ids = prompt_ids(5, 10)
    want = lookahead.generate(model, ids, 16, "lookahead").new_tokens[0].tolist()
    got = {}

    def client() -> None:
        handle = engine.submit(make_decoder(model, ids, 16, "lookahead"))
        got["tokens"] = collect_events(handle)[1].token_ids
        # Read once the answer is in: before, run() on the main thread may not have begun.
        got["alive"] = engine.alive
        engine.stop()

    thread = threading.Thread(target=client)
    thread.start()
    engine.run()  # returns once the client has stopped it
    thread.join(10)
    assert got == {"alive": True, "tokens": want}
    assert not engine.alive
    with pytest.raises(EngineClosedError):
        engine.submit(make_decoder(model, ids, 4, "autoregressive"))


def test_sigterm_caught_by_another_thread_still_stops_an_idle_engine(model, tokenizer) -> None:
    """``lookahead serve`` stops on SIGTERM by raising KeyboardInterrupt in the main thread,
    which runs the engine. The kernel may hand a process's SIGTERM to any thread; Python runs
    the handler in the main thread only when it next runs bytecode. So an idle engine must
    not block in its wait for good, or the server stays up (a CI run hung this way)."""
    import signal

    from lookahead.cli.serve import _interrupt_on_sigterm

    engine = Engine(model, tokenizer, EngineConfig(warm_up=False))

    def other_thread() -> None:
        time.sleep(0.3)  # the engine is waiting for work by now
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not main
        time.sleep(5)
        engine.stop()  # the watchdog: without a bounded wait, run() returns only now

    threading.Thread(target=other_thread, daemon=True).start()
    started = time.monotonic()
    with _interrupt_on_sigterm(), pytest.raises(KeyboardInterrupt):
        engine.run()
    assert time.monotonic() - started < 3
