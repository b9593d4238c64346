"""The fused Whisper decode path wired end to end == the plain PyTorch path (Triton interpreter or GPU).

    TRITON_INTERPRET=1 PYTHONPATH=src python dev/whisper_fused_check.py

The kernels have their own checks (dev/*_check.py); this one checks how the decoder uses them: a
small random Whisper (head size 64, the real English vocabulary) decodes the same windows with
the fused operators and one-kernel logit rules forced on, and with plain PyTorch. float32, so the
two may differ only by rounding: logits of each step within 1e-4 relative, and the same tokens for
greedy decoding with timestamp rules (also its scores and no-speech probabilities, which the fused
greedy step books itself) and with a repetition penalty, for beam search and for seeded sampling, and for
prompts with a head to prefill (earlier text; the prefill's logits and the keys it caches, on a cross K/V
slot named on the device and as a view). On the CPU the
fused path only runs under the interpreter; here it is forced on by replacing the switch that
normally keeps it to half precision on CUDA. Prints ``fused decode == torch: True`` last.
"""
from __future__ import annotations

import os
import sys

import torch

from ostinato.models.whisper import modules
from ostinato.models.whisper.config import WhisperDims
from ostinato.models.whisper.decoding import SearchOptions, WindowDecoder, WindowRequest
from ostinato.models.whisper.loaders.vocab import whisper_tokenizer_file
from ostinato.models.whisper.modules import Whisper
from ostinato.models.whisper.tokenizer import WhisperTokenizer

DIMS = WhisperDims(n_mels=80, n_audio_ctx=48, n_audio_state=128, n_audio_head=2, n_audio_layer=1, n_vocab=51864,
                   n_text_ctx=64, n_text_state=128, n_text_head=2, n_text_layer=2)


def build(device) -> tuple:
    torch.manual_seed(0)
    model = Whisper(DIMS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and "ln" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.2)  # wide logits: clear argmax margins between the two paths
    model = model.to(device).eval().requires_grad_(False)
    # As a decoder that runs the fused step does: q/k/v packed into one tensor (the plain path
    # then reads views of it: the same values).
    model.decoder.pack_self_attention()
    tok = WhisperTokenizer(whisper_tokenizer_file(DIMS.n_vocab), False, 0)
    return model, tok


