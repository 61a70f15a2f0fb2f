"""A launch of ranks (torchrun, `python -m scalestudy.jobs.local_ranks`, srun) started by
another command, run to its end with the stop signals passed on: `profile capture` and
`profile ncu` (jobs/profile.py run_launch) and benchmarks/compare.py's runs.

A module apart from jobs/local_ranks.py, whose agent every training job runs: an edit here
reruns the profiling jobs that import it, never a training run.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

from scalestudy import log
from scalestudy.jobs import local_ranks


def kill_launch(proc: subprocess.Popen) -> None:
    """SIGKILL to a launch started in a session of its own (start_new_session) and to its
    ranks (kill_tree), then waited for."""
    local_ranks.kill_tree(proc.pid)
    proc.kill()  # where its group was not found (a no-op once it has ended)
    proc.wait()


class Stopped(Exception):
    """A stop signal (SIGTERM, SIGHUP) to this process while a launch ran (run_to_end), raised
    once the launch has ended, as Ctrl-C raises KeyboardInterrupt. `signum` is the signal's."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signal.Signals(signum)


# how long a launch may take to end after a stop signal passed on: its grace is
# local_ranks.STOP_GRACE_S before it kills its ranks (shutdown_timeout), a trainer stopping on
# SIGTERM saves at its next epoch's end (trainer/checkpoint.StopFlag)
STOP_WAIT_S = 90


def run_to_end(
    argv: list[str],
    env: dict[str, str],
    say_kill: Callable[[int, str], None],
    stdout=None,
    stderr=None,
    popen: Callable[..., subprocess.Popen] = subprocess.Popen,
) -> int:
    """A launch of ranks (torchrun, jobs/local_ranks, srun) to its end: its exit status. It runs in
    a session of its own, and a stop signal to this process (Ctrl-C, SIGTERM, SIGHUP) is passed
    on to it once, then it is waited for; a second signal, or no end in STOP_WAIT_S, kills it
    and its ranks' process groups (kill_launch), after `say_kill(pid, why)` (`popen` starts it:
    a caller's own module's subprocess.Popen, which its tests replace). Then Ctrl-C raises
    KeyboardInterrupt, another signal Stopped. A signal ignored here (nohup's SIGHUP) stays
    ignored; each signal's handler is this process's again on return.
    Under subprocess.run in this process's group, a signal to this process alone (`timeout`,
    `kill PID`) killed it and left the launch and its ranks training, orphaned, holding the
    device; a terminal's Ctrl-C reached both, and subprocess.run SIGKILLed the launch 0.25 s
    later, while torchrun passed it on to its ranks (each in a session of its own)."""
    held: list[int] = []
    before = {}
    for signum in log.STOPS:  # noted from before the launch starts: none is lost inside Popen
        if signal.getsignal(signum) is not signal.SIG_IGN:
            before[signum] = signal.signal(signum, lambda signum, frame: held.append(signum))
    try:
        proc = popen(argv, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        passed, deadline = 0, None
        while True:
            seen = len(held)  # once per look: a signal during the send below is a next one
            if seen > passed:
                if passed or seen > 1:  # a second signal (two may come in one poll)
                    say_kill(proc.pid, "a second stop signal")
                    kill_launch(proc)
                else:
                    proc.send_signal(held[0])
                    deadline = time.monotonic() + STOP_WAIT_S
                passed = seen
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    say_kill(proc.pid, f"not ended {STOP_WAIT_S} s after the stop signal")
                    kill_launch(proc)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    if held:
        raise KeyboardInterrupt if held[0] == signal.SIGINT else Stopped(held[0])
    return code
