#!/usr/bin/env bash
# On a GPU host: the same benchmarks with two builds staged by
# scripts/gpu_prepare.sh (e.g. .carry-before and .carry), one after the
# other in one call, for a before/after comparison of a change that must
# not change behaviour: bench_attention.py (stof only, no peers) and
# bench_layers.py (BERT-base, eager as the only peer), each build tuning
# into its own fresh database. JSON and logs go to $OUT/<name>-*.
#   bash scripts/gpu_compare.sh .carry-before .carry
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
rc=0
for C in "$@"; do
    name=$(basename "$C" | tr -d .)
    db=/tmp/stof-compare-$name.db
    rm -f "$db"*
    export STOF_LIBRARY=$PWD/$C/lib/libstof.so
    env LD_LIBRARY_PATH=$PWD/$C/pylib PYTHONPATH=$PWD/python \
        PYTHONUNBUFFERED=1 python3 bench/bench_attention.py --no-flex \
        --user-db "$db" --json "$OUT/$name-attention.json" \
        >"$OUT/$name-attention.log" 2>&1 || rc=1
    tail -n 20 "$OUT/$name-attention.log"
    env LD_LIBRARY_PATH=$PWD/$C/pylib PYTHONPATH=$PWD/python \
        PYTHONUNBUFFERED=1 python3 bench/bench_layers.py --models bert-base \
        --no-compile --no-fp32-ref --user-db "$db" \
        --json "$OUT/$name-layers.json" >"$OUT/$name-layers.log" 2>&1 || rc=1
    tail -n 12 "$OUT/$name-layers.log"
done
exit $rc
