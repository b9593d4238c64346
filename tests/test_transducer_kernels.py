"""The transducer's Triton kernels in Triton's CPU interpreter (skipped where Triton is not installed):
fused decode step == PyTorch step (RNN-T and TDT, max_symbols forcing, odd steps per replay), the
conv-module kernel and the relative-position attention bias against float32 PyTorch."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_fused_kernels_in_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(ROOT / "dev" / "transducer_fused_check.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.count("fused == torch: True") == 2, out.stdout
