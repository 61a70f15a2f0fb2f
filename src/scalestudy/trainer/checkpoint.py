"""Checkpoints of a training run: atomic, checksummed, the last K kept, written in the background.

Layout of `--checkpoint-dir DIR` (one directory per run; never inside the run's declared outputs,
so a failed job's cleanup cannot delete it):

    DIR/epoch-0003/state.pt        rank 0: model (replicated strategies), optimizer, LR schedule,
                                   GradScaler, RNG states of every rank, progress and metrics so far
    DIR/epoch-0003/dcp/...         FSDP: sharded model + optimizer (torch.distributed.checkpoint)
    DIR/epoch-0003/manifest.json   written last: epoch, step, identity, sha256 + size of every file

A checkpoint is written into `DIR/.partial-epoch-0003/`, every file and directory fsynced, the
manifest written last, then the directory is renamed to `epoch-0003` and DIR fsynced: a reader
sees a complete checkpoint or none. Only after that are older checkpoints beyond the newest `keep`
deleted (and any numbered above the one just written: left by a run this one superseded), so a
failed write (disk full, read-only filesystem) leaves every earlier checkpoint intact.

The directory must be one every rank sees (rank 0 writes state.pt, every rank reads it): at
start every rank looks for a marker file rank 0 wrote there (write_marker, sees_marker;
state.Checkpointing refuses a directory some rank cannot see).

Resuming (`find_latest`) takes the newest checkpoint whose manifest and checksums verify, where
its identity (config_hash, world size, the prepared data's digest, the trainer code's sha256,
torch's version, RunState's fields, every rank's device, the ranks per host, the threads per
rank and the container image's digest: state.make_checkpointer) matches the run; a corrupted or
truncated one is skipped with a warning naming the file, one from another configuration, code,
torch, hardware or image is never resumed (a warning names the keys that differ, both values;
the run starts fresh, without looking further down, and its first save removes every checkpoint
of another identity).

Asynchronous saving: `Checkpointer.save` copies the state off the device (and clones CPU tensors,
which training keeps mutating) and returns; a background thread writes it. The stall training
sees is the copy; benchmarks/checkpoint_stall.py measures it against a synchronous save.
One save is in flight at a time; a write error is kept, returned by the next `poll`/`wait` and
raised by the next `save`. A rank 0 whose training fails with a write in flight (a peer died)
lets it end before exiting, for up to FINISH_WRITE_S (finish_writes; not FSDP's, whose write
needs every rank).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import random
import re
import secrets
import shutil
import signal
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scalestudy import log, vocab
from scalestudy.errors import CheckpointError
from scalestudy.files import fsync_dir, sha256, write_cause, write_failure, write_text

logger = log.get(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
STATE = "state.pt"
DCP_DIR = "dcp"
_NAME = re.compile(r"epoch-(\d{4,})")
# rank 0's record of the latest attempt of the run (state.Checkpointing.count_lost): the run's
# loop clock at its last epoch's end, so the next attempt knows the training it redoes
ATTEMPT = "attempt.json"
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: stopped on a signal after saving a checkpoint; rerun to resume
# rank 0's marker file for the check that every rank sees the directory (state.py), and how long
# a rank looks for it
SHARED_MARK = ".shared-check-"
SHARED_WAIT_S = 5.0
# seconds a failing rank 0 waits for its background write before it exits (finish_writes): the
# launchers end the ranks left 30 s after one failed (torchrun: SIGTERM, which StopFlag only
# notes, then SIGKILL; Slurm's KillWait, 30 s by default), and a hung filesystem holds the exit
# of a run nobody kills no longer than this
FINISH_WRITE_S = 25.0


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


# ---------------------------------------------------------------------------------------------
# writing


def _describe(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: {rank: (error, trace)}
    if isinstance(failures, dict) and failures:
        rank, (first, _) = min(failures.items(), key=lambda item: item[0])
        return f"rank {rank}: {_describe(first)}"
    return write_cause(exc)


def _write_error(directory: Path, epoch: int, exc: BaseException) -> CheckpointError:
    """The error of a failed save: the path, the cause in plain words, and what is left."""
    # a full filesystem behind torch.save's or DCP's error: judged by its free space while the
    # partial directory is still there
    cause = write_failure(exc, directory, _describe(exc))
    try:
        names = [p.name for p in list_checkpoints(directory)]
        kept = f"earlier checkpoints are intact: {names or 'none'}"
    except OSError as listing:  # the file system failing the listing too (EIO): the write's
        # error is still the one to report, never lost to this one's
        why = listing.strerror or listing
        kept = f"which earlier checkpoints are intact is unknown: cannot list {directory} ({why})"
    return CheckpointError(
        f"cannot write checkpoint {directory / checkpoint_name(epoch)}: {cause}; {kept}"
    )


def partial_dir(directory: Path, epoch: int) -> Path:
    return directory / f".partial-{checkpoint_name(epoch)}"


def write_checkpoint(
    directory: str | os.PathLike,
    epoch: int,
    state: dict,
    meta: dict,
    write_extra: Callable[[Path], None] | None = None,
    partial_ready: bool = False,
) -> Path:
    """Write `state` (CPU tensors) as DIR/epoch-NNNN atomically; returns the final path.

    `write_extra(partial)` writes more files first (FSDP: the DCP shards of every rank);
    `partial_ready` means the partial directory was already created (by prepare_partial)."""
    directory = Path(directory)
    partial = partial_dir(directory, epoch)
    final = directory / checkpoint_name(epoch)
    try:
        if not partial_ready:
            prepare_partial(directory, epoch)
        if write_extra is not None:
            write_extra(partial)
        # serialise in memory, then write: torch.save's own file writer reports a full disk as
        # "enforce fail at inline_container.cc", a plain write raises ENOSPC
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with (partial / STATE).open("wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        del buffer
        files = {}
        for path in sorted(p for p in partial.rglob("*") if p.is_file()):
            rel = path.relative_to(partial).as_posix()
            files[rel] = {"sha256": sha256(path), "bytes": path.stat().st_size}
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "files": files,
            **meta,
        }
        with (partial / MANIFEST).open("w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        # the entries of files in subdirectories (the DCP shards in dcp/) must be durable too
        for sub in sorted(p for p in partial.rglob("*") if p.is_dir()):
            fsync_dir(sub)
        fsync_dir(partial)
        if final.exists():  # the same epoch saved again (a resumed run): replace it whole
            shutil.rmtree(final)
        os.replace(partial, final)
        fsync_dir(directory)
    except Exception as exc:
        with contextlib.suppress(OSError):
            shutil.rmtree(partial)
        # torch.save turns a Ctrl-C or stop signal raised in its writes into a RuntimeError
        # ("enforce fail at inline_container.cc"), the interrupt its context: an interrupt
        # still, not a failed write
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise exc.__context__ from None
        raise _write_error(directory, epoch, exc) from exc
    return final


def prepare_partial(directory: Path, epoch: int) -> Path:
    partial = partial_dir(directory, epoch)
    directory.mkdir(parents=True, exist_ok=True)
    if partial.exists():  # left over by a killed writer
        shutil.rmtree(partial)
    partial.mkdir()
    return partial


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete-looking checkpoint directories (renamed from partial), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def prune(directory: str | os.PathLike, keep: int, identity: dict, saved: int) -> list[Path]:
    """After checkpoint `saved` was written: keep it and the `keep` - 1 checkpoints of this
    identity before it; delete the older ones, every checkpoint numbered above `saved`, every
    checkpoint of another identity (a different experiment, never resumable here) and every one
    whose manifest is unreadable (never resumable either). Returns what was removed.

    A checkpoint numbered above the one just written is stale: the run resumed from an earlier
    one, so the later ones were corrupted or not verifiable. Counting them as the newest would
    delete the good checkpoint just written and leave only them."""
    removed = []
    mine = []
    for path in list_checkpoints(directory):
        if int(_NAME.fullmatch(path.name).group(1)) > saved:
            removed.append(path)
            continue
        manifest = _read_manifest(path, quiet=True)
        # an unreadable manifest is never resumed (verify): counted among the `keep`, it
        # deleted the good checkpoint before it
        if path.name != checkpoint_name(saved) and (
            manifest is None or _differences(manifest, identity)
        ):
            removed.append(path)
        else:
            mine.append(path)  # oldest first, ending with `saved`
    removed += mine[: max(0, len(mine) - keep)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def remove_all(directory: str | os.PathLike) -> None:
    """Delete every checkpoint (complete and partial) of a finished run, and its ATTEMPT
    record (a rerun of the finished run starts afresh: it redoes nothing of this one's)."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if _NAME.fullmatch(path.name) or path.name.startswith(".partial-"):
            shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(SHARED_MARK):  # left by a rank 0 killed during the check
            with contextlib.suppress(OSError):
                path.unlink()
    with contextlib.suppress(OSError):
        (directory / ATTEMPT).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when empty


def write_marker(directory: Path) -> tuple[Path, str]:
    """Rank 0's marker for the check that every rank sees the checkpoint directory (a random
    name and content): its path and token."""
    token = secrets.token_hex(8)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{SHARED_MARK}{token}"
    write_text(path, token)  # fsynced and renamed into place: whole when a reader finds it
    return path, token


def sees_marker(directory: Path, token: str, wait_s: float = SHARED_WAIT_S) -> bool:
    """Whether this rank finds rank 0's marker `token` in `directory`, looking for up to
    `wait_s` seconds: a network filesystem may show a file another node just made a moment
    later (attribute caching); a node-local directory never shows it."""
    path = directory / f"{SHARED_MARK}{token}"
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if path.read_text(encoding="utf-8") == token:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# reading


def _differences(manifest: dict, identity: dict) -> dict[str, tuple[Any, Any]]:
    """The identity keys on which a checkpoint's manifest and this run differ: key -> (the
    checkpoint's value, this run's); empty when the checkpoint is this run's. A manifest written
    before a key joined the identity (data_sha256, code_sha256, ...) lacks it: another identity
    (None), never resumed, removed at the first save; a checkpoint of other data or code could
    not be told apart. Of RunState's fields (names, a set) each side keeps the items the other
    lacks; the devices and ranks per host (ordered, with repeats) are shown whole."""
    differ = {}
    for key, mine in identity.items():
        theirs = manifest.get(key)
        if key in manifest and theirs == mine:
            continue
        if key == "run_state_fields" and isinstance(theirs, list) and isinstance(mine, list):
            theirs, mine = (
                [x for x in theirs if x not in mine],
                [x for x in mine if x not in theirs],
            )
        differ[key] = (theirs, mine)
    return differ


def _read_manifest(path: Path, quiet: bool = False) -> dict | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
        return manifest
    except (OSError, ValueError) as exc:
        if not quiet:
            raise CheckpointError(f"{path / MANIFEST}: unreadable ({exc})") from exc
        return None


def _valid_entry(info: Any) -> bool:
    return (
        isinstance(info, dict)
        and isinstance(info.get("sha256"), str)
        and isinstance(info.get("bytes"), int)
    )


def verify(path: str | os.PathLike) -> dict:
    """The manifest of a checkpoint whose every file has its recorded size and sha256; else
    CheckpointError naming the first bad file."""
    path = Path(path)
    manifest = _read_manifest(path)
    files = manifest.get("files")
    if manifest.get("format") != FORMAT or not isinstance(files, dict):
        raise CheckpointError(f"{path / MANIFEST}: not a format-{FORMAT} checkpoint manifest")
    for rel, info in files.items():
        if not _valid_entry(info):
            raise CheckpointError(
                f"{path / MANIFEST}: entry {rel!r} is {info!r}, not {{'sha256': ..., 'bytes': ...}}"
            )
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"{file}: missing")
        try:
            size = file.stat().st_size
            digest = sha256(file) if size == info["bytes"] else None
        except OSError as exc:  # EIO of a damaged disk, a file system target down: skipped too
            raise CheckpointError(f"{file}: unreadable ({exc.strerror or exc})") from exc
        if size != info["bytes"]:
            raise CheckpointError(f"{file}: {size} bytes, the manifest says {info['bytes']}")
        if digest != info["sha256"]:
            raise CheckpointError(f"{file}: sha256 differs from the manifest (corrupted)")
    return manifest


