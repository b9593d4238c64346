"""Where do CPU float32 and CUDA float32 part ways on a clip? (device-side diagnosis)

    PYTHONPATH=src python dev/probe_gpu_float32.py MODEL_DIR CLIP.npy
Prints the feature and encoder-output differences and, where the greedy tokens differ, the top-2
logit margin at the first differing step on both devices.
"""
import sys

import numpy as np
import torch

from ostinato import WhisperModel
from ostinato.audio import whisper_input_features

model_dir, clip = sys.argv[1], sys.argv[2]
audio = np.load(clip).astype(np.float32) / 32768.0
cpu = WhisperModel(model_dir, device="cpu", compute_type="float32")
gpu = WhisperModel(model_dir, device="cuda", compute_type="float32")
fc = whisper_input_features(audio, 80, device="cpu")[:, :3000]
fg = whisper_input_features(audio, 80, device="cuda")[:, :3000]
fc = torch.nn.functional.pad(fc, (0, 3000 - fc.shape[-1]))
fg = torch.nn.functional.pad(fg, (0, 3000 - fg.shape[-1]))
print("features max |diff|", (fc - fg.cpu()).abs().max().item())
ec, eg = cpu.encode(fc[None]), gpu.encode(fg[None])
print("encoder max |diff|", (ec - eg.cpu()).abs().max().item(), "rel", ((ec - eg.cpu()).norm() / ec.norm()).item())
tc = [s.tokens for s in cpu.transcribe(audio, beam_size=1, temperature=0.0)[0]]
tg = [s.tokens for s in gpu.transcribe(audio, beam_size=1, temperature=0.0)[0]]
print("tokens equal:", tc == tg)
flat_c = [t for seg in tc for t in seg]
flat_g = [t for seg in tg for t in seg]
k = next((i for i, (a, b) in enumerate(zip(flat_c, flat_g)) if a != b), None)
if k is not None:
    prompt = cpu.tokenizer.sot_sequence("en", "transcribe") + flat_c[:k]
    for name, m, enc in (("cpu", cpu, ec), ("gpu", gpu, eg)):
        d = m.dims
        hd = d.n_text_state // d.n_text_head
        sk = [torch.zeros(1, d.n_text_head, d.n_text_ctx, hd, device=m.device) for _ in range(d.n_text_layer)]
        sv = [torch.zeros_like(t) for t in sk]
        cross = m.model.decoder.cross_kv(enc)
        toks = torch.tensor([prompt], device=m.device)
        with torch.inference_mode():
            logits = m.model.decoder(toks, torch.arange(len(prompt), device=m.device)[None], sk, sv,
                                     [c[0] for c in cross], [c[1] for c in cross])[0, -1]
        top = logits.topk(2)
        print(name, "step", k, "top2", top.indices.tolist(), "margin", (top.values[0] - top.values[1]).item())
