#!/usr/bin/env bash
# The build step ships inside the package (`abstract-client prepare vllm` works from a wheel);
# this is the checkout's entry point to it. Prints "PYTHON MODEL_DIR".
exec bash "$(dirname "$0")/../abstract_client/app/engines/get_vllm.sh" "$@"
