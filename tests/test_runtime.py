"""Runtime core on the CPU: device choice, persistent state, eager step graphs, one copy of weights."""
import pytest
import torch
from torch import nn

from ostinato.errors import InvalidOptionError
from ostinato.runtime import (
    DeviceState,
    StepGraph,
    bucket_for,
    duplicated_parameters,
    memory_report,
    place_module,
    resolve_device,
    resolve_dtype,
    storage_bytes,
)


def test_resolve_device_auto_and_errors():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(InvalidOptionError, match="unknown device"):
        resolve_device("gpu-please")
    with pytest.raises(InvalidOptionError):
        resolve_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidOptionError, match="no CUDA device"):
            resolve_device("cuda")


def test_resolve_dtype(caplog):
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    # half precision asked for by name on the CPU: float32, with one warning (as faster-whisper)
    for name in ("float16", "bfloat16"):
        caplog.clear()
        with caplog.at_level("WARNING", logger="ostinato"):
            assert resolve_dtype(name, cpu) == torch.float32
        assert [r.getMessage() for r in caplog.records] == [
            f"compute type {name} is not efficient on the CPU: computing in float32 instead"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ostinato"):
        assert resolve_dtype("float32", cpu) == torch.float32
        assert resolve_dtype(torch.bfloat16, cpu) == torch.bfloat16  # a torch dtype is taken as it is
    assert caplog.records == []
    assert resolve_dtype("float16", torch.device("cuda", 0)) == torch.float16
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.float16
    with pytest.raises(InvalidOptionError, match="unknown compute type"):
        resolve_dtype("int3", cpu)


def test_device_state_fixed_addresses():
    st = DeviceState("cpu")
    kv = st.allocate("kv", (2, 4, 8), torch.float32)
    address = kv.data_ptr()
    assert st.allocate("kv", (2, 4, 8), torch.float32) is kv  # same spec: the same buffer
    with pytest.raises(ValueError, match="cannot reallocate"):
        st.allocate("kv", (2, 4, 9), torch.float32)
    written = st.write("kv", torch.ones(1, 4, 8))
    assert st["kv"].data_ptr() == address
    assert written.data_ptr() == address
    assert st["kv"][0].sum().item() == 32 and st["kv"][1].sum().item() == 0
    with pytest.raises(ValueError):
        st.write("kv", torch.ones(3, 4, 8))
    st.allocate("flags", (4,), torch.bool, True)
    assert st.nbytes() == 2 * 4 * 8 * 4 + 4
    assert set(st.addresses()) == {"kv", "flags"}
    with pytest.raises(KeyError, match="no state buffer"):
        st["missing"]


def test_step_graph_runs_eagerly_on_cpu():
    st = DeviceState("cpu")
    counter = st.allocate("counter", (4,), torch.int64)
    calls = []

    def step(rows, increment):
        calls.append(rows)
        counter[:rows].add_(increment)
        return counter[:rows]

    graph = StepGraph(step, torch.device("cpu"), use_graphs=True)
    assert not graph.use_graphs  # no CUDA graphs on the CPU
    for _ in range(3):
        out = graph(2, increment=torch.tensor(5))
    assert calls == [2, 2, 2]
    assert out.tolist() == [15, 15]
    assert counter.tolist() == [15, 15, 0, 0]
    assert graph.mode(2) == "eager"


def test_bucket_for():
    assert bucket_for(1, (1, 2, 4, 8)) == 1
    assert bucket_for(3, (1, 2, 4, 8)) == 4
    assert bucket_for(8, (8, 1, 4, 2)) == 8
    with pytest.raises(ValueError):
        bucket_for(9, (1, 2, 4, 8))


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 10, bias=False)
        self.proj.weight = self.embed.weight  # tied: one storage


def test_weights_single_copy_and_report():
    model = place_module(_Tied(), torch.device("cpu"), torch.float32)
    assert not any(p.requires_grad for p in model.parameters())
    # The tied weight is counted once.
    assert storage_bytes(model.parameters()) == 10 * 4 * 4
    assert duplicated_parameters(model) == {}
    report = memory_report(model, state_bytes=123, device=torch.device("cpu"))
    assert report.parameter_bytes == 160 and report.state_bytes == 123 and report.peak_bytes is None
    assert "parameters" in str(report)

    untied = _Tied()
    untied.proj.weight = nn.Parameter(untied.embed.weight.detach().clone())
    assert duplicated_parameters(untied) == {"proj.weight": "embed.weight"}