def decode_all(model, tok, device, fused: bool) -> dict:
    original = modules.fused_step_enabled
    if fused:
        modules.fused_step_enabled = lambda x, head_dim: True
    try:
        decoder = WindowDecoder(model, tok, device, buckets=(1, 2, 4), steps_per_replay=4, capacity=9)
        decoder._fused_rules = fused
        decoder._prefill_together = fused
        torch.manual_seed(1)
        features = torch.randn(3, DIMS.n_audio_ctx, DIMS.n_audio_state, device=device)
        prompt = [tok.sot]
        requests = [WindowRequest(prompt, True, 50, 12), WindowRequest(prompt + [tok.timestamp_begin], True, 50, 10)]
        # prompts with a head to prefill: earlier text (5 tokens), and <|startoftranscript|> alone (1)
        # (the first two of one length: one prefill call when the operators compute each row alone)
        previous = [tok.sot_prev, 400, 401, 402, 403, tok.sot]
        other = [tok.sot_prev, 500, 501, 502, 503, tok.sot]
        headed = [WindowRequest(previous, True, 50, 10), WindowRequest(other, True, 50, 10),
                  WindowRequest([tok.sot, tok.no_timestamps], False, 50, 10)]
        suppress = list(tok.suppressed_tokens([-1]))
        begin = [tok.encode(" ")[0], tok.eot]
        out = {}
        with torch.inference_mode():
            greedy = decoder.decode(features[:2], requests, suppress, begin)
            out["greedy"] = [r.tokens for r in greedy]
            out["greedy scores"] = torch.tensor([[r.sum_logprob, r.no_speech_prob] for r in greedy])
            out["penalized"] = [r.tokens for r in decoder.decode(features[:2], requests, suppress, begin,
                                                                 SearchOptions(repetition_penalty=1.5))]
            out["beam"] = [r.tokens for r in decoder.decode(features[:2], requests, suppress, begin,
                                                            SearchOptions(beam_size=3))]
            prefilled = decoder.decode(features, headed, suppress, begin)
            out["prefilled"] = [r.tokens for r in prefilled]
            out["prefilled scores"] = torch.tensor([[r.sum_logprob, r.no_speech_prob] for r in prefilled])
            out["prefilled beam"] = [r.tokens for r in decoder.decode(features, headed, suppress, begin,
                                                                      SearchOptions(beam_size=3))]
            decoder.seed(7)
            out["sampling"] = [r.tokens for r in decoder.decode(features[:2], requests, suppress, begin,
                                                                SearchOptions(temperature=0.7, num_hypotheses=2))]
            # One step's logits through both paths, from the same cache state.
            cache = torch.randn(2, 2, 2, DIMS.n_text_head, DIMS.n_text_ctx, 64, device=device)
            self_k = [cache[0, i].clone() for i in range(2)]
            self_v = [cache[1, i].clone() for i in range(2)]
            cross = model.decoder.cross_kv(features[:2])
            tokens = torch.tensor([[tok.sot], [400]], device=device)
            positions = torch.tensor([[5], [17]], device=device)
            out["logits"] = model.decoder(tokens, positions, self_k, self_v, [k for k, _ in cross], [v for _, v in cross])
            out["self_k"] = torch.stack(self_k)
            # A prompt head of one row: its logits at one position, and the keys it leaves in the cache,
            # on the cross K/V of window 1 named on the device and as a view.
            # Two heads at once, each on the other's window.
            heads = torch.tensor([[tok.sot_prev, 400, 401, tok.sot, 402], [tok.sot_prev, 500, 501, tok.sot, 502]],
                                 device=device)
            for name, n, rows in (("head", 1, torch.tensor([1], device=device)), ("head view", 1, None),
                                  ("two heads", 2, torch.tensor([1, 0], device=device))):
                head = heads[:n]
                positions = torch.arange(head.shape[1], device=device).repeat(n, 1)
                head_k = [cache[0, i, :n].clone() for i in range(2)]
                head_v = [cache[1, i, :n].clone() for i in range(2)]
                ck = [k if rows is not None else k[1:] for k, _ in cross]
                cv = [v if rows is not None else v[1:] for _, v in cross]
                out[f"{name} logits"] = model.decoder(head, positions, head_k, head_v, ck, cv, cross_rows=rows,
                                                      logits_at=3)
                out[f"{name} self_k"] = torch.stack(head_k)
        return out
    finally:
        modules.fused_step_enabled = original


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding: relative norm of the difference under 1e-5 (a second layer's keys
    inherit the first layer's rounding, a few units of 1e-5 on single elements)."""
    return ((a - b).norm() / b.norm()).item() < 1e-5


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
    torch.set_num_threads(1)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from decode_attention_check import patch_interpreter_index

        patch_interpreter_index()
    model, tok = build(device)
    plain = decode_all(model, tok, device, fused=False)
    fused = decode_all(model, tok, device, fused=True)
    ok = True
    for name in ("greedy", "penalized", "beam", "sampling", "prefilled", "prefilled beam"):
        same = plain[name] == fused[name]
        lengths = [len(t) for t in plain[name]]
        print(f"{name:<9} tokens equal: {same}  lengths {lengths}")
        ok &= same and all(n > 0 for n in lengths)
    for name in ("greedy scores", "prefilled scores"):
        scores = torch.allclose(fused[name], plain[name], rtol=1e-4, atol=1e-6)
        print(f"{name} (sum_logprob and no_speech_prob) equal: {scores}  {plain[name].tolist()}")
        ok &= scores
    rel = ((fused["logits"] - plain["logits"]).norm() / plain["logits"].norm()).item()
    print(f"one step's logits: relative difference {rel:.2e}")
    same_cache = close(fused["self_k"], plain["self_k"])
    print(f"cache written at the same positions: {same_cache}")
    ok &= rel < 1e-4 and same_cache
    for name, n in (("head", 1), ("head view", 1), ("two heads", 2)):
        rel = ((fused[f"{name} logits"] - plain[f"{name} logits"]).norm() / plain[f"{name} logits"].norm()).item()
        same_cache = close(fused[f"{name} self_k"], plain[f"{name} self_k"])
        shape = tuple(fused[f"{name} logits"].shape) == (n, 1, DIMS.n_vocab)
        print(f"a prompt head ({name}): logits relative difference {rel:.2e}, shape {shape}, cache equal {same_cache}")
        ok &= rel < 1e-4 and same_cache and shape
    print(f"fused decode == torch: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
