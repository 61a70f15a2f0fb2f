"""The demo study through `snakemake --executor slurm` on the real local 2-node cluster.

The demo config is shrunk (256 synthetic images, 2 epochs) to fit CI time, and gpus_per_node is
set to 2 so its 4-rank runs span both nodes (2 ranks each, gloo over the namespaces' eth0).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow_helpers import copy_repo, snakemake, write_config  # noqa: E402

pytestmark = pytest.mark.slurm


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_demo_study_on_slurm_spans_two_nodes(slurm_cluster, tiny_study, tmp_path):
    cluster = slurm_cluster(2)
    work = copy_repo(tmp_path / "wf")
    demo = yaml.safe_load((work / "config/demo.yaml").read_text())
    demo["dataset"] = "synthetic"
    demo["synthetic"] = {"num_train": 512, "num_test": 100}
    demo["hardware"].update(gpus_per_node=2, mem_mb_per_rank=500, runtime_min=10)
    demo["train"].update(
        epochs=2, limit_train=256, limit_test=100, warmup_steps=1, comm_probe_steps=1
    )
    write_config(work / "demo-slurm.yaml", demo)

    proc = snakemake(
        work,
        "--profile",
        "profiles/local-slurm",
        "--configfile",
        "demo-slurm.yaml",
        timeout=1500,
        extra_env={"SLURM_CONF": cluster.env["SLURM_CONF"]},
    )
    assert "slurm" in proc.stdout + proc.stderr

    runs = read_csv(work / "results/csv/runs.csv")
    assert len(runs) == 8
    assert all(r["slurm_job_id"].isdigit() for r in runs)  # every run was its own Slurm job
    assert len({r["slurm_job_id"] for r in runs}) == 8
    spanning = [r for r in runs if r["world_size"] == "4"]
    assert spanning, "the demo has 4-rank runs"
    for r in spanning:
        assert r["nodes"] == "2" and r["ranks_per_node"] == "2"
        assert r["hostnames"] == "node1;node2"
        assert r["launcher"] == "srun"
        assert float(r["throughput_img_s"]) > 0
    single = [r for r in runs if r["world_size"] == "1"]
    assert all(r["launcher"] == "none" for r in single)  # one rank: a plain job, no srun
    # the same CSV schema as a local run
    local = read_csv(tiny_study / "results/csv/runs.csv")
    assert list(runs[0]) == list(local[0])
    epochs = read_csv(work / "results/csv/epochs.csv")
    assert list(epochs[0]) == list(read_csv(tiny_study / "results/csv/epochs.csv")[0])
    assert len(epochs) == 8 * 2