def test_step_graph_runs_k_steps_per_call_and_names_its_rung():
    from ostinato.runtime import loop_rung

    calls = []
    graph = StepGraph(lambda key, x: calls.append(key) or x + len(calls), "cpu", steps_per_replay=3)
    out = graph(2, x=torch.zeros(1))
    assert calls == [2, 2, 2] and out.item() == 3.0  # the last step's output
    graph.stop_soon()  # no device loop to stop: the next call still runs its K steps
    graph(2, x=torch.zeros(1))
    assert len(calls) == 6
    with pytest.raises(ValueError):
        StepGraph(lambda key: None, "cpu", steps_per_replay=0)
    assert loop_rung(torch.device("cpu"), True, 8).startswith("eager (no CUDA graphs on cpu")
    assert loop_rung(torch.device("cuda"), False, 8) == "eager (graphs disabled)"


def test_loop_rung_names_why_there_is_no_device_loop():
    from ostinato.runtime import device_loop, loop_rung

    assert "this step has no loop guard" in loop_rung(torch.device("cuda"), True, 8)
    why = device_loop.unavailable_reason("cuda")
    rung = loop_rung(torch.device("cuda"), True, 8, guarded=True)
    if why is None:
        assert rung.startswith("device while-loop")
    else:
        assert rung == f"8 unrolled steps per graph replay (device while-loop: {why})"
    assert device_loop.unavailable_reason("cpu") == "no CUDA graphs on cpu"


def test_guarded_step_graph_runs_k_steps_per_call_eagerly():
    """The guard only matters on the device loop: eagerly a call is still K steps, guard or not."""
    calls = []
    graph = StepGraph(lambda key: calls.append(key), "cpu", steps_per_replay=4,
                      loop_guard=lambda key, entering: torch.tensor(False))
    graph(1)
    assert calls == [1, 1, 1, 1] and graph.rung(1) == "eager"


def test_a_warm_step_graph_captures_new_keys_without_a_warm_up_and_warms_up_only_after_a_failure(monkeypatch):
    """The order of a StepGraph's capture attempts, with the capture itself stood in for (it needs
    CUDA; the GPU tests run the real one): once the step is warm a new key is first captured without
    a warm-up, a failure of that is retried with one on the same rung and no warning, and only
    failures with warm-ups step down the ladder (one warning, then eager)."""
    import warnings

    from ostinato.runtime import graphs

    attempts, replays, ran = [], [], []
    failing = set()  # "cold": captures without a warm-up fail; "all": every capture fails

    class Captured:
        def replay(self):
            replays.append(1)

    def capture_steps(self, key, static, unrolled, warm=True):
        attempts.append((key, unrolled, warm))
        if "all" in failing or (not warm and "cold" in failing):
            raise RuntimeError("arrival counters cannot be made during a CUDA graph capture")
        return Captured(), "outputs"

    monkeypatch.setattr(graphs.StepGraph, "_capture_steps", capture_steps)
    monkeypatch.setattr(graphs, "_recover_from_failed_capture", lambda device: None)
    graph = StepGraph(lambda key: ran.append(key), torch.device("cuda"), steps_per_replay=4,
                      capture_on_reuse=True, warm_up_new_shapes=False)
    assert graph.use_graphs  # (CUDA graphs exist in this build, whether or not a GPU does)
    graph(1)  # not warm: a capture_on_reuse key's first call runs eagerly, its capture deferred
    assert ran == [1, 1, 1, 1] and attempts == [] and graph.mode(1) == "uncaptured"
    graph.mark_warm()  # the caller ran the step's code itself
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graph(2) == "outputs"  # captured at its first call, without a warm-up, and replayed
        assert attempts == [(2, 4, False)] and len(replays) == 1 and graph.mode(2) == "graph"
        graph(1)  # the deferred key: its step has run at its shapes, so it never needed a warm-up
        assert attempts[-1] == (1, 4, True) and len(attempts) == 2
        failing.add("cold")
        graph(3)  # the capture without a warm-up fails: retried with one, quietly
        assert attempts[-2:] == [(3, 4, False), (3, 4, True)] and graph.mode(3) == "graph"
    failing.add("all")
    with pytest.warns(RuntimeWarning, match="running it eagerly"):
        graph(5)
    assert attempts[-3:] == [(5, 4, False), (5, 4, True), (5, 1, True)] and graph.mode(5) == "eager"
    assert ran[-4:] == [5, 5, 5, 5]
    # the default: a warm step still warms up every new key
    default = StepGraph(lambda key: None, torch.device("cuda"), steps_per_replay=4)
    default.mark_warm()
    failing.clear()
    default(6)
    assert attempts[-1] == (6, 4, True)


