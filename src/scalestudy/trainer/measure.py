"""What the trainer measures, and how (the definitions are in train.py's docstring).

`Meter` owns one segment's measurement: the step timer (CUDA events on GPU, perf_counter on CPU),
the steady-state throughput window, NVML sampling, and the cross-rank reductions into metrics.json.
The training loop calls it through one-line hooks (epoch_start, before_step, step_start, phase,
step_end, epoch_end). Also here: the --profile-steps window (`Profiler`, torch.profiler or the
cudaProfiler API) and the exposed-communication probe (`comm_probe`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import math
import os
import platform
import resource
import statistics
import subprocess
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scalestudy import files, hardware, log, vocab
from scalestudy.trainer import compiling, progress
from scalestudy.trainer import dist as sdist
from scalestudy.trainer.config import STEPS_BEFORE_WINDOW, TrainConfig
from scalestudy.trainer.parallel import allreduce_gradients

if TYPE_CHECKING:
    from scalestudy.trainer.state import RunState

logger = log.get(__name__)


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU): the edges of every timed interval."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Meter:
    """One segment's measurement of the training loop; each hook is one line in loop.py.

    The steady-state window opens before the first optimizer step after the segment's first
    `warmup_steps` steps (on a synchronised device) and stays open to the end of training. At each
    epoch's end, the window's wall time and images in that epoch are added to the RunState's
    window sums and the phase times of the window's steps to its step-time lists; the epoch's
    training time is its epochs.csv epoch_time_s (train.py defines every number). Between
    epochs every rank waits for the others (join_ranks), so rank 0's writes stay out of every
    window.
    """

    def __init__(
        self, cfg: TrainConfig, device: torch.device, rank: int, graphs: str = "off"
    ) -> None:
        self.graphs = graphs  # the run's CUDA graphs (loop.Run.graphs: compiling.graphs_mode)
        # on compressed steps under powersgd (every segment warms up), and on replays of the
        # captured step under --cuda-graphs step
        self.device, self.warmup_steps = device, cfg.window_warmup_steps()
        if self.graphs == "step":
            self.warmup_steps = max(self.warmup_steps, STEPS_BEFORE_WINDOW)
        self.timer = StepTimer(device)
        cuda = device.type == "cuda"
        self.nvml = NvmlSampler(device, out=Path(cfg.out), rank=rank) if cuda else None
        # this rank's GPU's energy counter over the window (set in start(); tests set a stand-in)
        self.energy: EnergyCounter | None = None
        self.segment_start = 0  # the optimizer step this segment started from
        self.loop_start = 0.0
        self.in_window = False  # the current step is inside the window
        self.epoch_t0 = 0.0
        self.window_t0: float | None = None  # when the window opened in this epoch
        self.window_seen0 = 0  # the epoch's images before the window opened
        # the last epoch_end's epoch had every step inside the window (no warm-up step)
        self.epoch_in_window = False
        self.gpu_util: float | None = None
        # the phases a rank runs before its first gradient synchronisation can block it (busy
        # time: the imbalance between ranks, train.py)
        self.sync_phase = SYNC_PHASE[cfg.strategy]
        self.busy_phases = "+".join(BUSY_PHASES[cfg.strategy])
        if cfg.strategy == "ddp" and cfg.accum_steps > 1:
            self.busy_phases += " (and the backward of each micro-batch before the last)"
        self.delays = diag_delays(cfg, rank)  # phase -> seconds slept in it (diagnostic flags)
        # --compile: dynamo's graph count when the window opened and when the loop ended
        self.cfg, self.compiled = cfg, compiling.compile_on(cfg, device)
        self.graphs_at_window: int | None = None
        self.graphs_at_end: int | None = None
        # --sync-debug: host synchronisations inside the window's steps (CUDA only)
        self.syncs = SyncCounter() if cfg.sync_debug and cuda else None
        self.syncs_before = 0  # the earlier segments' (start(): from the checkpoint)
        self.compiles_before: int | None = None  # likewise, graphs compiled in their windows
        self.util_before = (0.0, 0)
        # the energy counter's key (energy_key) in each earlier segment: which rank counted
        # each GPU there (energy_total refuses a run whose ranks shared GPUs differently)
        self.energy_keys_before: list = []

    def window_out_of_reach(self, state: RunState, left: int) -> bool:
        """No window step measured yet, and `left` optimizer steps too few to reach one after a
        segment's warm-up (each segment warms up anew): the resumed run's refusal (loop.py)
        and the checkpoint a stop would write (state.py `_unresumable`) ask the same."""
        return not state.window_step_times and left <= self.warmup_steps

    def window_micro_batch(self, epoch_step: int, accum_steps: int) -> int | None:
        """The micro-batch of the epoch starting at optimizer step `epoch_step` at which the
        window opens (before_step); None where it is open from the epoch's first step. One past
        the epoch's end (the window opens in a later epoch) the device loader ignores."""
        steps = self.segment_start + self.warmup_steps - epoch_step
        return steps * accum_steps if steps > 0 else None

    def start(self, state: RunState) -> None:
        """The training loop starts (after any resume); warm-up is excluded again per segment."""
        self.segment_start = state.step
        self.loop_start = time.perf_counter()
        # the earlier segments' counts, to which this segment's are added (bank_segment)
        self.syncs_before = state.host_syncs_in_window
        self.compiles_before = state.compile_graphs_in_window
        self.util_before = (state.gpu_util_sum, state.gpu_util_samples)
        if self.nvml:
            self.nvml.start()
            self.energy = self.energy or self.nvml.energy_counter()
        if self.energy:  # the earlier segments' sums, to which this segment's reads add
            self.energy.restore(state.energy_sums)
            self.energy_keys_before = list(state.energy_sums.get("keys", []))

    def epoch_start(self) -> None:
        self.window_t0 = None
        device_sync(self.device)
        self.epoch_t0 = time.perf_counter()

    def before_step(self, step: int, seen: int) -> None:
        """Opens the window at the first step after warm-up; `seen`: the epoch's images so far."""
        progress.at_step(step)  # where this rank is, for the hang diagnosis (progress.py)
        self.in_window = step - self.segment_start >= self.warmup_steps
        if self.in_window and self.window_t0 is None:
            if step - self.segment_start == self.warmup_steps:
                # a marker for logs: e.g. TORCH_LOGS=recompiles lines after it are recompilations
                # inside the window (gpu-check counts them)
                logger.info(f"steady-state window opens at step {step}")
            device_sync(self.device)  # the window starts on an idle device
            self.window_t0, self.window_seen0 = time.perf_counter(), seen
            if self.compiled and self.graphs_at_window is None:
                self.graphs_at_window = compiling.graphs()
            if self.energy:
                self.energy.open()
            if self.nvml:
                self.nvml.open_span()

    def step_start(self) -> None:
        if self.syncs and self.in_window:
            self.syncs.start()
        self.timer.start()

    def phase(self, name: str):
        """A timed phase of the step (data, forward, backward, communication, optimizer)."""
        progress.at(name)  # an assignment: the hang diagnosis publishes it off the hot path
        return self.timer.phase(name)

    def diag_delay(self, phase: str) -> None:
        """The diagnostic flags' injected cause (config.py): sleep inside `phase`, if asked."""
        if phase in self.delays:
            time.sleep(self.delays[phase])

    def step_end(self) -> None:
        self.timer.stop(self.in_window)
        if self.syncs and self.in_window:
            self.syncs.stop()

    def epoch_end(self, state: RunState, seen: int) -> float:
        """Adds the epoch's times and window sums to `state`; returns the epoch's training time."""
        device_sync(self.device)
        epoch_time = time.perf_counter() - self.epoch_t0
        # the window opened at the epoch's first step: none of its steps warmed up
        self.epoch_in_window = self.window_t0 is not None and self.window_seen0 == 0
        if self.window_t0 is not None:
            window_time = time.perf_counter() - self.window_t0
            state.window_time += window_time
            state.window_images += seen - self.window_seen0
            if self.energy:
                self.energy.close(window_time, seen - self.window_seen0)
            if self.nvml:
                self.nvml.close_span()
        for st in self.timer.collect(self.sync_phase):
            if st["in_window"]:
                state.window_step_times.append(st["total"])
                if st["busy"] is not None:  # None: the synchronising phase is inside a replay
                    state.window_busy_times.append(st["busy"])
                state.window_data_times.append(st.get("data", 0.0))
                for name in PHASES:
                    seconds = state.window_phase_seconds.get(name, 0.0) + st.get(name, 0.0)
                    state.window_phase_seconds[name] = seconds
        return epoch_time

    def join_ranks(self) -> None:
        """Between epochs, outside the window: every rank waits until all have ended the epoch.
        Rank 0 alone writes epochs.csv, TensorBoard and the checkpoints (the copy before a
        background write, the whole --no-checkpoint-async write); a rank that went on opened its
        next window at once and waited for rank 0 inside its first step's collective, so that
        work was counted in its window time (the window is the longest rank's). One small
        all-reduce per epoch; the host waits for it here (NCCL's returns at once)."""
        progress.at("epoch end")  # hang diagnosis: a rank still writing is behind
        joined = torch.ones(1, device=self.device)
        dist.all_reduce(joined)
        joined.item()

    def loop_time(self, state: RunState) -> float:
        """Training-loop seconds so far: earlier segments and checkpoints (state.loop_time) plus
        this segment's seconds since the last bank_loop_time() or the loop's start."""
        return state.loop_time + time.perf_counter() - self.loop_start

    def bank_loop_time(self, state: RunState) -> None:
        """Move the loop seconds since the last call into state.loop_time (before a checkpoint
        stores it) and restart the clock, so no second is counted twice."""
        now = time.perf_counter()
        state.loop_time += now - self.loop_start
        self.loop_start = now

    def bank_segment(self, state: RunState) -> None:
        """Before a checkpoint stores `state`: this rank's measures so far over the segments,
        so a resumed run reports them over every segment (train.py): the highest peak memory,
        the host synchronisations inside the window, the NVML samples inside it (sum and
        count), the graphs --compile compiled inside it and the energy counter's sums
        (EnergyCounter.banked, with each segment's energy_key). Idempotent: each call sets the
        earlier segments' values plus this one's."""
        state.peak_mem_mb = max(state.peak_mem_mb, peak_memory_mb(self.device))
        state.host_syncs_in_window = self.syncs_before + (self.syncs.count if self.syncs else 0)
        state.compile_graphs_in_window = self.compiles_before
        if self.compiled and self.graphs_at_window is not None:  # this segment's window opened
            in_window = compiling.graphs() - self.graphs_at_window
            state.compile_graphs_in_window = (self.compiles_before or 0) + in_window
        util, samples = self.nvml.window_util() if self.nvml else (0.0, 0)
        state.gpu_util_sum = self.util_before[0] + util
        state.gpu_util_samples = self.util_before[1] + samples
        if self.energy:
            keys = [*self.energy_keys_before, self.energy_key()]
            state.energy_sums = {**self.energy.banked(), "keys": keys}

    def energy_key(self) -> tuple:
        """(host, GPU UUID, local rank) of this rank's energy counter: ranks sharing a GPU see
        the whole GPU's counter, and energy_total counts it by the lowest local rank on it."""
        gpu = self.energy.gpu if self.energy else None
        return (sdist.hostname(), gpu, sdist.detect().local_rank)

    def end_loop(self, state: RunState) -> float:
        """The training loop is over: returns train_time_s and stops NVML sampling; gpu_util
        is this rank's mean over the window samples of every segment (None without any)."""
        train_time = self.loop_time(state)
        if self.nvml:
            self.nvml.stop()
        self.bank_segment(state)
        samples = state.gpu_util_samples
        self.gpu_util = state.gpu_util_sum / samples if samples else None
        if self.compiled:
            self.graphs_at_end = compiling.graphs()
        return train_time

    def reduce(self, state: RunState, world_size: int) -> dict:
        """The measured numbers of metrics.json over all ranks (every rank calls it): window
        images summed, window time and peak memory the maximum, GPU utilisation the mean."""
        device = self.device
        totals = torch.tensor(
            [float(state.window_images), state.window_time], dtype=torch.float64, device=device
        )
        images_all = totals[:1].clone()
        dist.all_reduce(images_all)  # images: summed over ranks
        times_max = totals[1:].clone()
        dist.all_reduce(times_max, op=dist.ReduceOp.MAX)  # window: the slowest rank's wall time
        # the highest of every segment (the earlier ones' from the checkpoint: bank_segment),
        # this one's read now, the communication probe after the loop included
        peak = max(state.peak_mem_mb, peak_memory_mb(device))
        peak_mem = torch.tensor([peak], dtype=torch.float64, device=device)
        dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
        places = rank_places(device, world_size)
        hosts = [host for host, _ in places]
        layout = ranks_per_host(hosts)
        # every rank joins the gather, with or without NVML (a rank that skipped it would
        # leave the others waiting until the process-group timeout)
        utils: list = [None] * world_size
        dist.all_gather_object(utils, self.gpu_util)
        sampled = [u for u in utils if u is not None]
        throughput = images_all.item() / times_max.item()
        step_times = state.window_step_times
        return {
            "nodes": len(layout),
            "ranks_per_node": max(layout),
            "throughput_img_s": throughput,
            "throughput_img_s_per_rank": throughput / world_size,
            "window_steps": len(step_times),
            # the steps each segment's window left out: --warmup-steps, or more (PowerSGD's
            # uncompressed steps, the captured step's eager ones)
            "window_warmup_steps": self.warmup_steps,
            "window_images": int(images_all.item()),
            "window_time_s": times_max.item(),
            "epoch_time_s": median_epoch_time(state.history),
            "step_time_ms_p50": 1e3 * _quantile(step_times, 0.50),
            "step_time_ms_p95": 1e3 * _quantile(step_times, 0.95),
            "data_time_frac": state.window_phase_seconds.get("data", 0.0) / sum(step_times),
            **{
                f"phase_frac_{name}": state.window_phase_seconds.get(name, 0.0) / sum(step_times)
                if name in self.timed_phases
                else None
                for name in PHASES
            },
            "phase_time_source": "cuda_events" if device.type == "cuda" else "host_clock",
            **self.reduce_ranks(state, world_size),
            "peak_mem_mb": peak_mem.item(),
            "peak_mem_source": "cuda_max_allocated" if device.type == "cuda" else "process_max_rss",
            "gpu_util_mean": statistics.fmean(sampled) if sampled else None,
            "gpu_util_ranks": len(sampled),  # ranks whose NVML samples make up the mean
            **self.reduce_energy(world_size),
            **self.reduce_gpus(world_size),
            # a resumed run's: every segment's (state.hostnames), as its window sums are
            "hostnames": sorted({*state.hostnames, *hosts}),
            "device_names": sorted({name for _, name in places}),
            **compiling.in_effect(
                self.compiled,
                self.graphs,
                self.graphs_at_window,
                self.graphs_at_end,
            ),
            # in_effect's, over every segment (end_loop banked this one's): each compiles anew, and
            # a recompilation inside any segment's window is inside the run's window sums
            "compile_graphs_in_window": state.compile_graphs_in_window if self.compiled else None,
            # every segment's (end_loop banked this one's)
            "host_syncs_in_window": state.host_syncs_in_window if self.syncs else None,
        }

    @property
    def timed_phases(self) -> tuple[str, ...]:
        """The phases this run's steps time: all but communication, which is a phase of its
        own under the allreduce strategy only (DDP and FSDP communicate inside backward and
        forward: its fraction is null there, not a measured 0); under --cuda-graphs step the
        data phase only (the rest is one graph replay)."""
        if self.graphs == "step":
            return ("data",)
        return tuple(p for p in PHASES if p != "communication" or self.cfg.strategy == "allreduce")

    def reduce_ranks(self, state: RunState, world_size: int) -> dict:
        """rank_times of every rank, as lists in rank order (every rank calls it: one
        all_gather_object), and which phases made up the busy time."""
        everyone: list = [None] * world_size
        dist.all_gather_object(everyone, rank_times(state))
        return {
            **{key: [mine[key] for mine in everyone] for key in everyone[0]},
            "busy_phases": self.busy_phases,
        }

    def reduce_gpus(self, world_size: int) -> dict:
        """mfu_gpus: the distinct physical GPUs the ranks ran on, the N of mfu = X F / (P N)
        (every rank calls it). A GPU is its host and CUDA UUID (gpu_identity), as reduce_energy
        counts GPUs: ranks sharing one GPU over gloo (one visible GPU puts every local rank on
        cuda:0, train.pick_device) count it once, so their MFU is the one GPU's, not world_size
        peaks' (that understated it world_size / GPUs times). Counting the GPUs rather than
        refusing MFU to shared ones: the shared GPU's utilisation is as well defined as a lone
        rank's, and the count is the same gather a refusal would need. Null on a CPU."""
        everyone: list = [None] * world_size
        dist.all_gather_object(everyone, (sdist.hostname(), gpu_identity(self.device)))
        if any(gpu is None for _, gpu in everyone):
            return {"mfu_gpus": None}
        return {"mfu_gpus": len(set(everyone))}

    def reduce_energy(self, world_size: int) -> dict:
        """energy_j / energy_j_per_img / energy_source over all ranks (every rank calls it): each
        GPU counted once, by the lowest local rank on it (ranks sharing a GPU each see the whole
        GPU's counter); null when any GPU's counter is missing or refused, never estimated. A
        resumed run's counters hold every segment's sums (bank_segment), and "keys" each
        segment's energy_key."""
        mine = self.energy.result() if self.energy else energy_unmeasured("no GPU")
        mine.setdefault("wall", wall_unmeasured(mine["reason"]))
        mine.pop("gpu", None)
        mine["key"] = self.energy_key()
        mine["keys"] = [*self.energy_keys_before, mine["key"]]
        everyone: list = [None] * world_size
        dist.all_gather_object(everyone, mine)
        return energy_total(everyone)


