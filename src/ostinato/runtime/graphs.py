"""Step graphs: a plain step function run eagerly, or captured once per bucket and replayed.

The step function is ordinary PyTorch that reads its inputs and the persistent state buffers and
writes its results in place; it must be graph-safe (no host syncs, no Python branching on device
values, no allocation that must outlive a replay). This module decides how it runs:

* on the CPU, or with graphs disabled: called directly, every time;
* on CUDA: per bucket key, warmed up on a side stream, captured into a CUDA graph that shares one
  memory pool with every other bucket's graph, then replayed. Inputs are copied into the graph's
  static buffers after their shape, dtype and device are checked; a mismatch raises
  ``GraphInputError`` and nothing is replayed. Outputs are the graph's static tensors: the next
  replay overwrites them, so callers consume or copy them before replaying again.

A call runs ``steps_per_replay`` steps (K): a captured graph holds K unrolled copies of the step,
so the host launches once and may look at a done flag once per K steps. A step given a
``loop_guard`` goes one rung higher: a device while-loop (``device_loop``) repeats the K steps (one
step captured once, its graph copied K times into the loop's body) until the guard turns false, so
the host launches once per call and syncs only when the guard says there is something to look at.
If capture fails (out of memory, an op that cannot be captured, a driver error) the bucket steps
down the ladder with one warning: K unrolled steps, a graph of one step replayed K times, else
eager execution; results stay correct.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Optional

import torch

from ..errors import GraphInputError
from ..errors import InvalidOptionError
from . import device_loop
from .device import side_stream

log = logging.getLogger(__name__)


def _indexed(device: torch.device) -> torch.device:
    """'cuda' names the current CUDA device; tensors report it with its index, so compare with that."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def graphs_supported(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch.cuda, "CUDAGraph")


DECODE_LOOPS = ("auto", "device", "kstep", "eager")


def resolve_decode_loop(decode_loop: str, device: torch.device, use_graphs: bool = True) -> str:
    """The top rung a model's decode loop may use: "device", "kstep" or "eager".

    "auto" takes the highest rung this device offers (the device while-loop where cuda-python can
    build it, else K-step graphs on CUDA, else eager); "device" and "kstep" ask for that rung and
    raise ``InvalidOptionError`` where it cannot exist (a capture that fails later still steps down
    the ladder with a warning); "eager" never captures. ``use_graphs=False`` means "eager".
    """
    if decode_loop not in DECODE_LOOPS:
        raise InvalidOptionError(f"decode_loop must be one of {', '.join(DECODE_LOOPS)}; got {decode_loop!r}")
    device = torch.device(device)
    if not use_graphs or decode_loop == "eager":
        return "eager"
    if not graphs_supported(device):
        if decode_loop == "auto":
            return "eager"
        raise InvalidOptionError(f"decode_loop={decode_loop!r} needs CUDA graphs; the device is {device.type}")
    why = device_loop.unavailable_reason(device.type)
    if decode_loop == "device" and why is not None:
        raise InvalidOptionError(f"decode_loop='device' is not available here: {why}")
    if decode_loop == "kstep" or why is not None:
        return "kstep"
    return "device"


def loop_rung(device: torch.device, use_graphs: bool, steps_per_replay: int, guarded: bool = False) -> str:
    """The decode-loop rung a device starts on, with the reason the rungs above it are out.

    The ladder: device while-loop -> K unrolled steps per replay (host reads a done flag once per
    replay) -> one step per replay -> eager. ``guarded``: the step has a loop guard, without which
    there is no while-loop to build. PyTorch cannot capture into a while node
    (``CUDAGraph.begin_capture_to_while_node`` is in no release this runtime supports), so the loop
    is built through cuda-python's conditional nodes (see ``device_loop``).
    """
    device = torch.device(device)
    if not use_graphs:
        return "eager (graphs disabled)"
    if not graphs_supported(device):
        return f"eager (no CUDA graphs on {device.type})"
    why = "this step has no loop guard" if not guarded else device_loop.unavailable_reason(device.type)
    if why is None:
        return f"device while-loop (CUDA conditional node through cuda-python), {steps_per_replay} steps per trip"
    if steps_per_replay > 1:
        return f"{steps_per_replay} unrolled steps per graph replay (device while-loop: {why})"
    return f"one step per graph replay (device while-loop: {why})"


