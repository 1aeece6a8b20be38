"""benchmarks/gpu_step_cost.py, the GPU step-cost script, checked on the CPU with its tiny
preset: CI has no GPU, but the script must not rot between the sessions that have one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step_cost.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300)


def test_the_gpu_script_measures_the_curve_and_every_method_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run("--device", "cpu", "--preset", "tiny", "--dtype", "float32",
                "--contexts", "16,40", "--tokens", "1,4,8", "--repeats", "2",
                "--max-new-tokens", "12", "--shapes", "2x3x2", "--passes", "2", "--warm-up", "0.2",
                "--out", str(out))
    assert done.returncode == 0, done.stderr  # 0: every run's text is HF generate's
    saved = json.loads((out / "results.json").read_text())
    for length, curve in saved["curves"].items():
        assert curve["tokens"] == [1, 4, 8] and curve["prompt_tokens"] == int(length)
        assert curve["seconds"] == sorted(curve["seconds"]) and curve["seconds"][0] > 0
    names = [(row["method"], row.get("run")) for row in saved["runs"]]
    ours = ["autoregressive", "lookahead W2 N3 G2", "prompt lookup", "draft (K=4)"]
    hf = [("hf generate", None), ("hf generate, torch's default attention", None)]
    assert names == hf + [(n, run) for run in (1, 2) for n in ours]
    for row in saved["runs"]:
        assert row["identical"] and row["new_tokens"] == 12
        assert row["ms_per_step"] > 0 and row["forward_ms"] > 0
    window = next(r for r in saved["runs"] if r["method"].startswith("lookahead"))
    assert window["mean_forward_tokens"] > 1  # the window runs at every step (token_cost 0)
    assert (out / "curve.png").stat().st_size > 0
    report = (out / "curve.md").read_text()
    # Re-rendered from the JSON alone, the report is the same.
    again = _run("--from-results", str(out / "results.json"), "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "curve.md").read_text() == report


def test_the_gpu_script_names_a_bad_shape() -> None:
    done = _run("--device", "cpu", "--preset", "tiny", "--shapes", "2x3")
    assert done.returncode == 2
    assert "--shape is 'auto' or WINDOWxNGRAMxGUESS" in done.stderr
