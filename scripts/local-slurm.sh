#!/usr/bin/env bash
# local-slurm.sh: a real Slurm cluster on this one machine, for tests and demos.
#
#   scripts/local-slurm.sh start [--nodes 1|2]   start (or reuse) a 1- or 2-node cluster
#   scripts/local-slurm.sh restart [--nodes 1|2] stop, then start
#   scripts/local-slurm.sh stop                  stop daemons, remove namespaces and hosts lines
#   scripts/local-slurm.sh status                sinfo + squeue
#
# Needs root and Debian's packages slurm-wlm, munge, iproute2 (ip), util-linux (nsenter,
# runuser). Throwaway machines only (CI, a dev VM): it owns /etc/slurm/slurm.conf while
# running and adds marked lines to /etc/hosts.
#
# Decisions:
# - Config location: everything lives under ${SCALESTUDY_SLURM_DIR:-/tmp/scalestudy-slurm}
#   (slurm.conf, log/, spool/, run/ pid files, the TaskProlog), and /etc/slurm/slurm.conf is a
#   symlink to that slurm.conf. So sbatch/squeue/scancel/srun from PATH (the snakemake slurm
#   executor, and srun inside jobs) need no SLURM_CONF. An existing /etc/slurm/slurm.conf that
#   is not our symlink is never touched: start refuses instead.
# - Nodes are always named node1 (and node2), so a job's MASTER_ADDR (first host of
#   SLURM_JOB_NODELIST) is a name that /etc/hosts resolves: --nodes 1: node1 = 127.0.0.1, the
#   slurmd runs in the host's network namespace. --nodes 2: a bridge sslurm0 with
#   ${NET}.1/24 for slurmctld, netns sslurm-node1/-node2, each with a veth renamed eth0 holding
#   ${NET}.11 / ${NET}.12 (NET=${SCALESTUDY_SLURM_NET:-10.77.77}); no default route in the
#   namespaces, so jobs reach only these addresses. Each slurmd runs under
#   `nsenter --net=/var/run/netns/...` (not `ip netns exec`, which remounts /sys and breaks
#   slurmd's cgroup probing).
# - A TaskProlog exports GLOO_SOCKET_IFNAME (eth0 with 2 nodes, lo with 1) to every task unless
#   the job already sets it, so jobs need no cluster-specific environment.
# - Resources: CPUs=${SCALESTUDY_SLURM_CPUS:-4} and RealMemory=${SCALESTUDY_SLURM_MEM_MB:-8000} per
#   node whatever the hardware (SlurmdParameters=config_overrides), select/cons_tres with
#   CR_Core_Memory and DefMemPerCPU=mem/cpus, so 4 one-CPU ranks fit on each node. No GPUs.
# - No accounting: use squeue, not sacct, for job status (MinJobAge=3600 keeps finished jobs
#   in `squeue -t all` and `scontrol show job` for an hour).
# - Start waits up to ${SCALESTUDY_SLURM_TIMEOUT:-60} s for all nodes idle, else prints the
#   daemon logs and exits 1. (SLURMCTLD/SLURMD name other daemon binaries, for testing.)
set -euo pipefail

DIR=${SCALESTUDY_SLURM_DIR:-/tmp/scalestudy-slurm}
NET=${SCALESTUDY_SLURM_NET:-10.77.77}
CPUS=${SCALESTUDY_SLURM_CPUS:-4}
MEM_MB=${SCALESTUDY_SLURM_MEM_MB:-8000}
START_TIMEOUT=${SCALESTUDY_SLURM_TIMEOUT:-60}
BRIDGE=sslurm0
NS_PREFIX=sslurm-
HOSTS_MARK="# scalestudy-local-slurm"
ETC_CONF=/etc/slurm/slurm.conf
CONF=$DIR/slurm.conf
MUNGE_SOCKET=/run/munge/munge.socket.2
SLURM_BIN_CTLD=${SLURMCTLD:-slurmctld}
SLURM_BIN_D=${SLURMD:-slurmd}

