"""A run's progress (`RunState`, what a checkpoint stores of it) and the checkpoint protocol of the
training loop (`Checkpointing`); checkpoint.py writes and reads the files.

The protocol (train.py describes it for users):
- start: every rank checks that it sees a file rank 0 writes in the checkpoint directory (one
  node-local to rank 0 is refused: the other nodes' ranks could never load a checkpoint); resume
  from the newest valid checkpoint of this configuration, data and code (rank 0 chooses, every
  rank loads), or start fresh without one;
- after every epoch but the last: one all-reduce on which every rank agrees whether to stop (a
  SIGTERM/SIGUSR1/SIGHUP on any rank) and whether any checkpoint write failed; save every
  --checkpoint-every epochs, and on a stop. Before a save the background write still in flight
  is waited for (in that all-reduce when the save is due by the schedule, in one more on a stop
  between scheduled saves), so a failed write fails every rank at the same point; no save
  where a resume from it could measure nothing (no window step yet, and too few steps left
  for one after a new warm-up: `_unresumable`);
- on a stop: wait until the save is complete on every rank, then raise Preempted (exit 75;
  without a save, the same, saying why the same command trains again);
- at the end, after metrics.json: remove the run's checkpoints, so a finished run never
  resumes (a failed metrics.json write keeps them for the rerun).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn

import torch
import torch.distributed as dist

from scalestudy import files, log, vocab
from scalestudy.errors import CheckpointError, Preempted, TrainConfigError
from scalestudy.trainer import checkpoint as ckpt
from scalestudy.trainer import dist as sdist
from scalestudy.trainer import measure, progress
from scalestudy.trainer.config import POWERSGD_START_ITER, TrainConfig

if TYPE_CHECKING:
    from scalestudy.trainer.measure import Meter

logger = log.get(__name__)


@dataclass
class RunState:
    """A run's progress: a checkpoint stores `dataclasses.asdict` of it as "progress" (rank 0's),
    and each rank's window sums once more in "ranks" (the ones it resumes with)."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    # images an epoch trains, all ranks: every epoch's count is the same (fixed batches, the
    # ragged tail dropped), and every segment trains at least one epoch to count it again
    epoch_images: int = 0
    history: list[dict] = field(default_factory=list)  # the epochs.csv rows so far
    window_images: int = 0  # images this rank processed in the steady-state window
    window_time: float = 0.0  # seconds of training steps in the window (no evaluation)
    window_step_times: list[float] = field(default_factory=list)  # seconds per window step
    # seconds per phase (data, forward, ...) summed over the window steps: GPU time between CUDA
    # events on GPU, host time on CPU (measure.StepTimer); "data" gives data_time_frac
    window_phase_seconds: dict[str, float] = field(default_factory=dict)
    # seconds per window step of this rank's busy time (measure.SYNC_PHASE) and data phase
    window_busy_times: list[float] = field(default_factory=list)
    window_data_times: list[float] = field(default_factory=list)
    # this rank's measures of the segments before, as of each one's last checkpoint
    # (Meter.bank_segment), combined with the last segment's in Meter.reduce: the highest peak
    # memory (MiB), the host synchronisations inside the window (--sync-debug) and the NVML
    # utilisation samples inside the window (their sum and count, so the mean weighs every
    # segment by its samples: its time in the window)
    peak_mem_mb: float = 0.0
    host_syncs_in_window: int = 0
    gpu_util_sum: float = 0.0
    gpu_util_samples: int = 0
    # the graphs --compile compiled inside the window (None until a compiled segment's window
    # opened)
    compile_graphs_in_window: int | None = None
    # this rank's NVML energy counter summed over the segments (measure.EnergyCounter.banked:
    # joules, spans, seconds and images of the window's spans, each segment's wall span) and the
    # counter's key in each segment ("keys"); empty without a counter (a CPU run)
    energy_sums: dict = field(default_factory=dict)
    loop_time: float = 0.0  # loop seconds banked so far: earlier segments, checkpoints
    checkpoint_stall_s: float = 0.0  # stall of earlier segments
    # loop seconds earlier attempts trained past the checkpoint their successor resumed from
    # (redone): Checkpointing.count_lost
    lost_time_s: float = 0.0
    resumed_from_epochs: list[int] = field(default_factory=list)
    # metrics.json's started_at: when the first segment started (UTC, ISO 8601, whole seconds)
    started_at: str | None = None
    # the hosts of every segment that saved a checkpoint so far: the ones whose training the
    # window sums hold (metrics.json hostnames joins the last segment's)
    hostnames: list[str] = field(default_factory=list)


# RunState fields that differ between ranks: each rank saves and resumes its own
PER_RANK = (
    "window_images",
    "window_time",
    "window_step_times",
    "window_busy_times",
    "window_data_times",
    "peak_mem_mb",
    "host_syncs_in_window",
    "gpu_util_sum",
    "gpu_util_samples",
    "compile_graphs_in_window",
    "energy_sums",
)


class Trainables(NamedTuple):
    """Everything besides RunState that defines a run's future, saved in every checkpoint."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    generators: dict[str, torch.Generator]  # random state carried across epochs (DataLoader's)


def rng_generators(train_loader) -> dict[str, torch.Generator]:
    """Generators whose state carries across epochs (the DataLoader's; DeviceLoader reseeds)."""
    gen = getattr(train_loader, "generator", None)
    return {"dataloader": gen} if isinstance(gen, torch.Generator) else {}


def device_runs(names: list[str]) -> list[str]:
    """Every rank's device name, in rank order, as runs of equal names: ["4 x NVIDIA H100 80GB
    HBM3"] for 4 ranks on one model, one short item however many ranks."""
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][1] == name:
            runs[-1][0] += 1
        else:
            runs.append([1, name])
    return [f"{count} x {name}" for count, name in runs]


def rank_layout(device: torch.device, world_size: int) -> tuple[list[str], list[int]]:
    """device_runs of every rank's device and measure.ranks_per_host of their hosts
    (measure.rank_places: a collective beyond 1 rank)."""
    places = measure.rank_places(device, world_size)
    return device_runs([name for _, name in places]), measure.ranks_per_host(
        [host for host, _ in places]
    )


def make_checkpointer(
    cfg: TrainConfig, rank: int, world_size: int, data_sha256: str, device: torch.device
) -> ckpt.Checkpointer | None:
    """The run's Checkpointer (None without --checkpoint-dir). Its identity is what a resumed
    run must share: the configuration, the world size and the prepared data (data_sha256,
    loaders.data_sha256: data.pt's sha256, verified at loading, and the meta.json values the
    run reads, its mean and std among them): --data-dir is not in config_hash (where files
    are), so another directory holding other data resumed, its schedule set for other steps
    per epoch, and an edited meta.json resumed under other normalisation constants.
    And the code: the sha256 of the trainer's source (measure.code_sha256: the files that can
    change a measured number, known in or out of git and a container; not the git commit,
    which a commit of docs or an edit of config.yaml changes too), torch's version and the
    fields of RunState (a checkpoint whose progress this code cannot read): a rerun after a
    trainer change resumed the old code's epochs silently. And the hardware: every rank's device
    (rank_layout, a collective beyond 1 rank): a job requeued on another GPU model (a mixed
    partition) resumed, and metrics.json summed both models' windows into one throughput_img_s
    under the last segment's device_names. And the layout, the ranks per host: a study whose
    gpus_per_node changed runs w8 as 2 x 4 where it ran 1 x 8, under the same run id and so
    the same checkpoint directory, and a stopped 1 x 8 job's checkpoint resumed, both layouts'
    windows summed under the last one's nodes and ranks_per_node. And the threads per rank
    (hardware.cpus_per_rank: a changed count's rerun resumed the old count's steps). And the
    container image's digest (a rebuilt image reruns the runs: they resumed the old image's
    checkpoints, one throughput of both)."""
    if not cfg.checkpoint_dir:
        return None
    devices, layout = rank_layout(device, world_size)
    # FSDP saves through torch.distributed.checkpoint, whose collectives run in the background:
    # give them their own gloo group so they never interleave with training's collectives. Its
    # timeout is --pg-timeout-s, as the default group's: without one it was torch's 30 minutes
    group = None
    if cfg.strategy == "fsdp":
        timeout = datetime.timedelta(seconds=cfg.pg_timeout_s)
        group = dist.new_group(backend="gloo", timeout=timeout)
    return ckpt.Checkpointer(
        cfg.checkpoint_dir,
        keep=cfg.checkpoint_keep,
        identity={
            "config_hash": cfg.config_hash(),
            "world_size": world_size,
            "data_sha256": data_sha256,
            "code_sha256": measure.code_sha256(),
            "torch_version": torch.__version__,
            "run_state_fields": sorted(f.name for f in dataclasses.fields(RunState)),
            "devices": devices,
            "ranks_per_host": layout,
            # rank 0's, as metrics.json's threads_per_rank (launch sets them to
            # hardware.cpus_per_rank): a changed count's rerun resumed the old count's steps
            "threads_per_rank": torch.get_num_threads(),
            # the image the launcher ran the ranks in (jobs/launch.py), None outside one: a
            # rebuilt image (other CUDA, cuDNN, NCCL) reruns the runs, which must not resume
            # the old image's checkpoints
            "container_digest": os.environ.get(vocab.CONTAINER_DIGEST_ENV) or None,
        },
        rank=rank,
        async_write=cfg.checkpoint_async,
        dcp_group=group,
    )


def _sharded_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


class Checkpointing:
    """The training loop's side of checkpointing; without --checkpoint-dir every hook does
    nothing (and resume() starts fresh). Creating it is a collective with --checkpoint-dir and
    several ranks (their devices; under FSDP a gloo group too)."""

    def __init__(
        self,
        cfg: TrainConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        stop: ckpt.StopFlag | None,
        trainables: Trainables,
        data_sha256: str,
    ) -> None:
        self.cfg, self.rank, self.device, self.stop = cfg, rank, device, stop
        self.trainables = trainables
        self.saver = make_checkpointer(cfg, rank, world_size, data_sha256, device)
        persistent = cfg.loader == "dataloader" and cfg.num_workers > 0 and cfg.persistent_workers
        if self.saver and rank == 0 and persistent:
            logger.warning(
                f"WARNING: --loader dataloader with --num-workers {cfg.num_workers} and "
                "persistent workers: a resumed run is correct but not bit for bit identical to an "
                "uninterrupted one (the workers' random state is not checkpointed); for an exact "
                "resume use --num-workers 0 or --no-persistent-workers"
            )
        if self.saver and rank == 0 and cfg.comm_hook == "powersgd":
            # its per-rank error feedback is a whole gradient per rank: too big to gather into
            # rank 0's checkpoint at scale, so it is not saved
            logger.warning(
                "WARNING: --comm-hook powersgd: a resumed run is not bit for bit identical to an "
                "uninterrupted one: PowerSGD's state (its step count, error feedback and "
                "warm-start factors) is not checkpointed, so each segment starts it anew with "
                f"{POWERSGD_START_ITER} uncompressed steps"
            )

    @property
    def stall_s(self) -> float:
        """Seconds training waited for checkpoint saves, all segments (0 without checkpoints)."""
        return self.saver.stall_s if self.saver else 0.0

    def resume(self) -> RunState:
        """Load the newest valid checkpoint of this configuration into the trainables; returns its
        RunState (a fresh one when there is none). Rank 0 chooses, every rank loads."""
        saver, rank = self.saver, self.rank
        if saver is None:
            return RunState()
        model, optimizer, scheduler, scaler, generators = self.trainables
        self._check_shared()
        choice = [None]
        progress.at("checkpoint search")  # rank 0's I/O (hang diagnosis)
        if rank == 0:
            found = ckpt.find_latest(saver.directory, saver.identity)
            choice[0] = str(found[0]) if found else None
        progress.at("checkpoint choice")
        dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return RunState()
        path = Path(choice[0])
        progress.at("checkpoint load")  # every rank's I/O (FSDP: DCP's collectives too)
        saved = ckpt.load_state(path)
        if self.cfg.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import set_state_dict

            sharded = _sharded_state(model, optimizer)
            saver.load_sharded(path, sharded)
            set_state_dict(
                model,
                optimizer,
                model_state_dict=sharded["model"],
                optim_state_dict=sharded["optimizer"],
            )
        else:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        scaler.load_state_dict(saved["scaler"])
        mine = saved["ranks"][rank]
        ckpt.set_rng_state(mine["rng"], generators)
        state = RunState(**saved["progress"])
        for key in PER_RANK:  # this rank's own sums (older checkpoints: some of them)
            if key in mine:
                setattr(state, key, mine[key])
        state.resumed_from_epochs = [*state.resumed_from_epochs, state.epoch]
        saver.stall_s = state.checkpoint_stall_s  # the stall of earlier segments carries on
        if rank == 0:
            logger.info(f"resuming from {path} (epoch {state.epoch}, step {state.step})")
        return state

    def _check_shared(self) -> None:
        """Every rank sees the files rank 0 writes in --checkpoint-dir, or a TrainConfigError
        before anything trains. Rank 0 alone writes state.pt and every rank reads it at a
        resume: a node-local directory (/tmp on each node) let a multi-node run train and save
        on rank 0's node, and the rerun died on the other nodes' ranks with a FileNotFoundError
        traceback, the checkpoint's training lost."""
        world_size = dist.get_world_size()
        if world_size == 1:
            return
        directory = self.saver.directory
        progress.at("checkpoint directory check")  # rank 0's write
        marker, sent = None, [None, None]  # rank 0's token, or why it could not write it
        if self.rank == 0:
            try:
                marker, sent[0] = ckpt.write_marker(directory)
            except OSError as exc:
                sent[1] = f"rank 0 cannot write in it: {files.write_cause(exc)}"
        # each rank's own read after rank 0's write, then the views gathered: a rank stuck in
        # its I/O is in an earlier phase than the others' wait (hang diagnosis)
        progress.at("checkpoint directory read")
        dist.broadcast_object_list(sent, src=0)
        token, failed = sent
        seen = token is not None and ckpt.sees_marker(directory, token)
        progress.at("checkpoint directory views")
        views: list = [None] * world_size
        dist.all_gather_object(views, (seen, sdist.hostname()))
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.unlink()
        if failed:  # the same on every rank (broadcast)
            raise TrainConfigError(f"--checkpoint-dir {directory}: {failed}")
        blind = [f"rank {r} on {host}" for r, (ok, host) in enumerate(views) if not ok]
        if not blind:
            return
        shown = ", ".join(blind[:4]) + (f" and {len(blind) - 4} more" if len(blind) > 4 else "")
        see = "does not see" if len(blind) == 1 else "do not see"
        raise TrainConfigError(  # all-gathered: every rank raises the same line, rank 0 says it
            f"--checkpoint-dir {directory} is not shared by every rank: {shown} {see} "
            f"the file rank 0 on {views[0][1]} wrote there, so a checkpoint could not be "
            "resumed: give a directory on a filesystem every node mounts, not node-local "
            "storage such as /tmp (--checkpoint-dir; the study config's checkpointing.dir)"
        )

    def count_lost(self, state: RunState) -> None:
        """After resume(), before training: state.lost_time_s = the loop seconds of earlier
        attempts that no checkpoint kept (train.py, lost_time_s): the latest attempt's record
        (ckpt.ATTEMPT, rank 0's, of this identity) holds its clock at its last epoch's end
        (`alive_s`) and the loss it knew of; what it ran past the clock this run resumed at
        was redone. Then this attempt's record replaces it at once, so an attempt killed
        before its first epoch's end still passes that loss on. Its resumes too (restarts): an
        attempt that resumed and was killed before its next save is in no checkpoint's
        resumed_from_epochs, only in its record, which then holds this one's resume after them.
        Rank 0 reads and writes it, every rank gets the sums (a broadcast: metrics.json is the
        same on every rank)."""
        if self.saver is None:
            return
        progress.at("attempt record")  # rank 0's I/O (hang diagnosis)
        known = [state.lost_time_s, state.resumed_from_epochs]
        if self.rank == 0:
            previous = self._read_attempt()
            if previous is not None:
                lost = previous["lost_time_s"] + max(0.0, previous["alive_s"] - state.loop_time)
                resumes = previous.get("resumed_from_epochs")
                if resumes is not None and state.resumed_from_epochs:  # this attempt resumed
                    resumes = [*resumes, state.resumed_from_epochs[-1]]
                known = [lost, resumes if resumes is not None else state.resumed_from_epochs]
            state.lost_time_s, state.resumed_from_epochs = known
            self._write_attempt(state, state.loop_time)
        progress.at("attempt shared")  # the others wait here while rank 0 is in its I/O
        dist.broadcast_object_list(known, src=0)
        state.lost_time_s, state.resumed_from_epochs = known

    def mark_alive(self, state: RunState, meter: Meter) -> None:
        """At an epoch's end (rank 0, outside every window): this attempt's loop clock, which
        the next attempt compares with the checkpoint it resumes from (count_lost)."""
        if self.saver is not None and self.rank == 0:
            progress.at("attempt record")  # rank 0's I/O (hang diagnosis)
            self._write_attempt(state, meter.loop_time(state))

    def _attempt_path(self) -> Path:
        return self.saver.directory / ckpt.ATTEMPT

    def _read_attempt(self) -> dict | None:
        """The latest attempt's record when it is this identity's (another configuration's,
        code's or data's attempt redid nothing of this run), else None."""
        path = self._attempt_path()
        try:
            record = json.loads(path.read_text())
            if record["identity"] != json.loads(json.dumps(self.saver.identity)):
                return None
            out: dict = {key: float(record[key]) for key in ("alive_s", "lost_time_s")}
            resumes = record.get("resumed_from_epochs")  # an older trainer's record: none
            if resumes is not None:
                out["resumed_from_epochs"] = [int(epoch) for epoch in resumes]
            return out
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning(
                f"WARNING: {path} unreadable ({exc}): the training earlier attempts redid is "
                "counted from the checkpoint only (lost_time_s is a lower bound)"
            )
            return None

    def _write_attempt(self, state: RunState, alive_s: float) -> None:
        """The record; a failed write costs the count of lost time, never the run (warned)."""
        record = {
            "identity": self.saver.identity,
            "alive_s": alive_s,
            "lost_time_s": state.lost_time_s,
            "resumed_from_epochs": state.resumed_from_epochs,
        }
        try:
            self.saver.directory.mkdir(parents=True, exist_ok=True)  # before the first save
            files.write_json(self._attempt_path(), record)
        except OSError as exc:
            logger.warning(
                f"WARNING: cannot write {self._attempt_path()} ({exc}): if this attempt is "
                "killed, the training it redoes is not counted (lost_time_s)"
            )

    def after_epoch(self, state: RunState, meter: Meter) -> None:
        """After epoch `state.epoch` (not the last): save every N epochs, and on a stop signal
        save, wait for the save on every rank and raise Preempted. Before a save, the write in
        flight has ended on every rank and all know whether it failed: save() would raise its
        error on the rank that wrote it alone, the others training on into a dead collective."""
        if self.saver is None or state.epoch >= self.cfg.epochs:
            return
        every = self.cfg.checkpoint_every
        due = bool(every and state.epoch % every == 0)
        stopping = self._agree_on_stop(wait=due)
        if stopping and self.stop is not None and self.stop.raised:
            logger.warning(
                f"received {self.stop.signame}: checkpointing after epoch {state.epoch} "
                "and stopping"
            )
        if stopping and not due:
            self._agree_on_write("an earlier checkpoint write failed on another rank")
        if stopping or due:
            meter.bank_loop_time(state)
            meter.bank_segment(state)
            state.checkpoint_stall_s = self.saver.stall_s
            if why := self._unresumable(state, meter):
                if stopping:  # the same command trains again (from an earlier checkpoint, if any)
                    raise Preempted(state.epoch, self._signame(), None, why)
                return
            self._save(state, wait=stopping)
            if stopping:
                self._stop_after_save(state.epoch)

    def _unresumable(self, state: RunState, meter: Meter) -> str:
        """Why a checkpoint of `state` is not written ("" where it is): a resume from it would
        warm up anew and reach no window step, no earlier segment having reached one (the
        resumed run refuses that, loop.py: every rerun refused, the checkpoint kept for ever,
        where the run from the start measures its window)."""
        left = state.step // state.epoch * (self.cfg.epochs - state.epoch)
        if not meter.window_out_of_reach(state, left):
            return ""
        return (
            f"a resume after epoch {state.epoch} would leave no steady-state window ({left} "
            f"optimizer steps left, warm-up {meter.warmup_steps}), and no step of this one "
            "was measured"
        )

    def _signame(self) -> str:
        stop = self.stop
        return stop.signame if stop is not None and stop.raised else "another rank's signal"

    def finish(self) -> None:
        """Training is over: a finished run never resumes, so its checkpoints go (rank 0)."""
        if self.saver:
            self.saver.wait()  # a write still in flight ends before its directory is removed
            if self.rank == 0:
                ckpt.remove_all(self.saver.directory)

    def _save(self, state: RunState, wait: bool) -> None:
        """Snapshot everything that defines the run's future and hand it to the saver."""
        model, optimizer, scheduler, scaler, generators = self.trainables
        per_rank: list = [None] * dist.get_world_size()
        mine = {key: getattr(state, key) for key in PER_RANK}
        progress.at("checkpoint agreement")  # hang diagnosis: the collectives of a save
        host = sdist.hostname()
        dist.all_gather_object(per_rank, {"rng": ckpt.rng_state(generators), "host": host, **mine})
        # this segment's hosts join the earlier segments' (a requeued job may land elsewhere)
        state.hostnames = sorted({*state.hostnames, *(r.pop("host") for r in per_rank)})
        fsdp = self.cfg.strategy == "fsdp"
        snapshot = {
            "model": None if fsdp else model.state_dict(),
            "optimizer": None if fsdp else optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "ranks": per_rank,
            "progress": dataclasses.asdict(state),
        }
        sharded = _sharded_state(model, optimizer) if fsdp else None
        progress.at("checkpoint write")  # the copy (and the write, on a stop: this rank's I/O)
        self.saver.save(state.epoch, snapshot, sharded, wait=wait)

    def _agree_on_stop(self, wait: bool) -> bool:
        """One all-reduce per epoch: did any rank get a stop signal, did any checkpoint write
        fail (`wait`: the one in flight waited for first)? Every rank leaves with the same
        answer, so all stop (or fail) at the same step."""
        error = self._wait_for_write() if wait else self.saver.poll()
        progress.at("stop agreement")  # hang diagnosis: a rank still writing is behind
        flags = torch.tensor(
            [float(bool(self.stop and self.stop.raised)), float(error is not None)],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        _raise_agreed(error, flags[1], "a checkpoint write failed on another rank (see its log)")
        return bool(flags[0].item())

    def _agree_on_write(self, elsewhere: str) -> None:
        """Wait for the write in flight; every rank raises when any rank's failed (this rank's
        error, or `elsewhere`)."""
        error = self._wait_for_write()
        progress.at("checkpoint agreement")  # hang diagnosis: a rank still writing is behind
        failed = torch.tensor([float(error is not None)], dtype=torch.float64, device=self.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        _raise_agreed(error, failed[0], f"{elsewhere} (see its log)")

    def _wait_for_write(self) -> BaseException | None:
        """The write in flight ended (its error, or None); training's wait counts as a stall."""
        progress.at("checkpoint write")  # this rank's I/O (hang diagnosis)
        t0 = time.perf_counter()
        error = self.saver.wait()
        self.saver.stall_s += time.perf_counter() - t0
        return error

    def _stop_after_save(self, epoch: int) -> NoReturn:
        """After the stop signal's synchronous save: exit 75 (Preempted) only with the checkpoint
        complete, and every rank together.

        Only rank 0 writes state.pt: a rank that exited at once would, under srun
        --kill-on-bad-exit, get the job step killed with rank 0 mid-write. The all-reduce holds
        every rank until rank 0 joins it after its write is renamed and fsynced (an all-reduce
        completes on no rank before all have entered it), and it carries whether any rank's
        write failed: then every rank fails with the error instead of claiming a checkpoint."""
        self._agree_on_write(f"the checkpoint of epoch {epoch} on stopping failed on another rank")
        raise Preempted(epoch, self._signame(), self.saver.directory / ckpt.checkpoint_name(epoch))


def _raise_agreed(error: BaseException | None, failed: torch.Tensor, elsewhere: str) -> None:
    """Raise this rank's write error, or `elsewhere` when only another rank's write failed
    (`failed`: the all-reduced flag)."""
    if failed.item():
        if error is not None:
            raise error
        raise CheckpointError(elsewhere)
