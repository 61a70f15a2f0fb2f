"""Who am I in the job: launcher detection, Slurm host lists, the network interface, process group.

Three ways a rank is started, detected from the environment (pure function `detect`):
- torchrun (or any env:// launcher): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR/PORT; the node from GROUP_RANK/GROUP_WORLD_SIZE (torchrun's), else from
  LOCAL_WORLD_SIZE with the ranks placed node by node.
- srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_TASKS_PER_NODE,
  SLURM_JOB_NODELIST, and SLURM_STEP_ID when there is more than one task: a multi-task job's
  batch shell has SLURM_PROCID and SLURM_NTASKS too, but no step, and is refused (LaunchError),
  as is salloc's shell in the job's interactive step, whose SLURM_NTASKS is the job's.
  MASTER_ADDR = first host of the node list, MASTER_PORT derived from the job and step ids
  (PORT_BASE below), unless MASTER_ADDR/PORT are set. The derived port tells apart the steps of
  one job, not jobs: two jobs whose ids differ by a multiple of PORT_SPAN (or whose ids and steps
  fall together otherwise, e.g. job 4242 step 1 and job 12161 step 0) get the same port, and the
  second to share the first node then fails its rendezvous with EADDRINUSE, said in one line
  naming the port and the MASTER_PORT override (init_process_group).
- nothing: one process, rank 0 of 1, on 127.0.0.1 with a free port.
RANK takes precedence over SLURM_PROCID, so one torchrun per node inside an allocation works too.
The device comes from the LOCAL rank (the global rank is a bug as soon as there are two nodes).

The network interface of gloo and NCCL is pinned before the process group starts (`pin_interfaces`).
Left alone, gloo binds to the address the host name resolves to: 127.0.1.1 on hosts whose
/etc/hosts maps the name there (Debian's default), so the other nodes are told to connect to a
loopback address and the FSDP checkpoint group (gloo) hangs. So, unless the user set
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (a user's value wins and is kept, each on its own), both are
set to the interface whose address routes to MASTER_ADDR (NCCL's as "=name": NCCL reads a bare
name as a prefix of names): the kernel's route lookup (connect() of a UDP socket sends nothing)
gives the local source address, and the interface holding it is found with the SIOCGIFCONF ioctl
(IPv4: every address of every card) or /proc/net/if_inet6 (IPv6). A loopback route is right
on one node; on several nodes it means MASTER_ADDR resolves to this host's loopback (the rank
on the master node), so the route to the other hosts of the Slurm node list is taken instead.
Decided: no guess when that fails too, nor when MASTER_ADDR does not resolve or has no route (the
process group could not start either): a LaunchError says so and how to set the variables.
NCCL's InfiniBand traffic does not use this interface (NCCL_IB_HCA picks the HCAs), but on an
Ethernet-only cluster with a faster NIC than the one routing to MASTER_ADDR, set
NCCL_SOCKET_IFNAME to it: a user's value is never replaced.
metrics.json records the result per distinct value over ranks (`net_interface`, train.py).
"""

from __future__ import annotations

import array
import contextlib
import datetime
import fcntl
import ipaddress
import itertools
import os
import re
import signal
import socket
import struct
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from scalestudy import vocab
from scalestudy.errors import LaunchError

# MASTER_PORT for srun launches: BASE + (job id + STEP x step id) modulo SPAN stays inside the
# unprivileged, non-ephemeral range (Linux ephemeral ports start at 32768). The step id tells
# apart the runs one allocation starts (snakemake's local executor inside salloc: every srun is
# a new step); STEP is prime to SPAN, so the first SPAN steps of a job get SPAN distinct ports.
PORT_BASE, PORT_SPAN, PORT_STEP = 12000, 20000, 7919


