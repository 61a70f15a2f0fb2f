"""`python -m scalestudy.jobs.local_ranks <torchrun's arguments>`: one node's ranks, as
`python -m torch.distributed.run` starts them (its parser, rendezvous and worker agent, run in
this process), with the ends of a run said as the rest of scalestudy says them.

torchrun itself ends every run that is not a success in a traceback of its own process and exit
1 (`@record` around its main): Ctrl-C was its SignalException (30 lines after rank 0's one
`interrupted`), a rank's failure its ChildFailedError report (40), and a stop's 75 (checkpoint
saved, rerun to resume) became 1. Here:
- Ctrl-C (SIGINT to the agent; the terminal sends it to the ranks too, and the agent passes it
  on): rank 0's line is the one line, and this process ends killed by SIGINT
  (log.end_by_sigint: a shell's 130, and a shell loop over runs stops). Before any rank
  started: `scalestudy launch: interrupted`. torchrun's two warnings that it got SIGINT and
  passes it on, which restate the user's Ctrl-C, are left out; its other messages are not.
- another signal torchrun handles (SIGTERM, SIGHUP, SIGQUIT): torchrun sends it to the ranks and
  kills those still running after its shutdown timeout, as before; one line, exit 128 + N.
- a rank that failed: one line naming the first to fail (its own lines above say why) and its
  exit status is this process's: 75 (every rank stopped after its checkpoint, the ranks having
  said so) passes through silently, 2 (a rank's expected error) stays 2; a rank killed by signal
  N is 128 + N, by SIGINT the interrupt.
`--debug` (SCALESTUDY_DEBUG) adds torchrun's traceback to the line.
"""

from __future__ import annotations

import logging
import signal
import sys

from scalestudy import log

logger = log.get("scalestudy.launch")


class _QuietInterrupt(logging.Filter):
    """torchrun's warnings "Received SIGINT death signal, shutting down workers" and "Sending
    process P closing signal SIGINT": the Ctrl-C the user just pressed (other signals' are
    kept: nobody at the terminal sent those)."""

    def filter(self, record: logging.LogRecord) -> bool:
        shutdown = record.msg in (
            "Received %s death signal, shutting down workers",
            "Sending process %s closing signal %s",
        )
        args = record.args if isinstance(record.args, tuple) else ()
        # the signal is the last argument of both: Signals.SIGINT (formatted "2"), "SIGINT"
        return not (shutdown and args and str(args[-1]) in ("2", "SIGINT", "Signals.SIGINT"))


# the loggers of torchrun's agent and of its worker processes' handling
TORCHRUN_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
)


def main(argv: list[str]) -> int:
    log.setup()
    try:
        return _run(argv)
    except KeyboardInterrupt:  # before torchrun handles SIGINT (torch's import too): no rank ran
        log.expected_error(logger, "scalestudy launch: interrupted", "run")
        log.end_by_sigint()
        return 130


def _run(argv: list[str]) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    for name in TORCHRUN_LOGGERS:
        logging.getLogger(name).addFilter(_QuietInterrupt())
    args = torchrun.parse_args(argv)
    try:
        torchrun.run(args)  # torchrun's main without @record, whose traceback is the problem
        return 0
    except SignalException as exc:
        if exc.sigval == signal.SIGINT:  # the ranks were running: rank 0 said it
            log.end_by_sigint()
            return 130
        name = signal.Signals(exc.sigval).name
        logger.error(
            f"scalestudy launch: stopped by {name}: the ranks were sent {name}, and any still "
            "running after torchrun's shutdown timeout killed",
            exc_info=log.debug(),
        )
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        return _failed(exc, args.nproc_per_node)


def _failed(exc, world_size) -> int:
    """The exit status of a run whose first failed rank is exc's (the module docstring)."""
    rank, failure = exc.get_first_failure()
    code = failure.exitcode
    if code == -signal.SIGINT:
        log.end_by_sigint()
        return 130
    if code < 0:
        what, status = f"was killed by {failure.signal_name()}", 128 - code
    else:
        what, status = f"exited {code}", code
    if status != 75:  # a stop: every rank said it saved its checkpoint
        logger.error(
            f"scalestudy launch: rank {rank} of {world_size} {what} (the first to fail; its "
            "lines above say why, and the other ranks were stopped)",
            exc_info=log.debug(),
        )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
