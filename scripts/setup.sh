#!/usr/bin/env bash
# One command for a fresh Debian/Ubuntu machine: install the build
# dependencies (when missing), configure and build stof in ./build, run the
# main job (stof-demo: the mask suite on the CPU, and masked attention on
# the GPU when one is present; without one it says so and runs the CPU
# part), and pip-install the Python package into ./build/venv.
#
#   bash scripts/setup.sh            # as root, or with sudo available
#
# Environment: BUILD_DIR (default build), STOF_WERROR=1 (warnings are
# errors, as in CI), CUDA_HOME (default /usr/local/cuda), STOF_PIP=0 (skip
# the pip install of the Python package).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PKGS="meson ninja-build pkg-config gcc g++ python3 python3-venv libsqlite3-dev \
libuv1-dev libxxhash-dev libcriterion-dev libjansson-dev zlib1g-dev"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "== installing:$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

if [ ! -f "$CUDA_HOME/include/cuda.h" ]; then
    echo "error: the CUDA toolkit headers are not at $CUDA_HOME/include" \
         "(set CUDA_HOME)" >&2
    exit 1
fi

opts=(-Dcudatoolkit="$CUDA_HOME")
[ "${STOF_WERROR:-0}" = 1 ] && opts+=(--werror)
if [ -f "$BUILD_DIR/build.ninja" ]; then
    meson configure "$BUILD_DIR" "${opts[@]}" >/dev/null
else
    meson setup "$BUILD_DIR" "${opts[@]}"
fi
ninja -C "$BUILD_DIR"

echo "== running the main job: $BUILD_DIR/tools/stof-demo"
"$BUILD_DIR/tools/stof-demo"

# The Python package as users install it (pip install ., meson-python from
# PyPI), into a virtual environment in the build directory, where the
# python_package test imports it from. STOF_PIP=0 skips it (offline).
if [ "${STOF_PIP:-1}" != 0 ]; then
    echo "== pip install . into $BUILD_DIR/venv"
    [ -x "$BUILD_DIR/venv/bin/python" ] || python3 -m venv "$BUILD_DIR/venv"
    "$BUILD_DIR/venv/bin/python" -m pip install --quiet --force-reinstall \
        --no-deps -Csetup-args=-Dcudatoolkit="$CUDA_HOME" .
    "$BUILD_DIR/venv/bin/python" -c \
        'import stof; print("== stof", stof.__version__, "from", stof.__file__)'
fi
