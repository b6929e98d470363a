#!/usr/bin/env bash
# On a GPU host: the load test of the tuning database (stof-bench-dbload):
# 16 processes planning and running a mix of problems against one user
# database in cache-only and default modes while `stof-tune export`,
# `import` and `merge` run beside them, for two minutes; then no error, no
# lost record and integrity_check ok, or it fails. Arguments go to
# stof-bench-dbload (e.g. --procs 8 --seconds 300 --db PATH). The table
# goes to $OUT/dbload.log (default ./gpu-logs) and the figures to
# $OUT/dbload.json. Uses the programs that scripts/gpu_prepare.sh put in
# .carry/, or ./build when there is no .carry. Exit status: that of
# stof-bench-dbload (0 pass, 1 fail, 2 usage, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
if [ -d .carry/bin ]; then
    BIN=.carry/bin
    export LD_LIBRARY_PATH="$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    LOAD=$BIN/stof-bench-dbload TUNE=$BIN/stof-tune
else
    LOAD=build/bench/stof-bench-dbload TUNE=build/tools/stof-tune
fi
for f in "$LOAD" "$TUNE"; do
    if [ ! -x "$f" ]; then
        echo "db_load_test.sh: $f is missing: build first (meson setup build;" \
             "ninja -C build) or run scripts/gpu_prepare.sh" >&2
        exit 2
    fi
done
LOG=$OUT/dbload.log
{
    date -u +%FT%TZ
    git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
        2>/dev/null || echo "nvidia-smi: not available"
    echo "== $LOAD --stof-tune $TUNE --json $OUT/dbload.json $*"
} >"$LOG"
"$LOAD" --stof-tune "$TUNE" --json "$OUT/dbload.json" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "== exit $rc" | tee -a "$LOG"
exit "$rc"
