#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine, builds flashattn, and runs the main
# job (fa-info, then fa-run on the best device: PoCL on the CPU when there is
# no GPU). Usage: tools/setup.sh [--no-run] [--build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

run_job=1
build_dir=build
while [ $# -gt 0 ]; do
  case "$1" in
    --no-run) run_job=0 ;;
    --build-dir) build_dir="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

packages=(cmake gcc make pkg-config pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo
          libclblast-dev hipcc libamdhip64-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B "$build_dir" -DFA_WERROR=ON
cmake --build "$build_dir" -j"$(nproc)"

if [ "$run_job" = 1 ]; then
  "$build_dir"/fa-info
  "$build_dir"/fa-run --seqlen 512 --heads 4 --dim 64
fi
