"""Tests of the benchmark harness and the shape tuner on a tiny random-weight model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tiny import save_tiny_model

import lookahead
from lookahead.api import make_decoder

from lookahead.cli.bench import config_from_args
from lookahead.bench.methods import METHODS, _our_options
from lookahead.bench.report import markdown_table, summarise
from lookahead.bench.runner import BenchConfig
from lookahead.bench.tune import TuneConfig
from lookahead.bench.shape_search import choose_shape, scaled_costs, versus_default
from lookahead.bench.cost_curve import (
    cost_at,
    fastest_curve,
    monotone,
    predict,
    reprice,
    step_overhead_of,
    token_cost_of,
)
from lookahead.profiles import (
    DEFAULT_SHAPE,
    SHAPE_KEYS,
    load_profile,
    profile_path,
    resolve_shape,
    saved_profile_path,
)
from lookahead.cli.main import build_parser, main
from lookahead.config import LookaheadConfig
from lookahead.cli.options import method_options
from lookahead.argtypes import UsageError

# A small vocabulary makes a random model repeat itself, so proposers get accepted.
WORDS = ["<unk>", "<s>", "</s>", "def", "f", "(", ")", ":", "return", "x", "+", "1", "a", "b"]
PROMPTS = [
    {"id": "p0", "prompt": "def f ( x ) : return x + 1 def f ( x ) :", "chat": False},
    {"id": "p1", "prompt": "a b a b a b return a + b", "chat": False},
    {"id": "p2", "prompt": "x + 1", "chat": False},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny Llama with a word-level tokenizer, a JSONL prompt file, a cache folder."""
    root = tmp_path_factory.mktemp("bench")
    save_tiny_model(root / "model", WORDS, max_positions=256)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return dict(model=root / "model", prompts=prompts, cache=root / "cache", out=root / "out")


def _bench_argv(tiny, *extra: str) -> list[str]:
    model = str(tiny["model"])
    return [
        "bench", "--model", model, "--draft-model", model, "--dataset", str(tiny["prompts"]),
        "--limit", "2", "--max-new-tokens", "16", "--dtype", "float64",
        "--baseline-dtypes", "float32,float64", "--cache-dir", str(tiny["cache"]), *extra,
    ]  # fmt: skip


def _tune_argv(tiny, cache: Path, *extra: str) -> list[str]:
    """``lookahead tune`` on the tiny model in float64, its profile saved under ``cache``."""
    return ["tune", "--model", str(tiny["model"]), "--dtype", "float64",
            "--dataset", str(tiny["prompts"]), "--cache-dir", str(cache), *extra]


