"""`python -m scalestudy.jobs.local_ranks <torchrun's arguments>`: one node's ranks, as
`python -m torch.distributed.run` starts them (its parser, rendezvous and worker agent, run in
this process), with the ends of a run said as the rest of scalestudy says them.

torchrun itself ends every run that is not a success in a traceback of its own process and exit
1 (`@record` around its main): Ctrl-C was its SignalException (30 lines after rank 0's one
`interrupted`), a rank's failure its ChildFailedError report (40), and a stop's 75 (checkpoint
saved, rerun to resume) became 1. Here:
- Ctrl-C (SIGINT to the agent, which passes it on: torchrun starts each rank in a session of
  its own, out of the terminal's reach): rank 0's line is the one line, and this process ends
  killed by SIGINT (log.end_by_sigint: a shell's 130, and a shell loop over runs stops).
  Before any rank started: `scalestudy launch: interrupted`. torchrun's two warnings that it
  got SIGINT and passes it on, which restate the user's Ctrl-C, are left out; its other
  messages are not.
- SIGTERM, SIGHUP or SIGUSR1 to this process alone (a batch system's or `timeout`'s stop of the
  launcher, a hang-up, the ranks' checkpoint-and-stop): passed on to each rank's process group,
  as torchrun would, and the ranks' own end is the run's (below): a stop's 75 where they
  checkpointed (torchrun made every such end its SignalException: 128 + N, and a wrapper could
  not tell a stop to rerun from a crash). Ranks still running after the grace
  (--shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else STOP_GRACE_S: time to reach
  the epoch's end and save) are killed, as torchrun did: one line, 128 + N.
  A signal ignored (nohup's SIGHUP) stays ignored.
- SIGQUIT: torchrun sends it to the ranks and kills those still running after its shutdown
  timeout, as before; one line, exit 128 + N.
- a rank that failed: one line naming the first to fail (its own lines above say why) and its
  exit status is this process's: 75 (every rank stopped after its checkpoint, the ranks having
  said so) passes through silently (torchrun's own "failed (exitcode: 75)" line left out),
  2 (a rank's expected error) stays 2; a rank killed by signal N is 128 + N, by SIGINT the
  interrupt.
`--debug` (SCALESTUDY_DEBUG) adds torchrun's traceback to the line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from scalestudy import log, vocab

logger = log.get("scalestudy.launch")


class _QuietInterrupt(logging.Filter):
    """torchrun's warnings "Received SIGINT death signal, shutting down workers" and "Sending
    process P closing signal SIGINT": the Ctrl-C the user just pressed (other signals' are
    kept: nobody at the terminal sent those). And "Received 9 death signal": no process
    receives a SIGKILL it can report, this is _PassOn's end of the grace, which the launch's
    own line says. And "failed (exitcode: 75) local_rank: ...": the ranks' stop after their
    checkpoint, which passes through silently (_failed), called a failure at ERROR level; with
    the stop this launch passed on (`passing`: SIGTERM, SIGHUP), "failed (exitcode: -15)" of a
    rank that died of it and torchrun's shutdown of the others by it, which the launch's own
    line ("stopped by SIGTERM") says."""

    def __init__(self, passing: _PassOn | None = None) -> None:
        super().__init__()
        self.passing = passing  # the stop this launch passes on to the ranks, once it came

    def filter(self, record: logging.LogRecord) -> bool:
        received = record.msg == "Received %s death signal, shutting down workers"
        shutdown = received or record.msg == "Sending process %s closing signal %s"
        args = record.args if isinstance(record.args, tuple) else ()
        passed = self.passing.signum if self.passing is not None else None
        # a rank's end by the stop passed on to it (a SIGTERM: exitcode -15) is no failure
        # either: the launch's own line says it
        stops = (75, -passed) if passed else (75,)
        if str(record.msg).startswith("failed (exitcode: %s)") and args and args[0] in stops:
            return False
        # the signal is the last argument of both: Signals.SIGINT (formatted "2"), "SIGINT"
        sig = str(args[-1]) if args else ""
        if received and sig in ("9", "Signals.SIGKILL"):
            return False
        quiet = {"2", "SIGINT", "Signals.SIGINT"}
        if passed:  # the ranks' shutdown by the same signal this launch passed on
            name = signal.Signals(passed).name
            quiet |= {str(int(passed)), name, f"Signals.{name}"}
        return not (shutdown and sig in quiet)


# the loggers of torchrun's agent and of its worker processes' handling
TORCHRUN_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
)


# the ranks' stop signals, which this process passes on to them instead of torchrun: torchrun's
# handler raises its SignalException, and the ranks' exit statuses are lost with it; SIGUSR1
# (the ranks' checkpoint-and-stop) killed this process by its default action, and the ranks,
# in sessions of their own, trained on with no one watching
PASSED_ON = vocab.RANK_STOP_SIGNALS
# the ranks' time to end after a stop passed on, without a --shutdown-timeout or
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT: a rank stops at its epoch's end, after its checkpoint
# (trainer/checkpoint.StopFlag); at torchrun's 30 s an epoch of 40 s was killed unsaved, the
# launch 143 for the stop's 75. Below supervise.STOP_WAIT_S, which waits for the launch
STOP_GRACE_S = 80


def children(pid: int | str = "self") -> list[int]:
    """The child processes of process `pid` (this one by default), from Linux /proc: every
    thread's ([] where /proc has none, or `pid` is gone)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):  # no /proc, or the process ended meanwhile
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                found.update(int(child) for child in (task / "children").read_text().split())
    return sorted(found)


