#!/usr/bin/env bash
# Prepare what a lent GPU machine needs (it has no -dev packages, no libuv
# and no Criterion): build here in build-dev, then copy the programs into
# .carry/bin and the shared libraries they need beyond the base system into
# .carry/lib. Then run scripts/gpu_check.sh there with .carry carried.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build-dev/build.ninja ] || meson setup build-dev --buildtype=release \
    -Db_ndebug=false >/dev/null
ninja -C build-dev
rm -rf .carry && mkdir -p .carry/bin .carry/lib
for f in build-dev/tests/test_* build-dev/tools/stof-* build-dev/bench/stof-*; do
    [ -x "$f" ] && [ -f "$f" ] && cp "$f" .carry/bin/
done
cp -L build-dev/src/libstof.so .carry/lib/libstof.so
# Every library the programs load, except the C runtime itself.
for f in .carry/bin/* .carry/lib/libstof.so; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" .carry/lib/; done
# Python loads libstof.so without the rest of .carry/lib on its path (the
# Debian copies of libcrypto and friends must not shadow the system's):
# give it only what libstof itself needs beyond the base system.
mkdir -p .carry/pylib
ldd .carry/lib/libstof.so | awk '/=> \//{print $3}' |
    grep -E '/libuv\.so' | while read -r lib; do
        cp -L "$lib" .carry/pylib/
    done
du -sh .carry
