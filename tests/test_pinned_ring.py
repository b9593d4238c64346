"""runtime.pinned_ring's bookkeeping (the ring of pinned host memory uploads go through): spans in
order, busy until their copy ran, reused after it, never handed out twice at once."""
from ostinato.runtime.pinned_ring import RingSpans


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
