"""ops.cpu_linear: F.linear's values (to float32 summation-order noise) and shapes for any row count,
in both weight layouts; each row computed alone; the layout chosen by the processor's vendor."""
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
def test_a_row_s_result_does_not_depend_on_the_rows_beside_it(layout, out_features):
    """What batching windows and beams on the CPU relies on (transcribe_batch equals transcribe): a
    row gives the same bits alone, among up to FEW_ROWS others, at any place among them; also for a
    slice of a packed weight (one of q/k/v)."""
    g = torch.Generator().manual_seed(out_features)
    w = LAYOUTS[layout](torch.randn(out_features, 384, generator=g))
    b = torch.randn(out_features, generator=g)
    x = torch.randn(FEW_ROWS, 384, generator=g)
    third = out_features // 3
    for weight, bias in ((w, b), (w[third : 2 * third], b[third : 2 * third])):
        assert is_in_major(weight) == (layout == "in-major")
        everyone = linear(x, weight, bias)
        for rows in range(1, FEW_ROWS + 1):
            order = torch.randperm(FEW_ROWS, generator=g)[:rows]
            assert torch.equal(linear(x[order], weight, bias), everyone[order]), rows


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
