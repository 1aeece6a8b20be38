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

Speculation adapts to load: one forward pass costs about the same for 1 token as for a few
on a CPU (see REFERENCE.md), so the spare room of a pass is shared. Each of n running requests
gets at most ``max(1, step_token_budget // n)`` input tokens for its step: alone, a request
may speculate with the whole budget; with many, the share falls to 1 token each, which is
plain batched decoding -- never worse than autoregressive batching. Below that ceiling
``BudgetPolicy`` picks the share that measured best (committed tokens per second).

Threads: the HTTP side calls ``submit`` (any thread) and reads the request's events from its
``RequestHandle``; ``RequestHandle.cancel`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from lookahead.cache import cache_keyword, decoding_pass
from lookahead.config import check_int
from lookahead.decode import Decoder, StepPlan, longrope_switch
from lookahead.batch_cache import BatchedCache
from lookahead.server.budget import BudgetPolicy
from lookahead.server.detokenize import Detokenizer
from lookahead.server.metrics import ServerMetrics
from lookahead.server.shapes import prefill_length, warm_up
from lookahead.stats import GenerationStats

logger = logging.getLogger(__name__)

# How long an idle engine waits for work before looking again (for pending signals only).
_IDLE_WAIT_S = 0.5


@dataclass(frozen=True)
class EngineConfig:
    """How the engine shares the model between requests.

    step_token_budget: input tokens of one batched forward pass, shared by the running requests
        (each gets ``max(1, budget // running)``). 64 suits SmolLM2-135M on a 2-core CPU, where
        a 64-token forward costs ~1.5x a 1-token one.
    max_batch_size: requests decoded together; more wait in the queue.
    max_queue: requests allowed to wait; beyond it ``submit`` raises ``QueueFullError``.
    prefill_token_budget: prompt tokens prefilled per iteration (at least one request), so that
        a burst of arrivals does not stall the running requests for long.
    adaptive_budget: below the ceiling ``step_token_budget // running``, give each request the
        share that measured best (``BudgetPolicy``); False always gives the ceiling.
    explore: with ``adaptive_budget``, the fraction of steps that try a neighbouring share.
    compact_waste: compact the cache when this fraction of its columns is waste. Every step
        attends over every column, so waste costs each step, while a compaction copies the
        cache once or twice: at 16 requests on SmolLM2, 0.1 ran 1.07-1.27x faster than 0.5 in
        each of 4 alternating runs (measured when each step also copied the whole cache).
    compact_min_columns: ... but not before it has this many columns.
    prefill_buckets: prefill prompts right-padded to a few lengths (``shapes.prefill_length``)
        so that the memory oneDNN keeps per forward shape stays bounded.
    warm_up: before serving, run every step size and prefill length up to
        ``prefill_token_budget`` once (``shapes.warm_up``), so that memory reaches its working
        level at start and the first requests do not pay for compiling kernels.
    """

    step_token_budget: int = 64
    max_batch_size: int = 16
    max_queue: int = 64
    prefill_token_budget: int = 512
    adaptive_budget: bool = True
    explore: float = 0.1
    compact_waste: float = 0.1
    compact_min_columns: int = 64
    prefill_buckets: bool = True
    warm_up: bool = False

    def __post_init__(self) -> None:
        check_int("step_token_budget", self.step_token_budget, 1, 1 << 16)
        check_int("max_batch_size", self.max_batch_size, 1, 1 << 12)
        check_int("max_queue", self.max_queue, 0, 1 << 20)
        check_int("prefill_token_budget", self.prefill_token_budget, 1, 1 << 24)
        check_int("compact_min_columns", self.compact_min_columns, 1, 1 << 24)
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"explore must be in [0, 1], got {self.explore!r}")
        if not 0.0 < self.compact_waste < 1.0:
            raise ValueError(f"compact_waste must be in (0, 1), got {self.compact_waste!r}")


class QueueFullError(RuntimeError):
    """Too many requests are waiting; the HTTP layer answers 429."""


class EngineClosedError(RuntimeError):
    """The engine was stopped."""


@dataclass(frozen=True)
class TokenEvent:
    """New text of a request (never empty)."""

    text: str


@dataclass(frozen=True)
class FinishEvent:
    """The request ended. reason: "stop" (EOS or a stop string), "length" or "cancelled"."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    stats: GenerationStats


@dataclass(frozen=True)
class ErrorEvent:
    """The request failed inside the engine; the server goes on with the others."""

    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


class RequestHandle:
    """The caller's side of one request: its events, and a switch to cancel it.

    With ``loop`` (an asyncio loop) read the events with ``async for event in handle.aevents()``
    in that loop; without, with ``for event in handle.events()``. Both end after a
    ``FinishEvent`` or ``ErrorEvent``.
    """

    def __init__(self, request_id: str, wake, loop: asyncio.AbstractEventLoop | None) -> None:
        self.id = request_id
        self._wake = wake
        self._loop = loop
        self._queue: asyncio.Queue | queue.Queue = asyncio.Queue() if loop else queue.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop decoding this request and free its memory (at the engine's next iteration)."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        while True:
            event = self._queue.get(timeout=timeout)
            yield event
            if not isinstance(event, TokenEvent):
                return

    async def aevents(self) -> AsyncIterator[Event]:
        while True:
            event = await self._queue.get()
            yield event
            if not isinstance(event, TokenEvent):
                return

    def emit(self, event: Event) -> None:
        """Called by the engine thread."""
        if self._loop is None:
            self._queue.put(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass(eq=False)
class _Request:
    """A submitted request as the engine tracks it."""

    handle: RequestHandle
    decoder: Decoder
    detokenizer: Detokenizer
    method: str
    arrived: float = field(default_factory=time.perf_counter)
    last_token_at: float = 0.0

    @property
    def past(self) -> int:
        """Tokens in the request's cache: every committed token but the last (x0)."""
        return len(self.decoder.context) - 1


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc keeps freed mid-sized blocks otherwise, so
    the resident size would stay at its peak after a burst of long requests)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc
        return None


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
                 metrics: ServerMetrics | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._cache_keyword = cache_keyword(model)  # "cache" or "past_key_values"
        self.config = config or EngineConfig()
        self.metrics = metrics or ServerMetrics(
            running=lambda: self.running_count,
            waiting=lambda: self.waiting_count,
            cache_columns=lambda: self._cache.columns,
        )
        self._wakeup = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []  # running[i] owns row i of the cache
        self._cache = BatchedCache()
        self.budget = BudgetPolicy(self.config.step_token_budget, self.config.adaptive_budget,
                                   self.config.explore)
        self._ids = itertools.count()
        self._stopping = False
        self._live = 0  # submitted and not yet retired (guarded by _wakeup)
        self._thread: threading.Thread | None = None
        self._looping = False

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
        """Whether the loop is running (or about to, after ``start``)."""
        return self._looping

    @property
    def context_length(self) -> int | None:
        """The longest text (prompt + new tokens) served, None if unbounded.

        For a "longrope" model (Phi-3 128k) it is the original context: past it the model
        rotates with other factors, chosen by the largest position *in the batch*, so one
        long request would change the others' outputs, and ``model.generate`` recomputes the
        whole cache there, which a shared batch cannot do for one row.
        """
        limits = [getattr(self.model.config, "max_position_embeddings", None),
                  longrope_switch(self.model.config)]
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
               loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue a request; raises ``QueueFullError`` when ``max_queue`` requests already wait."""
        handle = RequestHandle(f"req-{next(self._ids)}", self._wake, loop)
        request = _Request(handle, decoder, Detokenizer(self.tokenizer, decoder.prompt, stop),
                           method or decoder.stats.method)
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
                if self._stopping:
                    break
            try:
                with torch.inference_mode():
                    self._iterate()
            except Exception as error:  # a failed forward pass: fail the batch, keep serving
                logger.exception("engine step failed; failing the %d running requests",
                                 len(self._running))
                self._remove(list(range(len(self._running))), error=error)

    def _iterate(self) -> None:
        # 1. Cancelled requests leave (a disconnected client frees its memory and queue slot).
        self._remove([i for i, r in enumerate(self._running) if r.handle.cancelled],
                     reason="cancelled")
        with self._wakeup:
            gone = [r for r in self._waiting if r.handle.cancelled]
            self._waiting = deque(r for r in self._waiting if not r.handle.cancelled)
        for request in gone:
            self._finish(request, "cancelled")
        self._retire(len(gone))
        # 2. Prefill new requests while the batch has room.
        self._admit()
        # 3. One forward pass for every running request's step.
        if self._running:
            self._step()

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

    def _prefill(self, request: _Request) -> bool:
        """Run the prompt alone (its first token) and add its cache as a row; False when the
        request ended there (done at its first token, or failed)."""
        try:
            prompt = len(request.decoder.prompt)
            committed = request.decoder.prefill(
                prefill_length(prompt) if self.config.prefill_buckets else None
            )
            self.metrics.prompt_tokens.inc(prompt)
            if self._deliver(request, committed):
                return False
            self._cache.add_row(request.decoder.cache)
        except Exception as error:
            logger.exception("prefill of %s failed", request.handle.id)
            self._fail(request, error)
            return False
        request.decoder.cache = None  # the batch owns the entries now
        self._running.append(request)
        return True

    def _step(self) -> None:
        started = time.perf_counter()
        methods = [request.method for request in self._running]
        budget = self.budget.choose(methods)
        plans = self._plan(budget)
        if not plans:
            return
        batch = self._cache.prepare_step(self.model.config, [p.layout for p in plans],
                                         self.model.dtype)
        out = decoding_pass(
            self.model,
            self._cache_keyword,
            self._cache.cache,
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            attention_mask=batch.mask,
            logits_to_keep=batch.logit_rows,
        )
        self._cache.extend(batch.position_ids)
        self.metrics.forward_tokens.observe(batch.input_ids.numel())
        self.metrics.batch_size.observe(len(plans))
        self.metrics.step_budget.observe(budget)
        done, committed, kept = [], [], []
        for row, (request, plan, logits) in enumerate(
            zip(self._running, plans, self._cache.split_logits(batch, out.logits))
        ):
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

    def _finish_step(self, request: _Request, plan: StepPlan,
                     logits: torch.Tensor) -> tuple[bool, int, list[int]]:
        """Verify and accept one request's step: whether it is done, how many tokens it
        committed, and which of its step entries stay in the cache."""
        try:
            committed, keep = request.decoder.finish(plan, logits)
        except Exception as error:
            logger.exception("verifying %s failed", request.handle.id)
            self._fail(request, error)
            return True, 0, []
        self.metrics.record_step(request.method, request.decoder.stats)
        return self._deliver(request, committed), len(committed), keep

    # ------------------------------------------------------------------ requests' lifecycle

    def _deliver(self, request: _Request, committed: list[int]) -> bool:
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
            request.handle.emit(TokenEvent(text))
        if request.detokenizer.stopped:
            self._finish(request, "stop")
            return True
        if decoder.finished:
            eos = decoder.context[-1] in decoder.eos_token_ids
            self._finish(request, "stop" if eos else "length")
            return True
        return False

    def _finish(self, request: _Request, reason: str) -> None:
        decoder = request.decoder
        if reason != "cancelled":
            rest = request.detokenizer.push([], final=True)
            if rest:
                request.handle.emit(TokenEvent(rest))
            self.metrics.e2e.observe(time.perf_counter() - request.arrived)
        self.metrics.requests.inc(1, "cancelled" if reason == "cancelled" else "finished", reason)
        self.metrics.generation_tokens.inc(decoder.stats.new_tokens, request.method)
        request.handle.emit(FinishEvent(reason, len(decoder.prompt), decoder.stats.new_tokens,
                                        decoder.new_tokens, decoder.stats))

    def _fail(self, request: _Request, error: BaseException) -> None:
        self.metrics.requests.inc(1, "error", type(error).__name__)
        request.handle.emit(ErrorEvent(f"{type(error).__name__}: {error}"))

    def _remove(self, rows: list[int], reason: str | None = None,
                error: BaseException | None = None) -> None:
        """Take running requests out of the batch (finishing or failing them if asked)."""
        if not rows:
            return
        for row in rows:
            if error is not None:
                self._fail(self._running[row], error)
            elif reason is not None:
                self._finish(self._running[row], reason)
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
