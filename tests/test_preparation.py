"""runtime.preparation.prepared_in_background: Triton's once-per-process work and CUDA's libraries
loaded on helper threads while a model loads, then the model's own first uses.

Triton and CUDA are not on the CPU machines, so the Triton calls and the library loading are stood in
for by recorders; the GPU test (tests/gpu/test_whisper_gpu.py) checks the real ones after a model load."""
import collections
import importlib
import sys
import threading
import time
import types

import pytest
import torch

from ostinato.ops import triton_support
from ostinato.runtime import preparation


def test_no_helper_thread_where_kernels_cannot_run():
    before = set(threading.enumerate())
    with preparation.prepared_in_background(torch.device("cpu")):
        started = [t for t in threading.enumerate() if t not in before]
    assert started == []


@pytest.fixture
def recording_triton(monkeypatch):
    """Stand-ins for the Triton entry points ``triton_support.prepare`` calls and for the library
    loading; each records its thread."""
    calls = []

    def record(name, result=None, delay=0.0):
        def call(*args, **kwargs):
            time.sleep(delay)
            calls.append((name, threading.current_thread().name))
            return result
        return call

    class Backend:
        hash = staticmethod(record("backend.hash", "ptxas-version"))

        def parse_options(self, options):
            calls.append(("parse_options", threading.current_thread().name))
            return types.SimpleNamespace(hash=record("options.hash", "options"))

    class JITFunction:
        def __init__(self):
            self.device_caches = collections.defaultdict(tuple)  # as Triton: made on first look

        @property
        def cache_key(self):
            calls.append(("cache_key", threading.current_thread().name))
            return "key"

    modules = {
        "triton": types.ModuleType("triton"),
        "triton.compiler": types.ModuleType("triton.compiler"),
        "triton.compiler.compiler": types.SimpleNamespace(make_backend=lambda target: Backend()),
        "triton.runtime": types.SimpleNamespace(driver=types.SimpleNamespace(
            active=types.SimpleNamespace(get_current_target=record("target", "sm90"),
                                         get_current_device=record("device", 0)))),
        "triton.runtime.cache": types.SimpleNamespace(triton_key=record("triton_key", "key", delay=0.2)),
        "triton.runtime.jit": types.SimpleNamespace(JITFunction=JITFunction),
        "ostinato._fake_kernels": types.SimpleNamespace(kernel=JITFunction(), other=3),
    }
    for name in triton_support.SPECIALIZER_IMPORTS:
        modules[name] = types.ModuleType(name)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)

    def import_module(name):
        calls.append(("import " + name, threading.current_thread().name))
        return importlib.import_module(name)

    monkeypatch.setattr(triton_support, "importlib", types.SimpleNamespace(import_module=import_module))
    monkeypatch.setattr(triton_support, "kernels_can_run", lambda device: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())
    monkeypatch.setattr(preparation, "load_cuda_libraries", record("libraries", delay=0.2))
    return calls


def test_preparation_runs_beside_the_block_and_is_done_when_it_ends(recording_triton):
    calls = recording_triton
    with preparation.prepared_in_background(torch.device("cuda")):
        # the 0.2-s hash and library load are still running: the block was not held up
        assert not {"triton_key", "libraries"} & {name for name, _ in calls}
    triton = [name for name, thread in calls if thread == "ostinato-prepare-triton"]
    assert {"target", "backend.hash", "options.hash", "cache_key"} <= set(triton) and "triton_key" not in triton
    # The installation's 0.2-s hash on a thread of its own, beside the kernels' keys rather than
    # before them; CUDA's libraries on another helper
    assert ("triton_key", "ostinato-triton-key") in calls
    assert calls.index(("cache_key", "ostinato-prepare-triton")) < calls.index(("triton_key", "ostinato-triton-key"))
    assert ("libraries", "ostinato-prepare") in calls and len(triton) == len(calls) - 2
    kernel = sys.modules["ostinato._fake_kernels"].kernel
    assert list(kernel.device_caches) == [0]  # its binder was made for the current device
    # what the binders' first call would import (Gluon's descriptor types), imported on the helper
    for name in triton_support.SPECIALIZER_IMPORTS:
        assert ("import " + name, "ostinato-prepare-triton") in calls


def test_a_failed_preparation_is_only_logged(recording_triton, monkeypatch, caplog):
    def broken():
        raise RuntimeError("no ptxas here")

    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", broken)
    with caplog.at_level("DEBUG", logger="ostinato"):
        with preparation.prepared_in_background(torch.device("cuda")):
            pass
    assert "no ptxas here" in caplog.text
    assert [name for name, _ in recording_triton][-1] == "libraries"  # the libraries still load


def test_a_failed_library_load_is_only_logged(recording_triton, monkeypatch, caplog):
    def broken():
        raise RuntimeError("no cuDNN here")

    monkeypatch.setattr(preparation, "load_cuda_libraries", lambda device: broken())
    with caplog.at_level("DEBUG", logger="ostinato"):
        with preparation.prepared_in_background(torch.device("cuda")):
            pass
    assert "no cuDNN here" in caplog.text


def test_a_hung_preparation_does_not_hold_the_load(recording_triton, monkeypatch, caplog):
    release = threading.Event()

    def hung():
        release.wait(30)

    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", hung)
    monkeypatch.setattr(preparation, "PREPARE_WAIT_S", 0.2)
    start = time.perf_counter()
    with caplog.at_level("WARNING", logger="ostinato.runtime.preparation"):
        with preparation.prepared_in_background(torch.device("cuda")):
            pass
    release.set()
    assert time.perf_counter() - start < 5 and "still running" in caplog.text


def test_work_the_block_adds_runs_on_a_helper_before_the_block_ends(recording_triton, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    calls = recording_triton
    seen = []

    def failing(device):
        raise RuntimeError("no such kernel")

    with caplog.at_level("DEBUG", logger="ostinato"):
        with preparation.prepared_in_background(torch.device("cuda")) as helper:
            helper.also(lambda device: seen.append(("first", device, threading.current_thread().name,
                                                    torch.is_inference_mode_enabled())))
            helper.also(failing)
            helper.also(lambda device: seen.append(("after the failure", device, threading.current_thread().name,
                                                    torch.is_inference_mode_enabled())))
        # the block's exit waited for all of it, in order, after the libraries
        assert [s[0] for s in seen] == ["first", "after the failure"]
    # on a helper of its own, beside Triton's preparation and CUDA's libraries
    assert {s[1:] for s in seen} == {(torch.device("cuda"), "ostinato-first-uses", True)}
    assert ("libraries", "ostinato-prepare") in calls and len(calls) > 1  # Triton's calls too
    assert "no such kernel" in caplog.text


def test_work_with_triton_runs_on_its_thread_once_it_is_prepared(recording_triton, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    calls = recording_triton

    def preload(device):
        calls.append(("preload", threading.current_thread().name))

    with preparation.prepared_in_background(torch.device("cuda")) as helper:
        helper.with_triton(preload)  # queued while Triton is still being prepared
    assert ("preload", "ostinato-prepare-triton") in calls
    on_triton = [name for name, thread in calls if thread == "ostinato-prepare-triton"]
    assert on_triton.index("preload") > on_triton.index("cache_key")  # after its kernels' keys and binders


def test_added_work_is_dropped_where_there_is_no_helper():
    ran = []
    with preparation.prepared_in_background(torch.device("cpu")) as helper:
        helper.also(ran.append)
        helper.with_triton(ran.append)
    assert ran == []
