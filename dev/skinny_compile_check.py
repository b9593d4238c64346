"""Compile the skinny linear kernel for an H100 (sm_90) without a GPU and check what the compiler made
of it, where Triton's CPU interpreter cannot look:

  * with K chunks in groups, no chunk's product is accumulated straight into the running chunk sum:
    Triton folds ``sum + dot(a, b, 0)`` into ``dot(a, b, sum)`` when the product has no other use
    (one tile a chunk, no workspace), and the tensor cores then round differently from adding the
    chunk's partial, so a row's bits would depend on the other rows (150 rows of 1280x1280 did);
  * the K loop is software-pipelined (asynchronous copies into shared memory) at the plan's depth;
  * launched with PDL and asked to prefetch, the linear and the split attention kernel ask L2 for their
    weight / key lines before they wait on the kernel ahead (``griddepcontrol.wait``).

    PYTHONPATH=src python dev/skinny_compile_check.py

Needs Triton (its bundled ptxas), not a GPU. Prints one line per plan and, last, the verdict.
"""
from __future__ import annotations

import re
import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ostinato.ops import skinny

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = ["x_ptr", "w_ptr", "b_ptr", "r_ptr", "o_ptr"]
# Arguments a real launch passes 16-divisible (Triton specialises on that; without it the loads are
# scalar and nothing is pipelined), M excepted.
DIVISIBLE = POINTERS + ["ws_ptr", "lock_ptr", "N", "K", "sxm", "swn", "srm", "som"]


def compile_plan(plan: dict, dtype: str = "fp16", gelu: bool = False, **extra):
    signature = {name: f"*{dtype}" for name in POINTERS}
    signature.update(ws_ptr="*fp32", lock_ptr="*i32", M="i32", N="i32", K="i32", sxm="i32", swn="i32",
                     srm="i32", som="i32")
    constants = dict(TILES=plan["tiles"], SPLITS=plan["splits"], GROUP=plan["group"],
                     PROGRAMS_K=plan["programs_k"], BLOCK_M=plan["block_m"], BLOCK_N=plan["block_n"],
                     BLOCK_K=plan["block_k"], FP32=dtype == "fp32", HAS_BIAS=True, GELU=gelu, HAS_RES=True,
                     PDL=False)
    constants.update(extra)
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in DIVISIBLE}
    source = ASTSource(fn=skinny._linear_kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=TARGET, options=dict(num_warps=4, num_stages=plan["stages"],
                                                               enable_fp_fusion=False))


SHARED_LIMIT = 232448  # bytes of shared memory a program may have on an H100 / H200 SM (Triton's launch refuses more)
DOT = re.compile(r"(?:tt\.dot|ttng\.warp_group_dot) (%[\w.]+), (%[\w.]+), (%[\w.]+)")


def check(m: int, n: int, k: int, dtype: str = "fp16", whole_k: bool = False) -> bool:
    plan = skinny.linear_plan(m, n, k, 132, 4 if dtype == "fp32" else 2, whole_k=whole_k)
    t0 = time.perf_counter()
    compiled = compile_plan(plan, dtype)
    ttgir = compiled.asm["ttgir"]
    shared = compiled.metadata.shared
    accumulators = [acc for _, _, acc in DOT.findall(ttgir)]
    # a loop-carried value (%argN) as the accumulator is the chunk loop's own chaining in the one-chunk
    # loop; in the grouped loop a chunk starts from zero (a constant, or a select at its first tile)
    folded = plan["group"] > 1 and any(acc.startswith("%arg") for acc in accumulators)
    copies = ttgir.count("async_copy_global_to_local")
    loop_trips = plan["group"] * plan["tiles"]  # a loop of one tile has nothing to overlap
    ok = bool(accumulators) and not folded and (copies > 0 or loop_trips == 1) and shared <= SHARED_LIMIT
    print(f"{time.perf_counter() - t0:5.2f}s M={m:3d} N={n:5d} K={k:4d} {dtype} block_m={plan['block_m']} "
          f"tiles={plan['tiles']} splits={plan['splits']} group={plan['group']} programs_k={plan['programs_k']} "
          f"stages={plan['stages']} block_n={plan['block_n']} shared {shared // 1024} KiB: dot accumulators {accumulators}, async copies {copies} "
          f"{'ok' if ok else 'FAIL'}")
    return ok


