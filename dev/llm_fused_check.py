"""Check a language model's fused decode step (``models.llm``: projections on the skinny kernel with
the RMSNorms, SwiGLU and residual adds folded in, the q/k norms, rotary and cache writes in one
kernel, attention on the grouped-query kernel) against the
same step on PyTorch's ops, on the tiny checkpoints in half precision.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/llm_fused_check.py   # CPU, float16
    PYTHONPATH=src python dev/llm_fused_check.py                                     # on a GPU, + bfloat16

Each model decodes four teacher-forced steps of three rows from an empty cache both ways; the
logits must agree within the dtype's rounding (worst difference against the largest logit) and give
the same greedy choice nearly everywhere (a near-tie may flip). Ends with
``fused decode == plain decode: True`` (exit 1 otherwise).
"""
import sys
from pathlib import Path

import torch

from ostinato import LanguageModel
from ostinato.ops import skinny
from ostinato.testing.llm_decode import step_logits, unfused_decode

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "llm"
# Dense MLPs only: a routed MoE turns a rounding difference into another expert on a near-tie
# (Qwen3-Next's tiny checkpoint is MoE: one row of one step differed by 24% of the largest logit in
# bfloat16 on an H100 while the rest stayed within 3%). Its attention and Gated DeltaNet layers are
# Qwen3.5's classes, checked through qwen3_5.
NAMES = ["qwen3", "llama", "qwen3_5"]
TOLERANCE = {torch.float16: 0.01, torch.bfloat16: 0.03}  # worst |difference| / largest |logit|


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from decode_attention_check import check_setup

    setup = check_setup(skinny.HAVE_TRITON)
    if setup is None:
        return 2
    on_gpu, device, _ = setup
    dtypes = [torch.float16] + ([torch.bfloat16] if on_gpu else [])
    ok_all = True
    for dtype in dtypes:
        for name in NAMES:
            net = LanguageModel(str(DATA / name), device=device.type, dtype=dtype, compile=False).net
            x = torch.zeros(1, net.config.hidden_size, device=device, dtype=dtype)
            if not skinny.op_can_run(x, net.lm_head.weight):
                print(f"{name}: the fused path does not run here")
                return 2
            fused = step_logits(net, device)
            with unfused_decode():
                plain = step_logits(net, device)
            worst = (fused - plain).abs().max().item() / plain.abs().max().item()
            agree = (fused.argmax(-1) == plain.argmax(-1)).double().mean().item()
            ok = worst <= TOLERANCE[dtype] and agree >= 0.9 and not torch.isnan(fused).any().item()
            ok_all &= ok
            print(f"{name:11s} {str(dtype)[6:]:8s} worst logit difference {worst:.4f} of the largest, "
                  f"greedy choices agree {agree:.2f} {'ok' if ok else 'FAIL'}")
    print(f"fused decode == plain decode: {ok_all}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
