"""TensorBoard scalars per epoch (trainer/scalars.py): real event files read back with
TensorBoard's own readers and compared with epochs.csv, on 2 ranks and across a resume; and a
Python without tensorboard (the stand-in tests/stand-ins/no-tensorboard), where nothing is
written and one line says how to get it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import REPO, read_epochs, read_metrics, train
from test_checkpoint import EPOCHS, _sigterm_after_epoch_1

from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.scalars import TAGS, Scalars

HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
NO_TENSORBOARD = REPO / "tests" / "stand-ins" / "no-tensorboard"
BROKEN_TENSORBOARD = REPO / "tests" / "stand-ins" / "broken-tensorboard"


@pytest.fixture
def tensorboard():
    """Tests of the writing path need the optional package: CI installs it (requirements.txt);
    elsewhere they are skipped when it is absent."""
    if not HAVE_TENSORBOARD:
        message = "tensorboard is not installed (pip install tensorboard)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


def scalar_events(directory: Path) -> list[tuple[str, int, float]]:
    """Every scalar event of every event file in `directory`, as written: (tag, step, value)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    events = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                events.append((v.tag, event.step, v.tensor.float_val[0]))
    return events


def assert_scalars_are_the_epochs(out: Path) -> None:
    """Each tag has one value per epoch of epochs.csv (none twice: counted in the raw files,
    which a reader's purge of out-of-order steps would hide), equal to the CSV's cell."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = read_epochs(out)
    directory = out / "tensorboard"
    raw = scalar_events(directory)
    assert sorted((tag, step) for tag, step, _ in raw) == sorted(
        (tag, int(r["epoch"])) for tag in TAGS.values() for r in rows
    ), raw
    acc = EventAccumulator(str(directory))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(TAGS.values())
    for column, tag in TAGS.items():
        seen = [(e.step, e.value) for e in acc.Scalars(tag)]
        # the CSV rounds to 6 significant digits (relative error up to 5e-6), the event file
        # keeps a float32 (6e-8)
        expected = [(int(r["epoch"]), pytest.approx(float(r[column]), rel=1e-5)) for r in rows]
        assert seen == expected, tag


def _row(epoch: int, value: float) -> dict:
    return {"epoch": epoch, **{column: value for column in TAGS}}


def test_a_restarted_process_rewrites_the_history_without_the_stale_epochs(tmp_path, tensorboard):
    """A killed segment recorded epochs 1-3 but checkpointed only 2: the restart trains epoch 3
    again (another value). The event files then hold epochs 1, 2 and the new 3, each once."""
    cfg = TrainConfig(out=str(tmp_path), epochs=4)
    killed = Scalars(cfg, rank=0)
    killed.start([])  # as loop.train starts a fresh run
    history = []
    for epoch in (1, 2, 3):
        history.append(_row(epoch, float(epoch)))
        killed.epoch(history)  # flushed: on disk although the writer is never closed
    assert {step for _, step, _ in scalar_events(tmp_path / "tensorboard")} == {1, 2, 3}

    restarted = Scalars(cfg, rank=0)
    restarted.start(history[:2])  # the checkpoint's history
    history = [*history[:2], _row(3, 30.0)]  # then epoch 3 again
    restarted.epoch(history)
    history.append(_row(4, 40.0))
    restarted.epoch(history)  # the last epoch: closes the writer
    raw = scalar_events(tmp_path / "tensorboard")
    assert sorted({(step, value) for _, step, value in raw}) == [(1, 1), (2, 2), (3, 30), (4, 40)]
    assert len(raw) == 4 * len(TAGS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tensorboard"]  # no swap leftovers


def test_a_new_run_in_the_same_out_starts_its_scalars_anew(data_dir, tmp_path, tensorboard):
    """A run trained by hand in the --out of an earlier one, failing in its first epoch (a
    non-finite loss): its epochs.csv was its own header, its tensorboard/ the earlier run's
    two epochs, until its first epoch ended. Now the event files are the run's history from
    its start, as epochs.csv is: none."""
    out = tmp_path / "run"
    train(data_dir, out, "--epochs", "2", nproc=1)
    assert {step for _, step, _ in scalar_events(out / "tensorboard")} == {1, 2}
    failed = train(data_dir, out, "--epochs", "2", "--lr", "1e8", "--warmup-epochs", "0",
                   nproc=1, check=False)  # fmt: skip
    assert failed.returncode != 0 and "non-finite" in failed.stdout + failed.stderr
    assert read_epochs(out) == []
    assert scalar_events(out / "tensorboard") == []


@pytest.mark.parametrize("settings", [{"tensorboard": False}, {"rank": 1}])
def test_off_or_not_rank_0_writes_nothing(tmp_path, settings):
    cfg = TrainConfig(out=str(tmp_path), epochs=1, tensorboard=settings.get("tensorboard", True))
    scalars = Scalars(cfg, rank=settings.get("rank", 0))
    scalars.start([])
    scalars.epoch([_row(1, 1.0)])
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_is_no_part_of_the_experiment():
    assert TrainConfig().config_hash() == TrainConfig(tensorboard=False).config_hash()
    assert TrainConfig().config_hash() != TrainConfig(lr=0.2).config_hash()  # a hash of flags


def test_two_ranks_write_the_epochs_once(data_dir, tmp_path, tensorboard):
    out = tmp_path / "run"
    done = train(data_dir, out, "--epochs", "3", nproc=2)
    assert done.stdout.count("TensorBoard scalars per epoch ->") == 1, done.stdout
    assert_scalars_are_the_epochs(out)


def test_a_resumed_run_has_every_epoch_once(data_dir, tmp_path, tensorboard):
    """SIGTERM mid-run (checkpoint, exit 75), then the same command resumes: the scalars are the
    final epochs.csv, each epoch once, and rank 0's flushes lost nothing before the stop."""
    out, ckdir = tmp_path / "run", tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckdir), "--checkpoint-every", "2")
    _sigterm_after_epoch_1(data_dir, out, ckdir)
    stopped = {step for _, step, _ in scalar_events(out / "tensorboard")}
    assert stopped == {int(r["epoch"]) for r in read_epochs(out)}, stopped

    done = train(data_dir, out, *EPOCHS, *flags, nproc=1)
    assert "resuming from" in done.stdout
    assert read_metrics(out)["restarts"] == 1
    assert [int(r["epoch"]) for r in read_epochs(out)] == [1, 2, 3, 4]
    assert_scalars_are_the_epochs(out)