log() { printf 'local-slurm: %s\n' "$*"; }
die() {
    printf 'local-slurm: ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it starts munged/slurmctld/slurmd and edits /etc/hosts)"
}

need_tools() {
    local missing=() t
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    if ((${#missing[@]})); then
        die "missing tools: ${missing[*]} (apt-get install slurm-wlm munge iproute2 util-linux)"
    fi
}

# pid from a pid file if that process is alive, else empty
live_pid() {
    local f=$1 pid
    [[ -s $f ]] || return 0
    pid=$(<"$f")
    if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
        echo "$pid"
    fi
}

# SIGTERM the given pids together, wait up to 10 s for all, then SIGKILL the rest
stop_pids() {
    local pid i alive
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        alive=()
        for pid in "$@"; do
            kill -0 "$pid" 2>/dev/null && alive+=("$pid")
        done
        ((${#alive[@]})) || return 0
        sleep 0.1
    done
    log "pids ${alive[*]} ignored SIGTERM; sending SIGKILL"
    kill -KILL "${alive[@]}" 2>/dev/null || true
}

node_names() {
    local n=$1 i
    for ((i = 1; i <= n; i++)); do echo "node$i"; done
}

# ---------------------------------------------------------------- /etc/hosts
hosts_remove() {
    [[ -f /etc/hosts ]] || return 0
    grep -qF "$HOSTS_MARK" /etc/hosts || return 0
    local kept
    kept=$(grep -vF "$HOSTS_MARK" /etc/hosts || true)
    # rewrite in place (no rename): /etc/hosts is often a bind mount in containers
    printf '%s\n' "$kept" >/etc/hosts
}

hosts_add() { # lines "ip name"...
    hosts_remove
    local line
    # a last line without its newline would have ours glued to it (and removed with it)
    if [[ -s /etc/hosts && -n $(tail -c1 /etc/hosts) ]]; then echo >>/etc/hosts; fi
    for line in "$@"; do
        printf '%s %s\n' "$line" "$HOSTS_MARK" >>/etc/hosts
    done
}

# ---------------------------------------------------------------- network (2 nodes)
net_down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        if [[ $ns == "$NS_PREFIX"* ]]; then ip netns delete "$ns" 2>/dev/null || true; fi
    done
    ip link delete "$BRIDGE" 2>/dev/null || true
    # host ends of veths vanish with their namespace; remove any left from a failed start
    local l
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
        if [[ $l == sslurm-h* ]]; then ip link delete "$l" 2>/dev/null || true; fi
    done
    if command -v iptables >/dev/null 2>&1; then
        while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do :; done
    fi
}

net_up() { # nodes
    local n=$1 i ns
    # refuse a subnet that the machine already uses (we only talk to addresses we create); the
    # listing first: `grep -q` ending a pipeline early failed it under pipefail (SIGPIPE)
    local addrs
    addrs=$(ip -o -4 addr show | grep -v " $BRIDGE " || true)
    if grep -q " inet ${NET//./\\.}\." <<<"$addrs"; then
        die "subnet ${NET}.0/24 is already used on this machine; set SCALESTUDY_SLURM_NET=a.b.c"
    fi
    ip link add "$BRIDGE" type bridge
    ip addr add "${NET}.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= n; i++)); do
        ns="${NS_PREFIX}node$i"
        ip netns add "$ns"
        ip link add "sslurm-h$i" type veth peer name "sslurm-n$i"
        ip link set "sslurm-n$i" netns "$ns"
        ip link set "sslurm-h$i" master "$BRIDGE"
        ip link set "sslurm-h$i" up
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "sslurm-n$i" name eth0
        ip -n "$ns" addr add "${NET}.1$i/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
    # With br_netfilter loaded, bridged node1<->node2 traffic passes iptables FORWARD, which
    # Docker hosts set to DROP: accept traffic on our bridge explicitly.
    if [[ $(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0) == 1 ]]; then
        if command -v iptables >/dev/null 2>&1; then
            iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null ||
                iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT ||
                log "warning: could not add an iptables FORWARD rule for $BRIDGE"
        fi
    fi
}

# ---------------------------------------------------------------- munge
munge_ok() {
    command -v munge >/dev/null 2>&1 && munge -n -S "$MUNGE_SOCKET" 2>/dev/null |
        unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1
}

munge_start() {
    if munge_ok; then
        log "munged already running; reusing it"
        return 0
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        install -d -o munge -g munge -m 0700 /etc/munge
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    runuser -u munge -- munged >"$DIR/log/munged-start.log" 2>&1 || {
        cat "$DIR/log/munged-start.log" >&2
        die "munged failed to start"
    }
    touch "$DIR/run/munged.ours"
    local i
    for ((i = 0; i < 50; i++)); do
        munge_ok && return 0
        sleep 0.1
    done
    cat "$DIR/log/munged-start.log" >&2 || true
    die "munged did not come up"
}

# the pid of munged if this script started it
munge_our_pid() {
    [[ -f $DIR/run/munged.ours ]] || return 0
    live_pid /run/munge/munged.pid
}

# ---------------------------------------------------------------- config
write_conf() { # nodes
    local n=$1 ctld_addr ifname i host
    host=$(hostname -s)
    if ((n == 1)); then
        ctld_addr=127.0.0.1
        ifname=lo
    else
        ctld_addr=${NET}.1
        ifname=eth0
    fi
    mkdir -p "$DIR/log" "$DIR/spool/ctld" "$DIR/run"
    cat >"$DIR/task_prolog.sh" <<EOF
#!/bin/sh
# TaskProlog: lines "export NAME=value" on stdout land in every task's environment.
# Gloo must use the interface that carries the node's address (eth0 in a namespace).
[ -n "\${GLOO_SOCKET_IFNAME:-}" ] || echo "export GLOO_SOCKET_IFNAME=$ifname"
EOF
    chmod 0755 "$DIR/task_prolog.sh"
    {
        echo "# written by scripts/local-slurm.sh (scalestudy); nodes=$n"
        echo "ClusterName=scalestudy"
        echo "SlurmctldHost=${host}(${ctld_addr})"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        # a requeued job waits cred_expire seconds before it may start again (slurm.conf(5),
        # AuthInfo; default 120 s), and a job step's credential lives that long: 20 s is still
        # far more than a step's launch takes on a busy 2-core machine (about a second). At 45 s
        # the requeue test's job ended 70 s after snakemake started, just past the executor's
        # fourth status check (at 1, 12, 33, 64 s: each wait 10 s longer while no job ends),
        # and the fifth, at 105 s, saw it (the test took 109 s); at 20 s, 68 s
        echo "AuthInfo=cred_expire=20"
        echo "CryptoType=crypto/munge"
        echo "MpiDefault=none"
        echo "MailProg=/bin/true"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "TaskProlog=$DIR/task_prolog.sh"
        # salloc without a command opens its shell in the job's interactive step on its first
        # node, as many sites set it (slurm.conf(5)); with a command, it runs here as before
        echo "LaunchParameters=use_interactive_step"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "JobCompType=jobcomp/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core_Memory"
        echo "DefMemPerCPU=$((MEM_MB / CPUS))"
        echo "SlurmdParameters=config_overrides"
        echo "ReturnToService=2"
        # jobs start at once: the main scheduler runs on every submit/completion
        echo "SchedulerType=sched/backfill"
        echo "SchedulerParameters=sched_interval=2,bf_interval=2,sched_min_interval=0"
        echo "MinJobAge=3600"
        echo "KillWait=5"
        echo "InactiveLimit=0"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=30"
        echo "MessageTimeout=10"
        echo "StateSaveLocation=$DIR/spool/ctld"
        echo "SlurmdSpoolDir=$DIR/spool/%n"
        echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
        echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
        echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        for ((i = 1; i <= n; i++)); do
            local addr=127.0.0.1
            ((n == 1)) || addr=${NET}.1$i
            echo "NodeName=node$i NodeAddr=$addr CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=$(node_names "$n" | paste -sd,) Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF"
    echo "$n" >"$DIR/nodes"
}

install_etc_conf() {
    mkdir -p /etc/slurm
    if [[ -L $ETC_CONF ]]; then
        [[ $(readlink "$ETC_CONF") == "$CONF" ]] && return 0
        die "$ETC_CONF is a symlink to $(readlink "$ETC_CONF"), not ours; remove it first"
    elif [[ -e $ETC_CONF ]]; then
        die "$ETC_CONF exists and is not ours: this machine has its own Slurm; not touching it"
    fi
    ln -s "$CONF" "$ETC_CONF"
}

remove_etc_conf() {
    if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
        rm -f "$ETC_CONF"
    fi
}

# ---------------------------------------------------------------- daemons
print_logs() {
    local f
    for f in "$DIR"/log/*.log; do
        [[ -f $f ]] || continue
        echo "----- tail of $f" >&2
        tail -n 25 "$f" >&2
    done
}

ctld_pid() { live_pid "$DIR/run/slurmctld.pid"; }
slurmd_pid() { live_pid "$DIR/run/slurmd-$1.pid"; }

start_daemons() { # nodes
    local n=$1 i node
    "$SLURM_BIN_CTLD" -c -f "$CONF" ||
        {
            print_logs
            die "slurmctld failed to start"
        }
    for ((i = 1; i <= n; i++)); do
        node=node$i
        mkdir -p "$DIR/spool/$node"
        if ((n == 1)); then
            "$SLURM_BIN_D" -N "$node" -f "$CONF"
        else
            nsenter --net="/var/run/netns/${NS_PREFIX}$node" "$SLURM_BIN_D" -N "$node" -f "$CONF"
        fi || {
            print_logs
            die "slurmd $node failed to start"
        }
    done
}

# all n nodes idle?
nodes_idle() {
    local n=$1 states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
    [[ $(grep -c ' idle$' <<<"$states") -eq $n ]]
}

wait_idle() {
    local n=$1 deadline=$((SECONDS + START_TIMEOUT))
    while ((SECONDS < deadline)); do
        nodes_idle "$n" && return 0
        sleep 0.5
    done
    echo "--- sinfo:" >&2
    sinfo -N -l >&2 || true
    print_logs
    die "nodes not idle after ${START_TIMEOUT}s (logs above; '$0 stop' cleans up)"
}

# TCP from node1's namespace to node2 (what gloo and slurmd's message fan-out need): a connect to
# a closed port answered by "Connection refused" proves the path without bothering a daemon
check_ns_tcp() {
    local out
    if out=$(nsenter --net="/var/run/netns/${NS_PREFIX}node1" timeout 5 \
        bash -c "exec 3<>/dev/tcp/${NET}.12/9" 2>&1) || [[ $out == *"Connection refused"* ]]; then
        return 0
    fi
    die "no TCP from namespace ${NS_PREFIX}node1 to ${NET}.12 (node2): ${out:-timeout}"
}

running_nodes() { # prints the node count of a healthy running cluster, else nothing
    [[ -n $(ctld_pid) && -s $DIR/nodes ]] || return 0
    local n
    n=$(<"$DIR/nodes")
    local node
    for node in $(node_names "$n"); do
        [[ -n $(slurmd_pid "$node") ]] || return 0
    done
    [[ -L $ETC_CONF ]] || return 0
    nodes_idle_or_busy "$n" && echo "$n"
}

# all nodes answer (idle, mixed or allocated): the cluster is usable
nodes_idle_or_busy() {
    local n=$1 states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
    [[ $(grep -cE ' (idle|mixed|allocated|completing)$' <<<"$states") -eq $n ]]
}

# ---------------------------------------------------------------- commands
cmd_stop() {
    need_root
    local pid
    if [[ -n $(ctld_pid) ]] && command -v scancel >/dev/null 2>&1 && [[ -L $ETC_CONF ]]; then
        # end the jobs while slurmd can still clean up their steps
        local ids
        ids=$(squeue -h -o %i 2>/dev/null || true)
        # shellcheck disable=SC2086 # a list of job ids
        [[ -z $ids ]] || scancel --quiet $ids 2>/dev/null || true
        local i
        for ((i = 0; i < 50; i++)); do
            [[ -z $(squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    # slurmds, slurmctld and munged (if ours) shut down in parallel (~2 s each)
    local pids=() f
    for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"; do
        pid=$(live_pid "$f")
        [[ -z $pid ]] || pids+=("$pid")
    done
    pid=$(munge_our_pid)
    [[ -z $pid ]] || pids+=("$pid")
    stop_pids "${pids[@]}"
    rm -f "$DIR"/run/*.pid "$DIR/run/munged.ours" "$DIR/nodes"
    net_down
    hosts_remove
    remove_etc_conf
    log "stopped"
}

cmd_start() {
    local n=$1
    need_root
    need_tools slurmctld slurmd sinfo squeue scancel munged munge unmunge ip nsenter runuser \
        hostname timeout
    [[ $n == 1 || $n == 2 ]] || die "--nodes must be 1 or 2 (got $n)"
    mkdir -p "$DIR/run"
    local have
    have=$(running_nodes || true)
    if [[ $have == "$n" ]]; then
        log "already running with $n node(s); reusing it (use 'restart' for a fresh one)"
        cmd_status_short
        return 0
    fi
    if [[ -n $have || -n $(ctld_pid) || -s $DIR/nodes || -L $ETC_CONF ]] ||
        ip link show "$BRIDGE" >/dev/null 2>&1; then
        log "stopping the previous cluster first"
        cmd_stop >/dev/null
    fi
    [[ ! -e $ETC_CONF || -L $ETC_CONF ]] ||
        die "$ETC_CONF exists and is not ours: this machine has its own Slurm; not touching it"
    # a fresh state (logs of the previous run are replaced)
    rm -rf "$DIR/spool" "$DIR/log"
    mkdir -p "$DIR/log" "$DIR/spool" "$DIR/run"
    local t0=$SECONDS
    if ((n == 1)); then
        hosts_add "127.0.0.1 node1"
    else
        net_up "$n"
        hosts_add "${NET}.11 node1" "${NET}.12 node2"
    fi
    write_conf "$n"
    install_etc_conf
    munge_start
    start_daemons "$n"
    wait_idle "$n"
    ((n == 1)) || check_ns_tcp
    log "up with $n node(s) in $((SECONDS - t0)) s; config $ETC_CONF -> $CONF"
    log "clients need nothing else (optional: export SLURM_CONF=$CONF)"
    cmd_status_short
}

cmd_status_short() {
    sinfo -N -o '%N %T %c %m %P' || true
}

cmd_status() {
    if [[ -z $(ctld_pid) ]]; then
        log "not running (state dir $DIR)"
        return 3
    fi
    log "running with $(cat "$DIR/nodes" 2>/dev/null || echo '?') node(s); config $CONF"
    sinfo -N -o '%N %T %c %m %P' || true
    squeue || true
}

main() {
    local cmd=${1:-}
    [[ $# -gt 0 ]] && shift
    local nodes=1
    while [[ $# -gt 0 ]]; do
        case $1 in
        --nodes)
            [[ $# -ge 2 ]] || die "--nodes needs a value"
            nodes=$2
            shift 2
            ;;
        --nodes=*)
            nodes=${1#--nodes=}
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown argument: $1" ;;
        esac
    done
    # before `restart` stops the running cluster (cmd_start checks it too)
    [[ $nodes == 1 || $nodes == 2 ]] || die "--nodes must be 1 or 2 (got $nodes)"
    case $cmd in
    start) cmd_start "$nodes" ;;
    restart)
        cmd_stop
        cmd_start "$nodes"
        ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    -h | --help | help) usage ;;
    "")
        usage >&2
        exit 2
        ;;
    *)
        usage >&2
        die "unknown command: $cmd"
        ;;
    esac
}

# sourced (tests/test_scripts.py calls its functions): define, run nothing
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