def efficiency(
    throughput_img_s: float,
    flops_per_img: int,
    device_type: str,
    device_names: list[str],
    precision: str,
    gpus: int | None,
) -> dict:
    """metrics.json's FLOP rate and MFU (train.py defines them; hardware.py holds the peaks):
    `gpus` the distinct GPUs the ranks ran on (Meter.reduce_gpus: mfu_gpus), whose peaks the
    MFU divides by; None on a CPU, which has no peak. Ranks on devices of different names
    (device_names) have one peak when the table gives each the same figure (A100-SXM4-40GB and
    -80GB: one row); only where the figures differ is there no single peak, and no MFU."""
    peaks = {name: hardware.peak(device_type, name, precision) for name in device_names}
    unknown = sorted({p.why for p in peaks.values() if p.flops is None})
    figures = {p.flops for p in peaks.values()}
    if unknown:
        peak = hardware.Peak(None, None, "; ".join(unknown))
    elif len(figures) > 1:
        each = "; ".join(f"{n} {p.flops / hardware.TFLOPS:g} TFLOP/s" for n, p in peaks.items())
        why = f"the ranks ran on different devices ({each} at {precision}): no single peak"
        peak = hardware.Peak(None, None, why)
    else:
        peak = hardware.Peak(figures.pop(), "; ".join(sorted({p.source for p in peaks.values()})))
    if peak.flops and not gpus:
        peak = hardware.Peak(None, None, "the GPUs the ranks ran on were not counted")
    utilisation = None
    if peak.flops:
        utilisation = hardware.mfu(throughput_img_s, flops_per_img, peak.flops, gpus)
    return {
        "flops_per_img": flops_per_img,
        "model_flops_per_s": throughput_img_s * flops_per_img,
        "peak_flops": peak.flops,
        "peak_flops_source": peak.source,
        "mfu": utilisation,
        "mfu_unmeasured": peak.why,
    }


