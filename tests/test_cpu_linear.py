"""ops.cpu_linear: F.linear's values (to float32 summation-order noise) and shapes for any row count."""
import pytest
import torch
import torch.nn.functional as F

from ostinato.ops.cpu_linear import FEW_ROWS, linear


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (2, 96), (5, 96), (FEW_ROWS, 96), (FEW_ROWS + 3, 96), (2, 1, 96), (3, 2, 96),
                                   (0, 96)])
def test_equals_f_linear(shape, bias):
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[0])
    x = torch.randn(*shape, generator=g)
    w = torch.randn(40, 96, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    got = linear(x, w, b)
    want = F.linear(x, w, b)
    assert got.shape == want.shape == (*shape[:-1], 40)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
