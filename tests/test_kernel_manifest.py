"""ops.kernel_manifest: the Triton specializations a model's processes launched, recorded through
Triton's post-compile hook and brought back by the next load. Triton's side is stood in for here
(the CPU machine has none); tests/gpu/test_whisper_gpu.py runs the real thing across two processes."""
import contextlib
import json
import types

import pytest
import torch

from ostinato.ops import kernel_manifest, triton_support


class FakeKernel:
    """A JITFunction as the manifest sees one: its full name, source key, per-device kernel caches
    (kernel cache, key cache, target, ...), preload."""

    def __init__(self, name, source="src1"):
        self._fn_name = name
        self.cache_key = source
        self.device_caches = {0: ({}, {}, "cuda:90", None, None)}
        self.preloaded = []

    def preload(self, data):
        key = json.loads(data)["key"]
        compiled = types.SimpleNamespace(run="launcher")
        self.device_caches[0][0][key] = compiled
        self.preloaded.append(key)
        return compiled


def launched(kernel, key):
    """What Triton's post-compile hook receives when ``kernel`` first launches specialization ``key``."""
    kernel.device_caches[0][0][key] = types.SimpleNamespace(
        metadata_group={"k.json": f"/cache/files-{key}/k.json", "k.cubin": f"/cache/files-{key}/k.cubin"})
    data = json.dumps({"name": kernel._fn_name, "key": key})
    return dict(key=key, repr="", fn=types.SimpleNamespace(jit_function=kernel),
                compile={"device": 0, "specialization_data": data}, is_manual_warmup=False, already_compiled=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_manifest, "cache_folder", lambda: tmp_path)
    monkeypatch.setattr(kernel_manifest, "_built", lambda jit, target: f"{jit.cache_key} 3.6.0 {target}")
    monkeypatch.setattr(kernel_manifest, "_recording", {})
    monkeypatch.delenv("OSTINATO_NO_KERNEL_MANIFEST", raising=False)
    return tmp_path


def test_a_process_records_its_kernels_and_the_manifest_keeps_every_process_s(cache):
    ours, other = FakeKernel("ostinato.ops.skinny._linear_kernel"), FakeKernel("somebody.else._kernel")
    kernel_manifest._recording["whisper-x"] = {}
    for kernel, key in ((ours, "k1"), (other, "k9"), (ours, "k2")):
        kernel_manifest._note(**launched(kernel, key))
    kernel_manifest.save()
    entries = json.loads(kernel_manifest.manifest_path("whisper-x").read_text())
    assert [(e["kernel"], e["key"], e["files"], e["built"]) for e in entries] == [
        ("ostinato.ops.skinny._linear_kernel", "k1", "files-k1", "src1 3.6.0 cuda:90"),
        ("ostinato.ops.skinny._linear_kernel", "k2", "files-k2", "src1 3.6.0 cuda:90")]
    # a later process's kernels join the earlier ones'
    kernel_manifest._recording["whisper-x"] = {}
    kernel_manifest._note(**launched(ours, "k3"))
    kernel_manifest.save()
    assert [e["key"] for e in json.loads(kernel_manifest.manifest_path("whisper-x").read_text())] == ["k1", "k2", "k3"]


def test_the_hook_chains_the_one_before_and_never_raises(cache):
    seen = []
    hook = kernel_manifest._chained(lambda **kwargs: seen.append(kwargs["key"]) or "theirs")
    kernel_manifest._recording["m"] = {}
    assert hook(**launched(FakeKernel("ostinato.a._k"), "k1")) == "theirs"
    broken = dict(launched(FakeKernel("ostinato.a._k"), "k2"), compile={})  # no device: the note fails quietly
    assert hook(**broken) == "theirs"
    assert seen == ["k1", "k2"] and list(kernel_manifest._recording["m"]) == ["ostinato.a._k k1"]


def test_a_load_preloads_what_the_manifest_lists_and_is_cached(cache, monkeypatch):
    kernel = FakeKernel("ostinato.ops.skinny._linear_kernel")
    entries = [dict(kernel=kernel._fn_name, key=key, data=json.dumps({"key": key}), files=files,
                    built=f"{source} 3.6.0 cuda:90")
               for key, files, source in (("k1", "h1", "src1"), ("k2", "gone", "src1"), ("k3", "h3", "src1"),
                                          ("k4", "h4", "src1"), ("k6", "h1", "src0"))]
    entries.append(dict(kernel="ostinato.removed._kernel", key="k5", data="{}", files="h1", built="src1 3.6.0 cuda:90"))
    path = kernel_manifest.manifest_path("whisper-x")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(entries))
    for files in ("h1", "h3", "h4"):
        (cache / files).mkdir()
    kernel.device_caches[0][0]["k4"] = object()  # launched already in this process
    monkeypatch.setattr(triton_support, "kernels_can_run", lambda device: True)
    monkeypatch.setattr(triton_support, "loaded_kernels", lambda: [kernel])
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # k2's files are gone from the cache (a load never compiles), k4 is there already, k5's kernel is
    # gone, k6 was built from another source of the kernel (it would compile)
    assert kernel_manifest.preload("whisper-x", torch.device("cuda")) == 2
    assert kernel.preloaded == ["k1", "k3"]
    assert kernel_manifest.preload("no-such-model", torch.device("cuda")) == 0
    # a load spends at most its budget on them: the rest wait for their first launch
    kernel.device_caches[0][0].clear()
    monkeypatch.setattr(kernel_manifest, "PRELOAD_BUDGET_S", -1.0)
    assert kernel_manifest.preload("whisper-x", torch.device("cuda")) == 0


def test_switched_off_nothing_is_recorded_or_preloaded(cache, monkeypatch):
    monkeypatch.setenv("OSTINATO_NO_KERNEL_MANIFEST", "1")
    kernel_manifest.record("whisper-x")
    assert kernel_manifest._recording == {}
    assert kernel_manifest.preload("whisper-x", torch.device("cuda")) == 0


def test_a_damaged_manifest_is_read_as_empty(cache):
    path = kernel_manifest.manifest_path("whisper-x")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert kernel_manifest._read(path) == []
    path.write_text(json.dumps([{"kernel": "ostinato.a._k"}, 3,
                                {"kernel": "k", "key": "1", "data": "", "files": "f", "built": "b"}]))
    assert len(kernel_manifest._read(path)) == 1


def test_names_follow_the_model_s_shapes():
    a = kernel_manifest.manifest_name("whisper", {"n_text_layer": 4}, torch.float16)
    assert a == kernel_manifest.manifest_name("whisper", {"n_text_layer": 4}, torch.float16)
    assert a != kernel_manifest.manifest_name("whisper", {"n_text_layer": 4}, torch.float32)
    assert a.startswith("whisper-")