class SyncCounter:
    """--sync-debug: counts the host synchronisations CUDA ops make between start() and stop()
    (torch.cuda.set_sync_debug_mode("warn") turns each into a warning, recorded here, every one
    of them: the "always" filter). A diagnostic: the warnings cost host time, so a run that counts
    is not a measurement run (the flag is part of the config hash)."""

    MESSAGE = "called a synchronizing CUDA operation"

    def __init__(self) -> None:
        self.count = 0
        self._catcher: warnings.catch_warnings | None = None
        self._records: list | None = None

    def start(self) -> None:
        self._catcher = warnings.catch_warnings(record=True)
        self._records = self._catcher.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        if self._catcher is None:
            return
        self._catcher.__exit__(None, None, None)
        syncs = [w for w in self._records or [] if self.MESSAGE in str(w.message)]
        for w in syncs[:1] if not self.count else []:  # where the first one came from
            logger.warning(f"host synchronisation inside a step: {w.filename}:{w.lineno}")
        self.count += len(syncs)
        self._catcher = self._records = None


def environment(device: torch.device) -> dict:
    """What ran the numbers: the device, the code's commit, torch/CUDA/NCCL, the container."""
    cuda = device.type == "cuda"
    return {
        "device": device_info(device),
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        "nccl_version": nccl_version() if cuda else None,
        "container_digest": os.environ.get(vocab.CONTAINER_DIGEST_ENV) or None,
    }


