"""Turning benchmark runs into figures: per data set and method, a Markdown table, JSON.

The results dict (also written as ``results.json``)::

    {
      "config":  {...the BenchConfig, the methods run, the machine...},
      "summary": {"humaneval": [row, ...], ..., "all": [...] (when several data sets),
                  "groups": {"mtbench": [group row, ...]} (when a data set's prompts have
                             categories; ``lookahead.bench.groups``)},
      "runs":    [one record per (data set, prompt, method, dtype): tokens, seconds, stats...],
    }

A summary row describes one (method, dtype) on one data set. Its "dtype" names the weights
a method ran on (:func:`setting_label`): a dtype, with "+packed" for packed linear layers
(``lookahead.kernels.packing``), "+stream" for the stream kernel
(``lookahead.kernels.stream_linear``); "quantized" for a GGUF model's quantized layers.

* ``tokens_per_second``: all new tokens / all seconds (prefill included, as a user waits it);
* ``speedup``: over HF ``generate`` greedy on the same weights (the baseline);
* ``speedup_vs_best_baseline``: over the fastest HF greedy on plain weights in a dtype;
* ``tokens_per_step``: new tokens per target forward pass (the prefill counts as one);
* ``mean_accepted``: proposed tokens accepted per step that proposed any (our proposers);
* ``acceptance_per_position[k]``: the share of those steps that accepted more than k tokens;
* ``mean_forward_tokens``: tokens fed per decoding forward pass (1.0 for plain decoding);
* ``time_to_first_token``: mean seconds until the first new token;
* ``identical``: prompts whose output equals the baseline's (same weights), of ``prompts``;
  for the baseline on packed weights, the baseline's on the same dtype's plain weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from lookahead.bench.groups import GROUPS, dataset_summaries, group_rows, group_table
from lookahead.bench.methods import BASELINE
from lookahead.kernels.choice import Kernel

ALL = "all"


def setting_label(dtype: str, kernel: Kernel) -> str:
    """The label of weights in ``dtype`` on ``kernel``: "bfloat16+packed", "bfloat16+stream",
    "bfloat16" (plain); a quantized model's is "quantized" whatever its compute dtype."""
    if kernel is Kernel.QUANTIZED:
        return Kernel.QUANTIZED.value
    return f"{dtype}+{kernel.value}" if kernel.packs else dtype


def weights_of(setting: str) -> tuple[str, Kernel]:
    """A setting's label (:func:`setting_label`) split into (dtype, kernel): "bfloat16+stream"
    -> ("bfloat16", STREAM), "bfloat16+packed" -> ("bfloat16", PACKED), "float32" ->
    ("float32", PLAIN), "quantized" -> ("quantized", QUANTIZED). Old results files use the
    same labels."""
    if setting == Kernel.QUANTIZED.value:
        return setting, Kernel.QUANTIZED
    dtype, _, packing = setting.partition("+")
    return dtype, Kernel(packing) if packing else Kernel.PLAIN


