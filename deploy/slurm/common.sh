# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are for the scripts that source this file
# Shared by prolog.sh, epilog.sh and task-prolog.sh (sourced; not run on its own).
#
# Settings (environment of slurmd, or /etc/default/freeride, which is read first):
#   FREERIDE_BIN              the freeride command            (default /opt/freeride/bin/freeride)
#   FREERIDE_ENV_FILE         agent defaults, KEY=VALUE lines (default /etc/default/freeride)
#   FREERIDE_SLURM_RUN_ROOT   sockets: <root>/job<ID>/        (default /run/freeride)
#   FREERIDE_SLURM_STATE_ROOT state:   <root>/job<ID>/gpu<N>/ (default /var/lib/freeride/slurm)
#   FREERIDE_SLURM_START_S    how long the prolog waits for each agent to serve (default 30)
#   FREERIDE_SLURM_STOP_S     how long the epilog waits for each agent to stop  (default 30)

FREERIDE_ENV_FILE=${FREERIDE_ENV_FILE:-/etc/default/freeride}
if [ -r "$FREERIDE_ENV_FILE" ]; then
    set -a  # the agents inherit these FREERIDE_* twins of their flags
    # shellcheck disable=SC1090  # an operator's file
    . "$FREERIDE_ENV_FILE"
    set +a
fi
FREERIDE_BIN=${FREERIDE_BIN:-/opt/freeride/bin/freeride}
RUN_ROOT=${FREERIDE_SLURM_RUN_ROOT:-/run/freeride}
STATE_ROOT=${FREERIDE_SLURM_STATE_ROOT:-/var/lib/freeride/slurm}
START_S=${FREERIDE_SLURM_START_S:-30}
STOP_S=${FREERIDE_SLURM_STOP_S:-30}

JOB_ID=${SLURM_JOB_ID:-}
JOB_RUN="$RUN_ROOT/job$JOB_ID"
JOB_STATE="$STATE_ROOT/job$JOB_ID"

# One line per event, to syslog (journal) and to stderr (slurmd's log); never fails.
log() {
    logger -t "freeride-slurm" -- "job $JOB_ID: $*" 2>/dev/null || true
    echo "freeride-slurm: job $JOB_ID: $*" >&2 || true
}

# The job's GPU indices, one per line: SLURM_JOB_GPUS in a prolog/epilog, SLURM_STEP_GPUS in a step,
# CUDA_VISIBLE_DEVICES as a last resort. Anything that is not a plain index (UUIDs, MIG) is skipped.
job_gpus() {
    local list=${SLURM_JOB_GPUS:-${SLURM_STEP_GPUS:-${CUDA_VISIBLE_DEVICES:-}}}
    local gpu
    for gpu in ${list//,/ }; do
        case $gpu in
            '' | *[!0-9]*) log "skipping GPU '$gpu': not an index" ;;
            *) echo "$gpu" ;;
        esac
    done
}
