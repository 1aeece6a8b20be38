"""lookahead.kernels.huge_pages: an arena hands out exact copies, aligned, back to back in
one 2 MiB-aligned buffer, and refuses what does not fit; the quantized loader puts every
layer's records there."""

from __future__ import annotations

import sys

import pytest
import torch

from lookahead.kernels.huge_pages import ALIGN, HUGE_PAGE, Arena, huge_page_buffer


def test_the_arena_hands_out_aligned_copies_back_to_back():
    tensors = [torch.arange(100, dtype=torch.uint8).reshape(10, 10),
               torch.randn(3, 7), torch.randint(0, 255, (5, 64, 33), dtype=torch.uint8)]
    arena = Arena(Arena.size_of((t.shape, t.dtype) for t in tensors))
    copies = [arena.take(t) for t in tensors]
    for tensor, copy in zip(tensors, copies):
        assert torch.equal(copy, tensor) and copy.data_ptr() != tensor.data_ptr()
        assert copy.is_contiguous() and copy.data_ptr() % ALIGN == 0
    assert len({c.untyped_storage().data_ptr() for c in copies}) == 1
    with pytest.raises(ValueError, match="do not fit"):
        arena.take(torch.zeros(1, dtype=torch.uint8))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are Linux's")
def test_the_buffer_starts_on_a_huge_page_and_outlives_its_name():
    buffer = huge_page_buffer(3 * HUGE_PAGE + 5)
    assert buffer.numel() == 3 * HUGE_PAGE + 5 and buffer.data_ptr() % HUGE_PAGE == 0
    view = buffer[10:20]
    del buffer
    view.fill_(7)  # the mapping is alive while a view is
    assert view.sum().item() == 70
    with pytest.raises(ValueError, match="nbytes"):
        huge_page_buffer(-1)
