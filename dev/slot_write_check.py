"""Check ostinato.ops.slot_write against index_copy_ from the transposed view, bit for bit.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/slot_write_check.py   # CPU
    PYTHONPATH=src python dev/slot_write_check.py                                     # on a GPU (also times both)

Every other slot of the cache keeps its bytes (it starts as random values), positions past a block
boundary are covered (S not a multiple of the block), and the destination may be a strided view (a
layer of a [layers, slots, H, S, D] buffer). Ends with ``slot write == index_copy_: True`` (exit 1 otherwise).
"""
import sys

import torch

from ostinato.ops import slot_write
from ostinato.testing.measure import replay_median_us
from decode_attention_check import check_setup


def check(device, slots, heads, seq, dim, dtype) -> bool:
    src = torch.randn(1, seq, heads * dim, device=device).to(dtype)
    buffer = torch.randn(2, slots, heads, seq, dim, device=device).to(dtype)
    dst = buffer[1]  # a layer's view
    want = buffer.clone()
    slot = torch.tensor([slots - 1], device=device)
    want[1].index_copy_(0, slot, src.view(1, seq, heads, dim).transpose(1, 2))
    slot_write.write_slot(src, dst, slot)
    same = torch.equal(buffer.view(torch.uint8), want.view(torch.uint8))  # bytes: NaN payloads too
    print(f"slots {slots} heads {heads} S {seq} D {dim} {str(dtype)[6:]}: {'ok' if same else 'FAIL'}")
    return same


def timing() -> None:
    """One window's keys at large-v3's size, graph replays: index_copy_ against the kernel."""
    heads, seq, dim, slots = 20, 1500, 64, 16
    src = torch.randn(1, seq, heads * dim, device="cuda", dtype=torch.float16)
    buffers = [torch.empty(slots, heads, seq, dim, device="cuda", dtype=torch.float16) for _ in range(4)]
    slot = torch.tensor([7], device="cuda")

    def per_call_us(write, calls=64):
        def body():
            for i in range(calls):
                write(buffers[i % 4])  # rotated past L2

        return replay_median_us(lambda: write(buffers[0]), body, reps=9) / calls

    old = per_call_us(lambda buf: buf.index_copy_(0, slot, src.view(1, seq, heads, dim).transpose(1, 2)))
    new = per_call_us(lambda buf: slot_write.write_slot(src, buf, slot))
    print(f"one window's keys, 20 x 1500 x 64 fp16: index_copy_ {old:.1f} us, write_slot {new:.1f} us")


def main() -> int:
    setup = check_setup(slot_write.HAVE_TRITON)
    if setup is None:
        return 2
    on_gpu, device, _ = setup
    ok = True
    for slots, heads, seq, dim, dtype in ((3, 2, 77, 64, torch.float16), (2, 3, 130, 128, torch.float32),
                                          (4, 6, 1500, 64, torch.float16), (1, 2, 64, 32, torch.float16)):
        ok &= check(device, slots, heads, seq, dim, dtype)
    if on_gpu:
        ok &= check(device, 16, 20, 1500, 64, torch.bfloat16)
        timing()
    print(f"slot write == index_copy_: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
