"""Environment switches are read when asked, not at import; one check says whether the Triton kernels
run; the decode-loop choice is validated once."""
import os
import tempfile
from pathlib import Path

import pytest
import torch

from ostinato import settings
from ostinato.errors import InvalidOptionError
from ostinato.ops import triton_support
from ostinato.ops.triton_support import kernels_can_run
from ostinato.runtime import resolve_decode_loop


def test_switches_are_read_at_call_time(monkeypatch):
    monkeypatch.delenv("OSTINATO_NO_TRITON", raising=False)
    monkeypatch.delenv("OSTINATO_NO_PDL", raising=False)
    assert not settings.triton_disabled() and not settings.pdl_disabled()
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    monkeypatch.setenv("OSTINATO_NO_PDL", "1")
    assert settings.triton_disabled() and settings.pdl_disabled()
    monkeypatch.setenv("OSTINATO_NO_TRITON", "0")
    assert not settings.triton_disabled()


def test_cache_dirs_in_order(monkeypatch, tmp_path):
    monkeypatch.setenv("OSTINATO_CACHE", str(tmp_path / "mine"))
    assert settings.cache_dirs() == [tmp_path / "mine"]
    monkeypatch.delenv("OSTINATO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    dirs = settings.cache_dirs()
    assert dirs[0] == tmp_path / "xdg" / "ostinato" and len(dirs) == 2
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.cache_dirs()[0] == Path.home() / ".cache" / "ostinato"


def test_interpreter_and_api_key_read_at_call_time(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("OSTINATO_API_KEY", raising=False)
    assert not settings.triton_interpreter() and settings.api_key() is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("OSTINATO_API_KEY", "s3cret")
    assert settings.triton_interpreter() and settings.api_key() == "s3cret"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not settings.triton_interpreter()


def test_cache_dirs_fallback_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OSTINATO_CACHE", raising=False)
    user_tmp = Path(tempfile.gettempdir()) / (f"ostinato-{os.getuid()}" if hasattr(os, "getuid") else "ostinato")
    # an empty XDG_CACHE_HOME counts as unset: ~/.cache, then the per-user temp folder
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert settings.cache_dirs() == [tmp_path / "home" / ".cache" / "ostinato", user_tmp]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.cache_dirs() == [tmp_path / "xdg" / "ostinato", user_tmp]
    # OSTINATO_CACHE wins over both and is the only choice; "~" is the user's home
    monkeypatch.setenv("OSTINATO_CACHE", "~/mine")
    assert settings.cache_dirs() == [tmp_path / "home" / "mine"]
    monkeypatch.setenv("OSTINATO_CACHE", "")  # empty: as if unset
    assert settings.cache_dirs()[0] == tmp_path / "xdg" / "ostinato"


def test_hub_variables(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE",
                 "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert settings.hub_cache_dir() == str(tmp_path / "hf" / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert settings.hub_cache_dir() == str(tmp_path / "direct")
    assert not settings.hub_offline()
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "yes")
    assert settings.hub_offline()


def test_one_kernel_check(monkeypatch):
    monkeypatch.delenv("OSTINATO_NO_TRITON", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    # never on the CPU, with or without a dtype, for a device, its name or a tensor
    assert not kernels_can_run("cpu")
    assert not kernels_can_run(torch.zeros(1, dtype=torch.float16), torch.float16)
    # float32 keeps PyTorch's ops on every device
    assert not kernels_can_run("cuda", torch.float32)
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    assert not kernels_can_run("cuda", torch.float16)
    monkeypatch.delenv("OSTINATO_NO_TRITON")
    # Triton's CPU interpreter runs the kernels that support it, where Triton is installed
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    half = torch.zeros(1, dtype=torch.float16)
    assert kernels_can_run(half, half.dtype, interpreter=True) == triton_support.HAVE_TRITON
    assert not kernels_can_run(half, half.dtype)  # a kernel that needs CUDA
    assert not kernels_can_run(half.float(), torch.float32, interpreter=True)


def test_kernel_check_rules_with_triton_and_a_gpu(monkeypatch):
    """Every rule of the one check, on a CPU-only machine: Triton and CUDA are stood in for."""
    for name in ("OSTINATO_NO_TRITON", "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(triton_support, "have_triton", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda = torch.device("cuda", 0)
    assert kernels_can_run(cuda) and kernels_can_run("cuda")  # no dtype: the device alone
    assert kernels_can_run(cuda, torch.float16) and kernels_can_run(cuda, torch.bfloat16)
    for dtype in (torch.float32, torch.float64, torch.int64):  # half precision only
        assert not kernels_can_run(cuda, dtype)
    assert not kernels_can_run("cpu", torch.float16)
    assert not kernels_can_run(torch.zeros(1, dtype=torch.float16), torch.float16)  # a CPU tensor
    # the switch, read at call time, for every device and dtype
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    assert not kernels_can_run(cuda) and not kernels_can_run(cuda, torch.float16)
    monkeypatch.setenv("OSTINATO_NO_TRITON", "0")
    assert kernels_can_run(cuda, torch.float16)
    # the interpreter: any device, only for callers whose kernels support it, still half only
    half = torch.zeros(1, dtype=torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels_can_run(half, half.dtype, interpreter=True)
    assert not kernels_can_run(half, half.dtype)
    assert not kernels_can_run(half.float(), torch.float32, interpreter=True)
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    assert not kernels_can_run(half, half.dtype, interpreter=True)
    monkeypatch.delenv("OSTINATO_NO_TRITON")
    # no CUDA runtime, or no Triton: never
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not kernels_can_run(cuda, torch.float16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton_support, "have_triton", lambda: False)
    assert not kernels_can_run(cuda, torch.float16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not kernels_can_run(half, half.dtype, interpreter=True)


def test_module_conditions_on_top_of_the_check(monkeypatch):
    """Whisper's fused step adds only its head-dim rule (64 or 128) to the one check."""
    from ostinato.models.whisper.modules import fused_step_supported

    monkeypatch.delenv("OSTINATO_NO_TRITON", raising=False)
    monkeypatch.setattr(triton_support, "have_triton", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda = torch.device("cuda", 0)
    assert fused_step_supported(cuda, torch.float16, 64) and fused_step_supported(cuda, torch.bfloat16, 128)
    assert not fused_step_supported(cuda, torch.float16, 80)
    assert not fused_step_supported(cuda, torch.float32, 64)
    assert not fused_step_supported(torch.device("cpu"), torch.float16, 64)
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    assert not fused_step_supported(cuda, torch.float16, 64)


def test_pdl_switch(monkeypatch):
    monkeypatch.setenv("OSTINATO_NO_PDL", "1")  # checked before the device is ever asked
    assert triton_support.pdl_options(torch.device("cuda", 0), 1) == {"PDL": False}
    monkeypatch.delenv("OSTINATO_NO_PDL")
    assert triton_support.pdl_options(torch.device("cpu"), 1) == {"PDL": False}


def test_decode_loop_choice(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_decode_loop("auto", cpu) == "eager"
    assert resolve_decode_loop("eager", cpu) == "eager"
    assert resolve_decode_loop("auto", cpu, use_graphs=False) == "eager"
    for rung in ("device", "kstep"):
        with pytest.raises(InvalidOptionError, match="needs CUDA graphs"):
            resolve_decode_loop(rung, cpu)
    with pytest.raises(InvalidOptionError, match="decode_loop must be one of"):
        resolve_decode_loop("fast", cpu)
    # on CUDA: the device loop where cuda-python can build it, else K-step graphs
    from ostinato.runtime import device_loop, graphs

    monkeypatch.setattr(graphs, "graphs_supported", lambda device: True)
    monkeypatch.setattr(device_loop, "unavailable_reason", lambda kind: None)
    assert resolve_decode_loop("auto", torch.device("cuda")) == "device"
    assert resolve_decode_loop("kstep", torch.device("cuda")) == "kstep"
    monkeypatch.setattr(device_loop, "unavailable_reason", lambda kind: "cuda-python is not installed")
    assert resolve_decode_loop("auto", torch.device("cuda")) == "kstep"
    with pytest.raises(InvalidOptionError, match="cuda-python is not installed"):
        resolve_decode_loop("device", torch.device("cuda"))


def test_no_pdl_without_triton(monkeypatch):
    """A CUDA machine without Triton launches nothing with PDL, and asking does not import Triton's helpers."""
    monkeypatch.setattr(triton_support, "_triton_imports", lambda: False)
    assert triton_support._pdl_capable.__wrapped__(0) is False
