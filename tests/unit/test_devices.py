"""``device``: checked before anything loads, named in every error; models move there once loaded.

These tests run on the CPU: a CUDA device is asked for only where this machine has none, to
see the refusal, or with ``torch.cuda.is_available`` faked, to see what is checked before
any weights would move.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import save_tiny_chat_model

import lookahead
from lookahead.request import make_decoder
from lookahead.cli.main import main
from lookahead.devices import resolve_device

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-device-llama"))


def test_resolve_device_accepts_the_cpu_and_none():
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("device", ["gpu0", "cuda:x", 3.5])
def test_a_malformed_device_is_refused_by_name(device):
    with pytest.raises(ValueError, match="my_device"):
        resolve_device(device, "my_device")


@NO_CUDA
def test_cuda_without_cuda_is_refused_by_name():
    with pytest.raises(ValueError, match="device 'cuda'.*no cuda"):
        resolve_device("cuda")


@NO_CUDA
def test_load_model_refuses_cuda_here_before_loading(tiny_folder):
    with pytest.raises(ValueError, match="device"):
        lookahead.load_model(tiny_folder, dtype="float64", device="cuda")


def test_load_model_refuses_packed_weights_off_the_cpu(tiny_folder, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="packed_weights.*CPU"):
        lookahead.load_model(tiny_folder, dtype="bfloat16", device="cuda", packed_weights=True)


def test_load_model_on_the_cpu_generates(tiny_folder):
    model, tokenizer = lookahead.load_model(tiny_folder, dtype="float64", device="cpu")
    assert model.device.type == "cpu"
    ids = tokenizer("the cache key", return_tensors="pt")["input_ids"]
    result = lookahead.generate(model, ids, max_new_tokens=6)
    assert result.new_tokens.shape == (1, 6)


def test_the_sampling_generator_lives_on_the_models_device(tiny_folder):
    model, _ = lookahead.load_model(tiny_folder, dtype="float64")
    decoder = make_decoder(model, torch.tensor([[5, 6, 7]]), 4, "lookahead", do_sample=True,
                           seed=1)
    assert decoder.generator.device == model.device


@NO_CUDA
@pytest.mark.parametrize("command", [["generate", "--model", "no-such-model", "hi"],
                                     ["chat", "--model", "no-such-model"],
                                     ["serve", "--model", "no-such-model"]])
def test_device_flag_is_checked_before_the_model_loads(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([*command, "--device", "cuda"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device" in err and "no-such-model" not in err.splitlines()[-1]


@NO_CUDA
@pytest.mark.parametrize("command", ["bench", "tune"])
def test_bench_and_tune_name_the_device_flag(capsys, command):
    assert main([command, "--model", "no-such-model", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device" in err[0]


def test_device_flag_reaches_the_model(tiny_folder, capsys):
    code = main(["generate", "--model", str(tiny_folder), "--dtype", "float64", "--device",
                 "cpu", "--max-new-tokens", "4", "the cache"])
    assert code == 0 and capsys.readouterr().out.strip()
