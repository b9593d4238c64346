"""Language-model decoding on one GPU: ostinato beside transformers' generate and a gpt-fast-style
compiled decode step, on random bfloat16 weights in released models' shapes.

    python bench/llm_gpu.py --shapes qwen3-8b qwen3.5-2b --batches 1 8 32
    python bench/llm_gpu.py --shapes qwen3.5-35b-a3b --peers compile      # ~70 GB: an H200

Per shape and batch (prompt 512 tokens, 128 new tokens, medians over --repeats): decode ms/token and
tok/s; the bytes one decode step must read (weights it touches, for MoE the routed experts only in
expectation, plus the KV cache and recurrent state) over the measured copy bandwidth; prefill tok/s
against the measured matmul rate (``testing.measure.llm_prefill_flops``: the products a prefill runs,
the vocabulary's for the last token only); peak memory against weights + state. Peers in the same run:
transformers' eager `generate` on a model of the same shape, optionally with its static cache under
torch.compile (--peers hf-compile), and gpt-fast's recipe on the same weights and the same cache:
ostinato's network in PyTorch's own ops (its Triton kernels off) under
torch.compile(mode="reduce-overhead"), the cache's buffers at fixed addresses so that the step is a
CUDA graph.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback
from unittest import mock

import torch

sys.path.insert(0, "src")

from ostinato import LanguageModel  # noqa: E402
from ostinato.runtime import DeviceState, storage_bytes  # noqa: E402
from ostinato.testing.measure import copy_bandwidth_gbs, llm_prefill_flops, matmul_tflops  # noqa: E402
from ostinato.testing.random_llms import SHAPES, random_network  # noqa: E402


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def step_bytes(model: LanguageModel, batch: int, context: int) -> float:
    """Bytes one decode step reads: the weights it touches and the rows' state."""
    net, config = model.net, model.config
    total = 0.0
    for name, p in net.named_parameters():
        nbytes = p.numel() * p.element_size()
        if name.endswith("embed_tokens.weight") and not config.tie_word_embeddings:
            nbytes = batch * p.shape[-1] * p.element_size()  # a row per token
        elif ".experts_" in name:  # experts touched by batch x k routed tokens, in expectation
            e, k = config.num_experts, config.experts_per_token
            nbytes *= 1 - (1 - k / e) ** batch
        total += nbytes
    for layer in net.model.layers:
        if layer.linear:
            la = layer.linear_attn
            total += 2 * batch * la.v_heads * la.dk * la.dv * 4  # the recurrent state, read and written
        else:
            total += 2 * batch * context * config.num_kv_heads * config.head_dim * net.lm_head.weight.element_size()
    return total


def bench_ostinato(model: LanguageModel, batch: int, prompt: int, new: int, repeats: int):
    """(decode s/step, prefill s, peak bytes, first call s). Every prompt is admitted at once, so the
    decode phase runs from the end of the (only) prefill to the end of the call: timed directly, not
    as a difference of two calls that both hold a prefill and its noise."""
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=g).tolist()
    first_call = timed(lambda: model.generate(prompts, max_new_tokens=new))  # compiles and captures the bucket
    decoder = model.decoder
    prefill_ends = []

    def marked_prefill(*args, **kwargs):
        type(decoder).prefill(decoder, *args, **kwargs)
        torch.cuda.synchronize()
        prefill_ends.append(time.perf_counter())

    decoder.prefill = marked_prefill
    try:
        torch.cuda.reset_peak_memory_stats()
        decode, prefill = [], []
        for _ in range(repeats):
            prefill_ends.clear()
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(prompts, max_new_tokens=new)
            torch.cuda.synchronize()
            end = time.perf_counter()
            assert len(prefill_ends) == 1, "every prompt should be admitted at once"
            prefill.append(prefill_ends[0] - start)
            decode.append((end - prefill_ends[0]) / (new - 1))
        peak = torch.cuda.max_memory_allocated()
    finally:
        del decoder.prefill
    return statistics.median(decode), statistics.median(prefill), peak, first_call


def bench_compiled_step(model: LanguageModel, batch: int, prompt: int, new: int, repeats: int):
    """gpt-fast's recipe on ostinato's network: the whole decode step (greedy choice included) in
    PyTorch's own ops (ostinato's Triton kernels switched off, so inductor writes the kernels) under
    torch.compile(mode="reduce-overhead"), a static cache whose buffers are marked as fixed addresses
    (as gpt-fast's KV cache buffers are: inductor then captures the step as a CUDA graph although it
    writes them), the host feeding each token back."""
    net = model.net
    state = DeviceState(model.device)
    for name, (shape, dtype) in net.state_spec(batch, prompt + new).items():
        torch._dynamo.mark_static_address(state.allocate(name, shape, dtype))

    def step(tokens, positions):
        return net.decode(tokens, positions, state, batch).argmax(-1)

    with mock.patch.dict(os.environ, OSTINATO_NO_TRITON="1"):
        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        tokens = torch.zeros(batch, dtype=torch.int64, device=model.device)
        start = time.perf_counter()
        for i in range(3):
            tokens = compiled(tokens, torch.full((batch,), prompt + i, device=model.device)).clone()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        positions = [torch.full((batch,), prompt + i, device=model.device) for i in range(new)]

        def run():
            t = tokens
            for p in positions:
                t = compiled(t, p).clone()

        times = [timed(run) / new for _ in range(repeats)]
    return statistics.median(times), compile_s


