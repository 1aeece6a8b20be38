"""benchmarks/ab_options.py runs the lookahead proposer of an earlier revision beside the
current one: the swap must reach ``generate`` and be undone after it."""

from __future__ import annotations

import runpy
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import lookahead.proposers.lookahead as lookahead_proposer
from lookahead import generate

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ab_options.py"


def _in_git() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_a_revisions_proposer_decodes_while_swapped_in_and_is_swapped_out(tiny_lm):
    ab = runpy.run_path(str(SCRIPT))  # the script's globals; not run as __main__
    current = lookahead_proposer.LookaheadProposer
    then = ab["proposer_at"]("HEAD")
    assert then is not current and then.__module__.startswith("lookahead_at_")
    model = tiny_lm("llama")
    ids = torch.tensor([[3, 5, 7, 3, 5, 7, 3, 5]])
    plain = generate(model, ids, max_new_tokens=12, method="autoregressive")
    built = []
    original_build = then.build.__func__

    def recording_build(cls, config, inputs):
        built.append(cls)
        return original_build(cls, config, inputs)

    then.build = classmethod(recording_build)
    with ab["proposer"](then):
        assert lookahead_proposer.LookaheadProposer is then
        result = generate(model, ids, max_new_tokens=12, method="lookahead")
    assert lookahead_proposer.LookaheadProposer is current
    assert built == [then]  # the revision's proposer decoded, exactly
    assert torch.equal(result.new_tokens, plain.new_tokens)
