"""PNG figures of the benchmark, the tuner and the load test (matplotlib's Agg canvas).

Every figure says in its title what was measured and where: the model, the data set, the
number of prompts, the CPU and the threads, so that a PNG read on its own is understood. Each
method keeps one colour in every figure (``METHOD_COLOURS``). Axes that measure amounts start
at 0.

Figures are built with ``matplotlib.figure.Figure`` rather than ``pyplot``: no global state, no
backend to choose, safe in a server or a test.

Re-plot a saved run (a bench or a load-test ``results.json``) without running it again::

    python -m lookahead.bench.plots docs/results/.../results.json [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from matplotlib.figure import Figure

from lookahead.bench.groups import dataset_summaries
from lookahead.bench.methods import BASELINE
from lookahead.kernels.choice import Kernel
from lookahead.profiles import recorded_kernel


def _save(figure: Figure, path: str | Path) -> None:
    """Write ``figure`` as a PNG of at most 256 colours: a third of the size of matplotlib's
    own, and a plot has far fewer colours (the result files in docs/ are kept small)."""
    from PIL import Image  # matplotlib's own dependency

    figure.savefig(path, format="png")
    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)
    palette.save(path, format="png", optimize=True)

# One colour per method, in every figure (matplotlib's tab10 colours).
METHOD_COLOURS: Mapping[str, str] = MappingProxyType({
    "hf": "#7f7f7f",                # grey: the baseline
    "autoregressive": "#bcbd22",    # olive: our one-token decoding
    "lookahead": "#1f77b4",         # blue
    "prompt_lookup": "#2ca02c",     # green
    "draft": "#d62728",             # red
    "hf_prompt_lookup": "#ff7f0e",  # orange
    "hf_assisted": "#8c564b",       # brown
})
_SPARE_COLOURS = ("#9467bd", "#e377c2", "#17becf", "#000000")

METHOD_NAMES: Mapping[str, str] = MappingProxyType({
    "hf": "HF generate",
    "hf_prompt_lookup": "HF prompt lookup",
    "hf_assisted": "HF assisted generation",
    "autoregressive": "autoregressive",
    "lookahead": "lookahead",
    "prompt_lookup": "prompt lookup",
    "draft": "draft",
})


def method_colour(method: str) -> str:
    """The method's fixed colour; a method not in ``METHOD_COLOURS`` gets a spare one chosen
    from its name, so that it too keeps its colour from figure to figure."""
    if method in METHOD_COLOURS:
        return METHOD_COLOURS[method]
    return _SPARE_COLOURS[sum(method.encode()) % len(_SPARE_COLOURS)]


def main_setting(config: dict) -> str:
    """The weights the methods ran on ("bfloat16", "bfloat16+packed"; older results: dtype)."""
    return config.get("setting", config["dtype"])


def machine_label(environment: Mapping | None) -> str:
    """"<CPU>, <n> threads" from a results file's ``environment`` (as much as it records)."""
    environment = environment or {}
    cpu = environment.get("processor") or environment.get("machine") or "CPU not recorded"
    if environment.get("threads"):
        return f"{cpu}, {environment['threads']} threads"
    if environment.get("cpus"):  # a load test: the client's machine, the server's threads unknown
        return f"{cpu}, {environment['cpus']} CPUs"
    return cpu


def weights_label(setting: str) -> str:
    """"bfloat16+stream" -> "bfloat16, stream kernel"; "bfloat16" -> "bfloat16, plain";
    "quantized" -> "quantized" (GGUF blocks, whatever the compute dtype)."""
    if setting == Kernel.QUANTIZED.value:
        return setting
    dtype, _, packing = setting.partition("+")
    kind = {"": "plain", Kernel.STREAM.value: "stream kernel"}.get(packing, packing)
    return f"{dtype}, {kind}"


def _bench_title(results: dict, dataset: str, prompts: int, what: str) -> str:
    config = results["config"]
    draft = f" (draft {config['draft_model']})" if config.get("draft_model") else ""
    return (f"{what}: {config['model']}{draft}, {dataset}, {prompts} prompts\n"
            f"greedy, up to {config['max_new_tokens']} new tokens; "
            f"{machine_label(config.get('environment'))}")


