#!/usr/bin/env bash
# Run the whole test suite several times, alternating a quiet machine and one with every
# core busy, and print each run's result and time: a test that fails by chance shows up
# here rather than in someone's CI.
#
#   scripts/stress-tests.sh             # 6 runs: quiet, burned, quiet, burned, ...
#   RUNS=2 scripts/stress-tests.sh tests/test_browser.py    # any pytest arguments
#   FIRST=burned RUNS=1 scripts/stress-tests.sh             # start with the burned run
#
# "Burned": one busy Python loop per core (nproc), at the same priority as the tests,
# started before the run and stopped after it. Each run's output is kept in
# test-output/stress/run-N.log. Exits non-zero when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-6}"
FIRST="${FIRST:-quiet}"  # the first run's machine: quiet or burned; then they alternate
offset=0
[ "$FIRST" = burned ] && offset=1
PY="${PY:-.venv/bin/python}"
LOGS=test-output/stress
mkdir -p "$LOGS"

burners=()
start_burners() {
  for _ in $(seq "$(nproc)"); do
    "$PY" -c "while True: pass" &
    burners+=($!)
  done
}
stop_burners() {
  [ ${#burners[@]} -eq 0 ] || kill "${burners[@]}" 2>/dev/null
  wait "${burners[@]}" 2>/dev/null
  burners=()
}
trap stop_burners EXIT INT TERM

failed=0
printf '%-4s %-7s %8s %-14s %s\n' run machine seconds "load (1 min)" result
for i in $(seq "$RUNS"); do
  mode=quiet
  if [ $(((i + offset) % 2)) -eq 0 ]; then
    mode=burned
    start_burners
  fi
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s)
  "$PY" -m pytest -q -p no:cacheprovider "$@" >"$LOGS/run-$i.log" 2>&1
  status=$?
  seconds=$(($(date +%s) - start))
  load_after=$(cut -d' ' -f1 /proc/loadavg)
  stop_burners
  [ "$status" -eq 0 ] || failed=1
  result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|(passed|failed|error).* in [0-9.]+s' \
    "$LOGS/run-$i.log" | tail -1 | sed 's/=//g')
  printf '%-4s %-7s %8s %-14s %s\n' "$i" "$mode" "$seconds" "$load_before→$load_after" \
    "${result:-exit $status (see $LOGS/run-$i.log)}"
done
exit "$failed"
