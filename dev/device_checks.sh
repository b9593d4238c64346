#!/bin/bash
# The GPU checks on the device machine (logs under $OUT), in calls of under 10 minutes each:
#   PHASE=tests  ./dev/device_checks.sh   kernel checks and the GPU tests
#   PHASE=bench  ./dev/device_checks.sh   kernel bench, step profile, bench/whisper_gpu.py ($BENCH_ARGS)
#   PHASE=verify ./dev/device_checks.sh   after a change to the step: its checks, the GPU tests and the bench
#   PHASE=e2e    ./dev/device_checks.sh   bench/whisper_e2e.py on the real tiny.en beside transformers' pipeline ($E2E_ARGS)
#   PHASE=first  ./dev/device_checks.sh   dev/first_call_profile.py: fresh processes, Triton cache cold then warm,
#                                          random tiny and large-v3, large-v3 at 1, 2 and 8 steps per replay
#   PHASE=serve  ./dev/device_checks.sh   the runtime and Whisper GPU tests, then bench/serve_gpu.py ($SERVE_ARGS)
#                                          under dev/engine_timeline.py (timeline.txt: engine and HTTP waits);
#                                          carry .carry/server (dev/server_device_bundle.py): no tiny.en needed
# Expects the real tiny.en parts copied to /tmp/tiny by earlier calls (dev/export_device_bundle.py).
if [ -d /tmp/tiny ]; then  # (PHASE=serve needs none of it)
  cp .carry/tiny_rest/*.json .carry/tiny_rest/*.txt /tmp/tiny/ 2>/dev/null
  [ -f /tmp/tiny/model.bin ] || cat $(ls /tmp/tiny/model.bin.* | sort -t. -k3 -n) > /tmp/tiny/model.bin
fi
export PYTHONPATH=src:.carry/pylib OSTINATO_TINY_EN=/tmp/tiny OSTINATO_CLIP_SAMPLES=.carry/tiny_rest/clips
BENCH_ARGS=${BENCH_ARGS:---e2e-model /tmp/tiny --clips .carry/tiny_rest/clips --sizes tiny small large-v3 --batches 1 16 --sweep 1 4 16 --steps 64 --repeats 3 --peer-repeats 2}
checks() {
  for check in "$@"; do
    timeout ${CHECK_S:-300} python dev/${check}_check.py > $OUT/$check.txt 2>&1; echo "$check rc=$? $(tail -1 $OUT/$check.txt)"
  done
}
gpu_tests() {
  timeout ${TEST_S:-240} python -m pytest -q tests/gpu -p no:cacheprovider > $OUT/gputests.txt 2>&1
  echo "gpu tests rc=$?"; tail -25 $OUT/gputests.txt
}
bench() {
  timeout ${BENCH_S:-260} python bench/whisper_gpu.py --out $OUT $BENCH_ARGS > $OUT/bench.txt 2>&1
  echo "bench rc=$?"; tail -${BENCH_LINES:-45} $OUT/bench.txt
}
E2E_ARGS=${E2E_ARGS:---configs greedy-b16 defaults-b16 greedy-b1 words-b16 --ttft-sizes tiny large-v3}
case "${PHASE:-tests}" in
  tests) checks decode_attention skinny rotary_cache moe_decode gated_delta llm_fused rules_kernel whisper_fused; gpu_tests ;;
  verify) CHECK_S=100 checks ${CHECKS:-rules_kernel whisper_fused}; TEST_S=150 gpu_tests; BENCH_LINES=24 bench ;;
  bench)
    timeout 120 python bench/skinny_ops.py > $OUT/skinny_bench.txt 2>&1; echo "skinny bench rc=$?"; tail -15 $OUT/skinny_bench.txt
    timeout ${PROFILE_S:-120} python dev/whisper_profile.py --sizes tiny large-v3 --batches 1 16 --top 15 --encoder large-v3 > $OUT/profile.txt 2>&1
    echo "profile rc=$?"; grep -E "==|kernels, kernel time" $OUT/profile.txt
    bench ;;
  first)
    export TRITON_CACHE_DIR=$(mktemp -d)
    for run in "tiny_cold --size tiny" "tiny_warm --size tiny" "tiny_b16 --size tiny --batch 16" \
               "large_cold --size large-v3" "large_k8 --size large-v3" "large_k2 --size large-v3 --steps-per-replay 2" \
               "large_k1 --size large-v3 --steps-per-replay 1"; do
      set -- $run; name=$1; shift
      timeout 120 python dev/first_call_profile.py --top 60 "$@" > $OUT/first_$name.txt 2>&1
      echo "== $name rc=$?"; sed -n 2,9p $OUT/first_$name.txt
    done ;;
  serve)
    python -m pip install -q --no-index --no-deps --no-compile --target /tmp/server_lib .carry/server/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/server_lib
    timeout ${TEST_S:-150} python -m pytest -q tests/gpu/test_runtime_gpu.py tests/gpu/test_whisper_gpu.py \
      -p no:cacheprovider > $OUT/gputests.txt 2>&1
    echo "gpu tests rc=$?"; tail -5 $OUT/gputests.txt
    timeout ${SERVE_S:-400} python dev/engine_timeline.py run $OUT/timeline -- python bench/serve_gpu.py --size large-v3 \
      --speech .carry/server/speech.wav ${SERVE_ARGS:---concurrency 16 64} > $OUT/serve.txt 2>&1
    echo "serve bench rc=$?"; sed -n '/^== ostinato/,$p' $OUT/serve.txt
    python dev/engine_timeline.py show $OUT/timeline/*.json > $OUT/timeline.txt 2>&1  # where each request's time went
    grep -E "^==|alone|short audios" $OUT/timeline.txt | cut -c1-220 ;;
  e2e)
    timeout ${E2E_S:-560} python bench/whisper_e2e.py --model /tmp/tiny --clips .carry/tiny_rest/clips --out $OUT $E2E_ARGS \
      > $OUT/e2e.txt 2>&1
    echo "e2e rc=$?"; tail -30 $OUT/e2e.txt ;;
esac
exit 0
