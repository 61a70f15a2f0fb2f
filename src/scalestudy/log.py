"""One logging set-up for every command: `log.setup()` once per process, `log.get(__name__)`.

Progress (INFO) goes to stdout and problems (WARNING and above) to stderr, as the plain prints
did, so logs and tests read the same streams. In a training job every message carries
`[rank r/W host]` and only rank 0 prints progress: with 64 ranks, 64 copies of "epoch 3/10"
hide the one warning that matters. Warnings and errors are printed by every rank.
"""

from __future__ import annotations

import logging
import sys

ROOT = "scalestudy"


class _Console(logging.Handler):
    """INFO and below to stdout, WARNING and above to stderr; the stream is looked up at each
    message, so a redirected sys.stdout (pytest's capsys, contextlib.redirect_stdout) is used."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed pipe must not end training
            self.handleError(record)


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
) -> logging.Logger:
    """Configure the `scalestudy` logger (idempotent: a second call replaces the first).

    Without a rank: messages as they are. With one: `[rank r/W host] message`, and INFO only
    from rank 0."""
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
