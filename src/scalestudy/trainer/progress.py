"""Where each rank is, published for the others, so that a hung rank is named.

Without it a rank stopped by SIGSTOP (or frozen in a kernel, a file system, a driver) makes the
others fail after the process-group timeout with "Timed out waiting 20000ms for recv", which
names the rank that waited, not the one that stopped. With it the waiting ranks say
    hang diagnosis: rank 1 on node2 last reported step 412, forward, 20 s ago, and nothing
    since: stopped, frozen or dead
    hang diagnosis: the furthest rank(s) 0,2-7 wait at step 412, backward
How:
- Recording is an in-memory assignment on the hot path: `at_step(step)` (Meter.before_step),
  `at_micro(j, group)` (the micro-batch j of the step's `group` under --accum-steps: the loop)
  and `at(phase)` (the step timer's phases data/forward/backward/communication/optimizer, and
  one-line marks at start-up, evaluation, the attempt record, the checkpoint's steps, the
  epoch's end, comm probe, final checksum and metrics: PHASES). No clock is read and the
  device is never synchronised for it.
- Publishing happens off the hot path: a daemon thread wakes every PUBLISH_INTERVAL_S (1 s),
  stamps the wall time at which its place last changed (so that time has 1 s resolution) and
  writes this rank's record (rank, host, step, micro, micros, phase, changed_at, published_at;
  micro: the 0-based micro-batch of `micros` in the step; unix seconds) as JSON to the c10d
  store the process group already has: a public `TCPStore` client on MASTER_ADDR:MASTER_PORT
  (the torchrun agent's store, else rank 0's: `store_in_rank_0`), under the prefix KEY_PREFIX
  (`PrefixStore`). One small `set` per rank per second; nothing while one process.
- Three kinds of stall, visible in the records (`diagnose`, a pure function):
  ended: on a closed connection (a peer's process exited or was killed) the records are read
  twice, RECHECK_AFTER_S (2 s) apart: a rank whose record did not change in between is named
  as exited, killed or stopped, however fresh its record (less than 1 s old at the failure);
  silent: published_at is older than the silent threshold (5 s, or half of --pg-timeout-s when
  shorter): the process is stopped (SIGSTOP), frozen with the GIL held, or dead; its position
  is the last one it published, so it may have got up to PUBLISH_INTERVAL_S further (seen on
  CPU: reported step 18, forward, while the others waited for it at step 25, backward);
  behind: the rank still publishes, but its (step, micro-batch, phase) is earlier than the
  furthest live rank's: it is blocked somewhere the others already passed (a collective they
  did not enter, I/O).
  When none is found, all ranks wait in the same place: a collective mismatch or a network
  problem, not one stopped rank; the line says so and where. Wall times of different hosts are
  compared, so the clocks are assumed NTP-synchronised (milliseconds, far below 5 s).
- Where it is printed: `explain_failure` when training raises a collective failure on a rank
  (gloo raises "Timed out waiting ... for recv", "Application timeout caused pair closure" or
  "Connection closed by peer"): every surviving rank logs one line per stalled rank after its
  failure line (which a launcher ending the ranks meanwhile cannot cut off) and before the
  traceback (train.py). NCCL's watchdog aborts the process at the timeout instead of raising,
  so with any backend but gloo the publishing thread is also a local watchdog: when this rank's
  own place (step, micro-batch, phase) has not changed for WATCHDOG_SHARE (75%) of
  --pg-timeout-s it logs the same diagnosis once per stall, before NCCL kills the process (75%
  leaves a margin for the 1 s resolution at timeouts >= 4 s).
- The store can be unreachable at diagnosis time (outside torchrun it lives in rank 0's process,
  which may be the stopped one; a store call against a stopped host never returns, whatever the
  client's timeout): the reads run in a daemon thread that the diagnosis waits for at most
  STORE_TIMEOUT_S, and the line says the store did not answer; the rank's own position is always
  printed.
Exit codes (0, 1, 75) and the Preempted path are untouched: this only adds log lines.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Mapping

import torch.distributed as dist

from scalestudy import log
from scalestudy.errors import ScalestudyError
from scalestudy.trainer import dist as sdist

logger = log.get(__name__)

PUBLISH_INTERVAL_S = 1.0  # seconds between two records of a rank in the store
SILENT_AFTER_S = 5.0  # a record older than this: the rank no longer publishes (5 missed ticks)
WATCHDOG_SHARE = 0.75  # of --pg-timeout-s without progress on this rank: log the diagnosis
STORE_TIMEOUT_S = 5.0  # the longest the diagnosis waits for the store (a stopped store host)
KEY_PREFIX = "scalestudy/progress/"
# where a rank can be, in the order a run passes them for one value of `step` (the index of the
# optimizer step in progress, or of the last one taken: evaluation comes after that step's
# optimizer); the start-up's phases (step -1) precede the first step. A rank's own work (I/O,
# compute) has a phase of its own ahead of the collective that waits for it, so a rank stuck in
# it is behind the others waiting in that collective (a phase may recur: "checkpoint write" is
# the wait for the write in flight before the stop agreement, and the save after it)
START_PHASES = (
    "start",  # the process group is up
    "data load",  # the prepared data read, the loaders and the model built (this rank's)
    # every rank's prepared data compared (loop.check_same_data, a collective); the loaders and
    # the model are built after it, at "data load" again
    "data check",
    "model broadcast",  # the strategy's wrapper: DDP broadcasts rank 0's weights
    "model set-up",  # optimizer, FLOP count, TensorBoard (this rank's)
    # rank 0 writes a marker in --checkpoint-dir (its I/O), every rank looks for it (each
    # rank's), then their views are gathered (state.py)
    "checkpoint directory check",
    "checkpoint directory read",
    "checkpoint directory views",
    "checkpoint search",  # rank 0 finds and verifies the newest checkpoint (--checkpoint-dir)
    "checkpoint choice",  # rank 0's choice broadcast
    "checkpoint load",  # this rank loads it
)
STEP_PHASES = ("data", "forward", "backward", "communication", "optimizer")  # the Meter's
AFTER_STEP_PHASES = (
    "evaluation",  # the epoch's reduction, the evaluation, rank 0's epochs.csv
    # rank 0 writes attempt.json (lost_time_s, state.py); at start-up, after the checkpoint
    # load, rank 0 reads and writes it (after step -1) while the others wait at "attempt
    # shared", its result's broadcast
    "attempt record",
    "attempt shared",
    "checkpoint write",  # this rank waits for the write in flight, or copies and writes a save
    "stop agreement",  # the all-reduce on a stop signal and failed writes
    "checkpoint agreement",  # the collectives of a save (ranks' random state, its result)
    "epoch end",  # every rank waits for the others' end of the epoch (rank 0's writes)
    "comm probe",
    "final checksum",
    "metrics",
)
PHASES = START_PHASES + STEP_PHASES + AFTER_STEP_PHASES
# the words of a failed collective: gloo raises plain RuntimeErrors with these messages; the
# same timeout reads "Timed out waiting 10000ms for recv" or, when gloo's pair gives up first,
# "Application timeout caused pair closure" (seen on a broadcast in DDP's forward, torch 2.14.1)
COLLECTIVE_FAILURE_WORDS = (
    "timed out",
    "timeout caused pair closure",
    "connection closed",
    "connection reset",
    "broken pipe",
)
# of those, a peer's process that ended (exited, killed, its node gone): its last record is
# less than PUBLISH_INTERVAL_S old at the failure, so the diagnosis reads the records twice,
# RECHECK_AFTER_S apart, and names the rank that published nothing in between
CLOSED_CONNECTION_WORDS = ("connection closed", "connection reset", "broken pipe")
RECHECK_AFTER_S = 2 * PUBLISH_INTERVAL_S


class Tracker:
    """This rank's place in the run; publishes it once started (one per process: `TRACKER`)."""

    def __init__(self) -> None:
        self.step = -1  # the optimizer step in progress (or last taken); -1 before the first
        self.micro = (0, 1)  # (micro-batch j, of `group`) of the step; (0, 1) without accumulation
        # (step, j, group, phase): the hot path assigns only this tuple
        self.where: tuple[int, int, int, str] = (-1, 0, 1, "start")
        self.rank, self.world_size, self.host = 0, 1, ""
        self.store_in_rank_0 = False  # srun: the store lives in rank 0's process (dist.py)
        self.silent_after_s = SILENT_AFTER_S
        self.watchdog_after_s: float | None = None
        self._store = None
        self._lock = threading.Lock()  # one store call at a time (thread and main thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._changed: tuple[tuple[int, int, int, str], float] = (self.where, time.time())
        self._reported: tuple[int, int, int, str] | None = None  # the stall the watchdog reported

    def start(
        self,
        store,
        rank: int,
        world_size: int,
        host: str,
        pg_timeout_s: float,
        watchdog: bool,
        store_in_rank_0: bool = False,
    ) -> None:
        """Publish this rank's record every PUBLISH_INTERVAL_S through `store` (a c10d Store);
        `store_in_rank_0`: the store is served by rank 0's own process (srun, not torchrun's
        agent), so a store that stops answering means rank 0 ended or stopped."""
        self.rank, self.world_size, self.host, self._store = rank, world_size, host, store
        self.store_in_rank_0 = store_in_rank_0
        self.silent_after_s = max(2 * PUBLISH_INTERVAL_S, min(SILENT_AFTER_S, pg_timeout_s / 2))
        self.watchdog_after_s = WATCHDOG_SHARE * pg_timeout_s if watchdog else None
        # the run starts now: neither the rendezvous before it nor an earlier run is a stall
        self._changed, self._reported = (self.where, time.time()), None
        self._stop.clear()
        self._tick()  # a first record before any collective can wait for it
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=STORE_TIMEOUT_S)
            self._thread = None
        self._store = None

    def record(self, now: float | None = None) -> dict:
        """This rank's record as published (changed_at updated to `now` when it moved)."""
        now = time.time() if now is None else now
        where = self.where
        if where != self._changed[0]:
            self._changed = (where, now)
        step, micro, micros, phase = where
        return {
            "rank": self.rank,
            "host": self.host,
            "step": step,
            "micro": micro,
            "micros": micros,
            "phase": phase,
            "changed_at": self._changed[1],
            "published_at": now,
        }

    def records(self) -> tuple[dict[int, dict | None], str | None]:
        """Every rank's last record (None: none in the store), this rank's fresh; and the store
        error that stopped the reading, if any. Returns within STORE_TIMEOUT_S: the reads run in
        a daemon thread, because a store call against a stopped store host (SIGSTOP, a frozen
        node) blocks for as long as it is stopped, whatever the client's timeout (torch 2.14.1)."""
        read: dict[int, dict] = {}  # filled by the worker, which may outlive this call
        failure: list[str] = []
        silent = f"no answer within {STORE_TIMEOUT_S:g} s"

        def work() -> None:
            if not self._lock.acquire(timeout=STORE_TIMEOUT_S):  # an earlier call is stuck
                failure.append(silent)
                return
            try:
                for r in range(self.world_size):
                    if r != self.rank and self._store.check([f"rank{r}"]):
                        read[r] = json.loads(self._store.get(f"rank{r}"))
            except Exception as exc:  # a store that is gone: say so, keep what was read
                failure.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            finally:
                self._lock.release()

        worker = threading.Thread(target=work, name="progress-read", daemon=True)
        worker.start()
        worker.join(STORE_TIMEOUT_S)
        found: dict[int, dict | None] = dict.fromkeys(range(self.world_size))
        found.update(read.copy())
        found[self.rank] = self.record()  # after the wait: never silent for the time it took
        if worker.is_alive():
            return found, silent
        return found, failure[0] if failure else None

    def diagnosis(self, recheck_after_s: float = 0.0) -> list[str]:
        """The lines `diagnose` makes of every rank's record now (within STORE_TIMEOUT_S).
        `recheck_after_s` > 0 (a closed connection): read the records again after that long; a
        rank whose record did not change in between has ended (`diagnose`'s `gone`)."""
        if self._store is None:
            return []
        found, error = self.records()
        gone: set[int] = set()
        if recheck_after_s > 0 and error is None:
            time.sleep(recheck_after_s)
            first, (found, error) = found, self.records()
            gone = {
                r
                for r, rec in found.items()
                if r != self.rank and rec is not None and rec == first[r]
            }
        if error and self.store_in_rank_0 and self.rank != 0:
            # the store host is rank 0 itself: one line for it and every rank left unread, not
            # "no progress record" for each live peer from each survivor (W^2 lines)
            unread = (
                f"the progress store did not answer ({error}); it lives in rank 0's process "
                "(srun, or a launcher other than torchrun's agent), so rank 0 (the store host) "
                "exited, was killed or is stopped"
            )
            return diagnose(found, time.time(), self.silent_after_s, gone, unread)
        lines = diagnose(found, time.time(), self.silent_after_s, gone)
        if error:
            lines.append(
                f"the progress store did not answer ({error}); a rank without a record may not "
                "have been read (the store is on rank 0's host: under srun it lives in rank 0's "
                "process, which may be the stopped one)"
            )
        return lines

    def _tick(self) -> None:
        record = self.record()
        # skipped while another store call is stuck (a stopped store host): the watchdog still runs
        if self._lock.acquire(timeout=PUBLISH_INTERVAL_S):
            try:
                self._store.set(f"rank{self.rank}", json.dumps(record))
            except Exception:  # the store is gone (the run ends): the diagnosis says so
                pass
            finally:
                self._lock.release()
        self._watch(record)

    def _watch(self, record: dict) -> None:
        """Log the diagnosis once per stall when this rank has not moved for a long time."""
        limit = self.watchdog_after_s
        where = (record["step"], record["micro"], record["micros"], record["phase"])
        stalled = record["published_at"] - record["changed_at"]
        if limit is None or stalled < limit or self._reported == where:
            return
        self._reported = where
        logger.warning(
            f"hang diagnosis: this rank has made no progress for {stalled:.0f} s "
            f"({100 * WATCHDOG_SHARE:.0f}% of --pg-timeout-s; the backend may abort at 100%)"
        )
        for line in self.diagnosis():
            logger.warning(f"hang diagnosis: {line}")

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_INTERVAL_S):
            self._tick()