def test_bench_runs_every_method_and_writes_results(tiny, capsys) -> None:
    out = tiny["out"]
    assert main(_bench_argv(tiny, "--out", str(out), "--shape", "3x3x3")) == 0
    table = capsys.readouterr().out
    assert "| lookahead | float64 |" in table and "| hf | float32 |" in table

    results = json.loads((out / "results.json").read_text())
    assert results["config"]["methods"] == list(METHODS)
    assert results["config"]["options"]["lookahead"]["window"] == 3
    rows = {(r["method"], r["dtype"]): r for r in results["summary"]["prompts"]}
    assert set(rows) == {(m, "float64") for m in METHODS} | {("hf", "float32")}
    for (method, dtype), row in rows.items():
        assert row["prompts"] == 2
        assert row["new_tokens"] > 0 and row["tokens_per_second"] > 0
        assert row["steps"] >= 1 and row["time_to_first_token"] > 0
        assert row["speedup"] == pytest.approx(
            row["tokens_per_second"] / rows[("hf", dtype)]["tokens_per_second"]
        )
        fastest = max(rows[("hf", d)]["tokens_per_second"] for d in ("float32", "float64"))
        assert row["speedup_vs_best_baseline"] == pytest.approx(row["tokens_per_second"] / fastest)
        if method == "hf":
            assert row["identical"] is None  # the baseline itself
        else:
            assert row["identical"] == 2, method  # greedy in float64: exact
    for method in ("lookahead", "prompt_lookup", "draft"):
        row = rows[(method, "float64")]
        assert row["mean_accepted"] is not None and row["mean_forward_tokens"] > 1
        assert all(0 <= rate <= 1 for rate in row["acceptance_per_position"])
    assert rows[("autoregressive", "float64")]["tokens_per_step"] == 1.0
    assert rows[("lookahead", "float64")]["tokens_per_step"] > 1.0

    runs = results["runs"]
    assert len(runs) == 2 * (len(METHODS) + 1)
    assert {r["prompt"] for r in runs} == {"p0", "p1"}
    for name in ("speedups.png", "tokens_per_step.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "results.md").read_text().startswith("model ")


def test_bench_runs_float32_packed_when_asked_and_checks_it_against_plain(tiny, capsys) -> None:
    out = tiny["out"] / "float32-packed"
    argv = _bench_argv(tiny, "--dtype", "float32", "--baseline-dtypes", "float32", "--methods",
                       "hf,lookahead", "--packed-weights", "--no-plots", "--out", str(out))
    assert main(argv) == 0
    rows = {(r["method"], r["dtype"]): r
            for r in json.loads((out / "results.json").read_text())["summary"]["prompts"]}
    assert set(rows) == {("hf", "float32+packed"), ("hf", "float32"),
                         ("lookahead", "float32+packed")}
    assert rows[("hf", "float32")]["identical"] is None  # the plain baseline
    assert rows[("hf", "float32+packed")]["identical"] == 2  # against the plain weights
    assert rows[("lookahead", "float32+packed")]["identical"] == 2  # against packed HF


def test_bench_caps_our_steps_and_says_so(tiny, capsys) -> None:
    out = tiny["out"] / "capped"
    argv = _bench_argv(tiny, "--methods", "hf,lookahead,prompt_lookup", "--limit", "2",
                       "--shape", "3x3x3", "--max-step-tokens", "3", "--no-plots",
                       "--out", str(out))
    assert main(argv) == 0
    assert ", at most 3 tokens a step" in " ".join(capsys.readouterr().err.split())
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["options"]["max_step_tokens"] == 3
    assert ", at most 3 tokens a step" in (out / "results.md").read_text()
    ours = [run for run in results["runs"] if run["method"] in ("lookahead", "prompt_lookup")]
    fed = [max(run["stats"]["forward_tokens_per_step"][1:], default=0) for run in ours]
    assert ours and max(fed) == 3, fed  # the prefill aside, steps fed up to 3 and no more
    assert all(run["tokens"] == results["runs"][0]["tokens"] for run in results["runs"]
               if run["prompt"] == results["runs"][0]["prompt"])  # float64: the same text


def test_bench_header_names_the_shape_only_when_lookahead_runs(tiny, capsys) -> None:
    for methods, shown in [("hf,lookahead", True), ("hf,prompt_lookup", False)]:
        argv = _bench_argv(tiny, "--methods", methods, "--limit", "1", "--shape", "3x3x3",
                           "--no-plots", "--out", str(tiny["out"] / methods))
        assert main(argv) == 0
        header = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
        assert ("lookahead W=3 N=3 G=3" in header) is shown, methods


def test_tune_writes_a_profile_that_shape_auto_reads(tiny, capsys) -> None:
    cache, model = tiny["cache"], str(tiny["model"])
    assert resolve_shape(model, "float64", cache_dir=cache) == dict(DEFAULT_SHAPE)
    argv = [
        "tune", "--model", model, "--dtype", "float64", "--dataset", str(tiny["prompts"]),
        "--limit", "2", "--max-new-tokens", "12", "--tokens", "1,2,4,8", "--repeats", "2",
        "--shapes", "2x2x2,3x3x3", "--cache-dir", str(cache),
    ]  # fmt: skip
    assert main(argv) == 0
    assert f"| predicted tok/s {tiny['prompts']} |" in capsys.readouterr().out

    path = profile_path(model, "float64", cache_dir=cache)
    assert path.name.endswith("-float64-cpu.json")
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    profile = load_profile(model, "fp64", cache_dir=cache)
    assert profile is not None
    assert profile["curve"]["tokens"] == [1, 2, 4, 8]
    assert all(s > 0 for s in profile["curve"]["seconds"])
    assert [(s["window"], s["ngram"], s["guess"]) for s in profile["shapes"]] == [
        (2, 2, 2),
        (3, 3, 3),
    ]
    # The sample is spread over the file's 3 prompts: the middle of the first and second half.
    assert profile["sample"] == "spread"
    assert profile["prompt_ids"] == {str(tiny["prompts"]): ["p0", "p2"]}
    for shape in profile["shapes"]:  # one data set here: its prediction is the whole one
        assert [len(rates) for rates in shape["predicted_per_prompt"].values()] == [2]
        per_set = shape["predicted_per_dataset"]
        assert list(per_set) == [str(tiny["prompts"])]
        assert per_set[str(tiny["prompts"])] == pytest.approx(shape["predicted_tokens_per_second"])
    best = max(profile["shapes"], key=lambda s: s["predicted_tokens_per_second"])
    # The lookup length left out of a shape: the default's; the window's price: this curve's.
    # The shapes ran at the token cost of the curve measured before them.
    first = profile["curves_measured"][0]
    assert profile["token_cost"] == pytest.approx(token_cost_of(first), abs=1e-4)
    expected = dict(window=best["window"], ngram=best["ngram"], guess=best["guess"],
                    lookup_tokens=8, token_cost=profile["token_cost"])
    assert profile["best"] == expected
    assert resolve_shape(model, "float64", cache_dir=cache) == expected

    # --shape auto resolves through the profile; --guess overrides one part of it.
    args = build_parser().parse_args(_bench_argv(tiny, "--shape", "auto", "--guess", "9"))
    lookahead = config_from_args(args).options.lookahead
    assert (lookahead.window, lookahead.ngram, lookahead.guess) == (
        expected["window"], expected["ngram"], 9
    )  # fmt: skip


def test_the_tuner_must_beat_the_default_as_shipped(tiny, capsys) -> None:
    """With the default shape among the shapes, the tuner also runs it at the shipped token
    cost: that row is the default every other must beat, the same shape at this curve's cost
    included, and keeping it keeps the shipped cost."""
    cache, model = tiny["cache"] / "shipped", str(tiny["model"])
    argv = [
        "tune", "--model", model, "--dtype", "float64", "--dataset", str(tiny["prompts"]),
        "--limit", "1", "--max-new-tokens", "8", "--tokens", "1,8", "--repeats", "1",
        "--shapes", "2x5x4,1x2x2", "--margin", "0.99", "--cache-dir", str(cache),
        "--cost-scales", "1,0.5",
    ]  # fmt: skip
    assert main(argv) == 0
    assert "| 2 | 5 | 4 | 8 | 0.025 |" in capsys.readouterr().out  # the k column
    profile = load_profile(model, "float64", cache_dir=cache)
    cost = profile["token_cost"]
    assert cost != LookaheadConfig().token_cost and profile["cost_scales"] == [1.0, 0.5]
    # Each shape at each scale of the curve's cost (one, if the tiny model's curve is flat),
    # cheapest first; the default shape also as shipped.
    costs = scaled_costs(cost, (1.0, 0.5))
    rows = [(row["window"], row.get("token_cost")) for row in profile["shapes"]]
    assert rows == [(2, None)] + [(2, c) for c in costs] + [(1, c) for c in costs]
    # No shape leads by 99 %: the default as shipped is kept, at the shipped cost.
    assert profile["best"] == dict(DEFAULT_SHAPE, lookup_tokens=8)
    assert LookaheadConfig(**resolve_shape(model, "float64", cache_dir=cache)) == LookaheadConfig()
    # The default shape at another cost is not the default: it must lead like any other.
    shipped = dict(DEFAULT_SHAPE, predicted_tokens_per_second=40.0)
    priced = dict(DEFAULT_SHAPE, token_cost=0.06, predicted_tokens_per_second=41.0)
    assert choose_shape([shipped, priced], margin=0.03) is shipped
    assert choose_shape([shipped, priced], margin=0.0) is priced
    assert scaled_costs(0.1, (1, 1.6, 0.5, 20)) == [0.05, 0.1, 0.16, 1.0]
    assert scaled_costs(0.0, (1, 2)) == [0.0]
    with pytest.raises(SystemExit):
        main([*argv, "--cost-scales", "1,-1"])
    assert "argument --cost-scales: must be in [0.0, 10.0], got -1.0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cost_scales must list numbers in"):
        TuneConfig(cost_scales=())