# the timed phases of a training step, in the order they run (loop.py's meter.phase names)
PHASES = ("data", "forward", "backward", "communication", "optimizer")
# Busy time per strategy: the timed phases of a step before a rank's first collective that waits
# for the other ranks, so a fast rank's wait for a slow one is not in them. SYNC_PHASE: the
# phase that holds that collective, and which of its marks in a step (several micro-batches
# under gradient accumulation): DDP all-reduces buckets as its backward fills them, in the last
# micro-batch's backward only (the others run under no_sync: local); FSDP all-gathers parameters
# in every forward, the first included; allreduce waits in its communication phase. Its forward
# is local for DDP (no buffer broadcast: parallel.py). BUSY_PHASES names what that leaves in a
# step of one micro-batch. A cause of imbalance after these phases (a rank slow in backward
# under DDP) is not in the busy time: the waterfall's residual keeps it.
SYNC_PHASE = {
    "ddp": ("backward", "last"),
    "fsdp": ("forward", "first"),
    "allreduce": ("communication", "first"),
}
BUSY_PHASES = {
    "ddp": ("data", "forward"),
    "fsdp": ("data",),
    "allreduce": ("data", "forward", "backward"),
}


def diag_delays(cfg: TrainConfig, rank: int) -> dict[str, float]:
    """Phase -> seconds this rank sleeps in it per micro-batch (--diag-slow-rank: forward of
    rank R; --diag-data-delay-ms: data of every rank); empty without the diagnostic flags."""
    delays = {}
    slow = cfg.slow_rank()
    if slow is not None and slow[0] == rank:
        delays["forward"] = slow[1] / 1e3  # ms -> s
    if cfg.diag_data_delay_ms:
        delays["data"] = cfg.diag_data_delay_ms / 1e3
    return delays


class StepTimer:
    """Per-step phase durations: CUDA events on GPU (no host sync per step), perf_counter on CPU.

    Each phase is a record_function (torch.profiler, on CPU and as the GPU fallback without nsys)
    and, on GPU, also an NVTX range (Nsight), named data / forward / backward / communication /
    optimizer. Outside a profiler a record_function costs a few microseconds per phase.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.steps: list[tuple[bool, list[tuple[str, object, object]]]] = []
        self.current: list[tuple[str, object, object]] = []

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self) -> None:
        self.current = [("start", self._now(), None)]

    @contextlib.contextmanager
    def phase(self, name: str):
        begin = self._now()
        with torch.profiler.record_function(name):
            if self.cuda:
                torch.cuda.nvtx.range_push(name)
                try:
                    yield
                finally:
                    torch.cuda.nvtx.range_pop()
            else:
                yield
        self.current.append((name, begin, self._now()))

    def stop(self, in_window: bool) -> None:
        self.current.append(("end", self._now(), None))
        self.steps.append((in_window, self.current))

    def collect(self, sync: tuple[str, str] | None = None) -> list[dict]:
        """Seconds per phase and in total for each step since the last call (device synced),
        and "busy": the seconds of the phases before the step's synchronising mark, `sync` =
        (phase, "first" or "last" of its marks in the step: SYNC_PHASE); None when the step
        has no such mark (or no `sync` was given)."""

        def dt(a, b) -> float:
            return a.elapsed_time(b) / 1e3 if self.cuda else b - a

        out = []
        for in_window, marks in self.steps:
            start, end = marks[0][1], marks[-1][1]
            phases = [(name, dt(a, b)) for name, a, b in marks[1:-1]]
            step: dict = {"total": dt(start, end), "in_window": in_window, "busy": None}
            for name, seconds in phases:
                step[name] = step.get(name, 0.0) + seconds
            at = [i for i, (name, _) in enumerate(phases) if sync and name == sync[0]]
            if at:
                before = at[0] if sync[1] == "first" else at[-1]
                step["busy"] = sum(seconds for _, seconds in phases[:before])
            out.append(step)
        self.steps = []
        return out


class Profiler:
    """--profile-steps A:B profiles optimizer steps A..B-1 (a window past the run's last step is
    refused before training: loop.check_profile_window; so is a resume past step A:
    loop.check_profile_resume).

    On a GPU: cudaProfilerStart/Stop around the window, the capture range of `nsys profile
    --capture-range=cudaProfilerApi` and `ncu --profile-from-start off`. On a CPU, or on a GPU when
    SCALESTUDY_PROFILER=torch (set by `scalestudy profile capture` where nsys is missing):
    torch.profiler over the window, saved in --out/profile/ as torch_ops_rank{r}.json (key_averages,
    machine-readable: nsight/torch_ops.parse_torch), torch_ops_rank{r}.txt (the table) and
    trace_rank{r}.json (chrome trace). The range stops after step B-1 (after_step); its files
    are written after that epoch's throughput window (export), so the steady-state numbers hold
    the profiler's recording, start and stop, but not its export.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device, rank: int) -> None:
        self.window = cfg.profile_window()
        self.cuda_api = device.type == "cuda" and os.environ.get(vocab.PROFILER_ENV) != "torch"
        self.device = device
        self.dir = Path(cfg.out) / "profile"
        self.rank = rank
        self.prof = None

    def before_step(self, step: int) -> None:
        if not self.window or step != self.window[0]:
            return
        device_sync(self.device)
        if self.cuda_api:
            torch.cuda.profiler.start()
        else:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.__enter__()

    def after_step(self, step: int) -> None:
        if self.window and step == self.window[1] - 1:
            self.stop()

    def stop(self) -> None:
        """End the profiled range (after its last step; the files wait for export())."""
        if not self.window:
            return
        device_sync(self.device)
        if self.cuda_api:
            torch.cuda.profiler.stop()
        elif self.prof is not None:
            self.prof.__exit__(None, None, None)
        self.window = None

    def export(self) -> None:
        """Write a stopped torch.profiler range's files; the loop calls it after the epoch's
        meter.epoch_end, so the export (key_averages: about as long as the profiled steps
        themselves) stays out of the throughput window: inside it, it halved throughput_img_s."""
        if self.prof is None or self.window:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        averages = self.prof.key_averages()
        files.write_json(self.dir / f"torch_ops_rank{self.rank}.json", torch_ops_export(averages))
        table = averages.table(sort_by="self_cpu_time_total", row_limit=50)
        files.write_text(self.dir / f"torch_ops_rank{self.rank}.txt", table + "\n")
        trace = self.dir / f"trace_rank{self.rank}.json"
        tmp = trace.with_suffix(".json.tmp")
        self.prof.export_chrome_trace(str(tmp))
        if not tmp.is_file():
            # kineto logs a failed write ("Failed to write to log file!": a full disk, a quota)
            # and returns, its own partial temp file left: the rename's "No such file" hid that
            for partial in self.dir.glob(f"{glob.escape(tmp.name)}*"):
                partial.unlink(missing_ok=True)
            raise OSError(
                errno.EIO,
                "torch.profiler wrote no trace (its log says why: a full disk or quota?)",
                str(trace),
            )
        files.replace_with(tmp, trace)  # fsynced, as the other --out files
        self.prof = None

    def close(self) -> None:
        """Training is over: stop a range still open and write its files."""
        self.stop()
        self.export()

    def abandon(self) -> None:
        """Training stopped (a stop signal's checkpoint, an error) with the range maybe open:
        end it without files (a window cut short is no profile). torch.profiler left recording
        when the process exited crashed torch's exit (SIGSEGV in 2 of 5 runs: exit -11, not
        the stop's 75). Any error here is the profiler's: the run's own exception goes on."""
        with contextlib.suppress(Exception):
            if self.window and (self.cuda_api or self.prof is not None):
                self.stop()
        self.prof = None


