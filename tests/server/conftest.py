"""Fixtures of the server tests: the served tiny model and its tokenizer (``tests/tiny.py``)."""

from __future__ import annotations

import pytest
from tiny import server_llama, server_tokenizer


@pytest.fixture(scope="module")
def model():
    return server_llama()


@pytest.fixture(scope="module")
def tokenizer():
    return server_tokenizer()
