"""Step graphs on CUDA: capture, replay, buckets sharing one pool, input checks, capture fallback."""
import warnings

import pytest
import torch

from ostinato.errors import GraphInputError
from ostinato.runtime import DeviceState, StepGraph

pytestmark = pytest.mark.gpu


def _toy(device):
    """A step that reads a static input and accumulates into persistent state, with a matmul."""
    st = DeviceState(device)
    acc = st.allocate("acc", (8, 16), torch.float32)
    weight = torch.randn(16, 16, device=device)
    calls = {"n": 0}

    def step(rows, x):
        calls["n"] += 1
        acc[:rows].add_(torch.tanh(x @ weight))
        return acc[:rows].sum(dim=-1)

    return st, acc, weight, step, calls


def test_capture_replay_matches_eager():
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device, use_graphs=True, warmup=3)
    x0 = torch.randn(4, 16, device=device)
    graph.capture(4, x=x0)
    assert graph.is_captured(4) and graph.mode(4) == "graph"
    assert calls["n"] == 4  # 3 warm-up runs + 1 captured
    acc.zero_()
    expected = torch.zeros(4, 16, device=device)
    for _ in range(5):
        x = torch.randn(4, 16, device=device)
        out = graph(4, x=x)
        expected += torch.tanh(x @ weight)
    torch.cuda.synchronize()
    assert calls["n"] == 4  # replays never call Python again
    torch.testing.assert_close(acc[:4], expected)
    torch.testing.assert_close(out, expected.sum(-1))
    assert acc[4:].abs().sum().item() == 0
    graph.capture(2, x=x0[:2])  # a later bucket: its one warm-up run does the new shape's first run
    assert calls["n"] == 4 + 1 + 1
    acc.zero_()
    x = torch.randn(2, 16, device=device)
    torch.testing.assert_close(graph(2, x=x), torch.tanh(x @ weight).sum(-1))


def test_buckets_share_one_pool_and_state():
    device = torch.device("cuda")
    st, acc, weight, step, _ = _toy(device)
    graph = StepGraph(step, device)
    address = acc.data_ptr()
    for rows in (8, 4, 2, 1):  # largest first
        graph.capture(rows, x=torch.randn(rows, 16, device=device))
    assert sorted(graph.captured_keys()) == [1, 2, 4, 8]
    assert graph.pool is not None
    acc.zero_()
    x = torch.randn(2, 16, device=device)
    graph(2, x=x)
    torch.cuda.synchronize()
    torch.testing.assert_close(acc[:2], torch.tanh(x @ weight))
    assert acc.data_ptr() == address


def test_mismatched_inputs_raise_and_do_not_replay():
    device = torch.device("cuda")
    st, acc, weight, step, _ = _toy(device)
    graph = StepGraph(step, device)
    graph.capture(4, x=torch.randn(4, 16, device=device))
    acc.zero_()
    for bad in (
        torch.randn(3, 16, device=device),  # shape
        torch.randn(4, 16, device=device, dtype=torch.float64),  # dtype
        torch.randn(4, 16),  # device
    ):
        with pytest.raises(GraphInputError, match="captured for"):
            graph(4, x=bad)
    with pytest.raises(GraphInputError, match="do not match"):
        graph(4, y=torch.randn(4, 16, device=device))
    torch.cuda.synchronize()
    assert acc.abs().sum().item() == 0  # nothing ran


