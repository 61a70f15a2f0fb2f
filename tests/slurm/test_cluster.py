"""The local Slurm cluster works the way the workflow uses it: srun, sbatch, two nodes in their
own network namespaces, and a 2-node gloo all_reduce launched with srun (one rank per node).

Needs root; scripts/local-slurm.sh starts the cluster. About 20 s in all on a 2-core machine.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

# Each rank finds its place from Slurm only, as the workflow's ranks do (scalestudy.trainer.dist).
ALLREDUCE = textwrap.dedent(
    """
    import datetime, os, subprocess
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 20000  # job-unique
    dist.init_process_group("gloo", init_method=f"tcp://{hosts[0]}:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank={rank} node={os.environ['SLURMD_NODENAME']} "
          f"ifname={os.environ.get('GLOO_SOCKET_IFNAME')} sum={t.item():g}", flush=True)
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def one_node(slurm_cluster):
    return slurm_cluster(1)


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster):
    return slurm_cluster(2)


# ------------------------------------------------------------------ one node (runs first)
def test_one_node_srun(one_node):
    assert one_node.nodes == ("node1",)
    out = one_node.run(["srun", "-n", "2", "hostname"], timeout=30).stdout.split()
    assert len(out) == 2, out
    # 4 one-CPU ranks fit on a node (CPUs=4 declared whatever the hardware)
    ranks = one_node.run(
        [
            "srun",
            "-n",
            "4",
            "bash",
            "-c",
            "echo $SLURM_PROCID $SLURMD_NODENAME $GLOO_SOCKET_IFNAME",
        ],
        timeout=30,
    ).stdout.splitlines()
    assert sorted(ranks) == [f"{r} node1 lo" for r in range(4)]


def test_one_node_sbatch_completes(one_node, tmp_path: Path):
    out = tmp_path / "job.out"
    job = one_node.sbatch("-o", str(out), "-t", "1", "--wrap", "echo hello from $SLURM_JOB_ID")
    assert one_node.wait_gone(job, timeout=60) == "COMPLETED"
    assert out.read_text().strip() == f"hello from {job}"
    status = one_node.run(["bash", str(one_node.script), "status"])
    assert "node1" in status.stdout


# ------------------------------------------------------------------ two nodes
def test_two_nodes_srun_spans_both(two_nodes):
    assert two_nodes.nodes == ("node1", "node2")
    out = two_nodes.run(
        ["srun", "-N", "2", "-n", "2", "bash", "-c", "echo $SLURMD_NODENAME $GLOO_SOCKET_IFNAME"],
        timeout=30,
    ).stdout.splitlines()
    assert sorted(out) == ["node1 eth0", "node2 eth0"]
    # 2 nodes x 4 ranks fit; the inner layout is what the workflow's srun asks for
    nodes = two_nodes.run(
        ["srun", "--nodes=2", "--ntasks-per-node=4", "bash", "-c", "echo $SLURMD_NODENAME"],
        timeout=30,
    ).stdout.split()
    assert sorted(nodes) == ["node1"] * 4 + ["node2"] * 4


def test_two_nodes_gloo_allreduce(two_nodes, tmp_path: Path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    proc = two_nodes.run(
        [
            "srun",
            "-N2",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=1",
            "-t",
            "2",
            sys.executable,
            str(script),
        ],
        timeout=120,
    )
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank="))
    assert lines == [
        "rank=0 node=node1 ifname=eth0 sum=3",
        "rank=1 node=node2 ifname=eth0 sum=3",
    ], proc.stdout + proc.stderr
