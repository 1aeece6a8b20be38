"""The quantized kernel's prefetch setting, measured once per model and CPU
(``lookahead.kernels.prefetch``): the fastest setting kept, cached and read back, the same
bits at every setting, and ``load_model`` applying it to a quantized model."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_quant_linear import layer, needs_kernel
from tiny_gguf import write_tiny_gguf

import lookahead
from lookahead.kernels import prefetch
from lookahead.kernels.prefetch import (
    KERNEL_DEFAULT,
    SETTINGS,
    Prefetch,
    choose_prefetch,
    measure_prefetch,
    prefetch_path,
    quant_layers,
    set_prefetch,
)


class Clocked:
    """Stands for a QuantLinear: a call moves ``clock`` on by the cost of its setting."""

    def __init__(self, clock: list[float], cost: dict[Prefetch, float]) -> None:
        self.clock, self.cost, self.in_features = clock, cost, 32
        self.ahead, self.near = 4096, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.clock[0] += self.cost[Prefetch(self.ahead, self.near)] * x.shape[0]
        return x


def test_the_fastest_setting_is_kept_and_the_layers_left_as_they_were() -> None:
    for fastest in (Prefetch(1024), Prefetch(3072), Prefetch(4096, 512)):
        clock = [0.0]
        cost = {p: 1.0 if p == fastest else 1.3 for p in SETTINGS}
        layers = [Clocked(clock, cost) for _ in range(3)]
        measured = measure_prefetch(layers, clock=lambda: clock[0])
        assert measured["setting"] == fastest
        # a setting's time: 3 layers, a pass of each of ROWS
        rows = sum(prefetch.ROWS)
        assert measured["seconds"][fastest] == pytest.approx(3 * rows * 1.0)
        assert measured["seconds"][Prefetch(4096)] == pytest.approx(3 * rows * 1.3)
        assert all((layer.ahead, layer.near) == (4096, 0) for layer in layers)
    # Within TOLERANCE of the fastest, the first listed is kept.
    clock = [0.0]
    near = 1.0 + prefetch.TOLERANCE / 2
    cost = {p: 1.3 for p in SETTINGS} | {Prefetch(2048): near, Prefetch(4096, 512): 1.0}
    layers = [Clocked(clock, cost) for _ in range(3)]
    assert measure_prefetch(layers, clock=lambda: clock[0])["setting"] == Prefetch(2048)


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="layers: expected at least one QuantLinear"):
        measure_prefetch([])
    with pytest.raises(ValueError, match="settings: expected Prefetch settings"):
        measure_prefetch([Clocked([0.0], {})], settings=(-1,))
    with pytest.raises(ValueError, match="setting: expected a Prefetch, got 'far'"):
        set_prefetch(torch.nn.Linear(2, 2), "far")
    with pytest.raises(ValueError, match="ahead: expected a whole number of bytes >= 0, "
                                         "got -1"):
        Prefetch(-1)
    with pytest.raises(ValueError, match=r"near: expected fewer bytes than ahead \(512\), "
                                         "got 1024"):
        Prefetch(512, 1024)
    assert str(Prefetch(2048)) == "2048" and str(Prefetch(4096, 512)) == "4096 to L2, 512 to L1"


class Holder(torch.nn.Module):
    """A model of a few quantized layers, named as a loaded model is."""

    def __init__(self, name: str = "holder") -> None:
        super().__init__()
        self.name_or_path = name
        self.layers = torch.nn.ModuleList(
            [layer(Q.Q4_K, 64, 256, seed=i) for i in range(3)])


@needs_kernel
def test_every_setting_gives_the_same_bits() -> None:
    model = Holder()
    x = torch.randn(5, 256)
    expected = [m(x) for m in model.layers]
    for setting in (Prefetch(0), Prefetch(64), Prefetch(65536), Prefetch(65536, 64),
                    Prefetch(128, 64), *SETTINGS):
        set_prefetch(model, setting)
        assert all((m.ahead, m.near) == (setting.ahead, setting.near)
                   for m in quant_layers(model))
        assert all(torch.equal(m(x), e) for m, e in zip(model.layers, expected)), setting
        assert prefetch.prefetch_of(model) == setting
    layer = model.layers[0]
    with pytest.raises(RuntimeError, match="near: expected 0 or fewer bytes than distance"):
        layer.near = layer.ahead
        layer(x)


@needs_kernel
def test_measured_once_cached_and_read_back(tmp_path, monkeypatch, caplog) -> None:
    model = Holder()
    assert choose_prefetch(model, tmp_path) == (None, KERNEL_DEFAULT)  # small: not measured
    assert not (tmp_path / "prefetch").exists()
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 0)
    setting, source = choose_prefetch(model, tmp_path, cpu="CPU A", threads=2)
    path = prefetch_path("holder", "CPU A", 2, model.layers[0].isa, tmp_path)
    assert source == f"measured: {path}" and setting in SETTINGS
    cached = json.loads(path.read_text())
    assert Prefetch(cached["ahead"], cached["near"]) == setting
    assert prefetch.prefetch_of(model) == setting

    def not_again(*args, **kwargs):
        raise AssertionError("measured again")

    # Read back: another model object of the same name takes the cached setting.
    path.write_text(json.dumps(cached | dict(ahead=96, near=32)))
    with monkeypatch.context() as patch:
        patch.setattr(prefetch, "measure_prefetch", not_again)
        again = Holder()
        assert choose_prefetch(again, tmp_path, cpu="CPU A", threads=2)[0] == Prefetch(96, 32)
        assert all((m.ahead, m.near) == (96, 32) for m in quant_layers(again))
    # Another CPU, thread count or model: its own file.
    choose_prefetch(Holder(), tmp_path, cpu="CPU B", threads=2)
    choose_prefetch(Holder(), tmp_path, cpu="CPU A", threads=1)
    choose_prefetch(Holder("other"), tmp_path, cpu="CPU A", threads=2)
    assert len(list((tmp_path / "prefetch").glob("*.json"))) == 4
    # A file that cannot be read is measured again, with a warning.
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="lookahead.kernels.prefetch"):
        setting, _ = choose_prefetch(Holder(), tmp_path, cpu="CPU A", threads=2)
    assert "cannot be read" in caplog.text and setting in SETTINGS
    assert json.loads(path.read_text())["ahead"] == setting.ahead


@needs_kernel
def test_load_model_sets_a_quantized_model_to_the_measured_distance(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", (Q.Q4_1, Q.Q8_0), hidden=64)
    model, _ = lookahead.load_model(path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "prefetch").exists()  # a tiny model: not measured
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 0)
    monkeypatch.setattr(prefetch, "measure_prefetch", lambda layers: dict(
        setting=Prefetch(64, 32), seconds={Prefetch(64, 32): 1.0}))
    model, _ = lookahead.load_model(path, cache_dir=tmp_path / "cache")
    assert {(m.ahead, m.near) for m in quant_layers(model)} == {(64, 32)}
    assert len(list((tmp_path / "cache" / "prefetch").glob("*.json"))) == 1
    # the fused layers call the kernel with the new distance too, and the logits stay
    calls = [args for module in model.modules() for entry in getattr(module, "_calls", ())
             if isinstance(entry, tuple) for args in entry[1:] if len(args) == 9]
    assert calls and {(args[6], args[8]) for args in calls} == {(64, 32)}
    ids = torch.tensor([[1, 2, 3, 4]])
    set_prefetch(model, Prefetch(4096))
    with torch.inference_mode():
        expected = model(ids).logits
        set_prefetch(model, Prefetch(64, 32))
        assert torch.equal(model(ids).logits, expected)
