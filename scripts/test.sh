#!/usr/bin/env bash
# The README's test command: install, provide the real engines (cached under
# ~/.cache/abstract-client/), lint, type-check, run the whole suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

echo ">> installing abstract-client with the dev, mlx and cli extras"
log="$(mktemp)"
if ! python3 -m pip install -q -e '.[dev,mlx,cli]' >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
rm -f "$log"

echo ">> real engines (built or downloaded once, then cached)"
LLAMA_SERVER="$(bash scripts/get_llama_server.sh | tail -n 1)"
export LLAMA_SERVER
python3 scripts/get_model.py >/dev/null          # SmolLM2 GGUF (llama-server)
python3 scripts/get_model.py --mlx >/dev/null    # the same model as an MLX directory
bash scripts/get_vllm.sh >/dev/null              # vLLM CPU venv + SmolLM2 in HF format

echo ">> ruff and mypy"
ruff check .
ruff format --check .
mypy

echo ">> pytest"
set +e
python3 -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