def plot_speedups(results: dict, path: str | Path) -> Path:
    """Horizontal bars, one panel per data set: each (method, weights) row's tokens/s, labelled
    with its speed-up over the fastest plain HF ``generate`` and its identical outputs."""
    summary = dataset_summaries(results)
    heights = [len(rows) for rows in summary.values()]
    figure = Figure(figsize=(9.0, 1.6 + 0.45 * sum(heights) + 0.9 * len(heights)), dpi=120)
    panels = figure.subplots(len(summary), 1, squeeze=False,
                             gridspec_kw={"height_ratios": heights or [1]})[:, 0]
    for axes, (dataset, rows) in zip(panels, summary.items()):
        _speed_panel(axes, rows)
        prompts = rows[0]["prompts"] if rows else 0
        axes.set_title(_bench_title(results, dataset, prompts, "Decoding speed"), fontsize=9)
    figure.tight_layout()
    _save(figure, path)
    return Path(path)


def _speed_panel(axes, rows: list[dict]) -> None:
    """One data set's bars: HF generate's rows at the bottom, the other methods above, each
    group by speed."""
    best = rows[0].get("best_baseline_dtype") if rows else None
    ordered = sorted(rows, key=lambda r: (r["method"] != BASELINE, r["tokens_per_second"]))
    labels, speeds = [], []
    for row in ordered:
        labels.append(f"{METHOD_NAMES.get(row['method'], row['method'])}\n"
                      f"{weights_label(row['dtype'])}")
        speeds.append(row["tokens_per_second"])
    colours = [method_colour(r["method"]) for r in ordered]
    bars = axes.barh(range(len(ordered)), speeds, color=colours,
                     edgecolor="black", linewidth=0.5)
    for bar, row in zip(bars, ordered):
        if weights_label(row["dtype"]).endswith("plain"):
            bar.set_hatch("//")  # plain weights: what from_pretrained gives a user
    texts = []
    for row in ordered:
        versus = row.get("speedup_vs_best_baseline")
        same = ("baseline" if row["identical"] is None
                else f"identical {row['identical']}/{row['prompts']}")
        ratio = f", {versus:.2f}x plain HF" if versus is not None else ""
        texts.append(f"{row['tokens_per_second']:.1f} tok/s{ratio}, {same}")
    axes.bar_label(bars, texts, padding=3, fontsize=7)
    axes.set_yticks(range(len(ordered)), labels, fontsize=7)
    axes.set_xlim(0, 1.55 * max(speeds, default=1.0))
    reference = f"plain HF generate in {best}" if best else "plain HF generate"
    axes.set_xlabel(f"tokens per second (tok/s); ratio: over the fastest {reference}\n"
                    "identical: prompts whose greedy text equals HF generate's on the same "
                    "weights (HF generate's own row: its text on plain weights)", fontsize=7)
    axes.grid(True, axis="x", alpha=0.3)


def plot_tokens_per_step(results: dict, path: str | Path) -> Path:
    """Tokens per step against mean tokens fed per forward pass: a small dot per prompt, a
    large marker per method (and data set, labelled when there are several)."""
    setting = main_setting(results["config"])
    summary = dataset_summaries(results)
    figure = Figure(figsize=(7.5, 5.0), dpi=120)
    axes = figure.add_subplot()
    seen: dict[str, str] = {}
    for run in results["runs"]:
        stats = run.get("stats")
        if stats and stats.get("mean_forward_tokens"):
            seen[run["method"]] = method_colour(run["method"])
            axes.scatter(stats["mean_forward_tokens"], stats["tokens_per_step"], s=10,
                         color=method_colour(run["method"]), alpha=0.35)
    for dataset, rows in summary.items():
        for row in rows:
            if row["mean_forward_tokens"] is None or row["dtype"] != setting:
                continue
            x, y = row["mean_forward_tokens"], row["tokens_per_step"]
            seen[row["method"]] = method_colour(row["method"])
            axes.scatter(x, y, s=70, color=method_colour(row["method"]), edgecolors="black")
            if len(summary) > 1:
                axes.annotate(dataset, (x, y), fontsize=7, xytext=(4, 4),
                              textcoords="offset points")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("tokens fed per forward pass (mean over decoding steps)")
    axes.set_ylabel("tokens committed per forward pass (tokens per step)")
    datasets = [d for d in summary if d != "all"]
    prompts = sum(rows[0]["prompts"] for d, rows in summary.items() if d != "all" and rows)
    title = _bench_title(results, ", ".join(datasets), prompts, "What each forward pass buys")
    axes.set_title(f"{title}, {weights_label(setting)}", fontsize=9)
    axes.grid(True, alpha=0.3)
    handles = [axes.scatter([], [], color=c, label=METHOD_NAMES.get(m, m)) for m, c in seen.items()]
    if handles:
        axes.legend(handles=handles, fontsize=8, title="large: all prompts; small: one prompt",
                    title_fontsize=7)
    figure.tight_layout()
    _save(figure, path)
    return Path(path)


