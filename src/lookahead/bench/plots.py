"""PNG figures of the benchmark and of the tuner (matplotlib's Agg canvas, no display needed).

Figures are built with ``matplotlib.figure.Figure`` rather than ``pyplot``: no global state, no
backend to choose, safe in a server or a test.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from lookahead.bench.methods import BASELINE


def main_setting(config: dict) -> str:
    """The weights the methods ran on ("bfloat16", "bfloat16+packed"; older results: dtype)."""
    return config.get("setting", config["dtype"])


def _label(row: dict, dtype: str) -> str:
    return row["method"] if row["dtype"] == dtype else f"{row['method']} ({row['dtype']})"


def plot_speedups(results: dict, path: str | Path) -> Path:
    """Grouped bars: per data set, each method's tokens/s over HF greedy in the main dtype.

    A dashed line marks the fastest plain HF setting when it is another dtype.
    """
    dtype = main_setting(results["config"])
    summary = results["summary"]
    labels = list(
        dict.fromkeys(
            _label(row, dtype)
            for rows in summary.values()
            for row in rows
            if not (row["method"] == BASELINE and row["dtype"] == dtype)
        )
    )
    figure = Figure(figsize=(max(6.0, 1.2 + 0.5 * len(labels) * len(summary)), 4.5), dpi=120)
    axes = figure.add_subplot()
    width = 0.8 / max(len(labels), 1)
    for index, label in enumerate(labels):
        xs, ys = [], []
        for group, rows in enumerate(summary.values()):
            base = _baseline_speed(rows, dtype)
            for row in rows:
                if _label(row, dtype) == label and base:
                    xs.append(group + (index - (len(labels) - 1) / 2) * width)
                    ys.append(row["tokens_per_second"] / base)
        bars = axes.bar(xs, ys, width, label=label)
        axes.bar_label(bars, fmt="%.2f", fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8, label=f"hf ({dtype})")
    for group, rows in enumerate(summary.values()):
        base = _baseline_speed(rows, dtype)
        best = max((r["tokens_per_second"] for r in rows if r["method"] == BASELINE), default=0)
        if base and best > base:
            axes.hlines(best / base, group - 0.45, group + 0.45, colors="gray", linestyles="dashed")
    axes.set_xticks(range(len(summary)), list(summary))
    axes.set_ylabel(f"speed-up over HF generate ({dtype})")
    axes.set_title(f"{results['config']['model']}: tokens/s relative to HF greedy")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path)
    return Path(path)


def _baseline_speed(rows: list[dict], dtype: str) -> float:
    for row in rows:
        if row["method"] == BASELINE and row["dtype"] == dtype:
            return row["tokens_per_second"]
    return 0.0


def plot_tokens_per_step(results: dict, path: str | Path) -> Path:
    """Tokens per step against mean tokens per forward pass: small dots per prompt, a large
    marker per method (and data set, labelled when there are several)."""
    dtype = main_setting(results["config"])
    summary = results["summary"]
    figure = Figure(figsize=(7.0, 5.0), dpi=120)
    axes = figure.add_subplot()
    colours: dict[str, str] = {}
    for run in results["runs"]:
        stats = run.get("stats")
        if stats and stats["mean_forward_tokens"]:
            colour = _colour(colours, run["method"])
            x, y = stats["mean_forward_tokens"], stats["tokens_per_step"]
            axes.scatter(x, y, s=10, color=colour, alpha=0.35)
    for dataset, rows in summary.items():
        for row in rows:
            if row["mean_forward_tokens"] is None or row["dtype"] != dtype:
                continue
            x, y = row["mean_forward_tokens"], row["tokens_per_step"]
            axes.scatter(x, y, s=70, color=_colour(colours, row["method"]), edgecolors="black")
            if len(summary) > 1:
                axes.annotate(
                    dataset, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points"
                )
    axes.set_xscale("log")
    axes.set_xlabel("mean tokens per forward pass (stats.mean_forward_tokens, log scale)")
    axes.set_ylabel("tokens per step (new tokens per forward pass)")
    axes.set_title(f"{results['config']['model']} ({dtype}): what each forward pass buys")
    axes.grid(True, which="both", alpha=0.3)
    handles = [axes.scatter([], [], color=c, label=m) for m, c in colours.items()]
    if handles:
        axes.legend(handles=handles, fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return Path(path)


def _colour(colours: dict[str, str], method: str) -> str:
    if method not in colours:
        colours[method] = f"C{len(colours) % 10}"
    return colours[method]


def plot_cost_curve(profile: dict, path: str | Path) -> Path:
    """The tuner's forward-cost curve: median ms of one forward with k new tokens."""
    curve = profile["curve"]
    ks, ms = curve["tokens"], [1000 * s for s in curve["seconds"]]
    figure = Figure(figsize=(6.0, 4.0), dpi=120)
    axes = figure.add_subplot()
    axes.plot(ks, ms, "o-", label="one forward pass")
    for index, shape in enumerate(profile.get("shapes", [])):
        label = "tried lookahead shapes (mean step tokens)" if index == 0 else None
        axes.axvline(
            shape["mean_forward_tokens"], color="gray", alpha=0.3, linewidth=0.8, label=label
        )
    axes.set_xlabel(f"new tokens k (on a cached {curve['prompt_tokens']}-token prompt)")
    axes.set_ylabel("median latency (ms)")
    axes.set_ylim(bottom=0)
    axes.set_title(
        f"{profile['model']} {profile['dtype']} on {profile['device']}, "
        f"{profile['threads']} threads"
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return Path(path)
