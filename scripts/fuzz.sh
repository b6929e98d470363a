#!/usr/bin/env bash
# Build the libFuzzer target for the mask spec parser and dense-mask path
# with clang, and run it for N seconds (default 60) over fuzz/corpus.
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
if ! command -v clang >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang
fi
if [ ! -f build-fuzz/build.ninja ]; then
    CC=clang meson setup build-fuzz -Dfuzzer=true -Dtests=false -Dbench=false \
        >/dev/null
fi
ninja -C build-fuzz fuzz/fuzz_mask
mkdir -p fuzz/corpus-run
cp -n fuzz/corpus/* fuzz/corpus-run/ 2>/dev/null || true
./build-fuzz/fuzz/fuzz_mask -max_total_time="$secs" -max_len=256 \
    -print_final_stats=1 fuzz/corpus-run fuzz/corpus
