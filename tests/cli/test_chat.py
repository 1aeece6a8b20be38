"""``lookahead chat`` driven in a pseudo-terminal, as a person would use it (with pexpect), and
Ctrl-C in ``lookahead generate``."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

# The same tiny model and tokenizer as test_cli (tests/tiny.py: pytest's default "prepend"
# import mode puts tests/ on sys.path).
from tiny import save_tiny_chat_model  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STATS = re.compile(r"(\d+) tokens, [\d.]+ s, [\d.]+ tokens/s, ([\d.]+) tokens/step")
PROMPT = ">>>"
TIMEOUT = 90  # starting Python with torch and transformers takes a few seconds, more when busy


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """The commands run here keep their cache (the step costs measured at first use) in a
    folder of their own, not the user's; PyTorch's compiled kernels stay where they are."""
    from torch.utils import cpp_extension

    folder = tmp_path_factory.mktemp("cache-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", cpp_extension._get_build_directory("", False))
        patch.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    # A long context, so that an answer can run long enough to be interrupted.
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"), max_positions=1 << 16)


def spawn_lookahead(command: str, folder: Path, *extra: str):
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200", LINES="50")
    argv = ["-m", "lookahead", command, "--model", str(folder), "--dtype", "float64", *extra]
    # A Ctrl-C at a terminal: the child's SIGINT as a shell's foreground job has it. A test run
    # started in the background (``pytest &``) ignores SIGINT, and a child inherits that.
    return pexpect.spawn(
        sys.executable, argv, env=env, encoding="utf-8", timeout=TIMEOUT, dimensions=(50, 200),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def spawn_chat(folder: Path, *extra: str):
    child = spawn_lookahead("chat", folder, *extra)
    child.expect_exact(PROMPT)
    return child


def plain(text: str) -> str:
    return ANSI.sub("", text)


def test_chat_streams_answers_with_stats_resets_and_quits(tiny_folder, private_cache) -> None:
    child = spawn_chat(tiny_folder, "--debug", "--max-new-tokens", "24")
    try:
        child.sendline("hello world")
        child.expect(STATS)
        answer = plain(child.before).split("hello world", 1)[-1]  # after the echoed input
        tokens, tokens_per_step = int(child.match.group(1)), float(child.match.group(2))
        assert tokens == 24  # the tiny model has no EOS: it writes the whole budget
        assert tokens_per_step >= 1.0
        assert answer.strip()
        child.expect_exact(PROMPT)

        child.sendline("one two three one two three")  # a second turn on top of the first
        child.expect(STATS)
        if float(child.match.group(2)) > 1.0:  # steps that committed several tokens: blue
            assert "\x1b[34m" in child.before
        child.expect_exact(PROMPT)

        child.sendline("/reset")
        child.expect_exact("conversation cleared")
        child.expect_exact(PROMPT)

        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    # the step costs its lookahead measured at first use went to the private cache
    assert list((private_cache / "lookahead" / "step_costs").glob("*tiny-chat*.json"))


def test_ctrl_c_stops_the_answer_then_ctrl_c_at_the_prompt_leaves(tiny_folder) -> None:
    # 60 000 tokens would take minutes: the answer is surely still running when Ctrl-C comes.
    argv = ("--debug", "--method", "autoregressive", "--max-new-tokens", "60000")
    child = spawn_chat(tiny_folder, *argv)
    try:
        child.sendline("hello")
        child.expect(r"\w+ \w+ \w+ \w+")  # the answer is streaming
        child.sendintr()
        child.expect_exact("(stopped)")
        child.expect(STATS)  # the statistics of the part that was written
        assert float(child.match.group(2)) == 1.0  # one token per step, none in blue
        assert "\x1b[34m" not in child.before
        child.expect_exact(PROMPT)  # still chatting
        # At once: a Ctrl-C that lands before the chat blocks reading must not be lost.
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_ctrl_d_at_the_prompt_leaves(tiny_folder) -> None:
    child = spawn_chat(tiny_folder)
    try:
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_ctrl_c_during_an_answer_sets_a_flag_then_raises_and_the_handler_is_restored() -> None:
    from lookahead.cli.chat import ctrl_c_requests_stop

    before = signal.getsignal(signal.SIGINT)
    with ctrl_c_requests_stop() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler at the next bytecode
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # a few bytecodes for the handler to run in
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_stops_generate_with_status_130_and_no_traceback(tiny_folder) -> None:
    child = spawn_lookahead("generate", tiny_folder, "--max-new-tokens", "60000", "hello")
    try:
        child.expect(r"\w+ \w+ \w+ \w+")  # the completion is streaming
        child.sendintr()
        child.expect_exact("lookahead generate: interrupted")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "Traceback" not in child.before
    assert child.exitstatus == 130
