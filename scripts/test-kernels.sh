#!/usr/bin/env bash
# The quick numerical tests under several CPU kernel settings, from one machine.
#
# float32 rounds differently on different CPUs: MKL's AVX-512 products against its AVX2
# ones, ATen's own vectorised loops (AVX-512, AVX2 or none). A tolerance that holds on
# one machine can fail on the next (issue 27); each setting here stands in for a CPU kind:
#
#   (the machine's own)                                     whatever this CPU picks
#   ATEN_CPU_CAPABILITY=default                             ATen without vector loops
#   ATEN_CPU_CAPABILITY=avx2                                ATen's AVX2 loops
#   ATEN_CPU_CAPABILITY=avx512                              ATen's AVX-512 loops
#   MKL_ENABLE_INSTRUCTIONS=AVX2                            MKL's AVX2 products
#   ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2   both: an AVX2-only CPU (AMD EPYC)
#   ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2   neither: an x86-64 without
#                                                           AVX2, or MKL's generic path
#
# A setting the CPU cannot run (avx512 without AVX-512) is left out and said so; torch
# falls back silently, so each run first prints what ATen and MKL actually use.
#
#   scripts/test-kernels.sh                 every setting, the default test files
#   scripts/test-kernels.sh --ci            one setting unlike the machine's own (CI)
#   scripts/test-kernels.sh tests/test_model.py -x    other pytest arguments
#
# TXL_ULPS_LOG=FILE: every tolerance check appends the ulps it saw (tests/tolerance.py).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# The quick numerical files: exactness against forward passes, the reference and float64.
NUMERICAL=(tests/test_tolerance.py tests/test_model.py tests/test_cached.py tests/test_session.py
           tests/test_evaluate.py tests/test_predictions.py tests/test_anatomy.py
           tests/test_reference.py)

ci=0
if [ "${1:-}" = "--ci" ]; then ci=1; shift; fi
args=("$@")
[ ${#args[@]} -eq 0 ] && args=("${NUMERICAL[@]}")

# What ATen and MKL use under the settings given, e.g. "aten=AVX2 mkl=AVX2".
probe() {
  local out mkl
  out=$(env "$@" MKL_VERBOSE=1 "$PY" -c 'import torch
a = torch.ones(64, 64); a @ a  # MKL_VERBOSE names its instruction set at its first call
print("aten=" + torch.backends.cpu.get_cpu_capability())' 2>/dev/null)
  mkl=$(echo "$out" | grep -m1 '^MKL_VERBOSE oneMKL' | grep -o -E 'AVX-512|AVX2|SSE4\.2|AMX' |
        sort -u | paste -sd+)
  echo "$(echo "$out" | grep -o 'aten=.*') mkl=${mkl:-none}"
}

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }

settings=("")
has avx2 && settings+=("ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2")
settings+=("ATEN_CPU_CAPABILITY=default")
has avx2 && settings+=("ATEN_CPU_CAPABILITY=avx2")
has avx512f && settings+=("ATEN_CPU_CAPABILITY=avx512")
has avx2 && settings+=("MKL_ENABLE_INSTRUCTIONS=AVX2")
has sse4_2 && settings+=("ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2")
has avx512f || echo "no AVX-512 on this CPU: ATEN_CPU_CAPABILITY=avx512 left out"
has avx2 || echo "no AVX2 on this CPU: the avx2 settings left out"

own=$(probe)
if [ $ci = 1 ]; then
  # The first setting whose kernels differ from the machine's own.
  chosen=()
  for s in "${settings[@]:1}"; do
    # shellcheck disable=SC2086
    if [ "$(probe $s)" != "$own" ]; then chosen=("$s"); break; fi
  done
  [ ${#chosen[@]} -eq 0 ] && { echo "no kernel setting differs from this machine's own ($own)"; exit 1; }
  settings=("${chosen[@]}")
fi

status=0
results=()
seen="|"
for s in "${settings[@]}"; do
  name=${s:-"(the machine's own)"}
  # shellcheck disable=SC2086
  uses=$(probe $s)
  if [[ $seen == *"|$uses|"* ]]; then  # e.g. avx512 where it is the CPU's own anyway
    results+=("$(printf '%-58s %-28s %s' "$name" "$uses" "the same kernels as above: not run again")")
    continue
  fi
  seen+="$uses|"
  echo "== $name ($uses)"
  # shellcheck disable=SC2086
  out=$(env $s "$PY" -m pytest -q -p no:cacheprovider "${args[@]}" 2>&1)
  rc=$?
  if [ $rc -ne 0 ]; then echo "$out"; status=1; else echo "$out" | tail -n 1; fi
  results+=("$(printf '%-58s %-28s %s' "$name" "$uses" "$(echo "$out" | tail -n 1)")")
done

echo
printf '%-58s %-28s %s\n' "kernel setting" "ATen and MKL use" "result"
printf '%s\n' "${results[@]}"
exit $status
