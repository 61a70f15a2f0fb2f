"""A hung rank is named (trainer/progress.py): the diagnosis from records, the tracker through a
real c10d TCPStore, and two real gloo ranks under torchrun with rank 1 stopped by SIGSTOP."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from conftest import PYTHON, SMALL, child_env
from workflow_helpers import process_state

from scalestudy.errors import TrainingError
from scalestudy.jobs.supervise import kill_launch
from scalestudy.trainer import progress
from scalestudy.trainer.progress import Tracker, diagnose, is_collective_failure, ranks_text, where

NOW = 1_800_000_000.0  # unix seconds


def rec(rank, host, step, phase, changed_ago, published_ago=0.2) -> dict:
    return {
        "rank": rank,
        "host": host,
        "step": step,
        "phase": phase,
        "changed_at": NOW - changed_ago,
        "published_at": NOW - published_ago,
    }


# ---------------------------------------------------------------------------------------------
# the diagnosis (pure)


def test_a_silent_rank_is_named_with_its_host_step_and_phase():
    """SIGSTOP: the rank stops publishing; the others wait further on, still publishing."""
    records = {
        0: rec(0, "node1", 25, "backward", changed_ago=10.5),
        1: rec(1, "node2", 18, "forward", changed_ago=11.2, published_ago=11.0),
    }
    lines = diagnose(records, NOW, silent_after_s=5.0)
    assert lines == [
        "rank 1 on node2 last reported step 18, forward, 11 s ago, and nothing since: "
        "stopped, frozen or dead",
        "the furthest rank(s) 0 wait at step 25, backward",
    ]


def test_a_rank_blocked_where_the_others_passed_is_behind():
    """Alive (it publishes) but its step/phase stopped earlier than everyone else's."""
    records = {r: rec(r, f"n{r}", 410, "backward", changed_ago=9) for r in (0, 1, 3)}
    records[2] = rec(2, "n2", 410, "data", changed_ago=12)
    lines = diagnose(records, NOW, silent_after_s=5.0)
    assert lines == [
        "rank 2 on n2 is alive but behind: it has been at step 410, data for 12 s",
        "the furthest rank(s) 0-1,3 wait at step 410, backward",
    ]


def test_all_ranks_waiting_in_the_same_place_is_said_to_be_no_stopped_rank():
    records = {r: rec(r, "h", 63, "evaluation", changed_ago=8 + r) for r in range(2)}
    (line,) = diagnose(records, NOW, silent_after_s=5.0)
    assert line.startswith("no rank lags: all 2 ranks wait at evaluation after step 63 (for 8 s")
    assert "collective mismatch or a network problem" in line


def test_a_rank_without_a_record_is_listed_and_silent_ones_too():
    records = {0: rec(0, "a", 5, "optimizer", 7), 1: None, 2: rec(2, "c", 5, "data", 9, 8)}
    lines = diagnose(records, NOW, silent_after_s=5.0)
    assert lines[0] == "rank 1: no progress record (never started, or not read)"
    assert lines[1].startswith("rank 2 on c last reported step 5, data, 8 s ago")
    assert lines[2] == "the furthest rank(s) 0 wait at step 5, optimizer"
    assert diagnose({0: None}, NOW, 5.0) == ["no rank has published its progress"]
    # several: one line, however many ranks (it was one line per rank)
    many = {0: None, 1: None, 2: None, 3: rec(3, "d", 5, "optimizer", 7), 5: None}
    assert diagnose(many, NOW, 5.0) == [
        "ranks 0-2,5: no progress record (never started, or not read)",
        "the furthest rank(s) 3 wait at step 5, optimizer",
    ]


