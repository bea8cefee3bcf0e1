#!/usr/bin/env bash
# Build llama.cpp's native `llama-server` from the vendor/llama.cpp folder of the llama-cpp-python source
# package on PyPI, and cache the binary under ~/.cache/fleetgate/llama.cpp/<version>/bin/llama-server.
# Idempotent: returns at once when the cached binary exists. About 5-10 minutes on 2 cores.
#   LLAMA_CPP_PYTHON_VERSION  sdist version to build (default below)
#   FLEETGATE_CACHE           cache root (default ~/.cache/fleetgate)
#   JOBS                      parallel compile jobs (default: nproc)
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${FLEETGATE_CACHE:-$HOME/.cache/fleetgate}"
JOBS="${JOBS:-$(nproc)}"
PYTHON="${PYTHON:-python3}"
SRC_DIR="$CACHE/src"
OUT_DIR="$CACHE/llama.cpp/$VERSION"
BIN="$OUT_DIR/bin/llama-server"

if [[ -x "$BIN" ]]; then
    echo "llama-server already built: $BIN"
    exit 0
fi

mkdir -p "$SRC_DIR" "$OUT_DIR/bin"
SDIST="$SRC_DIR/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    echo "downloading llama-cpp-python==$VERSION source package from PyPI"
    "$PYTHON" -m pip download --no-binary :all: --no-deps --dest "$SRC_DIR" "llama-cpp-python==$VERSION"
fi

TREE="$SRC_DIR/llama_cpp_python-$VERSION"
if [[ ! -d "$TREE/vendor/llama.cpp" ]]; then
    tar -xzf "$SDIST" -C "$SRC_DIR"
fi
LLAMA="$TREE/vendor/llama.cpp"
BUILD="$LLAMA/build-fleetgate"

start=$(date +%s)
# CPU only, portable (no -march=native so the cached binary runs on any x86-64 box of this kind),
# static libs so the one binary can be copied into the cache on its own.
cmake -S "$LLAMA" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF \
    -DGGML_OPENMP=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF
cmake --build "$BUILD" --target llama-server -j "$JOBS"
cp "$BUILD/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
# The GGUF converter and its gguf-py package travel with the binary so that tools/tiny_model can use them.
rm -rf "$OUT_DIR/convert"
mkdir -p "$OUT_DIR/convert"
cp "$LLAMA/convert_hf_to_gguf.py" "$OUT_DIR/convert/"
cp -r "$LLAMA/conversion" "$OUT_DIR/convert/conversion"
cp -r "$LLAMA/gguf-py" "$OUT_DIR/convert/gguf-py"
end=$(date +%s)
echo "built $BIN in $((end - start)) s"
"$BIN" --version || true
