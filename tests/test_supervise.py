"""jobs/supervise.py: a launch of ranks run to its end by another command (profile capture and
ncu, compare.py), its stop signals passed on once, a second one or no end in STOP_WAIT_S
killing it. A real process in a session of its own stands in for the launch: one that ignores
the signals passed on, as a rank hung in a collective does."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from scalestudy.jobs import supervise

# a launch that heeds no stop signal (inherited as ignored by the sleep it becomes)
DEAF = ["sh", "-c", "trap '' TERM INT HUP; exec sleep 600"]


def deaf(argv, **kwargs) -> subprocess.Popen:
    """DEAF started, once it ignores the signals (a signal before the shell's trap killed it)."""
    proc = subprocess.Popen(argv, **kwargs)
    deadline = time.monotonic() + 30
    try:
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
            assert time.monotonic() < deadline and proc.poll() is None, "the stand-in hung"
            time.sleep(0.01)
    except BaseException:  # it ignores SIGTERM: killed here, not left behind
        proc.kill()
        proc.wait()
        raise
    return proc


def _run(popen, monkeypatch, wait_s: float = 60) -> tuple[list, list, float]:
    """(the kills said, the processes started, seconds taken) of run_to_end(DEAF) raising
    Stopped(SIGTERM)."""
    monkeypatch.setattr(supervise, "STOP_WAIT_S", wait_s)
    said, started = [], []

    def start(argv, **kwargs):
        started.append(popen(argv, **kwargs))
        return started[-1]

    t0 = time.monotonic()
    try:
        with pytest.raises(supervise.Stopped) as stopped:
            supervise.run_to_end(
                DEAF, dict(os.environ), lambda pid, why: said.append(why), popen=start
            )
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
    assert stopped.value.signum == signal.SIGTERM
    return said, started, time.monotonic() - t0


def test_two_stop_signals_within_one_poll_kill_the_launch(monkeypatch):
    """Two stop signals before the loop's first look (here: both while the launch starts; a
    double Ctrl-C within its 0.2 s poll): the second was taken for the first, the launch was
    told once and waited for STOP_WAIT_S. Now it is killed at once."""

    def popen(argv, **kwargs):
        proc = deaf(argv, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc

    said, started, took = _run(popen, monkeypatch)
    assert said == ["a second stop signal"], said
    assert started[0].returncode == -signal.SIGKILL
    assert took < 30, took  # not STOP_WAIT_S (60 s here)


def test_a_second_stop_signal_while_the_first_is_passed_on_kills_the_launch(monkeypatch):
    """A second signal whose handler ran while the first was being sent on (between the loop's
    look at the signals held and its count of them) was counted as seen: the launch was told
    once and waited for STOP_WAIT_S."""

    class Telling(subprocess.Popen):
        def send_signal(self, sig):
            super().send_signal(sig)
            if sig != signal.SIGKILL:  # the second stop, as the first is passed on
                os.kill(os.getpid(), signal.SIGTERM)

    def popen(argv, **kwargs):
        proc = deaf(argv, **kwargs)
        proc.__class__ = Telling
        os.kill(os.getpid(), signal.SIGTERM)
        return proc

    said, started, took = _run(popen, monkeypatch)
    assert said == ["a second stop signal"], said
    assert started[0].returncode == -signal.SIGKILL
    assert took < 30, took


def test_a_launch_deaf_to_the_stop_is_killed_after_the_wait(monkeypatch):
    """One stop signal, passed on; a launch that does not end in STOP_WAIT_S is killed, and
    the signal raised after it."""

    def popen(argv, **kwargs):
        proc = deaf(argv, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc

    said, started, took = _run(popen, monkeypatch, wait_s=1)
    assert said == ["not ended 1 s after the stop signal"], said
    assert started[0].returncode == -signal.SIGKILL
    assert took >= 1, took


def test_each_handler_is_the_callers_again_after_the_launch(monkeypatch):
    """The stop signals are run_to_end's while the launch runs, the caller's on return; an
    ignored one (nohup's SIGHUP) is never taken."""
    mine = lambda signum, frame: None  # noqa: E731
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        seen = {}

        def popen(argv, **kwargs):
            seen.update({s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)})
            return subprocess.Popen(["true"], **kwargs)

        assert supervise.run_to_end(["true"], dict(os.environ), print, popen=popen) == 0
        assert seen[signal.SIGTERM] is not mine and seen[signal.SIGHUP] is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
