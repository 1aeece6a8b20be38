"""The step costs a CPU call measures once, without a tuned profile (lookahead.step_costs)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from lookahead.kernels.quant_linear import cpu_label, cpu_name, cpuinfo_field
from lookahead.profiles import step_costs_of
from lookahead.step_costs import (
    MEASURED_TOKENS,
    curve_path,
    measure_curve,
    measured_curve,
    measured_shape,
    step_cap_of,
)
from tiny import tiny_llama

# The measurement itself: the real timed passes, not the tests' steady curve (conftest.py).
pytestmark = pytest.mark.timed_step_costs


class PassCounter:
    """Counts ``model``'s forward passes (a forward pre-hook) while in a ``with`` block."""

    def __init__(self, model) -> None:
        self.model, self.passes = model, 0

    def __enter__(self) -> PassCounter:
        self.handle = self.model.register_forward_pre_hook(self._count)
        return self

    def _count(self, *_) -> None:
        self.passes += 1

    def __exit__(self, *_) -> None:
        self.handle.remove()


@pytest.fixture(scope="module")
def model():
    return tiny_llama(64, eos=None, max_positions=128).to(torch.float64)


def test_the_curve_is_measured_once_then_read_from_the_cache(model, tmp_path) -> None:
    with PassCounter(model) as first:
        curve, path = measured_curve(model, tmp_path, cpu="Test CPU 9000", threads=2)
    # A prefill, then a warm-up round and at least one timed round of every size.
    assert first.passes >= 1 + 2 * len(MEASURED_TOKENS)
    assert curve["tokens"] == list(MEASURED_TOKENS) and path.is_file()
    assert path.parent == tmp_path / "step_costs"
    assert curve["prompt_tokens"] == 128 - max(MEASURED_TOKENS) - 1  # fits the context
    with PassCounter(model) as second:
        again, same = measured_curve(model, tmp_path, cpu="Test CPU 9000", threads=2)
    assert second.passes == 0 and again == curve and same == path
    # Never more than k passes of one, never less than one.
    costs = step_costs_of(curve)
    assert all(1.0 <= cost <= k + 1e-9 for k, cost in enumerate(costs, start=1))


def test_the_cache_is_kept_per_cpu_and_thread_count(model, tmp_path) -> None:
    paths = {curve_path("m", torch.float32, "cpu", None, cpu, threads, tmp_path)
             for cpu in ("AMD EPYC 9R14", "Intel(R) Xeon(R) Platinum 8488C") for threads in (2, 8)}
    assert len(paths) == 4
    assert all(" " not in p.name and "(" not in p.name for p in paths)
    measured_curve(model, tmp_path, cpu="CPU A", threads=2)
    for cpu, threads in (("CPU B", 2), ("CPU A", 4)):
        with PassCounter(model) as counter:
            _, path = measured_curve(model, tmp_path, cpu=cpu, threads=threads)
        assert counter.passes > 0, (cpu, threads)
        assert f"{threads}t" in path.name
    assert len(list((tmp_path / "step_costs").glob("*.json"))) == 3
    assert isinstance(cpu_name(), str) and cpu_name()


def test_cpus_of_one_name_but_other_models_keep_their_own_curves(tmp_path) -> None:
    name = "Intel(R) Xeon(R) Processor"
    labels = [cpu_label(name, "6", "167"), cpu_label(name, "6", "207")]
    assert labels == [f"{name} (family 6, model 167)", f"{name} (family 6, model 207)"]
    assert len({curve_path("m", torch.float32, "cpu", None, label, 2, tmp_path)
                for label in labels}) == 2
    assert cpu_label(name) == name and cpu_label(name, model="17") == f"{name} (model 17)"
    family, model = cpuinfo_field("cpu family"), cpuinfo_field("model")
    assert cpu_name().endswith(f"(family {family}, model {model})" if family and model
                               else "")


def test_a_corrupt_cache_file_is_measured_again_with_a_warning(model, tmp_path, caplog) -> None:
    _, path = measured_curve(model, tmp_path, cpu="CPU A", threads=2)
    nan = {"curve": {"tokens": [1, 2], "seconds": [1.0, float("nan")]}}
    for broken in ("{not json", json.dumps({"curve": {"tokens": [2, 4], "seconds": [1, 2]}}),
                   json.dumps(nan)):
        path.write_text(broken)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lookahead.step_costs"), \
                PassCounter(model) as counter:
            curve, again = measured_curve(model, tmp_path, cpu="CPU A", threads=2)
        assert counter.passes > 0 and again == path
        assert "cannot be read" in caplog.text and str(path) in caplog.text
        assert json.loads(path.read_text())["curve"] == curve  # rewritten whole


def test_another_model_of_the_same_name_is_measured_again(tmp_path) -> None:
    small, wider = tiny_llama(64, eos=None), tiny_llama(80, eos=None)
    small.name_or_path = wider.name_or_path = "same-name"
    measured_curve(small, tmp_path, cpu="CPU A", threads=2)
    with PassCounter(wider) as counter:
        measured_curve(wider, tmp_path, cpu="CPU A", threads=2)
    assert counter.passes > 0


def test_the_measured_shape_is_the_default_priced_on_the_curve(model, tmp_path) -> None:
    curve, path = measured_curve(model, tmp_path, cpu="CPU A", threads=2)
    shape, source = measured_shape(model, tmp_path, cpu="CPU A", threads=2)
    assert source == f"measured: {path}"
    assert (shape["window"], shape["ngram"], shape["guess"]) == (2, 5, 4)
    assert shape["step_costs"] == step_costs_of(curve)
    assert 0.0 <= shape["token_cost"] <= 1.0
    assert shape.get("max_step_tokens") == step_cap_of(shape["step_costs"])


@pytest.mark.parametrize(("costs", "cap"), [
    ((1.0, 1.05, 1.1, 1.2, 1.3, 1.4), None),  # the cost per token falls to the end
    ((1.0, 1.1, 1.2, 1.3, 2.5, 3.6, 4.2), 4),  # past 4 tokens a step costs more per token
    ((1.0, 1.1, 1.2, 1.3, 2.0, 2.0, 2.0), None),  # one noisy size (5) does not cap at 4
    ((1.0, 1.1, 1.2, 3.0, 3.0, 3.0, 3.0), 3),
    ((1.0, 2.0, 3.0, 4.0), 1),  # every token costs a whole pass: no step pays
    ((1.0, 1.9, 2.9, 3.9), 2),
    ((1.0,), None),
])
def test_the_step_cap_is_where_the_cost_per_token_is_least(costs, cap) -> None:
    assert step_cap_of(costs) == cap


def test_a_short_context_measures_after_fewer_tokens() -> None:
    short = tiny_llama(64, eos=None, max_positions=24).to(torch.float64)
    curve = measure_curve(short, repeats=1)
    assert curve["prompt_tokens"] == 24 - max(MEASURED_TOKENS) - 1
    assert curve["tokens"] == list(MEASURED_TOKENS) and len(curve["seconds"]) == 8


def test_a_model_that_cannot_be_timed_gets_the_default_shape(tmp_path, caplog) -> None:
    from lookahead.request import auto_shape

    model = tiny_llama(64, eos=None).to(torch.float64)

    def refuse(*_):
        raise RuntimeError("no forward here")

    model.register_forward_pre_hook(refuse)
    with caplog.at_level(logging.WARNING, logger="lookahead.request"):
        shape, source = auto_shape(model, {}, tmp_path)
    assert source == "default" and shape == {"window": 2, "ngram": 5, "guess": 4}
    assert "could not measure the step costs" in caplog.text
