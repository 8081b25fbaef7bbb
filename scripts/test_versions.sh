#!/usr/bin/env bash
# The other Python versions the README promises (3.12, 3.13): the core suite — everything but
# the real engines, which the main run (scripts/test.sh, Python 3.11) covers — in a venv per
# version, cached under ~/.cache/abstract-client/. A version missing on this machine fails,
# unless ABSTRACT_CLIENT_VERSIONS names fewer. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
versions="${ABSTRACT_CLIENT_VERSIONS:-3.12 3.13}"
cache="${HOME}/.cache/abstract-client"
for v in $versions; do
  python=""
  if command -v pyenv >/dev/null 2>&1; then  # pyenv's shims answer only for the selected version
    found="$(pyenv versions --bare | grep -E "^${v//./\\.}(\.[0-9]+)?$" | tail -n 1 || true)"
    [[ -n "$found" ]] && python="$(pyenv root)/versions/$found/bin/python"
  fi
  if [[ -z "$python" ]]; then
    python="$(command -v "python$v" || true)"
  fi
  if [[ -z "$python" ]] || ! "$python" -c "" >/dev/null 2>&1; then
    echo "Python $v is not on this machine (ABSTRACT_CLIENT_VERSIONS lists the versions to test)" >&2
    exit 1
  fi
  venv="$cache/venv-py$v"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
  fi
  echo ">> Python $v ($("$venv/bin/python" --version)): the core suite"
  log="$(mktemp)"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]' >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  rm -f "$log"
  set +e
  env -u ABSTRACT_CLIENT_REQUIRE_ENGINES "$venv/bin/python" -m pytest -q -m "not llamacpp and not vllm" \
    --ignore=tests/test_wheel.py "$@"
  rc=$?
  set -e
  if [[ $rc -eq 5 ]]; then
    echo "Python $v: pytest collected no tests" >&2
    exit 1
  fi
  [[ $rc -eq 0 ]] || exit $rc
done
