"""Giving the heap's freed memory back to the operating system."""

from __future__ import annotations

import ctypes


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc keeps freed mid-sized blocks otherwise, so
    the resident size would stay at its peak after a burst of long requests)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc
        return None