@contextlib.contextmanager
def capturing(graph: "torch.cuda.CUDAGraph", pool, device: torch.device):
    """Capture the work queued inside the block into ``graph`` (memory from ``pool``), on a side stream.

    ``torch.cuda.graph`` does the same after synchronizing the device and emptying the allocators'
    caches (device and pinned host memory; in some releases collecting garbage too): blocks that the
    next calls allocate again, at each of a first call's captures. Capture records work and runs
    none, so the block only has to come after the work queued so far, as a stream dependency."""
    stream = side_stream(device, "graph capture")
    stream.wait_stream(torch.cuda.current_stream(device))
    collecting = gc.isenabled()
    # No garbage collection inside: freeing a CUDA object there (an earlier failed capture's graph,
    # in a reference cycle) makes calls a capture forbids, which invalidate it.
    gc.disable()
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool)
            try:
                yield
            except BaseException:
                with warnings.catch_warnings():  # a capture cut short may be empty: PyTorch warns of that
                    warnings.simplefilter("ignore", UserWarning)
                    graph.capture_end()
                raise
            graph.capture_end()
    finally:
        if collecting:
            gc.enable()
    torch.cuda.current_stream(device).wait_stream(stream)


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph, or a device_loop.DeviceLoop
    inputs: Dict[str, torch.Tensor]
    outputs: Any
    repeats: int = 1  # replays per call: K when the K-step capture failed and one step was captured
    rung: str = "graph"