def test_a_deferred_capture_of_a_shape_the_step_has_not_run_at_is_one_try_without_a_warm_up(monkeypatch):
    """defer(step_has_run=False) (a run's smaller bucket, met once): its deferred capture may come
    while the rows it reads are live, so it runs no warm-up: one try on the top rung, and if that
    fails the key is neither eager nor warned about, but captured at its next call with the ladder
    a new key gets (a warm-up after the failed try). A step that is not warm defers no such key."""
    import warnings

    from ostinato.runtime import graphs

    attempts, ran, failing = [], [], set()

    class Captured:
        def replay(self):
            pass

    def capture_steps(self, key, static, unrolled, warm=True):
        attempts.append((key, unrolled, warm))
        if not warm and "cold" in failing:
            raise RuntimeError("arrival counters cannot be made during a CUDA graph capture")
        return Captured(), "outputs"

    monkeypatch.setattr(graphs.StepGraph, "_capture_steps", capture_steps)
    monkeypatch.setattr(graphs, "_recover_from_failed_capture", lambda device: None)
    graph = StepGraph(lambda key: ran.append(key), torch.device("cuda"), steps_per_replay=4,
                      warm_up_new_shapes=False)
    graph.defer(8, step_has_run=False)  # not warm yet: its capture would need a warm-up
    assert not graph.capture_deferred() and attempts == []
    graph.mark_warm()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph.defer(8, step_has_run=False)
        assert graph.capture_deferred()
        assert attempts == [(8, 4, False)] and graph.mode(8) == "graph" and ran == []
        failing.add("cold")
        graph.defer(4, step_has_run=False)
        assert graph.capture_deferred()
        assert attempts[-1] == (4, 4, False) and len(attempts) == 2
        assert graph.mode(4) == "uncaptured" and ran == []  # no warm-up ran, no warning, not eager
        assert not graph.capture_deferred()
        assert graph(4) == "outputs"  # its next call: the try without a warm-up, then one with
        assert attempts[-2:] == [(4, 4, False), (4, 4, True)] and graph.mode(4) == "graph"
        # a key whose step has run (the one-row bucket the load decoded) keeps every rung
        graph.defer(1)
        assert graph.capture_deferred() and attempts[-1] == (1, 4, True) and graph.mode(1) == "graph"


def test_a_deferred_capture_waits_for_spare_time_that_covers_what_a_capture_takes(monkeypatch):
    """capture_deferred(within=s): a capture that takes longer than the s seconds the device stays
    busy would make the device wait, so the key stays deferred, as it does with no time at all;
    with enough time, or some while no capture has been timed, it is captured. What a capture takes is the quickest one without a
    warm-up run (a capture after a warm-up counts the step's run too)."""
    import time as clock

    from ostinato.runtime import graphs

    attempts = []

    class Captured:
        def replay(self):
            pass

    def capture_steps(self, key, static, unrolled, warm=True):
        attempts.append(key)
        if warm:
            self._warm_up(key, static)
        clock.sleep(0.03 if key == "slow" else 0.01)
        return Captured(), "outputs"

    def warm_up(self, key, static, guarded=False):
        if key not in self._met:  # (as the real one: a key whose step has run needs none)
            clock.sleep(0.2)
            self._warmed = True

    monkeypatch.setattr(graphs.StepGraph, "_capture_steps", capture_steps)
    monkeypatch.setattr(graphs.StepGraph, "_warm_up", warm_up)
    graph = StepGraph(lambda key: None, torch.device("cuda"), steps_per_replay=4, warm_up_new_shapes=False)
    graph.capture("cold")  # the graph's first capture warms the step up first
    assert graph.capture_seconds is None  # not what a capture alone takes
    graph.defer("first")
    assert not graph.capture_deferred(within=0.0)  # no time to spare at all
    assert graph.capture_deferred(within=0.001)  # some, and nothing timed yet: no reason to wait
    assert 0.01 <= graph.capture_seconds < 0.03  # a key deferred after its step ran: no warm-up in it
    quick = graph.capture_seconds
    graph.defer("slow", step_has_run=False)  # warm (the capture above) and new shapes need no warm-up
    assert graph.capture_deferred()  # no limit given: it does not wait
    assert graph.capture_seconds == quick  # the quickest capture is what one takes
    graph.defer(2)
    graph.defer(3)
    assert not graph.capture_deferred(within=quick / 2) and graph.mode(2) == "uncaptured"  # it waits
    assert graph.may_capture(2)  # its call would capture first: an advance's clock does not time it
    assert graph.capture_deferred(within=quick * 2) and graph.is_captured(2)  # the oldest first
    assert not graph.may_capture(2)
    assert not StepGraph(lambda key: None, torch.device("cpu")).may_capture(2)  # eager: nothing to capture
    assert not graph.is_captured(3) and graph.capture_deferred() and graph.is_captured(3)
    assert attempts == ["cold", "first", "slow", 2, 3]


