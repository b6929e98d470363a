#!/usr/bin/env bash
# On a GPU host: the GPU suite, the CPU suites, the demo and the format
# benchmark, with logs under $OUT (or ./gpu-logs). Uses the programs that
# scripts/gpu_prepare.sh put in .carry/, or ./build when there is no .carry.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
if [ -d .carry/bin ]; then
    BIN=.carry/bin
    export LD_LIBRARY_PATH="$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    DEMO=$BIN/stof-demo BENCH=$BIN/stof-bench-formats T=$BIN
else
    DEMO=build/tools/stof-demo BENCH=build/bench/stof-bench-formats T=build/tests
fi
export STOF_SOURCE_ROOT=$PWD
{
    date -u +%FT%TZ
    git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} | tee "$OUT/env.txt"
fail=0
# At most 8 files come back from $OUT: one log per group.
run() { # log name, command...
    local log=$1; shift
    echo "== $*" | tee -a "$OUT/$log.log"
    "$@" >>"$OUT/$log.log" 2>&1
    local rc=$?
    tail -n 3 "$OUT/$log.log"
    echo "== exit $rc" | tee -a "$OUT/$log.log"
    [ $rc -eq 0 ] || fail=1
}
run gpu "$T/test_gpu" --verbose --jobs=4
for t in test_gpu_block test_gpu_wgmma test_gpu_gemm test_gpu_blaslt test_gpu_layer; do
    [ -x "$T/$t" ] && run gpu "$T/$t" --jobs=4
done
run jit "$T/test_jit" --jobs=8
export STOF_TUNE=$PWD/${BIN:-build/tools}/stof-tune
[ -x "$T/test_gpu_cli" ] && run gpu "$T/test_gpu_cli" --jobs=4
for t in test_api test_reference test_mask test_spec test_format test_cost \
         test_search test_db test_cli test_layer test_gemm_cpu; do
    [ -x "$T/$t" ] && run cpu "$T/$t" --jobs=8
done
run demo "$DEMO"
[ -x "$BENCH" ] && run cpu "$BENCH"
# stof-tune on the GPU: tune the public suite from its workload file, verify
# the records, record a miss in cache-only mode and tune it with `pending`.
if [ -x "$BIN/stof-tune" ] || [ -x build/tools/stof-tune ]; then
    TUNE=${BIN:-build/tools}/stof-tune
    [ -x "$TUNE" ] || TUNE=build/tools/stof-tune
    DB=/tmp/stof-suite.db
    rm -f "$DB"*
    run tune "$TUNE" tune examples/suite.workload --db "$DB"
    run tune "$TUNE" verify --db "$DB"
    run tune "$TUNE" stats --db "$DB"
    run tune "$TUNE" ls --db "$DB"
    if python3 -c "import torch" 2>/dev/null; then
        run tune env LD_LIBRARY_PATH=$PWD/.carry/pylib \
            STOF_LIBRARY=${STOF_LIBRARY:-$PWD/.carry/lib/libstof.so} \
            PYTHONPATH=$PWD/python python3 -c "
import torch, stof
ctx = stof.Context(user_db='$DB', tuning_mode='cache-only')
q = torch.randn(2, 8, 2048, 64, device='cuda', dtype=torch.float16)
m = ctx.mask('causal_sliding:512', 2048, 2048)
p = ctx.attention_plan(q, q, q, m, out=torch.empty_like(q))
print('cache-only plan:', p.describe()['source'])"
        run tune "$TUNE" pending --db "$DB"
        run tune "$TUNE" stats --db "$DB"
    fi
fi
# The comparison with FlexAttention and SDPA (needs torch; BENCH_ARGS to
# narrow it).
if [ "${STOF_BENCH:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null; then
    [ -f .carry/lib/libstof.so ] && export STOF_LIBRARY=$PWD/.carry/lib/libstof.so
    run bench env LD_LIBRARY_PATH=$PWD/.carry/pylib PYTHONPATH=$PWD/python \
        PYTHONUNBUFFERED=1 \
        python3 bench/bench_attention.py --json "$OUT/bench_attention.json" \
        --user-db /tmp/stof-bench-tuning.db ${BENCH_ARGS:-}
    grep -A40 "^ *shape " "$OUT/bench.log" | head -50
fi
echo "== demo table"; tail -n 12 "$OUT/demo.log"
grep -h "NVRTC compiles" "$OUT/gpu.log"
exit $fail
