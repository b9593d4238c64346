"""Check ostinato.ops.decode_attention against a float64 PyTorch reference on fresh random inputs.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/decode_attention_check.py   # CPU
    PYTHONPATH=src python dev/decode_attention_check.py                                     # on a GPU

Inputs are views of bigger cache buffers (two layouts), keys past each row's length hold NaN/inf,
the output buffer starts as NaN (so every element must be written); without lengths, query rows in
groups of 3 on one K/V row (beams) too: in float32 equal bit for bit to each row on its own copy, in half
precision (the tensor-core kernel) a window the same bits alone as among the others; and the tokens of
one sequence on one K/V row (a prefill), and K/V rows named by ``kv_rows`` (the bits of k[kv_rows]);
grouped-query attention as a language model's step runs it (``gqa_decode_attention``). The interpreter runs a small
set (bfloat16 only on a GPU: the interpreter computes through numpy, which has no bfloat16).
Prints one line per case (the worst row's ||out - ref|| / ||ref||) and ends with ``decode attention == reference: True`` (exit 1 otherwise).
SEED=n repeats a run.
"""
import os
import sys
import time

import torch

from ostinato.ops import decode_attention as da


def patch_interpreter_index():
    """Triton 3.6's interpreter holds scalars as 1-element arrays and turns them into ints (a loop bound
    read on the device, as ``range(start, end)`` here) with ``int(array)``, which NumPy >= 2.4 refuses
    for ndim > 0. Wrap its per-launch patching so ``__index__`` takes the single element."""
    import numpy as np
    from triton.runtime import interpreter

    try:
        int(np.zeros(1, dtype=np.int32))
        return
    except TypeError:
        pass
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 6e-3}


def reference(q, k, v, lengths, scale):
    """Float64 attention; keys at or past the length are masked out of scores and values (they hold NaN)."""
    seq = k.shape[2]
    s = torch.einsum("bhd,bhsd->bhs", q.double(), k.double()) * scale
    vv = v.double()
    if lengths is not None:
        past = torch.arange(seq, device=q.device)[None, :] >= lengths[:, None].to(q.device)
        s = s.masked_fill(past[:, None, :], float("-inf"))
        vv = vv.masked_fill(past[:, None, :, None], 0.0)
    return torch.einsum("bhs,bhsd->bhd", torch.softmax(s, dim=-1), vv)


def make_case(b, h, seq, dim, dtype, lengths_kind, layout, device):
    """q, k, v as strided views: k/v = buf[kv, layer 1, rows 1..b] of a [2, L, rows, H, S, D] buffer
    ('bhsd') or of a [2, L, rows, S, H, D] one seen as [B, H, S, D] ('bshd'); q a slice of a wider tensor."""
    rows = b + 2
    if layout == "bhsd":
        buf = torch.randn(2, 2, rows, h, seq, dim, device=device).to(dtype)
        k, v = buf[0, 1, 1:1 + b], buf[1, 1, 1:1 + b]
    else:
        buf = torch.randn(2, 2, rows, seq, h, dim, device=device).to(dtype)
        k, v = buf[0, 1, 1:1 + b].transpose(1, 2), buf[1, 1, 1:1 + b].transpose(1, 2)
    # a wide range of score spreads: some rows nearly uniform, some dominated by a few keys
    q = (torch.randn(b, h, 2 * dim, device=device) * torch.rand(b, h, 1, device=device) * 3).to(dtype)[..., :dim]
    if lengths_kind is None:
        lengths = None
    else:
        fixed = [1, seq] if lengths_kind == "edges" else []
        rand = torch.randint(1, seq + 1, (b,)).tolist()
        lengths = torch.tensor((fixed + rand)[:b], device=device, dtype=torch.int32 if lengths_kind == "int32" else torch.int64)
        for i, n in enumerate(lengths.tolist()):  # garbage past the length, as a reused cache holds
            k[i, :, n:] = float("nan") if i % 2 == 0 else float("inf")
            v[i, :, n:] = float("-inf") if i % 2 == 0 else float("nan")
    return q, k, v, lengths


def check_new_kv(q, k, v, lengths, scale, dtype):
    """decode_attention with new_k/new_v: the same as writing them at length - 1 first, and the cache
    afterwards holds them there and is untouched elsewhere (bit for bit, NaN garbage included)."""
    new_k, new_v = torch.randn_like(q).to(dtype), torch.randn_like(q).to(dtype)
    want_k, want_v = k.clone(), v.clone()
    for i, n in enumerate(lengths.tolist()):
        want_k[i, :, n - 1], want_v[i, :, n - 1] = new_k[i], new_v[i]
    ref = reference(q, want_k, want_v, lengths, q.shape[-1] ** -0.5 if scale is None else scale)
    got = da.decode_attention(q, k, v, lengths, scale=scale, new_k=new_k, new_v=new_v)
    err = ((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()
    same = lambda a, b: torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))  # noqa: E731
    return err < TOLERANCE[dtype] and same(k, want_k) and same(v, want_v), err