def torch_ops_export(key_averages) -> dict:
    """The trainer's machine-readable export of prof.key_averages() (nsight/torch_ops.py reads
    it), times in us. A record_function range (the phases data/forward/backward/communication/
    optimizer) appears twice on a GPU: a CPU entry (host time: how long the CPU took to enqueue
    the phase) and a CUDA entry flagged user_annotation (kineto's span of the GPU operations
    whose innermost annotation on their own thread was the range: it misses what a nested range
    or autograd's thread launched, so the parser projects the phases from the chrome trace
    instead: torch_ops.trace_phases). On a CPU only the CPU entry exists, and its host time is
    the phase's real time."""
    ops = []
    for evt in key_averages:
        self_dev = getattr(evt, "self_device_time_total", None)
        if self_dev is None:
            self_dev = getattr(evt, "self_cuda_time_total", 0)
        device_total = getattr(evt, "device_time_total", None)
        if device_total is None:
            device_total = getattr(evt, "cuda_time_total", 0)
        ops.append(
            {
                "name": evt.key,
                "count": int(evt.count),
                "self_cpu_us": float(evt.self_cpu_time_total),
                "cpu_total_us": float(evt.cpu_time_total),
                "self_device_us": float(self_dev or 0),
                "device_total_us": float(device_total or 0),
                "device_type": str(getattr(evt, "device_type", "CPU")).rsplit(".", 1)[-1],
                "user_annotation": bool(getattr(evt, "is_user_annotation", False)),
            }
        )
    return {"format": "scalestudy-torch-ops-2", "time_unit": "us", "ops": ops}


def comm_probe(model, no_sync, loader, cfg, device, place, autocast, world_size, begin_step):
    """Exposed communication: 1 - t(fwd+bwd without sync) / t(fwd+bwd with sync); see train.py.
    Returns (that share, the two medians in ms: with sync, without). `place(x, y)` puts a batch
    on the device in the model's layout; `autocast()` is the run's; `begin_step()` starts each
    probe step as the training loop starts its steps (CUDA graphs)."""
    model.train()
    saved = [b.detach().clone() for b in model.buffers()]  # BN stats change in train mode
    if cfg.loader == "device":
        loader.set_epoch(0)
    batches = iter(loader)
    x, y = place(*next(batches))

    def one(sync: bool) -> float:
        device_sync(device)
        t0 = time.perf_counter()
        begin_step()
        with no_sync() if not sync else contextlib.nullcontext():
            with autocast():
                loss = F.cross_entropy(model(x), y)
            loss.backward()
        if sync and cfg.strategy == "allreduce":
            allreduce_gradients(model, world_size)
        device_sync(device)
        # the slowest rank sets the pace of a synchronous step
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        for p in model.parameters():
            p.grad = None
        return t.item()

    one(True)  # warm both paths once
    one(False)
    # the arms interleaved pass by pass: a drift over the probe (clocks, caches, a shared node's
    # other jobs) falls on both alike; all of one arm, then all of the other, put it between them
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(cfg.comm_probe_steps):
        for sync in (True, False):
            times[sync].append(one(sync))
    with torch.no_grad():
        for b, s in zip(model.buffers(), saved, strict=True):
            b.copy_(s)
    t_sync, t_nosync = statistics.median(times[True]), statistics.median(times[False])
    return max(0.0, 1.0 - t_nosync / t_sync), 1e3 * t_sync, 1e3 * t_nosync


GPU_SAMPLE_COLUMNS = (
    "time_s",
    "unix_time_s",
    "rank",
    "gpu",
    "util_pct",
    "mem_util_pct",
    "mem_used_mb",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
)


def nvml_read(pynvml, handle) -> dict:
    """One NVML sample of a device: utilisation %, memory used MiB, clocks MHz, power W."""
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    return {
        "util_pct": util.gpu,
        "mem_util_pct": util.memory,
        "mem_used_mb": pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,  # NVML reports mW
    }


# NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption: mJ since the driver was last
# loaded, Volta and newer; NVML API reference / cuda.bindings.nvml docs) is updated coarsely,
# "approximately every 100 ms" (ml.energy blog, "Thermally Stable Profiling for Accurate GPU
# Energy Measurement"; Zeus v0.6.1 notes the period can exceed a short window). NVIDIA does not
# document the period, so this is the best available figure, not a datasheet value.
ENERGY_UPDATE_S = 0.1
# A read lags the true count by at most one update, so each epoch's span (two reads) can be off by
# up to 2 updates' worth of energy: relative error <= 2 * spans * ENERGY_UPDATE_S / window_s.
# A window whose bound exceeds this is refused (null + reason), never reported. On a GPU an
# epoch of CIFAR-10 lasts ~1.7 s (one H200 rank), so 30 spans of 1.7 s are bound at 12%: the
# training spans are refused there, and the wall span below (two reads in all) is what counts.
ENERGY_MAX_ERROR = 0.02


def _frozen(mj: float, seconds: float) -> str | None:
    """Why a span of `mj` millijoules over `seconds` is no measurement, or None: a counter that
    did not advance (a read that succeeds with a frozen value, reported of other vendors'
    counters) recorded a measured 0 J, which collect then refused as damage, run after run; no
    GPU trains on no energy."""
    if seconds > 0 and mj <= 0:
        return f"{vocab.ENERGY_FROZEN} in {seconds:.1f} s of training: not counting"
    return None


