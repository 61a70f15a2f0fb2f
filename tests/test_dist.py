"""The gloo/NCCL interface is pinned to the route towards MASTER_ADDR (trainer/dist.py)."""

from __future__ import annotations

import dataclasses
import fcntl
import re
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, SMALL, child_env, read_metrics
from workflow_helpers import need

from scalestudy.errors import LaunchError
from scalestudy.trainer import dist as sdist


def denv(master_addr: str, nodes: int = 1) -> sdist.DistEnv:
    return sdist.DistEnv(
        launcher="srun",
        rank=0,
        world_size=2 * nodes,
        local_rank=0,
        local_world_size=2,
        node_rank=0,
        nodes=nodes,
        master_addr=master_addr,
        master_port=29500,
    )


SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's first IPv4 address (not dist.py's way)


def off_loopback_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of this host's interfaces other than loopback."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(
                    s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
            address = socket.inet_ntoa(reply[20:24])
            if not address.startswith("127."):
                found.append((name, address))
    return found


def test_the_loopback_master_pins_lo_for_both():
    """NCCL reads NCCL_SOCKET_IFNAME as name prefixes ("eth1" is eth1, eth10, eth11, ...:
    its bootstrap took eth10, another network, first), "=eth1" as that name alone; gloo reads
    GLOO_SOCKET_IFNAME as one name. metrics.json records the name."""
    env: dict[str, str] = {}
    chosen = sdist.pin_interfaces(denv("127.0.0.1"), env)
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "=lo"}
    assert chosen == {"GLOO_SOCKET_IFNAME": "lo (auto)", "NCCL_SOCKET_IFNAME": "lo (auto)"}
    assert sdist.describe_interfaces(chosen) == "lo (auto)"


def test_a_user_set_variable_is_kept():
    env = {"GLOO_SOCKET_IFNAME": "ib7", "NCCL_SOCKET_IFNAME": "^docker,lo"}
    # both set: nothing is detected, so even an unknown master is no error
    chosen = sdist.pin_interfaces(denv("no-such-host.invalid"), env)
    assert env == {"GLOO_SOCKET_IFNAME": "ib7", "NCCL_SOCKET_IFNAME": "^docker,lo"}
    assert chosen == {"GLOO_SOCKET_IFNAME": "ib7 (user)", "NCCL_SOCKET_IFNAME": "^docker,lo (user)"}
    # one set: that one is kept, the other is detected
    env = {"NCCL_SOCKET_IFNAME": "ib0"}
    chosen = sdist.pin_interfaces(denv("localhost"), env)
    assert env == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "lo"}
    assert (
        sdist.describe_interfaces(chosen)
        == "GLOO_SOCKET_IFNAME=lo (auto), NCCL_SOCKET_IFNAME=ib0 (user)"
    )


def test_an_unknown_master_is_a_clear_error_and_changes_nothing():
    env: dict[str, str] = {}
    with pytest.raises(
        LaunchError,
        match=r"no route from this host to no-such-host\.invalid .*"
        r"set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME",
    ):
        sdist.pin_interfaces(denv("no-such-host.invalid"), env)
    assert env == {}


def test_a_loopback_master_on_several_nodes_is_refused_without_another_host():
    """127.0.1.1 for the host name on the master node: lo cannot reach the other nodes."""
    with pytest.raises(
        LaunchError,
        match=r"resolves to this host's loopback \(127\.0\.0\.1\) "
        r"but the job spans 2 nodes",
    ):
        sdist.pin_interfaces(denv("127.0.0.1", nodes=2), {})


def test_an_env_launch_of_several_nodes_without_master_addr_says_so():
    """An env:// launcher of its own (an mpirun wrapper) without MASTER_ADDR: detect made up
    127.0.0.1, and the refusal sent the user to /etc/hosts for a variable never set."""
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(LaunchError, match=r"MASTER_ADDR is not set.*2 nodes.*export MASTER_ADDR"):
        sdist.detect({**env, "MASTER_PORT": "29400"})
    one_node = {**env, "RANK": "1", "WORLD_SIZE": "2"}  # one node: loopback is right
    assert sdist.detect(one_node).master_addr == "127.0.0.1"


def test_a_loopback_master_on_several_nodes_takes_the_route_to_another_host():
    if not off_loopback_addresses():
        need("an address off loopback", "run the tests on a host with a network (CI has one)")
    name, address = off_loopback_addresses()[0]
    env = {"SLURM_JOB_NODELIST": address, "SLURMD_NODENAME": "master-node"}
    assert sdist.pin_interfaces(denv("127.0.0.1", nodes=2), env)["GLOO_SOCKET_IFNAME"] == (
        f"{name} (auto)"
    )
    assert env["NCCL_SOCKET_IFNAME"] == f"={name}"


