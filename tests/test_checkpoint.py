"""Checkpoints: atomic directories, checksums, keep-K, async snapshots, real disk-full and
read-only failures (a tmpfs), and exact resume of the real trainer after SIGTERM and kill -9."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import logging
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import PYTHON, SMALL, read_epochs, read_metrics, train
from workflow_helpers import child_env, need, sighup_as_in_a_terminal, worker_pids

from scalestudy.errors import CheckpointError, TrainConfigError
from scalestudy.trainer import checkpoint as ck
from scalestudy.trainer.config import TrainConfig

IDENTITY = {"config_hash": "abc", "world_size": 1}


def _state(n: int, value: float = 1.0) -> dict:
    return {"model": {"w": torch.full((n,), value)}, "progress": {"step": 7, "history": []}}


def _saver(d: Path, keep: int = 2, async_write: bool = True, identity=IDENTITY) -> ck.Checkpointer:
    return ck.Checkpointer(d, keep=keep, identity=identity, rank=0, async_write=async_write)


def test_keeps_the_newest_k_and_resumes_the_newest(tmp_path):
    saver = _saver(tmp_path)
    stalls = []
    for epoch in (1, 2, 3):
        saver.save(epoch, _state(10, float(epoch)))
        stalls.append(saver.stall_s)  # metrics.json's checkpoint_stall_s: the sum over saves
    assert 0 < stalls[0] < stalls[1] < stalls[2]
    assert saver.wait() is None
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["epoch-0002", "epoch-0003"]
    path, manifest = ck.find_latest(tmp_path, IDENTITY)
    assert path.name == "epoch-0003" and manifest["epoch"] == 3 and manifest["step"] == 7
    assert set(manifest["files"]) == {"state.pt"}
    assert torch.equal(ck.load_state(path)["model"]["w"], torch.full((10,), 3.0))
    assert not list(tmp_path.glob(".partial-*"))


def test_a_ctrl_c_during_a_synchronous_save_interrupts_the_run(tmp_path, monkeypatch):
    """The write's `except BaseException` (torch's DCP CheckpointException is one) also caught
    KeyboardInterrupt: with --no-checkpoint-async a Ctrl-C during a save became "cannot write
    checkpoint ...: KeyboardInterrupt" an epoch later, or, in the last save, nothing: the run
    ended with exit 0. It interrupts now, and the checkpoints written before stay."""
    saver = _saver(tmp_path, async_write=False)
    saver.save(1, _state(4))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        saver.save(2, _state(4))
    assert saver.error is None and saver.saved == [1]
    monkeypatch.undo()
    assert ck.find_latest(tmp_path, IDENTITY)[0].name == "epoch-0001"


def test_a_ctrl_c_in_torch_saves_writes_stays_an_interrupt(tmp_path, monkeypatch):
    """torch.save turns a KeyboardInterrupt raised in its writes into RuntimeError("enforce
    fail at inline_container.cc"): reported as a failed checkpoint write, not an interrupt."""

    class Interrupted(io.BytesIO):
        def write(self, b):
            if self.tell() > 1000:
                raise KeyboardInterrupt
            return super().write(b)

    monkeypatch.setattr(ck.io, "BytesIO", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        ck.write_checkpoint(tmp_path, 1, _state(100_000), {})
    assert not list(tmp_path.iterdir())  # the partial directory removed


def test_async_save_snapshots_before_returning(tmp_path):
    """Training keeps changing its tensors while the thread writes: the checkpoint holds the
    values of the moment save() returned."""
    saver = _saver(tmp_path)
    state = _state(2_000_000, 1.0)
    saver.save(1, state)
    state["model"]["w"].add_(1.0)  # the next optimizer step, while the write is in flight
    assert saver.wait() is None
    assert torch.equal(ck.load_state(tmp_path / "epoch-0001")["model"]["w"], torch.ones(2_000_000))


@pytest.mark.parametrize(
    "damage", ["truncate", "flip", "manifest", "manifest-array", "manifest-entry"]
)
def test_corrupted_newest_is_skipped_with_a_warning_naming_the_file(tmp_path, damage):
    saver = _saver(tmp_path, keep=3, async_write=False)
    saver.save(1, _state(1000, 1.0))
    saver.save(2, _state(1000, 2.0))
    newest = tmp_path / "epoch-0002"
    if damage == "truncate":  # a write cut short by a crash outside our atomic rename
        bad = newest / "state.pt"
        bad.write_bytes(bad.read_bytes()[:100])
    elif damage == "flip":  # same size, one byte changed: only the checksum sees it
        bad = newest / "state.pt"
        data = bytearray(bad.read_bytes())
        data[len(data) // 2] ^= 0xFF
        bad.write_bytes(bytes(data))
    elif damage == "manifest":
        bad = newest / "manifest.json"
        bad.write_text("{not json")
    elif damage == "manifest-array":  # valid JSON, but not an object
        bad = newest / "manifest.json"
        bad.write_text("[]")
    else:  # an object whose file entry lacks its size
        bad = newest / "manifest.json"
        manifest = json.loads(bad.read_text())
        del manifest["files"]["state.pt"]["bytes"]
        bad.write_text(json.dumps(manifest))
    warnings: list[str] = []
    path, _ = ck.find_latest(tmp_path, IDENTITY, warn=warnings.append)
    assert path.name == "epoch-0001"
    assert len(warnings) == 1 and str(bad) in warnings[0], warnings
    # the next save prunes, reading the same manifest: it must cope with it too
    saver.save(3, _state(10))
    assert saver.wait() is None


def test_a_file_system_that_cannot_sync_a_directory_still_takes_checkpoints(tmp_path, monkeypatch):
    """fsync of a directory refused with EINVAL (some network and FUSE file systems): files.py's
    writes take it as no failed write, so the start-up checks passed, and then every
    checkpoint failed and the run ended at its first epoch."""
    real = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ck.write_checkpoint(tmp_path, 1, _state(100, 1.0), {})
    assert ck.verify(tmp_path / "epoch-0001")["epoch"] == 1


def test_an_unreadable_newest_is_skipped_with_a_warning_naming_the_file(tmp_path, monkeypatch):
    """A read error (EIO of a damaged disk, a Lustre target down) of the newest state.pt was
    no CheckpointError: every retry of the run died at start-up, the older one never used."""
    saver = _saver(tmp_path, keep=3, async_write=False)
    saver.save(1, _state(1000, 1.0))
    saver.save(2, _state(1000, 2.0))
    bad = tmp_path / "epoch-0002" / "state.pt"
    real = ck.sha256

    def sha256(path):
        if Path(path) == bad:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path)

    monkeypatch.setattr(ck, "sha256", sha256)
    warnings: list[str] = []
    path, _ = ck.find_latest(tmp_path, IDENTITY, warn=warnings.append)
    assert path.name == "epoch-0001"
    assert len(warnings) == 1 and str(bad) in warnings[0] and "Input/output" in warnings[0]


def test_a_save_after_resuming_below_a_corrupted_checkpoint_survives_pruning(tmp_path):
    """keep=1 and epoch-0006 corrupted: the run resumes from 0004 and saves 0005, the only good
    checkpoint after 0004. It stays; the superseded 0006 goes (it used to be the other way)."""
    first = _saver(tmp_path, keep=3, async_write=False)
    first.save(4, _state(10, 4.0))
    first.save(6, _state(10, 6.0))
    bad = tmp_path / "epoch-0006" / "state.pt"
    bad.write_bytes(bad.read_bytes()[:100])
    warnings: list[str] = []
    assert ck.find_latest(tmp_path, IDENTITY, warn=warnings.append)[0].name == "epoch-0004"
    resumed = _saver(tmp_path, keep=1)
    resumed.save(5, _state(10, 5.0))
    assert resumed.wait() is None
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["epoch-0005"]
    path, _ = ck.find_latest(tmp_path, IDENTITY)
    assert torch.equal(ck.load_state(path)["model"]["w"], torch.full((10,), 5.0))


def test_a_checkpoint_without_a_readable_manifest_is_not_one_of_the_k_kept(tmp_path):
    """keep=2 promises a fallback behind the newest: an unreadable manifest (never resumable:
    verify refuses it) counted as one, and the good checkpoint before it was deleted."""
    saver = _saver(tmp_path, keep=3, async_write=False)
    for epoch in (1, 2):
        saver.save(epoch, _state(10, float(epoch)))
    (tmp_path / "epoch-0002" / "manifest.json").write_text("{not json")
    resumed = _saver(tmp_path, keep=2, async_write=False)
    resumed.save(3, _state(10, 3.0))
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["epoch-0001", "epoch-0003"]
    (tmp_path / "epoch-0003" / "state.pt").write_bytes(b"")  # the newest lost too
    path, _ = ck.find_latest(tmp_path, IDENTITY, warn=lambda _: None)
    assert torch.equal(ck.load_state(path)["model"]["w"], torch.full((10,), 1.0))


def test_checkpoint_of_another_configuration_is_never_resumed(tmp_path):
    _saver(tmp_path, async_write=False).save(1, _state(10))
    other = {"config_hash": "different", "world_size": 1}
    warnings: list[str] = []
    assert ck.find_latest(tmp_path, other, warn=warnings.append) is None
    assert "another configuration" in warnings[0] and "epoch-0001" in warnings[0]
    # the new run's first save removes the incompatible one
    _saver(tmp_path, async_write=False, identity=other).save(1, _state(10))
    assert ck.find_latest(tmp_path, IDENTITY, warn=warnings.append) is None
    assert ck.find_latest(tmp_path, other)[1]["config_hash"] == "different"
    # a manifest without a key of the run's identity (written before data_sha256 joined it) is
    # another identity too: it could hold other data
    newer = {**other, "data_sha256": "abc"}
    assert ck.find_latest(tmp_path, newer, warn=warnings.append) is None
    assert "'data_sha256': None" in warnings[-1]


def test_checkpoint_settings_are_not_experiment_identity():
    base = TrainConfig()
    moved = TrainConfig(
        checkpoint_dir="/x", checkpoint_every=3, checkpoint_keep=5, checkpoint_async=False
    )
    assert base.config_hash() == moved.config_hash()
    assert base.config_hash() != TrainConfig(lr=0.1).config_hash()


def test_an_ignored_local_batch_is_not_experiment_identity():
    """With --global-batch the local batch is derived from it and --local-batch ignored: the
    same training had a hash per --local-batch value, and its resume was refused."""
    a = TrainConfig(global_batch=512, local_batch=256)
    assert a.batches(1) == TrainConfig(global_batch=512, local_batch=64).batches(1)
    assert a.config_hash() == TrainConfig(global_batch=512, local_batch=64).config_hash()
    # without --global-batch it is the experiment's batch
    assert TrainConfig(local_batch=256).config_hash() != TrainConfig(local_batch=64).config_hash()


def test_the_process_group_timeout_is_not_experiment_identity():
    """--pg-timeout-s is how a run survives a hung rank, not what it measures: a rerun with a
    longer timeout started afresh and deleted the checkpoints it should have resumed."""
    assert TrainConfig().config_hash() == TrainConfig(pg_timeout_s=1200).config_hash()


@pytest.mark.parametrize(
    "argv",
    [
        ["--checkpoint-every", "5"],
        ["--checkpoint-every", "1"],
        ["--checkpoint-keep", "3"],
        ["--no-checkpoint-async"],
        ["--checkpoint-async"],
    ],
)
def test_checkpoint_flags_without_a_directory_are_refused(argv):
    """`scalestudy train --checkpoint-every 5` without --checkpoint-dir wrote no checkpoint and
    said nothing: the flag was silently ignored (an explicit 1 as much as a 5, and
    --no-checkpoint-async as much as --checkpoint-async)."""
    with pytest.raises(TrainConfigError) as info:
        TrainConfig.from_argv(argv)
    assert (
        str(info.value)
        == f"{' '.join(argv)} needs --checkpoint-dir: without it no checkpoint is written"
    )
    # with a directory, and without any of the flags, the defaults hold: every epoch, keep 2,
    # written in the background
    cfg = TrainConfig.from_argv(["--checkpoint-dir", "/x"])
    assert (cfg.checkpoint_every, cfg.checkpoint_keep, cfg.checkpoint_async) == (1, 2, True)
    ok = TrainConfig.from_argv([*argv, "--checkpoint-dir", "/x"])
    name = argv[0].removeprefix("--no-").removeprefix("--").replace("-", "_")
    assert getattr(ok, name) == (int(argv[1]) if argv[1:] else not argv[0].startswith("--no-"))
    # and without the directory, none of them is set: metrics.json records null, not a default
    # that did nothing
    bare = TrainConfig.from_argv([])
    assert (bare.checkpoint_every, bare.checkpoint_keep, bare.checkpoint_async) == (None,) * 3


def test_an_empty_checkpoint_dir_turns_checkpointing_off_and_drops_its_settings():
    """`--checkpoint-dir=` is how a caller (the workflow with checkpointing.enabled false) says
    "none": the every/keep/async it passes along are checked, then recorded as not in use."""
    argv = ["--checkpoint-dir=", "--checkpoint-every", "1", "--checkpoint-keep", "2"]
    cfg = TrainConfig.from_argv([*argv, "--no-checkpoint-async"])
    assert cfg.checkpoint_dir == ""
    assert (cfg.checkpoint_every, cfg.checkpoint_keep, cfg.checkpoint_async) == (None,) * 3
    with pytest.raises(TrainConfigError, match="--checkpoint-keep must be >= 1, got 0"):
        TrainConfig.from_argv([*argv, "--checkpoint-keep", "0"])
    with pytest.raises(TrainConfigError, match=r"--checkpoint-dir ' ' is blank: give a dir"):
        TrainConfig.from_argv(["--checkpoint-dir", " "])


def test_disk_full_gives_a_clear_error_and_keeps_earlier_checkpoints(tiny_fs):
    saver = _saver(tiny_fs, keep=1)
    saver.save(1, _state(1000))  # 4 kB: fits
    assert saver.wait() is None
    saver.save(2, _state(500_000))  # 2 MB: does not fit in 1 MiB
    error = saver.wait()
    assert isinstance(error, CheckpointError)
    assert "no space left" in str(error) and "epoch-0002" in str(error)
    assert "epoch-0001" in str(error)  # says what is still there
    path, _ = ck.find_latest(tiny_fs, IDENTITY)
    assert path.name == "epoch-0001"
    assert not list(tiny_fs.glob(".partial-*"))  # the half-written one is gone, space freed


def _failing_fs(monkeypatch, directory: Path, broken: dict) -> None:
    """A file system that fails with EIO (a network target down), as `broken` says: listing
    `directory` ("list") and opening a state.pt ("write")."""
    iterdir, open_ = Path.iterdir, Path.open

    def listing(self):
        if "list" in broken and self == directory:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return iterdir(self)

    def opening(self, *args, **kwargs):
        if "write" in broken and self.name == "state.pt":
            raise OSError(errno.EIO, "Input/output error", str(self))
        return open_(self, *args, **kwargs)

    monkeypatch.setattr(Path, "iterdir", listing)
    monkeypatch.setattr(Path, "open", opening)


@pytest.mark.parametrize("async_write", [True, False])
def test_a_write_that_fails_where_the_directory_cannot_be_listed_is_still_reported(
    tmp_path, monkeypatch, async_write
):
    """The error of a failed write lists the checkpoints left intact; where that listing
    failed too (EIO), its OSError escaped the handler: in the background thread the failure
    was lost (wait() said None, training went on as if checkpointed); a synchronous save raised
    a bare OSError on rank 0 alone, the others left in the agreement's all-reduce."""
    broken: set = set()
    _failing_fs(monkeypatch, tmp_path, broken)
    saver = _saver(tmp_path, async_write=async_write)
    broken |= {"list", "write"}
    saver.save(3, _state(10))  # kept, for the ranks' agreement (state.py) and the next save
    error = saver.wait()
    assert isinstance(error, CheckpointError), repr(error)
    said = str(error)
    assert said.startswith(f"cannot write checkpoint {tmp_path / 'epoch-0003'}: "), said
    assert "Input/output error" in said and f"cannot list {tmp_path}" in said, said
    broken.clear()
    assert not ck.list_checkpoints(tmp_path) and 3 not in saver.saved


def test_a_checkpoint_written_whose_old_ones_cannot_be_pruned_is_saved(
    tmp_path, monkeypatch, caplog
):
    """Pruning after the rename lists the directory; its failure (EIO) was reported as "cannot
    write checkpoint" of the checkpoint just written, and the next save raised it."""
    broken: set = set()
    _failing_fs(monkeypatch, tmp_path, broken)
    saver = _saver(tmp_path, keep=1, async_write=False)
    saver.save(1, _state(10))
    broken.add("list")
    with caplog.at_level(logging.WARNING):
        saver.save(2, _state(10))
    assert saver.wait() is None and saver.saved == [1, 2]
    assert f"checkpoint {tmp_path / 'epoch-0002'} written; older ones not removed" in caplog.text
    broken.clear()
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["epoch-0001", "epoch-0002"]


def test_a_failed_background_write_is_raised_by_the_next_save(tiny_fs):
    saver = _saver(tiny_fs, keep=1)
    saver.save(1, _state(500_000))  # 2 MB into 1 MiB: fails in the background thread
    with pytest.raises(CheckpointError, match="no space left") as failed:
        saver.save(2, _state(10))
    assert "epoch-0001" in str(failed.value)
    assert not ck.list_checkpoints(tiny_fs)  # nothing written on top of the failure


@pytest.mark.parametrize("async_write", [True, False])
def test_sharded_write_errors_name_the_cause(tiny_fs, one_rank_group, async_write):
    """A DCP shard write that fills the disk reports like any other write: path, cause, and the
    checkpoints still intact (async: kept for wait(); sync: raised by save())."""
    saver = _saver(tiny_fs, keep=2, async_write=async_write)
    saver.save(1, _state(10), sharded={"model": {"w": torch.zeros(10)}})
    assert saver.wait() is None
    big = {"model": {"w": torch.zeros(500_000)}}  # 2 MB of shards into 1 MiB
    if async_write:
        saver.save(2, _state(10), sharded=big)
        error = saver.wait()
    else:
        with pytest.raises(CheckpointError) as failed:
            saver.save(2, _state(10), sharded=big)
        error = failed.value
    assert isinstance(error, CheckpointError), repr(error)
    message = str(error)
    assert "no space left" in message and "epoch-0002" in message and "epoch-0001" in message
    assert not list(tiny_fs.glob(".partial-*"))
    assert ck.find_latest(tiny_fs, IDENTITY)[0].name == "epoch-0001"


@pytest.mark.parametrize("async_write", [True, False])
def test_a_sharded_save_that_cannot_make_its_directory_names_the_cause(
    tiny_fs, one_rank_group, async_write
):
    """FSDP's save made its partial directory (rank 0) outside every handler: a read-only or
    full file system was a bare OSError and a traceback on rank 0, the other ranks left in the
    barrier after it. It is the one-line CheckpointError of every failed write now, on each
    rank (rank 0's cause, broadcast)."""
    saver = _saver(tiny_fs, keep=2, async_write=async_write)
    saver.save(1, _state(10), sharded={"model": {"w": torch.zeros(10)}})
    assert saver.wait() is None
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    with pytest.raises(CheckpointError) as failed:
        saver.save(2, _state(10), sharded={"model": {"w": torch.zeros(10)}})
    message = str(failed.value)
    assert "no permission to write" in message and "epoch-0002" in message, message
    assert "epoch-0001" in message  # what is still intact
    assert ck.find_latest(tiny_fs, IDENTITY)[0].name == "epoch-0001"


def test_read_only_filesystem_gives_a_clear_error(tiny_fs):
    _saver(tiny_fs, async_write=False).save(1, _state(10))
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    saver = _saver(tiny_fs, async_write=False)
    saver.save(2, _state(10))
    assert isinstance(saver.error, CheckpointError)
    assert "no permission to write" in str(saver.error)
    assert ck.find_latest(tiny_fs, IDENTITY)[0].name == "epoch-0001"


# ---------------------------------------------------------------------------------------------
# the real trainer: stopped and resumed runs end with the same epochs as uninterrupted ones

EPOCHS = ["--epochs", "4", "--limit-train", "256", "--limit-test", "100"]
SAME = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr")


def _start(
    data_dir: Path, out: Path, *flags: str, nproc: int = 1, preexec_fn=None
) -> subprocess.Popen:
    launcher = [PYTHON, "-m", "scalestudy", "train"]
    if nproc > 1:
        launcher = [PYTHON, "-m", "torch.distributed.run", "--standalone"]
        launcher += [f"--nproc-per-node={nproc}", "-m", "scalestudy", "train"]
    cmd = [*launcher, *SMALL, *EPOCHS, *flags, "--data-dir", str(data_dir), "--out", str(out)]
    return subprocess.Popen(
        cmd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )


def _wait_for_epochs(out: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    csv = out / "epochs.csv"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if csv.exists() and len(csv.read_text().splitlines()) > n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {n} epochs in {csv} after {timeout} s")


def _wait_for(ready, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Poll `ready()` until true while the run goes on; AssertionError naming `what` where the
    run ends first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}:\n{proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {what} after {timeout} s")
        time.sleep(0.02)


def _sigterm_after_epoch_1(data_dir: Path, out: Path, ckdir: Path) -> tuple[str, str]:
    """Start a 1-rank run checkpointing every 2 epochs, SIGTERM it once epoch 1 is written, and
    return its (stdout, stderr) after it stopped with the preemption exit code (75)."""
    proc = _start(data_dir, out, "--checkpoint-dir", str(ckdir), "--checkpoint-every", "2")
    _wait_for_epochs(out, 1, proc)
    # mid epoch 2: checkpoint at its end, exit 75. Under load the signal can also land between
    # epoch 1's row in epochs.csv and that epoch's stop agreement: then the run stops after
    # epoch 1, which is as correct (seen once in a full run on 2 busy cores)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ck.PREEMPTED_EXIT, stderr
    return stdout, stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_whole_group_stops_a_run_with_loader_workers_at_a_checkpoint(
    data_dir, tmp_path, signum
):
    """Slurm signals every process of a job step (a time limit's SIGTERM, --signal's USR1
    warning), a closed terminal its whole foreground group: the DataLoader's workers got the
    signal too and died of it, and the rank failed mid-step ("DataLoader worker (pid N) is
    killed by signal"), its training since the last checkpoint lost. The workers ignore the
    stop signals now; the rank alone stops, at a checkpoint, exit 75."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--loader", "dataloader", "--num-workers", "1", "--no-persistent-workers",
             "--checkpoint-dir", str(ckdir), "--checkpoint-every", "0")  # fmt: skip
    proc = _start(data_dir, out, *flags, preexec_fn=os.setsid)  # a group of its own
    _wait_for_epochs(out, 1, proc)
    os.killpg(proc.pid, signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ck.PREEMPTED_EXIT, stderr
    assert "Traceback" not in stderr and "DataLoader worker" not in stderr, stderr
    assert ck.list_checkpoints(ckdir), stderr


def test_a_stop_of_a_run_without_checkpoints_ends_its_loader_workers(data_dir, tmp_path):
    """Without --checkpoint-dir a SIGTERM is cli's Stopped: at exit, multiprocessing ends the
    DataLoader's (persistent) workers with its own SIGTERM and waits for them. Workers that
    ignored every SIGTERM held the rank (and its GPU) for ever; the parent's SIGTERM still
    ends them. (Persistent: non-persistent workers are shut down at each epoch's end, inside
    the iterator's __del__, where a Stopped raised is "ignored" by Python and the run then
    trains on: a race of cli's Stopped with any finalizer, not of the workers.)"""
    out = tmp_path / "run"
    flags = ["--loader", "dataloader", "--num-workers", "1"]
    proc = _start(data_dir, out, *flags, preexec_fn=os.setsid)
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signal.SIGTERM)  # the rank alone
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the rank never ended:\n{proc.communicate()[1][-2000:]}") from None
    assert proc.returncode == -signal.SIGTERM, stderr
    assert stderr.splitlines()[-1].endswith("scalestudy train: stopped by SIGTERM"), stderr


def test_a_new_run_into_an_earlier_runs_out_starts_without_its_outputs(data_dir, tmp_path):
    """metrics.json marks a finished run, but a new run into the same --out (by hand:
    Snakemake deletes a job's outputs first) left the earlier one's in place until it
    finished itself, and epochs.csv until its first epoch: killed before, the directory held
    one run's metrics.json beside another's epochs, which collect took for one run. Now the
    new run starts with neither: no metrics.json, a header-only epochs.csv."""
    out = tmp_path / "run"
    train(data_dir, out, *EPOCHS, nproc=1)
    assert (out / "metrics.json").exists() and len(read_epochs(out)) == 4
    proc = _start(data_dir, out, "--seed", "1", "--diag-data-delay-ms", "200")
    try:
        deadline = time.monotonic() + 120
        # the header alone, not the earlier run's 4 epochs, before this run's first epoch ends
        while (out / "metrics.json").exists() or read_epochs(out):
            assert len(read_epochs(out)) in (0, 4), read_epochs(out)  # never this run's row
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    assert not (out / "metrics.json").exists()


def test_a_stop_signal_in_the_last_epoch_finishes_the_run_and_says_so(data_dir, tmp_path):
    """SIGTERM in the last epoch: nothing is left to checkpoint, so the run finishes (exit 0),
    but it went on without a word, as if no signal had come (train.py: a stop checkpoints at
    the epoch's end and exits 75)."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--epochs", "2", "--checkpoint-dir", str(ckdir), "--diag-data-delay-ms", "300")
    proc = _start(data_dir, out, *flags)
    # into epoch 2 (8 steps of 0.3 s), past epoch 1's stop agreement: its checkpoint, saved
    # after the agreement, is written (a fixed 1 s after epoch 1's row was too short on busy
    # cores: the run then stopped after epoch 1, exit 75)
    _wait_for(lambda: bool(ck.list_checkpoints(ckdir)), proc, "epoch 1's checkpoint")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "received SIGTERM in the last epoch: finishing the run" in stderr, stderr
    assert (out / "metrics.json").exists() and len(read_epochs(out)) == 2


def _same_epochs(a: Path, b: Path) -> None:
    ra, rb = read_epochs(a), read_epochs(b)
    assert [int(r["epoch"]) for r in rb] == [1, 2, 3, 4]  # none lost, none twice
    assert [{k: r[k] for k in SAME} for r in ra] == [{k: r[k] for k in SAME} for r in rb]


def test_sigterm_then_restart_matches_an_uninterrupted_run(data_dir, tmp_path):
    ref = tmp_path / "ref"
    train(data_dir, ref, *EPOCHS, nproc=1)
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckdir), "--checkpoint-every", "2")
    _, stderr = _sigterm_after_epoch_1(data_dir, out, ckdir)
    assert "received SIGTERM" in stderr and "rerun the same command to resume" in stderr
    assert not (out / "metrics.json").exists()  # not complete, and not reported as such
    stopped_at = [p.name for p in ck.list_checkpoints(ckdir)]
    assert stopped_at in (["epoch-0001"], ["epoch-0002"], ["epoch-0002", "epoch-0003"]), stopped_at

    (out / "epochs.csv").unlink()  # as Snakemake does with a failed job's outputs
    # a --target-acc the first segment was not given (not part of the run's identity), which
    # epoch 1 already reached: time_to_target_s was judged only on the epochs trained after
    # the resume (one later, or null), and with a target raised on resume it kept the old
    # target's time
    target = float(read_epochs(ref)[0]["val_acc"]) * 0.999
    assert target > 0
    done = train(data_dir, out, *EPOCHS, *flags, "--target-acc", str(target), nproc=1)
    assert "resuming from" in done.stdout
    _same_epochs(ref, out)
    m = read_metrics(out)
    first = float(read_epochs(out)[0]["epoch_time_s"])
    assert m["time_to_target_s"] == pytest.approx(first, rel=1e-4), m["time_to_target_s"]
    assert m["restarts"] == 1 and m["resumed_from_epochs"] in ([1], [2], [3])
    assert m["throughput_img_s"] > 0 and m["train_time_s"] > 0
    assert m["lost_time_s"] == 0  # the stop saved everything trained: nothing redone
    assert read_metrics(ref)["lost_time_s"] is None  # no --checkpoint-dir: not known
    assert m["config_hash"] == read_metrics(ref)["config_hash"]
    assert not ckdir.exists()  # a finished run leaves no checkpoint to resume


def _on_a_terminal(
    data_dir: Path, out: Path, *flags: str, stderr=None
) -> tuple[subprocess.Popen, int]:
    """A 1-rank `scalestudy train` whose controlling terminal is a pseudo-terminal (stdin,
    stdout and stderr on it, or stderr to `stderr`), as in an ssh session: returns it and the
    terminal's master end, whose closing hangs the terminal up (the kernel's SIGHUP; its
    writes then fail, EIO)."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def own_terminal() -> None:  # a session of its own, the pty its controlling terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's job has it (not nohup's)

    cmd = [PYTHON, "-m", "scalestudy", "train", *SMALL, *flags]
    cmd += ["--data-dir", str(data_dir), "--out", str(out)]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=slave,
            stdout=slave,
            stderr=slave if stderr is None else stderr,
            env=child_env(),
            preexec_fn=own_terminal,
        )
    finally:
        os.close(slave)
    return proc, master


def test_a_closed_terminal_checkpoints_and_exits_75(data_dir, tmp_path):
    """A run started by hand over ssh, whose connection dropped: the hang-up's SIGHUP killed
    the rank on the spot, every epoch since the last checkpoint lost (all of them with
    --checkpoint-every 0) and the temp file of attempt.json's write in flight left behind. It
    stops as on SIGTERM now: checkpoint at the epoch's end, exit 75, though every line it
    writes after the hang-up fails (EIO)."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--epochs", "30", "--limit-train", "256", "--limit-test", "100")
    proc, master = _on_a_terminal(
        data_dir, out, *flags, "--checkpoint-dir", str(ckdir), "--checkpoint-every", "0"
    )
    try:
        csv = out / "epochs.csv"
        while not (csv.exists() and len(csv.read_text().splitlines()) > 1):
            assert proc.poll() is None, "the run ended before its first epoch"
            try:  # what it writes, read so that it never blocks on a full terminal
                os.read(master, 65536)
            except OSError:  # EIO: it ended, closing the terminal's last slave end
                break
        os.close(master)  # the hang-up
        assert proc.wait(timeout=120) == ck.PREEMPTED_EXIT
    finally:
        proc.kill()
    assert [p.name for p in ck.list_checkpoints(ckdir)], "no checkpoint saved"
    assert not list(ckdir.glob(".*.tmp")), list(ckdir.iterdir())
    assert not (out / "metrics.json").exists()


def test_lines_to_a_terminal_that_hung_up_are_dropped_without_a_traceback(data_dir, tmp_path):
    """The terminal hangs up early in epoch 1 (32 steps), its stderr going to a file (`2> log`):
    the epoch's line to the dead terminal failed (EIO), and the logger printed its "--- Logging
    error ---" traceback, 30 lines, into the file for each later line. A terminal that hung up
    is now one whose reader is gone, as a closed pipe's: what goes there is dropped."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--epochs", "30", "--limit-train", "1024", "--limit-test", "100")
    with open(tmp_path / "stderr", "w") as err:
        proc, master = _on_a_terminal(
            data_dir, out, *flags, "--checkpoint-dir", str(ckdir), stderr=err
        )
    try:
        said = b""
        while b"window opens" not in said:  # step 2 of 32
            assert proc.poll() is None, said
            said += os.read(master, 65536)
        os.close(master)  # the hang-up, before epoch 1's line
        assert proc.wait(timeout=120) == ck.PREEMPTED_EXIT, (tmp_path / "stderr").read_text()
    finally:
        proc.kill()
    stderr = (tmp_path / "stderr").read_text()
    assert "received SIGHUP" in stderr and "Traceback" not in stderr, stderr
    assert len(read_epochs(out)) == 1  # epoch 1's line was due after the hang-up: it was


def test_a_hang_up_under_nohup_is_ignored(data_dir, tmp_path):
    """`nohup scalestudy train ...`: SIGHUP ignored at start stays ignored, the run completes."""
    out = tmp_path / "run"
    proc = _start(
        data_dir,
        out,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # as nohup starts it
    )
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "SIGHUP" not in stderr and read_metrics(out)["restarts"] == 0


def test_a_checkpoint_of_other_prepared_data_is_not_resumed(data_dir, tmp_path):
    """--data-dir is not in config_hash (where the data is, not what), and nothing else of the
    data was in the checkpoint's identity: the same command with a --data-dir of another
    prepared set resumed the checkpoint, trained on data it was not started on and reported
    one run. Its sha256 is in the identity now: the run starts fresh, saying why."""
    other = tmp_path / "other-data"  # as many images as data_dir's, so as many steps: only
    subprocess.run(  # the data tells them apart
        [PYTHON, "-m", "scalestudy", "prepare-data", "--dataset", "synthetic", "--data-dir",
         str(other), "--num-train", "1024", "--num-test", "300", "--seed", "1"],
        check=True, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckdir), "--checkpoint-every", "1")
    proc = _start(data_dir, out, *flags)
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ck.PREEMPTED_EXIT, stderr
    assert ck.list_checkpoints(ckdir)

    (out / "epochs.csv").unlink()
    done = train(other, out, *EPOCHS, *flags, nproc=1)
    assert "resuming from" not in done.stdout
    assert "not resuming" in done.stderr and "another configuration" in done.stderr
    m = read_metrics(out)
    assert m["restarts"] == 0 and m["resumed_from_epochs"] == []
    assert [int(r["epoch"]) for r in read_epochs(out)] == [1, 2, 3, 4]


def test_a_failed_metrics_write_keeps_the_checkpoints_for_the_rerun(data_dir, tmp_path):
    """The checkpoints went before metrics.json was written: a run whose last write failed
    (disk full, quota; here a directory in metrics.json's place, made mid-run after the
    trainer's own check) had lost all its training. Now the rerun resumes from the last one."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckdir), "--checkpoint-every", "1")
    proc = _start(data_dir, out, *flags)
    _wait_for_epochs(out, 1, proc)
    (out / "metrics.json" / "in-the-way").mkdir(parents=True)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode not in (0, ck.PREEMPTED_EXIT), stderr[-3000:]
    assert "metrics.json" in stderr and "Traceback" not in stderr, stderr[-3000:]
    kept = [p.name for p in ck.list_checkpoints(ckdir)]
    assert kept and kept[-1] == "epoch-0003", kept  # epochs 1-3 (the last is never saved)

    (out / "metrics.json" / "in-the-way").rmdir()
    (out / "metrics.json").rmdir()
    done = train(data_dir, out, *EPOCHS, *flags, nproc=1)
    assert "resuming from" in done.stdout
    m = read_metrics(out)
    assert m["restarts"] == 1 and m["resumed_from_epochs"] == [3]
    # the resumed segment saved nothing (epoch 4 is the last): its stall is the first
    # segment's, carried in the checkpoint (saves after epochs 1 and 2; state.py)
    assert m["checkpoint_stall_s"] > 0
    assert not ckdir.exists()  # finished: its checkpoints go, after metrics.json


def test_a_failed_save_on_stop_fails_every_rank_instead_of_exiting_75(data_dir, tmp_path, tiny_fs):
    """SIGTERM to both ranks with the checkpoint directory read-only: rank 0's stop save fails.
    No rank may exit 75 (that claims a checkpoint): rank 1, which writes nothing, waits for
    rank 0's result and fails with it. Read-only from the run's first epoch on: at start the
    trainer refuses a directory it cannot write (train.check_output_dirs)."""
    out = tmp_path / "run"
    flags = ("--checkpoint-dir", str(tiny_fs / "ckpt"), "--checkpoint-every", "0")
    proc = _start(data_dir, out, *flags, nproc=2)
    _wait_for_epochs(out, 1, proc)
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    for pid in worker_pids(proc.pid).values():  # as Slurm signals every task
        os.kill(pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode not in (0, ck.PREEMPTED_EXIT), stderr[-3000:]
    assert "rerun the same command to resume" not in stderr, stderr[-3000:]
    assert "[rank 0/2" in stderr and "no permission to write" in stderr, stderr[-3000:]
    assert "[rank 1/2" in stderr and "failed on another rank" in stderr, stderr[-3000:]
    assert not (out / "metrics.json").exists()


# one rank of the test below: rank 0's background write of the epoch-1 checkpoint outlasts an
# epoch, then fails as a full disk does (the CheckpointError write_checkpoint raises)
SLOW_THEN_FULL = """
import os, sys, time
from scalestudy.errors import CheckpointError
from scalestudy.trainer import checkpoint
if os.environ["RANK"] == "0":
    real, calls = checkpoint.write_checkpoint, []
    def slow_then_full(directory, epoch, *args, **kwargs):
        calls.append(epoch)
        if len(calls) == 1:
            time.sleep(3)
            raise CheckpointError(f"{directory}: No space left on device (injected)")
        return real(directory, epoch, *args, **kwargs)
    checkpoint.write_checkpoint = slow_then_full
from scalestudy.cli import main
sys.exit(main())
"""


def test_a_background_write_failing_after_the_agreement_fails_every_rank(data_dir, tmp_path):
    """Epoch 1's write is still in flight at epoch 2's stop agreement, then fails: it was raised
    by rank 0 alone inside the next save, and rank 1 trained on into a closed connection (a
    traceback, a wrong hang diagnosis). Now the agreement before a save waits for the write in
    flight: both ranks fail with the agreed CheckpointError, one line each, at the same point."""
    rank = tmp_path / "slow_then_full.py"
    rank.write_text(SLOW_THEN_FULL)
    out = tmp_path / "run"
    flags = ("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1")
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(rank), "train", *SMALL, *EPOCHS, *flags]
    cmd += ["--data-dir", str(data_dir), "--out", str(out)]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    err = proc.stderr
    assert proc.returncode not in (0, ck.PREEMPTED_EXIT), err[-3000:]
    assert "[rank 0/2 " in err and "No space left on device (injected)" in err, err[-3000:]
    assert "a checkpoint write failed on another rank (see its log)" in err, err[-3000:]
    assert "[rank1]: Traceback" not in err and "hang diagnosis" not in err, err[-3000:]
    assert "training failed" not in err, err[-3000:]
    assert len(read_epochs(out)) == 2  # both stopped after epoch 2, where the save was due


def test_killed_rank_fails_the_job_fast_and_fsdp_resumes_exactly(data_dir, tmp_path):
    """kill -9 of one FSDP rank: the job fails within seconds naming the rank; the restart
    resumes from the last periodic checkpoint (torch.distributed.checkpoint) and ends with
    the uninterrupted run's epochs."""
    fsdp = ("--strategy", "fsdp")
    ref = tmp_path / "ref"
    train(data_dir, ref, *EPOCHS, *fsdp)
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = (*fsdp, "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1")
    proc = _start(data_dir, out, *flags, nproc=2)
    _wait_for_epochs(out, 2, proc)
    t0 = time.monotonic()
    os.kill(worker_pids(proc.pid)[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 60  # far below the 60 s process-group timeout + start
    assert "local_rank: 1" in stderr and "SIGKILL" in stderr, stderr[-3000:]
    assert not (out / "metrics.json").exists()
    assert ck.list_checkpoints(ckdir), "the periodic checkpoints survive kill -9"
    assert (ck.list_checkpoints(ckdir)[-1] / "dcp" / ".metadata").is_file()

    done = train(data_dir, out, *EPOCHS, *flags)
    assert "resuming from" in done.stdout
    _same_epochs(ref, out)
    assert read_metrics(out)["restarts"] == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_without_checkpoints_stopped_by_a_signal_says_so(data_dir, tmp_path, signum):
    """`train` handles the stop signals itself (cli.OWN_STOP: it checkpoints and exits 75),
    but only with --checkpoint-dir: without one nothing handled them, and SIGTERM (scancel,
    `timeout`, a study with checkpointing off) or SIGHUP (a closed terminal) killed the rank
    on the spot, silently, its finally blocks never run. It now stops as Ctrl-C stops it: one
    line, then the signal's death."""
    out = tmp_path / "run"
    # SIGHUP as a terminal's job has it: CI's nohup starts the suite with it ignored, which
    # stays ignored (the run then trained to its end and exited 0)
    proc = _start(data_dir, out, preexec_fn=sighup_as_in_a_terminal)
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signum, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1].endswith(f"scalestudy train: stopped by {signum.name}"), stderr
    assert not (out / "metrics.json").exists()


def _stopped_after_epoch_1_then_refused(data_dir, out: Path, flags) -> tuple[str, str]:
    """One rank with `flags` stopped by SIGTERM after epoch 1 (checkpointed, exit 75), then
    the same command again, which must fail (not 0, not 75): its stdout and stderr."""
    proc = _start(data_dir, out, *flags)
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ck.PREEMPTED_EXIT, stderr
    (out / "epochs.csv").unlink()
    proc = _start(data_dir, out, *flags)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode not in (0, ck.PREEMPTED_EXIT), stdout + stderr
    return stdout, stderr


def test_a_stop_no_resume_could_measure_from_writes_no_checkpoint(data_dir, tmp_path):
    """Each segment warms up anew. A run stopped before its window opened (after epoch 1 of 3,
    4 steps each, warm-up 10) checkpointed, and its resume, 8 steps left, could never reach a
    window step: every rerun of the command its exit promised to resume refused, the
    checkpoint kept for ever. No such checkpoint is written (nor the periodic ones): the stop
    says so, and the same command trains from the start and measures its window."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--epochs", "3", "--limit-train", "128", "--warmup-steps", "10",
             "--diag-data-delay-ms", "100", "--checkpoint-dir", str(ckdir),
             "--checkpoint-every", "1")  # fmt: skip
    proc = _start(data_dir, out, *flags)
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ck.PREEMPTED_EXIT, stderr
    # after epoch 1 (or 2 under load: 4 steps left then)
    said = r"no checkpoint: a resume after epoch [12] would leave no steady-state window"
    assert re.search(said, stderr) and "rerun the same command to train again" in stderr
    assert not ck.list_checkpoints(ckdir)
    proc = _start(data_dir, out, *flags)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stdout + stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["restarts"] == 0 and metrics["window_steps"] == 2


@pytest.mark.parametrize(("hook", "warned"), [("powersgd", True), ("none", False)])
def test_a_checkpointed_powersgd_run_warns_that_its_resume_is_not_exact(
    tmp_path, caplog, hook, warned
):
    """PowerSGD's state (error feedback, warm-start factors, step count) is not checkpointed:
    a resumed run restarted it silently while train.py promised a bit-for-bit resume."""
    from scalestudy.trainer.state import Checkpointing

    cfg = TrainConfig(out=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"), comm_hook=hook)
    with caplog.at_level(logging.WARNING, logger="scalestudy"):
        Checkpointing(cfg, 0, 1, torch.device("cpu"), None, None, "data-sha256")
    assert ("--comm-hook powersgd: a resumed run is not bit for bit" in caplog.text) == warned


def test_the_fsdp_checkpoint_group_times_out_after_pg_timeout_s(
    tmp_path, monkeypatch, one_rank_group
):
    """FSDP's checkpoint collectives run in a gloo group of their own, created without a
    timeout: a hung save waited torch's default 30 minutes, not --pg-timeout-s."""
    import datetime

    import torch.distributed as dist

    from scalestudy.trainer import state

    created = []
    real = dist.new_group

    def new_group(*args, **kwargs):
        created.append(kwargs)
        return real(*args, **kwargs)  # a real group: torch takes the arguments

    monkeypatch.setattr(state.dist, "new_group", new_group)
    cfg = TrainConfig(strategy="fsdp", pg_timeout_s=7, checkpoint_dir=str(tmp_path / "ck"))
    saver = state.make_checkpointer(cfg, 0, 1, "data-sha256", torch.device("cpu"))
    assert saver.dcp_group is not None
    assert [c.get("timeout") for c in created] == [datetime.timedelta(seconds=7)]


# one rank of the test below: rank 0's checkpoint write sleeps SLOW_SAVE_S first (a slow
# filesystem); every rank appends its window seconds of each epoch to WINDOW_LOG.rank<r>
SLOW_SAVE = """
import os, sys, time
from scalestudy.trainer import checkpoint, measure
real_end, real_write = measure.Meter.epoch_end, checkpoint.write_checkpoint
def epoch_end(self, state, seen):
    before = state.window_time
    seconds = real_end(self, state, seen)
    with open(os.environ["WINDOW_LOG"] + ".rank" + os.environ["RANK"], "a") as f:
        f.write(f"{state.window_time - before} ")
    return seconds
def slow_write(*args, **kwargs):
    if os.environ.get("SAVE_STARTED"):  # the test's cue: the write is in flight
        open(os.environ["SAVE_STARTED"], "w").close()
    time.sleep(float(os.environ["SLOW_SAVE_S"]))
    return real_write(*args, **kwargs)
measure.Meter.epoch_end, checkpoint.write_checkpoint = epoch_end, slow_write
from scalestudy.cli import main
sys.exit(main())
"""


def test_a_synchronous_save_stays_out_of_every_ranks_window(data_dir, tmp_path):
    """--no-checkpoint-async makes the save wait outside the window, but only rank 0 writes: the
    other ranks went on into the next epoch, opened its window and waited for rank 0 inside their
    first step's all-reduce, so the save was counted in their window time (and throughput_img_s
    divides by the longest window over ranks). Now every rank waits for rank 0's end of the
    epoch before the next window opens: a 1.5 s write is in rank 0's checkpoint_stall_s, and in
    no rank's window."""
    delay = 1.5
    rank = tmp_path / "slow_save.py"
    rank.write_text(SLOW_SAVE)
    out, log = tmp_path / "run", tmp_path / "window"
    flags = ["--epochs", "3", "--limit-train", "256", "--limit-test", "100", "--comm-probe-steps"]
    flags += ["0", "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(rank), "train", *SMALL, *flags, "--no-checkpoint-async"]
    cmd += ["--data-dir", str(data_dir), "--out", str(out)]
    env = child_env(SLOW_SAVE_S=str(delay), WINDOW_LOG=str(log))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    assert m["checkpoint_stall_s"] >= 2 * delay  # the saves after epochs 1 and 2, on rank 0
    windows = [[float(s) for s in Path(f"{log}.rank{r}").read_text().split()] for r in (0, 1)]
    assert all(len(w) == 3 for w in windows), windows
    # in lockstep the ranks' windows of an epoch are equally long; the save made rank 1's
    # epochs 2 and 3 each `delay` longer than rank 0's
    for epoch, (mine, other) in enumerate(zip(*windows, strict=True), start=1):
        assert abs(other - mine) < delay / 2, (epoch, windows)
    assert m["window_time_s"] < sum(windows[0]) + delay / 2, (m["window_time_s"], windows)


def _checkpointing(tmp_path: Path):
    """The loop's Checkpointing of a tiny model (one rank, CPU, synchronous saves)."""
    from scalestudy.trainer.state import Checkpointing, Trainables

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainables = Trainables(model, optimizer, scheduler, torch.amp.GradScaler("cpu"), {})
    cfg = TrainConfig(
        out=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "ck"), checkpoint_async=False
    )
    return Checkpointing(cfg, 0, 1, torch.device("cpu"), None, trainables, "data-sha256")


def test_the_not_resuming_warning_names_both_devices_and_layouts_whole():
    """Of each list of the identity the warning kept the items the other side lacked: right
    for RunState's field names, but the devices and the ranks per host are ordered lists
    with repeats, and a checkpoint of the same GPUs in another order, or 2 + 2 ranks against
    2 + 1 + 1, printed ({'devices': []}, this run is {'devices': []}): no difference named."""
    a, h = "4 x NVIDIA A100", "4 x NVIDIA H100"
    assert ck._differences({"devices": [a, h]}, {"devices": [h, a]}) == {
        "devices": ([a, h], [h, a])
    }
    assert ck._differences({"ranks_per_host": [2, 2]}, {"ranks_per_host": [2, 1, 1]}) == {
        "ranks_per_host": ([2, 2], [2, 1, 1])
    }
    fields = {"run_state_fields": ["epoch", "step"]}
    assert ck._differences(fields, {"run_state_fields": ["epoch", "seen", "step"]}) == {
        "run_state_fields": ([], ["seen"])
    }


def test_a_checkpoint_of_other_code_or_torch_is_not_resumed(tmp_path, monkeypatch, one_rank_group):
    """A preempted run rerun after a trainer edit resumed the old code's checkpoint silently:
    metrics.json then gave the last segment's git_commit for epochs the old code trained.
    The trainer source's sha256 and torch's version are in the identity now: the run starts
    fresh, naming both values."""
    from scalestudy.trainer import measure
    from scalestudy.trainer import state as st

    warnings: list[str] = []
    monkeypatch.setattr(ck, "_warn", warnings.append)  # find_latest's, whatever logging's set-up
    old, new = "a" * 64, "b" * 64
    monkeypatch.setattr(measure, "code_sha256", lambda: old)
    _checkpointing(tmp_path)._save(st.RunState(epoch=1, step=5), wait=True)
    assert _checkpointing(tmp_path).resume().epoch == 1  # the same code resumes

    monkeypatch.setattr(measure, "code_sha256", lambda: new)
    assert _checkpointing(tmp_path).resume().epoch == 0
    assert "not resuming" in warnings[-1] and old in warnings[-1] and new in warnings[-1]

    monkeypatch.setattr(measure, "code_sha256", lambda: old)
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert _checkpointing(tmp_path).resume().epoch == 0
    assert "'torch_version': '0.0.1'" in warnings[-1] and "code_sha256" not in warnings[-1]


def test_the_code_digest_follows_the_trainer_source_not_the_checkout(tmp_path):
    """code_sha256 hashes the package's top level and trainer/ as imported: a copy of the
    package elsewhere (a container's, outside any git checkout) has the same digest, and an
    edit of one trainer file changes it (a commit of docs or config.yaml would not)."""
    import shutil

    from scalestudy.trainer import measure

    package = Path(measure.__file__).resolve().parent.parent
    for name in ("same", "edited"):
        shutil.copytree(
            package, tmp_path / name / "scalestudy", ignore=shutil.ignore_patterns("__pycache__")
        )
    loop = tmp_path / "edited/scalestudy/trainer/loop.py"
    loop.write_text(loop.read_text() + "\n# an edit\n")
    code = "from scalestudy.trainer import measure; print(measure.code_sha256())"
    digests = {
        name: subprocess.run(
            [PYTHON, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path / name)},
            capture_output=True, text=True, check=True, cwd=tmp_path,
        ).stdout.strip()
        for name in ("same", "edited")
    }  # fmt: skip
    assert digests["same"] == measure.code_sha256() != digests["edited"]
    assert len(digests["edited"]) == 64


def test_a_checkpoint_of_another_run_state_starts_fresh_with_a_warning(
    tmp_path, monkeypatch, one_rank_group
):
    """A checkpoint whose progress has other fields than this code's RunState (one renamed,
    the commit unknown on one side or a dirty tree on both) failed the resume with a TypeError
    traceback from RunState(**progress). RunState's fields are in the identity: not resumed,
    the warning names the fields that differ, the run starts fresh."""
    from scalestudy.trainer import state as st

    ours = _checkpointing(tmp_path)
    progress = dataclasses.asdict(st.RunState(epoch=1, step=5))
    progress["stall_seconds"] = progress.pop("checkpoint_stall_s")  # the older code's name
    fields = sorted(progress)
    older = {**ours.saver.identity, "run_state_fields": fields}
    snapshot = {
        "model": ours.trainables.model.state_dict(),
        "optimizer": ours.trainables.optimizer.state_dict(),
        "scheduler": ours.trainables.scheduler.state_dict(),
        "scaler": ours.trainables.scaler.state_dict(),
        "ranks": [{"rng": ck.rng_state()}],
        "progress": progress,
    }
    _saver(ours.saver.directory, async_write=False, identity=older).save(1, snapshot)
    warnings: list[str] = []
    monkeypatch.setattr(ck, "_warn", warnings.append)
    assert ours.resume() == st.RunState()
    assert "not resuming" in warnings[0], warnings
    assert "['stall_seconds']" in warnings[0] and "['checkpoint_stall_s']" in warnings[0]


def test_a_checkpoint_of_an_edited_meta_json_is_not_resumed(tmp_path, monkeypatch, one_rank_group):
    """The data identity was data.pt's sha256 alone: a meta.json whose mean and std were edited
    (valid values; data.pt untouched) resumed the checkpoint, its epochs normalised with other
    constants, reported as one run. The identity is loaders.data_sha256 now: what the run reads
    of meta.json is in it, what it does not read (the source) is not."""
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer import loop, prepare_data
    from scalestudy.trainer import state as st

    out = prepare_data.prepare("synthetic", tmp_path / "data", num_train=64, num_test=16, seed=0)
    cfg = TrainConfig(
        dataset="synthetic", data_dir=str(tmp_path / "data"), model="cnn", width=4, epochs=1,
        local_batch=16, warmup_steps=1, comm_probe_steps=0, tensorboard=False,
        out=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "ck"), checkpoint_async=False,
    )  # fmt: skip
    denv = sdist.DistEnv("none", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0)
    warnings: list[str] = []
    monkeypatch.setattr(ck, "_warn", warnings.append)

    def checkpointing():
        run = loop.build(cfg, denv, torch.device("cpu"))
        return st.Checkpointing(cfg, 0, 1, run.device, None, run.trainables(), run.data_sha256)

    checkpointing()._save(st.RunState(epoch=1, step=4), wait=True)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "source": "moved"}))
    assert checkpointing().resume().epoch == 1  # nothing the run reads changed
    (out / "meta.json").write_text(json.dumps({**meta, "mean": [0.0] * 3, "std": [1.0] * 3}))
    assert checkpointing().resume().epoch == 0
    assert "not resuming" in warnings[-1] and "data_sha256" in warnings[-1], warnings