def _prefetch_before_wait(ptx: str) -> bool:
    lines = ptx.splitlines()
    fetches = [i for i, line in enumerate(lines) if "prefetch.global.L2" in line]
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    return bool(fetches) and len(waits) == 1 and max(fetches) < waits[0]


def check_prefetch() -> bool:
    """large-v3's fc2 product (1280 x 5120: 14 chunks of 3 tiles) at one row with PDL and weight
    prefetch, its K loop still pipelined; tiny.en's cross-attention (6 heads x 1500 keys x 64) with its
    K/V prefetched."""
    import inspect

    from ostinato.ops import decode_attention

    plan = skinny.linear_plan(1, 1280, 5120, 132)
    chunk = plan["group"] * plan["tiles"] * plan["block_k"]
    compiled = compile_plan(plan, PDL=True, PREFETCH_STEP=64, PREFETCH_LINES=triton.next_power_of_2(chunk // 64))
    linear_ok = _prefetch_before_wait(compiled.asm["ptx"])
    pipelined = plan["tiles"] > 1 and compiled.asm["ttgir"].count("async_copy_global_to_local") > 0
    names = list(inspect.signature(decode_attention._split_kernel.fn).parameters)
    signature = {name: "*fp16" if name.endswith("_ptr") else "i32" for name in names}
    signature.update(len_ptr="*i32", kvr_ptr="*i64", part_ptr="*fp32", ml_ptr="*fp32", lock_ptr="*i32", qk_scale="fp32")
    splits, chunk = decode_attention.split_plan(1500, 6, 132)
    constants = dict(H=6, D=64, BLOCK_N=decode_attention.BLOCK_N, HAS_LEN=False, HAS_NEW=False,
                     SPLITS=triton.next_power_of_2(splits), NUM_STAGES=decode_attention.NUM_STAGES, PDL=True,
                     GROUP=1, HAS_ROWS=True, PREFETCH_KEYS=triton.next_power_of_2(chunk), PREFETCH_LINE=64,
                     PREFETCH_ROW_LINES=1)
    signature.update({name: "constexpr" for name in constants})
    source = ASTSource(fn=decode_attention._split_kernel, signature=signature, constexprs=constants)
    attention = triton.compile(source, target=TARGET, options=dict(num_warps=decode_attention.NUM_WARPS))
    attention_ok = _prefetch_before_wait(attention.asm["ptx"])
    ok = linear_ok and pipelined and attention_ok
    print(f"prefetch before the PDL wait: linear {linear_ok} (K loop pipelined {pipelined}), split attention "
          f"{attention_ok} {'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    print(f"triton {triton.__version__}, target sm_{TARGET.arch}")
    ok = True
    # large-v3's decode shapes at 5, 40 and 80 rows (132 SMs): one chunk a program, grouped chunks
    # with and without the workspace, one and several tiles a chunk, 16- to 64-row blocks
    for m in (5, 40, 80):
        for n, k in ((1280, 1280), (3840, 1280), (5120, 1280), (1280, 5120)):
            ok &= check(m, n, k)
    ok &= check(80, 1280, 1280, "fp32")
    ok &= check(150, 1280, 1280, "bf16")
    # tiny.en's products: one K chunk a program in 32-column blocks, up to a prefill's many rows
    for m, n, k, dtype in ((1, 384, 1536, "fp16"), (16, 1152, 384, "fp16"), (80, 384, 1536, "fp16"),
                           (4096, 1152, 384, "fp16"), (4096, 384, 1536, "bf16"), (4096, 384, 384, "fp32")):
        ok &= check(m, n, k, dtype, whole_k=True)
    ok &= check_prefetch()
    print(f"skinny kernel compiles as meant: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