def test_a_workload_profile_is_its_own_and_falls_back_to_the_general_one(tiny, capsys) -> None:
    cache, model = tiny["cache"] / "workload", str(tiny["model"])
    general = profile_path(model, "float64", cache_dir=cache)
    general.parent.mkdir(parents=True)
    general.write_text(json.dumps({"best": {"window": 3, "ngram": 4, "guess": 6}}))
    # No "code" profile yet: --workload code falls back to the general one.
    assert resolve_shape(model, "float64", cache_dir=cache, workload="code") == dict(
        window=3, ngram=4, guess=6
    )
    argv = [
        "tune", "--model", model, "--dtype", "float64", "--dataset", str(tiny["prompts"]),
        "--limit", "1", "--max-new-tokens", "8", "--tokens", "1,4", "--repeats", "1",
        "--shapes", "1x2x2", "--cache-dir", str(cache), "--workload", "code",
    ]  # fmt: skip
    assert main(argv) == 0
    assert ", workload code" in capsys.readouterr().out
    path = profile_path(model, "float64", cache_dir=cache, workload="code")
    assert path.name.endswith("-float64-cpu-code.json") and path.is_file()
    assert load_profile(model, "float64", cache_dir=cache, workload="code")["workload"] == "code"
    # The tuned "code" shape for --workload code; the general profile is untouched.
    code = load_profile(model, "float64", cache_dir=cache, workload="code")
    assert resolve_shape(model, "float64", cache_dir=cache, workload="code") == dict(
        window=1, ngram=2, guess=2, lookup_tokens=8, token_cost=code["token_cost"]
    )
    assert resolve_shape(model, "float64", cache_dir=cache) == dict(window=3, ngram=4, guess=6)
    argv = _bench_argv(tiny, "--workload", "code")
    argv[argv.index("--cache-dir") + 1] = str(cache)
    shape = config_from_args(build_parser().parse_args(argv)).options.lookahead
    assert (shape.window, shape.ngram, shape.guess) == (1, 2, 2)


