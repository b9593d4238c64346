"""The fused Whisper rules kernel (logit rules + log-softmax + greedy choice) in Triton's CPU
interpreter (skipped where Triton is not installed): against apply_logit_rules + log_softmax on random
rule states over real vocabulary layouts (dev/rules_kernel_check.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_rules_kernel_in_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(ROOT / "dev" / "rules_kernel_check.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "rules kernel == torch: True", out.stdout


def test_import_and_availability_without_a_gpu(monkeypatch):
    """The module imports (Triton or not) and never offers the kernel for the CPU or when disabled."""
    import torch

    from ostinato.models.whisper.rules_kernel import available

    assert not available("cpu")
    assert not available(torch.zeros(1))
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    assert not available("cuda")
