"""What a first run shows: one line naming the ``pip install`` of a missing extra, the hub's
download bars left on, and ``serve``'s ready line."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request

import pytest
import torch
from tiny import save_tiny_chat_model

from lookahead.cli.loading import quiet_loading_bars
from lookahead.cli.main import main, missing_extra


@pytest.mark.parametrize(("argv", "module", "extra"), [
    (["serve", "--model", "smollm2-135m"], "uvicorn", "server"),
    (["loadtest", "--url", "http://127.0.0.1:9"], "httpx", "server"),
    (["bench", "--model", "smollm2-135m"], "matplotlib", "bench"),
    (["tune", "--model", "smollm2-135m"], "matplotlib", "bench"),
])
def test_a_missing_extra_is_one_line_naming_its_pip_install(argv, module, extra, capsys,
                                                            monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # its import fails, find_spec finds none
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"lookahead {argv[0]} needs the {extra} extra ({module} is not installed): "
                   f'pip install "lookahead-exact[{extra}]"')


def test_an_extra_module_failing_while_the_command_runs_is_reported_alike(capsys,
                                                                          monkeypatch) -> None:
    """Past the check at the start: the server's module imports one the check does not name
    (fastapi.responses) and fails there."""
    monkeypatch.setitem(sys.modules, "fastapi.responses", None)
    monkeypatch.delitem(sys.modules, "lookahead.server.app", raising=False)
    assert main(["serve", "--model", "smollm2-135m"]) == 2
    assert 'pip install "lookahead-exact[server]"' in capsys.readouterr().err


def test_help_and_other_missing_modules_are_not_an_extra(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(SystemExit) as info:  # help still answers without the extra
        main(["serve", "--help"])
    assert info.value.code == 0
    assert missing_extra("serve", "torch") is None  # not the extra's: a real error
    assert missing_extra("generate", "uvicorn") is None  # generate needs no extra
    assert missing_extra("serve", "uvicorn.config") is not None


def test_loading_keeps_the_hub_download_bars(monkeypatch) -> None:
    from huggingface_hub.utils import (are_progress_bars_disabled, disable_progress_bars,
                                       enable_progress_bars)
    from transformers.utils import logging as transformers_logging

    enable_progress_bars()
    try:
        quiet_loading_bars()
        assert not are_progress_bars_disabled()  # downloads show their bar
        assert not transformers_logging.is_progress_bar_enabled()  # a load's bar is off
        disable_progress_bars()  # a hub switched off (HF_HUB_DISABLE_PROGRESS_BARS) stays off
        quiet_loading_bars()
        assert are_progress_bars_disabled()
    finally:
        enable_progress_bars()
        transformers_logging.enable_progress_bar()


def test_serve_says_when_it_is_ready(tmp_path, capsys) -> None:
    """The ready line names model, URL, kernel and method, on stderr at the default level."""
    folder = save_tiny_chat_model(tmp_path / "tiny")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    healthy = {}

    def client() -> None:
        try:
            deadline = time.monotonic() + 60
            while "status" not in healthy and time.monotonic() < deadline:
                try:
                    healthy.update(json.load(urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/health")))
                except OSError:
                    time.sleep(0.05)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    threads = torch.get_num_threads()
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        assert main(["serve", "--model", str(folder), "--dtype", "float64", "--no-warmup",
                     "--method", "prompt_lookup", "--port", str(port)]) == 0
    finally:
        torch.set_num_threads(threads)
    thread.join(10)
    assert healthy.get("status") == "ok"
    ready = [line for line in capsys.readouterr().err.splitlines() if "ready" in line]
    assert ready == [f"lookahead serve: ready: {folder} on http://127.0.0.1:{port} "
                     "(kernel plain, method prompt_lookup)"]
