#!/bin/sh
# Runs an MPI test under the MPI's launcher, with the flags a test machine
# needs. Usage: mpirun.sh MPIEXEC RANKS TIMEOUT_S PROGRAM [ARGS...]
# Open MPI refuses root (CI containers run as root) without
# --allow-run-as-root, and more ranks than cores without --oversubscribe;
# processes are left unbound, so that oversubscribed ranks share the
# cores; its own time limit ends every rank of a hung job (ctest's
# TIMEOUT, a little longer, is the last resort); output lines are tagged
# with their rank. In containers that forbid process_vm_readv (no
# CAP_SYS_PTRACE), its shared-memory transport's single-copy path fails,
# so it copies through the shared segment unless told otherwise. Two
# launchers starting at once (CI runs the installed examples beside the
# test suite) race to create the same session directory under /tmp and
# one fails, so each run keeps its session files in a directory of its
# own, removed when it ends. Other MPIs (MPICH's mpiexec) take the rank
# count alone.
set -eu
mpiexec=$1
ranks=$2
timeout_s=$3
shift 3
if "$mpiexec" --version 2>/dev/null | grep -qE "Open MPI|OpenRTE"; then
  set -- --oversubscribe --bind-to none --tag-output --timeout "$timeout_s" "$@"
  if [ "$(id -u)" -eq 0 ]; then
    set -- --allow-run-as-root "$@"
  fi
  export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
  session=$(mktemp -d "${TMPDIR:-/tmp}/fa-mpi.XXXXXX")
  trap 'rm -rf "$session"' EXIT
  trap 'exit 143' TERM INT
  export TMPDIR="$session"
  status=0
  "$mpiexec" -n "$ranks" "$@" || status=$?
  exit "$status"
fi
exec "$mpiexec" -n "$ranks" "$@"
