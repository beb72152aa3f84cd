#!/usr/bin/env bash
# On an NVIDIA GPU machine with Nsight Compute (ncu): measures the HBM bytes
# that fused and standard attention move on the CUDA backend and puts them
# beside the IO model's prediction (GUIDE section 3).
#
# For N = 1k, 2k, 4k, 8k and d = 64, 128 in fp16, each algorithm and pass is
# one fa-bench call under
#   ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv
# which profiles every kernel the process launches (ours and cuBLAS's).
# fa-bench runs with --warmup 0: a --pass fwd run with --repeats 2 launches
# the forward twice (two equal kernel lists: that checks the split, and
# anything launched before the first call stays out); a --pass bwd run with
# --repeats 1 launches the forward once per input set, then one backward.
# bench/io_table.py removes the forward's kernels from the backward run by
# their order and names (see its header) and prints the markdown table.
#
# Shapes: by default the FlashAttention-2 benchmark setting, 16k tokens,
# hidden 2048 (batch = 16384 / N, heads = 2048 / d). IO_TOKENS=1 gives
# batch 1 (heads still 2048 / d), which profiles faster.
#
# What the counters see: ncu flushes the caches before each kernel (its
# default --cache-control all), so reads start cold, as the model assumes;
# but re-reads that hit in L2 (50 MB on H100/H200) never reach DRAM, where
# the model counts every tile load, and dirty lines still in L2 when a
# kernel ends are not counted as writes (at most the L2 size per kernel).
#
# Environment: FA_BUILD_DIR (default build-gpu, holding fa-bench), OUT
# (default ./gpu-out; files go to $OUT/io), IO_SEQLENS, IO_DIMS, IO_ALGOS,
# IO_TOKENS, NCU (the ncu binary).
# Usage (from the repository root): bench/io_measure.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${FA_BUILD_DIR:-build-gpu}
out=${OUT:-$PWD/gpu-out}
io="$out/io"
seqlens=${IO_SEQLENS:-1024 2048 4096 8192}
dims=${IO_DIMS:-64 128}
algos=${IO_ALGOS:-fused standard}
tokens=${IO_TOKENS:-16384}
hidden=2048
dtype=fp16
bench="$build/fa-bench"
export FLASHATTN_CACHE_DIR=${FLASHATTN_CACHE_DIR:-/tmp/fa-kernel-cache}
# ncu formats numbers by locale; the parser expects the C locale's.
export LC_ALL=C

ncu_bin=${NCU:-$(command -v ncu || true)}
[ -n "$ncu_bin" ] || ncu_bin=/usr/local/cuda/bin/ncu
if [ ! -x "$ncu_bin" ]; then
  echo "io_measure.sh: ncu not found (put Nsight Compute's ncu on PATH or set NCU)" >&2
  exit 1
fi
if [ ! -x "$bench" ]; then
  echo "io_measure.sh: no $bench; build it first:" >&2
  echo "  cmake -S . -B $build -DFA_HIP=OFF -DFA_OPENCL=OFF && cmake --build $build -j --target fa-bench" >&2
  exit 1
fi
mkdir -p "$io"
rm -f "$io"/*-fwd-d*-n*.* "$io"/*-bwd-d*-n*.*
{
  echo "ncu: $("$ncu_bin" --version 2>&1 | tail -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified tree)')"
  echo "shapes: $dtype, tokens $tokens (batch = max(1, tokens / N)), heads = $hidden / d"
} | tee "$io/setup.txt"

t_start=$(date +%s)
for d in $dims; do
  for n in $seqlens; do
    for algo in $algos; do
      for pass in fwd bwd; do
        stem="$io/$algo-$pass-d$d-n$n"
        repeats=1
        [ "$pass" = fwd ] && repeats=2
        printf '[%4d s] %-8s %s d=%-3s N=%-6s ... ' $(( $(date +%s) - t_start )) "$algo" "$pass" "$d" "$n"
        # ncu's report and the application's output share stdout: the
        # parser keeps only the CSV records (lines that start with a quote).
        "$ncu_bin" --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
          --target-processes all \
          "$bench" --backend cuda --dtype "$dtype" --dim "$d" --seqlens "$n" --tokens "$tokens" \
          --hidden "$hidden" --algos "$algo" --pass "$pass" --warmup 0 --repeats "$repeats" \
          --json "$stem.jsonl" --label "io-$algo-$pass" > "$stem.csv" 2> "$stem.err"
        rc=$?
        kernels=$(grep -c '"dram__bytes_read.sum"' "$stem.csv" 2>/dev/null)
        echo "exit $rc, $kernels kernel(s) profiled"
        if grep -q "ERR_NVGPUCTRPERM" "$stem.csv" "$stem.err" 2>/dev/null; then
          echo "io_measure.sh: ncu may not read the performance counters here (ERR_NVGPUCTRPERM);" \
               "run as root or with NVreg_RestrictProfilingToAdminUsers=0" >&2
          exit 1
        fi
        [ "$rc" -eq 0 ] || grep -hE "==ERROR==|error|out of memory" "$stem.csv" "$stem.err" | head -3
      done
    done
  done
done

echo
python3 bench/io_table.py "$io" --json "$out/io_table.jsonl" | tee "$out/io_table.md"
