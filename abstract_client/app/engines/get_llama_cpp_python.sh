#!/usr/bin/env bash
# Install llama-cpp-python (the "gguf" lane's bindings) WITHOUT compiling a second llama.cpp:
# the shared build get_llama_server.sh makes (llama-server + libllama.so, one vendored commit)
# serves both lanes. The bindings come from the same sdist, installed with -DLLAMA_BUILD=OFF
# (a pure-Python install: seconds, not the ~15 minutes of a second llama.cpp build); at import,
# providers/gguf.py points llama-cpp-python's loader at the build (LLAMA_CPP_LIB_PATH).
# Prints the library directory on the last line of stdout.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
PY="${ABSTRACT_CLIENT_PYTHON:-python3}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
LIB_DIR="$(dirname "$(bash "$here/get_llama_server.sh" | tail -n 1)")"

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
if [[ "$installed" == "$VERSION" ]]; then
  echo "$LIB_DIR"; exit 0
fi
sdist="$(ls "$LIB_DIR"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
if [[ -z "$sdist" ]]; then  # a build directory from before the sdist was kept beside it
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$VERSION" >&2
  cp "$work"/llama_cpp_python-"$VERSION".tar.gz "$LIB_DIR/"
  sdist="$LIB_DIR/llama_cpp_python-$VERSION.tar.gz"
fi
echo ">> installing llama-cpp-python==$VERSION bindings (no library build: $LIB_DIR has it)" >&2
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip install -q "$sdist" >&2
echo "$LIB_DIR"