def test_a_checkpoint_of_other_hardware_is_not_resumed(tmp_path, monkeypatch, one_rank_group):
    """A job requeued on another GPU model (a mixed partition, hardware.gpu_type empty) resumed
    the checkpoint: metrics.json then summed the window images and times of both models into
    one throughput_img_s and named only the last segment's device. Every rank's device is in
    the identity now: the same hardware resumes, a checkpoint written on other hardware (its
    manifest as that machine wrote it) is not resumed, and the warning names both."""
    from scalestudy.trainer import measure
    from scalestudy.trainer import state as st

    warnings: list[str] = []
    monkeypatch.setattr(ck, "_warn", warnings.append)
    _checkpointing(tmp_path)._save(st.RunState(epoch=1, step=5), wait=True)
    assert _checkpointing(tmp_path).resume().epoch == 1  # the same machine resumes

    manifest_path = tmp_path / "ck" / "epoch-0001" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["devices"] = ["1 x NVIDIA A100-SXM4-80GB"]  # written by a job on another machine
    manifest_path.write_text(json.dumps(manifest))
    assert _checkpointing(tmp_path).resume().epoch == 0
    here = measure.device_info(torch.device("cpu"))["name"]
    assert "not resuming" in warnings[-1] and "another configuration" in warnings[-1]
    assert "NVIDIA A100-SXM4-80GB" in warnings[-1] and f"1 x {here}" in warnings[-1], warnings


