#!/usr/bin/env bash
# mpirun (Debian's Open MPI 4.1) with the settings ckpt's MPI tests, benchmarks and MPI guide use
# on one host; the one place they are written.
#   bash scripts/mpirun.sh -np 4 PROGRAM [ARGS...]      (any other mpirun option too)
#
#   --allow-run-as-root   containers and CI run as root, which mpirun refuses otherwise
#   --oversubscribe       more ranks than cores (4 ranks on 2 cores) instead of a refusal
#   --bind-to none        with 2 ranks mpirun pins each to a core: the memory level's sending
#                         thread then competes with its own rank's training on that core, and
#                         no rank can move off a core that other work on the host is using
#   --mca pml ob1 --mca btl self,vader
#                         shared memory only: no probing for UCX devices or TCP interfaces at
#                         start (0.46 s instead of 0.25 s for 4 ranks), nothing to go wrong
#                         on a container's network interfaces
#   --mca btl_vader_single_copy_mechanism none
#                         large messages through shared memory, not Linux CMA
#                         (process_vm_readv), which Docker's default seccomp profile forbids
#                         without CAP_SYS_PTRACE: every transfer fails there ("Read -1,
#                         expected N, errno = 1", open-mpi/ompi#4948). No slower here, where
#                         CMA is allowed (docs/PERFORMANCE.md).
#   --mca orte_tmpdir_base DIR
#                         a session directory of each job's own: two jobs starting at once
#                         both create /tmp/ompi.<host>.<uid>, and the one that loses the race
#                         fails to start ("A call to mkdir was unable to create the desired
#                         directory ... File exists", orte_init failed). A job removes what it
#                         made there when it ends; the empty directories left are removed once
#                         an hour old.
# On several hosts, use mpirun itself with the first three and --mca btl self,vader,tcp.
tmp=${TMPDIR:-/tmp}
find "$tmp" -maxdepth 1 -name 'ckpt-mpirun.*' -type d -empty -mmin +60 -delete 2> /dev/null || true
session=$(mktemp -d "$tmp/ckpt-mpirun.XXXXXX")
exec mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    --mca orte_tmpdir_base "$session" "$@"