def test_a_rank_gone_across_a_closed_connection_is_never_alive():
    """Killed: its last record is fresher than the silent threshold, and it may even be ahead
    of the survivor; read twice across the failure, it is named as ended, and the survivors
    are judged among themselves."""
    records = {
        0: rec(0, "a", 25, "backward", changed_ago=2.5),
        1: rec(1, "b", 25, "optimizer", changed_ago=3.0, published_ago=2.8),
        2: rec(2, "c", 24, "data", changed_ago=2.6),
    }
    lines = diagnose(records, NOW, silent_after_s=5.0, gone={1})
    assert lines == [
        "rank 1 on b last reported step 25, optimizer, 3 s ago, and nothing since its "
        "connection closed: exited, killed or stopped",
        "rank 2 on c is alive but behind: it has been at step 24, data for 3 s",
        "the furthest rank(s) 0 wait at step 25, backward",
    ]


def test_a_rank_stuck_in_an_earlier_micro_batch_is_the_one_behind():
    """--accum-steps 2: rank 1 is stuck at the end of micro-batch 1's backward, rank 0 went on
    to micro-batch 2 and waits in its collective. Without the micro-batch in the position,
    backward > forward named rank 0 (FSDP), or equal places said no rank lags (DDP)."""
    stuck = rec(1, "b", 20, "backward", changed_ago=12) | {"micro": 0, "micros": 2}
    for phase in ("forward", "backward"):  # FSDP's all-gather, DDP's all-reduce
        waiting = rec(0, "a", 20, phase, changed_ago=11) | {"micro": 1, "micros": 2}
        assert diagnose({0: waiting, 1: stuck}, NOW, silent_after_s=5.0) == [
            "rank 1 on b is alive but behind: it has been at step 20 (micro-batch 1/2), "
            "backward for 12 s",
            f"the furthest rank(s) 0 wait at step 20 (micro-batch 2/2), {phase}",
        ]


def test_phases_are_ordered_as_a_run_passes_them():
    """evaluation after step k is past step k's optimizer and before step k+1's data."""
    order = [
        (7, "start"),
        (7, "data"),
        (7, "backward"),
        (7, "optimizer"),
        (7, "evaluation"),
        (7, "checkpoint write"),
        (7, "stop agreement"),
        (7, "checkpoint agreement"),
        (8, "data"),
    ]
    positions = [progress.position({"step": s, "phase": p}) for s, p in order]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # start-up: each rank's own work before the collective that waits for it
    start = ["start", "data load", "data check", "model broadcast", "model set-up"]
    start += ["checkpoint directory check", "checkpoint directory read"]
    start += ["checkpoint directory views", "checkpoint search", "checkpoint choice"]
    start += ["checkpoint load"]
    positions = [progress.position({"step": -1, "phase": p}) for p in start]
    positions.append(progress.position({"step": 0, "phase": "data"}))
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # with accumulation: each micro-batch's phases, then the step's end, then the next step
    micro = [(7, 0, "data"), (7, 0, "backward"), (7, 1, "data"), (7, 1, "optimizer")]
    records = [{"step": s, "micro": j, "micros": 2, "phase": p} for s, j, p in micro]
    records += [{"step": 7, "micro": 1, "micros": 2, "phase": "evaluation"}]
    records += [{"step": 8, "micro": 0, "micros": 2, "phase": "data"}]
    positions = [progress.position(r) for r in records]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def test_the_hooks_record_the_micro_batch(monkeypatch):
    monkeypatch.setattr(progress, "TRACKER", Tracker())
    progress.at_step(20)
    progress.at_micro(1, 2)
    progress.at("forward")
    assert where(progress.TRACKER.record()) == "step 20 (micro-batch 2/2), forward"
    progress.at_step(21)  # a step without accumulation, or before its first micro-batch
    progress.at("data")
    assert where(progress.TRACKER.record()) == "step 21, data"