def energy_unmeasured(reason: str, images: int = 0) -> dict:
    """EnergyCounter's spans, refused or not read; `images`, those the rank trained in them, of a
    window too short for this rank alone: they count in J/img where another rank's reading is
    its GPU's (energy_total), where any other refusal blanks the total."""
    return {"joules": None, "images": images, "reason": reason}


def wall_unmeasured(reason: str, seconds: float | None = None, images: int = 0) -> dict:
    """EnergyCounter's wall span, refused or not read (EnergyCounter._wall)."""
    return {"joules": None, "seconds": seconds, "images": images, "reason": reason}


class EnergyCounter:
    """One GPU's NVML energy counter over the throughput window, as read by one rank: read at
    each epoch's window open and at the epoch's end (the device synchronised both times), the
    deltas summed: the training spans. Also the wall span: from the first read of the window to
    the last, the evaluations and checkpoints between the window's epochs included, two reads
    in all (`clock()`: seconds, perf_counter). `read_mj()` returns the counter in mJ
    (nvmlDeviceGetTotalEnergyConsumption); `gpu` names the physical GPU (its UUID), so ranks
    sharing it are counted once.

    A resumed run's counter starts from the earlier segments' sums (restore(banked()), through
    the checkpoint), so its numbers cover every segment, as the window's images and time do:
    joules = sum over segments and their spans of (read at the span's end - read at its open),
    error bound 2 x U x spans / seconds over all of them (U = ENERGY_UPDATE_S). The wall span
    cannot bridge a restart (another process, maybe another node and counter): each segment
    has its own, from its first read to its last, and the run's wall is their sum, joules and
    seconds, bound 2 x U x segments / seconds."""

    def __init__(self, read_mj, gpu: str, clock=time.perf_counter) -> None:
        self.read_mj, self.gpu, self.clock = read_mj, gpu, clock
        self.mj, self.spans, self.seconds, self.images = 0, 0, 0.0, 0
        self.open_mj: int | None = None
        self.error: str | None = None
        # the wall span: (mJ, s) at the window's first read, and at its last end
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None
        # the wall spans of the earlier segments (restore): mJ and seconds summed, and how many
        self.walls_before: dict = {"mj": 0, "seconds": 0.0, "spans": 0}

    def banked(self) -> dict:
        """The sums over every segment so far, this one's wall span added to the earlier
        ones': what a checkpoint carries to the next segment (Meter.bank_segment; restore)."""
        wall = dict(self.walls_before)
        if self.first is not None and self.last is not None:
            wall["mj"] += self.last[0] - self.first[0]
            wall["seconds"] += self.last[1] - self.first[1]
            wall["spans"] += 1
        return {
            "mj": self.mj,
            "spans": self.spans,
            "seconds": self.seconds,
            "images": self.images,
            "error": self.error,
            "wall": wall,
        }

    def restore(self, banked: dict) -> None:
        """A resumed run: the earlier segments' banked() sums, which this segment's reads add
        to; an earlier segment's refusal stands (a sum without its energy would be a guess).
        Nothing to restore (an empty dict) on a fresh start."""
        if not banked:
            return
        self.mj, self.spans = banked["mj"], banked["spans"]
        self.seconds, self.images = banked["seconds"], banked["images"]
        self.error = self.error or banked["error"]
        self.walls_before = dict(banked["wall"])

    def _read(self) -> int | None:
        if self.error is None:
            try:
                return int(self.read_mj())
            except Exception as exc:  # NVMLError_NotSupported (pre-Volta, some vGPUs) and friends
                self.error = f"NVML energy counter unavailable: {exc}"
        return None

    def open(self) -> None:
        self.open_mj = self._read()
        if self.first is None and self.open_mj is not None:
            self.first = (self.open_mj, self.clock())

    def close(self, seconds: float, images: int) -> None:
        """The epoch's window span ends: `seconds` and `images` of this rank in the span."""
        end, start, self.open_mj = self._read(), self.open_mj, None
        if end is None or start is None:
            return
        if end < start:  # the driver reloaded (the counter restarts at 0)
            self.error = "NVML energy counter went backwards (driver reloaded?)"
            return
        self.mj += end - start
        self.last = (end, self.clock())
        self.spans, self.seconds, self.images = (
            self.spans + 1,
            self.seconds + seconds,
            self.images + images,
        )

    def result(self) -> dict:
        """{"joules", "images", "reason", "gpu", "wall"}: joules None (with the reason) when
        refused; "wall": the wall span's {"joules", "seconds", "reason"}, likewise."""
        out = {"gpu": self.gpu, "wall": self._wall()}
        if self.error:
            return out | energy_unmeasured(self.error)
        if self.spans == 0:
            return out | energy_unmeasured("no window span was read")
        bound = 2 * self.spans * ENERGY_UPDATE_S / self.seconds if self.seconds > 0 else 1.0
        if bound > ENERGY_MAX_ERROR:
            reason = (
                f"{vocab.ENERGY_SHORT_WINDOW}: {self.seconds:.1f} s over "
                f"{self.spans} spans, error bound {bound:.1%} > {ENERGY_MAX_ERROR:.0%}"
            )
            return out | energy_unmeasured(reason, self.images)
        if frozen := _frozen(self.mj, self.seconds):
            return out | energy_unmeasured(frozen)
        return out | {"joules": self.mj / 1e3, "images": self.images, "reason": None}

    def _wall(self) -> dict:
        """The wall span, one per segment: two reads each, so the error bound is
        2 * ENERGY_UPDATE_S * segments / their seconds."""
        wall = self.banked()["wall"]
        if self.error or wall["spans"] == 0:
            return wall_unmeasured(self.error or "no window span was read")
        seconds, spans = wall["seconds"], wall["spans"]
        bound = 2 * spans * ENERGY_UPDATE_S / seconds if seconds > 0 else 1.0
        if bound > ENERGY_MAX_ERROR:
            span = "a wall span" if spans == 1 else f"{spans} wall spans (one per segment)"
            reason = (
                f"{vocab.ENERGY_SHORT_WINDOW}: {span} of {seconds:.1f} s, error bound "
                f"{bound:.1%} > {ENERGY_MAX_ERROR:.0%}"
            )
            return wall_unmeasured(reason, seconds, self.images)
        if frozen := _frozen(wall["mj"], seconds):
            return wall_unmeasured(frozen, seconds)
        return {
            "joules": wall["mj"] / 1e3,
            "seconds": seconds,
            "images": self.images,
            "reason": None,
        }


# why a resumed run whose ranks counted the GPUs differently in its segments has no energy
ENERGY_LAYOUT_CHANGED = (
    "the ranks shared GPUs differently in the segments of this resumed run, and each rank's "
    "counter sums its segments: which rank counted which GPU's energy is unknown"
)


