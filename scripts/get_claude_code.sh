#!/usr/bin/env bash
# Claude Code, the real Anthropic-API client the gateway's Messages route is tested with: the
# binary bundled in the PyPI wheel `claude-agent-sdk` (no npm, no network at run time). Cached
# under ~/.cache/abstract-client/claude-code/; prints the binary's path on the last line.
set -euo pipefail
version="${CLAUDE_AGENT_SDK_VERSION:-0.2.184}"
cache="${HOME}/.cache/abstract-client/claude-code"
binary="$cache/claude_agent_sdk/_bundled/claude"
if [[ ! -x "$binary" ]]; then
  mkdir -p "$cache"
  wheel="$(ls "$cache"/claude_agent_sdk-"$version"-*manylinux*x86_64.whl 2>/dev/null | head -n 1 || true)"
  if [[ -z "$wheel" ]]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
      --python-version 3.11 -d "$cache" "claude-agent-sdk==$version" >&2
    wheel="$(ls "$cache"/claude_agent_sdk-"$version"-*manylinux*x86_64.whl | head -n 1)"
  fi
  python3 - "$wheel" "$cache" <<'PY'
import sys, zipfile
wheel, cache = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extract("claude_agent_sdk/_bundled/claude", cache)
PY
  chmod +x "$binary"
fi
"$binary" --version >&2
echo "$binary"
