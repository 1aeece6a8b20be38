"""Tuned profiles (lookahead.profiles): how a decoding finds its shape."""


from __future__ import annotations

import json
from pathlib import Path

import lookahead
import pytest
import torch
from lookahead.request import make_decoder
from lookahead.cli.main import build_parser
from lookahead.cli.options import method_options
from lookahead.config import LookaheadConfig
from lookahead.profiles import (
    DEFAULT_SHAPE,
    load_profile,
    profile_path,
    resolve_shape,
    step_costs_of,
)
from tiny import tiny_llama


def test_a_broken_profile_falls_back_to_the_default(tmp_path: Path) -> None:
    path = profile_path("some-model", "bfloat16", cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"best": {"window": 0, "ngram": 5, "guess": 7}}')
    assert load_profile("some-model", "bf16", cache_dir=tmp_path) is None
    assert resolve_shape("some-model", "bf16", cache_dir=tmp_path) == dict(DEFAULT_SHAPE)
    assert profile_path("../a b/c", "fp32", cache_dir=tmp_path).parent == tmp_path / "profiles"


def test_window_auto_takes_the_tuned_shape_of_this_model(tiny, tmp_path, monkeypatch) -> None:
    # The default cache folder is under the home (or XDG) folder: point both at tmp_path.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    model, _ = lookahead.load_model(tiny["model"], dtype="float64")
    ids = torch.tensor([[5, 6, 7, 5, 6]])

    def shape(**options):
        config = make_decoder(model, ids, 4, "lookahead", **options).proposer.config
        return config.window, config.ngram, config.guess

    default = tuple(DEFAULT_SHAPE.values())
    assert shape(window="auto") == default  # no profile saved yet
    assert shape() == default
    path = profile_path(model.name_or_path, "float64")  # where `lookahead tune` saves it
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"best": {"window": 3, "ngram": 4, "guess": 6}}))
    assert shape(window="auto") == (3, 4, 6)
    assert shape(window="auto", guess=2) == (3, 4, 2)  # explicit parts are kept
    code = profile_path(model.name_or_path, "float64", workload="code")
    code.write_text(json.dumps({"best": {"window": 1, "ngram": 3, "guess": 2}}))
    assert shape(workload="code") == (1, 3, 2)  # a workload implies window="auto"
    assert shape(workload="chat") == (3, 4, 6)  # none saved for chat: the general profile
    with pytest.raises(ValueError, match="workload='code' chooses a tuned shape"):
        shape(window=2, workload="code")
    with pytest.raises(ValueError, match="workload must be a name"):
        shape(workload="no/slash")
    assert shape() == (3, 4, 6)  # no shape given: the tuned one
    assert shape(window=3) == (3, 5, 4)  # an int window keeps the shape as given
    path.write_text(json.dumps({"best": {"window": 3, "ngram": 4, "guess": 6},
                                "packed_weights": True}))
    assert shape() == default  # tuned on packed weights, and this model's are plain


def test_the_stats_name_the_profile_that_chose_the_shape(tiny, tmp_path, monkeypatch) -> None:
    # A call without a window reads a file outside the call: its stats must say which.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    model, _ = lookahead.load_model(tiny["model"], dtype="float64")
    ids = torch.tensor([[5, 6, 7, 5, 6]])

    def source(method="lookahead", **options):
        return lookahead.generate(model, ids, 3, method, **options).stats.shape_source

    measured = source()  # no profile: the default shape priced on this CPU's measured costs
    assert measured.startswith("measured: ") and Path(measured.split(": ", 1)[1]).is_file()
    assert source(window=2) == "given"
    assert source("prompt_lookup") is None
    path = profile_path(model.name_or_path, "float64")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"best": {"window": 3, "ngram": 4, "guess": 6}}))
    assert source() == str(path) == source(window="auto")
    assert lookahead.generate(model, ids, 3).stats.as_dict()["shape_source"] == str(path)


def test_cli_lookahead_without_a_window_asks_for_auto() -> None:
    args = build_parser().parse_args(["generate", "--model", "m", "hi"])
    assert method_options(args) == {"window": "auto"}
    args = build_parser().parse_args(["generate", "--model", "m", "--window", "auto",
                                      "--guess", "3", "hi"])
    assert method_options(args) == {"window": "auto", "guess": 3}
    args = build_parser().parse_args(["generate", "--model", "m", "--window", "3", "hi"])
    assert method_options(args) == {"window": 3}


