"""lookahead tune on a tiny random-weight model: the profile it writes and the shape it keeps."""


from __future__ import annotations

import json
import re

import lookahead
import pytest
import torch
from lookahead.argtypes import UsageError
from lookahead.bench.cost_curve import (
    cost_at,
    fastest_curve,
    token_cost_of,
)
from lookahead.bench.methods import _our_options
from lookahead.bench.shape_search import choose_shape, scaled_costs
from lookahead.bench.tune import TuneConfig
from lookahead.cli.bench import config_from_args
from lookahead.cli.main import build_parser, main
from lookahead.cli.options import method_options
from lookahead.config import LookaheadConfig
from lookahead.kernels import Kernel
from lookahead.profiles import (
    DEFAULT_SHAPE,
    DEFAULT_TOKEN_COST,
    load_profile,
    profile_path,
    resolve_shape,
    saved_profile_path,
    step_costs_of,
)

from tiny import BENCH_PROMPTS, bench_argv, tune_argv


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
    # Decoding prices its candidates on the profile's curve.
    costs = step_costs_of(profile["curve"])
    assert costs[0] == 1.0 and len(costs) == 8
    assert resolve_shape(model, "float64", cache_dir=cache) == expected | {"step_costs": costs}

    # --shape auto resolves through the profile; --guess overrides one part of it.
    args = build_parser().parse_args(bench_argv(tiny, "--shape", "auto", "--guess", "9"))
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
    # Where one of those scaled costs is the shipped one (the curve is timed, so it can be),
    # that row already is the default as shipped and no extra row is run.
    costs = scaled_costs(cost, (1.0, 0.5))
    as_shipped = [] if DEFAULT_TOKEN_COST in costs else [(2, None)]
    rows = [(row["window"], row.get("token_cost")) for row in profile["shapes"]]
    assert rows == as_shipped + [(2, c) for c in costs] + [(1, c) for c in costs]
    # No shape leads by 99 %: the default as shipped is kept, at the shipped cost.
    best = dict(profile["best"])
    assert best.pop("token_cost", DEFAULT_TOKEN_COST) == DEFAULT_TOKEN_COST
    assert best == dict(DEFAULT_SHAPE, lookup_tokens=8)
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
        window=1, ngram=2, guess=2, lookup_tokens=8, token_cost=code["token_cost"],
        step_costs=step_costs_of(code["curve"]),
    )
    assert resolve_shape(model, "float64", cache_dir=cache) == dict(window=3, ngram=4, guess=6)
    argv = bench_argv(tiny, "--workload", "code")
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
    assert main(bench_argv(tiny, "--shape", "2x3x4", "--workload", "code")) == 2
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
    plain float32, nor the other way round; a profile that does not say is taken for either.
    Profiles name the kernel ("packed", "plain"); older ones wrote true or false."""
    cache, model = tiny["cache"] / "packing", str(tiny["model"])
    path = profile_path(model, "float32", cache_dir=cache)
    path.parent.mkdir(parents=True)
    tuned = dict(window=1, ngram=3, guess=2)
    name = {True: "packed", False: "plain"}  # the older spellings' kernels
    for recorded in (True, False, None, Kernel.PACKED, Kernel.PLAIN):
        profile = {"best": tuned} | ({} if recorded is None else {"packed_weights": recorded})
        path.write_text(json.dumps(profile))
        for packed in (Kernel.PACKED, Kernel.PLAIN, None, True, False):
            alike = (recorded is None or packed is None
                     or name.get(packed, packed) == name.get(recorded, recorded))
            expected = tuned if alike else dict(DEFAULT_SHAPE)
            assert resolve_shape(model, "float32", cache_dir=cache, packed=packed) == expected
    # bench --shape auto asks with the packing it will run: float32 plain unless told to pack.
    path.write_text(json.dumps({"best": tuned, "packed_weights": True}))
    for flag, expected in (("--packed-weights", tuned), ("--no-packed-weights", DEFAULT_SHAPE),
                           (None, DEFAULT_SHAPE)):
        argv = bench_argv(tiny, "--dtype", "float32", "--baseline-dtypes", "float32")
        argv[argv.index("--cache-dir") + 1] = str(cache)
        shape = config_from_args(build_parser().parse_args(argv + [flag] * bool(flag)))
        lookahead_shape = shape.options.lookahead
        assert (lookahead_shape.window, lookahead_shape.ngram, lookahead_shape.guess) == (
            expected["window"], expected["ngram"], expected["guess"]), flag


def test_packed_and_plain_weights_keep_a_profile_each(tiny) -> None:
    """Tuning packed weights, then plain ones, keeps both shapes: each is saved under its own
    name and read for its own packing; a profile of unknown packing reads the plain one."""
    cache, model = tiny["cache"] / "profile-each", str(tiny["model"])
    shapes = {Kernel.PACKED: dict(window=1, ngram=3, guess=2),
              Kernel.PLAIN: dict(window=3, ngram=4, guess=5)}
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
    assert resolve_shape(model, "float32", cache_dir=cache) == shapes[Kernel.PLAIN]
    # Packed only: a caller who does not know the packing still gets a tuned shape.
    profile_path(model, "float32", cache_dir=cache).unlink()
    assert resolve_shape(model, "float32", cache_dir=cache) == shapes[Kernel.PACKED]
    assert resolve_shape(model, "float32", cache_dir=cache, packed=False) == dict(DEFAULT_SHAPE)


def test_tune_prices_the_shapes_on_the_faster_of_two_curves(tiny, capsys, caplog,
                                                          monkeypatch) -> None:
    """A curve measured while another job ran is slower than the machine: the tuner measures
    it again after the shapes, says so, and predicts from the faster timings."""
    import lookahead.bench.tune as tune_module

    measure = tune_module.forward_cost_curve
    calls = []

    def first_one_busy(*args, **kwargs):
        curve = measure(*args, **kwargs)
        if not calls:  # the first measurement, as if another job had slowed it 50-fold: far
            # more than a busy machine slows the second one
            curve = curve | dict(seconds=[50 * s for s in curve["seconds"]])
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


def test_tune_with_a_datastore_measures_the_shapes_copying_from_it(tiny, tmp_path, capsys) -> None:
    """A corpus holding the sample prompts' answers: the tuner's runs copy from it (more tokens
    per step than without it), and the profile says which corpus it was tuned with."""
    model, tokenizer = lookahead.load_model(tiny["model"], dtype="float64")
    corpus = tmp_path / "answers.txt"
    with corpus.open("w") as out:
        for prompt in BENCH_PROMPTS:
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
    argv = tune_argv(tiny, cache, "--limit", "1", "--max-new-tokens", "8", "--tokens", "1,8",
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


def test_tune_takes_the_kernels_it_can_tune_in_any_spelling() -> None:
    assert TuneConfig(dtype="float32", packed_weights=True).packed_weights is Kernel.PACKED
    assert TuneConfig(dtype="bfloat16", packed_weights="stream").packed_weights is Kernel.STREAM
    # The quantized path is chosen when a GGUF model loads; the tuner loads de-quantised.
    with pytest.raises(ValueError, match="packed_weights must be None .*'plain', 'packed', "
                                         "'stream', .*got 'quantized'"):
        TuneConfig(packed_weights=Kernel.QUANTIZED)


def test_the_tuner_can_choose_a_step_cap_and_the_commands_take_it(tiny, tmp_path, capsys
                                                                   ) -> None:
    """``--max-step-tokens 0,2`` runs each shape uncapped and capped at 2 tokens a step; a
    profile whose best carries a cap hands it to ``window="auto"`` (lookahead only in bench),
    where an explicit cap still wins."""
    cache, model = tmp_path / "cache", str(tiny["model"])
    argv = tune_argv(tiny, cache, "--limit", "1", "--max-new-tokens", "12", "--tokens", "1,8",
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
    args = build_parser().parse_args(bench_argv(tiny, "--cache-dir", str(cache)))
    options = config_from_args(args).options
    assert (options.max_step_tokens, options.lookahead_step_tokens) == (None, 2)
    assert _our_options("lookahead", options)["max_step_tokens"] == 2
    assert "max_step_tokens" not in _our_options("prompt_lookup", options)
    args = build_parser().parse_args(bench_argv(tiny, "--cache-dir", str(cache),
                                                 "--max-step-tokens", "5"))
    options = config_from_args(args).options
    assert [_our_options(m, options)["max_step_tokens"] for m in ("lookahead", "draft")] == [5, 5]
    path.write_text(json.dumps({"best": {**best, "max_step_tokens": 0}}))
    assert resolve_shape(model, "float64", cache_dir=cache) == dict(DEFAULT_SHAPE)  # unreadable


def test_tune_on_a_gguf_model_measures_the_quantized_path(tiny, tmp_path, capsys) -> None:
    """With the default dtype a GGUF model is tuned as the commands run it, quantized, and the
    profile is the one ``generate`` reads for the quantized model."""
    from gguf import GGMLQuantizationType as Q
    from tiny_gguf import write_tiny_gguf

    from lookahead.kernels.choice import Kernel
    from lookahead.kernels.packing import packing_of
    from lookahead.profiles import find_shape

    path = str(write_tiny_gguf(tmp_path / "tiny.gguf", "llama", (Q.Q4_1, Q.Q8_0)))
    cache = tmp_path / "cache"
    argv = [
        "tune", "--model", path, "--dataset", str(tiny["prompts"]), "--limit", "1",
        "--max-new-tokens", "8", "--tokens", "1,4", "--repeats", "1", "--shapes", "1x2x2",
        "--cache-dir", str(cache),
    ]  # fmt: skip
    assert main(argv) == 0
    assert f"{path} float32 on cpu" in capsys.readouterr().out
    profile = load_profile(path, "float32", cache_dir=cache, packed=Kernel.QUANTIZED)
    assert profile is not None and profile["packed_weights"] == "quantized"
    assert saved_profile_path(profile, cache).name.endswith("-float32-quantized-cpu.json")
    model, _ = lookahead.load_model(path, cache_dir=cache)
    shape, source = find_shape(model.name_or_path, model.dtype, cache, packed=packing_of(model))
    assert source.endswith("-float32-quantized-cpu.json") and shape["window"] == 1
    # bench --shape auto (its default) reads it too; de-quantised, it has no profile.
    for extra, window in (((), 1), (("--dequantize",), 2)):
        args = build_parser().parse_args(["bench", "--model", path, "--cache-dir", str(cache),
                                          *extra])
        assert config_from_args(args).options.lookahead.window == window
