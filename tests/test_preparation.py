"""ops.triton_support.prepared_in_background: Triton's once-per-process work on a helper thread.

Triton is not installed on the CPU machines, so the Triton calls are stood in for by recording
modules; the GPU test (tests/gpu/test_whisper_gpu.py) checks the real ones after a model load."""
import sys
import threading
import time
import types

import pytest
import torch

from ostinato.ops import triton_support


def test_no_helper_thread_where_kernels_cannot_run():
    before = set(threading.enumerate())
    with triton_support.prepared_in_background(torch.device("cpu")):
        started = [t for t in threading.enumerate() if t not in before]
    assert started == []


@pytest.fixture
def recording_triton(monkeypatch):
    """Stand-ins for the Triton entry points _prepare calls; each records its thread."""
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
        @property
        def cache_key(self):
            calls.append(("cache_key", threading.current_thread().name))
            return "key"

    modules = {
        "triton": types.ModuleType("triton"),
        "triton.compiler": types.ModuleType("triton.compiler"),
        "triton.compiler.compiler": types.SimpleNamespace(make_backend=lambda target: Backend()),
        "triton.runtime": types.SimpleNamespace(driver=types.SimpleNamespace(
            active=types.SimpleNamespace(get_current_target=record("target", "sm90")))),
        "triton.runtime.cache": types.SimpleNamespace(triton_key=record("triton_key", "key", delay=0.2)),
        "triton.runtime.jit": types.SimpleNamespace(JITFunction=JITFunction),
        "ostinato._fake_kernels": types.SimpleNamespace(kernel=JITFunction(), other=3),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(triton_support, "kernels_can_run", lambda device: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())
    return calls


def test_preparation_runs_beside_the_block_and_is_done_when_it_ends(recording_triton):
    calls = recording_triton
    with triton_support.prepared_in_background(torch.device("cuda")):
        assert calls == []  # the 0.2-s hash is still running: the block was not held up
    names = [name for name, _ in calls]
    assert names[:1] == ["triton_key"] and {"target", "backend.hash", "options.hash", "cache_key"} <= set(names)
    assert {thread for _, thread in calls} == {"ostinato-triton-prepare"}


def test_a_failed_preparation_is_only_logged(recording_triton, monkeypatch, caplog):
    def broken():
        raise RuntimeError("no ptxas here")

    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", broken)
    with caplog.at_level("DEBUG", logger="ostinato.ops.triton_support"):
        with triton_support.prepared_in_background(torch.device("cuda")):
            pass
    assert "no ptxas here" in caplog.text


def test_a_hung_preparation_does_not_hold_the_load(recording_triton, monkeypatch, caplog):
    release = threading.Event()

    def hung():
        release.wait(30)

    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", hung)
    monkeypatch.setattr(triton_support, "PREPARE_WAIT_S", 0.2)
    start = time.perf_counter()
    with caplog.at_level("WARNING", logger="ostinato.ops.triton_support"):
        with triton_support.prepared_in_background(torch.device("cuda")):
            pass
    release.set()
    assert time.perf_counter() - start < 5 and "still running" in caplog.text
