"""One logging set-up for every command: `log.setup()` once per process, `log.get(__name__)`.

Progress (INFO) goes to stdout and problems (WARNING and above) to stderr, as the plain prints
did, so logs and tests read the same streams; where a command writes an output to its own stdout
(`--out-csv /dev/stdout`), progress goes to stderr too (cli.py), not into that output. In a
training job every message carries `[rank r/W host]` and only rank 0 prints progress: with 64
ranks, 64 copies of "epoch 3/10" hide the one warning that matters. Warnings and errors are
printed by every rank, except an expected error (`expected_error`): it is printed by the ranks
its `scope` names (errors.py), once per run or per node when every rank would say the same, with
no traceback.

A stream whose reader is gone (a pipe's reader left, `| head`; a terminal that hung up) gets
nothing more: its descriptor is pointed at /dev/null (`to_devnull`) and the command goes on.
Any other failed write (a full disk, a failing one) is said by logging's own error report.

`SCALESTUDY_DEBUG=1` (`scalestudy --debug` sets it, so the ranks a launcher starts inherit it)
shows the traceback of expected errors too, from every rank.

A program that Ctrl-C ended says so in one line and calls `end_by_sigint()`: once it has
cleaned up it kills itself with SIGINT (`_end_by_signal`), so a shell's loop over runs stops.
One that a stop signal ended (SIGTERM, SIGHUP: cli.py) calls `end_by_signal(signum)` and dies
of that signal the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import signal
import stat
import sys
import traceback
from pathlib import Path
from typing import IO

ROOT = "scalestudy"
DEBUG_ENV = "SCALESTUDY_DEBUG"
# (rank, local rank) of this process in a training job, None elsewhere: who prints an error
_place: tuple[int, int] | None = None
# Ctrl-C and the stop signals (a time limit, `timeout`, a closed terminal): what a program that
# starts others passes on or holds (jobs/supervise.py, jobs/gpu_check.py, trainer/progress.py)
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# the signal that ended the program (Ctrl-C's SIGINT, a stop's SIGTERM or SIGHUP), None while
# none did: it ends killed by that signal, once it has cleaned up (end_by_signal)
_interrupted: int | None = None


def end_by_sigint() -> None:
    """Ctrl-C ended this program (its one line said): end_by_signal(SIGINT)."""
    end_by_signal(signal.SIGINT)


def end_by_signal(signum: int) -> None:
    """The signal `signum` ended this program (its one line said): at its exit, once it has
    cleaned up, it kills itself with that signal (_end_by_signal). Only a program's own entry
    point calls this, never a function a Python caller may call (the caller's process would
    die)."""
    global _interrupted
    _interrupted = signum


@atexit.register  # at import, before torch's and the others': the last exit handler to run
def _end_by_signal() -> None:
    """Once an interrupted program has cleaned up (its threads joined, the other exit handlers
    run), it kills itself with the signal that ended it, as Python ends on an unhandled Ctrl-C:
    a shell's loop over runs then stops (bash goes on after a child that exited by itself, even
    with 130, taking the interrupt as handled), and a shell or Snakemake sees 143 (SIGTERM) or
    129 (SIGHUP) as from a program the signal killed. Python's own way, the KeyboardInterrupt
    left unhandled, printed a traceback, and after a training run ended in exit 1 all the
    same."""
    if not _interrupted:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {_interrupted})
    signal.signal(_interrupted, signal.SIG_DFL)
    os.kill(os.getpid(), _interrupted)


def debug() -> bool:
    """SCALESTUDY_DEBUG is set to anything but empty or 0."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


_progress_to_stderr = False  # setup's progress_to_stderr, kept for its later calls (_Console)


class _Console(logging.Handler):
    """INFO and below to stdout (to stderr with `progress_to_stderr`: a command's output is
    stdout), WARNING and above to stderr; the stream is looked up at each message, so a
    redirected sys.stdout (pytest's capsys, contextlib.redirect_stdout) is used, and none
    (stdout closed: `>&-`, Python's sys.stdout None) drops the message."""

    def emit(self, record: logging.LogRecord) -> None:
        to_stderr = record.levelno >= logging.WARNING or _progress_to_stderr
        stream = sys.stderr if to_stderr else sys.stdout
        if stream is None:
            return
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except OSError as e:
            if _reader_gone(e, stream):
                # handleError printed a "--- Logging error ---" traceback for every later
                # message
                to_devnull(stream)
            else:  # a file's EIO is a failing disk: said, as any other failed write
                self.handleError(record)
        except Exception:  # nor may any other failed write end training
            self.handleError(record)


