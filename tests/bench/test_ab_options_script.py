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


def test_a_prefetch_hint_reaches_the_kernel_calls_and_is_undone(tmp_path):
    from gguf import GGMLQuantizationType as Q
    from tiny_gguf import write_tiny_gguf

    import lookahead
    from lookahead.kernels.quant_linear import QuantLinear
    from lookahead.kernels.row_ops import GatedMLP

    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", (Q.Q4_1, Q.Q8_0), hidden=64)
    model, _ = lookahead.load_model(path, cache_dir=tmp_path)
    if not any(m.isa for m in model.modules() if isinstance(m, QuantLinear)):
        pytest.skip("the quantized kernel does not run here")
    model.generation_config.eos_token_id = None
    ab = runpy.run_path(str(SCRIPT))
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    before = layers[0].nontemporal
    ids = torch.tensor([[256, 3, 70, 71, 72, 3, 70, 71, 72]])
    plain = generate(model, ids, max_new_tokens=10, method="autoregressive")
    for hint in (True, False):
        with ab["prefetch_hint"](model, hint):
            assert all(layer.nontemporal is hint for layer in layers)
            # the fused MLPs call the kernel with the hint (their bound calls' 8th argument)
            assert all(args[7] is hint for mlp in mlps for _, args in mlp._calls[1:])
            result = generate(model, ids, max_new_tokens=10, method="lookahead")
        assert torch.equal(result.new_tokens, plain.new_tokens)
        assert all(layer.nontemporal is before for layer in layers)
        assert all(args[7] is before for mlp in mlps for _, args in mlp._calls[1:])
    # the far and near prefetch distances reach the kernel calls too, and are undone
    with ab["prefetch_hint"](model, None, 4096, 512):
        assert {(layer.ahead, layer.near) for layer in layers} == {(4096, 512)}
        assert all(args[6:] == (4096, before, 512) for mlp in mlps for _, args in mlp._calls[1:])
        result = generate(model, ids, max_new_tokens=10, method="lookahead")
    assert torch.equal(result.new_tokens, plain.new_tokens)
    assert all(layer.near == 0 for layer in layers)


def test_a_prefetch_hint_on_a_model_without_the_quantized_kernel_is_refused(tiny_lm):
    ab = runpy.run_path(str(SCRIPT))
    with pytest.raises(SystemExit, match="nontemporal: expected a model on the quantized"):
        with ab["prefetch_hint"](tiny_lm("llama"), False):
            pass


def test_a_prefetch_hint_that_is_not_true_or_false_is_refused(tiny_lm):
    ab = runpy.run_path(str(SCRIPT))
    with pytest.raises(SystemExit, match="nontemporal: expected true or false, got 'yes'"):
        with ab["prefetch_hint"](tiny_lm("llama"), "yes"):
            pass


def test_an_explore_variant_reaches_the_step_clock_and_is_undone():
    import lookahead.proposers.gauges as gauges

    ab = runpy.run_path(str(SCRIPT))
    current = gauges.StepClock
    with ab["exploring"](5):
        clock = gauges.DepthGauge(0.1, step_costs=(1.0, 1.2, 1.5)).clock
        assert clock.explore == 5
    assert gauges.StepClock is current
    assert gauges.DepthGauge(0.1, step_costs=(1.0, 1.2)).clock.explore == 2
    with pytest.raises(SystemExit, match="explore: expected sizes >= 0, got -1"):
        with ab["exploring"](-1):
            pass
