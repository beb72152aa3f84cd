#!/usr/bin/env bash
# On an NVIDIA GPU machine with PyTorch (no package registry needed): build
# libflashattn and fa-bench with CMake, import the Python package from the
# source tree with FLASHATTN_LIBRARY pointing at the build, then run
# bench/python_gpu_check.py (gradients against PyTorch SDPA, no copies, the
# calls on PyTorch's current stream without host waits, one plan for many
# dropout seeds, flash_attn_with_kvcache on CUDA tensors against the NumPy
# path, the Python call's overhead against fa-bench's kernel time)
# and the package's pytest suite where pytest is installed. Logs to $OUT
# (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_info
stamp "configure and build"
fa_gpu_build build-python "flashattn fa-bench" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=AUTO \
  -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF || exit 1
export FLASHATTN_LIBRARY=$PWD/build-python/libflashattn.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}

stamp "fa-bench on the overhead shapes"
rm -f "$out/fa-bench-overhead.jsonl"
build-python/fa-bench --backend cuda --dtype fp16 --dim 64 --seqlens 128 --batch 1 --heads 8 --pass fwd \
  --repeats 50 --json "$out/fa-bench-overhead.jsonl" > "$out/fa-bench-overhead.txt" 2>&1
build-python/fa-bench --backend cuda --dtype bf16 --dim 128 --seqlens 2048 --batch 4 --heads 16 --pass fwd \
  --repeats 50 --json "$out/fa-bench-overhead.jsonl" >> "$out/fa-bench-overhead.txt" 2>&1

stamp "python_gpu_check.py"
rm -f "$out/python-gpu.jsonl"
python3 bench/python_gpu_check.py --json "$out/python-gpu.jsonl" --fa-bench-json "$out/fa-bench-overhead.jsonl" \
  2>&1 | tee "$out/python-gpu.txt"
status=${PIPESTATUS[0]}

if python3 -c "import pytest" 2>/dev/null; then
  stamp "pytest python/tests (CUDA, reference)"
  FA_TEST_BACKENDS=reference python3 -m pytest python/tests -q -rs -p no:cacheprovider 2>&1 | tee "$out/pytest.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "pytest is not installed: python/tests not run"
fi
stamp "done"
exit "$status"
