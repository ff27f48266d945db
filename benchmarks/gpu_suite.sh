#!/usr/bin/env bash
# Builds ckfmha in place for the local GPU, runs the GPU tests, a memcheck
# pass, the CLI and C examples, and the forward and backward benchmarks; logs
# go to LOG_DIR.
#
#   benchmarks/gpu_suite.sh LOG_DIR [COMMIT]
set -uo pipefail
log=${1:?usage: gpu_suite.sh LOG_DIR [COMMIT]}
commit=${2:-unknown}
mkdir -p "$log"
export CKFMHA_ARCHS=${CKFMHA_ARCHS:-sm_90a} CKFMHA_KERNELS=${CKFMHA_KERNELS:-default}
export CKFMHA_JOBS=${CKFMHA_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
# The in-place build is imported from the checkout.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

echo "== build ($CKFMHA_ARCHS, $CKFMHA_KERNELS)"
if ! python3 setup.py build_ext --inplace >"$log/build.log" 2>&1; then
  tail -40 "$log/build.log"
  exit 1
fi
grep -E "registers|spill" "$log/build.log" | sort | uniq -c | head -20

echo "== GPU tests"
python3 -m pytest -q tests -m gpu -rs 2>&1 | tee "$log/gpu_tests.log" | tail -15 || status=1

echo "== CLI"
python3 -m ckfmha run --batch 2 --heads 16 --seqlen 2048 --hdim 128 --causal --validate \
  2>&1 | tee "$log/cli.log" || status=1

echo "== C examples"
# The flags of tests/capi/test_c_examples.py; an exit of 77 means this build has no kernel for it.
inc=$(python3 -c "import ckfmha; print(ckfmha.get_include()[-1])")
lib=$(python3 -c "import ckfmha; print(ckfmha.get_library_dir())")
for source in examples/*.c; do
  name=$(basename "$source" .c)
  echo "-- $name"
  if ! cc -std=c11 -Wall -Wextra -Werror "$source" -I"$inc" -L"$lib" -lckfmha \
    -Wl,-rpath,"$lib" -lm -o "$log/$name"; then
    status=1
    continue
  fi
  "$log/$name" 2>&1 | tee "$log/$name.log"
  code=${PIPESTATUS[0]}
  [ "$code" = 0 ] || [ "$code" = 77 ] || status=1
done

echo "== memcheck"
compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m ckfmha run --batch 1 --heads 4 \
  --kv-heads 2 --seqlen 257 --seqlen-k 300 --hdim 64 --causal --validate --iters 1 \
  >"$log/memcheck.log" 2>&1 || status=1
tail -3 "$log/memcheck.log"

echo "== benchmark"
python3 benchmarks/bench_fwd.py --commit "$commit" --out "$log" 2>&1 | tee "$log/bench.log" &&
  python3 benchmarks/bench_fwd_features.py --commit "$commit" --out "$log" 2>&1 |
  tee "$log/bench_features.log" &&
  python3 benchmarks/bench_bwd.py --commit "$commit" --out "$log" --deterministic 2>&1 |
  tee "$log/bench_bwd.log" ||
  status=1
python3 benchmarks/bench_appendkv.py --commit "$commit" --out "$log" 2>&1 |
  tee "$log/bench_appendkv.log" || status=1
exit $status
