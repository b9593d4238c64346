"""runtime.pinned_ring's bookkeeping (the ring of pinned host memory uploads go through): spans in
order, busy until their copy ran, reused after it, never handed out twice at once; the staging copy."""
import pytest
import torch

from ostinato.runtime.pinned_ring import RingSpans, copy_on_this_thread


class Copies:
    """Stand-ins for the copies' events: each span's copy has run once ``finish`` says so."""

    def __init__(self):
        self.finished = set()

    def done(self, name):
        return lambda: name in self.finished


def test_spans_follow_each_other_and_stay_busy_until_their_copy_ran():
    copies, ring = Copies(), RingSpans(1024)
    assert ring.claim(256, copies.done("a")) == 0
    assert ring.claim(512, copies.done("b")) == 256
    assert ring.claim(512, copies.done("c")) is None  # 768..1280 runs past the end; 0..512 is busy
    copies.finished.add("a")
    assert ring.claim(256, copies.done("c")) == 768  # the tail still fits
    assert ring.claim(256, copies.done("d")) == 0  # wrapped onto a's span, free again
    assert ring.claim(256, copies.done("e")) is None  # 256..512 is b's, still busy
    assert ring.busy == 3


def test_a_span_finished_early_is_retired_with_the_older_ones():
    copies, ring = Copies(), RingSpans(1024)
    ring.claim(512, copies.done("a"))
    ring.claim(512, copies.done("b"))
    copies.finished.add("b")  # the oldest, a, still runs: b's span is not handed out yet
    assert ring.claim(512, copies.done("c")) is None
    copies.finished.add("a")
    assert ring.claim(1024, copies.done("c")) == 0  # all free: the ring starts over, whole


def test_sizes_the_ring_cannot_hold_are_refused():
    ring = RingSpans(1024)
    assert ring.claim(2048, lambda: True) is None
    assert ring.claim(0, lambda: True) is None
    assert ring.busy == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_staging_copy_gives_the_source_s_values(dtype):
    # 300K elements: past the size at which torch.copy_ would split the copy over threads
    src = (torch.arange(300_000) % 251 - 125).to(dtype).reshape(3, 100_000)
    dst = torch.zeros_like(src)
    copy_on_this_thread(dst, src)
    assert torch.equal(dst, (torch.arange(300_000) % 251 - 125).to(dtype).reshape(3, 100_000))


def test_a_staging_copy_of_a_strided_or_other_dtype_source_converts_as_copy_does():
    src = torch.arange(60, dtype=torch.float64).reshape(6, 10)[:, ::2]  # not contiguous, and float64
    dst = torch.empty(6, 5, dtype=torch.float32)
    copy_on_this_thread(dst, src)
    assert torch.equal(dst, torch.arange(60, dtype=torch.float32).reshape(6, 10)[:, ::2])