def test_capture_failure_falls_back_to_eager_with_one_warning():
    device = torch.device("cuda")
    state = torch.zeros(4, device=device)

    def step(rows, x):
        # A host sync: legal eagerly, illegal inside a capture.
        if x.sum().item() > -1e9:
            state[:rows].add_(x)
        return state[:rows]

    graph = StepGraph(step, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph(4, x=torch.ones(4, device=device))
        graph(4, x=torch.ones(4, device=device))
    assert graph.mode(4) == "eager"
    assert len([w for w in caught if "capture" in str(w.message)]) == 1
    # Warm-up ran the step for real before the capture failed; results are still computed eagerly.
    state.zero_()
    graph(4, x=torch.full((4,), 2.0, device=device))
    torch.cuda.synchronize()
    assert state.tolist() == [2.0, 2.0, 2.0, 2.0]
    assert torch.randn(8, device=device).isfinite().all()  # the device's generator still works


@pytest.mark.parametrize("failure", ["raise", "invalidate"])
def test_failure_inside_capture_leaves_device_usable(failure):
    """A step that only breaks while capturing (an uncapturable op): eager fallback, device still sane."""
    device = torch.device("cuda")
    state = torch.zeros(4, device=device)

    def step(rows, x):
        state[:rows].add_(x)
        if torch.cuda.is_current_stream_capturing():
            if failure == "raise":
                raise RuntimeError("operation not supported in a graph")
            torch.cuda.synchronize()  # invalidates the capture
        return state[:rows]

    graph = StepGraph(step, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph(4, x=torch.ones(4, device=device))
    assert graph.mode(4) == "eager"
    assert len([w for w in caught if "capture" in str(w.message)]) == 1
    state.zero_()
    graph(4, x=torch.full((4,), 3.0, device=device))
    torch.cuda.synchronize()
    assert state.tolist() == [3.0] * 4
    # Random ops and later captures still work on this device.
    assert torch.randn(8, device=device).isfinite().all()
    _, acc, weight, toy_step, _ = _toy(device)
    other = StepGraph(toy_step, device)
    other.capture(2, x=torch.randn(2, 16, device=device))
    assert other.mode(2) == "graph"


def test_disabled_graphs_run_eagerly_on_cuda():
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device, use_graphs=False)
    graph(4, x=torch.randn(4, 16, device=device))
    graph(4, x=torch.randn(4, 16, device=device))
    assert calls["n"] == 2 and graph.mode(4) == "eager"


def test_unrolled_steps_per_replay_and_ladder_step_down():
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device, steps_per_replay=4, warmup=2)
    x = torch.randn(4, 16, device=device)
    graph.capture(4, x=x)
    assert calls["n"] == 2 + 4  # warm-up, then four unrolled copies in one graph
    acc.zero_()
    graph(4, x=x)
    torch.cuda.synchronize()
    torch.testing.assert_close(acc[:4], 4 * torch.tanh(x @ weight))
    assert calls["n"] == 6

    # A step that can be captured once but not four times in a row (here: a Python-side limit)
    # steps down to a one-step graph replayed four times per call, with one warning.
    state = torch.zeros(4, device=device)
    in_capture = {"n": 0}

    def fragile(rows, x):
        if torch.cuda.is_current_stream_capturing():
            in_capture["n"] += 1
            if in_capture["n"] > 1:
                raise RuntimeError("simulated: out of memory in the second unrolled step")
        else:
            in_capture["n"] = 0
        state[:rows].add_(x)
        return state[:rows]

    graph = StepGraph(fragile, device, steps_per_replay=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph.capture(4, x=torch.ones(4, device=device))
    assert graph.mode(4) == "graph"
    assert len([w for w in caught if "one-step graph" in str(w.message)]) == 1
    state.zero_()
    graph(4, x=torch.ones(4, device=device))
    torch.cuda.synchronize()
    assert state.tolist() == [4.0] * 4


def test_capture_on_reuse_runs_a_key_eagerly_once_then_captures_it_without_a_warm_up():
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device, capture_on_reuse=True)
    x = torch.randn(4, 16, device=device)
    expected = torch.tanh(x @ weight)
    graph(4, x=x)  # the first call of key 4: eager, its capture deferred
    assert calls["n"] == 1 and graph.mode(4) == "uncaptured"
    graph(4, x=x)  # the second, no spare time having come: captured (the eager call was its warm-up), replayed
    assert calls["n"] == 2 and graph.mode(4) == "graph"
    assert not graph.capture_deferred()  # nothing deferred is left
    graph(4, x=x)  # then replays only
    torch.cuda.synchronize()
    assert calls["n"] == 2
    torch.testing.assert_close(acc[:4], 3 * expected)
    graph(2, x=x[:2])  # another key: eager at its first call again
    assert calls["n"] == 3 and graph.mode(2) == "uncaptured"
    assert graph.capture_deferred()  # spare time: key 2 is captured, running nothing
    assert calls["n"] == 4 and graph.mode(2) == "graph"
    acc.zero_()
    graph(2, x=x[:2])  # and replayed at its second call
    torch.cuda.synchronize()
    assert calls["n"] == 4
    torch.testing.assert_close(acc[:2], expected[:2])


