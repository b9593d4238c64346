"""The flash-decoding attention kernel in Triton's CPU interpreter (skipped where Triton is not
installed): against a float64 reference with masked garbage keys, strided cache views, split and
single-program paths, float32 and float16 (dev/decode_attention_check.py)."""
from dev_checks import run_dev_check


def test_decode_attention_in_interpreter():
    out = run_dev_check("decode_attention_check.py", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "decode attention == reference: True", out.stdout


def test_import_and_availability_without_a_gpu(monkeypatch):
    """The module imports (Triton or not) and never offers the kernel for the CPU or when disabled."""
    import torch

    from ostinato.ops.decode_attention import decode_attention_available

    assert not decode_attention_available("cpu")
    assert not decode_attention_available(torch.zeros(1))
    monkeypatch.setenv("OSTINATO_NO_TRITON", "1")
    assert not decode_attention_available("cuda")
