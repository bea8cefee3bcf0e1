#!/usr/bin/env bash
# Build fleetgate's tiny random-weight Llama model from code (no download of weights or data) and cache it:
#   ~/.cache/fleetgate/models/tiny-llama/hf/                    HF checkpoint + tokenizer (served by vLLM)
#   ~/.cache/fleetgate/models/tiny-llama/tiny-llama-f32.gguf    GGUF (served by llama-server)
# Uses its own venv (~/.cache/fleetgate/venv-model) so the project venv stays light, and llama.cpp's converter from
# the llama-cpp-python source package on PyPI. Idempotent: does nothing when the model is up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${FLEETGATE_CACHE:-$HOME/.cache/fleetgate}"
PYTHON="${PYTHON:-python3}"
VENV="$CACHE/venv-model"
OUT="$CACHE/models/tiny-llama"
CONV="$CACHE/llama.cpp/$VERSION/convert"
SRC_DIR="$CACHE/src"

if [[ ! -x "$VENV/bin/python" ]] || [[ ! -f "$VENV/.fleetgate-ok" ]]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0 "transformers==4.57.6" tokenizers safetensors sentencepiece \
        "numpy>=2" pyyaml "protobuf<5" tqdm requests jinja2
    touch "$VENV/.fleetgate-ok"
fi

if [[ ! -f "$CONV/convert_hf_to_gguf.py" ]]; then
    SDIST="$SRC_DIR/llama_cpp_python-$VERSION.tar.gz"
    mkdir -p "$SRC_DIR"
    [[ -f "$SDIST" ]] || "$PYTHON" -m pip download --no-binary :all: --no-deps --dest "$SRC_DIR" \
        "llama-cpp-python==$VERSION"
    TREE="$SRC_DIR/llama_cpp_python-$VERSION"
    [[ -d "$TREE/vendor/llama.cpp" ]] || tar -xzf "$SDIST" -C "$SRC_DIR"
    LLAMA="$TREE/vendor/llama.cpp"
    rm -rf "$CONV.tmp" && mkdir -p "$CONV.tmp"
    cp "$LLAMA/convert_hf_to_gguf.py" "$CONV.tmp/"
    cp -r "$LLAMA/conversion" "$LLAMA/gguf-py" "$CONV.tmp/"
    rm -rf "$CONV" && mv "$CONV.tmp" "$CONV"
fi

start=$(date +%s)
"$VENV/bin/python" tools/tiny_model/build.py --out "$OUT" --converter "$CONV" "$@"
echo "tiny model ready in $(($(date +%s) - start)) s: $OUT"
