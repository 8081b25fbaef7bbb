#!/usr/bin/env bash
# Make a llama-server binary available and print its path on the last line of stdout.
#
# Order: $LLAMA_SERVER if it points at an executable; else the cached build under
# ~/.cache/abstract-client/llama-server/<version>/; else build it from the PyPI sdist of
# llama-cpp-python (which vendors the whole llama.cpp tree) with CMake, 2 jobs. The first build
# takes ~15 minutes on 2 cores; later calls return at once.
#
# One build serves both llama.cpp lanes: it is a shared-library build, so the directory holds
# llama-server AND libllama.so/libggml*.so (RPATH $ORIGIN), and the in-process "gguf" lane's
# llama-cpp-python bindings (installed from the same sdist without compiling their own copy, see
# get_llama_cpp_python.sh) load that libllama.so: library and bindings from one vendored commit.
# The sdist is kept beside the build for that install.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${ABSTRACT_CLIENT_CACHE:-$HOME/.cache/abstract-client}"
# "-avx2": a portable x86-64-v3 build. A -march=native build compiles ggml's AMX kernels on CPUs
# that advertise AMX, and those segfault at the first matmul on this machine kind
# (ggml_backend_amx_mul_mat), so native is off and the SIMD level is explicit.
DEST="$CACHE/llama-server/$VERSION-avx2-shared"
BIN="$DEST/llama-server"

if [[ -n "${LLAMA_SERVER:-}" && -x "${LLAMA_SERVER}" ]]; then
  echo "$LLAMA_SERVER"; exit 0
fi
if [[ -x "$BIN" ]]; then
  echo "$BIN"; exit 0
fi

if ! command -v cmake >/dev/null; then
  echo ">> installing cmake" >&2
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && apt-get install -y -qq cmake >&2
  else
    python3 -m pip install -q cmake >&2
  fi
fi
mkdir -p "$DEST"
work="$(mktemp -d "$CACHE/llama-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo ">> downloading llama-cpp-python==$VERSION sdist" >&2
python3 -m pip download --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$VERSION" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
cp "$work"/llama_cpp_python-*.tar.gz "$DEST/"
src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"

echo ">> configuring llama.cpp (shared libraries with RPATH \$ORIGIN, no curl/openssl)" >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON >&2

echo ">> building llama-server with 2 jobs (~15 min on 2 cores); progress:" >&2
# CMake's own [ NN%] lines are the progress indicator; keep only those so the log stays short.
cmake --build "$work/build" --target llama-server -j2 2>&1 \
  | grep --line-buffered -E '^\[ *[0-9]+%\]' | sed -u 's/^/   /' >&2
# the libraries first, the binary last: its presence is what marks the cache complete
cp -P "$work"/build/bin/lib*.so* "$DEST/"
cp "$work/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo ">> built $BIN" >&2
echo "$BIN"
