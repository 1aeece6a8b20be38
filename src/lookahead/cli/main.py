"""The ``lookahead`` command: ``lookahead demo | generate | chat | bench | tune | serve | loadtest``.

Each subcommand lives in its own module, which exposes ``register(subparsers)``: it adds its
parser and sets ``func`` (called with the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

import torch
import transformers

from lookahead import __version__

# Modules that register subcommands, in the order ``--help`` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "lookahead.cli.demo",
    "lookahead.cli.generate",
    "lookahead.cli.chat",
    "lookahead.cli.install",
    "lookahead.cli.bench",
    "lookahead.cli.tune",
    "lookahead.cli.serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lookahead",
        description="Faster text generation with identical output: lookahead decoding, "
        "prompt lookup and draft-model speculative decoding.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the versions of lookahead, torch and transformers")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def version_line() -> str:
    """What a bug report needs: our version and the two libraries the decoding depends on."""
    return (f"lookahead {__version__} "
            f"(torch {torch.__version__}, transformers {transformers.__version__})")


# What a shell reports for a command that SIGINT ended (128 + 2).
INTERRUPTED_EXIT_CODE = 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # Ctrl-C is how a person stops a long generation or benchmark: a traceback through
        # torch's internals would read as a crash.
        print(f"\nlookahead {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