def test_a_warm_step_captures_a_new_key_without_a_warm_up():
    """warm_up_new_shapes=False: the first key warms up (the step runs for real, then is recorded);
    a later key is only recorded, so its first call runs the step exactly once, by its replay."""
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device, warm_up_new_shapes=False)
    x = torch.randn(4, 16, device=device)
    graph(4, x=x)  # warm-up + capture + replay
    assert calls["n"] == 2 and graph.mode(4) == "graph"
    torch.cuda.synchronize()
    acc.zero_()
    graph(2, x=x[:2])  # recorded without a warm-up, then replayed once
    torch.cuda.synchronize()
    assert calls["n"] == 3 and graph.mode(2) == "graph"
    torch.testing.assert_close(acc[:2], torch.tanh(x[:2] @ weight))
    assert torch.equal(acc[2:], torch.zeros_like(acc[2:]))


def test_capture_on_reuse_captures_at_the_first_call_once_the_path_is_warm():
    """mark_warm (the caller ran the step's code itself): a capture_on_reuse key is captured at its
    first call, no eager run and no warm-up, and the replay does the call's work once."""
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device, capture_on_reuse=True, warm_up_new_shapes=False)
    x = torch.randn(4, 16, device=device)
    step(1, x[:1])  # the path has run, at another shape
    graph.mark_warm()
    torch.cuda.synchronize()
    acc.zero_()
    graph(4, x=x)
    torch.cuda.synchronize()
    assert calls["n"] == 2 and graph.mode(4) == "graph" and not graph.capture_deferred()
    torch.testing.assert_close(acc[:4], torch.tanh(x @ weight))


def test_a_capture_without_a_warm_up_that_makes_a_buffer_is_retried_after_one_quietly():
    """A step that makes a persistent buffer at a new shape (the split kernels' arrival counters,
    which must be zeroed for real, not recorded) refuses to inside a capture: the capture without a
    warm-up fails, and the key is warmed up and captured on the same rung, with no warning."""
    from ostinato.ops import triton_support

    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    have = triton_support.arrival_counters(device, 1).numel()
    bigger = have + 1024

    def step_with_counters(rows, x):
        triton_support.arrival_counters(device, bigger)  # more than exist: a new buffer
        return step(rows, x)

    graph = StepGraph(step_with_counters, device, warm_up_new_shapes=False)
    graph.mark_warm()
    x = torch.randn(4, 16, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph(4, x=x)
    torch.cuda.synchronize()
    assert graph.mode(4) == "graph" and calls["n"] == 2  # the warm-up's run and the capture's pass
    counters = triton_support.arrival_counters(device, bigger)
    assert counters.numel() >= bigger and not counters.any()  # made by the warm-up, zeroed for real
    torch.testing.assert_close(acc[:4], 2 * torch.tanh(x @ weight))  # the warm-up's run and the replay


def test_a_deferred_capture_runs_nothing_and_does_not_wait_for_the_device():
    """defer + capture_deferred: the capture records the step while the device is still busy with
    earlier work (no warm-up, no synchronization) and leaves the state as it was; the graph then
    replays the step."""
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device)
    x = torch.randn(4, 16, device=device)
    step(4, x)  # the step has run at these shapes (a deferred capture needs no warm-up)
    graph.defer(4, x=x)
    assert graph.mode(4) == "uncaptured" and calls["n"] == 1
    torch.cuda.synchronize()
    before = acc.clone()
    torch.cuda._sleep(2_000_000_000)  # about a second of device work queued ahead
    assert graph.capture_deferred()
    busy = not torch.cuda.current_stream(device).query()
    assert busy  # the capture came back while the device was still sleeping
    assert graph.mode(4) == "graph" and calls["n"] == 2  # the step's Python ran once, for the capture
    torch.cuda.synchronize()
    assert torch.equal(acc, before)  # nothing ran
    assert not graph.capture_deferred()
    y = torch.randn(4, 16, device=device)
    graph(4, x=y)
    torch.cuda.synchronize()
    torch.testing.assert_close(acc[:4], before[:4] + torch.tanh(y @ weight))
    assert calls["n"] == 2


