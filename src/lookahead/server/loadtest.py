"""``lookahead loadtest``: drive a running server and measure what clients see.

For each method and each concurrency c, ``--requests`` streamed requests are sent by c
clients at once (each sends its next request when the last one ends), greedy, with the method
chosen per request through the body field ``"lookahead": {"method": ...}``. Measured:

* throughput: completion tokens of the cell / the cell's wall time;
* time to first token (TTFT): request sent -> first chunk with text;
* latency: request sent -> ``[DONE]``; p50 and p95 of both.

``--repeat R`` runs each concurrency's cells R times, the methods in turn and in alternating
order (A B, B A, A B, ...), and pools the repeats: on a machine whose speed drifts by tens of
percent within minutes, each method then sees about the same share of fast and slow minutes.

``--disconnect-fraction f`` makes a fraction f of the requests hang up after a few chunks
(the server must cancel them); they count as "cancelled" and stay out of the latency figures.
The server's resident memory (``process_resident_memory_bytes`` from /metrics) is read before
and after, once the server is idle again.

Writes ``results.json`` (each cell's figures, and every request's prompt id, repeat, tokens,
TTFT and latency) and ``throughput.png``, ``ttft.png``, ``latency.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lookahead.argtypes import UsageError, int_in
from lookahead.config import method_names
from lookahead.bench.datasets import Prompt, load_prompts
from lookahead.kernels.quant_linear import cpu_name

try:
    import httpx
except ImportError:  # no `server` extra: the subcommand is listed, and says what to install
    httpx = None

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """One request as the client saw it."""

    status: int
    prompt: str = ""  # the data set's prompt id
    tokens: int = 0
    ttft: float | None = None
    latency: float = 0.0
    cancelled: bool = False
    error: str | None = None


@dataclass
class Cell:
    """The figures of one (method, concurrency)."""

    method: str
    concurrency: int
    requests: int
    completed: int
    cancelled: int
    errors: int
    server_errors: int
    tokens: int
    seconds: float
    throughput: float
    ttft_p50: float | None
    ttft_p95: float | None
    latency_p50: float | None
    latency_p95: float | None
    load_average: float | None = None  # this machine's 1-minute load at the cell's end
    repeats: int = 1  # runs pooled into the cell (``--repeat``)
    run_seconds: list[float] = field(default_factory=list)  # each run's wall time: the spread
    # Every request, in the order they finished within each run (dicts of ``Outcome``'s fields
    # and ``repeat``): which prompts were slow, and whether a run was slow on every prompt.
    outcomes: list[dict] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    parser.add_argument("--api-key", metavar="KEY",
                        help="sent as 'Authorization: Bearer KEY' (a server started with --api-key)")
    parser.add_argument("--concurrency", default="1,2,4,8", type=_int_list,
                        help="comma-separated client counts (default: 1,2,4,8)")
    parser.add_argument("--requests", type=int_in(1, 1 << 20), default=16, metavar="N",
                        help="requests per (method, concurrency) (default: 16)")
    parser.add_argument("--dataset", default="humaneval",
                        help="humaneval, mtbench, gsm8k or a .jsonl file (default: humaneval)")
    parser.add_argument("--max-tokens", type=int_in(1, 1 << 20), default=128, metavar="N",
                        help="(default: 128)")
    parser.add_argument("--methods", default="lookahead,autoregressive", type=_method_list,
                        help="comma-separated methods (default: lookahead,autoregressive)")
    parser.add_argument("--disconnect-fraction", type=float, default=0.0, metavar="F",
                        help="hang up this fraction of requests after a few chunks (default: 0)")
    parser.add_argument("--warmup", type=int_in(0, 1000), default=1, metavar="N",
                        help="unmeasured requests per method first (default: 1)")
    parser.add_argument("--repeat", type=int_in(1, 100), default=1, metavar="R",
                        help="run each concurrency R times, alternating the methods' order, "
                        "and pool the figures (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the disconnect choices")
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    parser.add_argument("--out", type=Path, default=Path("loadtest-results"), metavar="DIR",
                        help="(default: ./loadtest-results)")


def run(args: argparse.Namespace) -> int:
    if httpx is None:
        print("lookahead loadtest: error: it needs httpx: pip install 'lookahead-exact[server]'",
              file=sys.stderr)
        return 1
    if not 0.0 <= args.disconnect_fraction <= 1.0:
        raise UsageError("--disconnect-fraction", "must be in [0, 1]")
    prompts = load_prompts(args.dataset)
    report = asyncio.run(_run(args, prompts))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    cells = [Cell(**c) for c in report["cells"]]
    _print_table(cells, report)
    _plot(report, args.out)
    print(f"wrote {args.out / 'results.json'} and plots in {args.out}")
    return 1 if any(c.server_errors for c in cells) else 0


async def _run(args, prompts: list[Prompt]) -> dict:
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout, limits=limits,
                                 headers=headers) as client:
        model = await _served_model(client, args.url)
        health = await _health(client)
        rss_before = await _server_rss(client)
        rng = random.Random(args.seed)
        cells = []
        for method in args.methods:
            for i in range(args.warmup):
                await _request(client, model, prompts[i % len(prompts)], method, args.max_tokens)
        # Concurrency-major, so that the methods of one row run close together in time, in
        # alternating order when repeated (a shared machine's load drifts).
        for concurrency in args.concurrency:
            runs: dict[str, list[tuple[list[Outcome], float]]] = {m: [] for m in args.methods}
            for repeat in range(args.repeat):
                order = args.methods if repeat % 2 == 0 else args.methods[::-1]
                for method in order:
                    runs[method].append(await _run_cell(client, model, prompts, method,
                                                        concurrency, args, rng))
            for method in args.methods:
                cell = _summarize(method, concurrency, runs[method])
                logger.info("%s at concurrency %d: %.1f tok/s, %d of %d done", method,
                            concurrency, cell.throughput, cell.completed, cell.requests)
                cells.append(asdict(cell))
        idle = await _wait_idle(client)
        rss_after = await _server_rss(client)
    return {
        "url": args.url, "model": model, "dataset": args.dataset, "max_tokens": args.max_tokens,
        "requests": args.requests, "repeat": args.repeat,
        "disconnect_fraction": args.disconnect_fraction,
        "server_rss_bytes_before": rss_before, "server_rss_bytes_after": rss_after,
        "server_idle_after": idle, "environment": _environment(health), "cells": cells,
    }


def _environment(health: dict) -> dict:
    """Where the figures come from, for the plots' titles: this machine's CPU (the server's
    too where both run on it) and the server's threads if its /health reports them."""
    return {"processor": cpu_name(), "cpus": os.cpu_count(),
            "threads": health.get("threads")}


