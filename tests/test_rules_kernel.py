"""The fused Whisper rules kernel (logit rules + log-softmax + greedy choice) in Triton's CPU
interpreter (skipped where Triton is not installed): against apply_logit_rules + log_softmax on random
rule states over real vocabulary layouts (dev/rules_kernel_check.py)."""
from dev_checks import run_dev_check


def test_rules_kernel_in_interpreter():
    out = run_dev_check("rules_kernel_check.py", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "rules kernel == torch: True", out.stdout
