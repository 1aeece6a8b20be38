"""Prometheus metrics of the server, in the text exposition format (no extra dependency).

The engine thread records, the HTTP thread renders: every metric guards its values with one
lock. Names follow vLLM's where one exists (``spec_decode_num_draft_tokens`` ...), prefixed
``lookahead_``.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence

from lookahead.stats import GenerationStats

# Latency buckets in seconds, from a fast CPU step to a long generation.
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values))
    return "{" + pairs + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], object] = {}
        if not self.label_names and self.kind == "counter":
            self._values[()] = 0.0  # an unlabelled counter shows 0 before its first event

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [
            f"{self.name}_total{_labels(self.label_names, k)} {_number(v)}" for k, v in items
        ]


class Gauge(_Metric):
    """A value read when rendered (``source``) or set by hand."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, source=None) -> None:
        super().__init__(name, help_text)
        self.source = source

    def set(self, value: float) -> None:
        with self._lock:
            self._values[()] = value

    def render(self) -> list[str]:
        value = self.source() if self.source is not None else self._values.get((), 0.0)
        return self.header() + [f"{self.name} {_number(value)}"]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], labels=()) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(buckets) + (math.inf,)

    def observe(self, value: float, *labels: str, count: int = 1) -> None:
        """Record ``value`` ``count`` times (e.g. one inter-token gap per token of a step)."""
        with self._lock:
            counts, total = self._values.get(labels, ([0] * len(self.buckets), 0.0))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += count
            self._values[labels] = (counts, total + value * count)

    def count(self, *labels: str) -> int:
        with self._lock:
            counts, _ = self._values.get(labels, ([0] * len(self.buckets), 0.0))
            return counts[-1]

    def render(self) -> list[str]:
        lines = self.header()
        with self._lock:
            items = sorted((k, (list(c), s)) for k, (c, s) in self._values.items())
        for labels, (counts, total) in items:
            for bound, count in zip(self.buckets, counts):
                names = self.label_names + ("le",)
                lines.append(f"{self.name}_bucket{_labels(names, labels + (_number(bound),))} {count}")
            base = _labels(self.label_names, labels)
            lines.append(f"{self.name}_sum{base} {_number(total)}")
            lines.append(f"{self.name}_count{base} {counts[-1]}")
        return lines


def resident_memory_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class ServerMetrics:
    """Every metric the server exports; the engine calls the ``record_*`` methods."""

    def __init__(self, running=lambda: 0, waiting=lambda: 0, cache_columns=lambda: 0) -> None:
        p = "lookahead_"
        self.requests = Counter(p + "requests", "Requests by outcome (finished, cancelled, "
                                "rejected, error) and finish reason.", ("outcome", "reason"))
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated.", ("method",))
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token.",
                              LATENCY_BUCKETS)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time per output token after the "
                             "first (a step's gap divided among its tokens).", LATENCY_BUCKETS)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to last token.",
                             REQUEST_BUCKETS)
        self.forward_tokens = Histogram(p + "batch_forward_tokens", "Tokens fed to one batched "
                                        "forward pass (padding included).", TOKEN_BUCKETS)
        self.batch_size = Histogram(p + "batch_size", "Requests in one batched forward pass.",
                                    TOKEN_BUCKETS)
        self.step_budget = Histogram(p + "step_budget_tokens", "Input tokens each request "
                                     "could use in one batched step (the adaptive share).",
                                     TOKEN_BUCKETS)
        self.steps = Counter(p + "spec_decode_steps", "Decoding steps (one per request per "
                             "batched forward).", ("method",))
        self.drafts = Counter(p + "spec_decode_num_drafts", "Steps that proposed tokens.",
                              ("method",))
        self.draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Proposed tokens.",
                                    ("method",))
        self.accepted = Counter(p + "spec_decode_num_accepted_tokens", "Accepted proposed tokens.",
                                ("method",))
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos", "Steps that "
                                        "accepted at least position + 1 tokens.",
                                        ("method", "position"))
        self.gauges = [
            Gauge(p + "num_requests_running", "Requests in the batch.", running),
            Gauge(p + "num_requests_waiting", "Requests waiting for a batch slot.", waiting),
            Gauge(p + "kv_cache_columns", "Columns of the batched KV cache.", cache_columns),
            Gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                  resident_memory_bytes),
        ]

    def record_step(self, method: str, stats: GenerationStats) -> None:
        """Count the last step of a request (its proposal and what it accepted)."""
        proposed, accepted = stats.proposed_per_step[-1], stats.accepted_per_step[-1]
        self.steps.inc(1, method)
        if proposed:
            self.drafts.inc(1, method)
            self.draft_tokens.inc(proposed, method)
        self.accepted.inc(accepted, method)
        for position in range(accepted):
            self.accepted_per_pos.inc(1, method, str(position))

    def render(self) -> str:
        metrics = [self.requests, self.prompt_tokens, self.generation_tokens, self.ttft, self.itl,
                   self.e2e, self.forward_tokens, self.batch_size, self.step_budget, self.steps,
                   self.drafts, self.draft_tokens, self.accepted, self.accepted_per_pos,
                   *self.gauges]
        lines = [line for metric in metrics for line in metric.render()]
        return "\n".join(lines) + "\n"
