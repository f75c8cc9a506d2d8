#!/usr/bin/env bash
# An example batch script (sbatch deploy/slurm/pool-job.sh): a pipeline-parallel training job whose
# bubbles, on every GPU of every node, work through one pool of items (docs/pools.md).
#
# The prolog (prolog.sh) started one agent per GPU of the job before this script runs, and the task
# prolog (task-prolog.sh) set FREERIDE_SOCKET_DIR in each step, so `freeride submit --all` in a step
# reaches every agent of that step's node. Outputs and inputs must be on storage every node sees.
#SBATCH --job-name=train-with-pool
#SBATCH --nodes=4
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=8
set -euo pipefail

POOL=${POOL:-redis://redis-host:6379/0/thumbs-$SLURM_JOB_ID}
PHOTOS=${PHOTOS:-/shared/photos}
OUT=${OUT:-/shared/thumbs}

# The pool: once for the job (idempotent: a requeued job adds nothing twice).
python -m sidetasks.images list "$PHOTOS" | freeride pool create "$POOL" --items -

# The pool task on every agent: one step per node, alongside the job's other steps.
srun --ntasks-per-node=1 --gpus-per-node=0 --overlap \
    freeride submit --all sidetasks.images:ThumbnailPool pool="$POOL" src_dir="$PHOTOS" out_dir="$OUT"

# The training itself (each rank's reporter finds its GPU's agent through FREERIDE_SOCKET_DIR).
srun python train.py

freeride pool status "$POOL"
