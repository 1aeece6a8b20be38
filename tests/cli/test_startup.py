"""``lookahead --help`` and argument errors answer without loading torch or transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Runs the command in-process in a fresh interpreter and reports what it imported.
PROBE = """
import json, sys
from lookahead.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "transformers")
                                                 if m in sys.modules)}), file=sys.stderr)
"""


def imported_by(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True,
                          timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], [], ["no-such-command"], ["generate", "--help"],
                                  ["generate", "--window", "x", "hi"], ["chat", "--help"]])
def test_help_and_argument_errors_do_not_import_torch(argv) -> None:
    result = imported_by(*argv)
    assert result["code"] in (0, 2)
    assert result["heavy"] == []


def test_python_m_lookahead_help_lists_every_command_without_torch() -> None:
    probe = ("import runpy, sys; sys.argv = ['lookahead', '--help']\n"
             "try:\n    runpy.run_module('lookahead', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False False"
    for name in ("demo", "generate", "chat", "install-model", "bench", "tune", "serve",
                 "loadtest"):
        assert f"    {name}" in done.stdout


def test_a_command_that_runs_does_import_them() -> None:
    # The probe can tell: --version prints torch's version, so it must import it.
    assert imported_by("--version")["heavy"] == ["torch", "transformers"]
