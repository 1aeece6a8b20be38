"""``lookahead serve`` and ``lookahead loadtest``.

    lookahead serve --model smollm2-135m --method lookahead --port 8000
    lookahead serve --model smollm2-135m --host 0.0.0.0 --api-key-file key.txt
    lookahead loadtest --url http://127.0.0.1:8000 --concurrency 1,2,4,8 --requests 16

Every limit and its default: docs/server.md, "Limits and flags".
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator

from lookahead.proposers.draft import check_draft_model
from lookahead.request import resolve_auto_shape
from lookahead.cli.loading import load, load_named
from lookahead.cli.options import set_handler
from lookahead.cli.options import add_method_args, add_model_args, check_copying_method
from lookahead.argtypes import UsageError, float_in, int_in
from lookahead.config import SAMPLING_OPTIONS
from lookahead.sources.memory import DEFAULT_CAPACITY

logger = logging.getLogger(__name__)

# The prefix cache's default budget is a quarter of the free memory, at most this (MB): about
# 70,000 tokens of Qwen2.5-Coder-1.5B's float32 KV entries (28 layers, 2 KV heads of 128).
PREFIX_CACHE_MAX_MB = 4096
# Chosen per request in the body: --sample and every sampling option.
_PER_REQUEST = ("sample", *(name for name in SAMPLING_OPTIONS if name != "do_sample"))


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        description="Serve /v1/completions and /v1/chat/completions (streamed or not), "
        "/v1/models, /health and /metrics. Requests are decoded together in one batch; "
        "speculation shrinks as the batch grows (--step-token-budget). A request picks its "
        'method with the body field "lookahead": {"method": ..., <options>}.',
    )
    add_model_args(serve)
    add_method_args(serve)
    group = serve.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    group.add_argument("--port", type=int_in(0, 65535), default=8000, help="(default: 8000)")
    group.add_argument("--served-model-name", metavar="NAME",
                       help="the name clients pass as `model` (default: --model)")
    group.add_argument("--max-batch-size", "--max-num-seqs", dest="max_batch_size",
                       type=int_in(1, 4096), default=16, metavar="N",
                       help="requests decoded together (default: 16)")
    group.add_argument("--max-queue", type=int_in(0, 1 << 20), default=64, metavar="N",
                       help="requests allowed to wait for the batch; more get 429 (default: 64)")
    group.add_argument("--step-token-budget", type=int_in(1, 1 << 16), default=64, metavar="N",
                       help="input tokens of one batched forward pass, shared by the running "
                       "requests (default: 64)")
    group.add_argument("--fixed-budget", action="store_true",
                       help="give every request the ceiling step_token_budget // running "
                       "instead of the share that measures best")
    group.add_argument("--prefill-token-budget", type=int_in(1, 1 << 24), default=512,
                       metavar="N", help="prompt tokens prefilled per engine iteration "
                       "(default: 512)")
    group.add_argument("--memory", action="store_true",
                       help="lookahead and prompt lookup also copy from the texts of earlier "
                       f"requests (at most {DEFAULT_CAPACITY} tokens), kept apart per API key: "
                       "a client copies only from texts sent with its own key. Without "
                       "--api-key all clients are one, so this is --shared-memory")
    group.add_argument("--shared-memory", action="store_true",
                       help="--memory with one memory for all clients. Then a client's "
                       "speed, and the acceptance figures (hidden from clients for this "
                       "reason), depend on the texts of other clients: a client can probe "
                       "what others sent. Use it only where all clients trust each other")
    group.add_argument("--no-warmup", action="store_true",
                       help="skip the warm-up before serving: one forward pass of every step "
                       "size and prefill length, and a short generation (they take the "
                       "first-call costs off the first clients, and bring memory to its "
                       "working level before serving)")
    _add_limit_args(serve)
    set_handler(serve, run_serve)

    from lookahead.server import loadtest

    test = subparsers.add_parser(
        "loadtest",
        description="Send dataset prompts to a running `lookahead serve` at several "
        "concurrencies and methods; print a table, write results.json and PNG plots.",
    )
    loadtest.add_arguments(test)
    set_handler(test, loadtest.run)


def _add_limit_args(serve: argparse.ArgumentParser) -> None:
    access = serve.add_argument_group("access")
    access.add_argument("--api-key", action="append", default=[], metavar="KEY",
                        help="every /v1 request must send 'Authorization: Bearer KEY' (may be "
                        "given more than once; a key on the command line shows in `ps`: "
                        "prefer --api-key-file)")
    access.add_argument("--api-key-file", metavar="PATH",
                        help="read API keys from PATH, one per line (blank lines and lines "
                        "starting with # are skipped)")
    access.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="also accept requests whose Host header names NAME. A server on a "
                        "loopback address accepts only localhost, 127.0.0.1 and [::1] (a "
                        "guard against DNS rebinding); on another address, only the names "
                        "given here if any ('*': any name)")
    access.add_argument("--cors-origins", type=_origins, default=(), metavar="ORIGINS",
                        help="comma-separated web origins (https://app.example:8443; '*': any) "
                        "whose pages may call the API from a browser (default: none, and no "
                        "CORS headers at all)")
    limits = serve.add_argument_group("limits")
    limits.add_argument("--max-model-len", type=int_in(2, 1 << 30), metavar="N",
                        help="the longest text served, prompt and answer (default: the "
                        "model's context)")
    limits.add_argument("--max-tokens", type=int_in(1, 1 << 30), default=2048, metavar="N",
                        help="the most tokens one request may ask for, and what a chat request "
                        "that names none gets (default: 2048)")
    limits.add_argument("--request-timeout", type=float_in(0, 1e7), default=600.0,
                        metavar="S", help="end a request (waiting or running) after S seconds "
                        "with an error; 0: never (default: 600)")
    limits.add_argument("--max-body-bytes", type=int_in(1024, 1 << 31), default=4 << 20,
                        metavar="N", help="largest request body; larger ones get 413 unread "
                        "(default: 4194304, 4 MiB)")
    limits.add_argument("--max-prompt-chars", type=int_in(1, 1 << 31), metavar="N",
                        help="longest prompt (chat: the messages' text) in characters, refused "
                        "before it is tokenized (default: 32 x the context length)")
    limits.add_argument("--prefix-cache-mb", type=int_in(0, 1 << 24), metavar="MB",
                        help="memory for the KV entries of earlier texts, so that a prompt that "
                        "starts as one did (a chat's next turn, a shared system prompt) "
                        "prefills only the rest; least recently used go first; 0: off "
                        f"(default: a quarter of the free memory, at most {PREFIX_CACHE_MAX_MB})")
    limits.add_argument("--health-stall-timeout", type=float_in(0, 1e7, low_open=True),
                        default=120.0, metavar="S",
                        help="/health answers 503 when the engine has work and no step ended "
                        "for S seconds (default: 120)")


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from lookahead.server.app import ServerSettings, create_app
    from lookahead.server.engine import Engine, EngineConfig

    for name in _PER_REQUEST:
        if getattr(args, name, None):
            flag = "--" + name.replace("_", "-")
            raise UsageError(flag, "sampling is chosen per request (temperature, top_p, seed "
                             "in the request body)")
    if args.memory or args.shared_memory:
        check_copying_method("--shared-memory" if args.shared_memory else "--memory", args.method)
    api_keys = _api_keys(args)
    # A draft model serves requests that ask for method "draft", whatever the default method.
    draft_name = args.draft_model
    if args.method != "draft":
        args.draft_model = None
    model, tokenizer, options = load(args)
    if args.method == "lookahead":
        options = resolve_auto_shape(model, options)  # once, not per request
    draft = options.pop("draft_model", None)
    if draft is None and draft_name:
        draft, _ = load_named("--draft-model", draft_name, args.dtype, args.packed_weights,
                              dequantize=args.dequantize)
        try:
            check_draft_model(model, draft)
        except ValueError as error:
            raise UsageError("--draft-model", str(error)) from None
    config = EngineConfig(
        step_token_budget=args.step_token_budget,
        max_batch_size=args.max_batch_size,
        max_queue=args.max_queue,
        prefill_token_budget=args.prefill_token_budget,
        adaptive_budget=not args.fixed_budget,
        warm_up=not args.no_warmup,
        request_timeout=args.request_timeout or None,
        max_model_len=args.max_model_len,
        prefix_cache_bytes=_prefix_cache_mb(args.prefix_cache_mb) << 20,
    )
    name = args.served_model_name or args.model
    engine = Engine(model, tokenizer, config, model_name=name)
    warm_up_options = None if args.no_warmup else dict(options)
    settings = ServerSettings(
        name, args.method, options, draft, api_keys=api_keys,
        allowed_hosts=_allowed_hosts(args.host, args.allowed_host),
        max_body_bytes=args.max_body_bytes, max_prompt_chars=args.max_prompt_chars,
        max_tokens=args.max_tokens,
        memory="shared" if args.shared_memory else "per-key" if args.memory else None,
        health_stall_s=args.health_stall_timeout, cors_origins=args.cors_origins)
    if settings.shares_memory:
        logger.warning("one --memory for all clients: each can probe the others' texts through "
                       "its own speed; use --api-key to keep them apart")
    if not api_keys and not _is_loopback(args.host):
        logger.warning("serving on %s without --api-key: anyone who can reach it may use it",
                       args.host)
    server = _ready_server(uvicorn.Config(
        create_app(engine, settings), host=args.host, port=args.port,
        log_level="info" if args.verbose else "warning"), settings.model_name, model, args.method)
    http = threading.Thread(target=_serve_http, name="lookahead-http", daemon=True,
                            args=(engine, server, args.method, warm_up_options))
    logger.info("serving %s (%s) on http://%s:%d", settings.model_name, args.method, args.host,
                args.port)
    http.start()
    interrupted = False
    with _interrupt_on_sigterm():
        try:
            engine.run()  # on this thread, which loaded the model: see Engine.run for why
        except KeyboardInterrupt:
            interrupted = True
            logger.info("interrupted: shutting down")
        finally:
            server.should_exit = True
            http.join(10)
    if not server.started and not interrupted:
        raise UsageError("--port", f"the server could not listen on {args.host}:{args.port} "
                         "(see the message above)")
    return 0


def _prefix_cache_mb(asked: int | None) -> int:
    """``--prefix-cache-mb``, else a quarter of the memory free now, at most
    ``PREFIX_CACHE_MAX_MB``."""
    if asked is not None:
        return asked
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return PREFIX_CACHE_MAX_MB // 4
    return min(PREFIX_CACHE_MAX_MB, free // 4 >> 20)


def _ready_server(config, model_name: str, model, method: str):
    """A ``uvicorn.Server`` that says on stderr, once it listens, what it serves: model, URL,
    kernel and default method (at every log level: a person waits for this line)."""
    import uvicorn

    from lookahead.kernels.packing import packing_of

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if not self.started:  # it could not listen: uvicorn said why
                return
            port = next((s.getsockname()[1] for server in self.servers for s in server.sockets),
                        config.port)
            print(f"lookahead serve: ready: {model_name} on http://{config.host}:{port} "
                  f"(kernel {packing_of(model)}, method {method})", file=sys.stderr, flush=True)

    return ReadyServer(config)


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """--api-key values and the keys of --api-key-file."""
    keys = list(args.api_key)
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as handle:
                lines = [line.strip() for line in handle]
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError("--api-key-file", f"cannot read {args.api_key_file}: {error}") from None
        found = [line for line in lines if line and not line.startswith("#")]
        if not found:
            raise UsageError("--api-key-file", f"{args.api_key_file} holds no key")
        keys += found
    for key in keys:
        if not key or not key.isascii() or not key.isprintable() or " " in key:
            raise UsageError("--api-key", "a key must be printable ASCII without spaces")
    return tuple(keys)


def _origins(value: str) -> tuple[str, ...]:
    """--cors-origins: "*" or scheme://host[:port] each, no path (as browsers send Origin)."""
    origins = tuple(part.strip() for part in value.split(",") if part.strip())
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s?#]+", origin):
            raise argparse.ArgumentTypeError(
                f"{origin!r} is not an origin: write scheme://host[:port] (no path, no "
                "trailing slash), or '*'")
    if not origins:
        raise argparse.ArgumentTypeError("give at least one origin")
    return origins


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _allowed_hosts(host: str, extra: list[str]) -> frozenset[str] | None:
    """The Host names to accept: on loopback, loopback names and ``extra``; elsewhere, only
    ``extra`` when given (None: any)."""
    from lookahead.server.guard import allowed_host_set

    if _is_loopback(host) or extra:
        return allowed_host_set(extra)
    return None


def _serve_http(engine, server, method: str, warm_up_options: dict | None) -> None:
    """The HTTP side, on its own thread: warm up through the engine (None: not), serve until
    uvicorn stops, then stop the engine."""
    try:
        if warm_up_options is not None:
            _warm_up(engine, method, warm_up_options)
        server.run()
    finally:
        engine.stop()


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM stops the server as Ctrl+C does (uvicorn, off the main
    thread, installs no handlers of its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _warm_up(engine, method: str, options: dict) -> None:
    """One short generation through the engine, so that one-time costs are paid up front."""
    from lookahead.request import make_decoder
    from lookahead.server.engine import ErrorEvent

    ids = engine.tokenizer("def fibonacci(n):\n    ", return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        return
    started = time.perf_counter()
    handle = engine.submit(make_decoder(engine.model, ids, 16, method, **options))
    for event in handle.events(timeout=600):
        if isinstance(event, ErrorEvent):
            logger.warning("warm-up failed: %s", event.message)
    engine.budget.forget()  # first calls are slow: not a measure of any share
    logger.info("warmed up in %.1f s", time.perf_counter() - started)