def test_where_and_ranks_text():
    assert where({"step": -1, "phase": "start"}) == "start-up"
    assert where({"step": 12, "phase": "communication"}) == "step 12, communication"
    assert where({"step": 9, "micro": 2, "micros": 4, "phase": "data"}) == (
        "step 9 (micro-batch 3/4), data"
    )
    # after the step: the micro-batch is not part of the place
    evaluation = {"step": 9, "micro": 3, "micros": 4, "phase": "evaluation"}
    assert where(evaluation) == "evaluation after step 9"
    assert where({"step": 99, "phase": "final checksum"}) == "final checksum after step 99"
    assert ranks_text([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"


def test_only_collective_failures_are_diagnosed():
    gloo = RuntimeError("[unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation")
    assert is_collective_failure(gloo)
    assert is_collective_failure(RuntimeError("Connection closed by peer [127.0.0.1]:1234"))
    # the same gloo timeout, when the pair gives up first (seen in DDP's buffer broadcast)
    assert is_collective_failure(RuntimeError("Application timeout caused pair closure"))
    assert is_collective_failure(dist.DistBackendError("NCCL error"))
    assert not is_collective_failure(TrainingError("non-finite training loss (nan)"))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


# ---------------------------------------------------------------------------------------------
# the tracker through a real TCPStore (two trackers play two ranks of one process)


@pytest.fixture
def stores():
    """A real c10d TCPStore server and two client connections, as the ranks would have."""
    timeout = datetime.timedelta(seconds=5)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)

    def client():
        store = dist.TCPStore(
            "127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=timeout
        )
        return dist.PrefixStore(progress.KEY_PREFIX, store)

    yield client(), client()  # the server lives as long as this fixture


@pytest.fixture
def trackers(stores):
    made = [Tracker(), Tracker()]
    yield made
    for t in made:
        t.stop()


@pytest.fixture
def warnings_of_progress():
    """The progress logger's records (its own handler: log.setup elsewhere stops propagation)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda r: seen.append(r.getMessage())
    logger = logging.getLogger("scalestudy.trainer.progress")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def test_a_tracker_that_stops_publishing_is_named_by_the_other(stores, trackers):
    a, b = trackers
    a.where, b.where = (25, 0, 1, "backward"), (18, 0, 1, "forward")
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=4, watchdog=False)  # silent after 2 s
    b.start(stores[1], 1, 2, "hostB", pg_timeout_s=4, watchdog=False)
    time.sleep(1.2)  # both published at least twice
    assert a.records()[0][1]["step"] == 18  # b's record, read from the store
    b.stop()  # what SIGSTOP does to its publishing
    time.sleep(a.silent_after_s + 0.5)
    lines = a.diagnosis()
    assert re.fullmatch(
        r"rank 1 on hostB last reported step 18, forward, \d+ s ago, and nothing since: "
        r"stopped, frozen or dead",
        lines[0],
    ), lines
    assert lines[1] == "the furthest rank(s) 0 wait at step 25, backward"


def test_a_live_rank_stuck_behind_is_named_while_it_publishes(stores, trackers):
    a, b = trackers
    a.where, b.where = (3, 0, 1, "optimizer"), (3, 0, 1, "data")
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=60, watchdog=False)
    b.start(stores[1], 1, 2, "hostB", pg_timeout_s=60, watchdog=False)
    time.sleep(1.5)
    lines = a.diagnosis()
    assert re.fullmatch(
        r"rank 1 on hostB is alive but behind: it has been at step 3, data for \d+ s", lines[0]
    ), lines
    assert lines[1] == "the furthest rank(s) 0 wait at step 3, optimizer"


def reports_within(warnings: list[str], count: int, timeout_s: float) -> None:
    """Wait until the watchdog has reported `count` stalls in all, no more (its thread ticks once
    a second: a fixed sleep past the due tick left it under 1 s of lateness on busy cores)."""
    deadline = time.monotonic() + timeout_s
    while (n := len([w for w in warnings if "made no progress" in w])) < count:
        assert time.monotonic() < deadline, f"{n} reports, not {count}: {warnings}"
        time.sleep(0.05)
    assert n == count, warnings


def test_the_watchdog_reports_once_before_the_timeout(stores, trackers, warnings_of_progress):
    """NCCL aborts at the timeout without raising: the thread logs first (75% of 2 s)."""
    a, b = trackers
    a.where, b.where = (9, 0, 1, "backward"), (9, 0, 1, "forward")
    b.start(stores[1], 1, 2, "hostB", pg_timeout_s=2, watchdog=False)
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=2, watchdog=True)
    reports_within(warnings_of_progress, 1, 10)  # due at the tick past 1.5 s
    time.sleep(2.1)  # two more stall ticks: still one report
    head = [w for w in warnings_of_progress if "made no progress" in w]
    assert len(head) == 1, warnings_of_progress
    assert "rank 1 on hostB is alive but behind: it has been at step 9, forward" in "\n".join(
        warnings_of_progress
    )
    a.where = (10, 0, 1, "data")  # it moved on: a new stall would be reported again
    time.sleep(1.2)
    assert len([w for w in warnings_of_progress if "made no progress" in w]) == 1


def test_the_stall_clock_starts_with_the_run(stores, trackers, warnings_of_progress):
    """The tracker is made at import; the rendezvous after it (here 1.6 s of a 2 s timeout) and
    an earlier run's stall that the watchdog reported are not this run's stall."""
    a, b = trackers
    b.start(stores[1], 1, 2, "hostB", pg_timeout_s=60, watchdog=False)
    time.sleep(1.6)  # the imports and the rendezvous: longer than the watchdog's 1.5 s
    started = time.time()
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=2, watchdog=True)
    assert a.record()["changed_at"] >= started
    assert not [w for w in warnings_of_progress if "made no progress" in w]
    reports_within(warnings_of_progress, 1, 10)  # the run's own stall at start-up (tick 2 s)
    a.stop()
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=2, watchdog=True)  # a second run, same place
    reports_within(warnings_of_progress, 2, 10)


def test_the_diagnosis_says_when_the_store_is_gone(trackers):
    """Under srun the store lives in rank 0's process: stopped with it, it cannot answer."""
    timeout = datetime.timedelta(seconds=1)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    client = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=timeout
    )
    a = trackers[0]
    a.where = (4, 0, 1, "forward")
    a.start(client, 0, 2, "hostA", pg_timeout_s=60, watchdog=False)
    # under srun rank 3 of 4 reads rank 0's store (store_in_rank_0): rank 0 ended with it
    under_srun = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=timeout
    )
    b = trackers[1]
    b.where = (4, 0, 1, "backward")
    b.start(under_srun, 3, 4, "hostD", pg_timeout_s=60, watchdog=False, store_in_rank_0=True)
    del server
    lines = a.diagnosis()
    assert any(line.startswith("the progress store did not answer") for line in lines), lines
    assert "rank 1: no progress record (never started, or not read)" in lines
    lines = b.diagnosis()
    assert len(lines) == 2 and lines[1] == "the furthest rank(s) 3 wait at step 4, backward"
    assert re.fullmatch(
        r"ranks 0-2: no progress record \(not read: the progress store did not answer \(.+\); "
        r"it lives in rank 0's process \(srun, or a launcher other than torchrun's agent\), so "
        r"rank 0 \(the store host\) exited, was "
        r"killed or is stopped\)",
        lines[0],
    ), lines


