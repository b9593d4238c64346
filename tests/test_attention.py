"""ops.attention on the CPU: PyTorch's scaled_dot_product_attention."""
import torch
import torch.nn.functional as F

from ostinato.ops.attention import attention


def test_on_the_cpu_it_is_pytorchs_attention():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=gen) for n in (5, 7, 7))
    mask = torch.rand(5, 7, generator=gen) > 0.3
    mask[:, 0] = True
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(attention(q, k, v, attn_mask=mask), expected)
    s = (q @ k.transpose(-1, -2)) / 4.0  # by hand: softmax(q k^T / sqrt(16)) v over the unmasked keys
    by_hand = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
    assert torch.allclose(expected, by_hand, atol=1e-6)
