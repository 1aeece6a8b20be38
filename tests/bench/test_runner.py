"""lookahead bench (the harness, its report and arguments) on a tiny random-weight model."""


from __future__ import annotations

import json

import pytest
from lookahead.bench.methods import bench_methods
from lookahead.bench.report import markdown_table, summarise
from lookahead.bench.runner import BenchConfig
from lookahead.cli.main import main
from lookahead.config import LookaheadConfig

from tiny import BENCH_PROMPTS, bench_argv


def test_bench_runs_every_method_and_writes_results(tiny, capsys) -> None:
    out = tiny["out"]
    assert main(bench_argv(tiny, "--out", str(out), "--shape", "3x3x3")) == 0
    table = capsys.readouterr().out
    assert "| lookahead | float64 |" in table and "| hf | float32 |" in table

    text = (out / "results.json").read_text()
    results = json.loads(text)
    assert results["config"]["methods"] == list(bench_methods())
    assert results["config"]["options"]["lookahead"]["window"] == 3
    # each run on a line of its own (its tokens inline), the rest indented
    run_lines = [line for line in text.splitlines() if '"tokens": [' in line]
    assert len(run_lines) == len(results["runs"]) > 0
    assert [json.loads(line.strip().rstrip(",")) for line in run_lines] == results["runs"]
    rows = {(r["method"], r["dtype"]): r for r in results["summary"]["prompts"]}
    assert set(rows) == {(m, "float64") for m in bench_methods()} | {("hf", "float32")}
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
    assert len(runs) == 2 * (len(bench_methods()) + 1)
    assert {r["prompt"] for r in runs} == {"p0", "p1"}
    for name in ("speedups.png", "tokens_per_step.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "results.md").read_text().startswith("model ")


def test_bench_runs_float32_packed_when_asked_and_checks_it_against_plain(tiny, capsys) -> None:
    out = tiny["out"] / "float32-packed"
    argv = bench_argv(tiny, "--dtype", "float32", "--baseline-dtypes", "float32", "--methods",
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
    argv = bench_argv(tiny, "--methods", "hf,lookahead,prompt_lookup", "--limit", "2",
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
        argv = bench_argv(tiny, "--methods", methods, "--limit", "1", "--shape", "3x3x3",
                           "--no-plots", "--out", str(tiny["out"] / methods))
        assert main(argv) == 0
        header = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
        assert ("lookahead W=3 N=3 G=3" in header) is shown, methods


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
        main(bench_argv(tiny, *extra))
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


def test_bench_memory_copies_earlier_answers_but_never_the_warm_up(tiny, tmp_path, capsys) -> None:
    """The same prompt twice: with --memory the second copies the first's answer; the first
    runs as without memory (the warm-up, on the same prompt, left nothing behind). Recycling
    is off: its table, shared across the prompts, would recall the answer too."""
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(json.dumps({**BENCH_PROMPTS[1], "id": i}) + "\n" for i in ("a", "b")))
    steps = {}
    for flag in ((), ("--memory",)):
        out = tmp_path / f"out{len(flag)}"
        argv = bench_argv(tiny, "--dataset", str(twice), "--methods", "hf,lookahead,prompt_lookup",
                           "--baseline-dtypes", "float64", "--no-plots", "--out", str(out),
                           "--recycle", "0", *flag)
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
    argv = bench_argv(tiny, "--methods", "hf,lookahead,prompt_lookup", "--baseline-dtypes",
                       "float64", "--no-plots", "--out", str(out), "--datastore", str(corpus))
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["options"]["datastore"] == str(corpus)
    assert "datastore " + str(corpus) in capsys.readouterr().out
    rows = [r for r in results["summary"]["prompts"] if r["identical"] is not None]
    assert {r["method"] for r in rows} >= {"lookahead", "prompt_lookup"}
    for row in rows:
        assert row["identical"] == row["prompts"], row
    missing = bench_argv(tiny, "--datastore", str(tmp_path / "nope"), "--out", str(out))
    assert main(missing) == 2
    assert "datastore: expected 'stdlib', 'python' or a file or folder" in capsys.readouterr().err


def test_measure_in_turn_measures_each_run_on_each_prompt(tiny) -> None:
    """The prompt-major loop of the comparison scripts in benchmarks/: every (data set, run)
    gets one measurement per prompt, in order; they sum and agree as the scripts read them,
    and the window gauge's run feeds fewer tokens per step."""
    from lookahead.bench.datasets import load_prompts
    from lookahead.bench.methods import MethodOptions, agreeing, measure_in_turn, total
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
