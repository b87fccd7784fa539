#!/usr/bin/env bash
# Storage checks for a CUDA host: the storage tests with the device forced to
# CUDA (default dtype float16, then bfloat16 and float32), then the storage
# benchmark (default copy chunk, then 16 and 256 MiB to pick the default).
#
#   scripts/gpu_check.sh                               # CUDA if available, else CPU
#   BLOCKPOOL_STORAGE_DEVICE=cuda scripts/gpu_check.sh # fails at once without CUDA
#
# Results (test logs, JUnit XML, benchmark JSON, a summary) go to $OUT when
# set, else to bench/results/.  Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
RESULTS=${OUT:-bench/results}
mkdir -p "$RESULTS"
SUMMARY="$RESULTS/gpu_check_summary.txt"
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

has_cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))') || {
    say "error: cannot import torch with $PY"
    exit 2
}
DEVICE=${BLOCKPOOL_STORAGE_DEVICE:-}
if [ "$DEVICE" = "" ] && [ "$has_cuda" = 1 ]; then
    DEVICE=cuda
fi
if [[ "$DEVICE" == cuda* ]] && [ "$has_cuda" != 1 ]; then
    say "error: BLOCKPOOL_STORAGE_DEVICE=$DEVICE but torch.cuda.is_available() is False" \
        "($("$PY" -c 'import torch; print(torch.__version__)')); unset it to run on CPU"
    exit 2
fi
say "gpu_check: device=${DEVICE:-cpu (default)} results=$RESULTS"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$SUMMARY"
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$SUMMARY"

status=0
dtypes=("")
[[ "$DEVICE" == cuda* ]] && dtypes=("" bfloat16 float32)
for dtype in "${dtypes[@]}"; do
    tag=${dtype:-default}
    if BLOCKPOOL_STORAGE_DEVICE="$DEVICE" BLOCKPOOL_STORAGE_DTYPE="$dtype" \
        timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/blockpool/test_storage*.py \
        --junitxml="$RESULTS/storage-tests-$tag.xml" >"$RESULTS/storage-tests-$tag.log" 2>&1; then
        say "tests ($tag dtype): $(tail -n 1 "$RESULTS/storage-tests-$tag.log")"
    else
        status=1
        say "tests ($tag dtype) FAILED:"
        tail -n 30 "$RESULTS/storage-tests-$tag.log" | tee -a "$SUMMARY"
    fi
done

bench_args=()
[ -n "$DEVICE" ] && bench_args=(--device "$DEVICE")
for chunk in "" 16 256; do
    tag=${chunk:-default}
    extra=()
    [ -n "$chunk" ] && extra=(--copy-chunk-mib "$chunk")
    if timeout 300 "$PY" bench/bench_storage.py "${bench_args[@]}" "${extra[@]}" \
        --json "$RESULTS/storage-bench-$tag.json" >"$RESULTS/storage-bench-$tag.log" 2>&1; then
        say "bench (copy chunk $tag):"
        tee -a "$SUMMARY" <"$RESULTS/storage-bench-$tag.log"
    else
        status=1
        say "bench (copy chunk $tag) FAILED:"
        tail -n 30 "$RESULTS/storage-bench-$tag.log" | tee -a "$SUMMARY"
    fi
    [[ "$DEVICE" == cuda* ]] || break # on CPU one run is enough
done

say "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
