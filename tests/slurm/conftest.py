"""A real local Slurm cluster (scripts/local-slurm.sh) for tests that submit jobs.

`slurm_cluster(nodes)` starts a 1- or 2-node cluster (or reuses the running one when it has that
node count) and returns a `SlurmCluster`; the cluster is stopped at the end of the session
(SCALESTUDY_SLURM_KEEP=1 leaves it running). Switching the node count restarts it (~3 s).

If the cluster cannot start (not root, Slurm/munge not installed, a daemon that does not come up):
under CI=true the test FAILS with the script's output, never skips; elsewhere it is skipped with
the reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local-slurm.sh"
IN_CI = os.environ.get("CI", "").lower() == "true"
STATE_DIR = Path(os.environ.get("SCALESTUDY_SLURM_DIR", "/tmp/scalestudy-slurm"))
START_TIMEOUT_S = 150  # the script itself gives the daemons 60 s


def slurm_env(**extra: str) -> dict[str, str]:
    """This process's environment without the variables of any enclosing Slurm job or launcher,
    so srun/sbatch see a clean submission (and the TaskProlog sets GLOO_SOCKET_IFNAME)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "GLOO_", "MASTER_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env["SLURM_CONF"] = str(STATE_DIR / "slurm.conf")
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run_cmd(
    cmd: Sequence[str] | str,
    timeout: float = 60,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` (argv list, or a string for bash -c) with a timeout; stdout/stderr as text.

    check=True turns a non-zero exit or a timeout into an AssertionError that carries the
    command and everything it printed."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.stdout) + _text(exc.stderr)
        if check:
            raise AssertionError(f"timed out after {timeout} s: {argv}\n{out}") from None
        return subprocess.CompletedProcess(argv, 124, _text(exc.stdout), _text(exc.stderr))
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}: {argv}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode(errors="replace")


@dataclass
class SlurmCluster:
    """A running local cluster: node names, the environment for its client commands."""

    nodes: tuple[str, ...]
    conf: Path
    state_dir: Path
    script: Path = SCRIPT
    env: dict[str, str] = field(default_factory=slurm_env)

    def run(
        self, cmd: Sequence[str] | str, timeout: float = 60, check: bool = True, **kw
    ) -> subprocess.CompletedProcess[str]:
        return run_cmd(cmd, timeout=timeout, check=check, env=self.env, **kw)

    def sbatch(self, *args: str, timeout: float = 30) -> str:
        """Submit with sbatch; returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], timeout=timeout).stdout
        return out.strip().split(";")[0]

    def wait_gone(self, job_id: str, timeout: float = 60) -> str:
        """Poll squeue until the job has left it; returns its final JobState (scontrol)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queued = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
            if queued.returncode == 0 and not queued.stdout.strip():
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"job {job_id} still in squeue after {timeout} s")
        show = self.run(["scontrol", "show", "job", job_id]).stdout
        for word in show.split():
            if word.startswith("JobState="):
                return word.removeprefix("JobState=")
        raise AssertionError(f"no JobState in scontrol output:\n{show}")


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(f"local Slurm cluster unavailable under CI=true:\n{message}", pytrace=False)
    pytest.skip(f"local Slurm cluster unavailable: {message.strip().splitlines()[-1]}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Callable[[int], SlurmCluster]]:
    """Factory: `slurm_cluster(2)` -> a running 2-node SlurmCluster (started or reused)."""
    state: dict[str, object] = {"started": False, "failed": {}}

    def start(nodes: int = 1) -> SlurmCluster:
        failed: dict[int, str] = state["failed"]  # type: ignore[assignment]
        if nodes in failed:  # do not retry a 60 s failure for every test
            _unavailable(failed[nodes])
        if not SCRIPT.exists():
            _unavailable(f"{SCRIPT} is missing")
        if os.geteuid() != 0:
            _unavailable("the local Slurm cluster needs root (it starts munged/slurmd)")
        state["started"] = True
        t0 = time.monotonic()
        proc = run_cmd(
            ["bash", str(SCRIPT), "start", "--nodes", str(nodes)],
            timeout=START_TIMEOUT_S,
            check=False,
            env=slurm_env(),
        )
        if proc.returncode != 0:
            failed[nodes] = (
                f"`{SCRIPT.name} start --nodes {nodes}` exited {proc.returncode} after "
                f"{time.monotonic() - t0:.0f} s\n--- stdout\n{proc.stdout}\n--- stderr\n"
                f"{proc.stderr}"
            )
            _unavailable(failed[nodes])
        return SlurmCluster(
            nodes=tuple(f"node{i}" for i in range(1, nodes + 1)),
            conf=STATE_DIR / "slurm.conf",
            state_dir=STATE_DIR,
        )

    yield start

    if state["started"] and os.environ.get("SCALESTUDY_SLURM_KEEP") != "1":
        run_cmd(["bash", str(SCRIPT), "stop"], timeout=60, check=False, env=slurm_env())
