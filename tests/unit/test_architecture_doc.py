"""The documentation matches the tree: every module is in docs/architecture.md, and every
file the README and docs/*.md point to exists.

docs/architecture.md's "## Modules" section has one list item per module, starting with its
path relative to ``src/lookahead/`` in backticks: ``- `proposers/draft.py` — what it does``.
Adding or removing a module means adding or removing its line there; the failure names the
lines to change.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "lookahead"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
PAGES = (ROOT / "README.md", *sorted(DOCS.glob("*.md")))

# A list item of the Modules section starts with its module: "- `kernels/quant_linear.py` — ...".
MODULE_LINE = re.compile(r"^[-*] `([\w./]+\.py)`", re.MULTILINE)
# What a page may point to: a Markdown link's target, or a path in a backticked span.
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
ROOT_PREFIXES = ("docs/", "benchmarks/", "examples/", "tests/", "src/")
# Under docs/ a page writes `results/...` for docs/results/... (docs/benchmarks.md says so).
PAGE_PREFIXES = ("results/",)
# Paths, as written, that name what a command writes, not a file kept in the repository.
WRITTEN_BY_COMMANDS = {
    "docs/results/gpu-h100",  # `gpu_step_cost.py --out`: where a new run of it writes
}


def module_paths() -> set[str]:
    """Every module of the package but the ``__init__.py`` files, relative to src/lookahead."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py"}


def modules_section(text: str) -> str:
    """The text of the "## Modules" section of a page (empty if it has none)."""
    match = re.search(r"^## Modules\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    return match.group(1) if match else ""


def documented_modules(text: str) -> set[str]:
    return set(MODULE_LINE.findall(modules_section(text)))


def referenced_paths(page: Path) -> set[tuple[str, Path]]:
    """(as written, where it should be) for each repository path ``page`` refers to.

    Link targets resolve against the page's folder; a backticked token starting with one of
    ROOT_PREFIXES against the repository, one starting with PAGE_PREFIXES against the page's
    folder. Fenced code blocks are left out: they hold commands and their output.
    """
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found = set()
    for target in LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        found.add((target, page.parent / target.split("#")[0]))
    for span in CODE_SPAN.findall(text):
        for token in span.split():
            token = token.rstrip(".,;:)")
            if token.startswith(ROOT_PREFIXES):
                found.add((token, ROOT / token))
            elif token.startswith(PAGE_PREFIXES):
                found.add((token, page.parent / token))
    return found


def exists(path: Path) -> bool:
    if any(ch in path.name for ch in "*?["):
        return any(path.parent.glob(path.name))
    return path.exists()


def missing_references(page: Path) -> list[str]:
    return sorted(written for written, path in referenced_paths(page)
                  if not exists(path) and written.rstrip("/") not in WRITTEN_BY_COMMANDS)


def test_architecture_lists_every_module():
    documented = documented_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    actual = module_paths()
    undocumented = sorted(actual - documented)
    gone = sorted(documented - actual)
    assert not undocumented and not gone, (
        f"docs/architecture.md's Modules section is out of date. Add a line "
        f"`` `PATH` — what it does `` for: {undocumented}; remove the lines naming modules "
        f"that do not exist: {gone}")


def test_pages_point_to_existing_files():
    broken = {page.relative_to(ROOT).as_posix(): missing for page in PAGES
              if (missing := missing_references(page))}
    assert not broken, f"paths that name no file in the repository, by page: {broken}"


def test_the_checks_can_fail(tmp_path):
    """The parsers find what they must: a module line, a missing link and a missing path."""
    page = ("# A\n\n## Modules\n\nNot `__init__.py`.\n\n- `api.py` — calls `y.py`\n"
            "- `kernels/none.py` — x\n\n## Next\n\n- `x.py` — after the section\n")
    assert documented_modules(page) == {"api.py", "kernels/none.py"}
    doc = tmp_path / "page.md"
    doc.write_text("[a](missing.md) and `docs/no-such-file.md`, `results/none/`\n"
                   "```\ncat docs/only-in-a-fence.md\n```\n[b](https://example.com)\n")
    assert missing_references(doc) == ["docs/no-such-file.md", "missing.md", "results/none/"]
