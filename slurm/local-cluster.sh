#!/usr/bin/env bash
# A throwaway SLURM cluster on this one machine, on loopback, for trying the
# submit workflow on a laptop and for xtask's integration tests.
#
#   slurm/local-cluster.sh start [--nodes 1|2] [--dir DIR]   # prints `export SLURM_CONF=...`
#   slurm/local-cluster.sh status [--dir DIR]
#   slurm/local-cluster.sh stop [--dir DIR]
#
# Typical use:  eval "$(sudo slurm/local-cluster.sh start --nodes 2)"
# (only the export line goes to stdout; progress goes to stderr).
#
# It installs nothing. It needs the Debian/Ubuntu packages
#   apt-get install -y slurmctld slurmd slurm-client munge
# and root (slurmd starts job steps as the submitting user, which only root can).
# Everything it creates - slurm.conf, pid files, logs, spool, controller state
# and a private munged's socket - lives under DIR. The only change outside is
# one /etc/hosts line naming the nodes, added only if those names do not
# resolve yet (and a MUNGE key, only if the package left none).
#
# Environment (flags win):
#   LOCAL_SLURM_DIR      state directory    (default ${TMPDIR:-/tmp}/local-slurm)
#   LOCAL_SLURM_PORT     slurmctld port; node k's slurmd listens on PORT+k (default 6817)
#   LOCAL_SLURM_TIMEOUT  seconds to wait for the nodes to become idle (default 30)
set -euo pipefail

die() { echo "local-cluster: error: $*" >&2; exit 1; }
say() { echo "local-cluster: $*" >&2; }

usage() {
    sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

STATE_DIR="${LOCAL_SLURM_DIR:-${TMPDIR:-/tmp}/local-slurm}"
PORT="${LOCAL_SLURM_PORT:-6817}"
TIMEOUT="${LOCAL_SLURM_TIMEOUT:-30}"
NODES=1

[ $# -ge 1 ] || usage
COMMAND="$1"
shift
while [ $# -gt 0 ]; do
    case "$1" in
        --nodes) [ $# -ge 2 ] || die "--nodes needs a value (1 or 2)"; NODES="$2"; shift 2 ;;
        --dir) [ $# -ge 2 ] || die "--dir needs a directory"; STATE_DIR="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
done
case "$NODES" in 1|2) ;; *) die "--nodes must be 1 or 2, got '$NODES'" ;; esac
case "$PORT" in ''|*[!0-9]*) die "LOCAL_SLURM_PORT must be a port number, got '$PORT'" ;; esac
case "$TIMEOUT" in ''|*[!0-9]*) die "LOCAL_SLURM_TIMEOUT must be whole seconds, got '$TIMEOUT'" ;; esac