def rank_groups(pid: int | str = "self") -> list[int]:
    """The process groups of torchrun's ranks: the children of process `pid` (this one by
    default: the agent) that lead one (torchrun starts each rank in a session of its own and
    signals its group), from Linux /proc ([] where it is gone)."""
    groups = []
    for child in children(pid):
        try:
            if os.getpgid(child) == child:
                groups.append(child)
        except ProcessLookupError:  # exited meanwhile
            pass
    return groups


def descendants(pid: int) -> list[int]:
    """Every process below process `pid` (children, theirs, ...), parents before children."""
    found, todo = [], children(pid)
    while todo:
        found.append(todo.pop(0))
        todo += children(found[-1])
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL to the process group of process `pid` (started in a session of its own) and to
    every process below it, each with its group. torchrun starts each rank in a session of its
    own, which a kill of the launch's group alone never reached (a rank hung in a collective,
    not heeding its signal, ran on, orphaned, holding the device; gpu-check's checks start
    torchrun under `scalestudy launch`, a level further down): they are read while the
    launch lives (once it is gone they are init's), then killed, a rank's group with it (its
    DataLoader workers)."""
    for p in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            try:
                os.killpg(p, signal.SIGKILL)
            except ProcessLookupError:  # no group of its own: the process alone
                os.kill(p, signal.SIGKILL)


class _PassOn:
    """SIGTERM/SIGHUP/SIGUSR1 to this process: sent to every rank's process group, whose ends
    torchrun's agent then reports as any rank's (ChildFailedError: the stop's 75). Those still
    running `grace_s` later are killed: SIGALRM raises torchrun's own SignalException with
    SIGKILL, its shutdown then kills them. Before any rank started, the signal ends the launch
    at once."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None

    def install(self, args) -> bool:
        """Whether this process passes PASSED_ON on: not where /proc lists no children, nor
        under an older torchrun without --signals-to-handle, whose agent installs its
        own handler for them (the ranks' 75 is then its 128 + N, as before)."""
        if not hasattr(args, "signals_to_handle"):
            return False
        if not Path(f"/proc/self/task/{os.getpid()}/children").exists():
            return False
        for sig in PASSED_ON:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, self._handle)
        signal.signal(signal.SIGALRM, self._kill)
        return True

    def _handle(self, signum, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        first = self.signum is None
        self.signum = signum
        groups = rank_groups()
        if not groups:  # no rank yet: nothing to stop but the launch
            raise SignalException(f"got {signal.Signals(signum).name}", sigval=signum)
        for group in groups:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(group, signum)
        if first:
            signal.setitimer(signal.ITIMER_REAL, max(self.grace_s, 0.001))

    def _kill(self, signum, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        raise SignalException("the ranks did not stop in time", sigval=signal.SIGKILL)


def shutdown_timeout(args) -> float:
    """The ranks' grace to end after a stop passed on (_PassOn): torchrun's --shutdown-timeout
    where given, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else STOP_GRACE_S. A torchrun without the
    option (torch 2.11: its parser has none; an AttributeError once) takes the variable too:
    the grace is this process's timer, not torchrun's."""
    if getattr(args, "shutdown_timeout", None) is not None:
        return args.shutdown_timeout
    return int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", STOP_GRACE_S))


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

    args = torchrun.parse_args(argv)
    passing = _PassOn(shutdown_timeout(args))
    if passing.install(args):  # torchrun handles the rest
        handled = [s.strip() for s in args.signals_to_handle.split(",")]
        args.signals_to_handle = ",".join(s for s in handled if s not in _names(PASSED_ON))
    quiet = _QuietInterrupt(passing)
    for name in TORCHRUN_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    try:
        torchrun.run(args)  # torchrun's main without @record, whose traceback is the problem
        return 0
    except SignalException as exc:
        if exc.sigval == signal.SIGINT:  # the ranks were running: rank 0 said it
            log.end_by_sigint()
            return 130
        sigval = passing.signum or exc.sigval  # SIGKILL: ours, after the grace
        name = signal.Signals(sigval).name
        logger.error(
            f"scalestudy launch: stopped by {name}: the ranks were sent {name}, and any still "
            f"running after the grace ({passing.grace_s:g} s) killed",
            exc_info=log.debug(),
        )
        return 128 + int(sigval)
    except ChildFailedError as exc:
        return _failed(exc, args.nproc_per_node, passing.signum)
    finally:
        for name in TORCHRUN_LOGGERS:  # this launch's: a later one in this process has its own
            logging.getLogger(name).removeFilter(quiet)
        signal.setitimer(signal.ITIMER_REAL, 0)
        # what torchrun's shutdown left: a second Ctrl-C (or our grace's SIGALRM) raised inside
        # its wait for a hung rank, and it ended without its kills; those ranks lived on,
        # orphaned, holding their GPU slots (every later run on those GPUs waited for ever)
        for rank in children():
            kill_tree(rank)


def _names(signals) -> set[str]:
    return {signal.Signals(s).name for s in signals}


def _failed(exc, world_size, stopped_by: int | None = None) -> int:
    """The exit status of a run whose first failed rank is exc's (the module docstring);
    `stopped_by`: the signal this process passed on to the ranks, if any."""
    rank, failure = exc.get_first_failure()
    code = failure.exitcode
    if code == -signal.SIGINT:
        log.end_by_sigint()
        return 130
    if stopped_by is not None and code == -stopped_by:  # the ranks died of the launcher's stop
        name = signal.Signals(stopped_by).name
        logger.error(f"scalestudy launch: stopped by {name}: the ranks were sent {name}")
        return 128 + stopped_by
    if code < 0:
        what, status = f"was killed by {failure.signal_name()}", 128 - code
    else:
        what, status = f"exited {code}", code
    why = "its lines above say why, and"
    if code == -signal.SIGKILL:  # no one in the run sends it: the rank printed nothing
        why = (
            "from outside the run, so it printed nothing: an out-of-memory kill is in the "
            "kernel log, `dmesg`;"
        )
    elif code < 0:  # its own crash (SIGSEGV, SIGABRT) may have printed a trace, or nothing
        why = "its lines above, if any, say why, and"
    if status != 75:  # a stop: every rank said it saved its checkpoint
        logger.error(
            f"scalestudy launch: rank {rank} of {world_size} {what} (the first to fail; {why} "
            "the other ranks were stopped)",
            exc_info=log.debug(),
        )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
