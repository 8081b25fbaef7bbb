#!/usr/bin/env bash
# The build step ships inside the package (so `abstract-client prepare llama-server` works from
# a wheel); this is the checkout's entry point to it. Prints the binary's path on the last line.
exec bash "$(dirname "$0")/../abstract_client/app/engines/get_llama_server.sh" "$@"
