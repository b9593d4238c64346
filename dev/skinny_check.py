"""Check ostinato.ops.skinny (linear, add_layer_norm) against a float64 PyTorch reference on fresh inputs.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/skinny_check.py   # CPU
    PYTHONPATH=src python dev/skinny_check.py                                     # on a GPU

Inputs are strided views (rows of wider buffers, some with leading dims), outputs start as NaN so every
element must be written, and a second call without ``out`` must give identical values (the split-K
sum is deterministic), and rows computed together (several row blocks, K chunks in groups) equal the
same rows a few at a time, bit for bit; a language model's decode-step folds (RMSNorm on load,
SwiGLU, residual add with square sums) against the unfused ops; on a GPU, products with their weights
prefetched under PDL equal to those without. The interpreter runs small shapes in float32 and float16
(bfloat16 and the large-v3 sizes only on a GPU: numpy has no bfloat16, and the interpreter is slow).
Prints one line
per case and ends with ``skinny ops == reference: True`` (exit 1 otherwise). SEED=n repeats a run.
"""
import itertools
import os
import sys
import time

import torch
import torch.nn.functional as F

from ostinato.ops import skinny

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
FLAGS = list(itertools.product((False, True), repeat=3))  # (bias, gelu, residual)


def rel_err(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def strided(shape, dtype, device, lead=False):
    """A [M, C] view whose rows lie 7 elements apart past their end; with ``lead`` a [M, 1, C] view."""
    m, c = shape
    t = torch.randn(m, c + 7, device=device).to(dtype)[:, :c]
    return t.unsqueeze(1) if lead else t


def check_decode_fusions(m, n, k, dtype, device, parts=4):
    """A language model's decode-step folds (``linear_op``): RMSNorm on load from per-row square sums
    given in ``parts`` pieces (both rounding conventions), SwiGLU of the input's halves, the residual
    add with the output's square sums, against float64 products of the unfused ops
    (``models.llm.fusion``, which define the numbers); the operator gives the function's bits."""
    from ostinato.models.llm import fusion

    x = strided((m, k), dtype, device)
    w = (torch.randn(n, k, device=device) / k ** 0.5).to(dtype)
    norm_w = (torch.rand(k, device=device) + 0.5).to(dtype)
    square_sums = x.float().pow(2).view(m, parts, k // parts).sum(-1).contiguous()
    ok, err = True, 0.0
    for zero_centered in (False, True):
        got = skinny.linear_op(x, w, None, square_sums, norm_w, 1e-6, zero_centered)[0]
        ref = fusion.rms_norm(x, norm_w, 1e-6, zero_centered).double() @ w.double().T
        e = rel_err(got, ref)
        ok &= e < TOLERANCE[dtype] * 2 and not torch.isnan(got).any().item()  # a norm rounding apart at most
        err = max(err, e)
    both = strided((m, 2 * k), dtype, device)
    residual = strided((m, n), dtype, device)
    got, sums = skinny.linear_op(both, w, residual, None, None, 0.0, False, True, True)
    ref = fusion.swiglu(both).double() @ w.double().T + residual.double()
    e = rel_err(got, ref)
    want_sums = got.double().pow(2).view(m, -1, skinny.BLOCK_N).sum(-1) if n % skinny.BLOCK_N == 0 else None
    ok &= e < TOLERANCE[dtype] and (want_sums is None or torch.allclose(sums.double(), want_sums, rtol=1e-5))
    ok &= torch.equal(got, skinny.linear(both, w, residual=residual, swiglu=True, one_wave=True))
    err = max(err, e)
    print(f"decode folds M={m} N={n} K={k} {str(dtype)[6:]:8s} rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return ok


def check_linear(m, n, k, dtype, flags, device, in_place=False, twice=True, whole_k=None):
    has_bias, gelu, has_res = flags
    lead = m % 2 == 1  # odd M: [M, 1, K] inputs, as the decoder's [batch, 1, d]
    x = strided((m, k), dtype, device, lead)
    w = (torch.randn(n, k, device=device) / k ** 0.5).to(dtype)
    b = (torch.randn(n, device=device) * 0.5).to(dtype) if has_bias else None
    r = strided((m, n), dtype, device, lead) if has_res or in_place else None
    ref = x.double() @ w.double().T
    if b is not None:
        ref = ref + b.double()
    if gelu:
        ref = F.gelu(ref)
    if r is not None:
        ref = ref + r.double()
    t0 = time.perf_counter()
    fresh = skinny.linear(x, w, b, residual=r, gelu=gelu, whole_k=whole_k) if twice or in_place else None
    # the in-place output overwrites the residual it adds; others start as NaN
    out = r if in_place else torch.full(ref.shape, float("nan"), device=device, dtype=dtype)
    got = skinny.linear(x, w, b, residual=r, gelu=gelu, out=out, whole_k=whole_k)
    fresh = got if fresh is None else fresh
    err = rel_err(got, ref)
    ok = (got is out and got.dtype == dtype and got.shape == ref.shape and not torch.isnan(got).any().item()
          and err < TOLERANCE[dtype] and torch.equal(fresh, got))
    plan = skinny.linear_plan(x.numel() // k, n, k, skinny._sm_count(device), x.element_size(),
                              whole_k=_whole_k(whole_k, n, k, x))
    print(f"{time.perf_counter() - t0:5.2f}s linear M={m:2d} N={n:5d} K={k:4d} {str(dtype)[6:]:8s} "
          f"bias={has_bias:d} gelu={gelu:d} res={has_res:d}{' in-place' if in_place else ''} "
          f"blocks={plan['n_blocks']}x{plan['m_blocks']} of {plan['block_n']} splits={plan['splits']} "
          f"rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return ok


def _whole_k(whole_k, n, k, x):
    """The plan ``linear`` takes for ``whole_k`` (None: by the weight's size)."""
    return skinny.small_product(n, k, x.element_size()) if whole_k is None else whole_k


def check_rows_alone(m, n, k, dtype, device, piece=5, whole_k=None):
    """A row's result does not depend on the other rows of the call (batched decoding equals one
    window at a time): M rows at once equal the same rows ``piece`` at a time, bit for bit."""
    x = strided((m, k), dtype, device)
    w = (torch.randn(n, k, device=device) / k ** 0.5).to(dtype)
    b = (torch.randn(n, device=device) * 0.5).to(dtype)
    r = strided((m, n), dtype, device)
    t0 = time.perf_counter()
    whole = skinny.linear(x, w, b, residual=r, gelu=True, whole_k=whole_k)
    pieces = torch.cat([skinny.linear(x[i:i + piece], w, b, residual=r[i:i + piece], gelu=True, whole_k=whole_k)
                        for i in range(0, m, piece)])
    ref = F.gelu(x.double() @ w.double().T + b.double()) + r.double()
    err = rel_err(whole, ref)
    ok = torch.equal(whole, pieces) and err < TOLERANCE[dtype]
    plan = skinny.linear_plan(m, n, k, skinny._sm_count(device), x.element_size(), whole_k=_whole_k(whole_k, n, k, x))
    print(f"{time.perf_counter() - t0:5.2f}s linear M={m:3d} N={n:5d} K={k:4d} {str(dtype)[6:]:8s} rows "
          f"{piece} at a time: {plan['m_blocks']} block(s) of {plan['block_m']} rows, splits={plan['splits']} "
          f"in groups of {plan['group']} "
          f"rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return ok


def check_add_layer_norm(m, n, dtype, with_update, mode, device):
    """mode: 'new' (fresh outputs), 'poison' (NaN-filled out/out_residual) or 'in-place' (out_residual=x)."""
    x = strided((m, n), dtype, device, lead=m % 2 == 1) * 3 + 1  # offset mean: the variance must not cancel
    u = strided((m, n), dtype, device, lead=m % 2 == 1) if with_update else None
    wdt = torch.float32 if m == 3 else dtype  # float32 LayerNorm parameters with half activations once
    w = (1 + 0.2 * torch.randn(n, device=device)).to(wdt)
    b = (0.2 * torch.randn(n, device=device)).to(wdt)
    new_ref = x + u if with_update else x.clone()  # the dtype rounding of the unfused add
    ref = F.layer_norm(new_ref.double(), (n,), w.double(), b.double(), 1e-5)
    x_before = x.clone()
    out_res = out = None
    if mode == "poison":
        out = torch.full(x.shape, float("nan"), device=device, dtype=dtype)
        out_res = torch.full(x.shape, float("nan"), device=device, dtype=dtype) if with_update else None
    elif mode == "in-place":
        out_res = x
    t0 = time.perf_counter()
    fresh_x, fresh_y = skinny.add_layer_norm(x_before, u, w, b, out_residual=None)
    new_x, y = skinny.add_layer_norm(x, u, w, b, out_residual=out_res, out=out)
    err = rel_err(y, ref)
    # half precision: within one unit in the last place of PyTorch's LayerNorm computed in float32 and
    # rounded once, as its half kernels do (plus float32 noise where the bias cancels the normalised value)
    torch_y = F.layer_norm(new_ref.float(), (n,), w.float(), b.float(), 1e-5).to(dtype).float()
    ulps = ((y.float() - torch_y).abs() / (torch.finfo(dtype).eps * torch.maximum(torch_y.abs(), y.float().abs())
                                            + 2**-20)).max().item()
    ok = ((ulps <= 1.0 or dtype == torch.float32) and torch.equal(new_x, new_ref) and torch.equal(fresh_x, new_ref)
          and torch.equal(fresh_y, y) and not torch.isnan(y).any().item() and y.dtype == dtype
          and err < TOLERANCE[dtype])
    if out is not None:
        ok &= y is out and (out_res is None or new_x is out_res)
    if mode == "in-place":
        ok &= new_x is x and torch.equal(x, new_ref)
    elif with_update:
        ok &= torch.equal(x, x_before)  # x itself untouched unless asked
        # the sum normed but not stored: the same norm, x untouched, None in its place
        unstored, y_only = skinny.add_layer_norm(x, u, w, b, store_residual=False)
        ok &= unstored is None and torch.equal(y_only, fresh_y) and torch.equal(x, x_before)
    print(f"{time.perf_counter() - t0:5.2f}s add_layer_norm M={m:2d} N={n:5d} {str(dtype)[6:]:8s} "
          f"update={with_update:d} {mode:8s} rel err {err:.2e} vs torch {ulps:.2f} ulp {'ok' if ok else 'FAIL'}")
    return ok


def check_prefetch(m, n, k, dtype, device):
    """On a GPU with PDL: a Whisper step's products with their weights asked into L2 ahead
    (``prefetch=True``) give the same bits as without (the hint must change nothing)."""
    x = strided((m, k), dtype, device)
    w = (torch.randn(n, k, device=device) / k ** 0.5).to(dtype)
    bias = torch.randn(n, device=device).to(dtype)
    residual = strided((m, n), dtype, device)
    plain = skinny.linear(x, w, bias, residual=residual, gelu=True)
    fetched = skinny.linear(x, w, bias, residual=residual, gelu=True, prefetch=True)
    ok = torch.equal(plain, fetched) and not torch.isnan(fetched).any().item()
    print(f"prefetch M={m} N={n} K={k} {str(dtype)[6:]:8s} {'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    if not on_gpu and not (skinny.HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"):
        print("needs a CUDA device, or Triton with TRITON_INTERPRET=1")
        return 2
    device = torch.device("cuda" if on_gpu else "cpu")
    seed = int(os.environ.get("SEED", time.time_ns() % 2**31))
    torch.manual_seed(seed)
    print(f"device {torch.cuda.get_device_name() if on_gpu else 'cpu (Triton interpreter)'}, seed {seed}")
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if on_gpu else [])
    shapes = [(384, 384), (1152, 384), (1536, 384), (384, 1536), (77, 130)] + ([(1280, 5120)] if on_gpu else [])
    ok_all = True
    start = time.perf_counter()
    i = 0
    for dtype in dtypes:
        for (n, k), m in itertools.product(shapes, (1, 3, 16, 17)):
            # the interpreter cycles through the flag combinations (each appears 2-3 times per dtype)
            # small weights take one K chunk a program by default (skinny.small_product); split K too
            for flags, whole_k in (itertools.product(FLAGS, (None, False)) if on_gpu
                                   else [(FLAGS[(i * 3) % len(FLAGS)], None if i % 2 else False)]):
                ok_all &= check_linear(m, n, k, dtype, flags, device, twice=on_gpu or m == 3, whole_k=whole_k)
            i += 1
        ok_all &= check_linear(1, 2100, 256, dtype, (True, True, True), device)  # enough blocks: no split-K
        ok_all &= check_linear(70, 77, 130, dtype, (True, False, True), device)  # two row blocks
        ok_all &= check_linear(3, 384, 384, dtype, (False, True, True), device, in_place=True)
        # several row blocks take the K chunks in groups (with the interpreter's 16 SMs; on a GPU the
        # plans differ): chunks of one tile in groups of 4, 4 and 2 (float32: 7, 7, 6); of 2 tiles in
        # groups of 5 and 4 over 2 programs; all in one group; groups of 2 over 5 programs
        for m, n, k in ((70, 64, 1280), (40, 128, 2304), (40, 192, 2560), (40, 64, 1280)):
            ok_all &= check_rows_alone(m, n, k, dtype, device, whole_k=False)
        # blocks of 32 and 64 rows against the pieces' 16, and no split K (one 64-row block); one K
        # chunk a program (tiny.en's feed-forward product): numpy's float32 product, the interpreter's,
        # rounds by shape, so float32 is checked on a GPU only
        if on_gpu or dtype != torch.float32:
            for m, n, k in ((40, 384, 1536), (70, 384, 1536), (40, 2100, 256)):
                ok_all &= check_rows_alone(m, n, k, dtype, device, whole_k=False)
            ok_all &= check_rows_alone(40, 384, 1536, dtype, device, whole_k=True)
        if on_gpu:  # large-v3's beam-step shapes, and its vocabulary projection (no split K)
            for m, n, k in ((80, 1280, 1280), (80, 1280, 5120), (150, 5120, 1280), (80, 3840, 1280),
                            (80, 51866, 1280), (150, 51866, 1280)):
                ok_all &= check_rows_alone(m, n, k, dtype, device)
        for n, m in ((384, 1), (384, 17), (1280, 3), (1280, 17), (77, 1), (77, 3)) + (((1280, 64),) if on_gpu else ()):
            for with_update, mode in ((True, "new"), (True, "poison"), (True, "in-place"), (False, "poison")):
                ok_all &= check_add_layer_norm(m, n, dtype, with_update, mode, device)
    if on_gpu:
        for dtype in dtypes:
            for m, n, k in ((1, 1152, 384), (16, 1536, 384), (1, 51866, 384), (5, 5120, 1280), (16, 1280, 5120)):
                ok_all &= check_prefetch(m, n, k, dtype, device)
    for dtype in [d for d in dtypes if d != torch.float32]:  # the decode step's folds: half precision only
        for m, n, k in ((1, 384, 1536), (3, 128, 512)) + (((1, 4096, 4096), (16, 6144, 4096)) if on_gpu else ()):
            ok_all &= check_decode_fusions(m, n, k, dtype, device)
    print(f"{time.perf_counter() - start:.1f} s")
    print(f"skinny ops == reference: {ok_all}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