def test_without_tensorboard_one_line_and_nothing_written(data_dir, tmp_path, monkeypatch):
    """The stand-in makes `import tensorboard` fail in both ranks: the run completes, rank 0
    says once how to get it, and no event file or directory is written."""
    pythonpath = os.pathsep.join(filter(None, [str(NO_TENSORBOARD), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", pythonpath)  # the ranks inherit it (conftest.train)
    out = tmp_path / "run"
    done = train(data_dir, out, nproc=2)
    lines = [line for line in done.stdout.splitlines() if "TensorBoard" in line]
    assert len(lines) == 1 and "[rank 0/2" in lines[0], done.stdout
    assert "TensorBoard scalars off" in lines[0] and "pip install tensorboard" in lines[0]
    assert (out / "metrics.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["epochs.csv", "metrics.json"]


def test_a_full_disk_stops_the_scalars_not_the_training(tiny_fs, tensorboard, caplog, monkeypatch):
    """The disk fills under the event file: the failed flush was warned of, then close() in the
    same handler flushed again, and TensorBoard raised the same OSError out of epoch(), so the
    run died with its traceback (the module promises a warning and training on). Now one
    warning, the scalars stop, and every later epoch() returns quietly. TensorBoard's writer
    thread re-raised the error as it died, and Python's threading.excepthook printed its
    traceback beside the warning: that hook (here one that records) no longer hears of it."""
    import logging
    import threading

    unhandled = []
    monkeypatch.setattr(threading, "excepthook", unhandled.append)  # as Python's, which prints
    cfg = TrainConfig(out=str(tiny_fs), epochs=1000)
    scalars = Scalars(cfg, rank=0)
    scalars.start([])
    history = [_row(1, 1.0)]
    scalars.epoch(history)
    filler = (tiny_fs / "filler").open("wb", buffering=0)  # every free page of the tmpfs
    with filler, pytest.raises(OSError, match="No space left"):
        while True:
            filler.write(b"\0" * 4096)
    with caplog.at_level(logging.WARNING, logger="scalestudy"):
        for epoch in range(2, 200):  # the event file's last page fills within a few rows
            history.append(_row(epoch, float(epoch)))
            scalars.epoch(history)
    stops = [r.getMessage() for r in caplog.records if "TensorBoard scalars stop" in r.message]
    assert len(stops) == 1 and "No space left on device" in stops[0], stops
    assert str(tiny_fs / "tensorboard") in stops[0]
    assert not unhandled, [(a.thread, a.exc_value) for a in unhandled]


def test_a_thread_error_of_another_kind_or_thread_still_reaches_the_hook(monkeypatch):
    """Only TensorBoard's writer threads' OSError (said in the warning) is kept from the hook:
    any other thread's error, or another error of theirs (a bug), is printed as before."""
    import threading

    from scalestudy.trainer import scalars

    heard = []
    monkeypatch.setattr(threading, "excepthook", heard.append)
    scalars.quiet_writer_thread_errors()

    class Writer(threading.Thread):  # a thread class of TensorBoard's module
        __module__ = "tensorboard.summary.writer.event_file_writer"

    def fail(exc: BaseException) -> None:
        raise exc

    runs = [(Writer, OSError(28, "No space left on device")), (Writer, ValueError("bug"))]
    runs.append((threading.Thread, OSError(28, "No space left on device")))
    for kind, exc in runs:
        thread = kind(target=fail, args=(exc,))
        thread.start()
        thread.join()
    assert [type(a.exc_value) for a in heard] == [ValueError, OSError], heard


def test_a_broken_tensorboard_install_is_one_line_and_the_run_completes(
    data_dir, tmp_path, monkeypatch
):
    """tensorboard installed but failing at import (an old one under protobuf >= 4 raises a
    TypeError, not an ImportError): only ImportError was caught, so rank 0 died building the run
    with that traceback, and rank 1 with a closed connection; the scalars are on by default, so
    no run could train until --no-tensorboard. Now one warning from rank 0 names the error and
    the way out, and the run completes without scalars."""
    pythonpath = os.pathsep.join(
        filter(None, [str(BROKEN_TENSORBOARD), os.environ.get("PYTHONPATH")])
    )
    monkeypatch.setenv("PYTHONPATH", pythonpath)  # the ranks inherit it (conftest.train)
    out = tmp_path / "run"
    done = train(data_dir, out, nproc=2, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "TensorBoard" in line]
    assert len(lines) == 1 and "[rank 0/2" in lines[0], done.stderr[-3000:]
    assert "TypeError: Descriptors cannot be created directly" in lines[0], lines
    assert "--no-tensorboard" in lines[0] and "Traceback" not in done.stderr, lines
    assert sorted(p.name for p in out.iterdir()) == ["epochs.csv", "metrics.json"]
