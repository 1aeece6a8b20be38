"""The PNGs are read without their results.json: titles name the run and the machine, each
method keeps its colour, repeats show as spread, and a saved run can be drawn again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from lookahead.bench import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _bench_results() -> dict:
    def row(method, dtype, tps, identical, steps=1.0, fed=1.0):
        return {"method": method, "dtype": dtype, "prompts": 2, "tokens_per_second": tps,
                "identical": identical, "speedup_vs_best_baseline": tps / 4.0,
                "best_baseline_dtype": "bfloat16", "tokens_per_step": steps,
                "mean_forward_tokens": fed}

    return {
        "config": {"model": "tiny-llama", "draft_model": None, "max_new_tokens": 16,
                   "dtype": "bfloat16", "setting": "bfloat16+packed",
                   "environment": {"processor": "Some CPU", "threads": 2}},
        "summary": {"humaneval": [row("hf", "bfloat16+packed", 6.0, 2),
                                  row("hf", "bfloat16", 4.0, None),
                                  row("lookahead", "bfloat16+packed", 9.0, 1, 2.0, 5.0)]},
        "runs": [{"method": "lookahead", "stats": {"mean_forward_tokens": 5.0,
                                                   "tokens_per_step": 2.0}}],
    }


def _loadtest_report(with_seconds: bool) -> dict:
    def outcome(repeat, tokens, ttft):
        return {"status": 200, "prompt": "p", "tokens": tokens, "ttft": ttft, "latency": 1.0,
                "cancelled": False, "error": None, "repeat": repeat}

    cell = {"method": "lookahead", "concurrency": 1, "throughput": 20.0, "ttft_p50": 0.1,
            "ttft_p95": 0.2, "latency_p50": 1.0, "latency_p95": 1.2, "repeats": 2,
            "outcomes": [outcome(0, 10, 0.1), outcome(1, 30, 0.3)]}
    if with_seconds:
        cell["run_seconds"] = [1.0, 1.0]
    return {"model": "tiny-llama", "dataset": "/some/where/prompts.jsonl", "max_tokens": 8,
            "requests": 1, "repeat": 2, "disconnect_fraction": 0.0, "cells": [cell],
            "environment": {"processor": "Some CPU", "cpus": 2, "threads": None}}


def test_each_method_keeps_one_colour_and_unknown_ones_a_stable_spare() -> None:
    assert plots.method_colour("lookahead") == plots.METHOD_COLOURS["lookahead"]
    colours = [plots.method_colour(m) for m in plots.METHOD_COLOURS]
    assert len(set(colours)) == len(colours)
    assert plots.method_colour("new_method") == plots.method_colour("new_method")


def test_titles_name_the_run_and_the_machine() -> None:
    results = _bench_results()
    title = plots._bench_title(results, "humaneval", 2, "Decoding speed")
    for part in ("tiny-llama", "humaneval", "2 prompts", "Some CPU", "2 threads"):
        assert part in title, part
    title = plots._loadtest_title(_loadtest_report(True), "throughput")
    for part in ("tiny-llama", "prompts.jsonl", "1 requests x 2 repeats", "Some CPU, 2 CPUs"):
        assert part in title, part
    assert "/some/where" not in title
    assert plots.machine_label(None) == "CPU not recorded"


def test_repeats_give_their_own_figures_where_the_report_records_them() -> None:
    cell = _loadtest_report(True)["cells"][0]
    assert plots._per_repeat(cell, "throughput") == [10.0, 30.0]
    assert plots._per_repeat(cell, "ttft_p50") == [0.1, 0.3]
    older = _loadtest_report(False)["cells"][0]
    assert plots._per_repeat(older, "throughput") == []  # no per-run seconds: no spread


def test_a_saved_run_is_drawn_again(tmp_path: Path) -> None:
    bench = tmp_path / "bench" / "results.json"
    bench.parent.mkdir()
    bench.write_text(json.dumps(_bench_results()))
    load = tmp_path / "load" / "results.json"
    load.parent.mkdir()
    load.write_text(json.dumps(_loadtest_report(True)))
    assert plots.main([str(bench), "--cpu", "Other CPU", "--threads", "4"]) == 0
    assert plots.main([str(load), "--out", str(tmp_path / "again")]) == 0
    for path in (bench.parent / "speedups.png", bench.parent / "tokens_per_step.png",
                 *(tmp_path / "again" / n for n in ("throughput.png", "ttft.png", "latency.png"))):
        assert path.read_bytes()[:8] == PNG, path


RESULTS = Path(__file__).parents[2] / "docs" / "results"


def test_the_results_and_profiles_under_docs_results_still_read_and_draw(tmp_path) -> None:
    """Files written before the kernel was one value (``packed_weights`` true, null or
    "stream"; settings "bfloat16+packed") still give their kernels, and draw again."""
    from lookahead.bench.report import weights_of
    from lookahead.kernels import Kernel
    from lookahead.profiles import recorded_kernel

    bench = [p for p in sorted(RESULTS.rglob("results.json"))
             if {"config", "runs"} <= set(json.loads(p.read_text()))]  # bench's own
    profiles = sorted(RESULTS.rglob("profile-*.json"))
    assert bench and profiles
    kernels = set()
    for path in bench:
        results = json.loads(path.read_text())
        _, kernel = weights_of(plots.main_setting(results["config"]))
        recorded = recorded_kernel(results["config"])
        assert recorded in (None, kernel), path  # null: the default, whatever it chose
        kernels |= {weights_of(run["dtype"])[1] for run in results["runs"]}
    assert {recorded_kernel(json.loads(p.read_text())) for p in profiles} <= set(Kernel)
    assert {Kernel.PLAIN, Kernel.PACKED, Kernel.STREAM} <= kernels
    stream = next(p for p in bench if "+stream" in p.read_text())
    for path in (stream, profiles[0]):
        for png in plots.replot(path, tmp_path / path.parent.name):
            assert png.read_bytes()[:8] == PNG, png
