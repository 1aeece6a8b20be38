"""benchmarks/attention_kernel.py: another commit's attention kernel timed beside this one."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_kernel.py"


@pytest.fixture(scope="module")
def script():
    return runpy.run_path(str(SCRIPT))


def test_it_times_both_kernels_on_every_shape(script, capsys) -> None:
    assert script["main"](["--against", "HEAD", "--keys", "40", "--rows", "1,3",
                           "--rounds", "1", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    shapes = [line for line in lines if "keys" in line]
    assert len(shapes) == 2 * 2  # two models' heads x two row counts
    for line in shapes:
        found = re.search(r"HEAD +([\d.]+) us +this +([\d.]+) us +max diff ([\d.e+-]+)$", line)
        assert found, line
        assert float(found[1]) > 0 and float(found[2]) > 0
        assert float(found[3]) < 1e-5  # the same attention, whichever build of it
    assert lines[-1].startswith("sum over shapes:")


def test_bad_input_names_the_argument(script, capsys) -> None:
    for argv, message in ((["--against", "no-such-commit"], "--against: no attention kernel"),
                          (["--against", "HEAD", "--rows", "0"], "argument --rows"),
                          (["--against", "HEAD", "--rounds", "0"], "--rounds: expected")):
        with pytest.raises(SystemExit):
            script["main"](argv)
        assert message in capsys.readouterr().err
