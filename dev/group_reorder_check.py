"""Check ostinato.ops.group_reorder against index_select on fresh random inputs.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/group_reorder_check.py   # CPU
    PYTHONPATH=src python dev/group_reorder_check.py                                     # on a GPU

Each case reorders views of a bigger cache ([L, rows, H, S, D] sliced to the first R rows and the
first ``filled`` positions, as beam search does) by origins drawn the way beams move: rows that
keep their own history, rows that take another's, swaps and longer cycles, groups where nothing
moves. The result must equal ``view.index_select(1, origin)`` bit for bit (NaN payloads included),
and everything outside the view must be untouched. Each case runs twice: over the whole view, and
bounded by lengths drawn per row (a group moves the positions below its rows' largest length only,
as a beam search on the device loop asks). Ends with ``group reorder == index_select: True``.
"""
import sys

import torch

from decode_attention_check import check_setup
from ostinato.ops import group_reorder


def origins(rows: int, group: int, gen: torch.Generator) -> torch.Tensor:
    """Per group: identity, a random choice with repeats, a permutation, or all from one beam."""
    out = []
    for g in range(rows // group):
        base = g * group
        kind = int(torch.randint(0, 4, (1,), generator=gen))
        if kind == 0:
            pick = torch.arange(group)
        elif kind == 1:
            pick = torch.randint(0, group, (group,), generator=gen)
        elif kind == 2:
            pick = torch.randperm(group, generator=gen)
        else:
            pick = torch.full((group,), int(torch.randint(0, group, (1,), generator=gen)))
        out.append(base + pick)
    return torch.cat(out)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def main() -> int:
    setup = check_setup(group_reorder.HAVE_TRITON)
    if setup is None:
        return 2
    on_gpu, device, seed = setup
    gen = torch.Generator().manual_seed(seed)
    # (layers, rows used, rows allocated, heads, ctx, filled, D, group, dtype, tensors)
    cases = [(2, 6, 8, 3, 40, 32, 16, 3, torch.float16, 2), (1, 10, 10, 2, 33, 33, 8, 5, torch.float32, 2),
             (3, 8, 9, 1, 70, 64, 64, 4, torch.bfloat16 if on_gpu else torch.float16, 1),
             (2, 4, 4, 2, 20, 1, 4, 2, torch.float16, 2)]
    if on_gpu:  # large-v3 at 16 windows of 5 beams, tiny.en at 5 beams
        cases += [(32, 80, 80, 20, 448, 128, 64, 5, torch.float16, 2), (4, 5, 16, 6, 448, 256, 64, 5, torch.float16, 2)]
    ok_all = True
    for (layers, rows, alloc, heads, ctx, filled, dim, group, dtype, count), bounded in (
            (case, bounded) for case in cases for bounded in (False, True)):
        bufs = [torch.randn(layers, alloc, heads, ctx, dim, generator=gen).to(dtype).to(device) for _ in range(count)]
        for buf in bufs:
            buf.view(-1)[:: 7] = float("nan")  # garbage the copy must move unchanged
        before = [buf.clone() for buf in bufs]
        origin = origins(rows, group, gen).to(device)
        views = [buf[:, :rows, :, :filled] for buf in bufs]
        want = [v.index_select(1, origin) for v in views]
        lengths = None
        if bounded:  # per row 0 .. filled + 3 (past the view too); a group moves up to its largest
            lengths = torch.randint(0, filled + 4, (rows,), generator=gen)
            group_max = lengths.view(-1, group).amax(1).repeat_interleave(group).clamp(max=filled)
            keep = torch.arange(filled)[None, :] >= group_max[:, None]  # [rows, filled]: left as it was
            keep = keep[None, :, None, :, None].to(device)
            want = [torch.where(keep, v, w) for v, w in zip(views, want)]
            lengths = lengths.to(device)
        group_reorder.reorder_in_groups(views, origin, group, lengths)
        ok = True
        for buf, old, view, w in zip(bufs, before, views, want):
            ok &= torch.equal(bits(view), bits(w))
            rest = old.clone()
            rest[:, :rows, :, :filled] = w
            ok &= torch.equal(bits(buf), bits(rest))
        moved = int((origin != torch.arange(rows, device=device)).sum())
        print(f"L={layers} R={rows}/{alloc} H={heads} S={filled}/{ctx} D={dim} group={group} {str(dtype)[6:]} "
              f"tensors={count} moved rows={moved}{' bounded' if bounded else ''}: {'ok' if ok else 'FAIL'}")
        ok_all &= ok
    print(f"group reorder == index_select: {ok_all}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