def test_a_bad_workload_is_refused_naming_it(tiny, capsys) -> None:
    with pytest.raises(ValueError, match="workload must be a name"):
        profile_path("m", "float64", workload="../etc")
    with pytest.raises(ValueError, match="workload must be a name"):
        TuneConfig(workload="a b")
    for argv in (["tune", "--workload", "a/b"], ["generate", "--workload", "", "hi"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert "argument --workload: workload must be a name" in capsys.readouterr().err
    # A workload chooses a tuned shape: it cannot go with a shape given outright.
    assert main(_bench_argv(tiny, "--shape", "2x3x4", "--workload", "code")) == 2
    assert "--workload chooses a tuned shape" in capsys.readouterr().err
    args = build_parser().parse_args(["generate", "--model", "m", "--window", "3",
                                      "--workload", "code", "hi"])
    with pytest.raises(UsageError, match="cannot go with --window 3") as info:
        method_options(args)
    assert info.value.option == "--workload"
    args = build_parser().parse_args(["generate", "--model", "m", "--workload", "code", "hi"])
    assert method_options(args) == {"workload": "code", "window": "auto"}
    args = build_parser().parse_args(["generate", "--model", "m", "--method", "prompt_lookup",
                                      "--workload", "code", "hi"])
    with pytest.raises(UsageError, match="applies to --method lookahead"):
        method_options(args)


def test_a_profile_measured_on_weights_packed_otherwise_is_passed_over(tiny) -> None:
    """Packing changes what a pass costs, so a shape tuned on packed float32 is not taken for
    plain float32, nor the other way round; a profile that does not say is taken for either."""
    cache, model = tiny["cache"] / "packing", str(tiny["model"])
    path = profile_path(model, "float32", cache_dir=cache)
    path.parent.mkdir(parents=True)
    tuned = dict(window=1, ngram=3, guess=2)
    for recorded in (True, False, None):
        profile = {"best": tuned} | ({} if recorded is None else {"packed_weights": recorded})
        path.write_text(json.dumps(profile))
        for packed in (True, False, None):
            alike = recorded is None or packed is None or packed == recorded
            expected = tuned if alike else dict(DEFAULT_SHAPE)
            assert resolve_shape(model, "float32", cache_dir=cache, packed=packed) == expected
    # bench --shape auto asks with the packing it will run: float32 plain unless told to pack.
    path.write_text(json.dumps({"best": tuned, "packed_weights": True}))
    for flag, expected in (("--packed-weights", tuned), ("--no-packed-weights", DEFAULT_SHAPE),
                           (None, DEFAULT_SHAPE)):
        argv = _bench_argv(tiny, "--dtype", "float32", "--baseline-dtypes", "float32")
        argv[argv.index("--cache-dir") + 1] = str(cache)
        shape = config_from_args(build_parser().parse_args(argv + [flag] * bool(flag)))
        lookahead_shape = shape.options.lookahead
        assert (lookahead_shape.window, lookahead_shape.ngram, lookahead_shape.guess) == (
            expected["window"], expected["ngram"], expected["guess"]), flag


def test_packed_and_plain_weights_keep_a_profile_each(tiny) -> None:
    """Tuning packed weights, then plain ones, keeps both shapes: each is saved under its own
    name and read for its own packing; a profile of unknown packing reads the plain one."""
    cache, model = tiny["cache"] / "profile-each", str(tiny["model"])
    shapes = {True: dict(window=1, ngram=3, guess=2), False: dict(window=3, ngram=4, guess=5)}
    for packed, best in shapes.items():
        saved_path = saved_profile_path(
            {"model": model, "dtype": "float32", "device": "cpu", "packed_weights": packed}, cache)
        assert saved_path == profile_path(model, "float32", cache_dir=cache, packed=packed)
        saved_path.parent.mkdir(parents=True, exist_ok=True)
        saved_path.write_text(json.dumps({"best": best, "packed_weights": packed}))
    assert profile_path(model, "float32", cache_dir=cache, packed=True).name.endswith(
        "-float32-packed-cpu.json")
    for packed, best in shapes.items():
        assert resolve_shape(model, "float32", cache_dir=cache, packed=packed) == best
    assert resolve_shape(model, "float32", cache_dir=cache) == shapes[False]
    # Packed only: a caller who does not know the packing still gets a tuned shape.
    profile_path(model, "float32", cache_dir=cache).unlink()
    assert resolve_shape(model, "float32", cache_dir=cache) == shapes[True]
    assert resolve_shape(model, "float32", cache_dir=cache, packed=False) == dict(DEFAULT_SHAPE)


def test_a_broken_profile_falls_back_to_the_default(tmp_path: Path) -> None:
    path = profile_path("some-model", "bfloat16", cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"best": {"window": 0, "ngram": 5, "guess": 7}}')
    assert load_profile("some-model", "bf16", cache_dir=tmp_path) is None
    assert resolve_shape("some-model", "bf16", cache_dir=tmp_path) == dict(DEFAULT_SHAPE)
    assert profile_path("../a b/c", "fp32", cache_dir=tmp_path).parent == tmp_path / "profiles"


def test_cost_curve_interpolates_and_extends() -> None:
    curve = dict(tokens=[1, 4, 8], seconds=[0.010, 0.010, 0.018])
    assert cost_at(curve, 1) == pytest.approx(0.010)
    assert cost_at(curve, 6) == pytest.approx(0.014)
    assert cost_at(curve, 16) == pytest.approx(0.034)  # along the last segment
    assert cost_at(dict(tokens=[2], seconds=[0.02]), 4) == pytest.approx(0.04)


def test_token_cost_is_the_curves_slope_over_one_token() -> None:
    tokens = [1, 4, 8, 16, 32, 64]
    seconds = [0.040 + 0.001 * (k - 1) for k in tokens[:-1]] + [0.5]  # 64: beyond a step's size
    assert token_cost_of(dict(tokens=tokens, seconds=seconds)) == pytest.approx(0.025)
    assert token_cost_of(dict(tokens=[1, 8, 16], seconds=[0.01] * 3)) == 0.0  # free tokens
    assert token_cost_of(dict(tokens=[1, 2], seconds=[0.01, 0.05])) == 1.0  # at most 1
    assert token_cost_of(dict(tokens=[1], seconds=[0.01])) == LookaheadConfig().token_cost


def test_cost_curve_is_made_non_decreasing() -> None:
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    # 16 tokens timed cheaper than 8 is noise: both become their mean, the rest is kept.
    assert monotone([0.05, 0.08, 0.06, 0.09]) == pytest.approx([0.05, 0.07, 0.07, 0.09])
    assert monotone([0.04, 0.03, 0.02]) == pytest.approx([0.03, 0.03, 0.03])


@pytest.mark.parametrize(("lead", "chosen"), [(0.02, "default"), (0.05, "other")])
def test_tuner_keeps_the_default_unless_another_clearly_leads(lead, chosen) -> None:
    default = dict(DEFAULT_SHAPE, predicted_tokens_per_second=40.0)
    other = dict(window=1, ngram=4, guess=6, predicted_tokens_per_second=40.0 * (1 + lead))
    rows = [other, default]
    assert choose_shape(rows, margin=0.03) is (default if chosen == "default" else other)
    assert choose_shape(rows, margin=0.0) is other
    assert choose_shape([other], margin=0.5) is other  # no default among the shapes


def test_tuner_keeps_the_default_over_a_shape_that_is_slower_on_one_data_set() -> None:
    def row(shape, code, chat):
        per_set = dict(humaneval=code, mtbench=chat)
        return dict(zip(("window", "ngram", "guess"), shape), predicted_per_dataset=per_set,
                    predicted_tokens_per_second=(code + chat) / 2)

    default = row(tuple(DEFAULT_SHAPE.values()), 50.0, 30.0)
    chat_only = row((2, 4, 4), 49.0, 40.0)  # 10 % faster overall, 2 % slower on code
    assert choose_shape([default, chat_only], margin=0.03) is default
    both = row((1, 4, 6), 50.5, 34.0)  # only 6 % faster overall, but on both sets
    assert choose_shape([default, chat_only, both], margin=0.03) is both
    # Chosen by measured timing, the per-set predictions do not apply.
    chat_only["measured_tokens_per_second"], default["measured_tokens_per_second"] = 45.0, 40.0
    both["measured_tokens_per_second"] = 41.0
    assert choose_shape([default, chat_only, both], "measured", margin=0.03) is chat_only


def test_the_curve_keeps_each_size_fastest_timing_made_non_decreasing() -> None:
    busy_first = dict(tokens=[1, 2, 4], seconds=[0.30, 0.31, 0.40], prompt_tokens=9)
    busy_later = dict(tokens=[1, 2, 4], seconds=[0.10, 0.12, 0.35], prompt_tokens=9)
    assert fastest_curve([busy_first, busy_later]) == dict(
        tokens=[1, 2, 4], seconds=[0.10, 0.12, 0.35], prompt_tokens=9
    )
    # Each size's fastest may dip below a smaller size's: pooled, as one curve is.
    dip = dict(tokens=[1, 2, 4], seconds=[0.20, 0.13, 0.50], prompt_tokens=9)
    assert fastest_curve([busy_first, dip])["seconds"] == pytest.approx([0.165, 0.165, 0.40])


def test_a_run_is_repriced_on_another_curve_from_its_forward_sizes() -> None:
    slow = dict(tokens=[1, 4], seconds=[0.3, 0.6], prompt_tokens=9)
    fast = dict(tokens=[1, 4], seconds=[0.1, 0.2], prompt_tokens=9)
    # 12 tokens in 6 steps: 4 passes of 1 token and 2 of 4 (priced on the slow curve).
    run = [12, 6, 4 * 0.3 + 2 * 0.6, [[1, 4], [4, 2]]]
    row = predict(dict(measured_step_ms=150.0, prompt_runs=dict(set=[run])))
    assert row["predicted_step_ms"] == pytest.approx(400.0)  # slower than it ran
    again = predict(reprice(row, fast))
    assert again["prompt_runs"]["set"][0][2] == pytest.approx(4 * 0.1 + 2 * 0.2)
    assert again["predicted_step_ms"] == pytest.approx(800.0 / 6)
    assert again["predicted_tokens_per_second"] == pytest.approx(12 / 0.8)


def test_tune_prices_the_shapes_on_the_faster_of_two_curves(tiny, capsys, caplog,
                                                          monkeypatch) -> None:
    """A curve measured while another job ran is slower than the machine: the tuner measures
    it again after the shapes, says so, and predicts from the faster timings."""
    import lookahead.bench.tune as tune_module

    measure = tune_module.forward_cost_curve
    calls = []

    def first_one_busy(*args, **kwargs):
        curve = measure(*args, **kwargs)
        if not calls:  # the first measurement, as if another job had tripled it
            curve = curve | dict(seconds=[3 * s for s in curve["seconds"]])
        calls.append(curve)
        return curve

    monkeypatch.setattr(tune_module, "forward_cost_curve", first_one_busy)
    cache, model = tiny["cache"] / "busy", str(tiny["model"])
    argv = [
        "tune", "--model", model, "--dtype", "float64", "--dataset", str(tiny["prompts"]),
        "--limit", "1", "--max-new-tokens", "8", "--tokens", "1,4", "--repeats", "1",
        "--shapes", "2x2x2", "--cache-dir", str(cache),
    ]  # fmt: skip
    with caplog.at_level("WARNING", logger="lookahead.bench"):
        assert main(argv) == 0
    assert len(calls) == 2 and "another job was running" in caplog.text
    profile = load_profile(model, "float64", cache_dir=cache)
    assert profile["curves_measured"] == calls
    assert profile["curve"] == fastest_curve(calls)
    assert profile["curve"]["seconds"][0] < calls[0]["seconds"][0]
    for row in profile["shapes"]:  # every step priced on the kept curve
        for run in row["prompt_runs"][str(tiny["prompts"])]:
            sizes = run[3]
            assert sum(count for _, count in sizes) == run[1]
            expected = sum(cost_at(profile["curve"], k) * count for k, count in sizes)
            assert run[2] == pytest.approx(expected)


def test_step_overhead_is_the_median_gap_and_counts_per_step() -> None:
    def row(measured_ms, runs):
        return predict(dict(measured_step_ms=measured_ms, prompt_runs=dict(set=runs)))

    # [tokens, steps, forward seconds]: 3 tokens/step in 10 ms steps; 2.6 in 8.5 ms steps.
    wide = row(12.0, [[30, 10, 0.100]])
    narrow = row(11.0, [[26, 10, 0.085]])
    spare = row(9.0, [[10, 10, 0.050]])  # measured 4 ms over its 5 ms steps
    assert wide["predicted_step_ms"] == pytest.approx(10.0)
    # On the forward cost alone the narrow shape looks faster.
    assert narrow["predicted_tokens_per_second"] > wide["predicted_tokens_per_second"]
    # The gaps are 2, 2.5 and 4 ms: the median, 2.5 ms, is the overhead of every step.
    overhead = step_overhead_of([wide, narrow, spare])
    assert overhead == pytest.approx(0.0025)
    wide, narrow = predict(wide, overhead), predict(narrow, overhead)
    assert wide["predicted_per_prompt"] == {"set": [pytest.approx(30 / 0.125)]}
    assert wide["predicted_step_ms"] == pytest.approx(12.5)
    # With it, the narrow shape's extra steps cost it: 26 / 0.110 s against 30 / 0.125 s.
    assert narrow["predicted_tokens_per_second"] == pytest.approx(26 / 0.110)
    assert wide["predicted_tokens_per_second"] > narrow["predicted_tokens_per_second"]
    # Steps measured faster than the curve says: no negative overhead.
    assert step_overhead_of([row(9.0, [[30, 10, 0.100]])]) == 0.0


def test_tuner_ranks_shapes_prompt_by_prompt_against_the_default() -> None:
    def row(shape, code, chat=(40.0,)):
        per_prompt = dict(humaneval=list(code), mtbench=list(chat))
        rates = [*code, *chat]  # the sum over the sample, as if every output were as long
        return dict(zip(SHAPE_KEYS, shape), predicted_per_prompt=per_prompt,
                    predicted_tokens_per_second=sum(rates) / len(rates))

    default = row((*DEFAULT_SHAPE.values(), 8), [40.0, 40.0, 40.0, 40.0])
    copier = row((1, 5, 3, 16), [90.0, 70.0, 38.0, 36.0])  # 29 % ahead, on 2 of 5 prompts
    steady = row((2, 4, 4), [42.0, 43.0, 39.0, 42.0], [41.0])  # 3.5 % ahead, on 4 of 5
    versus = versus_default(copier, default)
    assert (versus.won, versus.prompts) == (2, 5)
    assert versus.speedup == pytest.approx((90 * 70 * 38 * 36 / 40**4) ** 0.2)
    assert versus.per_dataset["mtbench"] == pytest.approx(1.0)
    assert choose_shape([default, copier], margin=0.03) is default  # though its sum leads
    assert copier["predicted_tokens_per_second"] > 1.2 * default["predicted_tokens_per_second"]
    assert choose_shape([default, copier, steady], margin=0.03) is steady
    assert choose_shape([default, copier, steady], margin=0.05) is default
    # Faster on most prompts and overall, but slower on one data set: not chosen.
    chat_loser = row((2, 4, 6), [50.0, 50.0, 50.0, 50.0], [39.0])
    assert versus_default(chat_loser, default).speedup > 1.1
    assert choose_shape([default, chat_loser], margin=0.03) is default
    # Ahead on every prompt, but not in sum (a long output where it is slow): not chosen.
    lopsided = row((1, 4, 6), [44.0, 44.0, 44.0, 44.0], [41.0])
    lopsided["predicted_tokens_per_second"] = 40.5
    assert versus_default(lopsided, default).speedup > 1.08
    assert choose_shape([default, lopsided], margin=0.03) is default
    lopsided["predicted_tokens_per_second"] = 42.0
    assert choose_shape([default, lopsided], margin=0.03) is lopsided
    # Rows without per-prompt figures (older profiles): no comparison.
    assert versus_default(steady, dict(DEFAULT_SHAPE)) is None


def test_tune_with_a_datastore_measures_the_shapes_copying_from_it(tiny, tmp_path, capsys) -> None:
    """A corpus holding the sample prompts' answers: the tuner's runs copy from it (more tokens
    per step than without it), and the profile says which corpus it was tuned with."""
    model, tokenizer = lookahead.load_model(tiny["model"], dtype="float64")
    corpus = tmp_path / "answers.txt"
    with corpus.open("w") as out:
        for prompt in PROMPTS:
            ids = tokenizer(prompt["prompt"], return_tensors="pt")["input_ids"]
            answer = lookahead.generate(model, ids, 16, "autoregressive").new_tokens[0]
            out.write(f"{prompt['prompt']} {tokenizer.decode(answer)}\n")
    argv = [
        "tune", "--model", str(tiny["model"]), "--dtype", "float64", "--dataset",
        str(tiny["prompts"]), "--limit", "2", "--max-new-tokens", "16", "--tokens", "1,8",
        "--repeats", "1", "--shapes", "1x2x1", "--cache-dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    per_step = {}
    for extra in ((), ("--datastore", str(corpus))):
        assert main([*argv, *extra]) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert (f", datastore {corpus}" in header) is bool(extra), header
        profile = load_profile(str(tiny["model"]), "float64", cache_dir=tmp_path / "cache")
        assert profile["datastore"] == (str(corpus) if extra else None)
        assert profile["cpu"] == torch.backends.cpu.get_cpu_capability()  # "AVX2", "AVX512"
        per_step[bool(extra)] = profile["shapes"][0]["tokens_per_step"]
    assert per_step[True] > per_step[False], per_step
    # A corpus that is not there is refused before the model loads, naming the flag.
    assert main([*argv, "--datastore", str(tmp_path / "nope")]) == 2
    assert "datastore: expected 'stdlib', 'python' or a file or folder" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="datastore: expected"):
        TuneConfig(datastore=str(tmp_path / "nope"))


def test_a_shape_may_carry_the_lookup_length_and_the_tuner_can_choose_it(tiny, capsys) -> None:
    cache, model = tiny["cache"] / "lookup", str(tiny["model"])
    argv = _tune_argv(tiny, cache, "--limit", "1", "--max-new-tokens", "8", "--tokens", "1,8",
                      "--repeats", "1", "--shapes", "2x3x2,2x3x2x4", "--margin", "0")
    assert main(argv) == 0
    assert "| 2 | 3 | 2 | 4 |" in capsys.readouterr().out  # the L column
    profile = load_profile(model, "float64", cache_dir=cache)
    assert [row["lookup_tokens"] for row in profile["shapes"]] == [8, 4]
    best = max(profile["shapes"], key=lambda row: row["predicted_tokens_per_second"])
    assert resolve_shape(model, "float64", cache_dir=cache)["lookup_tokens"] == best["lookup_tokens"]
    # The default's (W, N, G) with another lookup length is not the default.
    default = dict(DEFAULT_SHAPE, lookup_tokens=8, predicted_tokens_per_second=40.0)
    longer = dict(DEFAULT_SHAPE, lookup_tokens=24, predicted_tokens_per_second=42.0)
    assert choose_shape([default, longer], margin=0.03) is longer
    assert choose_shape([default, longer], margin=0.1) is default
    with pytest.raises(SystemExit):
        main(["tune", "--shapes", "2x5x4x0"])
    assert "L (lookup_tokens) in '2x5x4x0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--shapes", "2x5"])
    assert "each shape is WxNxG or WxNxGxL" in capsys.readouterr().err
    with pytest.raises(ValueError, match="a shape is"):
        TuneConfig(shapes=((2, 5, 4, 8, 1),))


