"""How the engine shares the model between requests, and the limits it holds them to."""

from __future__ import annotations

from dataclasses import dataclass

from lookahead.config import check_int


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
    request_timeout: seconds from ``submit`` after which a request that has not ended is
        ended with an ``ErrorEvent`` (code ``ERROR_TIMEOUT``), waiting or running; the others
        go on. None: no limit.
    max_model_len: the longest text (prompt + new tokens) served, below the model's own
        context (``Engine.context_length``); None: the model's.
    prefix_cache_bytes: memory for the KV entries of earlier texts (``PrefixCache``): a
        prompt that starts as one of them did prefills only the rest. 0 turns it off.
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
    request_timeout: float | None = None
    max_model_len: int | None = None
    prefix_cache_bytes: int = 0

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
        if self.request_timeout is not None and not (
                isinstance(self.request_timeout, (int, float)) and self.request_timeout > 0):
            raise ValueError(f"request_timeout must be a number of seconds > 0 or None, got "
                             f"{self.request_timeout!r}")
        check_int("prefix_cache_bytes", self.prefix_cache_bytes, 0, 1 << 50)
        if self.max_model_len is not None:
            check_int("max_model_len", self.max_model_len, 2, 1 << 30)
