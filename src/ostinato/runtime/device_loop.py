"""Device while-loops: captured step graphs repeated by a CUDA conditional WHILE node.

No PyTorch this runtime supports can capture into a while node (``begin_capture_to_while_node`` is
not in torch 2.11 or 2.13), so the loop is assembled from parts PyTorch does give, with the CUDA
driver API through cuda-python (the ``cuda-bindings`` package):

* PyTorch captures ordinary graphs into the step graphs' shared memory pool and keeps them
  un-instantiated (``CUDAGraph(keep_graph=True)``): the *head* (the guard's first look, then the
  gate) and the parts of the *body*, which run in a chain (one step's graph K times, then the
  guard and the gate);
* the gate is a one-thread kernel, compiled once per device with NVRTC, that sets the loop's
  conditional handle from the guard's flag, and bounds the number of trips so a guard that never
  turns false cannot hang the device; it also reads a flag in pinned host memory, so the host can
  end a running loop early (``stop_soon``: work that waits for the rows) without a CUDA call;
* the parent graph is head -> WHILE(body), each part embedded as a child-graph node; it is instantiated
  and launched with the driver API on PyTorch's current stream.

PyTorch's graph objects stay alive with the loop: their pool memory is what the kernels address.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Dict, Optional, Sequence

import torch

# The gate's source. cudaGraphSetConditional is a device-runtime builtin that NVRTC lowers itself;
# declaring it here keeps the program free of CUDA headers, which a pip-installed NVRTC may lack.
_GATE_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                      unsigned int value);

extern "C" __global__ void ostinato_loop_gate(cudaGraphConditionalHandle handle, const bool* keep_going,
                                              int* trips, int max_trips, int entering, const volatile int* stop)
{
    int done = entering ? 0 : trips[0] + 1;  // trips of the body completed in this launch
    trips[0] = done;
    // stop: pinned host memory the host may set while the loop runs (read over the bus, never cached)
    bool go = keep_going[0] && done < max_trips && (entering || stop[0] == 0);
    cudaGraphSetConditional(handle, go ? 1u : 0u);
}
"""
_GATE_NAME = b"ostinato_loop_gate"
_MIN_DRIVER = 12040  # conditional WHILE nodes set from device code: CUDA 12.4 drivers on


class DeviceLoopError(RuntimeError):
    """A CUDA driver, NVRTC or graph-assembly call behind a device while-loop failed."""


def _bindings():
    from cuda.bindings import driver, nvrtc  # optional dependency: imported only on CUDA

    return driver, nvrtc


def _check(result):
    """cuda-python returns (status, *values): raise on a failed status, else return the values."""
    status, *values = result
    if int(status) != 0:
        raise DeviceLoopError(f"{getattr(status, 'name', status)}")
    return values[0] if len(values) == 1 else tuple(values)


@functools.lru_cache(maxsize=None)
def unavailable_reason(device_type: str) -> Optional[str]:
    """None when this process can build device while-loops, else the reason it cannot."""
    if device_type != "cuda":
        return f"no CUDA graphs on {device_type}"
    graph_type = getattr(torch.cuda, "CUDAGraph", None)
    if graph_type is None or not hasattr(graph_type, "raw_cuda_graph"):
        return f"torch {torch.__version__} cannot hand over a captured graph (no CUDAGraph.raw_cuda_graph)"
    try:
        driver, _ = _bindings()
    except ImportError:
        return "cuda-python is not installed (pip install cuda-bindings)"
    try:
        version = _check(driver.cuDriverGetVersion())
    except Exception as exc:  # noqa: BLE001 - no driver, or a binding that cannot reach it
        return f"the CUDA driver cannot be queried ({exc})"
    if version < _MIN_DRIVER:
        return f"the CUDA driver ({version // 1000}.{version % 1000 // 10}) predates conditional while nodes (12.4)"
    return None


_gates: Dict[int, object] = {}
_gates_lock = threading.Lock()


