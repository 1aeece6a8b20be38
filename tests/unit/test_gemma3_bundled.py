"""The bundled Gemma 3 270M on the quantized path: sliding-window layers, greedy equality.

Needs its packages (``lookahead install-model gemma3-270m``); skipped without them.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import lookahead
from lookahead.models.load import load_model
from lookahead.models.registry import get_model_spec

_SPEC = get_model_spec("gemma3-270m")
_INSTALLED = all(importlib.util.find_spec(p.replace("-", "_")) for p in _SPEC.packages)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _INSTALLED, reason=_SPEC.install_hint())]

# 600+ tokens: past the 512-token window of its sliding-window layers.
_PARAGRAPH = ("The history of computing is a story of people who wanted machines to do "
              "arithmetic for them. Charles Babbage designed engines of gears, Ada Lovelace wrote "
              "programs for them, and a century later electronic computers filled whole rooms. ")


@pytest.fixture(scope="module")
def gemma3():
    model, tokenizer = load_model("gemma3-270m")
    assert type(model).__name__ == "Gemma3ForCausalLM"
    return model, tokenizer


@pytest.mark.parametrize("prompt", ["def fibonacci(n):\n    ",
                                    _PARAGRAPH * 14 + "In summary, the history of computing"])
def test_every_method_writes_autoregressive_text(gemma3, prompt) -> None:
    model, tokenizer = gemma3
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    expected = lookahead.generate(model, ids, 24, "autoregressive").sequences
    for method in ("lookahead", "prompt_lookup"):
        assert lookahead.generate(model, ids, 24, method).sequences.tolist() == expected.tolist()


def test_the_quantized_model_writes_the_dequantised_model_s_text(gemma3) -> None:
    model, tokenizer = gemma3
    dequantised, _ = load_model("gemma3-270m", "float32", quantized=False)
    ids = tokenizer("def fibonacci(n):\n    ", return_tensors="pt")["input_ids"]
    texts = [tokenizer.decode(m.generate(ids, max_new_tokens=12, do_sample=False,
                                         attention_mask=torch.ones_like(ids))[0, ids.shape[1]:])
             for m in (model, dequantised)]
    assert texts[0] == texts[1]
