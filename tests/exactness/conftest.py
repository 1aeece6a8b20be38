"""Fixtures of the exactness tests (the cases themselves are in tests/tiny.py)."""

from __future__ import annotations

import pytest
from tiny import MODEL_CASES, NEW_TOKENS, prompts_for, reference


@pytest.fixture(scope="module")
def case_data(tiny_lm):
    """Per model case: the model, its two draft models, prompts and references (cached)."""
    cache = {}

    def get(case: str):
        if case not in cache:
            family, attn, overrides = MODEL_CASES[case]
            model = tiny_lm(family, seed=0, attn=attn, **overrides)
            other = tiny_lm(family, seed=1, attn=attn, **overrides)
            # The reference is transformers' own attention, whatever ours runs on.
            stock = tiny_lm(family, seed=0, attn="sdpa" if attn == "grouped" else attn,
                            **overrides)
            prompts = prompts_for(stock)
            refs = {name: reference(stock, ids, NEW_TOKENS) for name, ids in prompts.items()}
            cache[case] = (model, {"self": model, "other": other}, prompts, refs)
        return cache[case]

    return get