def hf_model(shape: str, dtype):
    import transformers as tf

    raw = dict(SHAPES[shape])
    arch = raw.pop("architectures")[0]
    raw.pop("full_attention_interval", None)
    if arch == "Qwen3ForCausalLM":
        config, cls = tf.Qwen3Config(**raw), tf.Qwen3ForCausalLM
    elif arch == "Qwen3_5ForCausalLM":
        config, cls = tf.Qwen3_5TextConfig(**raw), tf.Qwen3_5ForCausalLM
    else:
        config, cls = tf.Qwen3_5MoeTextConfig(**raw), tf.Qwen3_5MoeForCausalLM
    config.eos_token_id = None
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # made in the dtype: the 35B shape in float32 would not fit
    try:
        with torch.device("cuda"):
            model = cls(config).eval()
    finally:
        torch.set_default_dtype(previous)
    return model


def bench_hf(model, batch: int, prompt: int, new: int, compiled: bool):
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=g).cuda()
    options = dict(do_sample=False, pad_token_id=0)
    if compiled:
        # transformers compiles its forward itself for a static cache on CUDA (its CompileConfig:
        # mode="reduce-overhead"); a forward compiled again by hand inside that one had failed with
        # "accessing tensor output of CUDAGraphs that has been overwritten"
        options.update(cache_implementation="static")
    with torch.no_grad():
        # warmed at the timed length: a static cache sized for another length compiles anew
        for length in (1, new):
            model.generate(ids, max_new_tokens=length, min_new_tokens=length, **options)
        one = timed(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **options))
        many = timed(lambda: model.generate(ids, max_new_tokens=new, min_new_tokens=new, **options))
    return (many - one) / (new - 1)


