"""ostinato.ops.skinny (split-K linear with fused epilogue, residual add + LayerNorm) in Triton's CPU
interpreter against float64 PyTorch (skipped where Triton is not installed)."""
import os
import subprocess
import sys
from pathlib import Path

from dev_checks import run_dev_check

ROOT = Path(__file__).resolve().parent.parent


def test_skinny_ops_in_interpreter():
    out = run_dev_check("skinny_check.py", timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "skinny ops == reference: True", out.stdout[-2000:]


def test_import_without_triton():
    """The module imports (and reports unavailable) where Triton is missing."""
    code = ("import sys; sys.modules['triton'] = None; import ostinato.ops.skinny as s; "
            "from ostinato.ops.triton_support import kernels_can_run; "
            "assert not s.HAVE_TRITON and not kernels_can_run('cpu'); print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_pdl_only_on_cuda_and_can_be_switched_off(monkeypatch):
    import torch

    from ostinato.ops.triton_support import pdl_options

    assert pdl_options(torch.device("cpu")) == {"PDL": False}  # no launch_pdl keyword for the interpreter
    monkeypatch.setenv("OSTINATO_NO_PDL", "1")
    assert pdl_options(torch.device("cuda", 0)) == {"PDL": False}