def find_latest(
    directory: str | os.PathLike, identity: dict, warn: Callable[[str], None] | None = None
) -> tuple[Path, dict] | None:
    """(path, manifest) of the newest valid checkpoint of this identity, or None."""
    warn = warn or _warn
    for path in reversed(list_checkpoints(directory)):
        try:
            manifest = verify(path)
        except CheckpointError as exc:
            warn(f"skipping corrupted checkpoint: {exc}; trying the previous one")
            continue
        if differ := _differences(manifest, identity):
            theirs = {key: value for key, (value, _) in differ.items()}
            mine = {key: value for key, (_, value) in differ.items()}
            warn(
                f"not resuming {path}: it belongs to another configuration, code or hardware "
                f"({theirs}, this run is {mine}); starting fresh, it will be "
                "removed at this run's first checkpoint"
            )
            return None
        return path, manifest
    return None


def load_state(path: str | os.PathLike) -> dict:
    return torch.load(Path(path) / STATE, map_location="cpu", weights_only=False)


def _warn(message: str) -> None:
    logger.warning(f"WARNING: {message}")


# ---------------------------------------------------------------------------------------------
# state helpers


def cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor on the CPU and detached from training's storage."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict:
    """This rank's random state: torch CPU, CUDA (all devices), Python, plus named generators."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "generators": {k: g.get_state() for k, g in (generators or {}).items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in (generators or {}).items():
        if name in state["generators"]:
            g.set_state(state["generators"][name])


class StopFlag:
    """SIGTERM/SIGUSR1/SIGHUP set a flag instead of killing the rank; the training loop agrees
    on it with the other ranks at the next epoch boundary (signals reach ranks at different
    times). SIGHUP is a closed terminal (an ssh session that dropped): it killed the rank on the
    spot, the run's training since its last checkpoint lost and a stray temp file of the write
    in flight left; a SIGHUP ignored at start (nohup) stays ignored."""

    SIGNALS = vocab.RANK_STOP_SIGNALS

    def __init__(self) -> None:
        self.signal: int | None = None

    def install(self) -> None:
        for sig in self.SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        # only the flag: the handler runs between any two bytecodes of the main thread, and a
        # print there can land inside another write to stderr (RuntimeError: reentrant call);
        # the training loop reports the signal at the epoch boundary where it acts on it
        self.signal = signum

    @property
    def raised(self) -> bool:
        return self.signal is not None

    @property
    def signame(self) -> str:
        return signal.Signals(self.signal).name if self.signal else "no signal"


# ---------------------------------------------------------------------------------------------
# the saver


class Checkpointer:
    """Saves on rank 0 (replicated strategies) or on every rank through DCP (FSDP).

    save() returns after the state is copied off the device; with async_write the files are
    written by a background thread. poll() returns the error of the last finished write (or
    None), wait() blocks until no write is in flight and returns the same; the next save()
    raises it (a CheckpointError naming the path and the cause).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int,
        identity: dict,
        rank: int,
        async_write: bool = True,
        dcp_group=None,
    ) -> None:
        self.directory = Path(directory)
        self.keep = keep
        self.identity = identity
        self.rank = rank
        self.async_write = async_write
        self.dcp_group = dcp_group  # a gloo group of all ranks: DCP's collectives off the main one
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.saved: list[int] = []
        self.stall_s = 0.0  # seconds training waited for save() (copy + sync writes)
        self.writing: tuple[int, bool] | None = None  # the last save's epoch, and if sharded
        _SAVERS.add(self)  # finish_writes: a failing rank lets its write in flight end

    def save(self, epoch: int, state: dict, sharded: dict | None = None, wait: bool = False):
        """Checkpoint after `epoch` epochs. `state` is rank 0's (others may pass {}), `sharded`
        the DCP state dict every rank passes under FSDP."""
        t0 = time.perf_counter()
        error = self.wait()  # one save in flight at a time
        if error is not None:  # the previous write failed: say so now, not one save later
            raise error
        meta = {"step": state.get("progress", {}).get("step"), **self.identity}
        extra = self._dcp_writer(epoch, sharded) if sharded is not None else None
        snapshot = cpu_copy(state) if self.rank == 0 else None
        sync = wait or not self.async_write
        self.writing = (epoch, sharded is not None)

        def work() -> None:
            try:
                if extra is not None:
                    extra.finish()
                if self.rank == 0:
                    path = write_checkpoint(
                        self.directory,
                        epoch,
                        snapshot,
                        meta,
                        partial_ready=sharded is not None,
                    )
                    try:
                        prune(self.directory, self.keep, self.identity, saved=epoch)
                    except OSError as exc:  # written and renamed: saved, the old ones stay
                        logger.warning(
                            f"WARNING: checkpoint {path} written; older ones not removed "
                            f"({exc}): they take space until the next save removes them"
                        )
                self.saved.append(epoch)
            # errors are kept, returned by poll()/wait() and raised by the next save()
            except CheckpointError as exc:
                self.error = exc
            except (KeyboardInterrupt, SystemExit):  # a Ctrl-C in a synchronous save: the run's
                raise
            except BaseException as exc:  # the DCP write (torch's CheckpointException is one)
                self.error = self._dcp_failed(epoch, exc)

        if sync:
            work()
        else:
            self.thread = threading.Thread(target=work, name=f"checkpoint-{epoch}", daemon=True)
            self.thread.start()
        self.stall_s += time.perf_counter() - t0

    def _dcp_failed(self, epoch: int, exc: BaseException) -> CheckpointError:
        """A failed DCP write as the CheckpointError a failed write_checkpoint raises (path,
        cause in words, what is intact); rank 0 removes the partial directory."""
        error = _write_error(self.directory, epoch, exc)
        error.__cause__ = exc
        if self.rank == 0:
            with contextlib.suppress(OSError):
                shutil.rmtree(partial_dir(self.directory, epoch))
        return error

    def _dcp_writer(self, epoch: int, sharded: dict):
        """Start the DCP save of every rank's shards into the partial directory."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        partial = partial_dir(self.directory, epoch)
        # rank 0 makes the partial directory before anyone writes, and every rank learns
        # whether it could: a read-only or full file system is then each rank's one-line
        # CheckpointError, not rank 0's bare OSError with the others left in a barrier
        failed: list[str | None] = [None]
        if self.rank == 0:
            try:
                prepare_partial(self.directory, epoch)
            except OSError as exc:
                failed[0] = str(_write_error(self.directory, epoch, exc))
        dist.broadcast_object_list(failed, src=0, group=self.dcp_group)
        if failed[0] is not None:
            raise CheckpointError(failed[0])
        target = str(partial / DCP_DIR)
        if self.async_write:
            response = dcp.async_save(sharded, checkpoint_id=target, process_group=self.dcp_group)
            # torch returns a Future, or an AsyncSaveResponse whose upload_completion is one
            future = getattr(response, "upload_completion", response)

            class Pending:
                def finish(self) -> None:
                    future.result()

            return Pending()
        try:
            dcp.save(sharded, checkpoint_id=target, process_group=self.dcp_group)
        except BaseException as exc:  # DCP gathers the failure to every rank: all raise it here
            raise self._dcp_failed(epoch, exc) from exc

        class Done:
            def finish(self) -> None:
                pass

        return Done()

    def load_sharded(self, path: Path, sharded: dict) -> None:
        """Fill `sharded` (FSDP's DCP state dict, in place) from checkpoint `path`."""
        import torch.distributed.checkpoint as dcp

        dcp.load(sharded, checkpoint_id=str(path / DCP_DIR), process_group=self.dcp_group)

    def poll(self) -> BaseException | None:
        if self.thread is not None and not self.thread.is_alive():
            self.thread.join()
            self.thread = None
        return self.error

    def wait(self) -> BaseException | None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return self.error


# every Checkpointer of this process (a rank has one), for finish_writes
_SAVERS: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def finish_writes(timeout_s: float = FINISH_WRITE_S) -> None:
    """This rank's training failed (a peer died, an error, Ctrl-C): let rank 0's background
    write still in flight end, for up to `timeout_s`, before the process exits and the daemon
    writer thread dies with it. The write holds a whole checkpoint of an epoch every rank agreed
    to save (the model is replicated, every rank's RNG state gathered first), so it needs no
    other rank: a peer failing during it dropped it, and the rerun started one checkpoint
    earlier. Not an FSDP save: its DCP write ends in a collective of every rank, which a failed
    peer never joins. train.py calls this after the failure's lines, so a launcher's SIGKILL
    during the wait cuts no diagnosis."""
    for saver in list(_SAVERS):
        thread, writing = saver.thread, saver.writing
        if saver.rank != 0 or thread is None or not thread.is_alive() or writing is None:
            continue
        epoch, sharded = writing
        if sharded:
            continue
        path = saver.directory / checkpoint_name(epoch)
        logger.warning(
            f"finishing the checkpoint of epoch {epoch} ({path}), still being written, before "
            f"exiting (at most {timeout_s:g} s)"
        )
        thread.join(timeout_s)
        if thread.is_alive():
            _warn(
                f"{path} not written within {timeout_s:g} s: the rerun resumes from an earlier "
                "checkpoint"
            )
        elif saver.error is not None:
            _warn(str(saver.error))
        else:
            logger.warning(f"wrote {path}: the rerun resumes from it")
