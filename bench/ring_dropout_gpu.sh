#!/usr/bin/env bash
# On an NVIDIA machine of two or more GPUs, in one call (about 5 minutes):
# everything the ring and the dropout origin touched, on real hardware.
# - bench/context_parallel.sh tests: the ring's passes, the ring against
#   one context on CUDA, NVIDIA's OpenCL and HIP (threads on one GPU, NCCL
#   one GPU a rank; dropout cases included), the Python ring over
#   torch.distributed;
# - bench/mpi_gpu.sh: the MPI tests with 2 and 4 ranks on one GPU;
# - the dropout origin and every dropout test of the device suites
#   (test_dropout_seed, cuda_attention, cuda_standard, hip_attention,
#   opencl_attention), since the origin reached every kernel that draws
#   dropout.
# Logs in $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
failed=0
bash bench/context_parallel.sh tests || failed=1
bash bench/mpi_gpu.sh 2>&1 | grep -E "^\[|^(ok|FAIL|skip)|passed|CHECK failed" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_nvidia_opencl
fa_hip_nvidia_args
stamp "dropout device tests"
fa_gpu_build build-gpu-cp "test_dropout_seed test_cuda_attention test_cuda_standard test_hip_attention test_opencl_attention" \
  -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || exit 1
(cd build-gpu-cp && ctest -R '^(dropout_seed|cuda_attention.*dropout|cuda_standard.dropout|hip_attention.dropout|opencl_attention.dropout)' \
  -j8 --timeout 300 --output-on-failure) > "$out/dropout-tests.log" 2>&1 || failed=1
grep -E "tests passed|Failed|\(Skipped\)|CHECK failed" "$out/dropout-tests.log" | head -30
stamp "done (failed=$failed)"
exit $failed
