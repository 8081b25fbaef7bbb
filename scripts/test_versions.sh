#!/usr/bin/env bash
# The other Python versions the README promises (3.12, 3.13): the core suite — everything but
# the real engines, which the main run (scripts/test.sh, Python 3.11) covers — in a venv per
# version, cached under ~/.cache/abstract-client/. A version missing on this machine fails,
# unless ABSTRACT_CLIENT_VERSIONS names fewer. Extra args go to pytest. The versions run side by
# side.
set -euo pipefail
cd "$(dirname "$0")/.."
versions="${ABSTRACT_CLIENT_VERSIONS:-3.12 3.13}"
cache="${HOME}/.cache/abstract-client"
# Each version's run in the background, side by side (the suites wait on sockets and servers
# far more than they compute); their output is printed in order once both are done.
run_one() {
  local v="$1" python="" venv log
  if command -v pyenv >/dev/null 2>&1; then  # pyenv's shims answer only for the selected version
    found="$(pyenv versions --bare | grep -E "^${v//./\\.}(\.[0-9]+)?$" | tail -n 1 || true)"
    [[ -n "$found" ]] && python="$(pyenv root)/versions/$found/bin/python"
  fi
  if [[ -z "$python" ]]; then
    python="$(command -v "python$v" || true)"
  fi
  if [[ -z "$python" ]] || ! "$python" -c "" >/dev/null 2>&1; then
    echo "Python $v is not on this machine (ABSTRACT_CLIENT_VERSIONS lists the versions to test)" >&2
    return 1
  fi
  venv="$cache/venv-py$v"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
  fi
  echo ">> Python $v ($("$venv/bin/python" --version)): the core suite"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'; then
    return 1
  fi
  local rc=0
  env -u ABSTRACT_CLIENT_REQUIRE_ENGINES "$venv/bin/python" -m pytest -q -m "not llamacpp and not vllm" \
    --ignore=tests/test_wheel.py "${pytest_args[@]}" || rc=$?
  if [[ $rc -eq 5 ]]; then
    echo "Python $v: pytest collected no tests" >&2
    return 1
  fi
  return $rc
}

pytest_args=("$@")
pids=()
logs=()
for v in $versions; do
  log="$(mktemp)"
  logs+=("$log")
  run_one "$v" >"$log" 2>&1 </dev/null &
  pids+=($!)
done
failed=0
i=0
for v in $versions; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  cat "${logs[$i]}"
  rm -f "${logs[$i]}"
  if [[ $rc -ne 0 ]]; then
    echo "Python $v: the core suite failed (exit $rc)" >&2
    failed=1
  fi
  i=$((i + 1))
done
exit $failed