def test_a_rank_whose_connection_closed_is_named_as_ended(
    stores, trackers, warnings_of_progress, monkeypatch
):
    """SIGKILL, exit: gloo raises 'Connection reset by peer' at once, with the rank's record
    under a second old, so it looked alive but behind. explain_failure reads the records
    again after RECHECK_AFTER_S: the rank that published nothing in between has ended."""
    a, b = trackers
    a.where, b.where = (25, 0, 1, "backward"), (18, 0, 1, "forward")
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=60, watchdog=False)
    b.start(stores[1], 1, 2, "hostB", pg_timeout_s=60, watchdog=False)
    time.sleep(1.2)
    b.stop()  # killed: it publishes no more
    monkeypatch.setattr(progress, "TRACKER", a)
    reset = RuntimeError("[pair.cc:545] Read error [127.0.0.1]:50055: Connection reset by peer")
    t0 = time.monotonic()
    progress.explain_failure(reset)
    assert time.monotonic() - t0 >= progress.RECHECK_AFTER_S
    said = [w for w in warnings_of_progress if w.startswith("hang diagnosis: ")]
    assert re.fullmatch(
        r"hang diagnosis: rank 1 on hostB last reported step 18, forward, \d+ s ago, and "
        r"nothing since its connection closed: exited, killed or stopped",
        said[0],
    ), said
    assert said[1:] == ["hang diagnosis: the furthest rank(s) 0 wait at step 25, backward"]


