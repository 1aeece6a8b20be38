"""``lookahead.config``: each option name is a config field, named once."""

from __future__ import annotations

import dataclasses

import pytest

from lookahead.cli.main import build_parser
from lookahead.config import (
    METHOD_OPTIONS,
    SAMPLING_OPTIONS,
    DraftConfig,
    LookaheadConfig,
    PromptLookupConfig,
    SamplingConfig,
)


@pytest.mark.parametrize("method, config", [("lookahead", LookaheadConfig),
                                            ("prompt_lookup", PromptLookupConfig),
                                            ("draft", DraftConfig)])
def test_a_methods_options_are_its_configs_fields_and_a_few_more(method, config) -> None:
    names = [f.name for f in dataclasses.fields(config)]
    options = METHOD_OPTIONS[method]
    assert [n for n in options if n in names] == names  # all of them, in their order
    assert set(options) - set(names) <= {"memory", "datastore", "workload", "draft_model",
                                         "successors",
                                         "max_step_tokens"}
    assert len(set(options)) == len(options)


def test_sampling_options_are_the_sampling_configs_fields() -> None:
    assert SAMPLING_OPTIONS == tuple(f.name for f in dataclasses.fields(SamplingConfig))
    assert METHOD_OPTIONS["autoregressive"] == ()


def test_every_cli_method_flag_is_an_option_of_some_method() -> None:
    known = {n for names in METHOD_OPTIONS.values() for n in names} | set(SAMPLING_OPTIONS)
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    group = next(g for g in generate._action_groups if g.title == "decoding method")
    dests = {a.dest for a in group._group_actions} - {"method"}
    assert dests and dests <= known