TRACKER = Tracker()


def at_step(step: int) -> None:
    """The optimizer step `step` begins (hot path: two assignments)."""
    TRACKER.step, TRACKER.micro = step, (0, 1)


def at_micro(j: int, group: int) -> None:
    """Micro-batch j (0-based) of the step's `group` begins (--accum-steps; hot path)."""
    TRACKER.micro = (j, group)


def at(phase: str) -> None:
    """This rank enters `phase` (one of PHASES; hot path: one tuple assignment)."""
    TRACKER.where = (TRACKER.step, *TRACKER.micro, phase)


def start(denv: sdist.DistEnv, host: str, pg_timeout_s: float) -> None:
    """After init_process_group: publish through the default group's store (not for 1 rank).
    The watchdog runs with every backend but gloo, which raises instead of aborting. A store
    that cannot be reached turns the diagnosis off with a warning, never the run."""
    # a second run in one process starts afresh
    TRACKER.step, TRACKER.micro, TRACKER.where = -1, (0, 1), (-1, 0, 1, "start")
    if denv.world_size == 1:
        return
    try:
        store = dist.TCPStore(
            denv.master_addr,
            denv.master_port,
            is_master=False,
            timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
            wait_for_workers=False,
        )
    except Exception as exc:
        logger.warning(
            f"hang diagnosis off: no store at {denv.master_addr}:{denv.master_port}"
            f" ({type(exc).__name__}: {exc})"
        )
        return
    TRACKER.start(
        dist.PrefixStore(KEY_PREFIX, store),
        denv.rank,
        denv.world_size,
        host,
        pg_timeout_s,
        watchdog=dist.get_backend() != "gloo",
        store_in_rank_0=store_in_rank_0(denv.launcher, os.environ),
    )


