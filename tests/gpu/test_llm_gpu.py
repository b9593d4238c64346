"""Language models on CUDA: CPU eager, GPU eager and GPU graph (the device loop) give the same
tokens on the tiny checkpoints (float32); half precision and the grouped-GEMM experts run."""
import os

import pytest
import torch

from ostinato import LanguageModel

pytestmark = pytest.mark.gpu
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "llm")
NAMES = ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe"]


def prompts(count=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (int(n),), generator=g).tolist()
            for n in torch.randint(1, 200, (count,), generator=g)]


@pytest.mark.parametrize("name", NAMES)
def test_cpu_eager_gpu_eager_and_gpu_graph_agree(name):
    path = os.path.join(DATA, name)
    batch = prompts()
    results = {}
    for label, device, loop in (("cpu", "cpu", "eager"), ("gpu eager", "cuda", "eager"),
                                ("gpu kstep", "cuda", "kstep"), ("gpu device loop", "cuda", "auto")):
        model = LanguageModel(path, device=device, dtype=torch.float32, decode_loop=loop, max_batch_size=4)
        greedy = [list(g) for g in model.generate(batch, max_new_tokens=16)]
        sampled = [list(g) for g in model.generate(batch, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=5)]
        results[label] = (greedy, sampled)
        if loop == "auto":
            assert model.decode_loop == "device"
            assert model.decoder.graph.rung(next(iter(model.decoder.graph.captured_keys()))) == "device loop"
    for label, (greedy, sampled) in results.items():
        assert greedy == results["cpu"][0], label
        assert sampled == results["gpu eager"][1], label


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_5_moe", "qwen3_next", "qwen3"])
def test_bfloat16_with_grouped_experts_matches_float32(name):
    path = os.path.join(DATA, name)
    batch = prompts(6, seed=1)
    full = LanguageModel(path, device="cuda", dtype=torch.float32)
    half = LanguageModel(path, device="cuda", dtype=torch.bfloat16)
    a = [list(g) for g in full.generate(batch, max_new_tokens=4)]
    b = [list(g) for g in half.generate(batch, max_new_tokens=4)]
    # bfloat16 may flip a late near-tie; the first tokens must agree for most prompts
    assert sum(x[0] == y[0] for x, y in zip(a, b)) >= len(batch) - 1


def test_a_growing_conversation_on_the_device_loop_keeps_the_cpu_tokens():
    """Each call's prompt grows by the last answer and a new turn: the state is made again (and the
    graphs captured again) only where the context doubles, and every answer is the CPU's."""
    path = os.path.join(DATA, "qwen3_5_moe")
    gpu = LanguageModel(path, device="cuda", dtype=torch.float32)
    cpu = LanguageModel(path, device="cpu", dtype=torch.float32)
    prompt, capacities = prompts(1, seed=3)[0], []
    for turn in range(8):
        got = gpu.generate([prompt], max_new_tokens=12)[0]
        assert list(got) == list(cpu.generate([prompt], max_new_tokens=12)[0]), f"turn {turn}"
        assert gpu.decoder.graph.rung(next(iter(gpu.decoder.graph.captured_keys()))) == "device loop"
        capacities.append(gpu.decoder.capacity)
        prompt = prompt + list(got) + prompts(1, seed=10 + turn)[0][:60]
    assert capacities == [256, 256, 512, 512, 512, 512, 1024, 1024]  # as on the CPU: the prompts are the CPU's


def test_streaming_on_the_device_loop_gives_the_generated_text():
    model = LanguageModel(os.path.join(DATA, "qwen3_5_moe"), device="cuda", dtype=torch.float32)
    prompt = prompts(1, seed=2)[0]
    pieces = list(model.stream(prompt, max_new_tokens=30, every=4))
    assert len(pieces) > 1
    assert "".join(pieces) == model.generate([prompt], max_new_tokens=30)[0].text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_delta_step_kernel_equals_the_pytorch_step(dtype):
    from ostinato.models.llm.delta_rule import recurrent_delta_step
    from ostinato.ops import delta_rule

    g = torch.Generator(device="cuda").manual_seed(0)
    rows, k_heads, v_heads, dk, dv = 5, 4, 8, 128, 64
    q, k = (torch.randn(rows, k_heads, dk, device="cuda", generator=g).to(dtype) for _ in range(2))
    v = torch.randn(rows, v_heads, dv, device="cuda", generator=g).to(dtype)
    decay = -torch.rand(rows, v_heads, device="cuda", generator=g)
    beta = torch.rand(rows, v_heads, device="cuda", generator=g).to(dtype)
    big = torch.randn(rows + 3, v_heads, dk, dv, device="cuda", generator=g)
    state = big[:rows]  # a row slice of a larger buffer, as the decoder passes it
    assert delta_rule.can_run(state, dk, dv)
    want_state = state.clone()
    want = recurrent_delta_step(q.repeat_interleave(2, 1), k.repeat_interleave(2, 1), v, decay, beta, want_state)
    got = delta_rule.delta_step(q, k, v, decay, beta, state)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dk,dv,dtype,heads", [(128, 128, torch.float32, 4), (64, 32, torch.float32, 4),
                                               (128, 128, torch.bfloat16, 4), (128, 128, torch.bfloat16, 48)])