def test_the_advance_clock_says_how_long_the_device_stays_busy():
    """AdvanceClock: the device time an advance in flight has left is the last timed advance's length
    less the host time since this one's launch, never below zero; nothing before an advance was
    timed, or with none in flight; on the CPU no advance is timed (no events)."""
    import time as clock

    from ostinato.runtime import AdvanceClock

    timer = AdvanceClock(torch.device("cpu"))
    assert timer.seconds_left() == 0.0
    timer.launching()
    timer.launched()
    assert timer.seconds_left() == 0.0  # nothing timed yet
    timer.collected()
    assert timer.last_seconds is None  # the CPU has no device time to read
    timer.last_seconds = 0.2
    assert timer.seconds_left() == 0.0  # no advance in flight
    timer.launching()
    clock.sleep(0.05)
    assert 0.1 < timer.seconds_left() <= 0.15
    timer.last_seconds = 0.04
    assert timer.seconds_left() == 0.0  # overdue: nothing left to hide behind
    timer.collected()
    assert timer.seconds_left() == 0.0


def test_concat_rows_is_a_view_of_consecutive_slices_and_a_copy_otherwise():
    from ostinato.runtime import concat_rows

    batch = torch.arange(24.0).reshape(4, 3, 2)
    rows = [batch[i : i + 1] for i in range(1, 4)]
    joined = concat_rows(rows)
    assert torch.equal(joined, batch[1:4]) and joined.data_ptr() == batch[1].data_ptr()  # no copy
    shuffled = concat_rows([batch[2:3], batch[0:1]])
    assert torch.equal(shuffled, torch.cat([batch[2:3], batch[0:1]]))
    assert shuffled.data_ptr() != batch.data_ptr()
    other = torch.zeros(1, 3, 2)
    assert torch.equal(concat_rows([batch[0:1], other]), torch.cat([batch[0:1], other]))
    assert concat_rows([batch[3:4]]) is not None and torch.equal(concat_rows([batch[3:4]]), batch[3:4])


def test_the_openmp_runtime_is_looked_up_once_however_many_threads_ask(monkeypatch):
    import threading

    from ostinato.runtime import device as device_module

    found = device_module.openmp_runtime()
    paths = {line.split()[-1] for line in open("/proc/self/maps") if "/libgomp" in line or "/libiomp5" in line
             or "/libomp" in line}
    if found is not None:  # one of the OpenMP libraries this process mapped
        assert found._name in paths
    lookups = []
    monkeypatch.setattr(device_module, "_find_openmp_runtime", lambda: lookups.append(1) or found)
    monkeypatch.setattr(device_module, "_openmp", [])
    barrier = threading.Barrier(8)
    seen = []

    def ask():
        barrier.wait()
        seen.append(device_module.openmp_runtime())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lookups == [1] and seen == [found] * 8


def test_one_cpu_thread_here_touches_only_the_calling_thread():
    import threading

    from ostinato.runtime import device as device_module
    from ostinato.runtime import one_cpu_thread_here

    if device_module.openmp_runtime() is None:
        pytest.skip("no OpenMP runtime in this process")
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # a caller with threads to keep
    seen = {}

    def helper():
        seen["took"] = one_cpu_thread_here()
        seen["here"] = torch.get_num_threads()
        torch.ones(1 << 20).add_(1)  # a parallelisable op runs on this thread alone, and works

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    try:
        assert seen == {"took": True, "here": 1}
        assert torch.get_num_threads() == 2  # the caller's threads stay
    finally:
        torch.set_num_threads(before)