def _reader_gone(e: OSError, stream: IO) -> bool:
    """Whether the write error `e` says that nobody reads `stream` any more: a pipe whose
    reader left (`| head`: BrokenPipeError), or a terminal that hung up (a closed ssh session:
    EIO on a character device; the run stops on its SIGHUP, trainer/checkpoint.StopFlag)."""
    if isinstance(e, BrokenPipeError):
        return True
    if e.errno != errno.EIO:
        return False
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return stat.S_ISCHR(os.fstat(stream.fileno()).st_mode)
    return False


def to_devnull(stream: IO) -> None:
    """Point `stream`'s descriptor at /dev/null: its reader is gone (`| head`), so what is
    still written, and the buffer's flush at exit ("Exception ignored ... BrokenPipeError"),
    goes nowhere, as Python's docs advise (signal module, "Note on SIGPIPE"). A stream without
    a descriptor (pytest's capture) is left as it is."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)


class _RankZeroProgress(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0 or record.levelno >= logging.WARNING


def setup(
    rank: int | None = None,
    world_size: int | None = None,
    host: str | None = None,
    level: int = logging.INFO,
    local_rank: int = 0,
    progress_to_stderr: bool | None = None,
) -> logging.Logger:
    """Configure the `scalestudy` logger (idempotent: a second call replaces the first).

    Without a rank: messages as they are. With one: `[rank r/W host] message`, and INFO only
    from rank 0. `progress_to_stderr`: INFO to stderr too (an output written to stdout: the
    CLI's call says so, and a command's own later call keeps it, None)."""
    global _place, _progress_to_stderr
    _place = None if rank is None else (rank, local_rank)
    if progress_to_stderr is not None:
        _progress_to_stderr = progress_to_stderr
    logger = logging.getLogger(ROOT)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = _Console()
    prefix = ""
    if rank is not None:
        where = f" {host}" if host else ""
        prefix = f"[rank {rank}/{world_size}{where}] "
        handler.addFilter(_RankZeroProgress(rank))
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger


def get(name: str) -> logging.Logger:
    """The logger of a module (`log.get(__name__)`), a child of `scalestudy`."""
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)


def reports(scope: str) -> bool:
    """Whether this process prints an expected error of `scope` (see expected_error)."""
    rank, local_rank = _place if _place else _launched_place()
    return {"run": rank == 0, "node": local_rank == 0}.get(scope, True) or debug()


def _launched_place() -> tuple[int, int]:
    """(rank, local rank) from the launcher's environment (torchrun's, else srun's), for a rank
    whose logging is not placed yet (a Ctrl-C while the ranks start: each printed the run's
    line); (0, 0) outside a launch."""
    for rank, local in (("RANK", "LOCAL_RANK"), ("SLURM_PROCID", "SLURM_LOCALID")):
        if os.environ.get(rank, "").isdigit():
            local_rank = os.environ.get(local, "")
            return int(os.environ[rank]), int(local_rank) if local_rank.isdigit() else 0
    return 0, 0


def expected_error(logger: logging.Logger, message: str, scope: str = "rank") -> None:
    """Log an expected error (errors.ScalestudyError) as one line, without a traceback.

    In a training job only the ranks that `scope` names print it: "run" = rank 0, "node" = each
    node's local rank 0, "rank" = every rank; the others, which hit the same error, are silent.
    With SCALESTUDY_DEBUG every rank prints it, followed by its traceback."""
    if reports(scope):
        logger.error(message, exc_info=debug())


@contextlib.contextmanager
def rule_log(path: str | os.PathLike, outputs):
    """A Snakemake `run:` rule's `log:` file: the block's warnings (the `scalestudy` loggers'),
    then "wrote <outputs>" when it succeeds; on an error, the error's one line and its
    traceback, then the error goes on (Snakemake then points at a log that says what went
    wrong, not at an empty file, nor at "wrote" when a PDF lost characters)."""
    # plain writes, not files.write_text: log.py imports nothing of scalestudy, so every rule
    # whose command logs does not get files.py as a code input (study/resources.py)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    warned = _Collect(logging.WARNING)
    logging.getLogger(ROOT).addHandler(warned)
    try:
        yield
    except BaseException as exc:
        text = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
        path.write_text(warned.text() + text, "utf-8")
        raise
    finally:
        logging.getLogger(ROOT).removeHandler(warned)
    path.write_text(f"{warned.text()}wrote {' '.join(map(str, outputs))}\n", "utf-8")


class _Collect(logging.Handler):
    """The messages of the records it is given, one per line."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def text(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)
