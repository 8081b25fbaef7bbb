#!/usr/bin/env bash
# The whole suite, 3 times in a row, with a CPU hog on every core: what CI and users see when
# the machine is busy with other work. Every run must pass. Extra args go to pytest.
#
#   bash scripts/stress.sh            # ~3 x 8-12 minutes on 2 loaded cores
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${STRESS_RUNS:-3}"
hogs=()
cleanup() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do
  python3 -c "while True: pass" &
  hogs+=("$!")
done
echo ">> ${#hogs[@]} CPU hog(s) running; the suite runs $runs times"
for i in $(seq "$runs"); do
  start=$(date +%s)
  if bash scripts/test.sh -q -p no:randomly "$@"; then
    echo ">> stress run $i/$runs passed in $(( $(date +%s) - start )) s"
  else
    echo ">> stress run $i/$runs FAILED after $(( $(date +%s) - start )) s" >&2
    exit 1
  fi
done
echo ">> all $runs stress runs passed"
