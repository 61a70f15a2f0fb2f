"""TensorBoard scalars per epoch, to watch runs live: `tensorboard --logdir results/runs`.

Rank 0 writes `--out/tensorboard/` (so TensorBoard names each run by its run directory) once per
epoch, from loop.end_of_epoch right after epochs.csv: the rows of epochs.csv as scalars with
global step = epoch (`TAGS`); and at the run's start, before training, the rows so far (start()).
That is outside the throughput window, and nothing here touches the model or the data, so it
cannot change a measured number (--tensorboard is in config.NOT_IDENTITY). Other ranks write
nothing.

tensorboard is an optional dependency (`pip install tensorboard`, or the `tensorboard` extra):
without it, or with --no-tensorboard, nothing is written; the missing package is said in one
info line (an installed one that fails to import, in one warning) and never fails a run. A
failed write (a full disk) warns once and stops the scalars, not the training. TensorBoard's
writer thread re-raises the error as it dies, which Python's threading.excepthook printed as a
traceback beside that warning: rank 0 keeps such an OSError of TensorBoard's threads from the
hook (quiet_writer_thread_errors; every write is flushed in epoch(), which raises it again).

Resume: the event files are a function of state.history, like epochs.csv. A process's start
(start(), from loop.train where it writes epochs.csv) writes every row of the history (the
checkpoint's epochs; none on a fresh start) into a new directory, which then replaces
`--out/tensorboard/` by two renames; later epochs are appended and flushed one by one, so a
preempted run (exit 75) or a killed one loses nothing it recorded.
Not `SummaryWriter(purge_step=...)`: that only hides the superseded events (epochs after a killed
segment's last checkpoint, trained again now) from readers that honour its SessionLog START;
the stale event files would stay on disk, other readers would show those epochs twice, and a
deleted `tensorboard/` would not come back. The cost: rewritten rows carry the wall time of the
rewrite (the history stores no clock), so TensorBoard's "wall" and "relative" axes are true
within a segment only; the step axis (epoch) is always true.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from scalestudy import log
from scalestudy.trainer.config import TrainConfig

logger = log.get(__name__)

SUBDIR = "tensorboard"  # under --out
# epochs.csv column -> TensorBoard tag; losses and accuracies share a chart each (the prefix)
TAGS = {
    "train_loss": "loss/train",
    "val_loss": "loss/val",
    "train_acc": "acc/train",
    "val_acc": "acc/val",
    "lr": "lr",
    "throughput_img_s": "throughput_img_s",
    "epoch_time_s": "epoch_time_s",
}
HOW_TO_GET = "pip install tensorboard, or pip install 'scalestudy[tensorboard]'"


class Scalars:
    """Rank 0's TensorBoard writer of one run; `epoch(history)` after each epoch's row."""

    def __init__(self, cfg: TrainConfig, rank: int) -> None:
        self.directory = Path(cfg.out) / SUBDIR
        self.last_epoch = cfg.epochs
        self._writer_class = summary_writer_class() if cfg.tensorboard and rank == 0 else None
        self._writer: Any = None  # open from the first epoch() of this process
        if self._writer_class is not None:
            quiet_writer_thread_errors()
            logger.info(f"TensorBoard scalars per epoch -> {self.directory}")

    def start(self, history: list[dict]) -> None:
        """The event files from the run's start, as loop.train writes epochs.csv: every row of
        `history` (the checkpoint's epochs; none on a fresh start). An earlier run's in the same
        --out, or a killed segment's epochs past its checkpoint, stayed until the first epoch
        ended, beside this run's epochs.csv: for ever where the run failed before that."""
        if self._writer_class is None:
            return
        try:
            self._writer = self._rewrite(history)
            self._writer.flush()
        except OSError as exc:
            self._stop("at the run's start", exc)

    def epoch(self, history: list[dict]) -> None:
        """Record the newest row of `history` after start(), flush, and close after the run's
        last epoch."""
        if self._writer is None:  # off, not rank 0, stopped by a failed write, or closed
            return
        try:
            _add(self._writer, history[-1])
            self._writer.flush()
            if history[-1]["epoch"] >= self.last_epoch:
                self.close()
        except OSError as exc:
            self._stop(f"after epoch {history[-1]['epoch']}", exc)

    def _stop(self, when: str, exc: OSError) -> None:
        logger.warning(
            f"WARNING: TensorBoard scalars stop {when}: cannot write {self.directory}: {exc}"
        )
        # TensorBoard keeps its writer thread's error and raises it at every flush, close()'s
        # too: let through, it left this handler and ended the run it promised to spare
        with contextlib.suppress(OSError):
            self.close()

    def close(self) -> None:
        """Nothing more is written (the epochs so far are on disk: each epoch was flushed)."""
        writer, self._writer, self._writer_class = self._writer, None, None  # off even if it raises
        if writer is not None:
            writer.close()

    def _rewrite(self, history: list[dict]) -> Any:
        """Every row so far into a new directory that replaces the old one; returns a writer
        appending to it."""
        fresh = self.directory.with_name(f".{SUBDIR}-new")
        old = self.directory.with_name(f".{SUBDIR}-old")
        for leftover in (fresh, old):  # of a process killed mid-swap
            shutil.rmtree(leftover, ignore_errors=True)
        writer = self._writer_class(log_dir=str(fresh))
        for row in history:
            _add(writer, row)
        writer.close()
        if self.directory.exists():
            os.rename(self.directory, old)
        os.rename(fresh, self.directory)
        shutil.rmtree(old, ignore_errors=True)
        # a second event file in the same directory: TensorBoard reads them in order as one run
        return self._writer_class(log_dir=str(self.directory))


def _add(writer: Any, row: dict) -> None:
    for column, tag in TAGS.items():
        writer.add_scalar(tag, row[column], global_step=row["epoch"])


def quiet_writer_thread_errors() -> None:
    """threading.excepthook (Python's prints a traceback) no longer hears of an OSError that
    ended one of TensorBoard's threads: its writer thread keeps the error and the next flush
    raises it in epoch(), whose one warning says it. Any other thread's error, or another
    error of theirs (a bug), still reaches the hook. Installed once per hook."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: Any) -> None:
        tensorboards = type(args.thread).__module__.startswith("tensorboard.")
        if not (tensorboards and issubclass(args.exc_type, OSError)):
            previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def summary_writer_class() -> Any:
    """torch's SummaryWriter, or None with one line: info when tensorboard is not installed, a
    warning when it is but fails to import."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch.utils.tensorboard imports the tensorboard package
        logger.info(f"TensorBoard scalars off: cannot import tensorboard ({exc}); {HOW_TO_GET}")
        return None
    except Exception as exc:
        # installed but broken: an old tensorboard under protobuf >= 4 raises a TypeError
        # ("Descriptors cannot be created directly"), which ended every run at its start
        first = str(exc).splitlines()[0] if str(exc) else ""
        logger.warning(
            f"WARNING: TensorBoard scalars off: importing tensorboard failed "
            f"({type(exc).__name__}: {first}); repair it (pip install -U tensorboard protobuf) "
            "or pass --no-tensorboard"
        )
        return None
    return SummaryWriter