def test_the_advance_clock_reads_an_advance_s_device_time_without_waiting():
    """AdvanceClock on CUDA: an advance's device time comes from two timing events (none of the
    clock's calls waits for the device); while the next one runs, the time left is that length
    less the host time since its launch; an advance launched with ``measure=False`` is not timed."""
    import time

    from ostinato.runtime import AdvanceClock

    device = torch.device("cuda")
    timer = AdvanceClock(device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    timer.launching()
    torch.cuda._sleep(100_000_000)  # some tens of ms of device work
    timer.launched()
    assert not torch.cuda.current_stream(device).query()  # launching returned before the device finished
    assert timer.seconds_left() == 0.0  # no advance timed yet
    torch.cuda.synchronize()
    host = time.perf_counter() - start
    timer.collected()
    assert 0.5 * host < timer.last_seconds <= host
    timer.launching()
    torch.cuda._sleep(100_000_000)
    timer.launched()
    left = timer.seconds_left()
    assert 0.0 < left <= timer.last_seconds
    torch.cuda.synchronize()
    timer.collected()
    measured = timer.last_seconds
    timer.launching(measure=False)  # (the launch captures a graph first: its host time is not device time)
    torch.cuda._sleep(1_000_000)
    timer.launched()
    torch.cuda.synchronize()
    timer.collected()
    assert timer.last_seconds == measured


def test_a_deferred_key_called_before_its_capture_is_captured_then():
    device = torch.device("cuda")
    st, acc, weight, step, calls = _toy(device)
    graph = StepGraph(step, device)
    x = torch.randn(4, 16, device=device)
    step(4, x)
    graph.defer(4, x=x)
    graph(4, x=x)  # captured now, without a warm-up, and replayed
    assert graph.mode(4) == "graph" and calls["n"] == 2
    assert not graph.capture_deferred()


def _counting_loop(device, target: int, slow: bool = False, **options):
    """A step that counts and accumulates; its guard keeps going while the count is under ``target``.
    ``slow``: each step also spins some 0.1 ms on the device."""
    count = torch.zeros(1, dtype=torch.int64, device=device)
    total = torch.zeros(4, device=device)
    limit = torch.tensor([target], device=device)
    calls = {"n": 0}

    def step(rows, x):
        calls["n"] += 1
        if slow:
            torch.cuda._sleep(200_000)
        count.add_(1)
        total[:rows].add_(x * count)  # depends on the step number: a skipped or repeated step shows
        return total[:rows]

    def guard(rows, entering):
        return count < limit

    graph = StepGraph(step, device, loop_guard=guard, **options)
    graph.calls = calls
    return graph, count, total


def _needs_device_loop():
    from ostinato.runtime import device_loop

    why = device_loop.unavailable_reason("cuda")
    if why is not None:
        pytest.skip(f"no device while-loop here: {why}")


def test_device_loop_runs_until_the_guard_turns_false():
    _needs_device_loop()
    device = torch.device("cuda")
    graph, count, total = _counting_loop(device, target=10, steps_per_replay=3, warmup=1)
    x = torch.ones(4, device=device)
    graph.capture(4, x=x)
    assert graph.rung(4) == "device loop"
    # The step's Python ran twice (the warm-up, then one capture whose graph the body holds 3 times).
    assert graph.calls["n"] == 2
    count.zero_(), total.zero_()
    graph(4, x=x)  # one launch: trips of 3 steps while count < 10 -> 4 trips, 12 steps
    torch.cuda.synchronize()
    assert count.item() == 12
    assert graph.calls["n"] == 2  # a launch runs no Python of the step
    assert total.tolist() == [float(sum(range(1, 13)))] * 4  # 1 + 2 + ... + 12, each step once
    graph(4, x=2 * x)  # the guard is false on entry: no step runs
    torch.cuda.synchronize()
    assert count.item() == 12 and total.tolist() == [78.0] * 4
    count.fill_(5)
    graph(4, x=x)  # 5 -> 8 -> 11
    torch.cuda.synchronize()
    assert count.item() == 11


def test_device_loop_stops_at_its_trip_limit():
    _needs_device_loop()
    device = torch.device("cuda")
    graph, count, _ = _counting_loop(device, target=10**9, steps_per_replay=2, max_loop_trips=5)
    x = torch.ones(4, device=device)
    graph.capture(4, x=x)
    count.zero_()
    graph(4, x=x)
    torch.cuda.synchronize()
    assert count.item() == 10  # 5 trips of 2 steps, though the guard never turned false


def test_device_loop_failure_steps_down_to_unrolled_steps(monkeypatch):
    _needs_device_loop()
    from ostinato.runtime import device_loop

    def broken(self, head, body):
        raise device_loop.DeviceLoopError("simulated: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(device_loop.DeviceLoop, "assemble", broken)
    device = torch.device("cuda")
    graph, count, total = _counting_loop(device, target=10, steps_per_replay=3)
    x = torch.ones(4, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph.capture(4, x=x)
    assert graph.rung(4) == "K steps per replay"
    assert len([w for w in caught if "3 unrolled steps" in str(w.message)]) == 1
    count.zero_(), total.zero_()
    graph(4, x=x)
    torch.cuda.synchronize()
    assert count.item() == 3 and total.tolist() == [6.0] * 4


def test_host_values_reach_the_device_without_waiting_for_queued_work():
    """A prefill's rows and settings go up while earlier work is still queued: the call returns
    before a 0.2-s kernel ahead of it ends, and the values are there once it has."""
    import time

    from ostinato.runtime import host_values_to_device, pinned_ring

    # The ring is pinned once, as a model's load does on its helper: pinning 64 MiB took ~49 ms,
    # nearly all of a 58-ms sleep at an H100's boost clock, when this test was the process's first upload.
    pinned_ring.reserve(torch.device("cuda"))
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(200_000_000)  # some 0.1-0.4 s of GPU clock cycles, queued
    end.record()
    t = time.perf_counter()
    got = host_values_to_device([[1.5, 2.0], [3.0, 4.25]], torch.device("cuda"), torch.float32)
    returned = time.perf_counter() - t
    torch.cuda.synchronize()
    assert returned * 1e3 < start.elapsed_time(end) / 2
    assert got.tolist() == [[1.5, 2.0], [3.0, 4.25]]


def test_uploads_go_through_one_pinned_ring_and_wait_for_nothing():
    """runtime.pinned_ring: uploads queued behind a long kernel are staged copies in spans of the
    ring (the host tensor may change at once), fill it, and are refused when it is full (the caller
    pins them otherwise: no wait); once the copies ran, the spans serve again. Any dtype and shape."""
    from ostinato.runtime import pinned_ring

    device = torch.device("cuda")
    ring = pinned_ring.PinnedRing(device, capacity=4096)
    torch.cuda.synchronize()
    # the copies below queue behind it (200M cycles: on a fresh machine the first process's first
    # copies took longer than 50M, and the full ring was not full any more when the test looked)
    torch.cuda._sleep(200_000_000)
    values = [torch.arange(i, i + 256, dtype=torch.float32) for i in range(4)]  # 1 KiB each
    expected = [v.tolist() for v in values]
    outs = [ring.upload(v) for v in values]
    for v in values:
        v.zero_()  # staged: the uploads already hold their own copies
    assert all(out is not None for out in outs)
    assert ring.upload(torch.ones(8)) is None  # every span busy while the copies wait
    assert ring.upload(torch.ones(1024)) is None  # over half the ring: never through it
    torch.cuda.synchronize()
    assert [out.cpu().tolist() for out in outs] == expected
    mixed = [torch.tensor([[1, -2], [3, 4]]), torch.tensor([True, False, True]), torch.arange(6.0).view(2, 3).t()]
    for value in mixed:
        out = ring.upload(value)
        assert out is not None and out.device.type == "cuda" and out.dtype == value.dtype
        assert torch.equal(out.cpu(), value)
    big = torch.randn(pinned_ring.CAPACITY // 4 + 1)  # over half the process's ring: pinned as before
    assert torch.equal(pinned_ring.upload(big, device).cpu(), big)


def test_downloads_come_back_through_a_ring_their_receivers_copy_out_of():
    """runtime.pinned_ring downloads: a device tensor's copy into a span of the download ring, queued
    behind the device's work (no wait); once its event has run, ``take`` gives the values in ordinary
    memory and frees the span. A span untaken is busy (the ring refuses what does not fit beside it);
    a dropped download frees its span once its copy has run. Over half the ring: refused."""
    import gc

    from ostinato.runtime import pinned_ring

    device = torch.device("cuda")
    ring = pinned_ring.PinnedRing(device, capacity=4096)
    values = [torch.arange(i, i + 256, dtype=torch.float32, device=device) for i in range(4)]  # 1 KiB each
    torch.cuda.synchronize()
    # the copies below queue behind it (200M cycles: on a fresh machine the first process's first
    # copies took longer than 50M, and the full ring was not full any more when the test looked)
    torch.cuda._sleep(200_000_000)
    downloads = [ring.download(v) for v in values]
    assert all(d is not None for d in downloads) and not downloads[0].event.query()
    assert ring.download(values[0][:8]) is None  # every span busy
    assert ring.download(torch.ones(1024, device=device)) is None  # over half the ring
    torch.cuda.synchronize()
    first = downloads[0].take()
    assert not first.is_pinned() and first.tolist() == values[0].tolist()
    assert downloads[0].take() is first  # taken once
    again = ring.download(values[1] * 2)  # the first span is free again, the others still untaken
    assert again is not None
    del downloads[1:]  # dropped: their spans come back (their copies have run)
    gc.collect()
    torch.cuda.synchronize()
    assert again.take().tolist() == (values[1] * 2).tolist()
    bools = torch.tensor([[True, False], [False, True]], device=device)
    assert torch.equal(ring.download(bools).take(), bools.cpu())
    big = torch.randn(pinned_ring.DOWNLOAD_CAPACITY // 4 + 1, device=device)
    assert pinned_ring.download(big) is None  # the caller pins a block of its own


def test_device_loop_stops_soon_when_the_host_asks():
    """A loop whose guard never turns false runs to its trip limit; asked from the host while it
    runs, it ends after the trip under way (at least one), and the next launch runs in full again."""
    import time

    _needs_device_loop()
    device = torch.device("cuda")
    graph, count, _ = _counting_loop(device, target=10**9, steps_per_replay=1, max_loop_trips=2000,
                                     slow=True)
    x = torch.ones(4, device=device)
    graph.capture(4, x=x)
    count.zero_()
    graph(4, x=x)
    torch.cuda.synchronize()
    assert count.item() == 2000  # never asked: every trip
    count.zero_()
    graph(4, x=x)
    time.sleep(0.03)  # some of the 0.2 s of trips run meanwhile
    graph.stop_soon()
    torch.cuda.synchronize()
    stopped_at = count.item()
    assert 1 <= stopped_at < 2000
    count.zero_()
    graph.stop_soon()  # before a launch: that launch clears it
    graph(4, x=x)
    torch.cuda.synchronize()
    assert count.item() == 2000