def test_a_checkpoint_of_another_rank_layout_is_not_resumed(data_dir, tmp_path):
    """A study whose gpus_per_node changed runs w8 as 2 x 4 where it ran 1 x 8: the same run id,
    so the same checkpoint directory, and neither the configuration nor the world size tells
    the layouts apart. A stopped 1 x 8 job's checkpoint resumed, and metrics.json summed both
    layouts' windows under the last one's nodes and ranks_per_node. The ranks per host are in
    the identity now: here 2 ranks on one host, stopped, then the same 2 ranks as two hosts'
    (SLURMD_NODENAME, the node name the trainer reads) start fresh, the warning naming both."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"

    def launch(*prefix: str) -> list[str]:
        cmd = [PYTHON, "-m", "scalestudy", "launch", "--ranks-per-node", "2", *prefix, "--"]
        cmd += [*SMALL, *EPOCHS, "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1"]
        return cmd + ["--device", "cpu", "--data-dir", str(data_dir), "--out", str(out)]

    proc = subprocess.Popen(  # 1 x 2
        launch(), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for_epochs(out, 1, proc)
    proc.send_signal(signal.SIGTERM)  # passed on to the ranks (jobs/local_ranks.py)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ck.PREEMPTED_EXIT, stderr[-3000:]
    assert ck.list_checkpoints(ckdir)

    (out / "epochs.csv").unlink()
    as_two_hosts = "sh -c 'SLURMD_NODENAME=node$LOCAL_RANK exec \"$@\"' sh"  # 2 x 1
    done = subprocess.run(
        launch("--rank-prefix", as_two_hosts),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not resuming" in done.stderr and "'ranks_per_host': [2]" in done.stderr, done.stderr
    assert "'ranks_per_host': [1, 1]" in done.stderr, done.stderr
    m = read_metrics(out)
    assert m["restarts"] == 0 and (m["nodes"], m["ranks_per_node"]) == (2, 1)


def test_a_checkpoint_of_another_image_is_not_resumed(tmp_path, monkeypatch, one_rank_group):
    """A rebuilt image (another CUDA, cuDNN or NCCL under the same torch) reruns the study's runs
    (the image is an input of training), and each resumed the checkpoint the old image wrote:
    metrics.json summed both images' windows under the new one's container_digest. The digest
    the launcher gives the ranks is in the identity now."""
    from scalestudy import vocab
    from scalestudy.trainer import state as st

    warnings: list[str] = []
    monkeypatch.setattr(ck, "_warn", warnings.append)
    monkeypatch.setenv(vocab.CONTAINER_DIGEST_ENV, "sha256:" + "a" * 64)
    _checkpointing(tmp_path)._save(st.RunState(epoch=1, step=5), wait=True)
    assert _checkpointing(tmp_path).resume().epoch == 1  # the same image resumes
    monkeypatch.setenv(vocab.CONTAINER_DIGEST_ENV, "sha256:" + "b" * 64)  # rebuilt
    assert _checkpointing(tmp_path).resume().epoch == 0
    assert "not resuming" in warnings[-1] and "b" * 64 in warnings[-1], warnings


def test_a_checkpoint_of_another_thread_count_is_not_resumed(tmp_path, monkeypatch, one_rank_group):
    """hardware.cpus_per_rank changed (launch sets each rank's threads to it): the same run id,
    so the same checkpoint directory, and the rerun resumed the old count's checkpoint: its
    window summed steps at 1 and 2 threads (454 and 590 img/s here) under the last count's
    threads_per_rank, which the planner then calibrated the new count from. The count is in
    the identity now."""
    from scalestudy.trainer import state as st

    warnings: list[str] = []
    monkeypatch.setattr(ck, "_warn", warnings.append)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _checkpointing(tmp_path)._save(st.RunState(epoch=1, step=5), wait=True)
        assert _checkpointing(tmp_path).resume().epoch == 1  # the same count resumes
        torch.set_num_threads(2)
        assert _checkpointing(tmp_path).resume().epoch == 0
    finally:
        torch.set_num_threads(threads)
    assert "not resuming" in warnings[-1] and "'threads_per_rank': 2" in warnings[-1], warnings


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["H100"] * 4, ["4 x H100"]),
        (["H100", "H100", "A100", "A100", "H100"], ["2 x H100", "2 x A100", "1 x H100"]),
    ],
)
def test_the_devices_of_the_identity_are_every_ranks_in_rank_order(names, expected):
    from scalestudy.trainer import state as st

    assert st.device_runs(names) == expected


def _one_rank_stopped_after_epoch_1(data_dir, tmp_path, epochs: int):
    """A checkpointed 1-rank run in this process (the group: one_rank_group) whose first
    segment is stopped as if signalled in epoch 1: it checkpoints after it and stops. Returns
    the run's config and DistEnv, to resume it with."""
    import signal as signals

    from scalestudy.errors import Preempted
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer import loop

    cfg = TrainConfig(
        dataset="synthetic", data_dir=str(data_dir), width=4, epochs=epochs, local_batch=32,
        warmup_steps=2, comm_probe_steps=0, limit_train=256, tensorboard=False,
        out=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1,
        checkpoint_async=False,
    )  # fmt: skip
    denv = sdist.DistEnv("none", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0)
    stop = ck.StopFlag()
    stop.signal = signals.SIGTERM
    with pytest.raises(Preempted):
        loop.train(cfg, denv, torch.device("cpu"), stop)
    return cfg, denv


def test_a_run_stopped_inside_its_profile_window_closes_the_profiler(
    data_dir, tmp_path, one_rank_group
):
    """--profile-steps 6:10 (8 steps per epoch) and a stop signal in epoch 1: the run saved its
    checkpoint after step 8 and raised Preempted with torch.profiler still recording. The
    process then exited with it open, and torch's exit crashed in 2 of 5 such runs (SIGSEGV,
    exit -11 instead of 75: a requeue and a retry took the job for failed). A stopped or failed
    run now ends the profiled range without writing it (a window cut short is no profile)."""
    import signal as signals

    from scalestudy.errors import Preempted
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer import loop

    cfg = TrainConfig(
        dataset="synthetic", data_dir=str(data_dir), width=4, epochs=3, local_batch=32,
        warmup_steps=2, comm_probe_steps=0, limit_train=256, tensorboard=False,
        out=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1,
        checkpoint_async=False, profile_steps="6:10",
    )  # fmt: skip
    denv = sdist.DistEnv("none", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0)
    stop = ck.StopFlag()
    stop.signal = signals.SIGTERM
    try:
        with pytest.raises(Preempted):
            loop.train(cfg, denv, torch.device("cpu"), stop)
        assert not torch._C._autograd._profiler_enabled(), "the profiler is still recording"
        assert not (tmp_path / "out" / "profile").exists()  # half a window: no files
    finally:
        if torch._C._autograd._profiler_enabled():  # the next tests' runs
            torch._C._autograd._disable_profiler()


def test_a_resumed_runs_epoch_time_counts_no_segments_warm_up(
    data_dir, tmp_path, monkeypatch, one_rank_group
):
    """Every segment warms up anew (compilation, autotuning: tens of seconds on a GPU), so each
    resumed segment's first epoch is slow again. epoch_time_s was the median over all epochs:
    a 3-epoch run stopped after epoch 1 had 2 slow epochs of 3 and reported a slow one as its
    epoch time, where the same run uninterrupted reported a steady one. Here one rank in this
    process, each warm-up step (outside the window) made 1 s slower, as compilation would: the
    steady epoch 3 is the run's epoch time, not the resumed segment's warm epoch 2."""

    from scalestudy.trainer import loop, measure

    warm_s = 1.0
    real_before_step = measure.Meter.before_step

    def before_step(self, step, seen):
        real_before_step(self, step, seen)
        if not self.in_window:
            time.sleep(warm_s)  # a warm-up step: compilation, cuDNN autotuning

    monkeypatch.setattr(measure.Meter, "before_step", before_step)
    cfg, denv = _one_rank_stopped_after_epoch_1(data_dir, tmp_path, epochs=3)
    m = loop.train(cfg, denv, torch.device("cpu"))  # resumes after epoch 1
    assert m["resumed_from_epochs"] == [1]
    times = [float(r["epoch_time_s"]) for r in read_epochs(tmp_path / "out")]
    # epochs 1 and 2 each hold a segment's 2 warm-up steps (2 s slower), epoch 3 none: the run's
    # epoch time is epoch 3's, whatever the machine's load does to the three. Not compared
    # with each other: under load (CI beside other work) epoch 3 once took 18 s and epoch 1
    # 11 s. On an idle machine the median over all three (what it was) is a warm epoch's.
    assert m["epoch_time_s"] == pytest.approx(times[2], rel=1e-5), (m["epoch_time_s"], times)


def test_a_resumed_run_records_when_it_started_and_every_host_it_ran_on(
    data_dir, tmp_path, monkeypatch, one_rank_group
):
    """A resumed run's window sums its segments, but metrics.json named the last segment's
    hosts only and gave its start as started_at: a job requeued onto another node (Slurm keeps
    the job id) reported the node it ended on, none of the one that trained most of its window,
    and a start after most of its training. Here one rank in this process, its segments on
    "node-a" and "node-b" (SLURMD_NODENAME, as on a Slurm node)."""
    import datetime

    from scalestudy.trainer import loop

    monkeypatch.setenv("SLURMD_NODENAME", "node-a")
    cfg, denv = _one_rank_stopped_after_epoch_1(data_dir, tmp_path, epochs=2)
    time.sleep(1.1)  # started_at counts whole seconds
    second = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    monkeypatch.setenv("SLURMD_NODENAME", "node-b")
    m = loop.train(cfg, denv, torch.device("cpu"))  # resumes after epoch 1, on another node
    assert m["resumed_from_epochs"] == [1]
    assert datetime.datetime.fromisoformat(m["started_at"]) < second, m["started_at"]
    assert m["hostnames"] == ["node-a", "node-b"]
    assert m["nodes"] == 1 and m["ranks_per_node"] == 1  # each segment's layout: one node


# the command of each rank of the test below: rank 1 runs on a "node" of its own, where
# NODE_LOCAL_DIR is a fresh tmpfs in a mount namespace only it sees (node-local /tmp)
NODE_LOCAL = """#!/bin/sh
if [ "$RANK" = 1 ]; then
  exec unshare -m sh -c 'mount -t tmpfs tmpfs "$NODE_LOCAL_DIR" && exec "$@"' sh "$@"
fi
exec "$@"
"""


def _node_local_dirs(tmp_path: Path) -> None:
    """Skip (fail in CI) where a mount namespace with a tmpfs cannot be made (needs root)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    proc = subprocess.run(
        ["unshare", "-m", "mount", "-t", "tmpfs", "tmpfs", str(probe)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        need("a tmpfs mounted in a mount namespace", f"run as root ({proc.stderr.strip()})")


def test_a_checkpoint_dir_one_rank_cannot_see_is_refused_before_training(data_dir, tmp_path):
    """Rank 0 alone writes a checkpoint and every rank reads it at a resume. With a node-local
    --checkpoint-dir (/tmp on each node) a multi-node run trained and saved on rank 0's node;
    its rerun resumed there and the other node's rank died with a FileNotFoundError traceback
    (rank 0: a traceback and a hang diagnosis), the checkpoint's hours lost. Here rank 1 runs in
    a mount namespace of its own, the directory a tmpfs only it sees: every segment now fails
    before anything is loaded or trained (at its start, so a first segment too), one line
    naming the directory and the setting, the checkpoint kept."""
    _node_local_dirs(tmp_path)
    local = tmp_path / "node_local.sh"
    local.write_text(NODE_LOCAL)
    local.chmod(0o755)
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckdir), "--checkpoint-every", "1")
    # a first segment on one node (the directory shared), stopped after epoch 1
    proc = _start(data_dir, out, *flags, nproc=2)
    _wait_for_epochs(out, 1, proc)
    for pid in worker_pids(proc.pid).values():
        os.kill(pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    saved = [p.name for p in ck.list_checkpoints(ckdir)]
    assert saved, "the first segment saved no checkpoint"
    (out / "epochs.csv").unlink()

    # the rerun, with rank 1 on another node: refused before anything is loaded or trained
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["--no-python", str(local), PYTHON, "-m", "scalestudy", "train", *SMALL, *EPOCHS]
    cmd += [*flags, "--data-dir", str(data_dir), "--out", str(out)]
    env = child_env(NODE_LOCAL_DIR=str(ckdir), SCALESTUDY_REPORT_GRACE_S="0")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    err = done.stderr
    assert done.returncode not in (0, ck.PREEMPTED_EXIT), err[-3000:]
    line = (
        f"--checkpoint-dir {ckdir} is not shared by every rank: rank 1 on "
        f"{os.uname().nodename} does not see the file rank 0"
    )
    assert line in err and "checkpointing.dir" in err, err[-3000:]
    assert err.count("is not shared by every rank") == 1, err[-3000:]  # rank 0 says it
    assert "[rank0]: Traceback" not in err and "[rank1]: Traceback" not in err, err[-3000:]
    assert "resuming from" not in done.stdout and not (out / "epochs.csv").exists()
    assert [p.name for p in ck.list_checkpoints(ckdir)] == saved  # nothing lost
    assert not list(ckdir.glob(ck.SHARED_MARK + "*"))  # rank 0's marker removed


def test_a_resume_past_the_profile_windows_start_is_refused_before_training(data_dir, tmp_path):
    """--profile-steps 6:10 (8 steps per epoch), stopped after epoch 1 (or 2 under load): the
    rerun resumed at step 8 (16), never saw step 6, never opened the profiler, and ended with
    exit 0 and a metrics.json naming the window; stopped at step 8, with no profile at all (the
    first segment's window was open at its stop, never written). Now the rerun refuses before
    training, in one line naming the window, the resumed step and the fix."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--profile-steps", "6:10", "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1")
    stdout, stderr = _stopped_after_epoch_1_then_refused(data_dir, out, flags)
    assert (
        "--profile-steps 6:10 profiles optimizer steps 6 to 9, but this run resumes at step"
        in stderr
    )
    assert "so this one would profile nothing; remove that directory's checkpoints" in stderr
    assert "Traceback" not in stderr and not (out / "metrics.json").exists()
    assert not (out / "epochs.csv").exists()  # refused before anything was written
    assert ck.list_checkpoints(ckdir)  # kept: the user decides


def test_a_peer_failing_during_rank_0s_background_write_keeps_that_checkpoint(data_dir, tmp_path):
    """kill -9 of rank 1 while rank 0's background write of epoch 1's checkpoint is in flight
    (it takes SLOW_SAVE_S here, a slow filesystem): rank 0's next collective fails and it
    exited, its daemon writer thread killed mid-write, so the rerun started from an earlier
    checkpoint (here: from scratch). Now rank 0 finishes the write before it exits (bounded:
    checkpoint.FINISH_WRITE_S), after its failure lines."""
    rank = tmp_path / "slow_save.py"
    rank.write_text(SLOW_SAVE)
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(rank), "train", *SMALL, *EPOCHS, "--checkpoint-dir", str(ckdir)]
    cmd += ["--checkpoint-every", "1", "--data-dir", str(data_dir), "--out", str(out)]
    # 8 steps of at least 0.2 s: epoch 2 is still training when rank 1 dies (at its end rank 0
    # would wait for the write anyway, before the next save)
    cmd += ["--diag-data-delay-ms", "200"]
    started = tmp_path / "save-started"
    env = child_env(SLOW_SAVE_S="6", WINDOW_LOG=str(tmp_path / "window"), SAVE_STARTED=str(started))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # epoch 1's write has begun (it sleeps 6 s, then writes): a fixed 0.5 s after epoch 1's row
    # was too short on busy cores, rank 1 then killed in the stop agreement before the save
    _wait_for(started.exists, proc, "epoch 1's checkpoint write to begin")
    t0 = time.monotonic()
    os.kill(worker_pids(proc.pid)[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 60, stderr[-3000:]
    assert "[rank 0/2" in stderr and "training failed" in stderr, stderr[-3000:]
    saved = ck.list_checkpoints(ckdir)
    assert [p.name for p in saved] == ["epoch-0001"], stderr[-3000:]
    assert ck.verify(saved[0])["epoch"] == 1
    assert "finishing the checkpoint of epoch 1" in stderr, stderr[-3000:]
    assert f"wrote {saved[0]}: the rerun resumes from it" in stderr, stderr[-3000:]
    assert not list(ckdir.glob(".partial-*"))


def test_a_resumed_runs_peak_memory_is_the_highest_of_its_segments(data_dir, tmp_path):
    """peak_mem_mb is what a user sizes a job's memory by, but a resumed run reported its last
    segment's peak alone: a first segment that needed more (here 1 GiB of ballast held by the
    process of the first segment, a real peak RSS of its own) was forgotten, and the job's
    --mem sized from metrics.json was too small for that segment. Now each checkpoint carries
    the highest peak of the segments before it."""
    ballast_mb = 1024
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckdir), "--checkpoint-every", "1")
    cmd = [*SMALL, *EPOCHS, *flags, "--data-dir", str(data_dir), "--out", str(out)]
    first = subprocess.Popen(
        [
            PYTHON,
            "-c",
            # a real first segment whose process holds (and has touched) the ballast
            f"import sys; b = bytearray({ballast_mb} * 2**20); b[::4096] = b'x' * len(b[::4096]);"
            "from scalestudy.cli import main; sys.exit(main(['train', *sys.argv[1:]]))",
            *cmd,
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_epochs(out, 1, first)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == ck.PREEMPTED_EXIT, stderr[-3000:]

    done = train(data_dir, out, *EPOCHS, *flags, nproc=1)
    assert "resuming from" in done.stdout
    m = read_metrics(out)
    assert m["restarts"] == 1 and m["peak_mem_source"] == "process_max_rss"
    assert m["peak_mem_mb"] > ballast_mb, m["peak_mem_mb"]  # the first segment's peak


def test_training_a_killed_attempt_redid_is_counted_as_lost_time(data_dir, tmp_path):
    """kill -9 after epoch 3 of a run that checkpoints every 2 epochs: epoch 3 is trained
    again by the rerun, which resumes from epoch 2. train_time_s counts the kept training only
    (the loop time up to each checkpoint resumed from, plus the last attempt's), so the node-
    hours priced from it left the lost epoch out, and nothing in metrics.json said any was
    lost. Now lost_time_s holds it, measured from the killed attempt's record in the checkpoint
    directory (its loop clock at its last epoch's end)."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--epochs", "5", "--checkpoint-dir", str(ckdir), "--checkpoint-every", "2")
    proc = _start(data_dir, out, *flags)
    _wait_for_epochs(out, 3, proc)
    attempt = ckdir / ck.ATTEMPT
    deadline = time.monotonic() + 60  # epoch 3's end recorded: its row is written just before
    while attempt.stat().st_mtime_ns < (out / "epochs.csv").stat().st_mtime_ns:
        assert time.monotonic() < deadline and proc.poll() is None, "no record of epoch 3"
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)
    epoch_3 = float(read_epochs(out)[2]["epoch_time_s"])  # the killed attempt's epoch 3
    assert [p.name for p in ck.list_checkpoints(ckdir)][-1] == "epoch-0002"

    done = train(data_dir, out, *EPOCHS, *flags, nproc=1)
    assert "resuming from" in done.stdout
    m = read_metrics(out)
    assert m["restarts"] == 1 and m["resumed_from_epochs"] == [2]
    # epoch 3's training and evaluation, as that attempt's clock measured them: at least its
    # training time, and less than the whole run's
    assert epoch_3 <= m["lost_time_s"] < m["train_time_s"], (epoch_3, m["lost_time_s"])
    assert not ckdir.exists()  # finished: the attempt record goes with the checkpoints


def test_a_resumed_attempt_killed_before_its_save_is_counted_in_restarts(tmp_path, one_rank_group):
    """restarts was len(resumed_from_epochs), a RunState field kept by the checkpoints: an
    attempt resumed from epoch 2 and killed before its next save lost its entry, and a run
    resumed twice said restarts 1 (lost_time_s counted both attempts). The attempt record
    carries the list too: the next attempt takes the record's and adds its own resume."""
    from scalestudy.trainer.measure import Meter
    from scalestudy.trainer.state import Checkpointing, RunState

    cfg = TrainConfig(checkpoint_dir=str(tmp_path / "ckpt"))
    device = torch.device("cpu")

    def attempt(resumed_from: list[int], epoch: int) -> RunState:
        """An attempt that resumed (state as resume() leaves it) and ran an epoch."""
        checkpointing = Checkpointing(cfg, 0, 1, device, None, None, "0" * 64)
        state = RunState(epoch=epoch, resumed_from_epochs=resumed_from)
        checkpointing.count_lost(state)
        checkpointing.mark_alive(state, Meter(cfg, device, 0, "off"))
        return state

    assert attempt([], 0).resumed_from_epochs == []  # the first attempt, killed at epoch 3
    # the second resumes from epoch 2's checkpoint (which holds []), is killed before epoch 4
    assert attempt([2], 2).resumed_from_epochs == [2]
    assert attempt([2], 2).resumed_from_epochs == [2, 2]  # the third, from epoch 2 again
    # a record of an older trainer, without the list: the checkpoint's, as before
    record = json.loads((tmp_path / "ckpt" / ck.ATTEMPT).read_text())
    del record["resumed_from_epochs"]
    (tmp_path / "ckpt" / ck.ATTEMPT).write_text(json.dumps(record))
    assert attempt([2], 2).resumed_from_epochs == [2]


def test_rank_0s_attempt_record_io_is_named_by_the_hang_diagnosis(
    tmp_path, monkeypatch, one_rank_group
):
    """attempt.json (lost_time_s) is rank 0's I/O at start-up and at each epoch's end: a write
    hung on a dead filesystem showed rank 0 at "evaluation" (the last place it had named),
    so the diagnosis sent the user to the evaluation. Its reads and writes are "attempt record",
    placed after the checkpoint load and between the evaluation and the checkpoint write."""
    from scalestudy import files
    from scalestudy.trainer import progress
    from scalestudy.trainer.measure import Meter
    from scalestudy.trainer.state import Checkpointing, RunState

    cfg = TrainConfig(checkpoint_dir=str(tmp_path / "ckpt"))
    device = torch.device("cpu")
    checkpointing = Checkpointing(cfg, 0, 1, device, None, None, "0" * 64)
    monkeypatch.setattr(progress, "TRACKER", progress.Tracker())
    seen, write_json = [], files.write_json

    def watched(path, *args, **kwargs):  # where the hang diagnosis has rank 0 while it writes
        seen.append((Path(path).name, progress.TRACKER.where[-1]))
        return write_json(path, *args, **kwargs)

    monkeypatch.setattr(files, "write_json", watched)
    state = RunState()
    progress.at("checkpoint load")
    checkpointing.count_lost(state)
    progress.at_step(3)
    progress.at("evaluation")
    checkpointing.mark_alive(state, Meter(cfg, device, 0, "off"))
    assert seen == [(ck.ATTEMPT, "attempt record")] * 2
    order = ["evaluation", "attempt record", "checkpoint write"]
    places = [progress.position({"step": 3, "phase": p}) for p in order]
    assert places == sorted(places) and len(set(places)) == 3
    start = [progress.position({"step": -1, "phase": p}) for p in ("checkpoint load", order[1])]
    assert start == sorted(start) and start[1] < progress.position({"step": 0, "phase": "data"})
