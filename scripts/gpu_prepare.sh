#!/usr/bin/env bash
# Prepare what a lent GPU machine needs (it has no -dev packages, no libuv
# and no Criterion): build here in build-dev, then copy the programs into
# .carry/bin and the shared libraries they need beyond the base system into
# .carry/lib. Then run scripts/gpu_check.sh there with .carry carried.
# BUILD (default build-dev) and CARRY (default .carry) name the build and
# staging directories, so that several checkouts' jobs can be staged apart.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build-dev}
C=${CARRY:-.carry}
[ -f "$B/build.ninja" ] || meson setup "$B" --buildtype=release \
    -Db_ndebug=false >/dev/null
ninja -C "$B"
rm -rf "$C" && mkdir -p "$C/bin" "$C/lib"
for f in "$B"/tests/test_* "$B"/tools/stof-* "$B"/bench/stof-*; do
    [ -x "$f" ] && [ -f "$f" ] && cp "$f" "$C/bin/"
done
cp -L "$B/src/libstof.so" "$C/lib/libstof.so"
# Programs linked against the shared library ask for its soname.
for f in "$B"/src/libstof.so.[0-9]; do [ -e "$f" ] && cp -L "$f" "$C/lib/"; done
# Every library the programs load, except the C runtime itself.
for f in "$C"/bin/* "$C/lib/libstof.so"; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$C/lib/"; done
# Python loads libstof.so without the rest of .carry/lib on its path (the
# Debian copies of libcrypto and friends must not shadow the system's):
# give it only what libstof itself needs beyond the base system.
mkdir -p "$C/pylib"
ldd "$C/lib/libstof.so" | awk '/=> \//{print $3}' |
    grep -E '/lib(uv|jansson)\.so' | while read -r lib; do
        cp -L "$lib" "$C/pylib/"
    done
du -sh "$C"
