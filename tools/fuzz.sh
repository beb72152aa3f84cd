#!/usr/bin/env bash
# A fuzzing campaign against the public API (tests/fuzz): builds fa-fuzz
# (clang, libFuzzer, AddressSanitizer, UBSan) and runs it for SECONDS in
# JOBS parallel processes, going on past crashes, starting from the seed
# corpus in tests/fuzz/corpus. New inputs and crash artifacts stay in the
# build folder; --merge adds the inputs that reach new edges to the seed
# corpus (inputs that crash are left out). Exits 1 when any crash, timeout
# or out-of-memory input was saved.
#
# Usage: tools/fuzz.sh [--jobs N] [--build-dir DIR] [--merge] SECONDS
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=1
build_dir=build-fuzz
merge=0
seconds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift ;;
    --build-dir) build_dir="$2"; shift ;;
    --merge) merge=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) seconds="$1" ;;
  esac
  shift
done
case "$seconds" in
  ''|*[!0-9]*) echo "usage: tools/fuzz.sh [--jobs N] [--build-dir DIR] [--merge] SECONDS" >&2; exit 2 ;;
esac
case "$jobs" in
  ''|*[!0-9]*|0) echo "--jobs takes a positive number, not '$jobs'" >&2; exit 2 ;;
esac

cc=$(command -v clang-14 || command -v clang || true)
if [ -z "$cc" ]; then
  echo "clang is needed (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi
CC="$cc" cmake -S . -B "$build_dir" -DFA_FUZZ=ON -DFA_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" --target fa-fuzz -j"$(nproc)"

campaign="$build_dir/campaign"
mkdir -p "$campaign/corpus" "$campaign/artifacts"
cp -n tests/fuzz/corpus/* "$campaign/corpus/" 2>/dev/null || true
before=$(find "$campaign/artifacts" -type f | wc -l)

# Fork mode: each job is a child process that libFuzzer restarts after a
# crash, so one known problem does not end the campaign.
"$build_dir/fa-fuzz" -fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
  -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$campaign/artifacts/" "$campaign/corpus" 2>&1 | tee "$campaign/fuzz.log" |
  grep -E '^#[0-9]+: cov|INFO: (fuzzed|exiting)|^stat::|fa-fuzz:|SUMMARY' || true

if [ "$merge" = 1 ]; then
  # Edges only (no hit counts): one input per new edge keeps the corpus small.
  "$build_dir/fa-fuzz" -merge=1 -use_counters=0 -timeout=10 tests/fuzz/corpus "$campaign/corpus" 2>&1 |
    grep -E 'MERGE-OUTER: [0-9]+ new' || true
fi

found=$(( $(find "$campaign/artifacts" -type f | wc -l) - before ))
echo "campaign: $(ls "$campaign/corpus" | wc -l) inputs in $campaign/corpus, $found new artifacts in $campaign/artifacts"
if [ "$found" -gt 0 ]; then
  echo "replay one with: FA_FUZZ_TRACE=1 $build_dir/fa-fuzz ARTIFACT" >&2
  exit 1
fi
