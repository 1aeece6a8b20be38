"""Prometheus metrics of the server (``prometheus_client``), one registry per server.

The engine thread records, the HTTP thread renders (``prometheus_client`` locks each value).
Each ``ServerMetrics`` has its own ``CollectorRegistry`` with the standard ``process_*``
metrics (resident memory, CPU seconds, open files) added, rather than the library's global
registry, so that two servers (or tests) in one process never mix their counts.

Names: ``lookahead_...`` for everything, with a ``method`` label where it matters; the
speculative-decoding counters are exported a second time under vLLM's names
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total`` with a
``position`` label), labelled ``model_name``, so that dashboards written for vLLM read them.
"""

from __future__ import annotations

from collections.abc import Sequence

import prometheus_client as prom

from lookahead.stats import GenerationStats

# Latency buckets in seconds, from a fast CPU step to a long generation.
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

CONTENT_TYPE = prom.CONTENT_TYPE_LATEST


class Counter:
    """A counter whose labels are given by position: ``inc(1, "finished", "stop")``."""

    def __init__(self, registry: prom.CollectorRegistry, name: str, help_text: str,
                 labels: Sequence[str] = ()) -> None:
        self.name, self.label_names, self._registry = name, tuple(labels), registry
        self._metric = prom.Counter(name, help_text, self.label_names, registry=registry)

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        (self._metric.labels(*labels) if labels else self._metric).inc(amount)

    def value(self, *labels: str) -> float:
        """The count so far (0 before the first ``inc`` with these labels)."""
        found = self._registry.get_sample_value(self.name + "_total",
                                                dict(zip(self.label_names, labels)))
        return found or 0.0


class Histogram:
    def __init__(self, registry: prom.CollectorRegistry, name: str, help_text: str,
                 buckets: Sequence[float], labels: Sequence[str] = ()) -> None:
        self.name, self.label_names, self._registry = name, tuple(labels), registry
        self._metric = prom.Histogram(name, help_text, self.label_names, registry=registry,
                                      buckets=tuple(buckets))

    def observe(self, value: float, *labels: str, count: int = 1) -> None:
        """Record ``value`` ``count`` times (e.g. one inter-token gap per token of a step)."""
        metric = self._metric.labels(*labels) if labels else self._metric
        for _ in range(count):
            metric.observe(value)

    def count(self, *labels: str) -> int:
        found = self._registry.get_sample_value(self.name + "_count",
                                                dict(zip(self.label_names, labels)))
        return int(found or 0)


class ServerMetrics:
    """Every metric the server exports; the engine calls the ``record_*`` methods.

    model_name: the ``model_name`` label of the vLLM-named counters (the served name).
    running, waiting, cache_columns: read when ``/metrics`` is rendered.
    """

    def __init__(self, model_name: str = "", running=lambda: 0, waiting=lambda: 0,
                 cache_columns=lambda: 0, prefix_bytes=lambda: 0) -> None:
        self.registry = registry = prom.CollectorRegistry()
        prom.ProcessCollector(registry=registry)
        self.model_name = model_name
        p = "lookahead_"
        self.requests = Counter(registry, p + "requests", "Requests by outcome (finished, "
                                "cancelled, rejected, error) and finish reason.",
                                ("outcome", "reason"))
        self.prompt_tokens = Counter(registry, p + "prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = Counter(registry, p + "generation_tokens", "Tokens generated.",
                                         ("method",))
        self.ttft = Histogram(registry, p + "time_to_first_token_seconds",
                              "Arrival to first token.", LATENCY_BUCKETS)
        self.itl = Histogram(registry, p + "inter_token_latency_seconds", "Time per output token "
                             "after the first (a step's gap divided among its tokens).",
                             LATENCY_BUCKETS)
        self.e2e = Histogram(registry, p + "e2e_request_latency_seconds",
                             "Arrival to last token.", REQUEST_BUCKETS)
        self.forward_tokens = Histogram(registry, p + "batch_forward_tokens", "Tokens fed to one "
                                        "batched forward pass (padding included).", TOKEN_BUCKETS)
        self.batch_size = Histogram(registry, p + "batch_size",
                                    "Requests in one batched forward pass.", TOKEN_BUCKETS)
        self.step_budget = Histogram(registry, p + "step_budget_tokens", "Input tokens each "
                                     "request could use in one batched step (the adaptive "
                                     "share).", TOKEN_BUCKETS)
        self.steps = Counter(registry, p + "spec_decode_steps", "Decoding steps (one per "
                             "request per batched forward).", ("method",))
        self.drafts = Counter(registry, p + "spec_decode_num_drafts",
                              "Steps that proposed tokens.", ("method",))
        self.draft_tokens = Counter(registry, p + "spec_decode_num_draft_tokens",
                                    "Proposed tokens.", ("method",))
        self.accepted = Counter(registry, p + "spec_decode_num_accepted_tokens",
                                "Accepted proposed tokens.", ("method",))
        self.accepted_per_pos = Counter(registry, p + "spec_decode_num_accepted_tokens_per_pos",
                                        "Steps that accepted at least position + 1 tokens.",
                                        ("method", "position"))
        v = "vllm:spec_decode_"
        self.vllm_drafts = Counter(registry, v + "num_drafts", "Number of spec decoding drafts.",
                                   ("model_name",))
        self.vllm_draft_tokens = Counter(registry, v + "num_draft_tokens", "Number of draft "
                                         "tokens.", ("model_name",))
        self.vllm_accepted = Counter(registry, v + "num_accepted_tokens", "Number of accepted "
                                     "tokens.", ("model_name",))
        self.vllm_accepted_per_pos = Counter(registry, v + "num_accepted_tokens_per_pos",
                                             "Accepted tokens per draft position.",
                                             ("model_name", "position"))
        self.prefix_queries = Counter(registry, "vllm:prefix_cache_queries", "Prefix cache "
                                      "queries, in terms of number of queried tokens.",
                                      ("model_name",))
        self.prefix_hits = Counter(registry, "vllm:prefix_cache_hits", "Prefix cache hits, in "
                                   "terms of number of cached tokens.", ("model_name",))
        for name, help_text, source in (
            (p + "prefix_cache_bytes", "Memory held by the prefix cache's entries.",
             prefix_bytes),
            (p + "num_requests_running", "Requests in the batch.", running),
            (p + "num_requests_waiting", "Requests waiting for a batch slot.", waiting),
            (p + "kv_cache_columns", "Columns of the batched KV cache.", cache_columns),
        ):
            prom.Gauge(name, help_text, registry=registry).set_function(source)

    def record_step(self, method: str, stats: GenerationStats) -> None:
        """Count the last step of a request (its proposal and what it accepted)."""
        proposed, accepted = stats.proposed_per_step[-1], stats.accepted_per_step[-1]
        name = self.model_name
        self.steps.inc(1, method)
        if proposed:
            self.drafts.inc(1, method)
            self.draft_tokens.inc(proposed, method)
            self.vllm_drafts.inc(1, name)
            self.vllm_draft_tokens.inc(proposed, name)
        self.accepted.inc(accepted, method)
        self.vllm_accepted.inc(accepted, name)
        for position in range(accepted):
            self.accepted_per_pos.inc(1, method, str(position))
            self.vllm_accepted_per_pos.inc(1, name, str(position))

    def render(self) -> str:
        """The Prometheus text exposition of every metric (``CONTENT_TYPE``)."""
        return prom.generate_latest(self.registry).decode("utf-8")