def test_tune_rejects_a_bad_margin_sample_or_no_data_set(capsys) -> None:
    with pytest.raises(ValueError, match="margin must be in"):
        TuneConfig(margin=1.5)
    with pytest.raises(ValueError, match="dataset must name"):
        TuneConfig(dataset=" , ")
    with pytest.raises(ValueError, match="sample must be one of spread, first, got 'middle'"):
        TuneConfig(sample="middle")
    with pytest.raises(SystemExit):
        main(["tune", "--sample", "middle"])
    assert "argument --sample: invalid choice: 'middle'" in capsys.readouterr().err


def test_summary_counts_identical_outputs_per_dtype() -> None:
    def record(method, dtype, tokens, seconds):
        return dict(dataset="d", prompt="p", method=method, dtype=dtype, tokens=tokens,
                    new_tokens=len(tokens), seconds=seconds, time_to_first_token=0.1,
                    steps=len(tokens), stats=None)  # fmt: skip

    records = [
        record("hf", "bfloat16", [1, 2, 3, 4], 1.0),
        record("hf", "float32", [1, 2, 3, 5], 0.5),
        record("autoregressive", "bfloat16", [1, 2, 3, 5], 2.0),
    ]
    results = summarise(dict(model="m", max_new_tokens=4, environment=dict(threads=2)), records)
    rows = results["summary"]["d"]
    assert [r["identical"] for r in rows] == [None, None, 0]  # compared with hf in bfloat16
    assert [r["speedup"] for r in rows] == [1.0, 1.0, 0.5]
    assert [r["speedup_vs_best_baseline"] for r in rows] == [0.5, 1.0, 0.25]
    assert "| autoregressive | bfloat16 | 2.0 | 0.50x | 0.25x |" in markdown_table(results)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--methods", "hf,nope"], "unknown 'nope'"),
        (["--shape", "7x5"], "WINDOWxNGRAMxGUESS"),
        (["--shape", "0x5x7"], "window must be in"),
        (["--baseline-dtypes", "int8"], "dtype"),
        (["--limit", "0"], "positive integer"),
        (["--methods", "hf,hf"], "twice"),
    ],
)
def test_bad_bench_arguments_are_argparse_errors(tiny, capsys, extra, message) -> None:
    with pytest.raises(SystemExit) as info:
        main(_bench_argv(tiny, *extra))
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("margin", "message"), [("1", "must be in [0.0, 1.0)"), ("x", "number")])
def test_bad_tune_margin_is_an_argparse_error(capsys, margin, message) -> None:
    with pytest.raises(SystemExit) as info:
        main(["tune", "--margin", margin])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --margin:" in err and message in err


