"""Check ostinato.ops.fused_linear (linear_silu, linear_glu) against float64.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/fused_linear_check.py   # CPU: the kernels themselves
    PYTHONPATH=src python dev/fused_linear_check.py                                     # on a GPU (also times them)

Shapes cover partial tiles in every dimension (M, N, K not multiples of the tiles) and several
persistent programs (float16 in the interpreter, float16 and bfloat16 on the GPU); every output
within half-precision rounding of the float64 result; a row's result the same bits whether it is
computed alone or among others. Ends with ``fused linear ok: True``.
"""
import sys

import torch
import torch.nn.functional as F

from ostinato import settings
from ostinato.ops import fused_linear as fl

KINDS = {"silu": (False, lambda y: F.silu(y), lambda n: n),
         "glu": (True, lambda y: F.glu(y, dim=-1), lambda n: n // 2)}


def launch(kind, x, w, b, programs):
    """The kernel itself (on the CPU the public functions would take the PyTorch path)."""
    if not settings.triton_interpreter():
        return getattr(fl, f"linear_{kind}")(x, w, b)
    glu, _, width = KINDS[kind]
    m, k = x.shape
    n = width(w.shape[0])
    out = torch.empty(m, n, dtype=x.dtype)
    cfg = fl.CONFIG[kind]
    td = fl.TensorDescriptor
    fl._linear_act_kernel[(programs,)](
        td.from_tensor(x, [cfg["BM"], cfg["BK"]]), td.from_tensor(w, [cfg["BN"], cfg["BK"]]),
        td.from_tensor(out, [cfg["BM"], cfg["BN"]]), b, m, n, k, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
        GROUP_M=cfg["GROUP_M"], PROGRAMS=programs, GLU=glu)
    return out


def check(kind, device, m, n, k, dtype, programs=3) -> bool:
    g = torch.Generator().manual_seed(m * 7 + n)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    got = launch(kind, x, w, b, programs)
    ref = KINDS[kind][1](x.double() @ w.double().t() + b.double())
    # half precision: the product's fp32 rounding plus the output's rounding
    tol = (2 ** -8 if dtype == torch.float16 else 2 ** -5) * ref.abs() + 2e-3
    close = got.shape == ref.shape and bool(((got.double() - ref).abs() <= tol).all())
    alone = launch(kind, x[m // 2:m // 2 + 1].contiguous(), w, b, 1)
    same_row = torch.equal(alone, got[m // 2:m // 2 + 1])
    print(f"{kind} M {m} N {n} K {k} {str(dtype)[6:]}: close {close}, a row alone == among others {same_row}")
    return close and same_row


def timing() -> None:
    import triton.testing
    m, k = 29250, 1024
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    for kind, n, torch_op in (("silu", 4096, lambda y: F.silu(y, inplace=True)), ("glu", 2048, lambda y: F.glu(y, -1))):
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.03
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        fused = triton.testing.do_bench(lambda: getattr(fl, f"linear_{kind}")(x, w, b), return_mode="median") * 1e3
        plain = triton.testing.do_bench(lambda: torch_op(torch.addmm(b, x, w.t())), return_mode="median") * 1e3
        print(f"{m} x {k} -> {n}: linear_{kind} {fused:.1f} us, cuBLAS addmm + {kind} {plain:.1f} us")


def main() -> int:
    device = "cpu" if settings.triton_interpreter() else "cuda"
    if device == "cpu":
        from decode_attention_check import patch_interpreter_index

        patch_interpreter_index()  # the persistent loop starts at a program id, under NumPy >= 2.4
    if device == "cuda" and not fl.fused_linear_supported(torch.empty(1, 8, device="cuda", dtype=torch.float16),
                                                          torch.empty(16, 8, device="cuda", dtype=torch.float16)):
        print("fused linear kernels not supported on this device")
        return 1
    shapes = [(300, 208, 64), (1, 16, 8), (130, 272, 136)] if device == "cpu" else \
        [(300, 208, 64), (1, 16, 8), (130, 272, 136), (29250, 4096, 1024), (5000, 2048, 1024)]
    # bfloat16 on the GPU only: Triton 3.6's interpreter reads bfloat16 through tensor descriptors as garbage
    dtypes = (torch.float16,) if device == "cpu" else (torch.float16, torch.bfloat16)
    ok = all([check(kind, device, m, n, k, dtype) for kind in KINDS for m, n, k in shapes for dtype in dtypes])
    if device == "cuda":
        timing()
    print(f"fused linear ok: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
