"""CPU checks of the transducer's Triton kernels in the Triton interpreter: the fused decode step
against the PyTorch step, and the encoder's kernels (conv module, relative-position attention over
packed rows, subsampling, a whole two-layer packed encoder) against float32 PyTorch.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/transducer_fused_check.py
"""

import torch

from ostinato import settings  # noqa: E402
from ostinato.models.transducer import kernels  # noqa: E402
from ostinato.models.transducer.encoder import pack_rows  # noqa: E402
from ostinato.models.transducer.label_looping import LabelLoopingDecoder  # noqa: E402
from ostinato.testing.random_models import random_prediction_and_joint  # noqa: E402


def main():
    assert settings.triton_interpreter() and kernels.HAVE_TRITON
    dtype = torch.float16
    for durations in ([0, 1, 2, 3, 4], []):
        p, j = random_prediction_and_joint(40, 32, 32, durations, dtype)
        enc = torch.randn(3, 23, 48).to(dtype)
        lengths = torch.tensor([23, 17, 5])
        results = {}
        for fused in (False, True):
            dec = LabelLoopingDecoder(p, j, 40, durations, torch.device("cpu"), use_graphs=False, steps_per_replay=3)
            dec.fused = fused
            with torch.inference_mode():
                results[fused] = [(h.tokens, h.frames, h.durations) for h in dec.decode(enc, lengths, max_symbols=2)]
        same = results[True] == results[False]
        print("tdt" if durations else "rnnt", "fused == torch:", same, [len(r[0]) for r in results[True]])
        if not same:
            for a, b in zip(results[True], results[False]):
                print(" fused", a)
                print(" torch", b)
    # conv module kernel on packed rows: each row's own frames only
    lengths = torch.tensor([37, 20, 1])
    x = torch.randn(3, 37, 2 * 64).to(dtype)
    w = torch.randn(64, 1, 9).to(dtype) * 0.3
    b = torch.randn(64).to(dtype)
    rows = pack_rows(lengths, int(lengths.sum()), 37)
    got = kernels.glu_dwconv_silu(x.view(-1, 128)[rows.source], w, b, rows.starts, rows.lengths, 37).float()
    y = torch.nn.functional.glu(x.float(), dim=-1)
    y = y.masked_fill(torch.arange(37)[None, :, None] >= lengths[:, None, None], 0.0)
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(y.transpose(1, 2), w.float(), b.float(), padding=4, groups=64)).transpose(1, 2)
    ref = ref.reshape(-1, 64)[rows.source]
    err = ((got - ref).norm() / ref.norm()).item()
    print("glu_dwconv_silu rel err", err)
    assert err < 2e-3
    # the same with the GLU taken before (as linear_glu gives it)
    glu = torch.nn.functional.glu(x.view(-1, 128)[rows.source], dim=-1)
    got = kernels.glu_dwconv_silu(glu, w, b, rows.starts, rows.lengths, 37, glu=False).float()
    err = ((got - ref).norm() / ref.norm()).item()
    print("dwconv_silu (GLU taken) rel err", err)
    assert err < 2e-3