def plot_cost_curve(profile: dict, path: str | Path) -> Path:
    """The tuner's forward-cost curve: median ms of one forward with k new tokens."""
    curve = profile["curve"]
    ks, ms = curve["tokens"], [1000 * s for s in curve["seconds"]]
    figure = Figure(figsize=(6.5, 4.2), dpi=120)
    axes = figure.add_subplot()
    axes.plot(ks, ms, "o-", color=method_colour("autoregressive"), label="one forward pass")
    for index, shape in enumerate(profile.get("shapes", [])):
        label = "tried lookahead shapes (mean tokens fed a step)" if index == 0 else None
        axes.axvline(shape["mean_forward_tokens"], color=method_colour("lookahead"), alpha=0.3,
                     linewidth=0.8, label=label)
    axes.set_xlabel(f"new tokens k in the pass (on a cached {curve['prompt_tokens']}-token prompt)")
    axes.set_ylabel("median time of one forward pass (ms)")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    cpu = (profile.get("environment") or {}).get("processor")
    where = cpu or f"{profile['device']} ({profile.get('cpu', 'ISA not recorded')})"
    # A profile names its kernel; an older one wrote true, false or null (plain).
    kernel = recorded_kernel(profile) or Kernel.PLAIN
    weights = "stream kernel" if kernel is Kernel.STREAM else str(kernel)
    axes.set_title(f"Forward-pass cost: {profile['model']} {profile['dtype']}, {weights}\n"
                   f"{where}, {profile['threads']} threads", fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    _save(figure, path)
    return Path(path)


def plot_loadtest(report: dict, out_dir: str | Path) -> list[Path]:
    """``throughput.png``, ``ttft.png`` and ``latency.png`` of a load test against concurrency:
    a line per method through the pooled figure, and each repeat's own figure as a cross, so that
    the spread between repeats shows."""
    out = Path(out_dir)
    cells = report["cells"]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    figures = (("throughput", "throughput (completion tokens/s, all clients)",
                (("throughput", "-"),)),
               ("time to first token", "time to first token (s)",
                (("ttft_p50", "-"), ("ttft_p95", "--"))),
               ("latency", "request latency (s)", (("latency_p50", "-"), ("latency_p95", "--"))))
    written = []
    for what, ylabel, series in figures:
        name = {"time to first token": "ttft"}.get(what, what) + ".png"
        figure = Figure(figsize=(7.0, 4.6), dpi=120)
        axes = figure.add_subplot()
        spread = False
        for method in methods:
            rows = [c for c in cells if c["method"] == method]
            for key, style in series:
                points = [(c["concurrency"], c[key]) for c in rows if c.get(key) is not None]
                if points:
                    suffix = "" if len(series) == 1 else f" {key.rsplit('_', 1)[1]}"
                    axes.plot(*zip(*points), style, marker="o", color=method_colour(method),
                              label=METHOD_NAMES.get(method, method) + suffix)
            offset = methods.index(method) - (len(methods) - 1) / 2
            spread |= _draw_spread(axes, rows, series[0][0], method, offset)
        if report.get("repeat", 1) > 1 and not spread:
            axes.text(0.99, 0.02, "each repeat's own figure: not recorded in this file",
                      transform=axes.transAxes, ha="right", fontsize=7, color="gray")
        concurrencies = sorted({c["concurrency"] for c in cells})
        axes.set_xscale("log", base=2)
        axes.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axes.minorticks_off()
        axes.set_xlabel("concurrent clients")
        axes.set_ylabel(ylabel)
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)
        axes.set_title(_loadtest_title(report, what), fontsize=9)
        figure.tight_layout()
        _save(figure, out / name)
        written.append(out / name)
    return written