def profile(model: LanguageModel, prompt: int) -> None:
    """Where a batch-1 decode step's and a prefill's GPU time goes: the top kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    ids = [torch.randint(0, model.config.vocab_size, (prompt,)).tolist()]
    model.generate(ids, max_new_tokens=33)
    long = [torch.randint(0, model.config.vocab_size, (4096,)).tolist()]
    model.generate(long, max_new_tokens=1)
    for label, prompts, new in (("prefill + 32 decode steps, batch 1", ids, 33),
                                ("prefill of one 4096-token prompt", long, 1)):
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            model.generate(prompts, max_new_tokens=new)
            torch.cuda.synchronize()
        print(f"-- profile: {label}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["qwen3-8b", "qwen3.5-2b"], choices=sorted(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-prefill", type=int, default=4096, help="prompt length of the prefill-rate row")
    parser.add_argument("--peers", default="hf,compile", help="comma list of hf, hf-compile, compile, or none")
    parser.add_argument("--hf-new", type=int, default=17, help="new tokens for transformers' eager generate")
    parser.add_argument("--compile-batches", nargs="+", type=int, default=[1],
                        help="batches for the compiled-step peer (each compiles for about a minute)")
    parser.add_argument("--hf-compile-batches", nargs="+", type=int, default=[1],
                        help="batches for transformers' static cache + compile (each batch size compiles anew)")
    parser.add_argument("--profile", action="store_true", help="print the top GPU kernels of a decode and a prefill")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="ostinato's compiled decode step (default: auto)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/llm_gpu.py needs a CUDA device")
    peers = set(args.peers.split(",")) - {"none", ""}
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    bandwidth = copy_bandwidth_gbs(device)
    tflops = matmul_tflops(device, torch.bfloat16)
    print(f"measured: copy {bandwidth:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s\n", flush=True)
    for shape in args.shapes:
        net = random_network(SHAPES[shape], device, torch.bfloat16)
        model = LanguageModel.from_network(net, max_batch_size=max(args.batches),
                                           compile={"auto": "auto", "on": True, "off": False}[args.compile])
        weights = storage_bytes(list(net.parameters()))
        print(f"== {shape}: {model.config.architecture}, {weights / 1e9:.1f} GB of weights, decode loop: "
              f"{model.decode_loop}, compiled step: {model.decoder.compile_step}", flush=True)
        rows = []
        for batch in args.batches:
            decode, prefill_s, peak, first_call = bench_ostinato(model, batch, args.prompt, args.new, args.repeats)
            state = model.decoder.state.nbytes()
            moved = step_bytes(model, batch, args.prompt + args.new // 2)
            row = dict(batch=batch, ms=decode * 1e3, tok_s=batch / decode, gbs=moved / decode / 1e9,
                       prefill_tok_s=batch * args.prompt / prefill_s, peak=peak, budget=weights + state,
                       first_call_s=first_call)
            rows.append(row)
            print(f"  batch {batch}: {row}", flush=True)
        if args.profile:
            profile(model, args.prompt)
        # prefill rate at a long prompt
        long = [torch.randint(0, model.config.vocab_size, (args.long_prefill,)).tolist()]
        for _ in range(2):  # on a fresh machine one warm call was not enough (2B: 66k tok/s, then 107k)
            model.generate(long, max_new_tokens=1)
        long_s = statistics.median(timed(lambda: model.generate(long, max_new_tokens=1)) for _ in range(args.repeats))
        long_rate = llm_prefill_flops(model.net, args.long_prefill) / long_s / 1e12
        # the compiled-step peer after all of ostinato's own timings: timed after its torch.compile, the
        # 4096-token prefill read 16% (2B) and 17% (35B) of the matmul rate, before it 27% and 25%
        for row in rows:
            if "compile" in peers and row["batch"] in args.compile_batches:
                try:
                    row["compiled_ms"], row["compile_s"] = (x * f for x, f in zip(
                        bench_compiled_step(model, row["batch"], args.prompt, args.new, args.repeats), (1e3, 1)))
                except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                    row["compiled_ms"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
                print(f"  compiled step, batch {row['batch']}: {row['compiled_ms']}", flush=True)
        hf_rows = {}
        # its weights, state and graphs go before a peer's model (the 35B shape's two copies would not
        # fit one H100) or the next shape's; torch.compile's caches hold the network too
        model = net = None
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        print(f"  freed: {torch.cuda.memory_allocated() / 1e9:.2f} GB still allocated", flush=True)
        if peers & {"hf", "hf-compile"}:
            for compiled in [c for c, name in ((False, "hf"), (True, "hf-compile")) if name in peers]:
                batches = [b for b in args.batches if not compiled or b in args.hf_compile_batches]
                try:
                    ref = hf_model(shape, torch.bfloat16)
                    for batch in batches:
                        hf_rows[(compiled, batch)] = bench_hf(ref, batch, args.prompt, args.hf_new, compiled) * 1e3
                        print(f"  transformers{' static+compile' if compiled else ' eager'}, batch {batch}: "
                              f"{hf_rows[(compiled, batch)]:.2f} ms/token", flush=True)
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc(limit=2)
                    for batch in batches:
                        hf_rows.setdefault((compiled, batch), f"failed: {type(exc).__name__}: "
                                                              f"{str(exc).splitlines()[0][:60]}")
                ref = None
                gc.collect()
                torch.cuda.empty_cache()
        print(f"\n{shape}, prompt {args.prompt}, {args.new} new tokens, bf16, medians of {args.repeats}")
        head = (f"{'batch':>5} | {'ostinato ms/tok':>15} | {'tok/s':>8} | {'GB/s read':>9} | {'% copy bw':>9} | "
                f"{'compiled step ms/tok':>20} | {'transformers eager ms/tok':>25} | {'hf static+compile':>17} | "
                f"{'prefill tok/s':>13} | {'peak / (weights+state)':>22}")
        print(head)
        print("-" * len(head))
        for r in rows:
            def cell(v, width):
                return f"{v:>{width}.2f}" if isinstance(v, float) else f"{str(v if v is not None else '-'):>{width}}"[:width]
            print(f"{r['batch']:>5} | {r['ms']:>15.2f} | {r['tok_s']:>8.0f} | {r['gbs']:>9.0f} | "
                  f"{100 * r['gbs'] / bandwidth:>8.0f}% | {cell(r.get('compiled_ms'), 20)} | "
                  f"{cell(hf_rows.get((False, r['batch'])), 25)} | {cell(hf_rows.get((True, r['batch'])), 17)} | "
                  f"{r['prefill_tok_s']:>13.0f} | {r['peak'] / 1e9:>8.2f} / {r['budget'] / 1e9:.2f} GB "
                  f"({r['peak'] / r['budget']:.2f}x) | first call {r['first_call_s']:.1f} s")
        print(f"prefill of one {args.long_prefill}-token prompt: {args.long_prefill / long_s:.0f} tok/s, "
              f"{long_rate:.0f} TFLOP/s of matmul work = {100 * long_rate / tflops:.0f}% of the measured rate\n",
              flush=True)


if __name__ == "__main__":
    main()
