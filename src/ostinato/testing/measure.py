"""The machine's rates, measured in the same run as a benchmark: what "% of the copy bandwidth" and "%
of the matmul rate" are shares of, the arithmetic that turns a model into FLOPs, and the benchmarks'
median wall time (and a captured graph's median replay time)."""
from __future__ import annotations

import statistics
import time

import torch

from ..models.whisper.config import WhisperDims


def median_seconds(fn, repeats: int, device) -> tuple:
    """(median wall time of ``fn()`` over ``repeats`` runs, the last result), the device synchronised
    around each run (a CUDA device; nothing to wait for on the CPU)."""
    def sync():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    times, result = [], None
    for _ in range(max(1, repeats)):
        sync()
        start = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def replay_median_us(warm, body, reps: int, replays: int = 1) -> float:
    """Median microseconds of one replay of a graph captured from ``body()``, over ``reps`` timings of
    ``replays`` back-to-back replays each; ``warm()`` runs first, outside the capture (compiles,
    first-call work)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays)
    del graph
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy rate in GB/s (1e9 B/s), counting bytes read + bytes written (2 x nbytes).

    Median over ``repeats`` copies of one ``nbytes`` buffer, timed with CUDA events on CUDA
    (perf_counter elsewhere). On a GPU the read and the written bytes share the memory bus, so
    this is the rate at which DRAM moves bytes in either direction.
    """
    device = torch.device(device)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times) / 1e9


def matmul_tflops(device, dtype=torch.float16, n: int = 8192, repeats: int = 10) -> float:
    """Dense n x n x n matmul rate in TFLOP/s (2 n^3 per product), median over ``repeats``."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    c = a @ b
    for _ in range(2):
        torch.matmul(a, b, out=c)
    times = []
    for _ in range(max(1, repeats)):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t = time.perf_counter()
            torch.matmul(a, b, out=c)
            times.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def whisper_encoder_flops(dims: WhisperDims, batch: int = 1) -> float:
    """FLOPs (2 x multiply-adds) of the encoder forward over ``batch`` 30-s windows.

    conv1 (n_mels -> d, kernel 3, 2 x n_audio_ctx frames), conv2 (d -> d, kernel 3, stride 2,
    n_audio_ctx frames), and per layer: q, k, v, out projections (4 n d^2), attention scores and
    their product with V (2 n^2 d), the MLP (8 n d^2). Layer norms, GELU, softmax and the
    additions are elementwise and left out (well under 1%).
    """
    n, d = dims.n_audio_ctx, dims.n_audio_state
    convs = d * dims.n_mels * 3 * (2 * n) + d * d * 3 * n
    per_layer = 4 * n * d * d + 2 * n * n * d + 8 * n * d * d
    return 2.0 * batch * (convs + dims.n_audio_layer * per_layer)


def llm_prefill_flops(net, tokens: int) -> float:
    """FLOPs (2 x multiply-adds) of the matrix products one prompt's prefill of ``tokens`` tokens does,
    for a decoder-only network (``models.llm.network.DecoderNet``).

    Every layer's projections for every token (a routed expert's share: ``experts_per_token`` of
    ``num_experts``); the vocabulary projection once, for the last token (prefill makes no other
    logits); causal attention's score and value products (a query at position p reads p + 1 keys);
    and each Gated DeltaNet value head's chunked delta rule in chunks of C tokens: per chunk its
    C x C key products (K K^T and Q K^T), the triangular inverse (C^3 / 3 multiply-adds), the values
    and keys solved for, the output's in-chunk product, and the state read twice and updated (three
    C x dk x dv products). Norms, gates, the causal conv, softmax and routing are left out.
    """
    from ..models.llm.delta_rule import CHUNK  # the network's own module: already imported

    config = net.config
    per_token = 0.0
    for name, p in net.named_parameters():
        if p.dim() < 2 or "conv1d" in name or name.endswith(("embed_tokens.weight", "lm_head.weight")):
            continue
        share = config.experts_per_token / config.num_experts if ".experts_" in name else 1.0
        per_token += p.numel() * share
    total = 2.0 * tokens * per_token + 2.0 * net.lm_head.weight.numel()
    pairs = tokens * (tokens + 1) / 2  # (query, key) pairs under the causal mask
    c = CHUNK
    chunks = -(-tokens // c)
    for layer in net.model.layers:
        if layer.linear:
            la = layer.linear_attn
            dk, dv = la.dk, la.dv
            per_chunk = 2 * c * c * dk + c ** 3 / 3 + c * c * (dk + dv) + c * c * dv + 3 * c * dk * dv
            total += 2.0 * la.v_heads * chunks * per_chunk
        else:
            attn = layer.self_attn
            total += 2.0 * 2 * attn.heads * attn.head_dim * pairs
    return total
