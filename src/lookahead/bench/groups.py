"""Figures per group of prompts (a prompt's ``category``): whether any group of tasks runs
slower than our own one-token decoding, ``autoregressive``.

A data set whose prompts carry at least two different categories (MT-Bench's, or a JSONL
file's ``"category"`` field) gets one row per (category, method) under the summary's
``"groups"`` entry, ``results["summary"]["groups"][dataset]``::

    {"category": "translation", "method": "lookahead", "dtype": "bfloat16", "prompts": 2,
     "new_tokens": 410, "seconds": 9.5, "tokens_per_second": 43.2, "vs_autoregressive": 1.12}

``tokens_per_second`` is the main table's: all new tokens / all seconds of the group's prompts
(prefill included). ``vs_autoregressive`` divides it by ``autoregressive``'s in the same group
(None where that method did not run). Only the runs on the weights the methods ran on (the
config's ``setting``) count, those ``autoregressive`` ran on; HF ``generate`` on the other
baseline dtypes is left out. Prompts without a category form the group ``""``.
"""

from __future__ import annotations

from collections.abc import Iterable

GROUPS = "groups"  # the summary's entry; not a data set's name
AUTOREGRESSIVE = "autoregressive"
NO_CATEGORY = "(none)"  # how the table names the prompts without a category


def dataset_summaries(results: dict) -> dict[str, list[dict]]:
    """``results["summary"]`` without its ``"groups"`` entry: each data set's summary rows (and
    "all"'s)."""
    return {name: rows for name, rows in results["summary"].items() if name != GROUPS}


def group_rows(config: dict, records: list[dict]) -> list[dict]:
    """One data set's rows per (category, method), categories in the order the prompts came;
    empty unless the prompts carry at least two different non-empty categories."""
    categories = list(dict.fromkeys(r.get("category") or "" for r in records))
    if sum(1 for c in categories if c) < 2:
        return []
    setting = _setting(config, records)
    runs = [r for r in records if r["dtype"] == setting]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    rows = []
    for category in categories:
        in_group = [r for r in runs if (r.get("category") or "") == category]
        figures = {m: _figures(m, setting, [r for r in in_group if r["method"] == m])
                   for m in methods}
        reference = figures.get(AUTOREGRESSIVE, {}).get("tokens_per_second")
        for figure in figures.values():
            if figure["prompts"]:
                rate = figure["tokens_per_second"]
                figure["vs_autoregressive"] = rate / reference if reference else None
                rows.append(dict(category=category, **figure))
    return rows


def _setting(config: dict, records: list[dict]) -> str:
    """The weights the methods ran on: the config's ``setting`` (older files: its ``dtype``),
    else those ``autoregressive`` ran on, else the last run's (the plan runs them last)."""
    if setting := config.get("setting") or config.get("dtype"):
        return setting
    ours = [r["dtype"] for r in records if r["method"] == AUTOREGRESSIVE]
    return ours[0] if ours else records[-1]["dtype"]


def _figures(method: str, dtype: str, runs: list[dict]) -> dict:
    new = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    return dict(method=method, dtype=dtype, prompts=len({r["prompt"] for r in runs}),
                new_tokens=new, seconds=seconds,
                tokens_per_second=new / seconds if seconds > 0 else 0.0)


# ----------------------------------------------------------------------------- Markdown


def group_table(dataset: str, rows: list[dict]) -> list[str]:
    """The Markdown lines of one data set's table per group (none without ``rows``): a row per
    category with its prompts, each method's tok/s and its ratio to ``autoregressive``; each
    method's lowest ratio in bold (its slowest group against our one-token decoding)."""
    if not rows:
        return []
    methods = list(dict.fromkeys(r["method"] for r in rows))
    ratioed = [m for m in methods if m != AUTOREGRESSIVE
               and any(r["vs_autoregressive"] is not None for r in rows if r["method"] == m)]
    lowest = {m: min(r["vs_autoregressive"] for r in rows
                     if r["method"] == m and r["vs_autoregressive"] is not None)
              for m in ratioed}
    header = ["group", "prompts"]
    for method in methods:
        header += [f"{method} tok/s"] + ([f"{method} vs AR"] if method in ratioed else [])
    lines = ["", f"#### {dataset} per group ({rows[0]['dtype']} weights)", "",
             "| " + " | ".join(header) + " |",
             "|---|" + "--:|" * (len(header) - 1)]
    by_key = {(r["category"], r["method"]): r for r in rows}
    for category in dict.fromkeys(r["category"] for r in rows):
        lines.append(_group_line(category, methods, ratioed, lowest, by_key))
    if ratioed:
        lines += ["", "vs AR: the method's tok/s over `autoregressive`'s on the group's prompts "
                  "(below 1.00x: slower than our one-token decoding); bold: each method's lowest."]
    return lines


def _group_line(category: str, methods: Iterable[str], ratioed: list[str],
                lowest: dict[str, float], by_key: dict) -> str:
    found = [by_key[(category, m)] for m in methods if (category, m) in by_key]
    cells = [category or NO_CATEGORY, str(max(r["prompts"] for r in found))]
    for method in methods:
        row = by_key.get((category, method))
        cells.append("-" if row is None else f"{row['tokens_per_second']:.1f}")
        if method in ratioed:
            ratio = None if row is None else row["vs_autoregressive"]
            text = "-" if ratio is None else f"{ratio:.2f}x"
            cells.append(f"**{text}**" if ratio is not None and ratio == lowest[method] else text)
    return "| " + " | ".join(cells) + " |"
