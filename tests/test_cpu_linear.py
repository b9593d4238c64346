"""ops.cpu_linear: F.linear's values (to float32 summation-order noise) and shapes for any row count,
in both weight layouts; each row computed alone among others, a lone row on MKL's one-row kernel or,
batch-invariant, as among others; the layout chosen by the processor's vendor."""
import pytest
import torch
import torch.nn.functional as F

from ostinato.ops import cpu_linear
from ostinato.ops.cpu_linear import FEW_ROWS, in_major_copy, is_in_major, linear, store_in_major

LAYOUTS = {"out-major": lambda w: w, "in-major": in_major_copy}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (2, 96), (5, 96), (FEW_ROWS, 96), (FEW_ROWS + 3, 96), (2, 1, 96), (3, 2, 96),
                                   (0, 96)])
def test_equals_f_linear(shape, bias, layout):
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[0])
    x = torch.randn(*shape, generator=g)
    w = torch.randn(40, 96, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    stored = LAYOUTS[layout](w)
    assert is_in_major(stored) == (layout == "in-major") and torch.equal(stored, w)
    got = linear(x, stored, b)
    want = F.linear(x, w, b)
    assert got.shape == want.shape == (*shape[:-1], 40)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("out_features", [1152, 51864 // 8])
@pytest.mark.parametrize("invariant", [True, False])
def test_a_row_s_result_does_not_depend_on_the_rows_beside_it(monkeypatch, layout, out_features, invariant):
    """What batching windows and beams on the CPU relies on (transcribe_batch equals transcribe): a
    row gives the same bits among up to FEW_ROWS others, at any place among them, and alone too where
    batch_invariant says so or the weight is stored [out, in]; also for a slice of a packed weight
    (one of q/k/v)."""
    monkeypatch.setattr(cpu_linear, "batch_invariant", invariant)
    g = torch.Generator().manual_seed(out_features)
    w = LAYOUTS[layout](torch.randn(out_features, 384, generator=g))
    b = torch.randn(out_features, generator=g)
    x = torch.randn(FEW_ROWS, 384, generator=g)
    third = out_features // 3
    for weight, bias in ((w, b), (w[third : 2 * third], b[third : 2 * third])):
        assert is_in_major(weight) == (layout == "in-major")
        everyone = linear(x, weight, bias)
        for rows in range(1 if invariant or layout == "out-major" else 2, FEW_ROWS + 1):
            order = torch.randperm(FEW_ROWS, generator=g)[:rows]
            assert torch.equal(linear(x[order], weight, bias), everyone[order]), rows


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("bias", [True, False])
def test_a_lone_row_runs_on_mkl_s_one_row_kernel_where_stored_in_major_unless_batch_invariant(monkeypatch, layout, bias):
    """By default a lone float32 row (also [1, 1, in]) against a weight stored [in, out] gives gemv's
    bits (torch.mv / addmv), which agree with the row among others to rounding; stored [out, in] (the
    EPYC's layout, where the one-column product was slow) and with batch_invariant, the row's bits
    among others."""
    g = torch.Generator().manual_seed(7)
    w = LAYOUTS[layout](torch.randn(1152, 384, generator=g))
    b = torch.randn(1152, generator=g) if bias else None
    x = torch.randn(FEW_ROWS, 384, generator=g)
    among_others = linear(x, w, b)[:1]
    gemv = torch.mv(w, x[0]) if b is None else torch.addmv(b, w, x[0])
    monkeypatch.setattr(cpu_linear, "batch_invariant", False)
    if layout == "in-major":
        assert cpu_linear.lone_rows(layout) == "on the one-row kernel"
        assert torch.equal(linear(x[:1], w, b), gemv[None])
        assert torch.equal(linear(x[:1, None], w, b), gemv[None, None])
        torch.testing.assert_close(linear(x[:1], w, b), among_others, rtol=1e-5, atol=1e-4)  # 384 terms |x w| ~ 1
        wd, xd, bd = w.double(), x[0].double(), None if b is None else b.double()
        assert torch.equal(linear(xd[None], wd, bd), (torch.mv(wd, xd) if b is None else torch.addmv(bd, wd, xd))[None])
    else:
        assert cpu_linear.lone_rows(layout) == "as among others"
        assert torch.equal(linear(x[:1], w, b), among_others)
    monkeypatch.setattr(cpu_linear, "batch_invariant", True)
    assert cpu_linear.lone_rows(layout) == "as among others (OSTINATO_CPU_BATCH_INVARIANT=1)"
    assert torch.equal(linear(x[:1], w, b), among_others)


def test_store_in_major_keeps_each_tensor_and_its_values_and_is_idempotent():
    layer = torch.nn.Linear(96, 40)
    weight, values = layer.weight, layer.weight.detach().clone()
    store_in_major([layer.weight])
    assert layer.weight is weight and is_in_major(weight) and torch.equal(weight, values)
    storage = weight.data_ptr()
    store_in_major([layer.weight])
    assert weight.data_ptr() == storage  # no second copy
    torch.testing.assert_close(layer(torch.ones(3, 96)), F.linear(torch.ones(3, 96), values, layer.bias))


@pytest.mark.parametrize("vendor, mkl, setting, want", [
    ("GenuineIntel", True, "", True),
    ("AuthenticAMD", True, "", False),
    ("GenuineIntel", False, "", False),  # a build without MKL: its BLAS was not measured
    ("", True, "", False),
    ("AuthenticAMD", True, "in-major", True),
    ("GenuineIntel", True, "out-major", False),
    ("GenuineIntel", True, "sideways", True),  # an unknown setting: the vendor decides, with a warning
])
def test_the_layout_follows_the_vendor_unless_the_variable_says(monkeypatch, caplog, vendor, mkl, setting, want):
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    monkeypatch.setenv(cpu_linear.LAYOUT_VARIABLE, setting)
    cpu_linear._cpu_layout.cache_clear()
    try:
        assert cpu_linear.in_major_preferred(torch.device("cpu")) is want
        assert not cpu_linear.in_major_preferred(torch.device("cuda"))
        assert ("neither of" in caplog.text) == (setting == "sideways")
    finally:
        cpu_linear._cpu_layout.cache_clear()


def test_the_vendor_is_read_from_the_processor():
    vendor = cpu_linear.cpu_vendor()
    assert isinstance(vendor, str)
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    if "vendor_id" in text:
        assert vendor and vendor in text


STRICT_PROBE = """
import json, sys, torch
if sys.argv[1] == "mkl-in-use":
    torch.mm(torch.randn(64, 64), torch.randn(64, 64))
from ostinato.ops import cpu_linear
torch.set_num_threads(2)
g = torch.Generator().manual_seed(5)
moved = []
for layout in ("out-major", "in-major"):
    for out_features, in_features in ((1152, 384), (1536, 384), (384, 1536), (384, 384), (51864 // 4, 384)):
        w = torch.randn(out_features, in_features, generator=g)
        w = cpu_linear.in_major_copy(w) if layout == "in-major" else w
        b = torch.randn(out_features, generator=g)
        x = torch.randn(80, in_features, generator=g)
        alone = torch.cat([cpu_linear.linear(x[i : i + 1], w, b) for i in range(80)])
        for rows in range(1, 81):
            if not torch.equal(cpu_linear.linear(x[:rows], w, b), alone[:rows]):
                moved.append([layout, out_features, in_features, rows])
print(json.dumps(dict(mode=cpu_linear.reproducibility(), any_count=cpu_linear.rows_alone_at_any_count, moved=moved,
                      invariant=cpu_linear.batch_invariant)))
"""


def _probe(*args, **env):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    environment = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", cpu_linear.STRICT_VARIABLE)}
    environment.update(PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])), **env)
    environment[cpu_linear.INVARIANT_VARIABLE] = "1"  # the probe compares rows with the same rows alone
    done = subprocess.run([sys.executable, "-c", STRICT_PROBE, *args], capture_output=True, text=True, env=environment,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="a PyTorch without MKL")