class _Stopped(KeyboardInterrupt):
    """What cli.py's SIGTERM handler raises (its Stopped, a KeyboardInterrupt)."""


def test_the_launchers_stop_waits_for_the_diagnosis_of_an_ended_rank(
    stores, trackers, warnings_of_progress, monkeypatch
):
    """torchrun's agent (srun's --kill-on-bad-exit) sends the survivors SIGTERM within
    milliseconds of the first failure: cli.py's handler raised its Stopped inside the 2 s
    recheck, past contextlib.suppress(Exception), and no diagnosis line was ever printed (a
    2-rank run with rank 1 killed said only "stopped by SIGTERM"). The stop now comes after."""
    a, b = trackers
    a.where, b.where = (25, 0, 1, "backward"), (18, 0, 1, "forward")
    a.start(stores[0], 0, 2, "hostA", pg_timeout_s=60, watchdog=False)
    b.start(stores[1], 1, 2, "hostB", pg_timeout_s=60, watchdog=False)
    time.sleep(1.2)
    b.stop()
    monkeypatch.setattr(progress, "TRACKER", a)

    def stop(signum, frame):
        raise _Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        reset = RuntimeError("[pair.cc:545] Read error [127.0.0.1]:50055: Connection closed")
        with pytest.raises(_Stopped):
            progress.explain_failure(reset)
    finally:
        signal.signal(signal.SIGTERM, previous)
    said = [w for w in warnings_of_progress if w.startswith("hang diagnosis: ")]
    assert said and "rank 1 on hostB last reported step 18" in said[0], said
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.fixture
def store_process():
    """A real TCPStore server in a child process (under srun rank 0's process hosts it), which
    the test may stop; it is killed in every case (SIGCONT, SIGKILL)."""
    code = (
        "import time, torch.distributed as d\n"
        "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
        "print(s.port, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        proc.wait(timeout=30)


def all_threads_stopped(pid: int) -> bool:
    """Every thread of the process in state T (/proc/TID/stat is the thread's own)."""
    return all(process_state(int(t.name)) == "T" for t in Path(f"/proc/{pid}/task").iterdir())


def test_the_diagnosis_returns_when_the_store_host_is_stopped(store_process, trackers, monkeypatch):
    """A store call against a SIGSTOPped store host never returns (whatever the client's
    timeout): the diagnosis still returns within STORE_TIMEOUT_S, says the store did not answer,
    and a second one (the lock still held by the stuck read) returns too. The wait (longer than
    the silent threshold here) never makes this rank's own record look silent."""
    monkeypatch.setattr(progress, "STORE_TIMEOUT_S", 2.5)
    proc, port = store_process
    timeout = datetime.timedelta(seconds=1)
    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timeout
    )
    a = trackers[0]
    a.where = (4, 0, 1, "forward")
    a.start(dist.PrefixStore(progress.KEY_PREFIX, client), 0, 2, "hostA", 4, watchdog=False)
    assert a.silent_after_s < progress.STORE_TIMEOUT_S
    os.kill(proc.pid, signal.SIGSTOP)
    # kill returns before every thread has stopped: on 2 busy cores the store's thread once
    # answered the first read (the diagnosis, rightly, said nothing of a silent store)
    deadline = time.monotonic() + 10
    while not all_threads_stopped(proc.pid):
        assert time.monotonic() < deadline, "the store host did not stop"
        time.sleep(0.01)
    for _ in range(2):
        got: list[list[str]] = []
        worker = threading.Thread(target=lambda got=got: got.append(a.diagnosis()), daemon=True)
        t0 = time.monotonic()
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the diagnosis blocked on the stopped store host"
        assert time.monotonic() - t0 < 2.5 + 2  # the store's wait and the lines
        (lines,) = got
        assert lines[0] == "rank 1: no progress record (never started, or not read)"
        assert lines[1] == "the furthest rank(s) 0 wait at step 4, forward"
        assert lines[2].startswith("the progress store did not answer (no answer within 2.5 s)")
        assert len(lines) == 3, lines


