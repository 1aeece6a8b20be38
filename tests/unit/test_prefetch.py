"""The quantized kernel's prefetch distance, measured once per model and CPU
(``lookahead.kernels.prefetch``): the fastest distance kept, cached and read back, the same
bits at every distance, and ``load_model`` applying it to a quantized model."""

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
    choose_prefetch,
    measure_distance,
    prefetch_path,
    quant_layers,
    set_prefetch,
)


class Clocked:
    """Stands for a QuantLinear: a call moves ``clock`` on by ``cost[self.ahead]``."""

    def __init__(self, clock: list[float], cost: dict[int, float]) -> None:
        self.clock, self.cost, self.in_features, self.ahead = clock, cost, 32, 4096

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.clock[0] += self.cost[self.ahead] * x.shape[0]
        return x


def test_the_fastest_distance_is_kept_and_the_layers_left_as_they_were() -> None:
    for fastest in (1024, 2048, 3072):
        clock = [0.0]
        cost = {d: 1.0 if d == fastest else 1.3 for d in (1024, 2048, 3072, 4096)}
        layers = [Clocked(clock, cost) for _ in range(3)]
        measured = measure_distance(layers, clock=lambda: clock[0])
        assert measured["distance"] == fastest
        # a distance's time: 3 layers, a pass of each of ROWS
        rows = sum(prefetch.ROWS)
        assert measured["seconds"][fastest] == pytest.approx(3 * rows * 1.0)
        assert measured["seconds"][4096] == pytest.approx(3 * rows * 1.3)
        assert all(layer.ahead == 4096 for layer in layers)
    # Within TOLERANCE of the fastest, the shortest distance is kept.
    clock = [0.0]
    near = 1.0 + prefetch.TOLERANCE / 2
    cost = {1024: 1.3, 2048: near, 3072: 1.0, 4096: 1.0}
    layers = [Clocked(clock, cost) for _ in range(3)]
    assert measure_distance(layers, clock=lambda: clock[0])["distance"] == 2048


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="layers: expected at least one QuantLinear"):
        measure_distance([])
    with pytest.raises(ValueError, match="distances: expected byte counts >= 0"):
        measure_distance([Clocked([0.0], {})], distances=(-1,))
    with pytest.raises(ValueError, match="distance: expected a whole number of bytes >= 0, "
                                         "got 'far'"):
        set_prefetch(torch.nn.Linear(2, 2), "far")


class Holder(torch.nn.Module):
    """A model of a few quantized layers, named as a loaded model is."""

    def __init__(self, name: str = "holder") -> None:
        super().__init__()
        self.name_or_path = name
        self.layers = torch.nn.ModuleList(
            [layer(Q.Q4_K, 64, 256, seed=i) for i in range(3)])


@needs_kernel
def test_every_distance_gives_the_same_bits() -> None:
    model = Holder()
    x = torch.randn(5, 256)
    expected = [m(x) for m in model.layers]
    for distance in (0, 64, 1024, 2048, 3072, 4096, 65536):
        set_prefetch(model, distance)
        assert all(m.ahead == distance for m in quant_layers(model))
        assert all(torch.equal(m(x), e) for m, e in zip(model.layers, expected)), distance


@needs_kernel
def test_measured_once_cached_and_read_back(tmp_path, monkeypatch, caplog) -> None:
    model = Holder()
    assert choose_prefetch(model, tmp_path) == (None, KERNEL_DEFAULT)  # small: not measured
    assert not (tmp_path / "prefetch").exists()
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 0)
    distance, source = choose_prefetch(model, tmp_path, cpu="CPU A", threads=2)
    path = prefetch_path("holder", "CPU A", 2, model.layers[0].isa, tmp_path)
    assert source == f"measured: {path}" and distance in prefetch.DISTANCES
    assert json.loads(path.read_text())["distance"] == distance
    assert all(m.ahead == distance for m in quant_layers(model))

    def not_again(*args, **kwargs):
        raise AssertionError("measured again")

    # Read back: another model object of the same name takes the cached distance.
    path.write_text(path.read_text().replace(f'"distance": {distance}', '"distance": 64'))
    with monkeypatch.context() as patch:
        patch.setattr(prefetch, "measure_distance", not_again)
        again = Holder()
        assert choose_prefetch(again, tmp_path, cpu="CPU A", threads=2)[0] == 64
        assert all(m.ahead == 64 for m in quant_layers(again))
    # Another CPU, thread count or model: its own file.
    choose_prefetch(Holder(), tmp_path, cpu="CPU B", threads=2)
    choose_prefetch(Holder(), tmp_path, cpu="CPU A", threads=1)
    choose_prefetch(Holder("other"), tmp_path, cpu="CPU A", threads=2)
    assert len(list((tmp_path / "prefetch").glob("*.json"))) == 4
    # A file that cannot be read is measured again, with a warning.
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="lookahead.kernels.prefetch"):
        distance, _ = choose_prefetch(Holder(), tmp_path, cpu="CPU A", threads=2)
    assert "cannot be read" in caplog.text and distance in prefetch.DISTANCES
    assert json.loads(path.read_text())["distance"] == distance


@needs_kernel
def test_load_model_sets_a_quantized_model_to_the_measured_distance(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", (Q.Q4_1, Q.Q8_0), hidden=64)
    model, _ = lookahead.load_model(path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "prefetch").exists()  # a tiny model: not measured
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 0)
    monkeypatch.setattr(prefetch, "measure_distance",
                        lambda layers: dict(distance=64, seconds={64: 1.0}))
    model, _ = lookahead.load_model(path, cache_dir=tmp_path / "cache")
    assert {m.ahead for m in quant_layers(model)} == {64}
    assert len(list((tmp_path / "cache" / "prefetch").glob("*.json"))) == 1
    # the fused layers call the kernel with the new distance too, and the logits stay
    calls = [args for module in model.modules() for entry in getattr(module, "_calls", ())
             if isinstance(entry, tuple) for args in entry[1:] if len(args) == 8]
    assert calls and {args[6] for args in calls} == {64}
    ids = torch.tensor([[1, 2, 3, 4]])
    set_prefetch(model, 4096)
    with torch.inference_mode():
        expected = model(ids).logits
        set_prefetch(model, 64)
        assert torch.equal(model(ids).logits, expected)