def store_in_rank_0(launcher: str, env: Mapping[str, str]) -> bool:
    """Whether the c10d store is served by rank 0's own process: under srun, and under any
    env:// launcher but torchrun's agent, which serves it for its workers and says so
    (TORCHELASTIC_USE_AGENT_STORE=True, torch's rendezvous reads it). A site's launcher or an
    mpirun wrapper (dist.detect names every env:// launch torchrun) leaves it to
    init_process_group, in rank 0: a stopped rank 0 was reported "never started"."""
    return launcher == "srun" or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def stop() -> None:
    TRACKER.stop()


def explain_failure(exc: BaseException) -> None:
    """On a failed collective: one line per stalled rank (every surviving rank logs them)."""
    if not is_collective_failure(exc):
        return
    closed = any(w in str(exc).lower() for w in CLOSED_CONNECTION_WORDS)
    # the diagnosis must never hide the failure itself; the launcher's stop of the survivors
    # (torchrun's SIGTERM, srun's --kill-on-bad-exit) comes within milliseconds of the first
    # failure, and raised inside the recheck it left no line: it is delivered after them
    with stops_held(), contextlib.suppress(Exception):
        for line in TRACKER.diagnosis(RECHECK_AFTER_S if closed else 0.0):
            logger.error(f"hang diagnosis: {line}")