def test_in_mkl_s_strict_mode_each_row_is_alone_at_every_count_up_to_a_batch_of_beams():
    """A fresh process that imports the model code before MKL ran: MKL is in strict reproducibility
    mode, and every row of tiny.en's decode-step products (a slice of the vocabulary) gives the bits
    it gives alone (batch-invariant, OSTINATO_CPU_BATCH_INVARIANT=1 read at the import), without a
    second copy of a lone row, at 1 to 80 rows (16 windows of 5 beams), in both layouts: 9 rows and
    more included, where MKL's usual mode splits some sums by the count. Rows of 2 and more run the
    same way without the variable."""
    got = _probe("fresh")
    assert got == dict(mode="on", any_count=True, moved=[], invariant=True)


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="a PyTorch without MKL")
@pytest.mark.parametrize("case", ["mkl-in-use", "turned-off", "user-chose"])
def test_without_strict_mode_a_lone_row_goes_in_twice_and_up_to_few_rows_are_alone(case):
    """Where MKL ran before the import (its mode is fixed by then), or OSTINATO_MKL_STRICT=0 or the
    user's MKL_CBWR leaves it alone, the mode is off and says why, and up to FEW_ROWS rows are still
    each computed alone (a lone row doubled)."""
    env = {"turned-off": {cpu_linear.STRICT_VARIABLE: "0"}, "user-chose": {"MKL_CBWR": "AUTO"}}.get(case, {})
    got = _probe(case, **env)
    why = "MKL was in use" if case == "mkl-in-use" else "MKL_CBWR or OSTINATO_MKL_STRICT=0"
    assert got["mode"].startswith(f"off ({why}") and got["any_count"] is False and got["invariant"] is True
    assert not [m for m in got["moved"] if m[3] <= FEW_ROWS]