def _draw_spread(axes, rows: list[dict], key: str, method: str, offset: float) -> bool:
    """Each repeat's figure as a cross on a bar from the lowest to the highest, shifted a little
    sideways per method (the x axis is log2: a factor) so that methods do not hide each other.
    Returns whether it drew any."""
    drawn = False
    for cell in rows:
        values = _per_repeat(cell, key)
        if not values:
            continue
        x = cell["concurrency"] * 2 ** (0.06 * offset)
        axes.vlines(x, min(values), max(values), color=method_colour(method), linewidth=3,
                    alpha=0.35)
        axes.scatter([x] * len(values), values, s=18, marker="x", color=method_colour(method),
                     label=None if drawn else f"{METHOD_NAMES.get(method, method)}, each repeat"
                     + (" (p50)" if key.endswith("_p50") else ""))
        drawn = True
    return drawn


def _per_repeat(cell: dict, key: str) -> list[float]:
    """Each repeat's own figure of ``key`` (throughput or a p50), where the cell has repeats and
    records what they need: the requests of each (and, for throughput, each run's seconds)."""
    outcomes = cell.get("outcomes") or []
    repeats = sorted({o.get("repeat", 0) for o in outcomes})
    if len(repeats) < 2:
        return []
    done = [o for o in outcomes if o["status"] == 200 and not o["cancelled"] and not o["error"]]
    values = []
    for repeat in repeats:
        mine = [o for o in done if o.get("repeat", 0) == repeat]
        if key == "throughput":
            seconds = cell.get("run_seconds") or []
            if len(seconds) != len(repeats):
                return []  # older reports kept only the pooled seconds
            values.append(sum(o["tokens"] for o in mine) / seconds[repeat])
        elif key.endswith("_p50"):
            field = key.removesuffix("_p50")
            times = sorted(o[field] for o in mine if o.get(field) is not None)
            if times:
                values.append(times[len(times) // 2])
    return values


def _loadtest_title(report: dict, what: str) -> str:
    repeat = report.get("repeat", 1)
    per_point = f"{report['requests']} requests" + (f" x {repeat} repeats" if repeat > 1 else "")
    gone = report.get("disconnect_fraction") or 0
    hang_up = f", {gone:.0%} hang up" if gone else ""
    machine = report.get("environment")
    where = machine_label(machine) if machine else "machine not recorded"
    dataset = Path(report["dataset"]).name  # a .jsonl file: its name, not its folder
    return (f"Server {what}: {report['model']}, {dataset}\n{per_point} per point, "
            f"max_tokens {report['max_tokens']}{hang_up}\n{where}")


def replot(results_path: str | Path, out_dir: str | Path | None = None,
           machine: Mapping | None = None) -> list[Path]:
    """Draw a saved ``results.json`` again (bench or load test; or a tuner's profile) into ``out_dir`` (default: its
    folder); return the PNGs written. ``machine`` (``processor``, ``threads``) fills in what an
    older file did not record."""
    results_path = Path(results_path)
    out = Path(out_dir) if out_dir is not None else results_path.parent
    out.mkdir(parents=True, exist_ok=True)
    results = json.loads(results_path.read_text())
    holder = results if "cells" in results or "curve" in results else results["config"]
    if machine:
        holder["environment"] = {**(holder.get("environment") or {}),
                                 **{k: v for k, v in machine.items() if v}}
    if "cells" in results:  # a load test's report
        return plot_loadtest(results, out)
    if "curve" in results:  # a tuner's profile
        return [plot_cost_curve(results, out / results_path.with_suffix(".png").name)]
    return [plot_speedups(results, out / "speedups.png"),
            plot_tokens_per_step(results, out / "tokens_per_step.png")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lookahead.bench.plots",
                                     description="Draw a bench or load-test results.json again.")
    parser.add_argument("results", type=Path,
                        help="a results.json written by bench or loadtest, or a tuner's profile")
    parser.add_argument("--out", type=Path, default=None, help="folder (default: the file's)")
    parser.add_argument("--cpu", default=None, help="the CPU, where the file does not name it")
    parser.add_argument("--threads", type=int, default=None,
                        help="the threads, where the file does not say")
    args = parser.parse_args(argv)
    machine = {"processor": args.cpu, "threads": args.threads}
    for path in replot(args.results, args.out, machine):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
