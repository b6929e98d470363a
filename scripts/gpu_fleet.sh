#!/usr/bin/env bash
# On a GPU host (with .carry from scripts/gpu_prepare.sh): the checks and
# measurements of the shared tuning database, logs under $OUT.
#   bash scripts/gpu_fleet.sh suites    # trust suites, Python hit, GPU suite
#   bash scripts/gpu_fleet.sh devices   # one GPU against all GPUs, 24 problems
#   bash scripts/gpu_fleet.sh trust     # stof-bench-trust (first-use cost)
#   bash scripts/gpu_fleet.sh load      # the 2-minute load test
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
BIN=.carry/bin
export LD_LIBRARY_PATH="$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STOF_SOURCE_ROOT=$PWD STOF_TUNE=$PWD/$BIN/stof-tune
{
    date -u +%FT%TZ
    git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
} >>"$OUT/env.txt"
rc=0
step() { # log, command...
    local log=$1; shift
    echo "== $*" >>"$OUT/$log.log"
    "$@" >>"$OUT/$log.log" 2>&1
    local r=$?
    echo "== exit $r" >>"$OUT/$log.log"
    tail -n 4 "$OUT/$log.log"
    [ $r -eq 0 ] || rc=1
}
for what in "$@"; do
case $what in
suites)
    step suites "$BIN/test_gpu_trust" --verbose --jobs=1
    step suites "$BIN/test_db_trust" --jobs=4
    step suites env LD_LIBRARY_PATH=$PWD/.carry/pylib \
        STOF_LIBRARY=$PWD/.carry/lib/libstof.so \
        python3 tests/python/test_cli_hit.py
    step suites "$BIN/test_gpu" --jobs=4
    ;;
devices)
    n=$(nvidia-smi -L | wc -l)
    rm -f /tmp/stof-one.db* /tmp/stof-all.db*
    step devices "$BIN/stof-tune" tune examples/fleet24.workload \
        --db /tmp/stof-one.db --devices 0 --json
    cp "$OUT/devices.log" "$OUT/devices-one.txt"
    step devices "$BIN/stof-tune" tune examples/fleet24.workload \
        --db /tmp/stof-all.db --devices all --json
    step devices "$BIN/stof-tune" stats --db /tmp/stof-all.db
    echo "GPUs: $n" >>"$OUT/devices.log"
    ;;
trust)
    step trust "$BIN/stof-bench-trust" --json "$OUT/trust.json"
    ;;
load)
    OUT=$OUT bash scripts/db_load_test.sh --procs 16 --seconds 120 || rc=1
    ;;
*)
    echo "unknown step $what" >&2
    rc=2
    ;;
esac
done
exit $rc
