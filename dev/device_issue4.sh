#!/bin/bash
# Issue 4 on the device (logs under $OUT), in two calls of under 10 minutes each:
#   PHASE=tests ./dev/device_issue4.sh    kernel checks and the GPU tests
#   PHASE=bench ./dev/device_issue4.sh    kernel bench, step profile, bench/whisper_gpu.py ($BENCH_ARGS)
# Expects the real tiny.en parts copied to /tmp/tiny by earlier calls (dev/export_device_bundle.py).
cp .carry/tiny_rest/*.json .carry/tiny_rest/*.txt /tmp/tiny/ 2>/dev/null
[ -f /tmp/tiny/model.bin ] || cat /tmp/tiny/model.bin.0 /tmp/tiny/model.bin.1 > /tmp/tiny/model.bin
export PYTHONPATH=src:.carry/pylib OSTINATO_TINY_EN=/tmp/tiny OSTINATO_CLIP_SAMPLES=.carry/tiny_rest/clips
if [ "${PHASE:-tests}" = tests ]; then
for check in decode_attention skinny rules_kernel whisper_fused; do
  timeout 300 python dev/${check}_check.py > $OUT/$check.txt 2>&1; echo "$check rc=$? $(tail -1 $OUT/$check.txt)"
done
timeout ${TEST_S:-200} python -m pytest -q tests/gpu -k "not transducer" -p no:cacheprovider > $OUT/gputests.txt 2>&1
echo "gpu tests rc=$?"; tail -25 $OUT/gputests.txt
exit 0
fi
timeout 120 python bench/skinny_ops.py > $OUT/skinny_bench.txt 2>&1; echo "skinny bench rc=$?"; tail -15 $OUT/skinny_bench.txt
timeout ${PROFILE_S:-120} python dev/whisper_profile.py --sizes tiny large-v3 --batches 1 16 --top 15 > $OUT/profile.txt 2>&1
echo "profile rc=$?"; grep -E "==|kernels, kernel time" $OUT/profile.txt
timeout ${BENCH_S:-260} python bench/whisper_gpu.py --out $OUT $BENCH_ARGS > $OUT/bench.txt 2>&1
echo "bench rc=$?"; tail -45 $OUT/bench.txt
