#!/usr/bin/env bash
# On-demand fuzzing of the SSE and NDJSON decoders: 100,000 Hypothesis examples per property
# (the default suite runs 300). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-100000}" python3 -m pytest tests/test_decoders.py -k fuzz -q --timeout=0 "$@"
