"""models.llm.fusion: when a chain runs compiled, and what happens when compiling fails (CPU; the
compiled kernels' numbers are checked against the eager ops on the GPU)."""
import logging

import torch
import torch.nn.functional as F

from ostinato.models.llm import fusion


def reference_rms_norm(x, weight, eps):
    h = x.double()
    return (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


def test_chains_equal_the_formulas_they_stand_for():
    g = torch.Generator().manual_seed(0)
    x, u = torch.randn(2, 7, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    w = torch.randn(16, generator=g)
    torch.testing.assert_close(fusion.rms_norm(x, w, 1e-6, False), reference_rms_norm(x, w, 1e-6))
    torch.testing.assert_close(fusion.rms_norm(x, w, 1e-6, True), reference_rms_norm(x, 1 + w, 1e-6))
    total, normed = fusion.add_rms_norm(x, u, w, 1e-6, False)
    torch.testing.assert_close(total, x + u)
    torch.testing.assert_close(normed, reference_rms_norm(x + u, w, 1e-6))
    torch.testing.assert_close(fusion.gated_rms_norm(x, u, w, 1e-6), reference_rms_norm(x, w, 1e-6) * F.silu(u))
    torch.testing.assert_close(fusion.swiglu(torch.cat((x, u), -1)), F.silu(x) * u)
    # rotary on the first 8 features of each head: pairs (i, i + 4) turn by the angle, the rest pass
    angle = torch.randn(7, 4, generator=g)
    out = fusion.rotate(x, angle.cos(), angle.sin())
    a, b = x[..., :4], x[..., 4:8]
    torch.testing.assert_close(out[..., :4], a * angle.cos() - b * angle.sin())
    torch.testing.assert_close(out[..., 4:8], b * angle.cos() + a * angle.sin())
    torch.testing.assert_close(out[..., 8:], x[..., 8:])
    beta, decay = fusion.delta_gates(x[..., :3], u[..., :3], torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(beta, torch.sigmoid(x[..., :3]))
    torch.testing.assert_close(decay, -torch.log1p(torch.exp(u[..., :3] + 1)))


def chain():
    calls = []

    def double(x):
        calls.append("eager")
        return 2 * x
    return fusion.fusible(double), calls


def test_a_chain_runs_eager_unless_enabled_and_on_the_gpu(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(kw) or (lambda x: 3 * x))
    run, calls = chain()
    x = torch.ones(2)
    assert run(x).tolist() == [2, 2] and calls == ["eager"] and not compiled  # not enabled
    with fusion.enabled():
        assert run(x).tolist() == [2, 2] and not compiled  # a CPU tensor
        monkeypatch.setattr(fusion, "_compilable", lambda t: True)
        assert run(x).tolist() == [3, 3] and run(x).tolist() == [3, 3]
    assert compiled == [dict(dynamic=True)]  # compiled once, for every shape
    with fusion.enabled(False):
        assert run(x).tolist() == [2, 2]


def test_a_chain_that_fails_to_compile_warns_once_and_stays_eager(monkeypatch, caplog):
    def broken(x):
        raise RuntimeError("inductor could not lower this\nmore detail")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: broken)
    monkeypatch.setattr(fusion, "_compilable", lambda t: True)
    run, calls = chain()
    with caplog.at_level(logging.WARNING, logger=fusion.__name__), fusion.enabled():
        assert run(torch.ones(2)).tolist() == [2, 2]
        assert run(torch.ones(2)).tolist() == [2, 2]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["ostinato: double runs uncompiled (RuntimeError: inductor could not lower this)"]
    assert calls == ["eager", "eager"]


def test_a_compiled_decode_step_traces_through_the_chains_in_one_graph():
    """The decode step is compiled whole: the chains inside it must not break its graph."""
    import os

    from ostinato import LanguageModel
    from ostinato.runtime import DeviceState

    for name in ("qwen3", "qwen3_5_moe"):
        net = LanguageModel(os.path.join(os.path.dirname(__file__), "data", "llm", name), device="cpu").net
        state = DeviceState(torch.device("cpu"))
        for key, (shape, dtype) in net.state_spec(2, 64).items():
            state.allocate(key, shape, dtype)
        tokens, positions = torch.tensor([5, 7]), torch.tensor([3, 9])
        torch._dynamo.reset()
        with fusion.enabled():
            report = torch._dynamo.explain(net.decode)(tokens, positions, state, 2)
        assert report.graph_break_count == 0, (name, report.break_reasons)
        assert report.graph_count == 1, name
