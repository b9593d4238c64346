"""The flash-decoding attention kernel in Triton's CPU interpreter (skipped where Triton is not
installed): against a float64 reference with masked garbage keys, strided cache views, split and
single-program paths, float32 and float16, a prefill's tokens on one K/V row, K/V rows named on the
device (dev/decode_attention_check.py)."""
from dev_checks import run_dev_check


def test_decode_attention_in_interpreter():
    out = run_dev_check("decode_attention_check.py", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "decode attention == reference: True", out.stdout