def test_draft_methods_without_a_draft_model_are_refused(capsys) -> None:
    assert main(["bench", "--methods", "hf,draft", "--limit", "1"]) == 2
    assert "need a draft model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_new_tokens"):
        BenchConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="dtype"):
        BenchConfig(baseline_dtypes=("int8",))
    # Without a draft model the draft methods are simply left out of "all that apply".
    assert (
        "draft" not in BenchConfig().run_methods
        and "hf" in BenchConfig(methods=("lookahead",)).run_methods
    )


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

    assert source() == "default"
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


def test_bench_memory_copies_earlier_answers_but_never_the_warm_up(tiny, tmp_path, capsys) -> None:
    """The same prompt twice: with --memory the second copies the first's answer; the first
    runs as without memory (the warm-up, on the same prompt, left nothing behind)."""
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(json.dumps({**PROMPTS[1], "id": i}) + "\n" for i in ("a", "b")))
    steps = {}
    for flag in ((), ("--memory",)):
        out = tmp_path / f"out{len(flag)}"
        argv = _bench_argv(tiny, "--dataset", str(twice), "--methods", "hf,lookahead,prompt_lookup",
                           "--baseline-dtypes", "float64", "--no-plots", "--out", str(out), *flag)
        assert main(argv) == 0
        results = json.loads((out / "results.json").read_text())
        assert results["config"]["options"]["memory"] is bool(flag)
        for run in results["runs"]:
            steps[run["method"], run["prompt"], bool(flag)] = run["steps"]
    assert "memory of earlier answers on" in capsys.readouterr().out
    for method in ("lookahead", "prompt_lookup"):
        assert steps[method, "a", True] == steps[method, "a", False], method
        assert steps[method, "b", True] < steps[method, "b", False], method


