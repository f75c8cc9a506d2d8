#!/usr/bin/env bash
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/freeride/task-prolog.sh): runs as the job's
# user before each task; each "export NAME=value" line it prints is set in the task's environment.
# Tells the job's processes where their GPUs' agents listen (agent-gpu<k>.sock, k = the local GPU
# index), and where the MPS control daemon is.
set -u
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" 2>/dev/null
if [ -n "$JOB_ID" ] && [ -d "$JOB_RUN" ]; then
    echo "export FREERIDE_SOCKET_DIR=$JOB_RUN"
    [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo "export CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY"
fi
exit 0
