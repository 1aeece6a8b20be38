"""The report's figures per group of prompts, from hand-built runs with known tokens and seconds:
tok/s as all tokens over all seconds, the ratio to ``autoregressive``, the lowest marked."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from lookahead.bench import llamacpp
from lookahead.bench.datasets import Prompt
from lookahead.bench.groups import GROUPS, dataset_summaries
from lookahead.bench.report import markdown_table, results_json, summarise
from lookahead.bench.runner import BenchConfig, _record
from lookahead.cli.main import main

from tiny import BENCH_PROMPTS, bench_argv

CONFIG = dict(model="m", max_new_tokens=32, setting="bfloat16", dtype="bfloat16",
              environment=dict(threads=2))


def record(prompt, category, method, new_tokens, seconds, dtype="bfloat16", dataset="d"):
    return dict(dataset=dataset, prompt=prompt, category=category, method=method, dtype=dtype,
                tokens=list(range(new_tokens)), new_tokens=new_tokens, seconds=seconds,
                time_to_first_token=0.1, steps=new_tokens, stats=None)


def grouped_records() -> list[dict]:
    """Two groups ("math": m1, m2; "qa": q1), HF on two dtypes, ours on bfloat16.

    math: autoregressive (10+30)/(2+2) = 10 tok/s; lookahead (10+30)/(0.5+2.5) = 13.33 tok/s
    (the mean of its per-prompt rates, 20 and 12, would be 16), 1.33x; hf 40/4 = 10, 1.00x.
    qa: autoregressive 20/1 = 20 tok/s; lookahead 20/2 = 10, 0.50x; hf 20/0.8 = 25, 1.25x.
    """
    runs = {"m1": ("math", [("hf", 10, 1.0), ("autoregressive", 10, 2.0), ("lookahead", 10, 0.5)]),
            "m2": ("math", [("hf", 30, 3.0), ("autoregressive", 30, 2.0), ("lookahead", 30, 2.5)]),
            "q1": ("qa", [("hf", 20, 0.8), ("autoregressive", 20, 1.0), ("lookahead", 20, 2.0)])}
    records = []
    for prompt, (category, figures) in runs.items():
        for method, tokens, seconds in figures:
            records.append(record(prompt, category, method, tokens, seconds))
            if method == "hf":  # HF on the other baseline dtype: not in the table per group
                records.append(record(prompt, category, "hf", tokens, 0.01, dtype="float32"))
    return records


def test_group_figures_are_all_tokens_over_all_seconds_against_autoregressive() -> None:
    results = summarise(CONFIG, grouped_records())
    rows = {(r["category"], r["method"]): r for r in results["summary"][GROUPS]["d"]}
    assert set(rows) == {(c, m) for c in ("math", "qa")
                         for m in ("hf", "autoregressive", "lookahead")}
    assert all(r["dtype"] == "bfloat16" for r in rows.values())
    math, qa = rows[("math", "lookahead")], rows[("qa", "lookahead")]
    assert (math["prompts"], math["new_tokens"], math["seconds"]) == (2, 40, pytest.approx(3.0))
    assert math["tokens_per_second"] == pytest.approx(40 / 3)
    assert math["vs_autoregressive"] == pytest.approx(4 / 3)
    assert qa["tokens_per_second"] == pytest.approx(10.0)
    assert qa["vs_autoregressive"] == pytest.approx(0.5)
    assert rows[("qa", "hf")]["vs_autoregressive"] == pytest.approx(1.25)
    assert rows[("math", "autoregressive")]["vs_autoregressive"] == pytest.approx(1.0)
    # the main table is unchanged: one row per (method, dtype) over every prompt
    assert [(r["method"], r["dtype"]) for r in dataset_summaries(results)["d"]] == [
        ("hf", "bfloat16"), ("hf", "float32"), ("autoregressive", "bfloat16"),
        ("lookahead", "bfloat16")]


def test_table_per_group_follows_the_main_table_and_marks_each_lowest_ratio() -> None:
    table = markdown_table(summarise(CONFIG, grouped_records()))
    lines = table.splitlines()
    start = lines.index("#### d per group (bfloat16 weights)")
    assert start > lines.index("### d (3 prompts)")
    assert lines[start + 2:start + 6] == [
        "| group | prompts | hf tok/s | hf vs AR | autoregressive tok/s | lookahead tok/s "
        "| lookahead vs AR |",
        "|---|--:|--:|--:|--:|--:|--:|",
        "| math | 2 | 10.0 | **1.00x** | 10.0 | 13.3 | 1.33x |",
        "| qa | 1 | 25.0 | 1.25x | 20.0 | 10.0 | **0.50x** |",
    ]


def test_the_groups_are_in_results_json_for_scripts() -> None:
    results = summarise(CONFIG, grouped_records())
    read = json.loads(results_json(results))
    assert read["summary"][GROUPS] == results["summary"][GROUPS]
    assert list(dataset_summaries(read)) == ["d"]
    assert "### groups" not in llamacpp.comparison_table(read)  # not taken for a data set


@pytest.mark.parametrize("categories", [("", "", ""), ("math", "math", "math"), None])
def test_no_table_per_group_without_two_categories(categories) -> None:
    records = grouped_records()
    for run in records:
        if categories is None:
            del run["category"]  # a results file from before categories were recorded
        else:
            run["category"] = categories[["m1", "m2", "q1"].index(run["prompt"])]
    results = summarise(CONFIG, records)
    assert GROUPS not in results["summary"]
    assert "per group" not in markdown_table(results)


def test_only_the_data_set_with_categories_gets_a_table_and_uncategorised_prompts_a_row() -> None:
    records = grouped_records() + [
        record("x", "", "autoregressive", 8, 1.0), record("x", "", "lookahead", 8, 0.5),
        record("h", "", "autoregressive", 8, 1.0, dataset="plain"),
        record("h", "", "lookahead", 8, 0.5, dataset="plain"),
    ]
    results = summarise(CONFIG, records)
    assert list(results["summary"][GROUPS]) == ["d"]
    table = markdown_table(results)
    assert "#### plain per group" not in table and "#### all per group" not in table
    assert "| (none) | 1 | - | - | 8.0 | 16.0 | 2.00x |" in table


def test_without_autoregressive_the_table_gives_tok_s_only() -> None:
    records = [r for r in grouped_records() if r["method"] != "autoregressive"]
    results = summarise(CONFIG, records)
    assert all(r["vs_autoregressive"] is None for r in results["summary"][GROUPS]["d"])
    table = markdown_table(results)
    assert "| group | prompts | hf tok/s | lookahead tok/s |" in table
    assert "| math | 2 | 10.0 | 13.3 |" in table and "vs AR" not in table


def test_a_data_set_may_not_take_the_groups_entry_s_name() -> None:
    with pytest.raises(ValueError, match="datasets: 'groups' names the summary's figures"):
        BenchConfig(datasets=("somewhere/groups.jsonl",))


def test_each_run_records_its_prompt_s_category() -> None:
    result = SimpleNamespace(tokens=[5, 6], new_tokens=2, seconds=0.5, time_to_first_token=0.1,
                             steps=2, stats=None)
    prompt = Prompt(id="translation-1", text="Translate.", is_chat=True, category="translation")
    run = _record("task-groups-12", prompt, "lookahead", "bfloat16", torch.ones(1, 4), result)
    assert (run["prompt"], run["category"], run["prompt_tokens"]) == ("translation-1",
                                                                      "translation", 4)


def test_bench_on_categorised_prompts_writes_the_table_per_group(tiny, tmp_path) -> None:
    prompts = tmp_path / "grouped.jsonl"
    prompts.write_text("".join(json.dumps({**p, "category": c}) + "\n"
                               for p, c in zip(BENCH_PROMPTS, ("code", "pairs"))))
    out = tmp_path / "out"
    argv = bench_argv(tiny, "--methods", "hf,autoregressive,lookahead", "--baseline-dtypes",
                      "float64", "--no-plots", "--out", str(out), "--dataset", str(prompts))
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["category"] for r in results["runs"]][::3] == ["code", "pairs"]
    rows = results["summary"][GROUPS]["grouped"]
    assert [(r["category"], r["method"]) for r in rows] == [
        (c, m) for c in ("code", "pairs") for m in ("hf", "autoregressive", "lookahead")]
    assert "#### grouped per group (float64 weights)" in (out / "results.md").read_text()