@dataclass(frozen=True)
class DistEnv:
    launcher: str  # "none" | "torchrun" | "srun"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nodes: int
    master_addr: str
    master_port: int
    slurm_job_id: str | None = None
    port_derived: bool = False  # MASTER_PORT derived from the Slurm job and step ids (srun)


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm host-list syntax: 'gpu[01-03,7],login1' -> gpu01 gpu02 gpu03 gpu7 login1."""
    hosts: list[str] = []
    for item in filter(None, _split_top_level(nodelist.strip())):
        # every [..] group is a list of values or zero-padded ranges; the product of the groups
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = []
        for part in parts:
            if part.startswith("["):
                values = []
                for rng in part[1:-1].split(","):
                    lo, dash, hi = rng.partition("-")
                    hi = hi if dash else lo  # n[1-] is no range
                    # n[3-1] named no host: detect's hosts[0] was an IndexError traceback
                    if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                        raise LaunchError(f"cannot parse host list {nodelist!r} at {part!r}")
                    values += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
                choices.append(values)
            elif "[" in part or "]" in part:  # a bracket never closed (or opened)
                raise LaunchError(f"cannot parse host list {nodelist!r} at {part!r}")
            elif part:
                choices.append([part])
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    if not hosts:
        raise LaunchError(f"cannot parse host list {nodelist!r}: it names no host")
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...]."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    if current:
        items.append(current)
    return items


def tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE: '4(x2),3' -> [4, 4, 3]."""
    counts: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise LaunchError(f"cannot parse SLURM_TASKS_PER_NODE={spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError) as exc:
        raise LaunchError(f"environment variable {key}={env.get(key)!r} is not an integer") from exc


def _in_range(env: Mapping[str, str], d: DistEnv, names: tuple[str, str, str, str]) -> DistEnv:
    """`d` when its rank is one of world_size and its local rank one of the node's, else a
    LaunchError naming the variables: a rank outside the world waited for peers that never come
    until the process-group timeout (10 minutes by default)."""
    rank, world, local, local_world = names
    for index, size, i, n in (
        (d.rank, d.world_size, rank, world),
        (d.local_rank, d.local_world_size, local, local_world),
    ):
        if size < 1 or not 0 <= index < size:
            shown = ", ".join(f"{k}={env.get(k)!r}" for k in (i, n) if k in env)
            raise LaunchError(
                f"{shown}: want 0 <= {i} < {n} (the launcher's environment is inconsistent; "
                f"start the ranks with torchrun, srun or scalestudy launch)"
            )
    return d


def detect(env: Mapping[str, str] = os.environ) -> DistEnv:
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world_size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world_size
        # an env:// launcher without torchrun's GROUP_* (a site's own, an mpirun wrapper): the
        # nodes follow from LOCAL_WORLD_SIZE, ranks placed node by node (torchrun's and srun's
        # block order). Taken as 1 node, a multi-node job pinned gloo and NCCL to loopback
        # (peer_interface). max(1, ...): a LOCAL_WORLD_SIZE of 0 is refused by _in_range
        per_node = max(1, local_world)
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        d = DistEnv(
            launcher="torchrun",
            rank=rank,
            world_size=world_size,
            # without LOCAL_RANK, the block placement's where LOCAL_WORLD_SIZE gives the ranks
            # per node: rank 5 of 4 per node is local 1 (0 had every rank of a node on its
            # first GPU); without either, 0 as before (one rank per node, a launcher's own)
            local_rank=(
                _int(env, "LOCAL_RANK")
                if "LOCAL_RANK" in env
                else rank % per_node
                if "LOCAL_WORLD_SIZE" in env
                else 0
            ),
            local_world_size=local_world,
            node_rank=_int(env, "GROUP_RANK") if "GROUP_RANK" in env else rank // per_node,
            nodes=(
                _int(env, "GROUP_WORLD_SIZE")
                if "GROUP_WORLD_SIZE" in env
                else -(-world_size // per_node)  # ceil: a last node may hold fewer ranks
            ),
            master_addr=env.get("MASTER_ADDR") or "127.0.0.1",  # set but empty: unset
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
            slurm_job_id=job_id,
        )
        d = _in_range(env, d, names)
        if d.nodes > 1 and not env.get("MASTER_ADDR"):  # loopback is one node's address
            raise LaunchError(
                f"MASTER_ADDR is not set, and the {world_size} ranks span {d.nodes} nodes "
                "(RANK, WORLD_SIZE, LOCAL_WORLD_SIZE): export MASTER_ADDR=<rank 0's host> (and "
                "MASTER_PORT) on every rank"
            )
        return d
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        node_rank = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
        per_node = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", env["SLURM_NTASKS"]))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        hosts = expand_nodelist(nodelist) if nodelist else ["127.0.0.1"]
        step = vocab.slurm_step(env)  # numeric in every step Slurm starts for tasks
        if _int(env, "SLURM_NTASKS") > 1 and not step.isdigit():
            # sbatch -n 4's batch shell has SLURM_PROCID=0 and SLURM_NTASKS=4 but is no task of
            # a step (jobs/launch.py: "the batch step"): as rank 0 of 4 it waited out the whole
            # process-group timeout for ranks nobody started. So did salloc -n 4's shell in its
            # interactive step, whose SLURM_NTASKS is the job's
            shell = "salloc's shell" if env.get("SLURM_STEP_ID") else "the batch shell"
            raise LaunchError(
                f"this is {shell} of Slurm job {job_id}, not a task of an srun step "
                f"(SLURM_NTASKS={env['SLURM_NTASKS']} are the job's tasks): start the ranks "
                "with srun or scalestudy launch"
            )
        if "MASTER_PORT" in env:
            port = _int(env, "MASTER_PORT")
        elif _int(env, "SLURM_NTASKS") == 1:
            port = free_port()  # no peer to meet; every run in `srun --pty bash` is one step
        elif job_id and job_id.isdigit():
            step_id = int(step) if step.isdigit() else 0
            port = PORT_BASE + (int(job_id) + PORT_STEP * step_id) % PORT_SPAN
        else:
            raise LaunchError("srun launch without SLURM_JOB_ID or MASTER_PORT: cannot pick a port")
        names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE")
        d = DistEnv(
            launcher="srun",
            rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            local_world_size=per_node[min(node_rank, len(per_node) - 1)],
            node_rank=node_rank,
            nodes=len(per_node),
            master_addr=env.get("MASTER_ADDR") or hosts[0],  # set but empty: unset
            master_port=port,
            slurm_job_id=job_id,
            port_derived="MASTER_PORT" not in env and _int(env, "SLURM_NTASKS") > 1,
        )
        return _in_range(env, d, names)
    return DistEnv(
        launcher="none",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        nodes=1,
        master_addr="127.0.0.1",
        master_port=free_port(),
        slurm_job_id=job_id,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hostname(env: Mapping[str, str] = os.environ) -> str:
    # SLURMD_NODENAME is the Slurm node name; it differs from gethostname() where several slurmd
    # share one kernel (the local test cluster) and is what users see in sinfo.
    return env.get("SLURMD_NODENAME") or socket.gethostname()


# the variables that choose gloo's and NCCL's socket interface (NCCL_SOCKET_IFNAME also picks
# NCCL's bootstrap and socket transport; InfiniBand devices are chosen by NCCL_IB_HCA)
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
SIOCGIFCONF = 0x8912  # <linux/sockios.h>: every IPv4 address, one struct ifreq each
# struct ifreq: the name (IFNAMSIZ 16), then a union whose largest member is struct ifmap (two
# unsigned longs, a short, three chars: 24 bytes on 64-bit Linux, 16 on 32-bit) or a sockaddr
IFREQ_SIZE = 16 + max(16, struct.calcsize("LLHBBB0L"))
_pinned: dict[str, str] = {}  # IFNAME_VARS -> "name (auto)" / "name (user)", for metrics.json


def route_source(host: str, port: int) -> str:
    """The local address the kernel would send from to reach `host` (no packet is sent)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError as exc:  # socket.gaierror: unknown name; ENETUNREACH: no route
        raise LaunchError(
            f"no route from this host to {host} ({exc}); set {' and '.join(IFNAME_VARS)} to the "
            "interface the ranks reach each other on"
        ) from exc


def ipv4_addresses(slots: int = 512) -> list[tuple[str, str]]:
    """(interface, address) of every IPv4 address of this host (SIOCGIFCONF: a card's second
    subnet too, which SIOCGIFADDR, each card's first address, never gave: a route from it was
    refused); an alias label (eth0:1) is its card's name."""
    buf = array.array("B", bytes(IFREQ_SIZE * slots))
    pointer, size = buf.buffer_info()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # struct ifconf {int ifc_len; char *ifc_buf;}: the kernel fills the buffer, says how much
        reply = fcntl.ioctl(s.fileno(), SIOCGIFCONF, struct.pack("iP", size, pointer))
    data = buf.tobytes()[: struct.unpack("iP", reply)[0]]
    found = []
    for at in range(0, len(data), IFREQ_SIZE):
        entry = data[at : at + IFREQ_SIZE]
        name = entry[:16].split(b"\0", 1)[0].decode(errors="replace").split(":", 1)[0]
        found.append((name, socket.inet_ntoa(entry[20:24])))  # ifr_addr.sin_addr
    return found


def interface_of(address: str) -> str:
    """The name of the local interface that holds `address` (IPv4 or IPv6)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 4:
        for name, held in ipv4_addresses():
            if held == str(ip):
                return name
    else:
        # /proc/net/if_inet6: address (32 hex digits), index, prefix, scope, flags, name
        with contextlib.suppress(OSError), open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) == 6 and int(fields[0], 16) == int(ip):
                    return fields[5]
    raise LaunchError(
        f"no local interface holds {address}, the address that routes to MASTER_ADDR; set "
        f"{' and '.join(IFNAME_VARS)} to the interface the ranks reach each other on"
    )


def job_hosts(env: Mapping[str, str] = os.environ) -> list[str]:
    """The hosts of this Slurm job step (empty outside Slurm)."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    return expand_nodelist(nodelist) if nodelist else []


def peer_interface(denv: DistEnv, env: Mapping[str, str] = os.environ) -> str:
    """The interface whose address routes to MASTER_ADDR (or, where that is this host's
    loopback in a job of several nodes, to another host of the job)."""
    source = route_source(denv.master_addr, denv.master_port)
    if denv.nodes == 1 or not ipaddress.ip_address(source.split("%")[0]).is_loopback:
        return interface_of(source)
    me = {hostname(env), socket.gethostname()}
    for host in job_hosts(env):
        if host in me:
            continue
        with contextlib.suppress(LaunchError):
            other = route_source(host, denv.master_port)
            if not ipaddress.ip_address(other.split("%")[0]).is_loopback:
                return interface_of(other)
    raise LaunchError(
        f"MASTER_ADDR={denv.master_addr} resolves to this host's loopback ({source}) but the job "
        f"spans {denv.nodes} nodes, and no other host of the job is reachable off loopback: fix "
        f"the host name in /etc/hosts or set {' and '.join(IFNAME_VARS)}"
    )


def pin_interfaces(denv: DistEnv, env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface towards MASTER_ADDR,
    keeping a value the user set; returns variable -> "name (auto)" or "value (user)"."""
    user = {var: env[var] for var in IFNAME_VARS if env.get(var)}
    chosen = {var: f"{value} (user)" for var, value in user.items()}
    if len(user) < len(IFNAME_VARS):
        name = peer_interface(denv, env)
        for var in IFNAME_VARS:
            if var not in user:
                # NCCL reads its variable as name prefixes ("eth1": eth10 too, and its bootstrap
                # took eth10, another network, first); "=eth1" is that name alone
                env[var] = f"={name}" if var == "NCCL_SOCKET_IFNAME" else name
                chosen[var] = f"{name} (auto)"
    return chosen


def describe_interfaces(chosen: Mapping[str, str]) -> str:
    """What metrics.json says of a rank's pinned interface: 'eth0 (auto)' when gloo and NCCL
    share it, else 'GLOO_SOCKET_IFNAME=eth0 (user), NCCL_SOCKET_IFNAME=ib0 (auto)'."""
    values = set(chosen.values())
    if len(values) == 1:
        return values.pop()
    return ", ".join(f"{var}={chosen[var]}" for var in IFNAME_VARS if var in chosen)


def net_interface_over_ranks(world_size: int) -> list[str]:
    """The distinct `net_interface` values of all ranks (a collective: every rank calls it)."""
    import torch.distributed as dist

    values: list = [None] * world_size
    dist.all_gather_object(values, describe_interfaces(_pinned))
    return sorted(set(values))


@contextlib.contextmanager
def stops_kill():
    """SIGTERM, SIGHUP and SIGINT keep their default action (death at once) inside the block,
    the main thread's handlers back after it; one ignored (nohup's SIGHUP) stays ignored. A
    Python handler runs only between bytecodes, never while torch's C++ rendezvous waits: for a
    peer that failed before it, the wait lasts until the process-group timeout, and the SIGTERM
    the launch then sends (torchrun's agent, srun) ran no handler, the rank dying of SIGKILL
    after the launch's grace (torchrun's 30 s, Slurm's KillWait); a Ctrl-C waited out the
    timeout too. Before the rendezvous a rank has nothing to save."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (*vocab.STOP_SIGNALS, signal.SIGINT):
            if callable(signal.getsignal(signum)):  # not SIG_IGN, SIG_DFL, nor C's (None)
                saved[signum] = signal.signal(signum, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def init_process_group(denv: DistEnv, backend: str, timeout_s: float) -> None:
    """The process group of this rank (env://, `timeout_s`), its network interface pinned first
    (pin_interfaces); a stop signal during the rendezvous ends the rank at once (stops_kill)."""
    import torch.distributed as dist

    _pinned.clear()
    _pinned.update(pin_interfaces(denv))  # before any gloo/NCCL socket exists
    os.environ["MASTER_ADDR"] = denv.master_addr
    os.environ["MASTER_PORT"] = str(denv.master_port)
    try:
        with stops_kill():
            dist.init_process_group(
                backend=backend,
                init_method="env://",
                rank=denv.rank,
                world_size=denv.world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
    except dist.DistError as exc:
        if "EADDRINUSE" not in str(exc):
            raise
        raise LaunchError(port_in_use_message(denv)) from exc


def port_in_use_message(denv: DistEnv) -> str:
    """The rendezvous port is taken on MASTER_ADDR (rank 0's host): another process, often
    another job's run whose derived port is the same (module docstring)."""
    port = denv.master_port
    if denv.port_derived:
        origin = (
            f"the port derived from Slurm job {denv.slurm_job_id} and its step id "
            f"({PORT_BASE} + (job + {PORT_STEP} x step) % {PORT_SPAN}; not unique across jobs)"
        )
    else:
        origin = "MASTER_PORT"
    return (
        f"MASTER_PORT {port} on {denv.master_addr} is already in use (EADDRINUSE), {origin}: "
        "set MASTER_PORT to a free port for this run (the same on every rank), e.g. "
        "`export MASTER_PORT=$((20000 + RANDOM % 10000))` before srun"
    )