class StepGraph:
    """Runs ``step(key, **inputs)`` eagerly or as replayed CUDA graphs, one per bucket key.

    The step receives its bucket key (e.g. the padded batch size) so it can work on the matching
    views of the persistent state; inputs are the per-call tensors copied into static buffers.

    ``loop_guard(key, entering)``, if given, returns a one-element bool tensor on the device, computed
    with graph-safe ops from the state: whether to run the K steps (again). It is called once as the
    loop is entered (``entering=True``, where it may also note the state it compares against) and
    after every K steps. On the while-loop rung a call runs until it returns False (or
    ``max_loop_trips`` trips); on the rungs below, a call runs K steps: callers must be right with
    either, e.g. by looking at their done flags after every call.

    ``capture_on_reuse``: a key's first call runs eagerly (it is the capture's warm-up) and defers
    the key's capture (see ``defer``); a later call replays it, capturing it first if no spare time
    came: for work of many shapes, some met only once (Whisper's prefill of the windows admitted
    together), whose captures would cost a first call more than their replays save.

    Deferred captures (``defer``, ``capture_deferred``) are for a caller that has host time to spare
    while the device works through a long replay (an engine waiting for a device loop): a capture
    records the step's launches and runs none of them, so it can be done then, off the path a first
    call waits on.

    ``warm_up_new_shapes=False``: once the step has run on this device (a warm-up of another key, or
    ``mark_warm``: the caller ran its code path itself), a new key is captured without a warm-up run,
    and a ``capture_on_reuse`` key is captured at its first call instead of running eagerly: each
    first meeting of a shape then pays one pass of the step's Python, not two. What a warm-up guards
    against fails loudly inside a capture instead (a host sync; a persistent buffer made lazily,
    which ``ops.triton_support.arrival_counters`` refuses to make while capturing): such a capture
    is retried after a warm-up, without a warning. (Kernels a new shape needs load inside the capture.)
    """

    def __init__(
        self,
        step: Callable[..., Any],
        device: torch.device,
        *,
        use_graphs: bool = True,
        warmup: int = 1,
        pool: Optional[Any] = None,
        name: str = "step",
        steps_per_replay: int = 1,
        loop_guard: Optional[Callable[[Hashable, bool], torch.Tensor]] = None,
        max_loop_trips: int = 1024,
        capture_on_reuse: bool = False,
        warm_up_new_shapes: bool = True,
    ):
        if steps_per_replay < 1:
            raise ValueError("steps_per_replay must be at least 1")
        self.step = step
        self.steps_per_replay = int(steps_per_replay)
        self.device = _indexed(torch.device(device))
        self.use_graphs = bool(use_graphs) and graphs_supported(self.device)
        self.warmup = warmup
        self.name = name
        self.loop_guard = loop_guard
        self.max_loop_trips = int(max_loop_trips)
        self._pool = pool
        self._captured: Dict[Hashable, _Captured] = {}
        self._eager_buckets: set = set()
        self._running_loop = None  # the device loop launched last, which stop_soon ends
        self._warmed = False  # the step has run warm-ups for some bucket: lazy setup is done
        self.capture_on_reuse = bool(capture_on_reuse)
        self.warm_up_new_shapes = bool(warm_up_new_shapes)
        self._met: set = set()  # keys whose step has run at their shapes: their capture needs no warm-up
        self._deferred: Dict[Hashable, Dict[str, torch.Tensor]] = {}  # key -> its inputs, oldest first
        self._graphs: list = []  # every graph captured into the pool, failed ones too (see _new_graph)
        self.capture_seconds: Optional[float] = None  # host time of the quickest capture without a warm-up

    # -- introspection -------------------------------------------------------------------------
    @property
    def pool(self):
        return self._pool

    def is_captured(self, key: Hashable) -> bool:
        return key in self._captured

    def may_capture(self, key: Hashable) -> bool:
        """Whether a call of ``key`` may do host work of a capture first (graphs on, none yet for it)."""
        return self.use_graphs and key not in self._captured

    def captured_keys(self):
        return list(self._captured)

    def mode(self, key: Hashable) -> str:
        if not self.use_graphs or key in self._eager_buckets:
            return "eager"
        return "graph" if key in self._captured else "uncaptured"

    def rung(self, key: Hashable) -> str:
        """How a call of ``key`` runs: 'device loop', 'K steps per replay', 'one step per replay', 'eager'."""
        if self.mode(key) != "graph":
            return self.mode(key)
        entry = self._captured[key]
        if entry.rung == "loop":
            return "device loop"
        return "K steps per replay" if entry.repeats == 1 and self.steps_per_replay > 1 else "one step per replay"

    def mark_warm(self) -> None:
        """The step's code has run on this device outside this object (at other shapes): the lazy
        setup a first warm-up does is done. With ``warm_up_new_shapes=False`` no key warms up then."""
        self._warmed = True

    @property
    def _new_shapes_need_no_warm_up(self) -> bool:
        return self._warmed and not self.warm_up_new_shapes

    # -- running -------------------------------------------------------------------------------
    def capture(self, key: Hashable, **inputs: torch.Tensor) -> None:
        """Capture the graph for ``key`` with example inputs (their shapes become the bucket's).

        Warm-up and capture run the step for real, so they mutate the state it writes: callers
        capture before they fill the state for actual work.
        """
        if not self.use_graphs or key in self._captured or key in self._eager_buckets:
            return
        deferred = self._deferred.pop(key, None)
        self._capture(key, deferred if deferred is not None else self._static(inputs))

    def defer(self, key: Hashable, *, step_has_run: bool = True, **inputs: torch.Tensor) -> None:
        """Capture ``key`` later, at a ``capture_deferred`` call, with these inputs' shapes.

        A deferred capture runs no warm-up, nothing at all, so it may come while the device works on
        the state the step reads. A call of the key before then captures it as ``capture`` does.
        ``step_has_run``: the step has run at this key's shapes before (eagerly, or in another
        graph's warm-up on the same kernels), so its capture needs no warm-up on any rung. Otherwise
        the key is deferred only where new shapes need no warm-up (``warm_up_new_shapes=False`` on a
        warm step), and its deferred capture is one try on the top rung: if that fails, the key is
        left uncaptured, for its next call (or ``capture``) to capture with warm-ups, which a
        deferred capture cannot run.
        """
        if not self.use_graphs or key in self._captured or key in self._eager_buckets or key in self._deferred:
            return
        if not step_has_run and not self._new_shapes_need_no_warm_up:
            return
        self._deferred[key] = self._static(inputs)
        if step_has_run:
            self._met.add(key)

    def capture_deferred(self, within: Optional[float] = None) -> bool:
        """Capture the oldest deferred key; returns whether there was one to try. ``within``: the
        host time there is to spare (seconds the device stays busy without it): with none, or less
        than a capture is known to take, the key waits (for a later call of this, or its next call),
        since the device would wait for the capture."""
        if not self._deferred:
            return False
        if within is not None and (within <= 0 or self.capture_seconds is not None and self.capture_seconds > within):
            log.debug("spare time for %s: %.1f ms, a capture takes %s ms: it waits", self.name, 1000 * within,
                      "?" if self.capture_seconds is None else f"{1000 * self.capture_seconds:.1f}")
            return False
        key = next(iter(self._deferred))
        self._capture(key, self._deferred.pop(key), deferred=True)
        return True

    def _static(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The graph's own input buffers: copies of the example inputs."""
        for name, t in inputs.items():
            if t.device != self.device:
                raise GraphInputError(f"{self.name}: input {name!r} is on {t.device}, graph device is {self.device}")
        return {name: t.detach().clone() for name, t in inputs.items()}

    def _capture(self, key: Hashable, static: Dict[str, torch.Tensor], deferred: bool = False) -> None:
        failure = None
        # Down the ladder: a device loop of K steps, K unrolled steps, one step replayed K times, eager.
        rungs = [("graph", self.steps_per_replay), ("graph", 1)]
        if self.loop_guard is not None and device_loop.unavailable_reason(self.device.type) is None:
            rungs.insert(0, ("loop", self.steps_per_replay))
        attempts = [(rung, unrolled, True) for rung, unrolled in dict.fromkeys(rungs)]
        if key not in self._met and self._new_shapes_need_no_warm_up:
            # a new shape without a warm-up; if the capture fails, the top rung again after one
            attempts.insert(0, (*attempts[0][:2], False))
            if deferred:  # no warm-up may run now (see defer): that retry waits for the key's next call
                attempts = attempts[:1]
        for rung, unrolled, warm in attempts:
            started, warm_up = time.perf_counter(), warm and key not in self._met
            try:
                capture = self._capture_loop if rung == "loop" else self._capture_steps
                graph, outputs = capture(key, static, unrolled, warm)
            except Exception as exc:  # out of memory, an op that cannot be captured, a driver error...
                _recover_from_failed_capture(self.device)
                if not warm:
                    log.debug("%s: capture of %r without a warm-up failed (%s); warming up", self.name, key, exc,
                              exc_info=True)
                    continue
                failure = failure or exc
                continue
            self._captured[key] = _Captured(graph, static, outputs, self.steps_per_replay // unrolled, rung)
            if not warm_up:
                took = time.perf_counter() - started
                self.capture_seconds = took if self.capture_seconds is None else min(self.capture_seconds, took)
            if failure is not None:
                action = (f"replaying {unrolled} unrolled steps per call" if unrolled > 1
                          else f"replaying a one-step graph {self.steps_per_replay} times per call")
                self._warn(key, failure, action)
            log.debug("captured %s for bucket %r (%s of %d steps)", self.name, key, rung, unrolled)
            return
        if failure is None:  # only the deferred try without a warm-up failed: the key stays uncaptured
            return
        self._eager_buckets.add(key)
        self._warn(key, failure, "running it eagerly")

    def _capture_steps(self, key: Hashable, static: Dict[str, torch.Tensor], unrolled: int, warm: bool = True):
        if warm:
            self._warm_up(key, static)
        graph = self._new_graph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with capturing(graph, self._pool, self.device):
            outputs = self._run(key, static, unrolled)
        return graph, outputs

    def _capture_loop(self, key: Hashable, static: Dict[str, torch.Tensor], unrolled: int, warm: bool = True):
        """head (guard, gate) -> WHILE(step x K, guard, gate): PyTorch captures the head, one step and
        the tail (guard, gate); the driver joins them with the step's graph K times over. A capture
        costs the Python that launches its kernels, so one step's worth instead of K (tiny.en's step
        is ~45 Triton launches); the step reads and writes only the state, so its K copies are what K
        captured steps would be."""
        if warm:
            self._warm_up(key, static, guarded=True)
        loop = device_loop.DeviceLoop(self.device, self.max_loop_trips)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        head = self._new_graph(keep_graph=True)
        with capturing(head, self._pool, self.device):
            loop.gate(self.loop_guard(key, True), entering=True)
        step = self._new_graph(keep_graph=True)
        with capturing(step, self._pool, self.device):
            outputs = self._run(key, static, 1)
        tail = self._new_graph(keep_graph=True)
        with capturing(tail, self._pool, self.device):
            loop.gate(self.loop_guard(key, False), entering=False)
        loop.assemble(head, [step] * unrolled + [tail])
        return loop, outputs

    def _new_graph(self, **options) -> "torch.cuda.CUDAGraph":
        """A graph to capture into the pool, kept for this object's life even if its capture fails: a
        pool whose last graph is gone cannot be captured into again (PyTorch's allocator asserts), and
        a failed capture is retried into the same pool."""
        graph = torch.cuda.CUDAGraph(**options)
        self._graphs.append(graph)
        return graph

    def _run(self, key: Hashable, inputs: Dict[str, torch.Tensor], steps: int):
        outputs = None
        for _ in range(steps):
            outputs = self.step(key, **inputs)
        return outputs

    def _warn(self, key: Hashable, exc: BaseException, action: str) -> None:
        detail = str(exc).splitlines()[0] if str(exc) else ""
        warnings.warn(
            f"ostinato: CUDA graph capture of {self.name} for bucket {key!r} failed "
            f"({type(exc).__name__}: {detail}); {action}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _warm_up(self, key: Hashable, static: Dict[str, torch.Tensor], guarded: bool = False) -> None:
        """Run the step on a side stream; a host sync in it raises here, before any capture begins.
        ``warmup`` runs for the first bucket, one for each later one: the first run at a new shape
        does what a capture must not (kernel compiles and loads, library handles, allocations); more
        runs only lengthen a first call (one run of large-v3's beam step is tens of ms of Python).
        A key whose step has run at its shapes (``capture_on_reuse``'s eager call, ``defer``) needs none;
        ``_capture`` asks for one after a capture without it failed."""
        if key in self._met:
            return
        side = side_stream(self.device, "graph warm-up")  # one for every capture (see side_stream)
        side.wait_stream(torch.cuda.current_stream(self.device))
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():  # PyTorch calls the mode a prototype each time it is set
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.stream(side):
                for _ in range(1 if self._warmed else self.warmup):
                    self.step(key, **static)
                    if guarded:
                        self.loop_guard(key, True)
                        self.loop_guard(key, False)
            self._warmed = True
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                torch.cuda.set_sync_debug_mode(previous)
        # Ordered after the warm-up by the stream, not by waiting for the device: a first call's
        # captures come while its other work is queued, and a wait idled the device during each
        # capture's Python (19 waits, 62 ms of a random tiny model's first batch-16 call).
        torch.cuda.current_stream(self.device).wait_stream(side)

    def __call__(self, key: Hashable, **inputs: torch.Tensor):
        """Run ``steps_per_replay`` steps (or, on the device loop, until the guard stops it); returns the
        last step's outputs."""
        if not self.use_graphs or key in self._eager_buckets:
            return self._run(key, inputs, self.steps_per_replay)
        entry = self._captured.get(key)
        if entry is None and self.capture_on_reuse and key not in self._met and not self._new_shapes_need_no_warm_up:
            outputs = self._run(key, inputs, self.steps_per_replay)
            self.defer(key, **inputs)
            return outputs
        if entry is None:
            self.capture(key, **inputs)
            entry = self._captured.get(key)
            if entry is None:  # capture fell back to eager
                return self._run(key, inputs, self.steps_per_replay)
        self._bind(entry, inputs)
        if entry.rung == "loop":
            entry.graph.launch()
            self._running_loop = entry.graph
            return entry.outputs
        for _ in range(entry.repeats):
            entry.graph.replay()
        return entry.outputs

    def stop_soon(self) -> None:
        """Ask the device loop launched last to stop at its next look at the guard, as if the guard
        had said stop (a call on another rung runs its K steps anyway: nothing to do)."""
        if self._running_loop is not None:
            self._running_loop.stop_soon()

    def _bind(self, entry: _Captured, inputs: Dict[str, torch.Tensor]) -> None:
        if set(inputs) != set(entry.inputs):
            raise GraphInputError(
                f"{self.name}: inputs {sorted(inputs)} do not match the captured inputs {sorted(entry.inputs)}"
            )
        for name, value in inputs.items():
            static = entry.inputs[name]
            if value.shape != static.shape or value.dtype != static.dtype or value.device != static.device:
                raise GraphInputError(
                    f"{self.name}: input {name!r} is {tuple(value.shape)} {value.dtype} on {value.device}, "
                    f"but the graph was captured for {tuple(static.shape)} {static.dtype} on {static.device}"
                )
        for name, value in inputs.items():
            static = entry.inputs[name]
            if value.data_ptr() != static.data_ptr():
                static.copy_(value)


def _recover_from_failed_capture(device: torch.device) -> None:
    """Leave the device usable after a capture broke off.

    When a capture is invalidated, PyTorch never closes the random generator's capture, and every
    later random op on the device then fails ("Offset increment outside graph capture"). Swapping
    in a copy of the generator's state (same seed and offset) clears that flag.
    """
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        pass
    generator = torch.cuda.default_generators[device.index or 0]
    if hasattr(generator, "graphsafe_set_state") and hasattr(generator, "clone_state"):
        generator.graphsafe_set_state(generator.clone_state())
