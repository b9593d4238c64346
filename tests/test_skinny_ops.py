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


def test_skinny_kernel_compiles_as_meant_for_hopper():
    """Compiled for sm_90 without a GPU: grouped K chunks never fold into the dot's accumulator (the
    interpreter cannot see that rounding), and the K loop is pipelined."""
    out = run_dev_check("skinny_compile_check.py", interpret=False, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "skinny kernel compiles as meant: True", out.stdout[-2000:]


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

    assert pdl_options(torch.device("cpu"), 1) == {"PDL": False}  # no launch_pdl keyword for the interpreter
    monkeypatch.setenv("OSTINATO_NO_PDL", "1")
    assert pdl_options(torch.device("cuda", 0), 1) == {"PDL": False}


def test_pdl_only_for_launches_of_few_rows(monkeypatch):
    import torch

    from ostinato.ops import triton_support

    monkeypatch.delenv("OSTINATO_NO_PDL", raising=False)
    monkeypatch.setattr(triton_support, "_pdl_capable", lambda index: True)
    cuda = torch.device("cuda", 0)
    assert triton_support.pdl_options(cuda, 5) == {"PDL": True, "launch_pdl": True}
    assert triton_support.pdl_options(cuda, triton_support.PDL_MAX_ROWS) == {"PDL": True, "launch_pdl": True}
    assert triton_support.pdl_options(cuda, triton_support.PDL_MAX_ROWS + 1) == {"PDL": False}


def test_linear_plan_keeps_the_sum_and_groups_chunks_for_many_rows():
    from ostinato.ops.skinny import linear_plan

    for n, k in ((1280, 1280), (3840, 1280), (5120, 1280), (1280, 5120), (384, 1536)):
        one = linear_plan(1, n, k, 132)
        assert one["group"] == 1 and one["programs_k"] == one["splits"]
        for m in (5, 16, 17, 40, 80, 150):
            plan = linear_plan(m, n, k, 132)
            # the sum's order (chunks of whole tiles) is the one-row plan's at every M
            assert (plan["splits"], plan["tiles"], plan["block_k"]) == (one["splits"], one["tiles"], one["block_k"])
            # every chunk goes to exactly one program
            assert (plan["programs_k"] - 1) * plan["group"] < plan["splits"] <= plan["programs_k"] * plan["group"]
            programs = plan["n_blocks"] * plan["m_blocks"] * plan["programs_k"]
            assert plan["m_blocks"] == 1 or programs <= 2 * 132 or plan["group"] == plan["splits"]
            assert plan["stages"] == (4 if plan["group"] > 1 else 3)
    # large-v3 at 16 windows x 5 beams, by hand: 1280x1280 has 20 column blocks and 10 chunks of one
    # tile; five 16-row blocks x 20 column blocks fit one program an SM (100 <= 132), so each program
    # takes all 10 chunks and no partial goes through the workspace
    assert linear_plan(80, 1280, 1280, 132) == dict(block_m=16, block_n=64, block_k=128, m_blocks=5, n_blocks=20,
                                                     tiles=1, splits=10, group=10, programs_k=1, stages=4)
    # 3840x1280 (60 column blocks): 16 rows would be 300 pairs, 32 rows 180, 64 rows 120: one wave
    assert linear_plan(80, 3840, 1280, 132)["block_m"] == 64
    assert linear_plan(40, 3840, 1280, 132)["block_m"] == 32
    # 5120x1280: no height fits one wave (80 column blocks x 2 row blocks of 64 is 160): 32 rows, one group
    assert linear_plan(80, 5120, 1280, 132)["block_m"] == 32 and linear_plan(80, 5120, 1280, 132)["programs_k"] == 1
    # a single 64-row block keeps the one-row plan's chunk a program: 80 x 4 programs are no wave either
    assert linear_plan(40, 5120, 1280, 132)["block_m"] == 16
    # the vocabulary projection (no split K) keeps the old depth
    assert linear_plan(80, 51866, 1280, 132)["stages"] == 3


def test_small_products_take_whole_k_chunks_in_narrow_blocks():
    from ostinato.ops.skinny import linear_plan, small_product

    # tiny.en's half-precision layer products are small, large-v3's and any vocabulary projection are not
    assert all(small_product(n, k, 2) for n, k in ((384, 384), (1152, 384), (1536, 384), (384, 1536)))
    assert not any(small_product(n, k, 2) for n, k in ((1280, 1280), (51864, 384), (384, 1536 * 2)))
    for m in (1, 16, 80, 256):
        # by hand: 384 x 1536 in 32-column blocks: 12 blocks, K in 6 tiles of 256, one chunk, no workspace
        plan = linear_plan(m, 384, 1536, 132, whole_k=True)
        assert (plan["block_n"], plan["n_blocks"], plan["block_k"], plan["tiles"], plan["splits"], plan["programs_k"]) \
            == (32, 12, 256, 6, 1, 1)
    assert linear_plan(1, 384, 1536, 132)["splits"] > 1  # the default plan splits K


def test_importing_ostinato_leaves_triton_alone(tmp_path):
    """``from ostinato import WhisperModel`` (what the CLI and a script do first) does not import
    Triton (0.3-0.7 s): a stand-in Triton on the path marks each import of it, which a kernel
    module's import does make."""
    fake, mark = tmp_path / "triton", tmp_path / "imported"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write('x')\nraise ImportError('stand-in')\n")
    code = ("import os; import ostinato; from ostinato import WhisperModel, load_model; "
            f"print('after ostinato:', os.path.exists({str(mark)!r})); "
            "import ostinato.ops.skinny as s; "
            f"print('after a kernel module:', os.path.exists({str(mark)!r}), s.HAVE_TRITON)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "src")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "after ostinato: False" in out.stdout, out.stdout
    assert "after a kernel module: True False" in out.stdout, out.stdout