def summarise(config: dict, records: list[dict]) -> dict:
    """Group ``records`` by data set (plus "all" for several) and (method, dtype); a data set
    whose prompts carry categories also by category (``summary["groups"]``)."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    groups = {name: [r for r in records if r["dataset"] == name] for name in datasets}
    per_category = {name: rows for name in datasets if (rows := group_rows(config, groups[name]))}
    if len(datasets) > 1:
        groups[ALL] = records
    summary = {name: _summarise_group(group) for name, group in groups.items()}
    if per_category:
        summary[GROUPS] = per_category
    return dict(config=config, summary=summary, runs=records)


def _summarise_group(records: list[dict]) -> list[dict]:
    baseline = {
        (r["dataset"], r["prompt"], r["dtype"]): r["tokens"]
        for r in records
        if r["method"] == BASELINE
    }
    keys = list(dict.fromkeys((r["method"], r["dtype"]) for r in records))
    rows = []
    for method, dtype in keys:
        runs = [r for r in records if (r["method"], r["dtype"]) == (method, dtype)]
        rows.append(_row(method, dtype, runs, baseline))
    reference = {
        row["dtype"]: row["tokens_per_second"] for row in rows if row["method"] == BASELINE
    }
    plain = {dtype: tps for dtype, tps in reference.items() if not weights_of(dtype)[1].packs}
    best = max(plain.values(), default=0.0)
    best_dtype = max(plain, key=plain.get) if plain else None
    for row in rows:
        tps = row["tokens_per_second"]
        base = reference.get(row["dtype"], 0.0)
        row["speedup"] = tps / base if base else None
        row["speedup_vs_best_baseline"] = tps / best if best else None
        row["best_baseline_dtype"] = best_dtype
    return rows


def _row(method: str, dtype: str, runs: list[dict], baseline: dict) -> dict:
    new = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    steps = sum(r["steps"] for r in runs)
    row = dict(
        method=method,
        dtype=dtype,
        prompts=len(runs),
        new_tokens=new,
        seconds=seconds,
        steps=steps,
        tokens_per_second=new / seconds if seconds > 0 else 0.0,
        tokens_per_step=new / steps if steps else 0.0,
        time_to_first_token=sum(r["time_to_first_token"] for r in runs) / len(runs),
        identical=None,
        mean_accepted=None,
        acceptance_per_position=None,
        mean_forward_tokens=1.0 if method == BASELINE else None,
    )
    # The baseline on packed weights is checked against the baseline on plain ones.
    against = weights_of(dtype)[0] if method == BASELINE else dtype
    if against != dtype or method != BASELINE:
        row["identical"] = sum(
            r["tokens"] == baseline.get((r["dataset"], r["prompt"], against)) for r in runs
        )
    stats = [r["stats"] for r in runs if r.get("stats")]
    if stats:
        row.update(_proposer_figures(stats))
    return row


def _proposer_figures(stats: list[dict]) -> dict:
    """Acceptance and forward-pass size pooled over runs (every step weighs the same)."""
    accepted = [a for s in stats for a, p in _steps(s) if p > 0]
    forward = [t for s in stats for t in s["forward_tokens_per_step"][1:]]  # prefill excluded
    positions: list[int] = []
    for s in stats:
        for k, count in enumerate(s["accepted_per_position"]):
            if k == len(positions):
                positions.append(0)
            positions[k] += count
    proposing = len(accepted)
    return dict(
        mean_accepted=sum(accepted) / proposing if proposing else None,
        acceptance_per_position=[c / proposing for c in positions] if proposing else None,
        mean_forward_tokens=sum(forward) / len(forward) if forward else None,
    )


def _steps(stats: dict) -> Iterable[tuple[int, int]]:
    return zip(stats["accepted_per_step"], stats["proposed_per_step"], strict=True)


# ----------------------------------------------------------------------------- output


def _cap_note(options: dict) -> str:
    """", at most T tokens a step" (every method of ours), or ", lookahead at most T ..." (the
    tuned profile's cap, or the one read off the measured step costs), or nothing."""
    if cap := options.get("max_step_tokens"):
        return f", at most {cap} tokens a step"
    if cap := options.get("lookahead_step_tokens"):
        origin = "measured" if options.get("measured_step_costs") else "tuned"
        return f", lookahead at most {cap} tokens a step ({origin})"
    return ""


def markdown_table(results: dict) -> str:
    """One Markdown table per data set (and "all"), for the terminal or a report."""
    config = results["config"]
    lines = [
        f"model {config['model']}"
        + (f", draft {config['draft_model']}" if config.get("draft_model") else "")
        + f", greedy, up to {config['max_new_tokens']} new tokens, "
        f"{config['environment']['threads']} threads"
        + (", memory of earlier answers on" if config.get("options", {}).get("memory") else "")
        + (f", datastore {store}" if (store := config.get("options", {}).get("datastore")) else "")
        + _cap_note(config.get("options", {})),
    ]
    per_category = results["summary"].get(GROUPS, {})
    for dataset, rows in dataset_summaries(results).items():
        best = rows[0]["best_baseline_dtype"] if rows else None
        lines += [
            "",
            f"### {dataset} ({rows[0]['prompts'] if rows else 0} prompts)",
            "",
            "| method | dtype | tok/s | speed-up | vs best plain"
            + (f" (hf {best})" if best else "")
            + " | tokens/step | accepted/step | accept@1,2,3,4 | fwd tokens | TTFT ms"
            + " | identical |",
            "|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|",
        ]
        lines += [_table_line(row) for row in rows]
        lines += group_table(dataset, per_category.get(dataset, []))
    return "\n".join(lines)


def _table_line(row: dict) -> str:
    cells = [
        row["method"],
        row["dtype"],
        f"{row['tokens_per_second']:.1f}",
        _times(row["speedup"]),
        _times(row["speedup_vs_best_baseline"]),
        f"{row['tokens_per_step']:.2f}",
        _number(row["mean_accepted"]),
        "/".join(f"{r:.2f}" for r in (row["acceptance_per_position"] or [])[:4]) or "-",
        _number(row["mean_forward_tokens"], 1),
        f"{1000 * row['time_to_first_token']:.0f}",
        "baseline" if row["identical"] is None else f"{row['identical']}/{row['prompts']}",
    ]
    return "| " + " | ".join(cells) + " |"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write_results(results: dict, out_dir: str | Path, plots: bool = True) -> list[Path]:
    """Write ``results.json``, ``results.md`` and (with ``plots``) the PNGs; return the paths."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.md"]
    written[0].write_text(results_json(results), encoding="utf-8")
    written[1].write_text(markdown_table(results) + "\n", encoding="utf-8")
    if plots:
        from lookahead.bench.plots import plot_speedups, plot_tokens_per_step

        written.append(plot_speedups(results, out / "speedups.png"))
        written.append(plot_tokens_per_step(results, out / "tokens_per_step.png"))
    return written


def results_json(results: dict) -> str:
    """``results`` as JSON text: indented, but each run on one line. A run holds its
    generated tokens, which indented take a line each: a 20-prompt, 3-method run wrote
    247 KB that way and 104 KB this way (the same JSON)."""
    lines = ["{"]
    items = list(results.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "runs" and isinstance(value, list):
            runs = ",\n".join("  " + json.dumps(run) for run in value)
            lines.append(f' {json.dumps(key)}: [\n{runs}\n ]{comma}' if value else f' "runs": []{comma}')
        else:
            indented = json.dumps(value, indent=1).replace("\n", "\n ")
            lines.append(f" {json.dumps(key)}: {indented}{comma}")
    return "\n".join(lines) + "\n}\n"
