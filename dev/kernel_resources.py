"""What ostinato's LLM decode and prefill kernels ask of an SM, without a GPU: each is compiled for
sm_90 (Hopper) on this machine by Triton's own compiler and ptxas, and its registers, spilled bytes
and shared memory are read from the cubin (cuobjdump), with the programs an H100 SM can hold at once.

    PYTHONPATH=src:/path/to/triton python dev/kernel_resources.py

Use it before spending GPU time: a kernel that spills, or holds fewer programs an SM than its launch
needs for one wave, shows here; so does a kernel that does not compile for the GPU at all (a type
error the CPU interpreter lets pass). Shapes are Qwen3.5-35B-A3B's at one row (2B's for the prefill
conv and scan), launch settings the modules' own.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

SM_REGISTERS = 65536  # an H100 SM's register file, 32-bit registers
SM_SHARED = 228 * 1024
SM_WARPS = 64
SM_PROGRAMS = 32


def compile_for_gpu(fn, pointers: dict, constants: dict, warps: int, stages: int = 3):
    """(registers a thread, spilled bytes a thread, shared bytes a program) of ``fn`` for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature = {}
    for name in names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name == "eps" else "i32"
    source = ASTSource(fn, signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(item.split(":") for item in next(line for line in usage.splitlines() if "REG:" in line).split()
                  if ":" in item and item.split(":")[1].isdigit())
    return int(fields["REG"]), int(fields["STACK"]), kernel.metadata.shared + int(fields.get("SHARED", 0))


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    """Programs of this kind an H100 SM holds at once (registers go to warps in 256s)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = SM_REGISTERS // (per_warp * warps)
    by_shared = SM_SHARED // shared if shared else SM_PROGRAMS
    return min(by_registers, by_shared, SM_WARPS // warps, SM_PROGRAMS)


def kernels():
    """(label, kernel, pointer types, constexprs, warps, stages, programs a launch)"""
    import triton.language as tl

    from ostinato.ops import causal_conv, delta_rule, gated_delta_decode as gd, moe_decode as moe

    def pointers(fp32=(), i32=(), i64=()):  # every other pointer is to bfloat16
        return {**{n: "*fp32" for n in fp32}, **{n: "*i32" for n in i32}, **{n: "*i64" for n in i64}}

    return [
        ("moe routing (256 experts, top 8)", moe._route_kernel, pointers(fp32=("wts_ptr",), i32=("ids_ptr",)),
         dict(E=256, BLOCK_E=256, TOPK=8, BLOCK_TOPK=8, NORMALIZE=True, DTYPE=tl.bfloat16, PDL=True), moe.ROUTE_WARPS, 1, 1),
        ("moe experts' gate/up (1024 x 2048)", moe._experts_up_kernel, pointers(fp32=("ss_ptr",), i32=("ids_ptr",)),
         dict(TOPK=8, BLOCK_N=moe.UP_BLOCK_N, BLOCK_K=moe.UP_BLOCK_K, TILES=2048 // moe.UP_BLOCK_K, NORM=True,
              ZERO_CENTERED=True, SS_BLOCK=256, NUM_STAGES=moe.UP_STAGES, PDL=True),
         moe.UP_WARPS, moe.UP_STAGES, 8 * 1024 // moe.UP_BLOCK_N),
        ("moe experts' down + shared (2048 x 512)", moe._experts_down_kernel,
         pointers(fp32=("wts_ptr", "sso_ptr"), i32=("ids_ptr",)),
         dict(TOPK=8, HAS_SHARED=True, BLOCK_N=moe.DOWN_BLOCK_N, BLOCK_I=512, BLOCK_IS=512, SS_COLS=moe.SS_COLS,
              NUM_STAGES=moe.DOWN_STAGES, PDL=True), moe.DOWN_WARPS, moe.DOWN_STAGES, 2048 // moe.DOWN_BLOCK_N),
        ("gated delta conv (8192 channels)", gd._conv_kernel, pointers(),
         dict(K=4, BLOCK_T=4, BLOCK_C=gd.CONV_BLOCK, PDL=True), gd.CONV_WARPS, 1, -(-8192 // gd.CONV_BLOCK)),
        ("gated delta rule + norm (32 heads of 128)", gd._delta_kernel,
         pointers(fp32=("alog_ptr", "dtb_ptr", "state_ptr"), i32=("lock_ptr",)),
         dict(KEY_DIM=2048, V_HEADS=32, A_OFF=32, GROUP=2, DK=128, DV=128, BV=32, SCALE=128 ** -0.5, PDL=True),
         gd.DELTA_WARPS, 1, 32 * 4),
        ("prefill conv (6144 channels, 4096 tokens)", causal_conv._causal_conv_kernel,
         pointers(i64=("rows_ptr",)),
         dict(K=4, BLOCK_T=causal_conv.BLOCK_T, BLOCK_C=causal_conv.BLOCK_C), causal_conv.WARPS, 1,
         -(-4096 // causal_conv.BLOCK_T) * -(-6144 // causal_conv.BLOCK_C)),
        ("prefill chunk scan, TF32 (16 heads, 128 x 128)", delta_rule._chunk_scan_kernel,
         pointers(fp32=("u_ptr", "w_ptr", "qd_ptr", "a_ptr", "kt_ptr", "decay_ptr", "state_ptr", "out_ptr")),
         dict(C=64, DK=128, DV=128, BV=16, PRECISION="tf32"), 8, 1, 16 * 8),
    ] + [(f"prefill chunk prepare, {precision}, {warps} warps, blocks {block}, {stages} st", delta_rule._chunk_prepare_kernel,
          pointers(fp32=("g_ptr", "u_ptr", "w_ptr", "qd_ptr", "a_ptr", "kt_ptr", "decay_ptr", "scratch_ptr")),
          dict(V_HEADS=16, GROUP=1, C=64, BT=16, DK=128, BK=block, DV=128, BV=block, SCALE=128 ** -0.5,
               PRECISION=precision), warps, stages, 64 * 16)
        for precision in ("ieee", "tf32") for warps in (4, 8) for block in (32, 64) for stages in (1,)]


def main() -> int:
    try:
        import triton  # noqa: F401
    except ImportError:
        print("needs Triton (its compiler and ptxas run here; no GPU needed)")
        return 2
    print(f"{'kernel':48s} {'regs':>5s} {'spill B':>8s} {'shared B':>9s} {'warps':>5s} {'per SM':>6s} "
          f"{'programs':>8s} {'waves':>6s}")
    ok = True
    for label, fn, pointers, constants, warps, stages, programs in kernels():
        try:
            registers, spilled, shared = compile_for_gpu(fn, pointers, constants, warps, stages)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            print(f"{label:48s} does not compile: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            ok = False
            continue
        per_sm = programs_per_sm(registers, shared, warps)
        waves = programs / (per_sm * 132)
        print(f"{label:48s} {registers:5d} {spilled:8d} {shared:9d} {warps:5d} {per_sm:6d} {programs:8d} {waves:6.2f}")
    print(f"every kernel compiles for sm_90: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
