"""`scalestudy launch`: each rank's thread pools are sized to its own cores."""

from __future__ import annotations

import subprocess
import sys

from scalestudy.jobs import launch

# Snakemake's shell exports these with the rule's threads (all ranks' cores together)
SNAKEMAKE_THREADS = dict.fromkeys(launch.THREAD_VARS, "4")


def test_rank_env_gives_every_thread_pool_the_cores_of_one_rank():
    env = launch.rank_env({"PATH": "/bin", **SNAKEMAKE_THREADS}, 1)
    assert env["PATH"] == "/bin"
    assert {k: env[k] for k in launch.THREAD_VARS} == dict.fromkeys(launch.THREAD_VARS, "1")
    assert {"MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} <= set(launch.THREAD_VARS)


def test_a_launched_rank_sees_its_own_thread_counts(tmp_path):
    """A real launch (one rank, whose trainer is replaced through --rank-prefix by a shell that
    records its environment) under the variables Snakemake's shell sets."""
    seen = tmp_path / "env.txt"
    prefix = f"sh -c 'env > {seen}' sh"
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--cpus-per-rank", "2"]
        + ["--rank-prefix", prefix, "--", "--epochs", "1"],
        env={"PATH": "/usr/bin:/bin", **SNAKEMAKE_THREADS},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert {k: got.get(k) for k in launch.THREAD_VARS} == dict.fromkeys(launch.THREAD_VARS, "2")
