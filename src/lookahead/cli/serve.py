"""``lookahead serve`` and ``lookahead loadtest``.

    lookahead serve --model smollm2-135m --method lookahead --port 8000
    lookahead loadtest --url http://127.0.0.1:8000 --concurrency 1,2,4,8 --requests 16
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator

from lookahead.api import check_draft_model, resolve_auto_shape
from lookahead.cli.loading import load, load_named
from lookahead.cli.options import set_handler
from lookahead.cli.options import add_method_args, add_model_args, check_copying_method
from lookahead.argtypes import UsageError, int_in
from lookahead.config import SAMPLING_OPTIONS
from lookahead.sources.memory import DEFAULT_CAPACITY, TextMemory

logger = logging.getLogger(__name__)

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
    group.add_argument("--max-batch-size", type=int_in(1, 4096), default=16, metavar="N",
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
                       f"requests (kept in the server's memory, at most {DEFAULT_CAPACITY} tokens)")
    group.add_argument("--no-warmup", action="store_true",
                       help="skip the warm-up before serving: one forward pass of every step "
                       "size and prefill length, and a short generation (they take the "
                       "first-call costs off the first clients, and bring memory to its "
                       "working level before serving)")
    set_handler(serve, run_serve)

    from lookahead.server import loadtest

    test = subparsers.add_parser(
        "loadtest",
        description="Send dataset prompts to a running `lookahead serve` at several "
        "concurrencies and methods; print a table, write results.json and PNG plots.",
    )
    loadtest.add_arguments(test)
    set_handler(test, loadtest.run)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from lookahead.server.app import ServerSettings, create_app
    from lookahead.server.engine import Engine, EngineConfig

    for name in _PER_REQUEST:
        if getattr(args, name, None):
            flag = "--" + name.replace("_", "-")
            raise UsageError(flag, "sampling is chosen per request (temperature, top_p, seed "
                             "in the request body)")
    if args.memory:
        check_copying_method("--memory", args.method)
    # A draft model serves requests that ask for method "draft", whatever the default method.
    draft_name = args.draft_model
    if args.method != "draft":
        args.draft_model = None
    model, tokenizer, options = load(args)
    if args.method == "lookahead":
        options = resolve_auto_shape(model, options)  # once, not per request
    draft = options.pop("draft_model", None)
    if draft is None and draft_name:
        draft, _ = load_named("--draft-model", draft_name, args.dtype, args.packed_weights)
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
    )
    engine = Engine(model, tokenizer, config)
    warm_up_options = None if args.no_warmup else dict(options)  # no memory: not a request
    if args.memory:
        options["memory"] = TextMemory()
    settings = ServerSettings(args.served_model_name or args.model, args.method, options, draft)
    server = uvicorn.Server(uvicorn.Config(
        create_app(engine, settings), host=args.host, port=args.port,
        log_level="info" if args.verbose else "warning"))
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
    from lookahead.api import make_decoder
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