def test_the_chunk_scan_kernel_equals_the_pytorch_scan(dk, dv, dtype, heads, monkeypatch):
    """The prefill's chunked delta rule with its chunk-to-chunk scan in one kernel (in TF32 for half
    precision), against the same rule with the scan as PyTorch ops (IEEE float32), and against the
    one-token recurrence. 48 heads of 3 rows: more programs of 16 columns than SMs, 32 a program."""
    from ostinato.models.llm import delta_rule as rule
    from ostinato.ops import delta_rule as kernels

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert kernels.scan_block(3 * heads * dv // 16, dv, sms) == (32 if 3 * heads * dv // 16 > sms else 16)
    g = torch.Generator(device="cuda").manual_seed(1)
    rows, length = 3, 200  # 200 tokens: four chunks, the last one padded
    q, k = (torch.randn(rows, length, heads, dk, device="cuda", generator=g).to(dtype) for _ in range(2))
    v = torch.randn(rows, length, heads, dv, device="cuda", generator=g).to(dtype)
    decay = -torch.rand(rows, length, heads, device="cuda", generator=g) * 0.5
    beta = torch.rand(rows, length, heads, device="cuda", generator=g)
    state = torch.randn(rows, heads, dk, dv, device="cuda", generator=g) * 0.1
    assert kernels.can_scan(state, 64)
    got, got_state = rule.chunked_delta_rule(q, k, v, decay, beta, state)
    monkeypatch.setattr(kernels, "can_scan", lambda *a: False)
    want, want_state = rule.chunked_delta_rule(q, k, v, decay, beta, state)
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # TF32 products; the output rounded to bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(got_state, want_state, rtol=tol, atol=tol)
    step_state = state.clone()
    steps = [rule.recurrent_delta_step(q[:, t], k[:, t], v[:, t], decay[:, t], beta[:, t], step_state)
             for t in range(length)]
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), torch.stack(steps, dim=1).float(), rtol=tol, atol=tol)
    torch.testing.assert_close(got_state, step_state, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunk_prepare_kernel_serves_shared_key_heads_and_nearly_alike_keys(dtype, monkeypatch):
    """Everything inside the chunks in one kernel (norms, decays, each chunk's triangular inverse, the
    values and keys solved for), a key head serving two value heads in place, against the PyTorch
    terms and solve (the same scan kernel after both), on keys nearly alike with slow decay (where an
    inexact inverse loses everything) and on random ones, and against the float64 recurrence."""
    from ostinato.models.llm import delta_rule as rule
    from ostinato.ops import delta_rule as kernels

    g = torch.Generator(device="cuda").manual_seed(2)
    rows, length, k_heads, v_heads, dk, dv = 2, 150, 2, 4, 128, 64  # three chunks, the last one padded
    for alike in (True, False):
        qk = torch.randn(rows, length, k_heads, 2 * dk, device="cuda", generator=g)
        if alike:  # one direction shared by every key, strong writes, almost no decay
            qk[..., dk:] = 0.3 * qk[..., dk:] + torch.randn(dk, device="cuda", generator=g)
            beta = 0.8 + 0.2 * torch.rand(rows, length, v_heads, device="cuda", generator=g)
            decay = -0.001 * torch.rand(rows, length, v_heads, device="cuda", generator=g)
        else:
            beta = torch.rand(rows, length, v_heads, device="cuda", generator=g)
            decay = -0.5 * torch.rand(rows, length, v_heads, device="cuda", generator=g)
        qk = qk.to(dtype)
        q, k = qk[..., :dk], qk[..., dk:]  # views of one projection, as the layer passes them
        v = torch.randn(rows, length, v_heads, dv, device="cuda", generator=g).to(dtype)
        state = torch.randn(rows, v_heads, dk, dv, device="cuda", generator=g) * 0.1
        assert kernels.can_prepare(q, v, 64)
        got, got_state = rule.chunked_delta_rule(q, k, v, decay, beta.to(dtype), state)
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "can_prepare", lambda *a: False)
            want, want_state = rule.chunked_delta_rule(q, k, v, decay, beta.to(dtype), state)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        scale = want.float().abs().max()
        assert (got.float() - want.float()).abs().max() / scale < tol
        assert (got_state - want_state).abs().max() / want_state.abs().max() < tol
        qr, kr = (x.repeat_interleave(2, dim=2).double() for x in (q, k))
        exact_state = state.double().clone()
        exact = torch.stack([rule.recurrent_delta_step(qr[:, t], kr[:, t], v[:, t].double(), decay[:, t].double(),
                                                       beta[:, t].to(dtype).double(), exact_state)
                             for t in range(length)], dim=1)
        assert (got.double() - exact).abs().max() / exact.abs().max() < (1e-4 if dtype == torch.float32 else 3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_prefill_chains_match_the_eager_ops_at_every_length(dtype, caplog):
    from torch._dynamo.utils import counters

    from ostinato.models.llm import fusion

    graphs = counters["stats"]["unique_graphs"]

    g = torch.Generator(device="cuda").manual_seed(0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for length in (5, 17, 300):
        def rand(*shape):
            return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
        x, u, w = rand(2, length, 256), rand(2, length, 256), rand(256)
        angle = torch.randn(length, 1, 16, device="cuda", generator=g)
        heads = rand(2, length, 4, 64)
        cases = [(fusion.rms_norm, (x, w, 1e-6, False)), (fusion.rms_norm, (x, w, 1e-6, True)),
                 (fusion.add_rms_norm, (x, u, w, 1e-6, True)), (fusion.gated_rms_norm, (x, u, w, 1e-6)),
                 (fusion.rotate, (heads, angle.cos().to(dtype), angle.sin().to(dtype))),
                 (fusion.swiglu, (x,)), (fusion.delta_gates, (x[..., :8], u[..., :8], w[:8].float(), w[:8]))]
        for fn, args in cases:
            with fusion.enabled():
                got = fn(*args)
            want = fn.uncompiled(*args)
            for a, b in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
                torch.testing.assert_close(a, b, **tol, msg=f"{fn.__name__} at {length} tokens")
    assert "runs uncompiled" not in caplog.text
    assert counters["stats"]["unique_graphs"] > graphs  # they did compile (once each, any length)


def compiled_tokens_eager_and_on_the_loop(name, seed):
    """({"eager": tokens, "auto": tokens}, the last model): six prompts, 12 new tokens each, from the
    bfloat16 compiled step run eagerly and on the device loop."""
    batch = prompts(6, seed=seed)
    tokens = {}
    for loop in ("eager", "auto"):
        model = LanguageModel(os.path.join(DATA, name), device="cuda", dtype=torch.bfloat16, decode_loop=loop,
                              max_batch_size=4, compile=True)
        tokens[loop] = [list(g) for g in model.generate(batch, max_new_tokens=12)]
    return tokens, model


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])  # Qwen3's norms; the hybrid's zero-centred ones, gated attention
def test_half_precision_decode_on_the_fused_kernels(name):
    """bfloat16 decode runs its projections on the skinny kernel (RMSNorm, SwiGLU and residual adds
    folded in) and attention on the grouped-query kernel: the device loop gives the tokens of the
    same compiled step run eagerly, and the fused step's logits are those of PyTorch's norms,
    matmuls and attention within bfloat16 rounding, with the same greedy choice nearly everywhere
    (a near-tie may flip)."""
    from ostinato.testing.llm_decode import step_logits, unfused_decode

    tokens, model = compiled_tokens_eager_and_on_the_loop(name, seed=3)
    assert tokens["auto"] == tokens["eager"]
    net = model.net
    fused = step_logits(net, torch.device("cuda"))
    with unfused_decode():
        plain = step_logits(net, torch.device("cuda"))
    worst = (fused - plain).abs().max().item() / plain.abs().max().item()
    agree = (fused.argmax(-1) == plain.argmax(-1)).double().mean().item()
    print(f"{name}: worst logit difference {worst:.4f} of the largest, greedy choices agree {agree:.2f}")
    assert worst <= 0.03
    assert agree >= 0.9


@pytest.mark.parametrize("name", ["qwen3_5_moe", "qwen3_moe"])  # with and without a shared expert
def test_half_precision_moe_decode_on_its_kernels(name):
    """bfloat16 MoE decode runs on ops.moe_decode (routing, the experts' products, the shared expert
    and the residual add): the device loop gives the tokens of the same compiled step run eagerly."""
    from ostinato.ops import moe_decode

    tokens, model = compiled_tokens_eager_and_on_the_loop(name, seed=4)
    layer = next(layer for layer in model.net.model.layers if layer.moe)
    assert moe_decode.can_run(torch.zeros(4, 8, device="cuda", dtype=torch.bfloat16), layer.mlp.experts_gate_up,
                              layer.mlp.experts_down)
    assert layer.mlp.router_in is not None
    assert tokens["auto"] == tokens["eager"]


def test_prefill_pointwise_kernels_on_cuda():
    """SwiGLU and the MoE prefill's combine of expert outputs against PyTorch in float16 and bfloat16,
    and a grouped MoE block with them against it without (dev/prefill_kernels_check.py)."""
    from dev_checks import run_dev_check

    out = run_dev_check("prefill_kernels_check.py", interpret=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "prefill kernels == reference: True", out.stdout
