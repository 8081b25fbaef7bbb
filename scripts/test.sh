#!/usr/bin/env bash
# The README's test command: install, provide the real engines (cached under
# ~/.cache/abstract-client/), lint, type-check, run the whole suite, the other Python versions,
# then the mutation gate on the stop contract (scripts/mutation.sh: incremental against the
# committed record; MUTATION=full runs every mutant, MUTATION=0 skips the gate). Extra args go
# to pytest. It ends with a table of its phases' times.
#
# It runs however it is started: from a terminal, `nohup bash scripts/test.sh &`, cron, a CI
# runner with SIGINT ignored, with no standard input.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Every engine is installed below: a missing one fails its tests instead of skipping them.
export ABSTRACT_CLIENT_REQUIRE_ENGINES=1
# The gateways the suite starts keep their usage records here, not in the user's data directory
usage_dir="$(mktemp -d)"
export ABSTRACT_CLIENT_DATA_DIR="${ABSTRACT_CLIENT_DATA_DIR:-$usage_dir}"
cache="${HOME}/.cache/abstract-client"
mkdir -p "$cache"

phases=()
phase_start=$SECONDS
suite_start=$SECONDS
phase_done() {  # phase_done NAME: the time since the last phase ended
  phases+=("$1|$((SECONDS - phase_start))")
  phase_start=$SECONDS
}
print_phases() {
  echo
  echo "| phase | seconds |"
  echo "|---|---|"
  for row in "${phases[@]}"; do
    echo "| ${row%%|*} | ${row##*|} |"
  done
  echo "| total | $((SECONDS - suite_start)) |"
}
trap 'print_phases; rm -rf "$usage_dir"' EXIT

echo ">> installing torch (the CPU build), then abstract-client with the dev, mlx, vlm, transformers, cli and chart extras"
log="$(mktemp)"
# The CPU build, never a CUDA one: the wheel this machine kind keeps on disk (pip's find-links),
# else PyTorch's CPU index. A bare `torch` requirement would pull a CUDA build of several GB.
if ! python3 -m pip install -q "torch==2.13.0+cpu" >"$log" 2>&1 \
  && ! python3 -m pip install -q "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
if ! python3 -m pip install -q -e '.[dev,mlx,vlm,transformers,cli,chart]' >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
# Chromium: the chat page's browser test (Playwright drives it, no browser download);
# tinyproxy, nginx and redis-server: the network tests start their own, on loopback ports.
echo ">> Debian packages: chromium, tinyproxy, nginx, redis-server"
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v tinyproxy >/dev/null 2>&1 || [[ -x /usr/bin/tinyproxy ]] || need+=(tinyproxy)
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || need+=(nginx-light)
command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]] || need+=(redis-server)
if [[ ${#need[@]} -gt 0 ]]; then
  sudo=""
  [[ "$(id -u)" -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y -q "${need[@]}" >"$log" 2>&1 \
    && ! { $sudo apt-get update -q >"$log" 2>&1 && $sudo apt-get install -y -q "${need[@]}" >"$log" 2>&1; }; then
    cat "$log" >&2
    exit 1
  fi
fi
rm -f "$log"
phase_done "install (pip, Debian packages)"

echo ">> real engines (built or downloaded once, then cached)"
LLAMA_SERVER="$(bash scripts/get_llama_server.sh | tail -n 1)"
export LLAMA_SERVER
# the gguf lane's bindings, over the same llama.cpp build (no second compile)
bash scripts/get_llama_cpp_python.sh >/dev/null
python3 scripts/get_model.py >/dev/null          # SmolLM2 GGUF (llama-server)
python3 scripts/get_model.py --mlx >/dev/null    # the same model as an MLX directory
bash scripts/get_vllm.sh >/dev/null              # vLLM CPU venv + SmolLM2 in HF format
CLAUDE_CODE="$(bash scripts/get_claude_code.sh 2>/dev/null | tail -n 1)"  # a real Messages client
export CLAUDE_CODE
phase_done "engines and models (cached after the first run)"

echo ">> ruff, mypy, the API reference (mkdocs --strict: a docstring that disagrees fails)"
ruff check .
ruff format --check .
# mypy's cache survives the clone (it compares file hashes when mtimes differ)
mypy --cache-dir "$cache/mypy"
site="$(mktemp -d)"
mkdocs build --strict -q -d "$site"
rm -rf "$site"
phase_done "ruff, mypy, mkdocs"

echo ">> pytest"
pytest_log="$(mktemp)"
set +e
python3 -m pytest "$@" 2>&1 | tee "$pytest_log"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
phase_done "pytest (Python 3.11, every engine)"
if [[ $rc -ne 0 ]]; then
  exit $rc
fi

echo ">> the other Python versions the README promises: the core suite on 3.12 and 3.13 (scripts/test_versions.sh)"
bash scripts/test_versions.sh -q
phase_done "core suite on 3.12 and 3.13"

if [[ "${MUTATION:-1}" != "0" ]]; then
  echo ">> mutation gate (scripts/mutation.sh; the suite just passed, so no baseline run)"
  bash scripts/mutation.sh --no-baseline
  phase_done "mutation gate (${MUTATION:-incremental})"
fi
trap - EXIT
print_phases
rm -rf "$usage_dir"
# the suite's own closing line last, so that whoever reads the end reads pytest's count
echo ">> pytest, as above:"
grep -E "^=* *[0-9]+ (passed|failed)" "$pytest_log" | tail -n 1 || true
rm -f "$pytest_log"