def check_grouped(k, v, dtype, group=3):
    """group > 1 (a window's beams on one cross K/V): ``group`` query rows per K/V row give the
    float64 reference over the shared keys. Float32 (the CUDA-core kernel) gives the same bits as
    each query row on its own copy; half precision (the tensor-core kernel) the same bits for a
    window whether it runs alone or among the others (batched equals one window at a time)."""
    b, h, _, dim = k.shape
    q = (torch.randn(b * group, h, dim, device=k.device) * 2).to(dtype)
    copies_k, copies_v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    got = da.decode_attention(q, k, v, group=group)
    if dtype == torch.float32:
        same = torch.equal(got, da.decode_attention(q, copies_k, copies_v))
    else:
        last = slice((b - 1) * group, b * group)
        same = torch.equal(got[last], da.decode_attention(q[last], k[b - 1:], v[b - 1:], group=group))
    ref = reference(q, copies_k, copies_v, None, dim ** -0.5)
    err = ((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()
    return err < TOLERANCE[dtype] and same, err


def check_kv_rows(q, k, v, lengths, group=1):
    """kv_rows (each group's K/V row read from the device): the bits of the same call on k[kv_rows],
    v[kv_rows] (the rows reversed, one named twice when there are several)."""
    b = k.shape[0]
    rows = torch.arange(b - 1, -1, -1, device=k.device)
    if b > 1:
        rows[-1] = rows[0]
    if group > 1:
        q = torch.cat([q] * group).view(group, b, *q.shape[1:]).transpose(0, 1).reshape(b * group, *q.shape[1:])
    if lengths is not None:  # each query row as long as the K/V row it reads (garbage lies past that)
        lengths = lengths[rows]
    got = da.decode_attention(q, k, v, lengths, group=group, kv_rows=rows)
    want = da.decode_attention(q, k[rows], v[rows], lengths, group=group)
    return torch.equal(got, want)


def check_one_sequence(k, v, dtype):
    """The tokens of one sequence as rows (a prompt's prefill): one K/V row seen by every token (a
    stride-0 view), token t at lengths t + 1, against causal float64 attention."""
    _, h, seq, dim = k.shape
    tokens = min(seq, 7)
    q = (torch.randn(tokens, h, dim, device=k.device) * 2).to(dtype)
    lengths = torch.arange(1, tokens + 1, device=k.device)
    shared_k, shared_v = k[:1].expand(tokens, -1, -1, -1), v[:1].expand(tokens, -1, -1, -1)
    got = da.decode_attention(q, shared_k, shared_v, lengths)
    ref = reference(q, shared_k, shared_v, lengths, dim ** -0.5)
    err = ((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()
    return err < TOLERANCE[dtype], err


def check_gqa(b, kv_heads, group, seq, dim, dtype, device):
    """gqa_decode_attention (a language model's step: query head j reads K/V head j // group, each
    row up to its length, garbage past it, the cache a strided view) against float64 attention over
    the K/V heads repeated; a row alone gives the same bits as among the others; the custom
    operator the same bits as the function."""
    q_heads = kv_heads * group
    _, k, v, lengths = make_case(b, kv_heads, seq, dim, dtype, "edges", "bshd", device)
    q = (torch.randn(b, q_heads, dim, device=device) * torch.rand(b, q_heads, 1, device=device) * 3).to(dtype)
    got = da.gqa_decode_attention(q, k, v, lengths)
    ref = reference(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), lengths, dim ** -0.5)
    err = ((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()
    alone = da.gqa_decode_attention(q[-1:], k[-1:], v[-1:], lengths[-1:])
    op = da.gqa_decode_attention_op(q, k, v, lengths, dim ** -0.5)
    ok = (err < TOLERANCE[dtype] and not torch.isnan(got).any().item() and torch.equal(alone, got[-1:])
          and torch.equal(op, got))
    splits, _ = da.split_plan(seq, kv_heads, da._sm_count(device), da.GROUPED_PROGRAMS_PER_SM, da.GQA_MIN_CHUNK,
                              da.GROUPED_BLOCK_N * 128 // max(dim, 128))
    print(f"GQA B={b} H={q_heads}/{kv_heads} S={seq} D={dim} {str(dtype)[6:]:8s} splits={splits:2d} "
          f"lengths={lengths.tolist()} rel err (worst row) {err:.2e} {'ok' if ok else 'FAIL'}")
    return ok


def gqa_cases(on_gpu):
    """(B, K/V heads, group, S, D, dtype): half precision only (the tensor-core kernel)."""
    out = [(3, 2, 4, 300, 64, torch.float16), (2, 1, 3, 700, 128, torch.float16),
           (2, 2, 2, 300, 256, torch.float16)]
    if on_gpu:  # the released shapes: Qwen3-8B, Qwen3.5-2B / 35B-A3B's attention
        for dtype in (torch.float16, torch.bfloat16):
            out += [(4, 8, 4, 640, 128, dtype), (3, 8, 4, 5000, 128, dtype), (4, 2, 4, 640, 256, dtype),
                    (2, 2, 8, 3000, 256, dtype)]
    return out


def cases(on_gpu):
    """(B, H, S, D, dtype, lengths_kind, layout)."""
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if on_gpu else [])
    out = []
    for dtype in dtypes:
        for b in (1, 3):
            for h in (2, 6):
                for lk in (None, "edges"):
                    out.append((b, h, 77, 64, dtype, lk, "bhsd" if h == 2 else "bshd"))
        out.append((1, 2, 448, 64, dtype, None, "bhsd"))
        out.append((3, 2, 448, 64, dtype, "edges", "bshd"))
        out.append((3, 2, 1500, 64, dtype, "edges", "bhsd"))
        out.append((3, 2, 448, 128, dtype, "random", "bhsd"))
    out.append((1, 2, 1500, 64, torch.float32, None, "bshd"))
    out.append((3, 2, 448, 64, torch.float16, "int32", "bhsd"))
    out.append((2, 2, 1500, 64, torch.float16, None, "bhsd"))  # beams of a window over several splits: the combine
    if on_gpu:  # Whisper sizes, cheap on a GPU
        for dtype in dtypes:
            for b, s in ((1, 448), (1, 1500), (16, 448), (16, 1500)):
                for lk in (None, "edges"):
                    out.append((b, 20, s, 64, dtype, lk, "bhsd"))
            out.append((4, 6, 1500, 128, dtype, "random", "bshd"))
    return out


def check_setup(have_triton: bool):
    """(on_gpu, device, seed) for a kernel check: CUDA, or Triton's CPU interpreter (patched, see
    above) under TRITON_INTERPRET=1; None (after saying why) when neither is here. Seeds torch."""
    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    if not on_gpu and not (have_triton and os.environ.get("TRITON_INTERPRET") == "1"):
        print("needs a CUDA device, or Triton with TRITON_INTERPRET=1")
        return None
    if not on_gpu:
        patch_interpreter_index()
    seed = int(os.environ.get("SEED", time.time_ns() % 2**31))
    torch.manual_seed(seed)
    print(f"device {torch.cuda.get_device_name() if on_gpu else 'cpu (Triton interpreter)'}, seed {seed}")
    return on_gpu, torch.device("cuda" if on_gpu else "cpu"), seed


def run_half_cases(have_triton: bool, cases, check, verdict: str) -> int:
    """The main of a kernel check over ``cases``: ``check(device, dtype, *case)`` for each in float16
    (and bfloat16 on a GPU), then ``<verdict>: <all passed>``; the exit status (2 when nothing can run)."""
    setup = check_setup(have_triton)
    if setup is None:
        return 2
    on_gpu, device, _ = setup
    ok = True
    for dtype in [torch.float16] + ([torch.bfloat16] if on_gpu else []):
        for case in cases:
            ok &= check(device, dtype, *case)
    print(f"{verdict}: {ok}")
    return 0 if ok else 1


def main() -> int:
    setup = check_setup(da.HAVE_TRITON)
    if setup is None:
        return 2
    on_gpu, device, _ = setup
    ok_all = True
    start = time.perf_counter()
    for b, h, seq, dim, dtype, lk, layout in cases(on_gpu):
        q, k, v, lengths = make_case(b, h, seq, dim, dtype, lk, layout, device)
        scale = dim ** -0.5 if lk != "random" else 0.1  # the explicit scale argument once per dtype
        ref = reference(q, k, v, lengths, scale)
        out = torch.full((b, h, dim), float("nan"), device=device, dtype=dtype)
        got = da.decode_attention(q, k, v, lengths, scale=None if lk != "random" else scale, out=out)
        fresh = da.decode_attention(q, k, v, lengths, scale=None if lk != "random" else scale)
        # per row (a row of length 1 has a much larger output norm and would hide the others' errors)
        err = ((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()
        ok = (got is out and got.dtype == dtype and not torch.isnan(got).any().item() and err < TOLERANCE[dtype]
              and torch.equal(fresh, got))
        if lengths is not None:  # this step's key/value passed fresh: written into the cache and attended
            ok_new, err_new = check_new_kv(q, k, v, lengths, scale if lk == "random" else None, dtype)
            ok &= ok_new and check_kv_rows(q, k, v, lengths)
            err = max(err, err_new)
        else:  # rows in groups sharing one K/V row
            ok_group, err_group = check_grouped(k, v, dtype)
            ok_seq, err_seq = check_one_sequence(k, v, dtype)
            ok &= ok_group and ok_seq and check_kv_rows(q, k, v, None, group=3)
            err = max(err, err_group, err_seq)
        ok_all &= ok
        splits, _ = da.split_plan(seq, b * h, da._sm_count(device))
        lens = "all" if lengths is None else lengths.tolist()
        print(f"B={b} H={h} S={seq} D={dim} {str(dtype)[6:]:8s} {layout} splits={splits:2d} lengths={lens} "
              f"rel err (worst row) {err:.2e} {'ok' if ok else 'FAIL'}")
    for case in gqa_cases(on_gpu):
        ok_all &= check_gqa(*case, device)
    print(f"{time.perf_counter() - start:.1f} s")
    print(f"decode attention == reference: {ok_all}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