async def _run_cell(client, model, prompts, method, concurrency, args,
                    rng) -> tuple[list[Outcome], float]:
    """``args.requests`` requests, ``concurrency`` at a time: their outcomes and wall seconds."""
    jobs = list(range(args.requests))
    hang_up = {j: rng.randint(1, 5) for j in jobs if rng.random() < args.disconnect_fraction}
    outcomes: list[Outcome] = []

    async def worker() -> None:
        while jobs:
            j = jobs.pop(0)
            prompt = prompts[j % len(prompts)]
            outcomes.append(await _request(client, model, prompt, method, args.max_tokens,
                                           hang_up.get(j)))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes, time.perf_counter() - start


def _summarize(method: str, concurrency: int, runs: list[tuple[list[Outcome], float]]) -> Cell:
    """One cell's figures, pooled over its runs: throughput is all their completion tokens over
    all their seconds; the percentiles are over all their requests."""
    outcomes = [o for run_outcomes, _ in runs for o in run_outcomes]
    seconds = sum(run_seconds for _, run_seconds in runs)
    done = [o for o in outcomes if o.status == 200 and not o.cancelled and o.error is None]
    ttfts = [o.ttft for o in done if o.ttft is not None]
    latencies = [o.latency for o in done]
    tokens = sum(o.tokens for o in done)
    errors = [o for o in outcomes if o.status != 200 or o.error]
    for o in errors[:3]:
        logger.warning("request failed: %s %s", o.status, o.error)
    return Cell(
        method=method, concurrency=concurrency, requests=len(outcomes), completed=len(done),
        cancelled=sum(o.cancelled for o in outcomes), errors=len(errors),
        server_errors=sum(o.status >= 500 for o in outcomes), tokens=tokens, seconds=seconds,
        throughput=tokens / seconds if seconds else 0.0,
        ttft_p50=_percentile(ttfts, 50), ttft_p95=_percentile(ttfts, 95),
        latency_p50=_percentile(latencies, 50), latency_p95=_percentile(latencies, 95),
        load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        repeats=len(runs), run_seconds=[run_seconds for _, run_seconds in runs],
        outcomes=[dict(asdict(o), repeat=r) for r, (run_outcomes, _) in enumerate(runs)
                  for o in run_outcomes],
    )