@contextlib.contextmanager
def stops_held():
    """SIGINT, SIGTERM and SIGHUP that arrive in the block are raised again once it ends, to the
    handlers they had (bounded: the diagnosis takes at most RECHECK_AFTER_S and two store
    reads, within torchrun's 30 s grace and Slurm's KillWait); an ignored one stays ignored.
    Only the main thread sets handlers: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = {
        s: signal.signal(s, lambda signum, _frame: caught.append(signum))
        for s in log.STOPS
        if signal.getsignal(s) not in (signal.SIG_IGN, None)
    }
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


def is_collective_failure(exc: BaseException) -> bool:
    """A distributed error (DistError), or gloo's plain RuntimeError of a timeout or a closed
    connection; never one of our own errors (a NaN loss, a bad flag)."""
    if isinstance(exc, ScalestudyError):
        return False
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in COLLECTIVE_FAILURE_WORDS)


# ---------------------------------------------------------------------------------------------
# the diagnosis: records -> lines (pure)


def position(record: Mapping) -> tuple[int, int, int]:
    """How far a record is: (step, micro-batch, place of the phase in PHASES); "start" counts
    as before a step's first micro-batch, the phases after its optimizer as after its last, and
    unknown phases come last."""
    phase = record["phase"]
    place = PHASES.index(phase) if phase in PHASES else len(PHASES)
    if phase in STEP_PHASES:
        return record["step"], record.get("micro", 0), place
    return record["step"], -1 if phase == "start" else sys.maxsize, place


def where(record: Mapping) -> str:
    """'step 412, backward', 'step 20 (micro-batch 1/2), forward' (--accum-steps), 'evaluation
    after step 63', 'start-up (before the first step)'."""
    step, phase = record["step"], record["phase"]
    if step < 0:
        return f"{phase} (before the first step)" if phase != "start" else "start-up"
    if phase in STEP_PHASES:
        micros = record.get("micros", 1)
        if micros > 1:
            return f"step {step} (micro-batch {record.get('micro', 0) + 1}/{micros}), {phase}"
        return f"step {step}, {phase}"
    return f"{phase} after step {step}"


