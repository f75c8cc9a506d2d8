#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/freeride/prolog.sh, PrologFlags=Alloc): start one
# freeride agent per GPU of the job, as the job's user, before the job's first step.
#
# It ALWAYS exits 0. A failing prolog makes slurmd drain the node and requeue the job: freeride
# being broken must cost the job its side tasks, never its node. Failures are logged instead
# (syslog tag freeride-slurm, and slurmd's log).
#
# Agent k serves the job's k-th GPU (physical index SLURM_JOB_GPUS[k], which NVML uses) and
# listens on <run root>/job<ID>/agent-gpu<k>.sock: k is the index the job's processes see once
# Slurm confines them to their GPUs, so `FREERIDE_SOCKET_DIR=<run root>/job<ID>` (task-prolog.sh)
# is all a trainer needs. State: <state root>/job<ID>/gpu<physical index>/.
set -u
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start_agents() {
    [ -n "$JOB_ID" ] || { log "no SLURM_JOB_ID: not started by slurmd? nothing to do"; return 0; }
    local gpus
    mapfile -t gpus < <(job_gpus)
    [ "${#gpus[@]}" -gt 0 ] || { log "no GPUs allocated: no agents"; return 0; }
    [ -x "$FREERIDE_BIN" ] || { log "ERROR: $FREERIDE_BIN is not executable: no agents (job runs without side tasks)"; return 0; }

    local uid=${SLURM_JOB_UID:-$(id -u)} gid=${SLURM_JOB_GID:-$(id -g)}
    # The agents run as the job's user: MPS serves one user per GPU at a time, and the job's
    # processes must be able to connect to the sockets.
    local as_user=()
    [ "$uid" = "$(id -u)" ] || as_user=(setpriv "--reuid=$uid" "--regid=$gid" --init-groups --)
    local root
    for root in "$RUN_ROOT" "$STATE_ROOT"; do  # created if missing; an existing one is left as it is
        [ -d "$root" ] || install -d -m 0755 "$root" || { log "ERROR: cannot create $root"; return 0; }
    done
    # Only the job's user may reach the sockets (submitting a side task runs code as that user).
    install -d -m 0700 -o "$uid" -g "$gid" "$JOB_RUN" "$JOB_STATE" || { log "ERROR: cannot create job dirs"; return 0; }

    local k=0 gpu dir started=()
    for gpu in "${gpus[@]}"; do
        dir="$JOB_STATE/gpu$gpu"
        if install -d -m 0700 -o "$uid" -g "$gid" "$dir"; then
            # setsid: its own session, so it outlives this script and slurmd's cleanup of it; a
            # simple command, so $! is the agent's PID (setsid and setpriv exec, they do not fork).
            setsid "${as_user[@]}" "$FREERIDE_BIN" agent --gpu "$gpu" --state-dir "$dir" \
                --socket "$JOB_RUN/agent-gpu$k.sock" </dev/null >>"$dir/agent.log" 2>&1 &
            echo "$!" >"$dir/agent.pid"
            started+=("$k:$gpu")
        else
            log "ERROR: cannot create $dir: no agent for GPU $gpu"
        fi
        k=$((k + 1))
    done

    # Wait for every agent to serve (in parallel; the health check wakes on the socket, no sleep).
    local item waits=()
    for item in "${started[@]}"; do
        "$FREERIDE_BIN" health --agent "$JOB_RUN/agent-gpu${item%%:*}.sock" --wait-s "$START_S" >/dev/null 2>&1 &
        waits+=("$!:$item")
    done
    for item in "${waits[@]}"; do
        k=${item#*:}
        gpu=${k#*:}
        k=${k%%:*}
        if wait "${item%%:*}"; then
            log "agent for GPU $gpu serving on $JOB_RUN/agent-gpu$k.sock"
        else
            log "ERROR: agent for GPU $gpu did not serve within ${START_S}s; see $JOB_STATE/gpu$gpu/agent.log"
        fi
    done
}

start_agents || log "ERROR: prolog failed; the job runs without side tasks"
exit 0
