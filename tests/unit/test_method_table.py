"""One table of methods: a method added as one row of ``METHOD_SPECS`` (with its proposer and
config) reaches ``generate``, the batch, the command line, the benchmark and the server, and
decodes exactly."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import lookahead
from lookahead import config
from lookahead.config import MethodSpec, check_ranges, option
from lookahead.proposers.base import Proposal, ProposerInputs, StepOutcome
from tiny import reference, tiny_llama


@dataclass(frozen=True)
class EchoConfig:
    """A toy method: propose the last ``repeat`` tokens of the text again."""

    repeat: int = option(3, 1, 8, "tokens of the text's tail proposed again", "K")

    def __post_init__(self) -> None:
        check_ranges(self)


class EchoProposer:
    def __init__(self, repeat: int, memory) -> None:
        self.repeat, self.memory = repeat, memory

    @classmethod
    def build(cls, cfg: EchoConfig, inputs: ProposerInputs) -> EchoProposer:
        return cls(cfg.repeat, inputs.memory)

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        if max_tokens <= 0:
            return Proposal()
        return Proposal([context[-self.repeat:][:max_tokens]])

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        pass


ECHO = MethodSpec("echo", EchoConfig, EchoProposer.build, copies_text=True)


@pytest.fixture
def with_echo(monkeypatch):
    """The table with one more row, as adding a method to the source would give it."""
    monkeypatch.setattr(config, "METHOD_SPECS", (*config.METHOD_SPECS, ECHO))


def test_a_new_row_is_a_method_with_its_options(with_echo) -> None:
    assert "echo" in config.method_names() and "echo" in lookahead.config.METHODS
    assert config.options_by_method()["echo"] == ("repeat", "memory", "datastore",
                                                  "max_step_tokens")
    assert "echo" in config.copying_methods()
    with pytest.raises(ValueError, match="method must be one of .*echo"):
        config.method_spec("ech0")


def test_the_new_method_decodes_exactly(with_echo) -> None:
    model = tiny_llama(32, eos=None).double()
    ids = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    want = reference(model, ids, 20)
    memory = lookahead.TextMemory()
    result = lookahead.generate(model, ids, 20, method="echo", repeat=4, memory=memory)
    assert torch.equal(result.sequences, want)
    assert result.stats.method == "echo" and result.stats.steps < 20  # some were accepted
    batch = lookahead.generate(model, torch.cat([ids, ids]), 20, method="echo", batched=True)
    assert torch.equal(batch.sequences, torch.cat([want, want]))


def test_the_new_methods_options_are_checked_by_name(with_echo) -> None:
    model = tiny_llama(32, eos=None)
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['window'\] for method 'echo'"):
        lookahead.generate(model, ids, 4, method="echo", window=2)
    with pytest.raises(ValueError, match=r"repeat must be in \[1, 8\], got 9"):
        lookahead.generate(model, ids, 4, method="echo", repeat=9)


def test_the_command_line_takes_the_new_method_and_its_flag(with_echo) -> None:
    from lookahead.cli.main import build_parser
    from lookahead.cli.options import method_options

    parser = build_parser()
    args = parser.parse_args(["generate", "--model", "m", "--method", "echo", "--repeat", "2", "hi"])
    assert method_options(args) == {"repeat": 2}  # only what was given
    generate = parser._subparsers._group_actions[0].choices["generate"]
    repeat = next(a for a in generate._actions if a.dest == "repeat")
    assert repeat.help == "echo: tokens of the text's tail proposed again (default: 3)"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--model", "m", "--method", "echo", "--repeat", "9", "hi"])


def test_the_bench_and_the_server_take_the_new_method(with_echo) -> None:
    from lookahead.bench.methods import MethodOptions, _our_options, bench_methods
    from lookahead.server.app import ServerSettings

    assert "echo" in bench_methods()
    assert _our_options("echo", MethodOptions()) == {"repeat": 3}
    assert ServerSettings(model_name="m", method="echo").method == "echo"
    with pytest.raises(ValueError, match="method must be one of"):
        ServerSettings(model_name="m", method="ech0")
