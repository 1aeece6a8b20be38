"""The engine: one thread owns the model and serves every request by continuous batching.

Each request is a ``lookahead.decode.Decoder`` (its own proposer, RNG and statistics); the
engine only decides *when* each one runs and puts every running request's step into one
forward pass. An iteration of the loop (``Engine._iterate``):

1. drop cancelled requests; their cache rows are freed;
2. admit waiting requests while the batch has room: prefill each alone (batch 1), which gives
   its first token, and add its KV cache to the batch as a new row;
3. one batched step for all running requests: ``Decoder.plan`` with the request's share of the
   step's token budget, one forward pass over the padded batch (``BatchedCache``),
   ``Decoder.finish`` on each request's logits; keep the accepted entries, send the new text,
   retire finished requests and compact the cache when half of it is waste.

Speculation adapts to load: on a CPU a pass of 8 tokens can cost about 1.05x a pass of 1
(``docs/benchmarks.md``), so the spare room of a pass is shared. Each of n running requests
gets at most ``max(1, step_token_budget // n)`` input tokens for its step: alone, a request
may speculate with the whole budget; with many, the share falls to 1 token each, which is
plain batched decoding -- never worse than autoregressive batching. Below that ceiling
``BudgetPolicy`` picks the share that measured best (committed tokens per second).

Threads: the HTTP side calls ``submit`` (any thread) and reads the request's events from its
``RequestHandle``; ``RequestHandle.cancel`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from lookahead.decode import Decoder, StepPlan, longrope_switch
from lookahead.batch_cache import BatchedCache
from lookahead.server.budget import BudgetPolicy
from lookahead.server.heap import release_free_memory
from lookahead.detokenize import Detokenizer
from lookahead.prefix_cache import PrefixCache, entries_of
from lookahead.server.engine_config import EngineConfig
from lookahead.server.metrics import ServerMetrics
from lookahead.server.requests import (
    ERROR_INTERNAL,
    ERROR_SHUTDOWN,
    ERROR_TIMEOUT,
    EngineClosedError,
    EngineRequest,
    ErrorEvent,
    Event,
    FinishEvent,
    QueueFullError,
    RequestHandle,
    TokenEvent,
)
from lookahead.server.shapes import prefill_length, warm_up

__all__ = ["Engine", "EngineClosedError", "EngineConfig", "ErrorEvent", "Event", "FinishEvent",
           "QueueFullError", "RequestHandle", "TokenEvent", "release_free_memory"]

logger = logging.getLogger(__name__)

# How long an idle engine waits for work before looking again (for pending signals only).
_IDLE_WAIT_S = 0.5


class Engine:
    """Continuous batching of ``Decoder`` requests over one model, on one thread: a new one
    (``start``) or the caller's (``run``, which a server should prefer: see there).

    Example::

        engine = Engine(model, tokenizer).start()
        handle = engine.submit(make_decoder(model, ids, 64, "lookahead"), stop=["\\n\\n"])
        text = "".join(e.text for e in handle.events() if isinstance(e, TokenEvent))
        engine.stop()
    """

    def __init__(self, model, tokenizer, config: EngineConfig | None = None,
                 metrics: ServerMetrics | None = None, model_name: str | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        # KV entries of earlier texts by their tokens (None: off); this thread alone uses it.
        self.prefixes = (PrefixCache(self.config.prefix_cache_bytes)
                         if self.config.prefix_cache_bytes else None)
        self.metrics = metrics or ServerMetrics(
            model_name if model_name is not None else getattr(model, "name_or_path", ""),
            running=lambda: self.running_count,
            waiting=lambda: self.waiting_count,
            cache_columns=lambda: self._cache.columns,
            prefix_bytes=lambda: self.prefixes.nbytes if self.prefixes is not None else 0,
        )
        self._wakeup = threading.Condition()
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []  # running[i] owns row i of the cache
        self._cache = BatchedCache()
        self.budget = BudgetPolicy(self.config.step_token_budget, self.config.adaptive_budget,
                                   self.config.explore)
        self._ids = itertools.count()
        self._stopping = False
        self._live = 0  # submitted and not yet retired (guarded by _wakeup)
        self._thread: threading.Thread | None = None
        self._looping = False
        # time.monotonic() when the loop last finished an iteration or found nothing to do
        self._progress_at = time.monotonic()

    # ------------------------------------------------------------------ caller's side

    def start(self) -> Engine:
        """Run the loop (``run``) on a new thread and return at once."""
        self._looping = True
        self._thread = threading.Thread(target=self.run, name="lookahead-engine", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """Serve requests in the calling thread until ``stop`` (or KeyboardInterrupt there).

        ``lookahead serve`` calls it from the thread that loaded the model and serves HTTP
        from another. PyTorch's CPU kernels run on OpenMP (GNU libgomp), and each thread that
        starts parallel work gets a team of worker threads of its own. Once two teams exist,
        a machine with as many PyTorch threads as cores has more OpenMP threads than cores, and
        libgomp then lets a waiting worker spin far less before it sleeps. On 2 cores,
        SmolLM2-135M's 64-token forward pass took 119 ms on a second thread once the main
        thread had run one, against 81-84 ms otherwise (``benchmarks/openmp_threads.py``).
        """
        self._looping = True
        try:
            self._loop()
        finally:
            self._shut_down()
            self._looping = False

    def stop(self, timeout: float | None = 10.0) -> None:
        """End the loop once its current step is done; wait up to ``timeout`` s for ``start``'s
        thread."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the loop is running (or about to, after ``start``), and its thread too."""
        thread = self._thread
        return self._looping and (thread is None or thread.is_alive())

    def stalled_for(self) -> float:
        """Seconds since the loop last made progress while it had work (0 when it has none).

        The loop marks progress after each iteration and each idle wait (at most
        ``_IDLE_WAIT_S`` apart), so a large value means a step that does not end: a forward
        pass that hangs, a deadlock. ``/health`` reports 503 past its limit.
        """
        if not self._live:  # not the queues: a request being prefilled is in neither
            return 0.0
        return max(0.0, time.monotonic() - self._progress_at)

    @property
    def context_length(self) -> int | None:
        """The longest text (prompt + new tokens) served, None if unbounded.

        For a "longrope" model (Phi-3 128k) it is the original context: past it the model
        rotates with other factors, chosen by the largest position *in the batch*, so one
        long request would change the others' outputs, and ``model.generate`` recomputes the
        whole cache there, which a shared batch cannot do for one row.
        """
        limits = [getattr(self.model.config, "max_position_embeddings", None),
                  longrope_switch(self.model.config), self.config.max_model_len]
        return min((limit for limit in limits if limit is not None), default=None)

    @property
    def running_count(self) -> int:
        return len(self._running)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def active_count(self) -> int:
        """Requests submitted and not yet retired. A request is retired after its last event,
        once the engine holds nothing of it (its cache row is freed)."""
        return self._live

    def submit(self, decoder: Decoder, *, stop: Sequence[str] = (), method: str = "",
               loop: asyncio.AbstractEventLoop | None = None,
               request_id: str | None = None) -> RequestHandle:
        """Queue a request; raises ``QueueFullError`` when ``max_queue`` requests already wait.

        request_id: names the request in the log (default ``req-N``).
        """
        handle = RequestHandle(request_id or f"req-{next(self._ids)}", self._wake, loop)
        request = EngineRequest(handle, decoder, Detokenizer(self.tokenizer, decoder.prompt, stop),
                                method or decoder.stats.method)
        timeout = self.config.request_timeout
        if timeout is not None:
            request.deadline = request.arrived + timeout
        with self._wakeup:
            if self._stopping:
                raise EngineClosedError("the engine is stopped")
            if len(self._waiting) >= self.config.max_queue:
                self.metrics.requests.inc(1, "rejected", "queue_full")
                raise QueueFullError(
                    f"{len(self._waiting)} requests are already waiting (max_queue="
                    f"{self.config.max_queue}); retry later"
                )
            self._waiting.append(request)
            self._live += 1
            self._wakeup.notify_all()
        return handle

    def _wake(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        if self.config.warm_up:
            try:
                warm_up(self.model, self.config.step_token_budget,
                        self.config.prefill_token_budget)
            except Exception:  # serving without it is slower at first, not wrong
                logger.exception("the shape warm-up failed; serving without it")
            release_free_memory()
        while True:
            with self._wakeup:
                while not self._stopping and not self._waiting and not self._running:
                    # Bounded: a SIGTERM that the kernel hands to another thread runs its
                    # Python handler (KeyboardInterrupt, see Engine.run) only once this thread
                    # runs bytecode again; an unbounded wait would keep an idle server up.
                    self._wakeup.wait(_IDLE_WAIT_S)
                    self._progress_at = time.monotonic()
                if self._stopping:
                    break
            try:
                with torch.inference_mode():
                    self._iterate()
            except Exception as error:  # a failed forward pass: fail the batch, keep serving
                logger.exception("engine step failed; failing the %d running requests",
                                 len(self._running))
                self._remove(list(range(len(self._running))), error=error)
            self._progress_at = time.monotonic()

    def _iterate(self) -> None:
        # 1. Cancelled requests leave (a disconnected client frees its memory and queue slot).
        self._remove([i for i, r in enumerate(self._running) if r.handle.cancelled],
                     reason="cancelled")
        with self._wakeup:
            gone = [r for r in self._waiting if r.handle.cancelled]
            self._waiting = deque(r for r in self._waiting if not r.handle.cancelled)
        for request in gone:
            self._finish_safely(request, "cancelled")
        self._retire(len(gone))
        self._time_out()
        # 2. Prefill new requests while the batch has room.
        self._admit()
        # 3. One forward pass for every running request's step.
        if self._running:
            self._step()

    def _time_out(self) -> None:
        """End the requests past their deadline (running or waiting) with a timeout error."""
        now = time.perf_counter()
        late = [i for i, r in enumerate(self._running) if r.deadline <= now]
        self._remove(late, error=TimeoutError())
        with self._wakeup:
            gone = [r for r in self._waiting if r.deadline <= now]
            if gone:
                self._waiting = deque(r for r in self._waiting if r.deadline > now)
        for request in gone:
            self._fail(request, TimeoutError())
        self._retire(len(gone))

    def _admit(self) -> None:
        spent = 0
        while (len(self._running) < self.config.max_batch_size
               and spent < self.config.prefill_token_budget):
            with self._wakeup:
                if not self._waiting:
                    return
                request = self._waiting.popleft()
            spent += len(request.decoder.prompt)
            if not self._prefill(request):
                self._retire(1)

    def _prefill(self, request: EngineRequest) -> bool:
        """Run the prompt alone (its first token) and add its cache as a row; False when the
        request ended there (done at its first token, or failed)."""
        try:
            decoder = request.decoder
            self._reuse_prefix(decoder)
            fed = len(decoder.prompt) - decoder.reused
            committed = decoder.prefill(prefill_length(fed) if self.config.prefill_buckets
                                        else None)
            self.metrics.prompt_tokens.inc(fed)
            if self.prefixes is not None:  # later prompts that start the same way reuse it
                self.prefixes.store(decoder.prompt, entries_of(decoder.cache))
            if self._deliver(request, committed):
                return False
            self._cache.add_row(decoder.cache)
        except Exception as error:
            logger.exception("prefill of %s failed", request.handle.id)
            self._fail(request, error)
            return False
        except BaseException:  # the loop ends (see run): in no queue, it would get no answer
            self._fail(request, EngineClosedError())
            self._retire(1)
            raise
        request.decoder.cache = None  # the batch owns the entries now
        self._running.append(request)
        return True

    def _reuse_prefix(self, decoder: Decoder) -> None:
        """Give ``decoder`` the longest stored prefix of its prompt, counting the query."""
        if self.prefixes is None or decoder.prefix is not None:
            return
        decoder.prefix = self.prefixes.lookup(decoder.prompt)
        name = self.metrics.model_name
        self.metrics.prefix_queries.inc(len(decoder.prompt), name)
        self.metrics.prefix_hits.inc(decoder.reused, name)

    def _remember(self, rows: list[int]) -> None:
        """Store the KV entries of the texts of finished ``rows`` (all but their last token,
        which no pass has fed yet) for the prompts that will extend them: a chat's next turn
        sends the whole conversation again."""
        for row in rows:
            decoder = self._running[row].decoder
            entries = self._cache.row_entries(row)
            if entries is not None and entries[0][0].shape[2] == len(decoder.context) - 1:
                self.prefixes.store(decoder.context[:-1], entries)

    def _step(self) -> None:
        started = time.perf_counter()
        methods = [request.method for request in self._running]
        budget = self.budget.choose(methods)
        plans = self._plan(budget)
        if not plans:
            return
        batch, row_logits = self._cache.run_step(self.model, [p.layout for p in plans])
        self.metrics.forward_tokens.observe(batch.input_ids.numel())
        self.metrics.batch_size.observe(len(plans))
        self.metrics.step_budget.observe(budget)
        done, committed, kept = [], [], []
        for row, (request, plan, logits) in enumerate(zip(self._running, plans, row_logits)):
            finished, count, keep = self._finish_step(request, plan, logits)
            committed.append(count)
            kept.append(keep)
            if finished:
                done.append(row)
        self._cache.keep(batch.width, kept)
        seconds = time.perf_counter() - started
        methods = [request.method for request in self._running]  # _plan may have dropped some
        self.budget.observe(methods, budget, committed, batch.input_ids.numel(), seconds)
        logger.debug("step: %d requests x %d tokens (share %d) over %d cached columns: "
                     "%d tokens in %.1f ms", len(plans), batch.width, budget,
                     self._cache.columns - batch.width, sum(committed), seconds * 1e3)
        if self.prefixes is not None:
            self._remember(done)
        self._remove(done)
        cache = self._cache
        if cache.columns >= self.config.compact_min_columns and cache.wasted() > self.config.compact_waste:
            cache.compact()

    def _plan(self, budget: int) -> list[StepPlan]:
        """Step 1 of every running request; a request whose proposer fails is dropped."""
        plans, failed = [], []
        for row, request in enumerate(self._running):
            try:
                plans.append(request.decoder.plan(request.past, budget))
            except Exception as error:
                logger.exception("planning %s failed", request.handle.id)
                failed.append((row, error))
        for row, error in reversed(failed):
            self._remove([row], error=error)
        return plans

    def _finish_step(self, request: EngineRequest, plan: StepPlan,
                     logits: torch.Tensor) -> tuple[bool, int, list[int]]:
        """Verify and accept one request's step: whether it is done, how many tokens it
        committed, and which of its step entries stay in the cache."""
        try:
            committed, keep = request.decoder.finish(plan, logits)
        except Exception as error:
            logger.exception("verifying %s failed", request.handle.id)
            self._fail(request, error)
            return True, 0, []
        try:  # the text or the figures of one request failing ends that request alone
            self.metrics.record_step(request.method, request.decoder.stats)
            return self._deliver(request, committed), len(committed), keep
        except Exception as error:
            logger.exception("delivering %s's tokens failed", request.handle.id)
            self._fail(request, error)
            return True, len(committed), keep

    # ------------------------------------------------------------------ requests' lifecycle

    def _deliver(self, request: EngineRequest, committed: list[int]) -> bool:
        """Send the text of newly committed tokens; finish the request if it is done."""
        now = time.perf_counter()
        decoder = request.decoder
        text = request.detokenizer.push(committed)
        if request.last_token_at == 0.0:
            decoder.stats.time_to_first_token = now - request.arrived
            self.metrics.ttft.observe(now - request.arrived)
        elif committed:
            gap = (now - request.last_token_at) / len(committed)
            self.metrics.itl.observe(gap, count=len(committed))
        request.last_token_at = now
        decoder.stats.seconds = now - request.arrived
        if text:
            request.handle.emit(TokenEvent(text, request.take_logprobs()))
        if request.detokenizer.stopped:
            self._finish(request, "stop")
            return True
        if decoder.finished:
            eos = decoder.context[-1] in decoder.eos_token_ids
            self._finish(request, "stop" if eos else "length")
            return True
        return False

    def _finish(self, request: EngineRequest, reason: str) -> None:
        decoder = request.decoder
        if reason != "cancelled":
            rest = request.detokenizer.push([], final=True)
            if rest:
                request.handle.emit(TokenEvent(rest, request.take_logprobs()))
            self.metrics.e2e.observe(time.perf_counter() - request.arrived)
        self.metrics.requests.inc(1, "cancelled" if reason == "cancelled" else "finished", reason)
        self.metrics.generation_tokens.inc(decoder.stats.new_tokens, request.method)
        request.handle.emit(FinishEvent(reason, len(decoder.prompt), decoder.stats.new_tokens,
                                        decoder.new_tokens, decoder.stats,
                                        request.take_logprobs()))

    def _finish_safely(self, request: EngineRequest, reason: str) -> None:
        """``_finish``, failing the request instead if that raises (its last text, metrics)."""
        try:
            self._finish(request, reason)
        except Exception as error:
            logger.exception("finishing %s failed", request.handle.id)
            self._fail(request, error)

    def _fail(self, request: EngineRequest, error: BaseException) -> None:
        """End the request with an ``ErrorEvent`` whose message quotes nothing of ``error``."""
        if isinstance(error, TimeoutError):
            event = ErrorEvent(f"the request ran longer than the server's limit of "
                               f"{self.config.request_timeout:g} s", ERROR_TIMEOUT)
        elif isinstance(error, EngineClosedError):
            event = ErrorEvent("the server is shutting down", ERROR_SHUTDOWN)
        else:  # the traceback was logged by the caller, under the request's id
            event = ErrorEvent(f"the server failed while decoding request {request.handle.id}; "
                               "its log has the details", ERROR_INTERNAL)
        try:
            self.metrics.requests.inc(1, "error", event.code)
        except Exception:  # a metric must not keep the client waiting for its answer
            logger.exception("counting the error of %s failed", request.handle.id)
        request.handle.emit(event)

    def _remove(self, rows: list[int], reason: str | None = None,
                error: BaseException | None = None) -> None:
        """Take running requests out of the batch (finishing or failing them if asked)."""
        if not rows:
            return
        for row in rows:
            if error is not None:
                self._fail(self._running[row], error)
            elif reason is not None:
                self._finish_safely(self._running[row], reason)
        gone = set(rows)
        remaining = [r for i, r in enumerate(self._running) if i not in gone]
        if remaining:
            self._cache.remove_rows(rows)
        else:
            self._cache.clear()
            release_free_memory()
        self._running = remaining
        self._retire(len(gone))  # last: an idle engine (active_count 0) has freed its cache

    def _shut_down(self) -> None:
        error = EngineClosedError("the server is shutting down")
        self._remove(list(range(len(self._running))), error=error)
        with self._wakeup:
            self._stopping = True  # also when the loop ended by an exception: no new requests
            waiting, self._waiting = list(self._waiting), deque()
        for request in waiting:
            self._fail(request, error)
        self._retire(len(waiting))

    def _retire(self, count: int) -> None:
        with self._wakeup:
            self._live -= count