async def _served_model(client, url: str) -> str:
    """The id of the model the server at ``url`` serves (``GET /v1/models``); a ``UsageError``
    naming ``--url`` when nothing answers there, or not as an OpenAI-compatible server."""
    try:
        response = await client.get("/v1/models")
    except httpx.HTTPError as error:
        raise UsageError("--url", f"no server answers at {url} "
                         f"({type(error).__name__}: {error}); start one with `lookahead serve`") from None
    try:
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        raise UsageError("--url", f"{url} is not an OpenAI-compatible server: GET /v1/models "
                         f"answered {response.status_code} {response.text[:100]!r}") from None


async def _request(client, model, prompt: Prompt, method, max_tokens, hang_up_after=None) -> Outcome:
    """One streamed greedy request; with ``hang_up_after``, close after that many chunks."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "lookahead": {"method": method}}
    if prompt.is_chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt.text}]
    else:
        path, body["prompt"] = "/v1/completions", prompt.text
    start = time.perf_counter()
    outcome = Outcome(status=0, prompt=prompt.id)
    try:
        async with client.stream("POST", path, json=body) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode(errors="replace")[:300]
                return outcome
            chunks = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    outcome.error = event["error"].get("message")
                    break
                if event.get("usage"):
                    outcome.tokens = event["usage"]["completion_tokens"]
                if _text(event) and outcome.ttft is None:
                    outcome.ttft = time.perf_counter() - start
                chunks += 1
                if hang_up_after is not None and chunks >= hang_up_after:
                    outcome.cancelled = True  # leaving the block closes the connection
                    break
    except httpx.HTTPError as error:
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.latency = time.perf_counter() - start
    return outcome


def _text(event: dict) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def _health(client) -> dict:
    try:
        response = await client.get("/health")
        return response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


async def _server_rss(client) -> int | None:
    try:
        text = (await client.get("/metrics")).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return int(float(line.split()[1]))
    return None


async def _wait_idle(client, timeout: float = 30.0) -> bool:
    """Wait until the server holds no request any more (cancellations have landed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = (await client.get("/health")).json()
        if health.get("active", health.get("running", 0) + health.get("waiting", 0)) == 0:
            return True
        await asyncio.sleep(0.2)
    return False


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _print_table(cells: list[Cell], report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report['model']} - {report['dataset']}, max_tokens "
                  f"{report['max_tokens']}, {report['requests']} requests per row"
                  + (f" x {report['repeat']} repeats" if report.get("repeat", 1) > 1 else ""))
    for name in ("method", "conc.", "done", "cancel", "errors", "tok/s", "TTFT p50", "TTFT p95",
                 "latency p50", "latency p95", "load"):
        table.add_column(name, justify="left" if name == "method" else "right")

    def ms(x):
        return "-" if x is None else f"{x * 1000:.0f} ms"

    for c in cells:
        table.add_row(c.method, str(c.concurrency), str(c.completed), str(c.cancelled),
                      str(c.errors), f"{c.throughput:.1f}", ms(c.ttft_p50), ms(c.ttft_p95),
                      ms(c.latency_p50), ms(c.latency_p95),
                      "-" if c.load_average is None else f"{c.load_average:.1f}")
    console = Console(width=max(120, Console().width))
    console.print(table)
    before, after = report["server_rss_bytes_before"], report["server_rss_bytes_after"]
    if before and after:
        console.print(f"server RSS: {before / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB "
                      f"after (idle: {report['server_idle_after']})")


def _plot(report: dict, out: Path) -> None:
    """The three PNGs (``lookahead.bench.plots.plot_loadtest``); skipped, with a warning,
    where matplotlib is not installed (it comes with the ``bench`` extra)."""
    try:
        from lookahead.bench.plots import plot_loadtest
    except ImportError as error:
        logger.warning("no plots: %s (pip install matplotlib)", error)
        return
    plot_loadtest(report, out)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _method_list(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in method_names()]
    if bad or not methods:
        raise argparse.ArgumentTypeError(f"methods must be among {', '.join(method_names())}; got {text!r}")
    return methods