def energy_total(readings: list[dict]) -> dict:
    """Every rank's EnergyCounter.result() (with "key" = (host, gpu, local_rank)) -> the metrics:
    energy_j = sum over GPUs of the lowest local rank's joules; energy_j_per_img = energy_j /
    the images all ranks trained in the counted spans; null when any GPU has no number. The
    same for the wall span (energy_wall_j, energy_wall_j_per_img over the same images,
    energy_wall_s the longest rank's span, energy_wall_unmeasured). A resumed run's results
    sum every segment (EnergyCounter.restore), so the readers must be the same ranks in each:
    "keys", each segment's key (the last this one's); null with the reason when they differ."""
    readers = _readers([r["key"] for r in readings])
    layouts = [r.get("keys") or [r["key"]] for r in readings]  # per rank, a key per segment
    segments = min(len(keys) for keys in layouts)
    same = all(len(keys) == segments for keys in layouts) and all(
        _readers([keys[s] for keys in layouts]) == readers for s in range(segments)
    )
    if not same:
        changed = {
            **energy_unmeasured(ENERGY_LAYOUT_CHANGED),
            "wall": wall_unmeasured(ENERGY_LAYOUT_CHANGED),
        }
        readings = [changed | {"key": r["key"]} for r in readings]
    walls = [r.get("wall") or wall_unmeasured("no wall span was read") for r in readings]
    seconds = [w["seconds"] for w in walls if w["seconds"] is not None]
    out = {
        **_gpu_sum("energy", readings, readers),
        **_gpu_sum("energy_wall", walls, readers),
        "energy_wall_s": max(seconds) if seconds else None,
    }
    measured = out["energy_j"] is not None or out["energy_wall_j"] is not None
    out["energy_source"] = "nvml_total_energy" if measured else None
    return out


def _readers(keys: list) -> list[int]:
    """The indices of the (host, gpu, local_rank) keys that count their GPU: its lowest local
    rank (ranks sharing a GPU each see the whole GPU's counter)."""
    readers: dict = {}
    for i in sorted(range(len(keys)), key=lambda i: keys[i][2]):
        readers.setdefault(tuple(keys[i][:2]), i)
    return sorted(readers.values())


def _gpu_sum(prefix: str, parts: list[dict], readers) -> dict:
    """PREFIX_j (the joules of the `readers`' parts: one per GPU), PREFIX_j_per_img (over every
    rank's images) and PREFIX_unmeasured; null with the reasons when a part is refused, but
    for another rank's of a GPU refused as too short for its own window alone (not what is
    counted, and its images all there): an error's part counted too few images."""

    def blanks(i: int) -> bool:
        refused = parts[i]["joules"] is None
        return refused and (
            i in readers or not parts[i]["reason"].startswith(vocab.ENERGY_SHORT_WINDOW)
        )

    problems = sorted({parts[i]["reason"] for i in range(len(parts)) if blanks(i)})
    if problems:
        return {
            f"{prefix}_j": None,
            f"{prefix}_j_per_img": None,
            f"{prefix}_unmeasured": "; ".join(problems),
        }
    joules = sum(parts[i]["joules"] for i in readers)
    images = sum(p["images"] for p in parts)  # the wall's: the spans', read even when refused
    return {
        f"{prefix}_j": joules,
        f"{prefix}_j_per_img": joules / images if images else None,
        f"{prefix}_unmeasured": None,
    }


def nvml_handle(pynvml, props):
    """NVML's handle of the CUDA device whose torch.cuda.get_device_properties are `props`: by
    UUID (GPU-... or, for a MIG instance, MIG-...), else by PCI bus id. Never by index:
    CUDA_VISIBLE_DEVICES may list UUIDs or MIG instances, and CUDA's default device order
    (fastest first) need not be NVML's PCI order, so an index can name another job's GPU."""
    uuid, errors = str(props.uuid), []
    for key in (f"GPU-{uuid}", f"MIG-{uuid}"):
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(key)
        except Exception as exc:  # pynvml.NVMLError_NotFound and friends
            errors.append(f"{key}: {exc}")
    # NVML's bus id: 8 hex digits of domain, bus, device, function 0 ("00000000:3B:00.0")
    bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    try:
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except Exception as exc:
        errors.append(f"{bus_id}: {exc}")
    raise LookupError(f"no NVML device matches this CUDA device ({'; '.join(errors)})")


# seconds between two NVML samples of a rank's GPU (utilisation, power, clock)
NVML_INTERVAL_S = 0.5
# seconds NVML's utilisation looks back: "percent of time over the past sample period during
# which one or more kernels was executing", a period "between 1 second and 1/6 second depending
# on the product" (NVML API reference, nvmlUtilization_t). A sample counts for the window only
# where all of its look-back lies inside one of the window's spans: one taken early in a span
# measured mostly the compilation, evaluation or join before it (4% reported for a run whose
# steps filled 97% of its window, 43 to 100 for one configuration). Epochs shorter than this
# give no sample, so gpu_util_mean null: nvmlDeviceGetSamples (the driver's own timestamped
# samples) would measure them, untested without a GPU
NVML_UTIL_LOOKBACK_S = 1.0