def ranks_text(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8': short even with hundreds of ranks."""
    parts: list[tuple[int, int]] = []  # (first, last) of each run of consecutive ranks
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def diagnose(
    records: Mapping[int, Mapping | None],
    now: float,
    silent_after_s: float,
    gone: Collection[int] = (),
    unread: str | None = None,
) -> list[str]:
    """One line per stalled rank (gone, silent, behind, or without a record), then one line for
    the ranks that got furthest; when no rank stands out, one line saying where all of them
    wait. `records`: rank -> its last published record (None: none); `now`: unix seconds;
    `gone`: ranks whose record did not change across a closed connection (Tracker.diagnosis),
    ended however fresh their record; `unread`: why the ranks without a record were not read
    (the store failed), said on their one line. Behind and furthest are judged among the live
    ranks."""
    known = {r: rec for r, rec in records.items() if rec is not None}
    if not known:
        return ["no rank has published its progress"]
    ended = sorted(r for r in known if r in gone)
    silent = sorted(
        r
        for r, rec in known.items()
        if now - rec["published_at"] > silent_after_s and r not in gone
    )
    live = {r: rec for r, rec in known.items() if r not in silent and r not in ended}
    furthest = max(position(rec) for rec in (live or known).values())
    behind = sorted(r for r, rec in live.items() if position(rec) < furthest)
    missing = sorted(r for r, rec in records.items() if rec is None)
    lines = []
    if missing:  # one line however many: with 64 ranks, not 63 lines of the same
        who = f"rank{'s' if len(missing) > 1 else ''} {ranks_text(missing)}"
        why = f"not read: {unread}" if unread else "never started, or not read"
        lines.append(f"{who}: no progress record ({why})")
    for r in ended:
        rec = known[r]
        lines.append(
            f"rank {r} on {rec['host']} last reported {where(rec)}, "
            f"{now - rec['published_at']:.0f} s ago, and nothing since its connection closed: "
            "exited, killed or stopped"
        )
    for r in silent:
        rec = known[r]
        lines.append(
            f"rank {r} on {rec['host']} last reported {where(rec)}, "
            f"{now - rec['published_at']:.0f} s ago, and nothing since: stopped, frozen or dead"
        )
    for r in behind:
        rec = known[r]
        lines.append(
            f"rank {r} on {rec['host']} is alive but behind: it has been at {where(rec)} for "
            f"{now - rec['changed_at']:.0f} s"
        )
    ahead = sorted(r for r, rec in live.items() if position(rec) == furthest)
    if not lines:
        rec = known[ahead[0]]
        return [
            f"no rank lags: all {len(ahead)} ranks wait at {where(rec)} (for "
            f"{now - max(k['changed_at'] for k in known.values()):.0f} s or more): "
            "a collective mismatch or a network problem, not a stopped rank"
        ]
    if ahead:
        rec = known[ahead[0]]
        lines.append(f"the furthest rank(s) {ranks_text(ahead)} wait at {where(rec)}")
    return lines
