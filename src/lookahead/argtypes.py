"""Checked argument types shared by every command-line parser (the ``lookahead`` subcommands
and the load generator), and the error a bad command line raises after parsing.

Imports nothing of lookahead: the parsers of ``cli``, ``bench`` and ``server`` all use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


class UsageError(Exception):
    """A bad command line found after parsing; ``option`` is the flag to blame, e.g. "--window"."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"argument {option}: {message}")
        self.option = option


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting an int in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value

    parse.__name__ = "int"
    return parse


def float_in(low: float, high: float, *, low_open: bool = False,
             high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a number in the interval from ``low`` to ``high`` (ends open or not)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (above and below):
            interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {value}")
        return value

    parse.__name__ = "float"
    return parse