class NvmlSampler:
    """This rank's GPU sampled every NVML_INTERVAL_S (GPU_SAMPLE_COLUMNS) during training.

    stop() returns the mean utilisation of the samples taken inside the throughput window's
    spans (open_span() .. close_span(), one per epoch) with all of their look-back
    (`lookback_s`, NVML_UTIL_LOOKBACK_S) inside the span, None without NVML or without such a
    sample, never a made-up 0: the whole run's mean counts compilation and warm-up (on an H200
    it read 5.8% for a run that kept the GPU busy in its window). Given `out`, it writes
    every sample to out/gpu_samples_rank{rank}.csv (time_s: seconds since start(); gpu: NVML's
    index of the device, found by UUID or PCI bus id: nvml_handle).
    `read(handle) -> dict` is nvml_read unless given (tests pass a stand-in: no GPU there).
    """

    def __init__(
        self,
        device: torch.device,
        interval_s: float = NVML_INTERVAL_S,
        out: Path | None = None,
        rank: int = 0,
        read=None,
        lookback_s: float = NVML_UTIL_LOOKBACK_S,
    ) -> None:
        self.index, self.interval, self.lookback = device.index or 0, interval_s, lookback_s
        self.out, self.rank, self.read = out, rank, read
        self.samples: list[dict] = []
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.physical = self.index
        self.pynvml, self.handle, self.uuid = None, None, ""
        self.t0: float | None = None  # time.monotonic() at start(): time_s is counted from it
        self.spans: list[list[float]] = []  # the window's [open, close] in time_s

    def open_span(self) -> None:
        """The window opens (an epoch's first window step; the device is idle)."""
        if self.t0 is not None:
            self.spans.append([time.monotonic() - self.t0, math.inf])

    def close_span(self) -> None:
        """The epoch's window span ends (the device synchronised)."""
        if self.spans and self.spans[-1][1] == math.inf:
            self.spans[-1][1] = time.monotonic() - self.t0

    def in_window(self, time_s: float) -> bool:
        """A sample at time_s measured the window alone: its look-back lies inside a span."""
        return any(start <= time_s - self.lookback and time_s <= end for start, end in self.spans)

    def window_util(self) -> tuple[float, int]:
        """The sum and the count of the utilisation samples so far inside the window's spans
        (what a checkpoint carries to the next segment: Meter.bank_segment)."""
        util = [s["util_pct"] for s in list(self.samples) if self.in_window(s["time_s"])]
        return float(sum(util)), len(util)

    def start(self) -> None:
        handle = None
        if self.read is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                props = torch.cuda.get_device_properties(self.index)
                handle = nvml_handle(pynvml, props)
                self.physical = pynvml.nvmlDeviceGetIndex(handle)
                self.pynvml, self.handle, self.uuid = pynvml, handle, str(props.uuid)
                self.read = functools.partial(nvml_read, pynvml)
            except Exception as exc:  # no NVML: the value stays null, never a made-up 0
                logger.warning(f"NVML unavailable ({exc}); gpu_util_mean will be null")
                return
        t0 = self.t0 = time.monotonic()

        def loop() -> None:
            while not self.stop_event.wait(self.interval):
                try:
                    sample = self.read(handle)
                except Exception as exc:  # a failing query ends sampling, never training
                    logger.warning(f"NVML sampling stopped: {exc}")
                    return
                self.samples.append(
                    {
                        "time_s": time.monotonic() - t0,
                        "unix_time_s": time.time(),
                        "rank": self.rank,
                        "gpu": self.physical,
                        **sample,
                    }
                )

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def energy_counter(self) -> EnergyCounter:
        """The energy counter of this GPU (a counter without NVML reports why it is null)."""
        if self.pynvml is None:
            counter = EnergyCounter(lambda: None, gpu=f"cuda:{self.index}")
            counter.error = "NVML unavailable"
            return counter
        read = functools.partial(self.pynvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)
        return EnergyCounter(read, gpu=self.uuid)

    def stop(self) -> float | None:
        if self.thread is None:
            return None
        self.stop_event.set()
        self.thread.join()
        if self.out is not None:
            lines = [",".join(GPU_SAMPLE_COLUMNS)]
            for s in self.samples:
                # unix_time_s to the millisecond: 6 significant digits of 1.8e9 s are 10^4 s
                cells = (
                    f"{s[c]:.3f}" if c == "unix_time_s" else f"{s[c]:.6g}"
                    for c in GPU_SAMPLE_COLUMNS
                )
                lines.append(",".join(cells))
            files.write_text(
                Path(self.out) / f"gpu_samples_rank{self.rank}.csv", "\n".join(lines) + "\n"
            )
        util = [s["util_pct"] for s in self.samples if self.in_window(s["time_s"])]
        return statistics.fmean(util) if util else None


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB -> MiB


def gpu_identity(device: torch.device) -> str | None:
    """The physical GPU of this rank's device: its CUDA UUID (what NvmlSampler finds it by in
    NVML and reduce_energy keys its counter by), never its index, which names another GPU under
    another CUDA_VISIBLE_DEVICES; None on a CPU."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def rank_places(device: torch.device, world_size: int) -> list[tuple[str, str]]:
    """(host, device name) of every rank, in rank order (device_info; a collective beyond
    1 rank)."""
    here = (sdist.hostname(), device_info(device)["name"])
    if world_size == 1:
        return [here]
    places: list = [None] * world_size
    dist.all_gather_object(places, here)
    return places


def ranks_per_host(hosts: list[str]) -> list[int]:
    """How many ranks each host holds, hosts in the order of their first rank: [4, 4] for 2
    nodes of 4, [8] for 1 node of 8; the layout without the host names (a requeued job on
    other nodes of the same shape is the same layout)."""
    return [hosts.count(host) for host in dict.fromkeys(hosts)]


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device)}
    # the model as the inventory reads it: lscpu's where cpuinfo has none (aarch64)
    name = hardware.cpu_model(_lscpu) or platform.processor() or platform.machine()
    return {"type": "cpu", "name": name}


def _lscpu() -> str:
    """lscpu's output, "" where it is missing or fails."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        argv = ["lscpu"]
        return subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=10
        ).stdout
    return ""


def git_commit() -> str | None:
    """The commit of the code that ran: given by the launcher in the container (whose image may
    have no git: jobs/container_exec.py exec_prefix), else read from the source tree."""
    if os.environ.get(vocab.GIT_COMMIT_ENV):
        return os.environ[vocab.GIT_COMMIT_ENV]
    sha = files.git_commit(Path(__file__).resolve().parent)
    return None if sha == "unknown" else sha


@functools.cache
def code_sha256() -> str:
    """sha256 of the trainer's source as this process imported it: every .py file of
    scalestudy/trainer/ and of the package's top level (the shared vocabulary, errors, files,
    log and hardware it imports), each as its path below the package and its bytes, in path
    order. The code that can change a measured number, whatever the git checkout around it."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*package.glob("*.py"), *package.glob("trainer/**/*.py")]):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def rank_times(state: RunState) -> dict[str, float | None]:
    """This rank's entries of the *_by_rank lists, ms: the medians of its window steps' whole,
    busy and data-phase times, and the mean of the data-phase times. The mean is the data wait
    per step: the device loader prepares loaders.AHEAD steps' batches inside one step's data
    phase, so most steps' data phase holds none of that work and the median step shows ~0 (one
    H100, bf16, local batch 512: a median of 0.0016 ms where the mean is ~0.1 ms)."""
    data = state.window_data_times
    return {
        "step_time_ms_p50_by_rank": _median_ms(state.window_step_times),
        "busy_time_ms_p50_by_rank": _median_ms(state.window_busy_times),
        "data_time_ms_p50_by_rank": _median_ms(data),
        "data_time_ms_mean_by_rank": 1e3 * sum(data) / len(data) if data else None,
    }


def median_epoch_time(history: list[dict]) -> float:
    """metrics.json's epoch_time_s: the median epoch time over the epochs whose every step was
    inside the window ("in_window", loop.end_of_epoch), over all epochs when none was. Each
    segment of a resumed run warms up anew, so its first epoch is slow again (compilation:
    tens of seconds on a GPU); the median over all epochs counted those, and a 3-epoch run
    resumed once reported a warm epoch where the uninterrupted run reported a steady one."""
    steady = [r["epoch_time_s"] for r in history if r.get("in_window")]
    return statistics.median(steady or [r["epoch_time_s"] for r in history])


def _median_ms(seconds: list[float]) -> float | None:
    """The p50 of step_time_ms_p50 (_quantile), so rank 0's entry of a *_by_rank list equals it."""
    return 1e3 * _quantile(seconds, 0.50) if seconds else None


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile, linear between the two nearest ranks (numpy.percentile's default, the
    median at q = 0.5). It took the nearest rank with round(), which rounds half to even: the
    p50 of 4 step times was the 3rd, of 6 the 3rd, of 8 the 5th."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)