def compile_gate(device: torch.device):
    """The gate kernel for ``device``'s architecture, compiled (NVRTC) and loaded on first use; a
    model's load asks for it on a helper thread, the first loop's capture otherwise."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _gates_lock:
        if index not in _gates:
            _gates[index] = _compiled_gate(index)
        return _gates[index]


def _compiled_gate(index: int):
    driver, nvrtc = _bindings()
    major, minor = torch.cuda.get_device_capability(index)
    program = _check(nvrtc.nvrtcCreateProgram(_GATE_SOURCE.encode(), b"ostinato_loop_gate.cu", 0, [], []))
    try:
        options = [f"--gpu-architecture=sm_{major}{minor}".encode()]
        status = nvrtc.nvrtcCompileProgram(program, len(options), options)[0]
        if int(status) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program))
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise DeviceLoopError(f"NVRTC could not compile the loop gate: {bytes(log).decode(errors='replace').strip()}")
        cubin = bytearray(_check(nvrtc.nvrtcGetCUBINSize(program)))
        _check(nvrtc.nvrtcGetCUBIN(program, cubin))
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    image = ctypes.create_string_buffer(bytes(cubin), len(cubin))
    with torch.cuda.device(index):
        torch.cuda.synchronize()  # a runtime call: makes PyTorch's (primary) context current here
        module = _check(driver.cuModuleLoadData(ctypes.addressof(image)))
        function = _check(driver.cuModuleGetFunction(module, _GATE_NAME))
    return function


def _add_node(driver, graph, dependencies, params):
    import cuda.bindings

    if int(cuda.bindings.__version__.split(".")[0]) >= 13:  # CUDA 13 added per-edge data
        return _check(driver.cuGraphAddNode(graph, dependencies, None, len(dependencies), params))
    return _check(driver.cuGraphAddNode(graph, dependencies, len(dependencies), params))


class DeviceLoop:
    """One while-loop: ``gate`` is launched inside the head and body captures, then ``assemble``.

    Usage: create, capture the head (guard, then ``gate(flag, entering=True)``) and the body's parts
    (steps; the guard, then ``gate(flag, entering=False)`` last) with PyTorch into graphs made with
    ``keep_graph=True``, call ``assemble(head, parts)``, then ``launch()`` per call.
    """

    def __init__(self, device: torch.device, max_trips: int):
        self.driver, _ = _bindings()
        self.device = device
        self.max_trips = int(max_trips)
        self._function = compile_gate(device)
        self._graph = _check(self.driver.cuGraphCreate(0))
        self._exec = None
        torch.cuda.current_stream(device).query()  # a runtime call, no wait: binds PyTorch's context here
        self._context = _check(self.driver.cuCtxGetCurrent())
        # The head sets the handle before the node runs, so its launch default is never used.
        self._handle = _check(self.driver.cuGraphConditionalHandleCreate(self._graph, self._context, 0, 0))
        self.trips = torch.zeros(1, dtype=torch.int32, device=device)  # body trips of the last launch
        # Set by the host (stop_soon) while a launch runs: the gate ends the loop at its next look.
        # Pinned memory is mapped into the device's address space at the same address (UVA).
        self._stop = torch.zeros(1, dtype=torch.int32).pin_memory()
        self._stop_flag = self._stop.numpy()
        self._keep = []  # PyTorch graphs whose memory the loop addresses

    def gate(self, keep_going: torch.Tensor, entering: bool) -> None:
        """Launch the gate on the current (capturing) stream: loop on while ``keep_going`` holds."""
        if keep_going.dtype != torch.bool or keep_going.numel() != 1 or keep_going.device != self.trips.device:
            raise DeviceLoopError(f"a loop guard must return one bool on {self.trips.device}, got "
                                  f"{tuple(keep_going.shape)} {keep_going.dtype} on {keep_going.device}")
        values = (
            ctypes.c_ulonglong(int(self._handle)),
            ctypes.c_void_p(keep_going.data_ptr()),
            ctypes.c_void_p(self.trips.data_ptr()),
            ctypes.c_int(self.max_trips),
            ctypes.c_int(1 if entering else 0),
            ctypes.c_void_p(self._stop.data_ptr()),
        )
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        stream = self.driver.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        _check(self.driver.cuLaunchKernel(self._function, 1, 1, 1, 1, 1, 1, 0, stream, ctypes.addressof(pointers), 0))

    def assemble(self, head: "torch.cuda.CUDAGraph", body: Sequence["torch.cuda.CUDAGraph"]) -> None:
        """Build head -> WHILE(body[0] -> body[1] -> ...) from captured PyTorch graphs and instantiate
        it. A graph may appear in ``body`` more than once: each place gets its own copy."""
        driver = self.driver
        head_node = _check(driver.cuGraphAddChildGraphNode(
            self._graph, None, 0, driver.CUgraph(int(head.raw_cuda_graph()))))
        params = driver.CUgraphNodeParams()
        params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = self._handle
        params.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        params.conditional.size = 1
        params.conditional.ctx = self._context
        _add_node(driver, self._graph, [head_node], params)
        body_graph = params.conditional.phGraph_out[0]
        previous = []
        for part in body:
            node = _check(driver.cuGraphAddChildGraphNode(
                body_graph, previous or None, len(previous), driver.CUgraph(int(part.raw_cuda_graph()))))
            previous = [node]
        self._exec = _check(driver.cuGraphInstantiate(self._graph, 0))
        self._keep = [head, *dict.fromkeys(body)]

    def launch(self) -> None:
        """Run the loop on the current stream (asynchronously, like a graph replay). A launch waits
        for the last one on its stream, so the stop flag is the new launch's from here on."""
        self._stop_flag[0] = 0
        stream = self.driver.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        _check(self.driver.cuGraphLaunch(self._exec, stream))

    def stop_soon(self) -> None:
        """End the running launch at its next look at the guard (after the body trip under way; at
        least one trip always runs). No CUDA call: a write to host memory the gate reads."""
        self._stop_flag[0] = 1

    def __del__(self):
        driver = getattr(self, "driver", None)
        if driver is None:
            return
        try:
            if self._exec is not None:
                driver.cuGraphExecDestroy(self._exec)
            driver.cuGraphDestroy(self._graph)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass
