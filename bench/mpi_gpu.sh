#!/usr/bin/env bash
# On an NVIDIA machine with an MPI (the GPU image has Debian's Open MPI), in
# one call: the MPI tests (tests/mpi/test_dist_mpi.c) on CUDA, NVIDIA's
# OpenCL and HIP through the mapping where they are there, with 2 and 4
# ranks on the best GPU (the ring is checked against one process there,
# not timed), over host memory; then with FLASHATTN_MPI_GPU_AWARE=1, device
# pointers handed to MPI, where the Open MPI was built with CUDA support.
# Log: $OUT/mpi-tests.log (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_info
fa_nvidia_opencl
fa_hip_nvidia_args
command -v mpiexec > /dev/null || { echo "no mpiexec on this machine" >&2; exit 1; }
stamp "configure and build"
fa_gpu_build build-gpu-mpi "test_dist_mpi" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON -DFA_MPI=ON \
  "${hip_args[@]}" || exit 1
failed=0
run_case() {  # RANKS CASE
  stamp "mpirun -n $1 test_dist_mpi $2 ${FLASHATTN_MPI_GPU_AWARE:+(FLASHATTN_MPI_GPU_AWARE=$FLASHATTN_MPI_GPU_AWARE)}"
  tests/mpi/mpirun.sh mpiexec "$1" 500 build-gpu-mpi/tests/mpi/test_dist_mpi "$2" 2>&1 | tee -a "$out/mpi-tests.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || failed=1
}
for ranks in 2 4; do
  for c in transport communicators refusals mismatched_ranks cuda opencl hip; do run_case "$ranks" "$c"; done
done
if ompi_info --parsable --all 2>/dev/null | grep -q "mpi_built_with_cuda_support:value:true"; then
  FLASHATTN_MPI_GPU_AWARE=1 run_case 2 cuda
else
  stamp "this Open MPI has no CUDA support: the device-memory transport not run"
fi
stamp "done, failed=$failed"
exit "$failed"
