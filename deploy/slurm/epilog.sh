#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/freeride/epilog.sh): stop the job's freeride agents.
#
# SIGTERM to each agent: it pauses its side tasks, lets them checkpoint (FREERIDE_SHUTDOWN_GRACE_S),
# reaps them and exits. The epilog waits on the agent's state-directory lock, which the agent holds
# for its whole life (flock wakes when it is released: no polling), up to FREERIDE_SLURM_STOP_S,
# then SIGKILLs what is left, including side-task workers of an agent that was itself killed.
# The sockets go; the state (ledger, checkpoints) stays under the state root for later runs or a
# post-mortem: expire it with systemd-tmpfiles (docs/deploy.md).
#
# Like the prolog it ALWAYS exits 0: a failing epilog drains the node.
set -u
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# PIDs of processes whose command line mentions this job's socket or state directory: the agents
# and their side-task workers (started with --agent unix:<socket>), and nothing else.
job_processes() {
    local cmdline pid
    for cmdline in /proc/[0-9]*/cmdline; do
        pid=${cmdline#/proc/}
        pid=${pid%/cmdline}
        [ "$pid" = "$$" ] && continue
        if { tr '\0' ' ' <"$cmdline"; } 2>/dev/null | grep -qF -e "$JOB_RUN/" -e "$JOB_STATE/"; then
            echo "$pid"
        fi
    done
}

stop_agents() {
    [ -n "$JOB_ID" ] || { log "no SLURM_JOB_ID: nothing to do"; return 0; }
    [ -d "$JOB_STATE" ] || [ -d "$JOB_RUN" ] || return 0  # the prolog started nothing
    local pidfile pid dir stopping=() agents=()
    for pidfile in "$JOB_STATE"/gpu*/agent.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        dir=$(dirname "$pidfile")
        # Only if that PID is still this job's agent (PIDs are reused).
        if { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "--state-dir $dir "; then
            kill -TERM "$pid" 2>/dev/null && stopping+=("$dir") && agents+=("$pid")
        fi
        rm -f "$pidfile"
    done
    for dir in "${stopping[@]}"; do
        if flock --wait "$STOP_S" "$dir/agent.lock" true; then
            log "agent in $dir stopped"
        else
            log "ERROR: agent in $dir did not stop within ${STOP_S}s; killing it"
        fi
    done
    # An agent releases its lock when its work is done, a moment before its process ends: those
    # are merely exiting. Anything else is left over (e.g. workers of an agent that was killed).
    local all=() leftover=()
    mapfile -t all < <(job_processes)
    for pid in "${all[@]}"; do
        case " ${agents[*]} " in
            *" $pid "*) ;;
            *) leftover+=("$pid") ;;
        esac
    done
    [ "${#leftover[@]}" -eq 0 ] || log "killing leftover processes: ${leftover[*]}"
    [ "${#all[@]}" -eq 0 ] || kill -KILL "${all[@]}" 2>/dev/null || true
    rm -rf -- "$JOB_RUN"
}

stop_agents || log "ERROR: epilog failed to stop freeride cleanly"
exit 0