# The state directory must be absolute: slurm.conf paths are read by daemons
# whose working directory is not ours.
case "$STATE_DIR" in /*) ;; *) STATE_DIR="$PWD/$STATE_DIR" ;; esac
CONF="$STATE_DIR/slurm.conf"
RUN="$STATE_DIR/run"
LOG="$STATE_DIR/log"
MUNGE="$STATE_DIR/munge"
export SLURM_CONF="$CONF"

# Names of the daemons we may have started, as "pidfile:expected-comm" pairs.
# The comm check keeps `stop` from killing an unrelated process that reused a
# stale pid.
daemon_pidfiles() {
    local f
    for f in "$RUN"/slurmd-*.pid; do [ -e "$f" ] && echo "$f:slurmd"; done
    [ -e "$RUN/slurmctld.pid" ] && echo "$RUN/slurmctld.pid:slurmctld"
    [ -e "$MUNGE/munged.pid" ] && echo "$MUNGE/munged.pid:munged"
    return 0
}

# Prints the pid in $1 if that process is alive and is named $2.
live_pid() {
    local pid
    pid="$(cat "$1" 2>/dev/null || true)"
    case "$pid" in ''|*[!0-9]*) return 1 ;; esac
    [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$2" ] || return 1
    echo "$pid"
}

any_alive() {
    local entry
    for entry in $(daemon_pidfiles); do
        live_pid "${entry%%:*}" "${entry##*:}" >/dev/null && return 0
    done
    return 1
}

log_tails() {
    local f
    for f in "$LOG"/*.log "$MUNGE/munged.log"; do
        [ -e "$f" ] || continue
        echo "----- last lines of $f -----" >&2
        tail -n 20 "$f" >&2
    done
}

node_name() { echo "localnode$1"; }

check_tools() {
    local missing="" tool
    for tool in slurmctld slurmd sbatch srun scontrol sinfo munged munge unmunge; do
        command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
    done
    [ -z "$missing" ] || die "not found on PATH:$missing.
Install the SLURM and MUNGE packages first (Debian/Ubuntu, as root):
    apt-get update && apt-get install -y slurmctld slurmd slurm-client munge"
}

# MUNGE authenticates every SLURM message. Each cluster gets its own munged
# on its own socket (slurm.conf's AuthInfo points there), so stopping one
# cluster never pulls authentication from under another, or from a system
# munged. It runs as the munge user, as the package runs it.
start_munge() {
    id munge >/dev/null 2>&1 || die "user 'munge' does not exist; reinstall the munge package"
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating the missing MUNGE key /etc/munge/munge.key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            # munge before 0.5.14 has no mungekey; any 1 KiB of random bytes will do.
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    mkdir -p "$MUNGE"
    chown munge:munge "$MUNGE"
    chmod 0755 "$MUNGE"
    runuser -u munge -- test -w "$MUNGE" ||
        die "the munge user cannot write to $MUNGE; make every directory above it searchable (chmod o+x)"
    runuser -u munge -- munged --socket="$MUNGE/munge.socket" --pid-file="$MUNGE/munged.pid" \
        --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" ||
        die "munged failed to start; see $MUNGE/munged.log"
    local _
    for _ in $(seq 50); do
        if munge -n --socket="$MUNGE/munge.socket" 2>/dev/null |
            unmunge --socket="$MUNGE/munge.socket" >/dev/null 2>&1; then
            say "started munged (pid $(cat "$MUNGE/munged.pid"))"
            return
        fi
        sleep 0.1
    done
    die "munged does not answer on $MUNGE/munge.socket; see $MUNGE/munged.log"
}

# srun and the trainer resolve node names (the master address is the first
# node's name), so each must map to loopback.
ensure_hosts() {
    local k missing=""
    for k in $(seq "$NODES"); do
        getent hosts "$(node_name "$k")" >/dev/null || missing="$missing $(node_name "$k")"
    done
    [ -z "$missing" ] && return
    say "adding '127.0.0.1$missing' to /etc/hosts so the node names resolve (it stays after stop; harmless)"
    echo "127.0.0.1$missing  # added by slurm/local-cluster.sh" >>/etc/hosts
}

write_conf() {
    local host topology k
    host="$(hostname -s)"
    # Every node claims the machine's real topology; slurmd drains a node whose
    # configured cores exceed what it detects, so copy what `slurmd -C` sees.
    topology="$(slurmd -C | head -n1 | tr ' ' '\n' |
        grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')"
    [ -n "$topology" ] || die "could not read the CPU topology from 'slurmd -C'"
    cat >"$CONF" <<EOF
# Written by slurm/local-cluster.sh; regenerated on every start.
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE/munge.socket
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# No cgroups here: track job processes through /proc and skip CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
# A node that was down comes back as soon as its slurmd registers.
ReturnToService=2
# Cancelled jobs get SIGKILL after 2 s instead of 30, so stop is quick.
KillWait=2
# Schedule a batch job as soon as it is submitted rather than up to 3 s later.
SchedulerParameters=batch_sched_delay=0
EOF
    for k in $(seq "$NODES"); do
        echo "NodeName=$(node_name "$k") NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + k)) $topology State=UNKNOWN" >>"$CONF"
    done
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
}

wait_idle() {
    local deadline=$((SECONDS + TIMEOUT)) idle
    while [ $SECONDS -lt $deadline ]; do
        idle="$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle$' || true)"
        [ "$idle" = "$NODES" ] && return 0
        sleep 0.2
    done
    say "nodes are not idle after ${TIMEOUT}s:"
    sinfo -N >&2 || true
    log_tails
    die "the cluster did not come up"
}

# Idle nodes can still fail to launch a job (munge, name resolution, spool
# permissions), so run one step on every node before declaring the cluster up.
probe_job() {
    say "running a probe job on every node"
    if ! timeout "$TIMEOUT" srun --nodes="$NODES" --ntasks-per-node=1 true >&2; then
        squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
        log_tails
        die "a probe job did not run within ${TIMEOUT}s"
    fi
}

start() {
    [ "$(id -u)" = 0 ] || die "must run as root (slurmd starts jobs as their submitting user); try sudo"
    check_tools
    if any_alive; then
        die "a local cluster is already running from $STATE_DIR; stop it first: $0 stop --dir $STATE_DIR"
    fi
    # A daemon that cannot bind its port keeps running but is useless, and
    # sinfo would then happily report the nodes of whoever holds the port.
    local port
    for port in $(seq "$PORT" $((PORT + NODES))); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            die "port $port is already in use (another local cluster?); stop it or choose other ports with LOCAL_SLURM_PORT"
        fi
    done
    # Whatever fails from here on, leave no half-started cluster behind.
    trap 'say "start failed; stopping what was started"; stop >/dev/null 2>&1 || true' EXIT
    # Fresh controller state each time: old jobs and node states would otherwise be recovered.
    rm -rf "$STATE_DIR/ctld" "$STATE_DIR/spool" "$RUN" "$LOG" "$MUNGE"
    mkdir -p "$STATE_DIR/ctld" "$RUN" "$LOG"
    local k
    for k in $(seq "$NODES"); do
        # slurmd exits at once if its spool directory is missing.
        mkdir -p "$STATE_DIR/spool/$(node_name "$k")"
    done
    start_munge
    ensure_hosts
    write_conf
    slurmctld || { log_tails; die "slurmctld failed to start"; }
    for k in $(seq "$NODES"); do
        slurmd -N "$(node_name "$k")" || { log_tails; die "slurmd for $(node_name "$k") failed to start"; }
    done
    wait_idle
    probe_job
    for k in $(seq "$NODES"); do
        live_pid "$RUN/slurmd-$(node_name "$k").pid" slurmd >/dev/null ||
            { log_tails; die "slurmd for $(node_name "$k") is not running"; }
    done
    trap - EXIT
    say "$NODES node(s) idle; state, logs and pids under $STATE_DIR"
    say "stop with: $0 stop --dir $STATE_DIR"
    echo "export SLURM_CONF=$CONF"
}

stop() {
    if ! any_alive; then
        say "nothing running from $STATE_DIR"
        return 0
    fi
    # Cancel jobs first: killing slurmd would leave their slurmstepd behind.
    if live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null; then
        squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
        local deadline=$((SECONDS + 15))
        while [ $SECONDS -lt $deadline ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do
            sleep 0.2
        done
    fi
    local entry pid pids=""
    for entry in $(daemon_pidfiles); do
        pid="$(live_pid "${entry%%:*}" "${entry##*:}")" || continue
        kill "$pid" 2>/dev/null || true
        pids="$pids $pid"
    done
    local deadline=$((SECONDS + 10)) alive
    while :; do
        alive=""
        for pid in $pids; do [ -d "/proc/$pid" ] && alive="$alive $pid"; done
        [ -z "$alive" ] && break
        if [ $SECONDS -ge $deadline ]; then
            say "still alive after 10 s, killing:$alive"
            # shellcheck disable=SC2086 # one pid per word
            kill -9 $alive 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$RUN"/*.pid "$MUNGE/munged.pid"
    say "stopped (pids:$pids); logs kept under $LOG"
}

status() {
    local entry pid found=0
    for entry in $(daemon_pidfiles); do
        found=1
        if pid="$(live_pid "${entry%%:*}" "${entry##*:}")"; then
            echo "$(basename "${entry%%:*}" .pid): running (pid $pid)"
        else
            echo "$(basename "${entry%%:*}" .pid): not running"
        fi
    done
    [ "$found" = 1 ] || { echo "no local cluster in $STATE_DIR"; return 0; }
    if live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null; then
        echo "export SLURM_CONF=$CONF"
        sinfo -N
        squeue
    fi
}

case "$COMMAND" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    -h|--help) usage ;;
    *) die "unknown command '$COMMAND' (expected start, stop or status)" ;;
esac
