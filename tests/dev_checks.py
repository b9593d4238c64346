"""Running a dev/*_check.py script from a test: the kernel checks print a verdict as their last line.

With ``interpret`` the script runs in Triton's CPU interpreter (the test skips where Triton is not
installed); without it, on the device the script finds (CUDA for the GPU tests).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_dev_check(script: str, *, interpret: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    pytest.importorskip("triton")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, str(ROOT / "dev" / script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