def _own_network() -> bool:
    """Whether this host lets a test make a network namespace of its own (root, unshare -n)."""
    try:
        return subprocess.run(["unshare", "-n", "true"], timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# in a network namespace of its own: a card (one end of a veth pair) with three IPv4 addresses,
# the 2nd added as a secondary, the 3rd with an alias label; each is found on the card
SECONDARY = """
set -e
ip link add v0 type veth peer name v1
ip addr add 10.1.0.1/24 dev v0
ip addr add 10.2.0.1/24 dev v0
ip addr add 10.3.0.1/24 dev v0 label v0:x
ip link set v0 up
"$PYTHON" -c '
from scalestudy.trainer import dist
for peer in ("10.1.0.5", "10.2.0.5", "10.3.0.5"):
    print(dist.interface_of(dist.route_source(peer, 29500)))
'
"""


def test_an_address_that_is_not_the_cards_first_is_found_on_its_card():
    """A card with two subnets, MASTER_ADDR in the second: the route's source is the card's
    second address, and SIOCGIFADDR gives each card its first only: every run on such a node
    was refused ("no local interface holds 10.2.0.1")."""
    if not _own_network():
        need("a network namespace of its own (unshare -n)", "run the tests as root (CI does)")
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", SECONDARY],
        capture_output=True,
        text=True,
        env={**child_env(), "PYTHON": PYTHON},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["v0", "v0", "v0"], proc.stdout


def test_every_address_maps_to_its_interface():
    if not off_loopback_addresses():
        need("an address off loopback", "run the tests on a host with a network (CI has one)")
    for name, address in off_loopback_addresses():
        assert sdist.interface_of(sdist.route_source(address, 29500)) == name


@pytest.mark.skipif(
    not Path("/proc/net/if_inet6").exists() or "lo" not in Path("/proc/net/if_inet6").read_text(),
    reason="no IPv6 on loopback",
)
def test_an_ipv6_address_maps_to_its_interface():
    assert sdist.interface_of(sdist.route_source("::1", 29500)) == "lo"


def test_metrics_record_a_user_set_interface(data_dir, tmp_path):
    """One real process: GLOO_SOCKET_IFNAME from the user is kept, NCCL's is chosen."""
    cmd = [PYTHON, "-m", "scalestudy", "train", *SMALL, "--epochs", "1", "--comm-probe-steps", "0"]
    cmd += ["--limit-train", "256", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    proc = subprocess.run(
        cmd, env=child_env(GLOO_SOCKET_IFNAME="lo"), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_metrics(tmp_path)["net_interface"] == [
        "GLOO_SOCKET_IFNAME=lo (user), NCCL_SOCKET_IFNAME=lo (auto)"
    ]


@pytest.mark.parametrize(
    "env, named",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2', WORLD_SIZE='2': want 0 <= RANK < WORLD_SIZE"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1', WORLD_SIZE='2'"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "RANK='0', WORLD_SIZE='0'"),
        (
            {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "LOCAL_RANK='2', LOCAL_WORLD_SIZE='2': want 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE",
        ),
        (
            {"SLURM_PROCID": "3", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"},
            "SLURM_PROCID='3', SLURM_NTASKS='3': want 0 <= SLURM_PROCID < SLURM_NTASKS",
        ),
        (
            {
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "4",
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "0",
                "SLURM_LOCALID": "2",
                "SLURM_TASKS_PER_NODE": "2(x2)",
            },
            "SLURM_LOCALID='2', SLURM_TASKS_PER_NODE='2(x2)'",
        ),
    ],
)
def test_a_rank_outside_its_world_is_refused_at_once(env, named):
    """RANK=2 of WORLD_SIZE=2 waited at the rendezvous for the process-group timeout (10
    minutes by default) before failing."""
    with pytest.raises(LaunchError, match=re.escape(named)):
        sdist.detect(env)
    ok = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert sdist.detect(ok).rank == 1 and sdist.detect(ok).local_rank == 1


def test_a_rank_outside_its_world_is_one_line_before_any_rendezvous(data_dir, tmp_path):
    argv = [PYTHON, "-m", "scalestudy", "train", *SMALL, "--data-dir", str(data_dir)]
    argv += ["--out", str(tmp_path / "run")]
    env = child_env(RANK="2", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("scalestudy train: RANK='2', WORLD_SIZE='2': want 0 <= RANK"), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("checkpoints", "signum"),
    [(False, signal.SIGTERM), (True, signal.SIGTERM), (False, signal.SIGINT)],
    ids=["plain", "checkpointing", "ctrl-c"],
)
def test_a_stop_signal_during_the_rendezvous_ends_the_rank_at_once(
    data_dir, tmp_path, checkpoints, signum
):
    """A Python handler of SIGTERM (cli's Stopped; the checkpointing StopFlag) runs only between
    bytecodes, never inside torch's C++ rendezvous wait: rank 0 of 2 whose peer failed before
    it ran none on the launch's SIGTERM and lived on to the launch's SIGKILL (a 2-rank local
    launch whose rank 1 failed 25 s in ended at 65 s, torchrun's 30-s grace, now at 35 s). The
    rank now dies of it at once; here its peer never comes, and the rank is in the rendezvous
    once its store listens. Ctrl-C too: the "interrupted" handler waited out --pg-timeout-s."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    argv = [PYTHON, "-m", "scalestudy", "train", *SMALL, "--data-dir", str(data_dir)]
    argv += ["--out", str(tmp_path / "run"), "--pg-timeout-s", "300"]
    if checkpoints:
        argv += ["--checkpoint-dir", str(tmp_path / "ckpt")]
    env = child_env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # SIGINT at its default in the rank, as under a terminal's Ctrl-C: a shell's background job
    # (CI under nohup, `cmd &`) starts with it ignored, and an ignored SIGINT stays ignored
    proc = subprocess.Popen(
        argv,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for _ in range(1200):  # its store listens (a connection is refused before)
            assert proc.poll() is None, proc.communicate()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("rank 0 never reached the rendezvous")
        time.sleep(1)  # inside the wait, past the store's start
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)  # the handlers' rank waited out --pg-timeout-s
    finally:
        proc.kill()
    assert proc.returncode == -signum, err


def test_an_env_launcher_without_group_variables_counts_its_nodes():
    """A launcher that sets only RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_*
    (not torchrun's GROUP_RANK/GROUP_WORLD_SIZE) made every job one node, node 0: on several
    nodes a loopback MASTER_ADDR route then pinned gloo and NCCL to lo."""
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    d = sdist.detect(env)
    assert (d.nodes, d.node_rank) == (2, 1)
    # a last node holding fewer ranks: 10 ranks, 4 per node, is 3 nodes
    assert sdist.detect({**env, "WORLD_SIZE": "10", "RANK": "9"}).nodes == 3
    # torchrun's own variables win where set; one node without LOCAL_WORLD_SIZE
    grouped = sdist.detect({**env, "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"})
    assert (grouped.nodes, grouped.node_rank) == (1, 0)
    bare = sdist.detect({"RANK": "1", "WORLD_SIZE": "2"})
    assert (bare.nodes, bare.node_rank) == (1, 0)
    # so the loopback route of a 2-node job is not taken for the interface of both nodes
    with pytest.raises(LaunchError, match="resolves to this host's loopback"):
        sdist.peer_interface(d, {})


def test_each_srun_step_of_a_job_has_its_own_port_and_one_rank_a_free_one():
    """Runs started in one allocation (snakemake's local executor inside salloc) share the job
    id: every one of their process groups bound the port of the job id, and all but the first
    failed with EADDRINUSE. A step's ranks share SLURM_STEP_ID, so they still meet."""
    srun = {"SLURM_NTASKS": "2", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1"}

    def port(**env) -> int:
        return sdist.detect({**srun, "SLURM_PROCID": "0", **env}).master_port

    steps = {port(SLURM_STEP_ID=str(step)) for step in range(50)}
    assert len(steps) == 50 and all(sdist.PORT_BASE <= p < 32768 for p in steps)
    assert (
        port(SLURM_STEP_ID="3")
        == sdist.detect({**srun, "SLURM_PROCID": "1", "SLURM_STEP_ID": "3"}).master_port
    )  # the step's other rank
    assert port(SLURM_STEP_ID="3", MASTER_PORT="23456") == 23456  # a user's port is kept
    # one rank meets no peer: a free port, not the job's (srun --pty bash: every run is step 0)
    one = {**srun, "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_ID": "0"}
    first, second = (sdist.detect({**one, "SLURM_PROCID": "0"}) for _ in range(2))
    with socket.socket() as s:  # the first run holds its port: the second must get another
        s.bind(("127.0.0.1", first.master_port))
        assert sdist.detect({**one, "SLURM_PROCID": "0"}).master_port != first.master_port
    assert second.master_port >= 1024


def test_the_batch_shell_of_a_multi_task_job_is_not_rank_0():
    """`sbatch -n 4` running the trainer in its script: the batch shell has SLURM_PROCID=0 and
    SLURM_NTASKS=4 but no SLURM_STEP_ID; taken for rank 0 of 4 it waited out the process-group
    timeout for three ranks nobody started. A task of a step, or a lone task, still runs."""
    batch = {"SLURM_JOB_ID": "200505", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    batch |= {"SLURM_NODEID": "0", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "4"}
    batch |= {"SLURM_JOB_NODELIST": "localhost"}
    with pytest.raises(LaunchError) as caught:
        sdist.detect(batch)
    assert str(caught.value) == (
        "this is the batch shell of Slurm job 200505, not a task of an srun step "
        "(SLURM_NTASKS=4 are the job's tasks): start the ranks with srun or scalestudy launch"
    )
    step = sdist.detect({**batch, "SLURM_STEP_ID": "0"})
    assert (step.launcher, step.rank, step.world_size) == ("srun", 0, 4)
    # salloc -n 4's shell in its interactive step (LaunchParameters=use_interactive_step): a
    # task of that step, whose SLURM_NTASKS is the job's (tests/slurm/test_launch_slurm.py)
    with pytest.raises(LaunchError, match="^this is salloc's shell of Slurm job 200505, not a"):
        sdist.detect({**batch, "SLURM_STEP_ID": "4294967290"})
    lone = {**batch, "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1"}  # `sbatch -n 1`'s shell
    assert sdist.detect(lone).world_size == 1
    # torchrun inside an srun step (or inside the batch shell): RANK wins over SLURM_*
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert sdist.detect({**batch, **torchrun}).launcher == "torchrun"


def test_a_derived_port_in_use_is_one_line_naming_it_and_the_override(monkeypatch):
    """The srun port (job id + 7919 x step id, modulo 20000) is not unique across jobs: job 4242
    step 1 and job 12161 step 0 get the same; the second to start on a shared first node failed
    with torch's DistNetworkError (EADDRINUSE)."""
    env = {"SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost"}
    env |= {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    a = sdist.detect({**env, "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1"})
    b = sdist.detect({**env, "SLURM_JOB_ID": "12161", "SLURM_STEP_ID": "0"})
    assert a.master_port == b.master_port and a.port_derived and b.port_derived
    assert not sdist.detect(
        {**env, "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "MASTER_PORT": "23456"}
    ).port_derived
    for name in sdist.IFNAME_VARS + ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # init_process_group sets them: restored after the test
        monkeypatch.delenv(name)
    with socket.socket() as taken:  # another job's store on the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = dataclasses.replace(b, master_addr="127.0.0.1", master_port=port)
        with pytest.raises(LaunchError) as caught:
            sdist.init_process_group(b, "gloo", 5)
    assert str(caught.value) == (
        f"MASTER_PORT {port} on 127.0.0.1 is already in use (EADDRINUSE), the port derived from "
        "Slurm job 12161 and its step id (12000 + (job + 7919 x step) % 20000; not unique across "
        "jobs): set MASTER_PORT to a free port for this run (the same on every rank), e.g. "
        "`export MASTER_PORT=$((20000 + RANDOM % 10000))` before srun"
    )


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu[01-03,7],login1", ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]),
        ("a-[1-2]b", ["a-1b", "a-2b"]),
        ("n[1-2]-ib[0-1]", ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"]),
    ],
)
def test_slurm_host_lists_expand(nodelist, hosts):
    assert sdist.expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["n[3-1]", "n[1-", "n]1[", "n[a-b]", ","])
def test_a_host_list_that_names_no_host_is_one_line(nodelist):
    """n[3-1] expanded to no host, then detect's hosts[0] was an IndexError traceback."""
    srun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0"}
    with pytest.raises(LaunchError, match="cannot parse host list"):
        sdist.expand_nodelist(nodelist)
    with pytest.raises(LaunchError, match="cannot parse host list"):
        sdist.detect({**srun, "SLURM_JOB_NODELIST": nodelist})


def test_an_empty_master_addr_is_unset():
    """MASTER_ADDR='' was taken as the address: the route check then blamed the network
    interface ("no route from this host to  ... set GLOO_SOCKET_IFNAME")."""
    srun = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0"}
    srun |= {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    srun |= {"SLURM_NODEID": "1"}
    assert sdist.detect({**srun, "MASTER_ADDR": ""}).master_addr == "node01"
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": ""}
    assert sdist.detect(env).master_addr == "127.0.0.1"


def test_a_missing_local_rank_follows_the_block_placement():
    """RANK 5 of 8, 4 per node, without LOCAL_RANK was local rank 0: every rank of a node took
    its first GPU (set_device(local_rank)), and NCCL refused the duplicate GPU."""
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n1"}
    d = sdist.detect(env)
    assert (d.local_rank, d.node_rank) == (1, 1)
    # without LOCAL_WORLD_SIZE the ranks per node are unknown (a launcher of one rank per
    # node, mpirun's, sets neither): 0, as before
    assert sdist.detect({"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "n1"}).local_rank == 0
