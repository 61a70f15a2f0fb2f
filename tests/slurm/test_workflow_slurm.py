"""The README's local-cluster command, verbatim, on the real local 2-node cluster.

The command is read from README.md (the row "the demo on the local test cluster"), so the
README cannot drift from what is tested: the demo study (config/demo.yaml with
config/local-slurm.yaml's 2 ranks per node, so its 4-rank run spans both nodes, and without its
precision family, whose CPU bf16 run is slow and says nothing about Slurm), every run its own
Slurm job through snakemake-executor-plugin-slurm, to reports/ and the same CSV schema as a
local run.
"""

from __future__ import annotations

import csv
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow_helpers import copy_repo, snakemake  # noqa: E402

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def readme_commands() -> tuple[str, list[str]]:
    """(the local-slurm.sh command, the snakemake arguments) of the README's local-cluster row."""
    row = next(
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("| the demo on the local test cluster")
    )
    start, run = re.findall(r"`([^`]+)`", row)
    argv = shlex.split(run)
    assert argv[0] == "snakemake", run
    return start, argv[1:]


def test_readme_command_is_what_the_cluster_fixture_starts():
    start, args = readme_commands()
    assert start == "scripts/local-slurm.sh start --nodes 2"
    assert args[:2] == ["--profile", "profiles/local-slurm"]


def test_readme_demo_on_slurm_spans_two_nodes(slurm_cluster, tiny_study, tmp_path):
    cluster = slurm_cluster(2)
    work = copy_repo(tmp_path / "wf")
    _, args = readme_commands()
    # a --config value reaches each job as the user wrote it: inside sbatch's --wrap="..." the
    # submitting shell ran its $(...) and `...` (profiles: slurm-pass-command-as-script)
    args += ["study=demo $(touch injected-dollar) `touch injected-backtick`"]
    proc = snakemake(work, *args, timeout=1500, extra_env={"SLURM_CONF": cluster.env["SLURM_CONF"]})
    assert "slurm" in proc.stdout + proc.stderr
    assert not list(work.glob("injected-*")) and not list(Path.cwd().glob("injected-*"))

    demo = yaml.safe_load((work / "config/demo.yaml").read_text())
    runs = read_csv(work / "results/csv/runs.csv")
    n = len(runs)
    with (work / "results/matrix/runs.tsv").open() as f:
        assert n == len(list(csv.DictReader(f, delimiter="\t"))) > 1  # every run of the table
    assert {r["precision"] for r in runs} == {"fp32"}  # config/local-slurm.yaml: no bf16 run
    assert all(r["slurm_job_id"].isdigit() for r in runs)  # every run was its own Slurm job
    assert len({r["slurm_job_id"] for r in runs}) == n
    assert {(r["dataset"], r["epochs"]) for r in runs} == {
        ("synthetic", str(demo["train"]["epochs"]))
    }
    spanning = [r for r in runs if r["world_size"] == "4"]
    assert spanning, "the demo has a 4-rank run"
    for r in spanning:
        assert r["nodes"] == "2" and r["ranks_per_node"] == "2"
        assert r["hostnames"] == "node1;node2"
    # every rank, one too, runs in an srun step (the USR1 warning reaches job steps only)
    assert all(r["launcher"] == "srun" for r in runs)
    # a demo that teaches: every run learned the synthetic set
    assert all(float(r["final_val_acc"]) >= 0.6 for r in runs), [
        (r["run"], r["final_val_acc"]) for r in runs
    ]
    # the same CSV schema as a local run, and the study's documents
    local = read_csv(tiny_study / "results/csv/runs.csv")
    assert list(runs[0]) == list(local[0])
    epochs = read_csv(work / "results/csv/epochs.csv")
    assert list(epochs[0]) == list(read_csv(tiny_study / "results/csv/epochs.csv")[0])
    assert len(epochs) == n * demo["train"]["epochs"]
    assert (work / "reports/study.md").stat().st_size > 0
