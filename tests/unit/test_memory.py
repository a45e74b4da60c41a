"""honing.train.memory: per-phase peak RSS and handing freed memory back to the OS."""

from __future__ import annotations

import sys

import pytest

from honing.train import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM / clear_refs are Linux")


@linux
def test_peak_window_resets_after_a_large_allocation() -> None:
    block = bytearray(200 * 2**20)  # touched: 200 MB resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    high = memory.peak_rss_mb()
    assert high >= 200
    del block
    assert memory.reset_peak()
    assert memory.peak_rss_mb() < high - 150  # the new window does not remember the freed block


@linux
def test_current_rss_is_below_the_peak() -> None:
    now = memory.rss_mb()
    assert now is not None and 0 < now <= memory.peak_rss_mb() + 1


@linux
def test_release_gives_back_freed_heap_memory() -> None:
    if memory._malloc_trim() is None:
        pytest.skip("the C library has no malloc_trim")
    # many mid-sized blocks (below glibc's mmap threshold, so they live on the heap), every other
    # one freed: without a trim the freed holes stay resident
    keep, drop = [], []
    for i in range(4000):
        b = bytearray(64 * 1024)
        b[::4096] = b"\x01" * len(b[::4096])
        (keep if i % 2 else drop).append(b)
    drop.clear()
    before = memory.rss_mb()
    assert memory.release_free_memory()
    after = memory.rss_mb()
    assert before is not None and after is not None
    assert after < before - 50, (before, after)  # ~125 MB of holes handed back
    del keep
