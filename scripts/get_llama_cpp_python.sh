#!/usr/bin/env bash
# The checkout's entry point to the shipped install step (see the file it runs).
exec bash "$(dirname "$0")/../abstract_client/app/engines/get_llama_cpp_python.sh" "$@"