# ---------------------------------------------------------------------------------------------
# the real thing: two gloo ranks under torchrun, rank 1 stopped with SIGSTOP


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (torchrun's workers), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def rank_of(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"RANK="):
                return item[5:].decode()
    return None


def wait_for(lines: list[str], text: str, timeout_s: float, reader: threading.Thread) -> bool:
    """Whether `text` appears in `lines` within `timeout_s` (False as soon as output ended)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        ended = not reader.is_alive()  # read before the lines: no line can come after it
        if any(text in line for line in lines):
            return True
        if ended:
            return False
        time.sleep(0.1)
    return False


def test_sigstopped_rank_is_named_by_rank_0(data_dir, tmp_path):
    """Rank 0 fails after --pg-timeout-s 10 with gloo's 'Timed out waiting ... for recv' and,
    before the traceback, names rank 1, its host, its step and phase. The stopped process is
    killed in every case (SIGCONT, SIGKILL), the test passing or not."""
    cmd = [
        *(PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"),
        *("-m", "scalestudy", "train", *SMALL),
        *("--epochs", "30", "--comm-probe-steps", "0", "--pg-timeout-s", "10"),
        *("--data-dir", str(data_dir), "--out", str(tmp_path)),
    ]
    proc = subprocess.Popen(
        cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    workers: list[int] = []
    try:
        assert wait_for(lines, "epoch   1/30", 120, reader), "".join(lines)  # training is under way
        workers = children(proc.pid)
        (rank1,) = [pid for pid in workers if rank_of(pid) == "1"]
        time.sleep(0.5)  # mid-epoch 2
        os.kill(rank1, signal.SIGSTOP)
        # the diagnosis follows the failure line: killing the ranks at that line cut it off
        assert wait_for(lines, "hang diagnosis: the furthest rank(s)", 60, reader), "".join(lines)
        # and for the traceback after it, asserted on below: killed at the diagnosis line, the
        # ranks' output sometimes ended before their traceback (a failed CI run)
        wait_for(lines, "Traceback", 60, reader)
    finally:
        for pid in workers or children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=10)
    out = "".join(lines)
    named = re.search(
        r"\[rank 0/2 (\S+)\] hang diagnosis: rank 1 on (\S+) last reported (.+?), \d+ s ago, "
        "and nothing since: stopped, frozen or dead",
        out,
    )
    assert named, out
    assert named.group(1) == named.group(2)  # one host: rank 1's is rank 0's
    # 'step 18, forward' (mid-step) or 'evaluation after step 31': a step number and a phase
    assert re.search(r"step \d+", named.group(3)), named.group(3)
    assert any(phase in named.group(3) for phase in progress.PHASES[1:]), named.group(3)
    assert re.search(r"\[rank 0/2 \S+\] hang diagnosis: the furthest rank\(s\) 0 wait at", out)
    # the diagnosis comes after rank 0's failure line (which a launcher that ends the ranks
    # while the diagnosis waits for the store cannot cut off) and before its traceback
    assert out.index("training failed") < out.index("hang diagnosis") < out.index("Traceback")
    assert "Timed out waiting" in out


# one rank of the test below: at step 20 rank 1 blocks (alive, the GIL released) at the end of
# the first micro-batch's backward of its accumulation group
STUCK_IN_MICRO_BATCH_1 = """
import os, sys, time
from scalestudy.trainer import loop, progress
real = loop.train_step
def train_step(run, meter, x, y, group=1, last=True):
    out = real(run, meter, x, y, group=group, last=last)
    if os.environ["RANK"] == "1" and not last and progress.TRACKER.step == 20:
        time.sleep(60)
    return out
loop.train_step = train_step
from scalestudy.cli import main
sys.exit(main())
"""


def test_a_rank_stuck_in_a_micro_batch_is_named_with_it(data_dir, tmp_path):
    """DDP with --accum-steps 2: rank 1 is stuck in micro-batch 1's backward (no_sync: local),
    rank 0 went on to micro-batch 2's backward and waits in its all-reduce. Rank 0 names rank 1
    and the micro-batch (it used to say no rank lagged: both were at 'step 20, backward')."""
    rank = tmp_path / "stuck_rank.py"
    rank.write_text(STUCK_IN_MICRO_BATCH_1)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(rank), "train", *SMALL, "--global-batch", "128", "--accum-steps", "2"]
    cmd += ["--epochs", "4", "--comm-probe-steps", "0", "--pg-timeout-s", "10"]
    cmd += ["--data-dir", str(data_dir), "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert re.search(
        r"\[rank 0/2 \S+\] hang diagnosis: rank 1 on \S+ is alive but behind: it has been at "
        r"step 20 \(micro-batch 1/2\), backward for \d+ s",
        out,
    ), out[-3000:]
    assert "the furthest rank(s) 0 wait at step 20 (micro-batch 2/2), backward" in out, out[-3000:]


# the ranks of the tests below: one rank blocks (alive, the GIL released) in its own I/O
def stuck_in(module: str, function: str, rank: int) -> str:
    """A rank's script: `rank` sleeps 60 s before scalestudy.trainer.<module>.<function>."""
    return f"""
import os, sys, time
from scalestudy.trainer import {module}
if os.environ["RANK"] == "{rank}":
    real = {module}.{function}
    def slow(*args, **kwargs):
        time.sleep(60)
        return real(*args, **kwargs)
    {module}.{function} = slow
from scalestudy.cli import main
sys.exit(main())
"""


STUCK_IN_DATA_LOAD = stuck_in("loaders", "load_prepared", 1)
STUCK_IN_CHECKPOINT_WRITE = stuck_in("checkpoint", "write_checkpoint", 0)
STUCK_IN_MARKER_WRITE = stuck_in("checkpoint", "write_marker", 0)
STUCK_IN_ATTEMPT_READ = stuck_in("state", "Checkpointing._read_attempt", 0)


def run_rank(script: str, data_dir: Path, tmp_path: Path, *flags: str, last: str = "") -> str:
    """Two gloo ranks of `script` (a wrapper of the CLI) under torchrun, with a 10 s timeout;
    the output of the run, which must fail. `last`: the output up to the first line that holds
    it, the run then killed (its end can be torchrun's 30 s wait for a rank that hangs on)."""
    rank = tmp_path / "rank.py"
    rank.write_text(script)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(rank), "train", *SMALL, *flags, "--comm-probe-steps", "0", "--pg-timeout-s", "10"]
    cmd += ["--data-dir", str(data_dir), "--out", str(tmp_path / "run")]
    if not last:
        proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=180)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        return out
    proc = subprocess.Popen(
        cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines = []
    watchdog = threading.Timer(180, kill_launch, (proc,))  # subprocess.run's timeout above
    watchdog.start()
    try:
        for line in proc.stdout:  # ends with the run, if it never says `last`
            lines.append(line)
            if last in line:
                break
    finally:
        watchdog.cancel()
        kill_launch(proc)  # torchrun and each rank's process group
        proc.stdout.close()
    return "".join(lines)


def test_a_rank_stuck_loading_its_data_is_named_at_start_up(data_dir, tmp_path):
    """Rank 1's read of the prepared data hangs; rank 0 waits in the comparison of the ranks'
    data (loop.check_same_data; before it, in DDP's broadcast of its weights). Both were at
    'start-up': no rank lagged. Now rank 1 is behind, at its data load."""
    out = run_rank(STUCK_IN_DATA_LOAD, data_dir, tmp_path)
    assert re.search(
        r"\[rank 0/2 \S+\] hang diagnosis: rank 1 on \S+ is alive but behind: it has been at "
        r"data load \(before the first step\) for \d+ s",
        out,
    ), out[-3000:]
    assert "the furthest rank(s) 0 wait at data check (before the first step)" in out


def test_a_rank_stuck_in_its_checkpoint_write_is_named(data_dir, tmp_path):
    """Rank 0's background write of epoch 1's checkpoint hangs; at epoch 2's save it waits for
    it while rank 1 waits in the stop agreement. Both were at 'checkpoint': no rank lagged."""
    flags = ("--epochs", "4", "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1")
    # rank 0, in its write when rank 1 fails, ends only at torchrun's SIGKILL 30 s later
    out = run_rank(STUCK_IN_CHECKPOINT_WRITE, data_dir, tmp_path, *flags, last="furthest rank")
    named = re.search(
        r"\[rank 1/2 \S+\] hang diagnosis: rank 0 on \S+ is alive but behind: it has been at "
        r"checkpoint write after step (\d+) for \d+ s",
        out,
    )
    assert named, out[-3000:]
    assert f"the furthest rank(s) 1 wait at stop agreement after step {named.group(1)}" in out


@pytest.mark.parametrize(
    ("script", "own", "wait"),
    [
        (STUCK_IN_MARKER_WRITE, "checkpoint directory check", "checkpoint directory read"),
        (STUCK_IN_ATTEMPT_READ, "attempt record", "attempt shared"),
    ],
)
def test_rank_0_stuck_in_its_start_up_checkpoint_io_is_named(data_dir, tmp_path, script, own, wait):
    """Rank 0's write of the shared-directory marker, or its read of attempt.json, hangs (a
    hung file system): every rank had set the same phase before rank 0's I/O and the others
    waited in its broadcast under it, so the diagnosis said "no rank lags ... a network
    problem". The others now wait in a phase of their own after it: rank 0 is behind."""
    flags = ("--epochs", "2", "--checkpoint-dir", str(tmp_path / "ckpt"))
    out = run_rank(script, data_dir, tmp_path, *flags, last="furthest rank")
    assert re.search(
        rf"\[rank 1/2 \S+\] hang diagnosis: rank 0 on \S+ is alive but behind: it has been at "
        rf"{own} \(before the first step\) for \d+ s",
        out,
    ), out[-3000:]
    assert f"the furthest rank(s) 1 wait at {wait} (before the first step)" in out, out[-3000:]


@pytest.mark.parametrize(
    ("launcher", "env", "in_rank_0"),
    [
        ("srun", {}, True),
        # torchrun's agent serves the store for its workers (and says so in their environment)
        ("torchrun", {"TORCHELASTIC_USE_AGENT_STORE": "True"}, False),
        # any other env:// launcher (a site's own, an mpirun wrapper: dist.detect calls it
        # torchrun) leaves the store to init_process_group, in rank 0's own process; a stopped
        # rank 0 was "never started" and a survivor "the furthest"
        ("torchrun", {}, True),
        ("torchrun", {"TORCHELASTIC_USE_AGENT_STORE": "False"}, True),
    ],
)
def test_the_store_is_rank_0s_unless_torchruns_agent_serves_it(launcher, env, in_rank_0):
    assert progress.store_in_rank_0(launcher, env) is in_rank_0
