#!/usr/bin/env bash
# The mutation gate on the stop contract (scripts/mutants.toml; see scripts/mutation.py).
# Prints a table (mutant | killed by | seconds); exits non-zero when a mutant survives.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec python3 scripts/mutation.py "$@"