def check_relpos():
    """The packed kernel path (position scores + attention kernel) against the float32 padded reference."""
    from ostinato.models.transducer.encoder import RelPositionAttention, relative_positions
    torch.manual_seed(0)
    # several key blocks, a partial last block, a row of one frame, a one-frame input, and short rows
    # beside a long one (most tiles of the position term outside every band: not computed)
    # (the last with scores spread wide: row maxima that keep growing after the first key block, so the
    # running sums are rescaled many times over)
    for h, dk, lengths, gain in ((2, 16, [70, 50], 1), (2, 32, [129, 1, 64], 1), (2, 16, [1], 1),
                                 (2, 16, [300, 17, 40, 5, 33], 1), (2, 32, [200, 150], 6)):
        b, t, d = len(lengths), max(lengths), h * dk
        att = RelPositionAttention(d, h, True)
        att.pos_bias_u.data.normal_()
        att.pos_bias_v.data.normal_()
        x = torch.randn(b, t, d) * torch.linspace(1, gain, t)[None, :, None]  # later keys larger
        pe = relative_positions(t, d, "cpu", torch.float32)
        lengths = torch.tensor(lengths)
        kb = torch.zeros(b, t).masked_fill_(torch.arange(t)[None] >= lengths[:, None], -10000.0)
        rows = pack_rows(lengths, int(lengths.sum()), t)
        with torch.inference_mode():
            ref = att(x, pe, kb).reshape(b * t, d)[rows.source]  # float32 torch path
            width = -(-(2 * t + 7) // 8) * 8  # descending and padded, as the encoder gives them
            pe_rows = torch.nn.functional.pad(pe.flip(0), (0, 0, width - pe.shape[0], 8))
            got = att.half().forward_packed(x.half().reshape(b * t, d)[rows.source], pe_rows.half(), rows).float()
        assert torch.isfinite(got).all()
        for i, n in enumerate(lengths.tolist()):
            s = int(rows.starts[i])
            err = ((got[s:s + n] - ref[s:s + n]).norm() / ref[s:s + n].norm()).item()
            print(f"relpos attention fp16 (triton, packed) vs fp32, T={t} length {n}: rel err {err:.2e}")
            assert err < 5e-3


def check_encoder():
    """A whole two-layer encoder: the packed kernel path in float16 against the padded float32 reference
    (rows of three lengths, so packing, key bounds and the conv's row edges all matter)."""
    from ostinato.models.transducer.encoder import FastConformerEncoder
    from ostinato.models.transducer.nemo_checkpoint import EncoderConfig
    torch.manual_seed(2)
    cfg = EncoderConfig(feat_in=24, n_layers=2, d_model=64, n_heads=2, ff_expansion_factor=4,
                        subsampling_factor=8, subsampling_conv_channels=16, conv_kernel_size=9)
    enc = FastConformerEncoder(cfg).eval()
    for prm in enc.parameters():
        prm.data.normal_(0, 0.2)
    for layer in enc.layers:
        for norm in (layer.norm_ff1, layer.norm_att, layer.norm_conv, layer.norm_ff2, layer.norm_out):
            norm.weight.data.fill_(1.0)
    feat_lengths = [300, 131, 9]
    n = torch.tensor(feat_lengths)
    feats = torch.randn(3, cfg.feat_in, 300).masked_fill_(torch.arange(300)[None, None, :] >= n[:, None, None], 0.0)
    with torch.inference_mode():
        ref, ref_len = enc(feats, n)
        got, got_len = enc.half()(feats, n, host_lengths=feat_lengths)
        enc.float()
    assert torch.equal(ref_len, got_len)
    for i, k in enumerate(ref_len.tolist()):
        err = ((got[i, :k].float() - ref[i, :k]).norm() / ref[i, :k].norm()).item()
        print(f"encoder fp16 (triton, packed) vs fp32, length {k}: rel err {err:.2e}")
        assert err < 1e-2
        assert not got[i, k:].any()


def check_subsampling():
    from ostinato.models.transducer.encoder import DwStridingSubsampling
    torch.manual_seed(1)
    for factor, feat, lengths in ((8, 20, [61, 40, 1]), (4, 17, [33, 9]), (16, 24, [70])):
        sub = DwStridingSubsampling(feat, 32, 16, factor)
        for m in sub.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                m.bias.data.normal_(0, 0.3)
        b, t = len(lengths), max(lengths)
        n = torch.tensor(lengths)
        x = torch.randn(b, t, feat).masked_fill_(torch.arange(t)[None, :, None] >= n[:, None, None], 0.0)
        with torch.inference_mode():
            ref, ref_len = sub(x, n)  # float32 torch path
            sub = sub.half()
            weight = sub.out.weight.clone()
            got, got_len = sub(x, n)  # interpreter: triton kernels (x given in float32)
            sub.float()(x, n)  # back on the torch path: the weight's column order restored
        assert torch.equal(ref_len, got_len)
        assert torch.equal(sub.out.weight, weight.float())
        for i, k in enumerate(ref_len.tolist()):
            err = ((got[i, :k].float() - ref[i, :k]).norm() / ref[i, :k].norm()).item()
            print(f"subsampling x{factor} fp16 (triton) vs fp32, T={t} length {lengths[i]}: rel err {err:.2e}")
            assert err < 5e-3


if __name__ == "__main__":
    from decode_attention_check import patch_interpreter_index

    patch_interpreter_index()  # loop bounds read on the device, under NumPy >= 2.4
    main()
    check_relpos()
    check_subsampling()
    check_encoder()