def test_window_auto_brings_the_tuned_step_cap(tiny, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    model, _ = lookahead.load_model(tiny["model"], dtype="float64")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    path = profile_path(model.name_or_path, "float64")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"best": {"window": 2, "ngram": 3, "guess": 3,
                                         "max_step_tokens": 3}}))
    assert make_decoder(model, ids, 4, "lookahead").step_tokens == 3
    assert make_decoder(model, ids, 4, "lookahead", max_step_tokens=5).step_tokens == 5
    assert make_decoder(model, ids, 4, "lookahead", window=2).step_tokens is None
    result = lookahead.generate(model, ids, 24, "lookahead")
    assert max(result.stats.forward_tokens_per_step[1:]) <= 3
    expected = model.generate(ids, max_new_tokens=24, do_sample=False,
                              attention_mask=torch.ones_like(ids))
    assert torch.equal(result.sequences, expected[:, : result.sequences.shape[1]])


def test_a_cuda_model_gets_the_gpu_default_shape_untuned(tmp_path) -> None:
    """Untuned, a model on CUDA gets the paper's W15 N5 G15 with its window at every step (a
    GPU step's tokens come nearly free), a CPU model the CPU default; options given win."""
    from lookahead.request import resolve_auto_shape
    from lookahead.profiles import GPU_DEFAULT_SHAPE

    assert resolve_shape("m", "bfloat16", cache_dir=tmp_path, device="cuda") == dict(
        window=15, ngram=5, guess=15, token_cost=0.0)
    assert resolve_shape("m", "bfloat16", cache_dir=tmp_path) == dict(DEFAULT_SHAPE)

    class OnCuda(torch.nn.Module):  # what resolve_auto_shape reads of a model on a GPU
        name_or_path = "test-only/never-tuned-model"
        dtype = torch.bfloat16
        device = torch.device("cuda")

    assert resolve_auto_shape(OnCuda(), {}) == dict(GPU_DEFAULT_SHAPE)
    given = resolve_auto_shape(OnCuda(), dict(window="auto", guess=4, token_cost=0.5))
    assert given == dict(window=15, ngram=5, guess=4, token_cost=0.5)
    assert LookaheadConfig(**given).window == 15  # a valid config


def test_a_tuned_shape_brings_the_step_costs_of_its_curve(tmp_path: Path) -> None:
    """A profile's forward-cost curve becomes ``step_costs`` (relative to one token, linear
    between the measured sizes) where its best shape has a tuned token cost."""
    curve = {"tokens": [1, 2, 4, 8], "seconds": [0.02, 0.022, 0.03, 0.05]}
    assert step_costs_of(curve) == (1.0, 1.1, 1.3, 1.5, 1.75, 2.0, 2.25, 2.5)
    assert step_costs_of(curve, up_to=3) == (1.0, 1.1, 1.3)
    # A dip (noise) is levelled; a curve without one token, or of one size, gives none.
    assert step_costs_of({"tokens": [1, 2, 3], "seconds": [1.0, 1.2, 1.1]}) == (1.0, 1.2, 1.2)
    assert step_costs_of({"tokens": [2, 4], "seconds": [1.0, 1.2]}) is None
    assert step_costs_of({"tokens": [1], "seconds": [1.0]}) is None and step_costs_of(None) is None
    path = profile_path("some-model", "float32", cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    best = {"window": 2, "ngram": 4, "guess": 2, "token_cost": 0.2}
    path.write_text(json.dumps({"best": best, "curve": curve}))
    shape = resolve_shape("some-model", "float32", cache_dir=tmp_path)
    assert shape["step_costs"] == step_costs_of(curve) and shape["token_cost"] == 0.2
    assert LookaheadConfig(**shape).step_costs == step_costs_of(curve)
    path.write_text(json.dumps({"best": {**best, "token_cost": None}, "curve": curve}))
    assert "step_costs" not in resolve_shape("some-model", "float32", cache_dir=tmp_path)


@pytest.mark.parametrize("costs", [(), (1.1, 1.2), (1.0, 0.9), (1.0, float("nan")), "1.0",
                                   (1.0, True), 1.0])
def test_step_costs_must_start_at_one_and_never_fall(costs) -> None:
    with pytest.raises(ValueError, match="step_costs must be a non-empty list of numbers"):
        LookaheadConfig(step_costs=costs)


def _cache_in(tmp_path: Path, monkeypatch) -> Path:
    """Point the user cache at ``tmp_path`` (the default cache folder is under the home or
    XDG folder); the cache root."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    from lookahead.models.registry import default_cache_dir

    return default_cache_dir()


def _passes(model) -> list[int]:
    """A counter of ``model``'s forward passes from now on (a forward pre-hook; ``model`` is
    the test's own)."""
    counter = [0]
    model.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    return counter


def test_a_tuned_profile_wins_over_the_measured_costs(tmp_path) -> None:
    from lookahead.request import auto_shape

    model = tiny_llama(64, eos=None).to(torch.float64)
    shape, source = auto_shape(model, {}, tmp_path)  # no profile: measured here, once
    assert source.startswith("measured: ") and "step_costs" in shape
    path = profile_path(model.name_or_path, model.dtype, cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"best": {"window": 3, "ngram": 4, "guess": 6}}))
    passes = _passes(model)
    shape, source = auto_shape(model, {}, tmp_path)
    assert source == str(path) and shape == {"window": 3, "ngram": 4, "guess": 6}
    assert passes[0] == 0