def test_bench_datastore_is_recorded_and_keeps_outputs_exact(tiny, tmp_path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f ( x ) : return x + 1\n" * 3)
    out = tmp_path / "out"
    argv = _bench_argv(tiny, "--methods", "hf,lookahead,prompt_lookup", "--baseline-dtypes",
                       "float64", "--no-plots", "--out", str(out), "--datastore", str(corpus))
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["options"]["datastore"] == str(corpus)
    assert "datastore " + str(corpus) in capsys.readouterr().out
    rows = [r for r in results["summary"]["prompts"] if r["identical"] is not None]
    assert {r["method"] for r in rows} >= {"lookahead", "prompt_lookup"}
    for row in rows:
        assert row["identical"] == row["prompts"], row
    missing = _bench_argv(tiny, "--datastore", str(tmp_path / "nope"), "--out", str(out))
    assert main(missing) == 2
    assert "datastore: expected 'stdlib', 'python' or a file or folder" in capsys.readouterr().err


def test_measure_in_turn_measures_each_run_on_each_prompt(tiny) -> None:
    """The prompt-major loop of the comparison scripts in benchmarks/: every (data set, run)
    gets one measurement per prompt, in order; they sum and agree as the scripts read them,
    and the window gauge's run feeds fewer tokens per step."""
    from lookahead.bench.methods import MethodOptions, agreeing, measure_in_turn, total
    from lookahead.bench.datasets import load_prompts
    from lookahead.models.load import load_model

    model, tokenizer = load_model(str(tiny["model"]), "float64")
    prompts = {"set": load_prompts(str(tiny["prompts"]))}
    every = LookaheadConfig(window=3, ngram=3, guess=2, token_cost=0.0)
    dear = LookaheadConfig(window=3, ngram=3, guess=2, token_cost=1.0)
    runs = {"hf": ("hf", MethodOptions()),
            "every": ("lookahead", MethodOptions(lookahead=every)),
            "dear": ("lookahead", MethodOptions(lookahead=dear))}
    seen = []
    measured = measure_in_turn(model, tokenizer, prompts, {"set": runs}, 24,
                               progress=lambda d, p: seen.append((d, p.id)))
    assert seen == [("set", "p0"), ("set", "p1"), ("set", "p2")]
    assert set(measured) == {("set", label) for label in runs}
    assert all(len(measured["set", label]) == 3 for label in runs)
    # float64: every run writes the same text on every prompt
    assert agreeing(measured, "set", list(runs)) == [0, 1, 2]
    sums = {label: total(measured["set", label]) for label in runs}
    assert sums["every"].tokens == sums["dear"].tokens == sums["hf"].tokens
    for label in runs:
        s = sums[label]
        assert s.seconds > 0 and 0 < s.steps <= s.tokens and s.forward >= s.steps
    assert total(measured["set", "hf"], [1]).tokens == measured["set", "hf"][1].new_tokens
    per_step = {label: sums[label].forward_per_step for label in runs}
    assert per_step["dear"] < per_step["every"]


def test_agreeing_keeps_the_prompts_on_which_every_run_wrote_the_same() -> None:
    from lookahead.bench.methods import Measurement, Totals, agreeing, total

    def run(*texts: list[int]) -> list[Measurement]:
        return [Measurement(tokens=t, seconds=1.0, time_to_first_token=0.1, steps=len(t))
                for t in texts]

    runs = {("d", "a"): run([1, 2], [3], [5, 6]), ("d", "b"): run([1, 2], [4], [5, 6]),
            ("d", "c"): run([1, 2], [3], [5])}
    assert agreeing(runs, "d", ["a", "b"]) == [0, 2]
    assert agreeing(runs, "d", ["a", "b", "c"]) == [0]
    assert agreeing(runs, "d", ["a", "c"]) == [0, 1]
    assert total(runs["d", "a"], [0, 2]) == Totals(tokens=4, seconds=2.0, steps=4, forward=4)
    assert total(runs["d", "c"]).tokens_per_step == 1.0


def test_the_tuner_can_choose_a_step_cap_and_the_commands_take_it(tiny, tmp_path, capsys
                                                                   ) -> None:
    """``--max-step-tokens 0,2`` runs each shape uncapped and capped at 2 tokens a step; a
    profile whose best carries a cap hands it to ``window="auto"`` (lookahead only in bench),
    where an explicit cap still wins."""
    cache, model = tmp_path / "cache", str(tiny["model"])
    argv = _tune_argv(tiny, cache, "--limit", "1", "--max-new-tokens", "12", "--tokens", "1,8",
                      "--repeats", "1", "--shapes", "1x2x2,2x3x3", "--max-step-tokens", "0,2")
    assert main(argv) == 0
    assert re.search(r"\| 1 \| 2 \| 2 \| 8 \| [\d.]+ \| 2 \|", capsys.readouterr().out)  # T
    profile = load_profile(model, "float64", cache_dir=cache)
    assert profile["step_caps"] == [None, 2]
    assert profile["curve"]["tokens"] == [1, 2, 8]  # a capped step's size is measured
    rows = [(row["window"], row.get("max_step_tokens")) for row in profile["shapes"]]
    # 2x3x3 is not the default shape (2x5x4): it gets no extra uncapped run at the shipped cost
    assert rows == [(1, None), (1, 2), (2, None), (2, 2)]
    capped = [row for row in profile["shapes"] if row.get("max_step_tokens")]
    assert all(row["mean_forward_tokens"] <= 2 for row in capped)
    assert any(row["mean_forward_tokens"] > 2 for row in profile["shapes"] if row not in capped)
    config = TuneConfig(step_caps=(6, None, 2, 6), tokens=(1, 8))
    assert (config.step_caps, config.tokens) == ((None, 2, 6), (1, 2, 6, 8))
    with pytest.raises(ValueError, match=r"step_caps must be in \[1, 65536\], got 0"):
        TuneConfig(step_caps=(0,))
    with pytest.raises(SystemExit):
        main([*argv, "--max-step-tokens", "0,-1"])
    assert "argument --max-step-tokens:" in capsys.readouterr().err

    # A profile whose best is capped (written here, so that the choice is known).
    path = profile_path(model, "float64", cache_dir=cache)
    best = {"window": 2, "ngram": 3, "guess": 3, "max_step_tokens": 2}
    path.write_text(json.dumps({"best": best}))
    assert resolve_shape(model, "float64", cache_dir=cache) == best
    args = build_parser().parse_args(_bench_argv(tiny, "--cache-dir", str(cache)))
    options = config_from_args(args).options
    assert (options.max_step_tokens, options.lookahead_step_tokens) == (None, 2)
    assert _our_options("lookahead", options)["max_step_tokens"] == 2
    assert "max_step_tokens" not in _our_options("prompt_lookup", options)
    args = build_parser().parse_args(_bench_argv(tiny, "--cache-dir", str(cache),
                                                 "--max-step-tokens", "5"))
    options = config_from_args(args).options
    assert [_our_options(m, options)["max_step_tokens"] for m in ("lookahead", "draft")] == [5, 5]
    path.write_text(json.dumps({"best": {**best, "max_step_tokens": 0}}))
    assert resolve_shape(model, "float64", cache_dir=cache) == dict(DEFAULT_SHAPE)  # unreadable


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
    from lookahead.api import resolve_auto_shape
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
