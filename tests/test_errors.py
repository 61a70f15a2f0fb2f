"""Expected errors are one line on stderr from one rank; bugs keep their traceback (issue 14).

The ranks are two plain processes given torchrun's variables by hand (real gloo process group),
so what reaches stderr is ours alone; one test goes through `scalestudy launch` (torchrun), whose
own ChildFailedError block is torchrun's and is left out of the assertion.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON
from workflow_helpers import REPO, child_env, need, sigint_as_in_a_terminal

from scalestudy import files, log

# a tiny run: the errors below stop it at start-up or at its first step
FLAGS = ["--dataset", "synthetic", "--width", "4", "--epochs", "1", "--local-batch", "32"]
FLAGS += ["--warmup-steps", "1", "--comm-probe-steps", "0", "--pg-timeout-s", "60"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(data_dir: Path, out: Path, *flags: str, pre: tuple[str, ...] = (), **env: str):
    """Run `scalestudy [pre] train` as ranks 0 and 1 of a 2-rank job: [(returncode, stderr)].
    No launcher kills a rank here, so the silent rank need not wait for rank 0 to print
    (SCALESTUDY_REPORT_GRACE_S 0 instead of 10 s: train.report_grace_s)."""
    env = {"SCALESTUDY_REPORT_GRACE_S": "0", **env}
    port = str(free_port())
    procs = []
    for rank in range(2):
        rank_env = dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
        rank_env.update(LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [PYTHON, "-m", "scalestudy", *pre, "train", *FLAGS, *flags]
        cmd += ["--data-dir", str(data_dir), "--out", str(out)]
        procs.append(
            subprocess.Popen(
                cmd,
                env=child_env(**rank_env, **env),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return [(p.wait(timeout=300), p.stderr.read()) for p in procs]


@pytest.fixture(scope="module")
def changed_data(data_dir, tmp_path_factory) -> Path:
    """The prepared data with one byte of data.pt flipped (meta.json's sha256 no longer fits)."""
    d = tmp_path_factory.mktemp("changed")
    shutil.copytree(data_dir / "synthetic", d / "synthetic")
    path = d / "synthetic" / "data.pt"
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 1
    path.write_bytes(bytes(raw))
    return d


@pytest.mark.parametrize(
    "case, flags, message",
    [
        ("missing", [], "/nonexistent/synthetic/meta.json does not exist"),
        ("changed", [], "the file was changed or is incomplete; recreate: scalestudy prepare-data"),
        (
            "split",
            ["--global-batch", "100", "--accum-steps", "3"],
            "--global-batch 100 does not split over world_size 2 x accum_steps 3",
        ),
        ("flag", ["--local-batch", "0"], "--local-batch must be >= 1, got 0"),
        # a TrainingError every rank finds alike (here the step count): once, not once a rank
        ("window", ["--warmup-steps", "100"], "leave no steady-state window after --warmup-steps"),
        # by hand (the study refuses it): one step of 100 images, its learning rate scaled for
        # a global batch of 128 no step held, and metrics.json said 128
        (
            "batch",
            ["--limit-train", "100", "--global-batch", "128"],
            "the global batch 2 x 64 x --accum-steps 1 = 128 is larger than the 100 training",
        ),
    ],
)
def test_expected_error_is_one_line_from_rank_0(
    data_dir, changed_data, tmp_path, case, flags, message
):
    source = {"missing": Path("/nonexistent"), "changed": changed_data}.get(case, data_dir)
    (rc0, err0), (rc1, err1) = two_ranks(source, tmp_path, *flags)
    assert (rc0, rc1) == (2, 2), (err0, err1)
    assert err0.count("\n") == 1 and err0.startswith("[rank 0/2 ") and message in err0, err0
    assert "scalestudy train: " in err0 and "Traceback" not in err0
    assert err1 == "", err1  # the same error: rank 0 says it once
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize("case", ["out-file", "metrics-dir", "checkpoint-under-file"])
def test_an_output_the_run_cannot_write_is_refused_before_training(data_dir, tmp_path, case):
    """--out naming a file, or a directory where metrics.json goes, failed only after training
    (and --checkpoint-dir at the first save), as two lines: the run was lost."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    out, flags = tmp_path / "run", []
    if case == "out-file":
        out, says = afile, f"--out {afile} is a file, not a directory"
    elif case == "metrics-dir":
        (out / "metrics.json").mkdir(parents=True)
        says = f"--out {out}: metrics.json there is a directory"
    else:
        flags = ["--checkpoint-dir", str(afile / "ckpt")]
        says = f"--checkpoint-dir {afile / 'ckpt'} cannot be made: {afile} is a file"
    (rc0, err0), (rc1, err1) = two_ranks(data_dir, out, *flags)
    assert (rc0, rc1) == (2, 2), (err0, err1)
    assert err0.count("\n") == 1 and says in err0 and "Traceback" not in err0, err0
    assert err1 == "", err1
    assert not list(tmp_path.rglob("epochs.csv"))  # no epoch was trained


def test_an_out_under_a_symlink_to_a_purged_scratch_is_refused_before_training(tmp_path):
    """`results -> /scratch/...` whose target was purged: check_output_dirs passed (exists()
    is False for the dangling link, so it walked past it), an epoch was trained, and the first
    write failed "results: File exists"."""
    from scalestudy.errors import OutputDirError
    from scalestudy.trainer import train
    from scalestudy.trainer.config import TrainConfig

    link = tmp_path / "results"
    link.symlink_to(tmp_path / "purged" / "results")
    out = link / "runs" / "r1"
    with pytest.raises(OutputDirError) as caught:
        train.check_output_dirs(TrainConfig(out=str(out)))
    assert str(caught.value) == (
        f"--out {out} cannot be made: {link} is a symlink to missing "
        f"{tmp_path / 'purged' / 'results'}: create it or remove the link; give a directory "
        "this job can write"
    )


def test_an_output_dir_problem_is_said_by_each_node(tmp_path, monkeypatch):
    """--out is judged on each node's own file system (node-local scratch, a relative path): a
    node where it is a file said nothing when rank 0 alone reported it (scope "run"), and rank
    0, whose own --out was fine, waited out the process-group timeout at the rendezvous."""
    from scalestudy.errors import TrainConfigError
    from scalestudy.trainer import train
    from scalestudy.trainer.config import TrainConfig

    afile = tmp_path / "run"
    afile.write_text("not a directory\n")
    with pytest.raises(TrainConfigError) as caught:
        train.check_output_dirs(TrainConfig(out=str(afile)))
    assert str(caught.value).startswith(f"--out {afile} is a file, not a directory")
    monkeypatch.delenv(log.DEBUG_ENV, raising=False)
    try:
        log.setup(rank=1, world_size=2, local_rank=0)  # rank 1, alone on the second node
        assert log.reports(caught.value.scope)
        log.setup(rank=1, world_size=2, local_rank=1)  # its node's rank 0 says it
        assert not log.reports(caught.value.scope)
    finally:
        log.setup()


@pytest.mark.parametrize(
    ("env", "run", "node"),
    [
        ({}, True, True),
        ({"RANK": "1", "LOCAL_RANK": "1"}, False, False),  # torchrun's rank 1
        ({"RANK": "2", "LOCAL_RANK": "0"}, False, True),  # the second node's first
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1"}, False, False),  # srun's task 3
    ],
)
def test_a_rank_before_its_logging_is_placed_reports_as_its_rank(monkeypatch, env, run, node):
    """Ctrl-C while the ranks started (before log.setup placed them): every rank printed the
    run's "interrupted" line, W lines for one stop. The launcher's environment places them."""
    monkeypatch.delenv(log.DEBUG_ENV, raising=False)
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    log.setup()  # no rank given: not placed
    assert (log.reports("run"), log.reports("node"), log.reports("rank")) == (run, node, True)


def test_debug_shows_the_traceback_of_expected_errors(data_dir, tmp_path):
    for how in ({"SCALESTUDY_DEBUG": "1"}, {"pre": ("--debug",)}):
        env = {k: v for k, v in how.items() if k != "pre"}
        results = two_ranks(data_dir, tmp_path, "--local-batch", "0", pre=how.get("pre", ()), **env)
        for rank, (rc, err) in enumerate(results):
            assert rc == 2, err
            assert f"[rank {rank}/2 " in err and "--local-batch must be >= 1, got 0" in err, err
            assert "Traceback" in err and "TrainConfigError" in err, err


def test_unexpected_error_keeps_traceback_and_names_each_rank(data_dir, tmp_path):
    """A bug's path: an exception no check expects, raised by the loss of the first forward pass
    (a sitecustomize on PYTHONPATH replaces F.cross_entropy; bad labels, which this test once
    used, are now an expected error of load_prepared)."""
    bug = tmp_path / "bug"
    bug.mkdir()
    (bug / "sitecustomize.py").write_text(
        "import torch.nn.functional as F\n\n\n"
        "class InjectedBug(Exception):\n    pass\n\n\n"
        "def cross_entropy(*args, **kwargs):\n"
        "    raise InjectedBug('the loss is broken (tests/test_errors.py)')\n\n\n"
        "F.cross_entropy = cross_entropy\n"
    )
    path = os.pathsep.join(p for p in (str(bug), os.environ.get("PYTHONPATH", "")) if p)
    for rank, (rc, err) in enumerate(two_ranks(data_dir, tmp_path / "out", PYTHONPATH=path)):
        assert rc == 1, err
        assert f"[rank {rank}/2 " in err and "training failed: InjectedBug" in err, err
        assert "Traceback" in err and "the loss is broken" in err, err


def test_launch_adds_no_noise_to_an_expected_error(tmp_path):
    """Through `scalestudy launch` (torchrun's agent): our ranks print one line; the agent's
    lines (without our `[rank r/W host]` prefix: its `rank r of W exited 2`) are the launcher's."""
    cmd = [PYTHON, "-m", "scalestudy", "launch", "--ranks-per-node", "2", "--", *FLAGS]
    cmd += ["--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("[rank ")]
    assert len(ours) == 1 and ours[0].startswith("[rank 0/2 "), proc.stderr
    assert "scalestudy prepare-data --dataset synthetic --data-dir" in ours[0]
    assert proc.stdout.splitlines()[0].startswith("+ ") and len(proc.stdout.splitlines()) == 1


@pytest.mark.parametrize(
    "rank, local_rank, scope, prints",
    [
        (0, 0, "run", True),
        (1, 1, "run", False),
        (2, 0, "run", False),
        (2, 0, "node", True),
        (1, 1, "node", False),
        (1, 1, "rank", True),
    ],
)
def test_who_reports_an_expected_error(monkeypatch, rank, local_rank, scope, prints):
    monkeypatch.delenv(log.DEBUG_ENV, raising=False)
    try:
        log.setup(rank=rank, world_size=4, local_rank=local_rank)
        assert log.reports(scope) is prints
        monkeypatch.setenv(log.DEBUG_ENV, "1")
        assert log.reports(scope)  # under SCALESTUDY_DEBUG every rank prints
    finally:
        log.setup()


@pytest.mark.parametrize("buffered", [True, False])
def test_progress_to_a_closed_pipe_is_dropped_without_a_traceback(buffered):
    """With stdout piped to a reader that is gone (`| head -0`) every message printed a
    '--- Logging error ---' traceback on stderr; a warning still reaches stderr, and the
    interpreter's last flush says nothing either."""
    env = child_env()
    if buffered:  # as in a shell's pipe; child_env makes the output unbuffered
        del env["PYTHONUNBUFFERED"]
    script = (
        "from scalestudy import log\n"
        "logger = log.setup()\n"
        "for i in range(3):\n"
        "    logger.info(f'epoch {i}')\n"
        "logger.warning('still heard')\n"
    )
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        proc = subprocess.run(
            [PYTHON, "-c", script],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (0, "still heard\n"), proc.stderr


def test_the_silent_ranks_grace_period_can_be_set(monkeypatch, caplog):
    from scalestudy.trainer import train

    monkeypatch.delenv("SCALESTUDY_REPORT_GRACE_S", raising=False)
    assert train.report_grace_s() == train.REPORT_GRACE_S == 10.0
    monkeypatch.setenv("SCALESTUDY_REPORT_GRACE_S", "2.5")
    assert train.report_grace_s() == 2.5
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv("SCALESTUDY_REPORT_GRACE_S", bad)
        caplog.clear()
        assert train.report_grace_s() == 10.0
        assert f"SCALESTUDY_REPORT_GRACE_S={bad!r} is not a number of seconds" in caplog.text


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stop_on_a_signal_is_said_by_rank_0_alone(monkeypatch, capsys, tmp_path, rank):
    """SIGUSR1/SIGTERM reach every task, every rank stops after the same epoch and raises
    Preempted: its "stopped on ... rerun the same command" line came once per rank."""
    from scalestudy.errors import Preempted
    from scalestudy.trainer import checkpoint, train
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer.config import TrainConfig

    def stopped(*_):
        raise Preempted(3, "SIGUSR1", tmp_path / "epoch-0003")

    for name in ("preflight", "pick_device", "pick_backend", "preload_dynamo"):
        monkeypatch.setattr(train, name, lambda *a: None)
    monkeypatch.setattr(train.sdist, "init_process_group", lambda *a: None)
    monkeypatch.setattr(train.progress, "start", lambda *a: None)
    monkeypatch.setattr(train, "train", stopped)
    monkeypatch.delenv(log.DEBUG_ENV, raising=False)
    denv = sdist.DistEnv("torchrun", rank, 2, rank, 2, 0, 1, "127.0.0.1", 29500)
    try:
        log.setup(rank=rank, world_size=2, local_rank=rank)
        assert train.main(TrainConfig(out=str(tmp_path)), denv) == checkpoint.PREEMPTED_EXIT
    finally:
        log.setup()
    err = capsys.readouterr().err
    said = "stopped on SIGUSR1 after epoch 3; checkpoint"
    assert err.count(said) == (1 if rank == 0 else 0), err


@pytest.mark.parametrize("flag", ["out", "data_dir"])
def test_an_empty_directory_flag_is_refused(flag):
    """--out '' wrote metrics.json into the current directory; --data-dir '' read ./<dataset>."""
    from scalestudy.errors import TrainConfigError
    from scalestudy.trainer.config import TrainConfig

    for empty in ("", "  "):
        with pytest.raises(TrainConfigError) as info:
            TrainConfig(**{flag: empty})
        assert str(info.value) == f"--{flag.replace('_', '-')} must not be empty"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("lr", -0.1, "--lr must be > 0, got -0.1"),
        ("lr", 0.0, "--lr must be > 0, got 0.0"),
        ("momentum", -0.5, "--momentum must be in [0, 1), got -0.5"),
        ("momentum", 1.5, "--momentum must be in [0, 1), got 1.5"),
        # argparse's float() takes "nan" and "inf": NaN passes every bound, inf most
        ("lr", float("nan"), "--lr must be a finite number, got nan"),
        ("bucket_cap_mb", float("inf"), "--bucket-cap-mb must be a finite number, got inf"),
        # past 2**63 - 1 torch.manual_seed overflowed with a traceback; < 0 the study refuses
        ("seed", 2**63, f"--seed must be in [0, 2**63 - 1], got {2**63}"),
        ("seed", -1, "--seed must be in [0, 2**63 - 1], got -1"),
    ],
)
def test_optimizer_flags_out_of_range_are_refused_before_training(flag, value, message):
    """torch.optim.SGD refused a negative --lr or --momentum only once the model was built, with
    a traceback (and the scaled lr in it); lr 0 and momentum >= 1 passed silently."""
    from scalestudy.errors import TrainConfigError
    from scalestudy.trainer.config import TrainConfig

    with pytest.raises(TrainConfigError) as info:
        TrainConfig(**{flag: value})
    assert str(info.value) == message


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_writes_get_the_mode_of_a_plain_new_file(tmp_path, umask, mode):
    """mkstemp creates 0600 and the rename kept it: on a shared project directory the group
    could read none of the CSVs, reports or prepared data. Now 0666 less the umask."""

    old = os.umask(umask)
    try:
        files.write_text(tmp_path / "a.csv", "x\n")
        plain = tmp_path / "plain.csv"
        plain.write_text("x\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.csv").stat().st_mode & 0o777 == mode == plain.stat().st_mode & 0o777


def test_an_atomic_rewrite_keeps_the_files_mode_and_its_symlink(tmp_path):
    """A rewrite made a file kept 0600 on purpose 0644 (the umask's), and replaced a symlinked
    output with a regular file, leaving the file it pointed to as it was."""
    private = tmp_path / "token.json"
    private.write_text("old\n")
    private.chmod(0o600)
    files.write_text(private, "new\n")
    assert (private.read_text(), private.stat().st_mode & 0o777) == ("new\n", 0o600)

    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "runs.tsv"
    real.write_text("old\n")
    link = tmp_path / "runs.tsv"
    link.symlink_to("store/runs.tsv")  # relative, into another directory
    files.write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == "store/runs.tsv"
    assert real.read_text() == "new\n"
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["runs.tsv"]  # no temp


def test_an_atomic_write_names_its_target_and_takes_any_valid_name(tmp_path, monkeypatch):
    """A failed write named the random temp file ("/sys/.runs.tsv.qsfcp9yw.tmp: Permission
    denied"), and the temp name's 14 more characters made a valid 247-255 character name
    "File name too long"."""
    for length in (241, 255):
        files.write_text(tmp_path / ("a" * length), "x\n")
        assert (tmp_path / ("a" * length)).read_text() == "x\n"
    assert sorted(len(p.name) for p in tmp_path.iterdir()) == [241, 255]  # no temp file left

    real_open = os.open

    def refused(file, *args, **kwargs):  # the kernel's answer in a directory it may not write
        if str(file).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(PermissionError) as info:
        files.write_text(tmp_path / "runs.tsv", "x\n")
    assert (info.value.filename, info.value.filename2) == (str(tmp_path / "runs.tsv"), None)
    assert str(info.value) == (
        f"[Errno 13] cannot create a temporary file in {tmp_path} (the write is atomic: it "
        f"needs write permission on the directory): '{tmp_path / 'runs.tsv'}'"
    )


def test_an_atomic_write_to_a_pipe_writes_into_the_pipe(tmp_path):
    """atomic_open renamed its temp file over any target: a named pipe given as the output was
    replaced by a regular file, and what listened on the pipe got nothing."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer's open returns
    try:
        files.write_text(pipe, "through the pipe\n")
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert got == b"through the pipe\n"
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temp file left


def write_to_descriptor(target: str, stdout) -> subprocess.CompletedProcess:
    """A process that prints a line, writes `target` with files.write_text, prints another."""
    code = (
        "from scalestudy import files; print('before'); "
        f"files.write_text({target!r}, 'written\\n'); print('after')"
    )
    return subprocess.run(
        [PYTHON, "-c", code], env=child_env(), stdout=stdout, stderr=subprocess.PIPE, timeout=60
    )


@pytest.mark.parametrize("target", ["/dev/stdout", "/dev/fd/1"])
def test_an_atomic_write_to_stdout_goes_through_the_pipe_or_the_redirected_file(tmp_path, target):
    """`scalestudy plan --out-md /dev/stdout | cat` failed: its realpath on a pipe,
    /proc/<pid>/fd/pipe:[N], names no file ("No such file or directory"). Redirected to a file,
    the file was replaced by a rename (what was printed before and after went to the unlinked
    one); a plain open() would truncate it and the later lines write over the start."""
    r = write_to_descriptor(target, subprocess.PIPE)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"before\nwritten\nafter\n", b"")
    out = tmp_path / "out.txt"
    for mode, prior in (("w", b""), ("a", b"prior\n")):  # `> out.txt` and `>> out.txt`
        out.write_bytes(prior)
        inode = out.stat().st_ino
        with open(out, mode) as stdout:
            r = write_to_descriptor(target, stdout)
        assert (r.returncode, r.stderr) == (0, b"")
        assert out.read_bytes() == prior + b"before\nwritten\nafter\n", mode
        assert out.stat().st_ino == inode  # written through, not replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temp file left


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--config", "config/demo.yaml", "--out-md", "/dev/null", "--out-csv"],
        ["matrix", "--config", "config/demo.yaml", "--out"],
    ],
)
def test_an_output_to_stdout_gets_no_progress_line_in_it(tmp_path, argv):
    """`plan --out-csv /dev/stdout > plan.csv`: the command's progress lines (stdout) came
    after the table in the same stream, so what a caller read back was no CSV ("26 columns in
    the header but 2 cells here"). With an output on this process's stdout they go to stderr."""
    r = subprocess.run(
        [PYTHON, "-m", "scalestudy", *argv, "/dev/stdout"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    columns = header.count("," if argv[0] == "plan" else "\t")
    assert rows and all(row.count("," if argv[0] == "plan" else "\t") >= columns for row in rows)
    assert "/dev/stdout" in r.stderr  # the progress line, there


def python_c(code: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """`python -c code` from the repository root with the tests' environment, its output text."""
    return subprocess.run(
        [PYTHON, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=timeout, **kwargs,
    )  # fmt: skip


def test_a_closed_stdout_is_no_traceback(tmp_path):
    """`scalestudy plan ... >&-`: Python has no sys.stdout, so logging printed a traceback per
    progress line and the flush at the end an AttributeError: exit 1 for work that was done."""
    code = "import os, sys; os.close(1); sys.stdout = None; from scalestudy import cli; "
    code += "sys.exit(cli.main(['plan', '--config', 'config/demo.yaml', '--out-md', "
    code += f"{str(tmp_path / 'p.md')!r}, '--out-csv', {str(tmp_path / 'p.csv')!r}]))"
    r = python_c(code)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "p.csv").exists() and (tmp_path / "p.md").exists()
    # the run table to a closed stdout: nowhere to go, one line
    code = "import os, sys; os.close(1); sys.stdout = None; from scalestudy import cli; "
    code += "sys.exit(cli.main(['matrix', '--config', 'config/demo.yaml']))"
    r = python_c(code)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("scalestudy matrix: stdout: closed")


def matrix_to(out: Path) -> subprocess.CompletedProcess:
    """`scalestudy matrix` of the demo study, its run table written to `out`."""
    argv = [PYTHON, "-m", "scalestudy", "matrix", "--config", "config/demo.yaml", "--out", str(out)]
    return subprocess.run(
        argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )


def test_an_output_that_is_a_device_stays_the_device(tmp_path):
    """`--out /dev/null` as root replaced /dev/null with a regular file holding the table (every
    later program's output then went into it); as another user it failed with "Permission
    denied", where a plain open() works. Here a private null device made with mknod, and a
    symlink to it."""
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as exc:
        need("a device node of its own (mknod)", f"run the tests as root (CI does): {exc}")
    (tmp_path / "link").symlink_to("null")
    for out in (null, tmp_path / "link"):
        r = matrix_to(out)
        assert r.returncode == 0, r.stderr
        assert stat.S_ISCHR(os.lstat(null).st_mode), out
        assert os.lstat(null).st_rdev == os.makedev(1, 3)
        assert (tmp_path / "link").is_symlink()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "null"]  # no temp file
    with open(null, "w") as f:  # still the null device: what is written there is gone
        f.write("hello\n")
    assert null.read_text() == ""


def test_a_full_disk_is_one_line_naming_the_file(tiny_fs, tmp_path):
    """A write to a full disk raised ENOSPC naming no file, which cli.main takes for a bug: a
    traceback and exit 1, not its one line. A real full tmpfs (the temp file's write fails),
    and a private /dev/full made with mknod (written in place, as a device is)."""
    with open(tiny_fs / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 16))
            f.flush()
    outs = [tiny_fs / "runs.tsv"]
    with contextlib.suppress(OSError):
        os.mknod(tmp_path / "full", stat.S_IFCHR | 0o666, os.makedev(1, 7))
        outs.append(tmp_path / "full")
    for out in outs:
        r = matrix_to(out)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == f"scalestudy matrix: {out}: No space left on device"
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler"]  # no temp file left


def test_a_run_rules_log_says_what_went_wrong(tmp_path):
    """The workflow's `run:` rules (matrix, plan, proposal) wrote their log only after success:
    on an error Snakemake pointed at an empty log file."""
    from scalestudy import log
    from scalestudy.errors import AnalysisError

    path = tmp_path / "logs" / "proposal.log"
    with pytest.raises(AnalysisError), log.rule_log(path, ["reports/proposal.md"]):
        raise AnalysisError("proposal.md.j2 prints a number that is no CSV cell: 0.93")
    text = path.read_text()
    assert text.startswith("AnalysisError: proposal.md.j2 prints a number that is no CSV cell")
    assert "Traceback" in text
    with log.rule_log(path, ["a.csv", "b.md"]):
        pass
    assert path.read_text() == "wrote a.csv b.md\n"
    # a warning of the block went to Snakemake's console only: the log said just "wrote"
    with log.rule_log(path, ["reports/proposal.pdf"]):
        log.get("results.render_report").warning("WARNING pdfLaTeX cannot set 2 characters")
        log.get("results.proposal").info("an info line stays on the console")
    assert path.read_text() == (
        "WARNING pdfLaTeX cannot set 2 characters\nwrote reports/proposal.pdf\n"
    )
    with pytest.raises(AnalysisError), log.rule_log(path, ["reports/proposal.md"]):
        log.get("results.proposal").warning("WARNING first this")
        raise AnalysisError("then this")
    assert path.read_text().startswith("WARNING first this\nAnalysisError: then this\n")


def test_a_path_the_command_cannot_use_is_one_line_naming_it(tmp_path, monkeypatch):
    """An OSError about a path (here an output path that is a directory) is one line with the
    path and the cause, exit 2, nothing left behind; --debug adds the traceback. An OSError
    without a path is a bug and keeps its traceback."""
    out = tmp_path / "runs.tsv"
    out.mkdir()
    argv = [PYTHON, "-m", "scalestudy", "matrix", "--config", "config/demo.yaml", "--out", str(out)]
    repo = REPO
    r = matrix_to(out)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"scalestudy matrix: {out}: Is a directory", r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.tsv"]  # no temporary file left
    r = subprocess.run(
        [*argv[:3], "--debug", *argv[3:]], cwd=repo, env=child_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" in r.stderr and "IsADirectoryError" in r.stderr

    from scalestudy import cli
    from scalestudy.study import matrix

    def no_path(args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(matrix, "run", no_path)
    with pytest.raises(OSError, match="Input/output error"):
        cli.main(["matrix", "--config", "config/demo.yaml"])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["analyze", "--gpus-per-node", "0"], "scalestudy analyze: error: argument --gpus-per"),
        (["plot", "--figure", "nope"], "scalestudy plot: error: argument --figure: invalid choice"),
        (["profile", "parse"], "scalestudy profile parse: error: the following arguments are"),
        (["analyze", "--gpus-per-node", "1", "--no-such"], "scalestudy analyze: error: unrecogniz"),
        (["no-such-command"], "scalestudy: error: argument COMMAND: invalid choice"),
    ],
)
def test_a_bad_command_line_is_one_line_not_the_usage_block(capsys, argv, says):
    """argparse printed its usage block (10 lines for analyze) above the one line that says
    what is wrong; the line now ends with where the usage is."""
    from scalestudy import cli

    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(says), err
    # the help that lists the flags: the subcommand's (`scalestudy --help` lists the commands)
    assert err[0].endswith(f"`{says.partition(':')[0]} --help` shows the usage"), err


def test_what_a_nodes_hardware_or_the_run_refuses_is_said_once_per_node_or_run(monkeypatch):
    """The refusals every rank of a node finds alike (no CUDA, a CUDA-only precision or graph
    mode, NCCL on a CPU, NHWC on a CPU) had scope "rank": one copy per rank, 8 per node. Their
    scope is "node" now (its local rank 0 says it), and the --cuda-graphs step refusal of a run
    too short for the graph, the same on every rank, is "run"."""
    import torch

    from scalestudy.errors import TrainingError
    from scalestudy.trainer import compiling, numerics, train
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer.config import TrainConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    denv = sdist.DistEnv("torchrun", 1, 2, 1, 2, 0, 1, "127.0.0.1", 29500)
    cpu = torch.device("cpu")
    refusals = [
        lambda: train.pick_device(TrainConfig(device="cuda"), denv),
        lambda: train.pick_device(TrainConfig(device="cpu", precision="fp16"), denv),
        lambda: train.pick_device(TrainConfig(device="cpu", cuda_graphs="step"), denv),
        lambda: train.pick_backend(TrainConfig(backend="nccl"), cpu),
        lambda: numerics.configure(TrainConfig(channels_last="on"), cpu),
    ]
    for refuse in refusals:
        with pytest.raises(TrainingError) as info:
            refuse()
        assert info.value.scope == "node", info.value
    with pytest.raises(TrainingError, match="--cuda-graphs step") as info:
        compiling.graphs_mode(TrainConfig(cuda_graphs="step"), cpu, total_steps=1)
    assert info.value.scope == "run"


@pytest.mark.parametrize(
    ("argv", "buffered"),
    [
        (["matrix", "--config", "config/demo.yaml", "--out", "/dev/stdout"], False),
        (["plan", "--config", "config/demo.yaml", "--out-md", "/dev/stdout"], False),
        (["inventory", "--out", "/dev/stdout"], False),
        (["container", "digest", "IMAGE"], True),  # one print(), flushed at exit
    ],
)
def test_a_reader_gone_before_the_output_ends_the_command_quietly(tmp_path, argv, buffered):
    """`scalestudy plan --out-md /dev/stdout | head -1`: a traceback (BrokenPipeError), or
    "inventory: /dev/stdout: Broken pipe" (exit 2), or for a print() flushed at exit "Exception
    ignored ... BrokenPipeError" and exit 120. Now nothing, and 141, a shell's status for a
    tool that SIGPIPE ended (its later outputs, plan's --out-csv, were not written)."""
    from scalestudy import cli

    image = tmp_path / "trainer.sif"
    image.write_bytes(b"an image\n")
    argv = [str(image) if a == "IMAGE" else a for a in argv]
    env = child_env()
    if buffered:  # as in a shell's pipe; child_env makes the output unbuffered
        del env["PYTHONUNBUFFERED"]
    if argv[0] == "plan":
        argv += ["--out-csv", str(tmp_path / "plan.csv")]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first byte
    try:
        proc = subprocess.run(
            [PYTHON, "-m", "scalestudy", *argv],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, ""), proc.stderr
    assert cli.SIGPIPE_EXIT == 141
    assert not (tmp_path / "plan.csv").exists()


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys):
    """Ctrl-C escaped cli.main as a KeyboardInterrupt: a traceback (74 lines a rank in a
    training run) and exit 1. Now one line and 130; --debug keeps the traceback. A Python
    caller of main() gets 130 returned (only the program kills itself with SIGINT at exit)."""
    from scalestudy import cli
    from scalestudy.study import matrix

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "run", interrupted)
    monkeypatch.delenv(log.DEBUG_ENV, raising=False)
    argv = ["matrix", "--config", str(REPO / "config/demo.yaml")]

    def main() -> int:
        try:
            return cli.main(argv)
        except KeyboardInterrupt:  # else it ended the test session
            pytest.fail("the KeyboardInterrupt escaped cli.main")

    try:
        assert main() == 130
        assert capsys.readouterr().err == "scalestudy matrix: interrupted\n"
        monkeypatch.setenv(log.DEBUG_ENV, "1")  # what --debug sets
        assert main() == cli.INTERRUPTED_EXIT == 130
        err = capsys.readouterr().err
    finally:
        log.setup()
    assert err.startswith("scalestudy matrix: interrupted\nTraceback")
    assert err.rstrip().endswith("KeyboardInterrupt")
    assert not log._interrupted


@pytest.mark.parametrize("ranks", [1, 2])
def test_ctrl_c_in_training_is_one_line_from_rank_0(data_dir, tmp_path, ranks):
    """Ctrl-C (SIGINT) in `scalestudy train`: a 74-line traceback on every rank and exit 1.
    Now rank 0 says it in one line and the rank ends killed by SIGINT (a shell's status 130,
    and a shell loop over runs stops, as for any program Ctrl-C ends); under torchrun, which
    passes the SIGINT on to every worker, the others are silent. torchrun's own traceback of
    its SignalException is torchrun's."""
    cmd = [PYTHON, "-m", "scalestudy", "train"]
    if ranks == 2:
        cmd[1:2] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
    cmd += ["--dataset", "synthetic", "--width", "4", "--local-batch", "32", "--epochs", "1000"]
    cmd += ["--warmup-steps", "1", "--comm-probe-steps", "0"]
    cmd += ["--data-dir", str(data_dir), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(
        cmd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        assert proc.stdout.readline()  # rank 0's first progress line: the run is under way
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    ours = [line for line in err.splitlines() if line.startswith("[rank")]
    assert len(ours) == 1 and re.fullmatch(
        rf"\[rank 0/{ranks} \S+\] scalestudy train: interrupted", ours[0]
    ), err
    assert "KeyboardInterrupt" not in err, err
    if ranks == 1:
        assert (proc.returncode, err) == (-signal.SIGINT, ours[0] + "\n")
    else:
        assert proc.returncode != 0


def test_a_failure_after_ctrl_c_is_the_interrupt():
    """Ctrl-C reaches every rank; one waiting in a collective when its interrupted peer exited
    saw the collective fail ("Connection closed by peer": "training failed", a hang diagnosis
    and a traceback on that rank), the KeyboardInterrupt raised inside torch's C++ wait lost.
    The rank remembers the SIGINT, and the failure after it is the interrupt."""
    from scalestudy.trainer import train

    # Python's own handler, as in a foreground run: this test process may be a background job
    # that inherited SIGINT ignored (then Interrupt leaves it so, and the test was skipped)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _failure_after_ctrl_c(train)
    finally:
        signal.signal(signal.SIGINT, previous)


def _failure_after_ctrl_c(train) -> None:
    with train.Interrupt() as interrupt:
        with contextlib.suppress(KeyboardInterrupt):  # what torch's wait did with it
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs at once
        lost = RuntimeError("Connection closed by peer [127.0.0.1]:29500")
        with pytest.raises(KeyboardInterrupt) as info:
            interrupt.check(lost)
    assert info.value.__cause__ is lost
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # as it was
    with train.Interrupt() as calm:
        calm.check(lost)  # no SIGINT: the failure is the failure (the caller goes on)


def test_a_ctrl_c_while_the_command_imports_is_held_until_the_imports_are_done():
    """Ctrl-C 0.3-0.45 s after a rank starts lands in `import torch`: torch's NumPy set-up
    swallowed the KeyboardInterrupt and left numpy.linalg half-imported, and the rank failed
    later with "cannot start: maximum recursion depth exceeded", the launch quiet after it (it
    expects rank 0's "interrupted"). The SIGINT is now held while the command's modules import
    and raised after: the imports whole, the one "interrupted" line, the death by SIGINT.
    Here the SIGINT comes inside build_parser (the command's imports) of a real `scalestudy`
    program, which goes on importing for 0.3 s after it."""
    script = (
        "import os, signal, sys, time\n"
        "from scalestudy import cli\n"
        "built = cli.build_parser\n"
        "def build_parser(argv):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.3)  # an import going on\n"
        "    print('imports done', flush=True)\n"
        "    return built(argv)\n"
        "cli.build_parser = build_parser\n"
        "sys.argv = ['scalestudy', 'matrix', '--config', 'config/demo.yaml', '--out', '-']\n"
        "raise SystemExit(cli.main())\n"
    )
    done = python_c(script, preexec_fn=sigint_as_in_a_terminal)
    assert done.stdout == "imports done\n", (done.stdout, done.stderr[-2000:])
    assert done.stderr.strip().splitlines()[-1:] == ["scalestudy matrix: interrupted"], done.stderr
    assert done.returncode == -signal.SIGINT
    # a second Ctrl-C is not held: an import that hangs (a stalled mount) can still be stopped
    twice = script.replace(
        "    time.sleep(0.3)  # an import going on\n",
        "    time.sleep(0.3)\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(30)\n",
    )
    assert twice != script
    done = python_c(twice, timeout=20, preexec_fn=sigint_as_in_a_terminal)
    assert done.stdout == "" and done.returncode == -signal.SIGINT, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1:] == ["scalestudy matrix: interrupted"], done.stderr


def test_a_stop_signal_that_c_code_swallowed_still_stops_the_command():
    """A SIGTERM inside a command's lazy `import torch` (inventory's) raised cli's Stopped where
    torch's C code imports NumPy, which swallowed it: the command went on, wrote its output and
    exited 0, and every later SIGTERM was ignored (the first had been taken). Here a real
    `scalestudy` program whose command swallows it as that import did: it ends as stopped, one
    line, death by SIGTERM."""
    script = (
        "import os, signal, sys\n"
        "from scalestudy import cli\n"
        "from scalestudy.study import matrix\n"
        "run = matrix.run\n"
        "def swallowing(args):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    except KeyboardInterrupt:\n"
        "        print('swallowed', flush=True)\n"
        "    return run(args)\n"
        "matrix.run = swallowing\n"
        "sys.argv = ['scalestudy', 'matrix', '--config', 'config/demo.yaml', '--out', os.devnull]\n"
        "raise SystemExit(cli.main())\n"
    )
    done = python_c(script)
    assert done.stdout.startswith("swallowed\n"), (done.stdout, done.stderr[-2000:])
    assert done.stderr.strip().splitlines()[-1:] == ["scalestudy matrix: stopped by SIGTERM"], (
        done.stderr
    )
    assert done.returncode == -signal.SIGTERM


def test_a_deleted_working_directory_is_one_line(tmp_path):
    """Every command has relative default paths: run from a directory deleted since (a study
    directory removed in another shell), each was a FileNotFoundError traceback naming no path."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        f"import os, sys\nos.chdir({str(gone)!r})\nos.rmdir({str(gone)!r})\n"
        "from scalestudy import cli\n"
        "sys.argv = ['scalestudy', 'plan']\n"
        "raise SystemExit(cli.main())\n"
    )
    done = python_c(script)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "scalestudy plan: the working directory no longer exists (deleted or moved): cd to the "
        "study's directory and run the command again"
    ], done.stderr


def test_a_failure_after_a_stop_signal_is_the_stop():
    """A stop signal to a run without checkpointing (the launch passes SIGTERM to every rank;
    cli's handler raises its Stopped): a rank waiting in a collective lost the Stopped inside
    torch's C++ wait, and its peer's exit failed the collective: "training failed" on that rank.
    The rank remembers the stop, and the failure after it is the stop. Here a STAND-IN for
    cli's handler (a KeyboardInterrupt naming the signal)."""
    from scalestudy.trainer import train

    class Stop(KeyboardInterrupt):
        pass

    def cli_handler(signum, frame):
        raise Stop(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, cli_handler)
    try:
        with train.Interrupt() as interrupt:
            with contextlib.suppress(KeyboardInterrupt):  # what torch's wait did with it
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs at once
            lost = RuntimeError("Connection closed by peer [127.0.0.1]:29500")
            with pytest.raises(Stop, match="SIGTERM") as info:
                interrupt.check(lost)
        assert info.value.__cause__ is lost
        assert signal.getsignal(signal.SIGTERM) is cli_handler  # as it was
        with train.Interrupt() as calm:
            calm.check(lost)  # no signal: the failure is the failure
    finally:
        signal.signal(signal.SIGTERM, previous)