def test_a_given_window_measures_nothing(tmp_path) -> None:
    from lookahead.request import auto_shape

    model = tiny_llama(64, eos=None).to(torch.float64)
    passes = _passes(model)
    options, source = auto_shape(model, {"window": 2, "guess": 3}, tmp_path)
    assert (options, source) == ({"window": 2, "guess": 3}, "given")
    assert passes[0] == 0 and not (tmp_path / "step_costs").exists()


def test_greedy_output_is_unchanged_on_the_measured_costs_and_cap(tiny, tmp_path,
                                                                   monkeypatch) -> None:
    """A cached curve that rises steeply past 3 tokens caps the steps at 3; the text is
    ``model.generate``'s, as on the curve measured here."""
    cache = _cache_in(tmp_path, monkeypatch)
    model, _ = lookahead.load_model(tiny["model"], dtype="float64")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    expected = model.generate(ids, max_new_tokens=30, do_sample=False,
                              attention_mask=torch.ones_like(ids))
    measured = lookahead.generate(model, ids, 30, "lookahead")
    source = measured.stats.shape_source
    assert source.startswith(f"measured: {cache / 'step_costs'}")
    assert torch.equal(measured.sequences, expected[:, : measured.sequences.shape[1]])
    curve_file = Path(source.split(": ", 1)[1])
    record = json.loads(curve_file.read_text())
    record["curve"]["seconds"] = [1.0, 1.1, 1.2, 3.5, 5.5, 7.5, 11.5, 15.5]  # 1-16 tokens
    curve_file.write_text(json.dumps(record))
    assert make_decoder(model, ids, 30, "lookahead").step_tokens == 3
    config = make_decoder(model, ids, 30, "lookahead").proposer.config
    assert config.step_costs == step_costs_of(record["curve"])
    capped = lookahead.generate(model, ids, 30, "lookahead")
    assert max(capped.stats.forward_tokens_per_step[1:]) <= 3
    assert torch.equal(capped.sequences, expected[:, : capped.sequences.shape[1]])


def test_bench_prices_an_untuned_lookahead_on_the_measured_costs(tiny, tmp_path) -> None:
    """``lookahead bench`` without --shape runs lookahead as a call without a window does:
    untuned, on this CPU's measured costs; a shape given or a tuned profile, as before."""
    from lookahead.bench.runner import _priced
    from lookahead.cli.bench import config_from_args
    from lookahead.step_costs import measured_shape

    def parse(*extra):
        argv = ["bench", "--model", str(tiny["model"]), "--dtype", "float64", "--cache-dir",
                str(tmp_path), "--methods", "lookahead", *extra]
        return config_from_args(build_parser().parse_args(argv))

    assert parse().options.measured_step_costs
    assert not parse("--shape", "2x5x4").options.measured_step_costs
    assert not parse("--window", "2").options.measured_step_costs
    model, _ = lookahead.load_model(tiny["model"], dtype="float64")
    priced = _priced(parse(), model)
    shape, _ = measured_shape(model, tmp_path)
    assert priced.options.lookahead.step_costs == shape["step_costs"]
    assert priced.options.lookahead.token_cost == shape["token_cost"]
    assert priced.options.lookahead_step_tokens == shape.get("max_step_tokens")
    assert _priced(parse("--shape", "2x5x4"), model).options.lookahead.step_costs is None
    path = profile_path(str(tiny["model"]), "float64", cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"best": {"window": 3, "ngram": 4, "guess": 6}}))
    assert not parse().options.measured_step_costs
