#!/usr/bin/env bash
# Installs a build into a temporary prefix and builds the examples against
# the installed tree the two ways an application would: CMake's
# find_package (shared and static targets) and pkg-config; then runs every
# example on the best device present (ring attention over MPI on two ranks,
# where libflashattn_mpi was built). Usage: .ci/examples_installed.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: .ci/examples_installed.sh BUILD_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
export FLASHATTN_CACHE_DIR=$work/kernel-cache

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
echo "installed into a temporary prefix:"
(cd "$prefix" && find . -type f -o -type l | sort | sed 's/^\.\//  /')

echo "examples through find_package(flashattn CONFIG):"
cmake -S examples -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_FLAGS="-Wall -Wextra -Wpedantic -Werror" > "$work/cmake.log"
cmake --build "$work/cmake" -j2 > "$work/cmake-build.log" || { cat "$work/cmake-build.log"; exit 1; }
ctest --test-dir "$work/cmake" --output-on-failure

echo "examples through pkg-config:"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cflags=$(pkg-config --cflags flashattn)
libs=$(pkg-config --libs flashattn)
libdir=$(pkg-config --variable=libdir flashattn)
passed=0
for src in examples/*.c; do
  name=$(basename "$src" .c)
  # shellcheck disable=SC2086  # pkg-config's flags are word lists
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror $cflags "$src" -o "$work/$name" $libs -Wl,-rpath,"$libdir" -lm
  "$work/$name" > "$work/$name.out" || { cat "$work/$name.out"; echo "$name failed"; exit 1; }
  echo "  $name: ok ($(tail -1 "$work/$name.out"))"
  passed=$((passed + 1))
done
echo "pkg-config examples: $passed passed, 0 failed"

# Ring attention over MPI where libflashattn_mpi was installed (the
# find_package build above ran it already, through the mpi component).
if [ -f "$prefix/lib/pkgconfig/flashattn_mpi.pc" ]; then
  echo "examples/mpi through pkg-config flashattn_mpi:"
  # shellcheck disable=SC2046  # pkg-config's flags are word lists
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror $(pkg-config --cflags flashattn_mpi) examples/mpi/ring_attention.c \
    -o "$work/ring_attention" $(pkg-config --libs flashattn_mpi) -Wl,-rpath,"$libdir"
  tests/mpi/mpirun.sh mpiexec 2 600 "$work/ring_attention" > "$work/ring_attention.out" 2>&1 ||
    { cat "$work/ring_attention.out"; echo "ring_attention failed"; exit 1; }
  echo "  ring_attention: ok ($(grep -c 'rank' "$work/ring_attention.out") ranks)"
fi
