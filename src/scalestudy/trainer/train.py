"""`scalestudy train`: train one configuration and measure it.

Launch (the same code on a laptop and on H100 nodes; see dist.py for how a rank finds its place):
    scalestudy train --dataset synthetic --width 8 --epochs 2                 # 1 process
    torchrun --nproc-per-node=4 -m scalestudy train --precision bf16 ...       # 1 node, 4 ranks
    srun --nodes=2 --ntasks=8 --ntasks-per-node=4 python -m scalestudy train  # Slurm, 8 ranks
Backend: NCCL on CUDA, gloo on CPU (--backend gloo: several ranks share one GPU, which NCCL
refuses: one line says so). Device: one visible GPU is cuda:0 for every rank, else the local
rank's GPU; --device cuda never falls back to the CPU. Rank 0 writes
--out/{metrics.json,epochs.csv} atomically.
Exit status: 0 done; 75 stopped on a signal after a checkpoint; 130 (killed by SIGINT) Ctrl-C,
one line from rank 0 (a rank whose collective failed as an interrupted peer exited is
interrupted too: Interrupt); 1 cannot start (the rendezvous, a device that fails: one line per
rank); 2 an expected error (a bad flag, one this node cannot run: --device cuda without CUDA,
fp16 or NCCL on a CPU, one line per node; missing or changed prepared data,
checked before the rendezvous where possible: one line, from rank 0; cli.py); a bug raises, with
its traceback on every rank.

Modules: loop.py (the training loop), measure.py (how the numbers below are taken), state.py
(checkpoint protocol and resume), parallel.py (DDP/FSDP/all-reduce), recipe.py (optimizer, LR
schedule), loaders.py (input pipelines), checkpoint.py (checkpoint files), progress.py (a hung
rank is named: every rank logs which rank stopped, and where, when a collective fails).

How the numbers are measured (the analysis relies on these definitions):
- step: one optimizer step (accum_steps micro-batches on every rank; an epoch's last step may
  hold fewer, when its micro-batches do not divide by accum_steps).
- throughput_img_s: images processed by all ranks in the steady-state window divided by the
  window's wall time. The window starts after `warmup_steps` optimizer steps (compilation, cuDNN
  autotuning, allocator growth) and covers every later training step; evaluation is excluded
  (the device is synchronised at each edge), and so is what rank 0 alone does at an epoch's
  end (epochs.csv, TensorBoard, a checkpoint's copy or synchronous write): every rank waits for
  it before its next epoch (measure.Meter.join_ranks), not inside its next window's first
  step. Every training step has the same input shape: the ragged last n % (local_batch x
  world_size) samples of each epoch's permutation are left out of that epoch
  (loaders.epoch_batches), so no new shape re-runs cuDNN autotuning or recompiles inside the
  window. An epoch therefore trains on floor(n / (local_batch x world_size)) x local_batch x
  world_size images (floor(n / global_batch) x global_batch when accum_steps is 1; with
  accumulation the micro-batch, not the global batch, is the unit). Images are summed over
  ranks; the window time is the maximum over ranks. Under --profile-steps the profiled steps
  inside the window count in it, with the profiler's recording, start and stop (those before
  window_warmup_steps are warm-up steps; the study's captures pass --warmup-steps at most
  profiling.start_step: study/profiling.window_flags);
  its export (torch.profiler's files, measure.Profiler.export) is written after the epoch's
  window, outside it.
  throughput_img_s_per_rank = throughput_img_s / world_size.
- window_warmup_steps: the optimizer steps the window leaves out at the start of each segment
  (measure.Meter.warmup_steps): --warmup-steps (metrics.json warmup_steps), but at least
  PowerSGD's 10 uncompressed steps under --comm-hook powersgd and 12 (the captured step's 11
  eager steps and its capture) under cuda_graphs_mode "step". window_steps: the steps inside it.
- epoch_time_s: median over epochs of the wall time of an epoch's training steps (no evaluation,
  rank 0's clock: the ranks synchronise every step, so the others' differ by a step's tail),
  over the epochs whose every step is inside the window (none of a segment's warm-up steps in
  them), over all epochs when no epoch is (a warm-up reaching into the last epoch).
- step_time_ms_p50/p95: rank 0's step times inside the window (CUDA events on GPU).
- data_time_frac: share of window step time spent producing the batch (index, augment, copy).
- phase_frac_{data,forward,backward,communication,optimizer}: each phase's share of rank 0's
  window step time; phase_time_source says the clock: "cuda_events" on GPU (GPU time between
  events recorded on the stream at the phase's edges, never host enqueue time) or "host_clock"
  (perf_counter, CPU runs). What is left to 1 is time between the phases. Communication is a
  phase of its own under --strategy allreduce only: DDP and FSDP communicate inside backward
  (and FSDP's forward), so its fraction is null there, never a measured 0. Under
  cuda_graphs_mode "step" the forward, backward, communication and optimizer phases are one
  graph replay: their fractions are null (never 0) and only data is timed per step.
- step_time_ms_p50_by_rank, busy_time_ms_p50_by_rank, data_time_ms_p50_by_rank: lists in rank
  order, each rank's median over its window steps (gathered to rank 0 at the end) of its whole
  step time, its busy time and its data-phase time. In synchronous data parallelism the slowest
  rank paces every rank's whole step (the others wait inside the gradient synchronisation), so
  the step times hardly differ; the busy time is what a rank runs before its first collective
  that waits for the others: the seconds of the step's phases before its synchronising phase
  (measure.SYNC_PHASE: DDP's last micro-batch's backward, FSDP's first forward, allreduce's
  communication); busy_phases names them (measure.BUSY_PHASES: ddp "data+forward", fsdp
  "data", allreduce "data+forward+backward"; under gradient accumulation DDP's also holds the
  backward of each micro-batch before the last, run under no_sync). Its spread over ranks is
  the imbalance of the efficiency-loss waterfall (analyze.py); a cause later in the step (a rank
  slow in DDP's backward) stays in the waterfall's residual. Null under cuda_graphs_mode
  "step" (the busy phases are inside the replay): the waterfall then leaves imbalance
  unmeasured.
- data_time_ms_mean_by_rank: each rank's mean data-phase time per window step, the waterfall's
  data wait: the device loader prepares 16 micro-batches (loaders.AHEAD) in one step's data
  phase, so the median step's data time (data_time_ms_p50_by_rank) holds none of that work; a
  group starts at the window's first step, so the window holds the preparation of every batch
  it trains on.
- diag_slow_rank, diag_data_delay_ms: diagnostic flags, off (null, 0) in every measurement;
  recorded so a run with an injected cause is never mistaken for one without. --diag-slow-rank
  R:MS: rank R sleeps MS ms (host sleep) at the end of the forward phase of every training
  micro-batch, warm-up included; --diag-data-delay-ms MS: every rank sleeps MS ms inside the data
  phase of every training micro-batch. Neither sleeps in the communication probe or in the
  evaluation, so the probe measures the communication alone.
- comm_exposed_frac: after training, `comm_probe_steps` forward+backward passes are timed with
  gradient synchronisation and as many without it (DDP no_sync / FSDP without gradient sync / no
  all-reduce), the two arms interleaved pass by pass (each pass the slowest rank's time);
  exposed = max(0, 1 - t_nosync / t_sync) of the arms' medians, the share of a forward-backward
  pass that communication adds beyond what overlaps with backward (under FSDP both arms
  all-gather the parameters, so the share is the gradient reduce-scatter's alone). Clipped at 0,
  the estimate errs upward where the true share is below the passes' noise (a few % of a pass on
  a shared CPU): comm_probe_sync_ms_p50 and comm_probe_nosync_ms_p50 record the two medians (ms;
  null where the probe did not run). Optimizer steps are not taken in the probe and BN
  statistics are restored, so it cannot change the trained model. At world_size 1 the probe is
  skipped and the value is 0.0 (nothing to synchronise); null when the probe is off. Under
  --accum-steps k the passes are single micro-batches too: the share of one synchronised pass,
  not of a step of k (the analysis leaves such a run's communication part blank). Under the
  whole-step CUDA graph (cuda_graphs_mode step) the passes are the compiled model's, eager, not
  a replay: the waterfall leaves that communication part blank too (results/analyze.py).
- param_count: not a timing: the model's trainable parameters (elements; FSDP: of the full, not
  the sharded, tensors). grad_sync_bytes: the bytes of gradient that one rank's all-reduce
  carries per optimizer step, P in the scaling model (study/model.py): ddp and allreduce:
  the gradients in their dtype (param_count x 4 for fp32 parameters, autocast included);
  with the fp16/bf16 comm hooks param_count x 2; null for powersgd (low-rank factors) and fsdp
  (reduce-scatter and all-gather, not one all-reduce of P).
- flops_per_img: not a timing: the FLOPs of one training image, forward + backward, counted by
  torch.utils.flop_counter on the run's network (models.training_flops_per_image: convolutions
  and matrix products, 2 FLOPs per multiply-add; 3,328,997,376 for ResNet-18 at width 64).
  model_flops_per_s = throughput_img_s x flops_per_img: the FLOP rate the network needed.
  mfu = model_flops_per_s / (peak_flops x mfu_gpus), peak_flops the dense peak of one device
  at the run's precision from NVIDIA's datasheets (hardware.py, peak_flops_source names the
  sheet); mfu_gpus: the distinct physical GPUs the ranks ran on (host + CUDA UUID,
  measure.Meter.reduce_gpus): world_size with one GPU per rank, 1 for ranks sharing one GPU
  over gloo, null on CPU; device_names: the devices of all ranks. mfu and peak_flops are
  null, with the reason in mfu_unmeasured, on CPUs, MIG slices, GPUs not in the table,
  precisions a GPU has no units for and ranks on devices of different peaks (devices whose
  names differ but whose table figure is the same, A100 40 and 80 GB, share it): never a
  guessed peak.
- compiled: --compile in effect (auto: on CUDA only; compiling.py). compile_graphs: the graphs
  dynamo compiled in this process by the end of the training loop; compile_graphs_in_window:
  those compiled after the steady-state window opened (recompilations inside the measurement:
  0 when the fast path holds; summed over the segments of a resumed run, each of which
  compiles anew). Null when not compiled. cuda_graphs_mode: the CUDA graphs in effect
  (--cuda-graphs; auto resolved by compiling.graphs_mode): "step" (the whole step one graph,
  step_graph.py; the window then opens no earlier than step 12, after the 11 eager steps and
  the capture), "compiled" (torch.compile's graphs) or "off"; cuda_graphs_used: not "off";
  cuda_graph_skips: inductor's graphs that could not run as CUDA graphs (null unless
  "compiled").
- host_syncs_in_window: --sync-debug only (CUDA): the host synchronisations CUDA operations made
  inside the window's training steps on rank 0 (0 is the fast path); null otherwise.
- peak_mem_mb: CUDA max_memory_allocated on GPU, the process's peak RSS on CPU (max over ranks
  and over the segments of a resumed run), in MiB (2**20 bytes, Slurm's MB).
- gpu_util_mean: mean NVML utilisation of the samples (every 0.5 s) that measured the
  throughput window alone: NVML's utilisation is the share of its past sample period (up to
  1 s) with a kernel running, so a sample counts where that look-back lies inside one of the
  window's spans (one per epoch; measure.NVML_UTIL_LOOKBACK_S). Null where none does (epochs
  shorter than about 1 s), averaged over the gpu_util_ranks ranks that have samples (the device
  is found by UUID/PCI bus id, not index); null without a GPU or NVML.
- energy_j: NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption) read at each
  epoch's window open and end, deltas summed, over the GPUs (each counted once: ranks sharing a
  GPU see the whole GPU); energy_j_per_img = energy_j / the images of the read spans (all ranks:
  window_images); energy_source "nvml_total_energy". Null, with the reason in
  energy_unmeasured, on CPU (RAPL is not read), without the counter on any GPU, or when the
  window is too short for its ~0.1 s update period (measure.ENERGY_MAX_ERROR); never estimated.
- energy_wall_j: the same counter from the window's first read to its last (two reads per GPU),
  so the evaluations and checkpoints between the window's epochs are in it; energy_wall_s that
  span's wall time (the longest rank's), energy_wall_j_per_img = energy_wall_j / the same
  images as energy_j_per_img: the energy a training image costs with its share of the
  evaluations between the window's epochs (those of E - 1 of a window of E epochs: the span
  ends with the last epoch's training; one fewer per resume, each segment its own span).
  Null, with the reason in energy_wall_unmeasured, as energy_j, but its error bound is that of
  one span (2 x 0.1 s / energy_wall_s: 10 s suffice), so it is measured where the ~1.7 s GPU
  epochs make energy_j's sum of per-epoch spans too coarse. The plan and resources.csv take
  energy_j_per_img where it is measured, else this one; results/plan.csv says which for each
  run (energy_basis); resources.csv's energy_kwh may sum both kinds, and its energy_basis
  says which ("mixed: 3 training, 1 evaluation included").
- backend: the process-group backend in effect (--backend auto resolved: nccl on CUDA, gloo on
  CPU). matmul_fp32_precision / cudnn_fp32_precision: "ieee" or "tf32" as torch reports them
  after set-up; cudnn_benchmark, autocast_dtype, channels_last_inputs/_weights likewise
  (numerics.py says why FSDP keeps NCHW weights).
- lr_max_reached: not a timing: the highest learning rate the schedule reaches, peak_lr unless
  the warm-up (--warmup-epochs) is at least as long as the run: then the LR rises through the
  whole run and never decays, ending below peak_lr when the warm-up is longer (lr_max_reached =
  peak_lr x run steps / warm-up steps), and rank 0 warns at start.
- time_to_target_s: training time (evaluation excluded, rank 0's clock) until the end of the
  first epoch whose val_acc reaches --target-acc; null if never reached, or without the flag
  (the workflow gives none: collect reads runs.csv's off epochs.csv with train.target_acc, so
  that changing the threshold retrains no run).
- train_time_s: wall time of the whole training loop, evaluation included.
- final_val_acc, best_val_acc: the last epoch's val_acc, and the highest over every epoch
  (every segment's); epochs.csv holds each.
- steps_per_epoch: optimizer steps per epoch (ceil of the micro-batches / accum_steps);
  train_images_per_epoch: the images one epoch trains, counted over all ranks (not steps x
  global batch: a short last accumulation group trains fewer; the ragged tail of a rank's
  shard is dropped); test_images_per_epoch: the (limited) test set, evaluated whole after every
  epoch.
- window_time_s, window_images, window_steps: the throughput window's wall time (the slowest
  rank's), its images (all ranks) and its optimizer steps.
- threads_per_rank: each rank's intra-op threads (rank 0's; launch sets them to the job's CPUs
  per rank): they set a CPU rank's speed, and the plan calibrates a run from runs of its count.
- launcher: what started the ranks (torchrun, srun, none); ddp_static_graph: DDP's
  static_graph in effect; param_checksums: each rank's parameter checksum at the end, all
  equal (a divergence fails the run).
- lost_time_s (--checkpoint-dir): loop seconds that earlier attempts of a resumed run trained
  past the checkpoint their successor resumed from, so redone (a kill -9, a node failure, a
  time limit reached before the stop's checkpoint): the sum over attempts k followed by
  another of max(0, alive_k - resumed_k+1), alive_k the run's loop clock (train_time_s's) at
  attempt k's last epoch's end, resumed_k+1 the clock the checkpoint attempt k+1 resumed from
  holds. Rank 0 keeps alive in --checkpoint-dir/attempt.json (rewritten at each epoch's end,
  outside the window; state.Checkpointing.count_lost), so it is measured to an epoch: the
  epoch a kill interrupts, and an attempt that ended no epoch, add nothing (a lower bound);
  so does start-up, as in train_time_s. 0 when nothing was redone (a stop on a signal saves
  everything trained); null without --checkpoint-dir (a rerun starts over, and nothing
  records the attempt before it). train_time_s + lost_time_s: the loop time every attempt
  spent, what resources.csv's spent node-hours count (the redone part: lost_node_hours).
- data_sha256: not a measurement: the prepared data as the run read it (loaders.data_sha256):
  the sha256 of data.pt's sha256 (meta.json's, checked against the file) and meta.json's
  num_classes, mean, std, train_shape and test_shape, in canonical JSON; not data.pt's own
  sha256 (meta.json's "sha256"). The same value is in the checkpoint identity, so every segment
  of a resumed run read the same data; data_dir says where it was.
- net_interface: not a measurement: the network interface gloo and NCCL were pinned to
  (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; dist.py), its distinct values over ranks, e.g.
  ["eth0 (auto)"]: "auto" = the interface routing to MASTER_ADDR, chosen by the trainer; "user" =
  the variable was set by the user and kept; "GLOO_SOCKET_IFNAME=... , NCCL_SOCKET_IFNAME=..."
  when the two differ.

Checkpoints and resume (--checkpoint-dir; state.py, checkpoint.py): a run saves every
--checkpoint-every epochs and, on SIGTERM/SIGUSR1 (or SIGHUP, a closed terminal, unless started
under nohup), at the end of the current epoch (all ranks agree on the stop with one all-reduce
per epoch), then, once the checkpoint is complete on every rank, exits with 75
(checkpoint.PREEMPTED_EXIT; a failed save fails the run instead). A signal in the last epoch
finishes the run instead (exit 0; nothing is left to resume), with a warning that says so. The
same command resumes from the newest valid checkpoint of the same configuration (config_hash),
world size, prepared data (data_sha256: another --data-dir holding other data, or an edited
meta.json, starts fresh, with a warning) and code (the sha256 of the trainer's source,
measure.code_sha256, torch's version, RunState's fields: a rerun after a trainer change starts
fresh, with a warning naming both values, so the code and torch_version hold for every segment)
and hardware (every rank's device, in rank order: a job requeued on another GPU model starts
fresh, with a warning, so device_names, the window and mfu hold for every segment) and layout
(the ranks per host: a run whose gpus_per_node changed keeps its run id and checkpoint
directory, and starts fresh; the threads per rank: a changed hardware.cpus_per_rank starts
fresh) and container image (its digest: a rebuilt image reruns the runs,
which start fresh) and continues with the same data order, RNG states, optimizer, schedule and
scaler: bit for bit on CPU; on CUDA not (cudnn.benchmark autotunes again in the resumed process
and may choose other convolution algorithms, some non-deterministic), nor with --loader
dataloader and persistent worker processes (--num-workers > 0): their random state lives in the
workers and is not checkpointed, so such a run resumes correctly but not bit for bit (a warning
says so at start-up); and with --comm-hook powersgd, whose state (error feedback, warm-start
factors, step count) is not checkpointed either: each segment starts PowerSGD anew (a warning
says so too).
A resumed run's numbers are accounted over its segments:
- train_time_s: the sum over segments of the loop time up to each segment's last checkpoint
  (time lost after it is not counted: that work is redone and counted then; lost_time_s holds
  it); start-up, checkpoint loading and the restart itself are excluded. time_to_target_s
  likewise, of the training time (evaluation excluded).
- the throughput window: each segment excludes its own first `warmup_steps` steps (at least
  PowerSGD's uncompressed steps under --comm-hook powersgd, and the capture under --cuda-graphs
  step); images, window times and step times are summed over segments. epoch_time_s leaves
  out each segment's epochs holding warm-up steps, as the window does: a segment's first epoch
  is slow again (compilation), and the median over every epoch counted it.
- restarts / resumed_from_epochs: how often and after which epoch the run resumed.
- started_at: when the first segment started (UTC). hostnames: the hosts of every segment
  whose epochs the run holds (a requeued job may land on other nodes); nodes and
  ranks_per_node: the layout, the same in every segment (the checkpoint identity).
- checkpoint_stall_s: seconds rank 0's training waited for checkpoint saves, all segments, but
  for each stopped segment's final save: the checkpoint holding the value is that save.
- peak_mem_mb: the highest over segments (each rank's, as of each earlier segment's last
  checkpoint: what it reached after that was redone by the next segment). host_syncs_in_window:
  summed over the segments' windows, as is compile_graphs_in_window (compile_graphs: the last
  segment's process). gpu_util_mean: each rank's mean over the window samples of
  every segment (so a segment weighs by its samples, its time in the window), then over ranks.
  energy_j: summed over the segments' spans, and energy_j_per_img over their images, as the
  window's; energy_wall_j and energy_wall_s: the sum of each segment's wall span (a span cannot
  bridge a restart: the restart is in none), its error bound 2 x 0.1 s x segments /
  energy_wall_s. Null, with the reason, when the ranks shared GPUs differently in two segments
  (each GPU is counted by one rank, and a rank's counter sums its segments).
  The checkpoint carries each rank's peak, count, samples' sum and count and energy counter's
  sums (RunState).
- of the last segment only: gpu_samples_rank*.csv (the samples are
  written once, at the end of the loop: a stopped segment's are not kept), comm_exposed_frac
  (the probe runs once, after training), slurm_job_id, net_interface and nccl_version (the
  checkpoint identity holds the trainer's code, torch's version, every rank's device, the
  ranks per host and container_digest the same in every segment).
With --checkpoint-dir, saves are written by a background thread on rank 0 by default, during
the next epoch's window steps, where its CPU and I/O share the machine with training;
--no-checkpoint-async makes each save wait, outside every rank's window (the others wait for
rank 0's write between the epochs; checkpoint_stall_s holds rank 0's wait).
Once metrics.json is written, the checkpoints are deleted, so a rerun of a finished run (changed
code) trains from scratch instead of resuming a final checkpoint; a failed metrics.json write
(disk full, quota) keeps them, and the rerun resumes from the last one.
--checkpoint-dir must be one directory every rank sees (rank 0 writes a checkpoint, every rank
reads it): at start every rank looks for a file rank 0 wrote there, and a directory local to
rank 0's node (/tmp) is refused in one line before training. A run that fails while rank 0's
background write is in flight (another rank died) lets that write end before rank 0 exits (at
most checkpoint.FINISH_WRITE_S; not under FSDP, whose write needs every rank).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from scalestudy import files, log, vocab
from scalestudy.errors import (
    OutputDirError,
    Preempted,
    ScalestudyError,
    TrainConfigError,
    TrainingError,
)
from scalestudy.trainer import checkpoint as ckpt
from scalestudy.trainer import dist as sdist
from scalestudy.trainer import loaders, progress
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.config import add_arguments as _add_config_arguments
from scalestudy.trainer.loop import train

logger = log.get(__name__)


def add_arguments(parser) -> None:
    _add_config_arguments(parser)


# seconds a rank that leaves an expected error's line to rank 0 (or its node's local rank 0)
# waits before it exits: torchrun and srun --kill-on-bad-exit end every rank at the first failed
# exit, which could kill rank 0 before it prints; start-up skew between ranks is seconds at most.
# SCALESTUDY_REPORT_GRACE_S overrides it (a site with a slower start-up raises it; the tests,
# whose ranks no launcher kills, lower it).
REPORT_GRACE_S = 10.0
REPORT_GRACE_ENV = "SCALESTUDY_REPORT_GRACE_S"
# NCCL's refusal of two ranks on one GPU, in the DistBackendError torch raises at the first
# collective (DDP's parameter check): ncclInvalidUsage's "Last error:" line
NCCL_SHARED_GPU = "Duplicate GPU detected"


def report_grace_s() -> float:
    """REPORT_GRACE_S, or SCALESTUDY_REPORT_GRACE_S (seconds, >= 0) where it is set; a bad value
    is named in one line and the default kept (this runs on the way out of another error)."""
    raw = os.environ.get(REPORT_GRACE_ENV)
    if raw is None:
        return REPORT_GRACE_S
    try:
        value = float(raw)
        if value >= 0 and value != float("inf"):
            return value
    except ValueError:
        pass
    logger.warning(
        f"{REPORT_GRACE_ENV}={raw!r} is not a number of seconds >= 0: waiting the default "
        f"{REPORT_GRACE_S:g} s"
    )
    return REPORT_GRACE_S


def run(args) -> int:
    denv = place_logging()  # first: a bad flag below is then printed by rank 0 alone
    hold_gpu_slots(os.environ)
    try:
        return main(TrainConfig.from_args(args), denv)
    except ScalestudyError as exc:
        if not log.reports(exc.scope):  # silent here: let the reporting rank print first
            time.sleep(report_grace_s())
        raise  # cli.main prints it where log.reports(scope) says so, and exits 2


def hold_gpu_slots(env: Mapping[str, str]) -> None:
    """This rank holds its local launch's GPU slots (jobs/gpu_slots.py) until it exits: a
    shared lock on each file SCALESTUDY_GPU_SLOT_LOCKS names. torchrun's ranks inherit no
    descriptor of the launcher's: killed, it freed the GPUs its ranks still trained on."""
    for problem in files.hold_shared_locks(env.get(vocab.GPU_SLOT_LOCKS_ENV, "")):
        logger.warning(f"WARNING GPU slot not held by this rank: {problem}")


def place_logging() -> sdist.DistEnv:
    """This rank's place; every message carries [rank r/W host], progress only from rank 0."""
    denv = sdist.detect()
    log.setup(denv.rank, denv.world_size, sdist.hostname(), local_rank=denv.local_rank)
    return denv


def main(cfg: TrainConfig, denv: sdist.DistEnv | None = None) -> int:
    """One rank of a run: 0 when it completed, PREEMPTED_EXIT (75) after a stop signal's
    checkpoint, 1 when it cannot start; an expected error (a flag, the prepared data) raises
    for cli.main's one line (exit 2); a failed run raises (after naming the rank)."""
    denv = denv or place_logging()
    with Interrupt() as interrupt:
        return _main(cfg, denv, interrupt)


def _main(cfg: TrainConfig, denv: sdist.DistEnv, interrupt: Interrupt) -> int:
    preflight(cfg, denv)  # before the rendezvous: no rank waits for a process group
    stop = ckpt.StopFlag()
    if cfg.checkpoint_dir:
        stop.install()  # SIGTERM/USR1/HUP: checkpoint at the epoch's end, then exit 75
    try:
        device = pick_device(cfg, denv)
        backend = pick_backend(cfg, device)
        preload_dynamo()
        sdist.init_process_group(denv, backend, cfg.pg_timeout_s)
    except TrainingError as exc:
        # a flag this node's hardware cannot run (pick_device, pick_backend: fp16 or NCCL on a
        # CPU, --device cuda without CUDA): an expected error, its scope's line (each node's
        # local rank 0), exit 2; it was "cannot start" from every rank
        interrupt.check(exc)
        raise
    except Exception as exc:
        interrupt.check(exc)
        logger.error(f"cannot start: {exc}", exc_info=log.debug())
        return 1
    progress.start(denv, sdist.hostname(), cfg.pg_timeout_s)  # a hung rank is named
    try:
        train(cfg, denv, device, stop)
        return 0
    except Preempted as exc:
        if log.reports("run"):  # every rank stopped alike: rank 0 says it once
            # no checkpoint: from an earlier one of this run where there is one, else the start
            again = "resume" if exc.path is not None else "train again"
            logger.warning(f"{exc}: rerun the same command to {again}")
        return ckpt.PREEMPTED_EXIT
    except ScalestudyError as exc:
        interrupt.check(exc)
        raise  # expected (changed data, NaN loss): cli.main prints one line, its scope's ranks
    except Exception as exc:
        interrupt.check(exc)
        if NCCL_SHARED_GPU in str(exc):
            # one visible GPU for several local ranks is either one GPU per task (each rank's
            # cuda:0 its own: NCCL works) or one GPU they share, which only NCCL itself tells
            # apart: its refusal, a traceback on every rank, is one line naming the fix
            raise TrainingError(shared_gpu_message(cfg, exc)) from exc
        # name the rank: with 64 ranks, "which one failed and why" is the first question
        logger.error(f"training failed: {type(exc).__name__}: {exc}")  # first: never lost
        progress.explain_failure(exc)  # a failed collective: which rank stopped, and where
        raise
    finally:
        # a failed run: rank 0's checkpoint write still in flight ends first (bounded), after
        # the failure's lines above; a run that returned or stopped has none in flight
        ckpt.finish_writes()
        progress.stop()
        if dist.is_initialized():
            dist.destroy_process_group()


class Interrupt:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt, as Python's own handler does, and is
    remembered while the rank runs: Ctrl-C reaches every rank (torchrun passes it on to each
    worker, srun to each task), and a rank waiting in a collective when an interrupted peer
    exits saw the collective fail ("Connection closed by peer"), the KeyboardInterrupt raised
    inside torch's C++ wait lost: "training failed" with a hang diagnosis and a traceback, for
    a run the user stopped. `check(exc)`: such a failure is the interrupt (cli.main's one line
    from rank 0, status 130). A SIGINT that is ignored (a background job) stays ignored. A stop
    signal (SIGTERM, SIGHUP) without checkpointing alike: cli's handler raises its Stopped,
    remembered here, and the failure after it is that stop (128 + N)."""

    def __init__(self) -> None:
        self.received = False
        self.stopped: KeyboardInterrupt | None = None  # cli's Stopped, a stop signal's
        self._previous = None
        self._stops: dict[int, object] = {}

    def __enter__(self) -> Interrupt:
        ours = threading.current_thread() is threading.main_thread()
        if ours and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        # a stop signal without checkpointing (cli's handler raises its Stopped) alike: raised
        # inside torch's wait it was lost too, and a peer's failed collective was "training
        # failed" on the ranks the launch had sent SIGTERM
        for signum in vocab.STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if ours and callable(handler) and handler is not signal.default_int_handler:
                self._stops[signum] = handler
                signal.signal(signum, self._remember(handler))
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        for signum, handler in self._stops.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.received = True
        raise KeyboardInterrupt

    def _remember(self, handler):
        def handle(signum, frame) -> None:
            try:
                handler(signum, frame)
            except KeyboardInterrupt as stop:
                self.stopped = stop
                raise

        return handle

    def check(self, exc: BaseException) -> None:
        """KeyboardInterrupt (from `exc`) where SIGINT came first, the stop signal's Stopped
        where one came: `exc` is its consequence."""
        if self.received:
            raise KeyboardInterrupt from exc
        if self.stopped is not None:
            raise self.stopped from exc


def preload_dynamo() -> None:
    """Import torch._dynamo before the process group exists and before any run is on the stack.
    DDP's constructor (and torch.compile) import it on first use, and imported there it kept
    the run alive past train() twice over (torch 2.14.1, tests/test_trainer.py):
    - imported after init_process_group, something it sets up holds the default group: gloo's
      threads and the TCPStore outlived destroy_process_group, even a gc.collect();
    - torch.fx.wrap, run by that import, keeps its callers' frames in a reference cycle (its
      frame holds itself), and with them `loop.build`'s and `loop.train`'s locals: the run, its
      model, DDP.
    After the checks, so a refused flag does not wait for it (2 s on 2 cores)."""
    import torch._dynamo  # noqa: F401


def preflight(cfg: TrainConfig, denv: sdist.DistEnv) -> None:
    """The checks that need no process group, made by every rank before the rendezvous: the
    batch split over this world size and --diag-slow-rank's rank (TrainConfigError), the output
    and checkpoint directories (a run that cannot write them would lose its training at the
    first write), the prepared data's presence and sizes (--expect-train, --expect-test:
    PreparedDataError; its sha256 is checked when it is loaded) and a training image for
    every rank (TrainConfigError)."""
    cfg.batches(denv.world_size)
    slow = cfg.slow_rank()
    if slow is not None and slow[0] >= denv.world_size:
        raise TrainConfigError(
            f"--diag-slow-rank {cfg.diag_slow_rank}: rank {slow[0]} does not exist at world "
            f"size {denv.world_size} (ranks 0-{denv.world_size - 1})"
        )
    check_output_dirs(cfg)
    expect = (cfg.expect_train, cfg.expect_test)  # the study's sizes (the launch rules')
    meta = loaders.check_prepared(cfg.dataset, cfg.data_dir, verify=False, expect=expect)
    # every rank takes a sample of each step (loaders.epoch_batches): fewer images than ranks
    # was a ValueError traceback on every rank once the loaders were built
    available = meta["train_shape"][0]
    if min(cfg.limit_train or available, available) < denv.world_size:
        if cfg.limit_train and cfg.limit_train < available:
            raise TrainConfigError(
                f"--limit-train {cfg.limit_train} leaves fewer training images than the "
                f"{denv.world_size} ranks, each of which needs one: give --limit-train "
                f"{denv.world_size} or more (0 = all {available})"
            )
        raise TrainConfigError(
            f"{cfg.dataset} in --data-dir {cfg.data_dir} has {available} training images, fewer "
            f"than the {denv.world_size} ranks, each of which needs one: prepare more "
            "(prepare-data --num-train) or run fewer ranks"
        )


def check_output_dirs(cfg: TrainConfig) -> None:
    """--out (epochs.csv, metrics.json, tensorboard/) and --checkpoint-dir can be written; an
    OutputDirError (scope "node": each node's file system is its own) when not."""
    dirs = {"--out": cfg.out, "--checkpoint-dir": cfg.checkpoint_dir}
    for flag, directory in dirs.items():
        if directory and (why := files.output_dir_problem(directory)):
            raise OutputDirError(f"{flag} {directory} {why}; give a directory this job can write")
    for name in ("epochs.csv", "metrics.json"):
        if (Path(cfg.out) / name).is_dir():
            raise OutputDirError(
                f"--out {cfg.out}: {name} there is a directory; remove it or give another --out"
            )


def pick_device(cfg: TrainConfig, denv: sdist.DistEnv) -> torch.device:
    """The rank's device: --device cuda without CUDA fails (never a silent CPU run); one visible
    GPU is cuda:0 for every local rank (sites that bind one GPU per task, ranks sharing a GPU
    over gloo); with several visible GPUs the LOCAL rank picks one."""
    # what a node's hardware cannot do, every rank of the node finds: its local rank 0 says it
    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise TrainingError(no_cuda_message(), scope="node")
    if cfg.device == "cpu" or not cuda:
        if cfg.precision in vocab.CUDA_ONLY_PRECISIONS:
            raise TrainingError(
                f"--precision {cfg.precision} needs CUDA "
                f"({vocab.CUDA_ONLY_PRECISIONS[cfg.precision]}; none here): use fp32 or bf16 "
                "on CPU",
                scope="node",
            )
        if cfg.cuda_graphs in ("on", "step"):
            raise TrainingError(
                f"--cuda-graphs {cfg.cuda_graphs} needs CUDA (none here): use auto or off on CPU",
                scope="node",
            )
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = 0 if count == 1 else denv.local_rank  # from the LOCAL rank, never the global one
    if index >= count:
        raise TrainingError(
            f"local rank {denv.local_rank} needs GPU {index} but only {count} GPUs are visible "
            f"on {sdist.hostname()} (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): one rank per GPU, so check "
            "--ntasks-per-node against the GPUs per node (--gres/--gpus-per-node)"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def no_cuda_message() -> str:
    return (
        f"--device cuda but torch.cuda.is_available() is False on {sdist.hostname()} "
        f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}, CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): the job step has no GPU (--gres/--gpus), "
        "the container runs without --nv, or the driver is older than the wheel's CUDA; "
        "hardware.device: cpu in the study config runs on CPUs instead"
    )


def pick_backend(cfg: TrainConfig, device: torch.device) -> str:
    """--backend auto: NCCL on CUDA, gloo on CPU. gloo on CUDA stages tensors through the host
    and lets several ranks share one GPU (NCCL refuses that: "Duplicate GPU detected", at the
    first collective; main makes it shared_gpu_message's line)."""
    if cfg.backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if cfg.backend == "nccl" and device.type != "cuda":
        raise TrainingError(
            f"--backend nccl needs CUDA, but this rank runs on {device.type} "
            f"(--device {cfg.device}, torch.cuda.is_available() is {torch.cuda.is_available()}): "
            "use --backend gloo or auto",
            scope="node",
        )
    return cfg.backend


def shared_gpu_message(cfg: TrainConfig, exc: BaseException) -> str:
    """NCCL's refusal of ranks sharing a GPU (NCCL_SHARED_GPU in `exc`), as one line: what
    NCCL said, and the two ways out."""
    said = next(line for line in str(exc).splitlines() if NCCL_SHARED_GPU in line).strip()
    backend = "--backend auto (nccl on CUDA)" if cfg.backend == "auto" else "--backend nccl"
    return (
        f"{backend}: NCCL refuses several ranks on one GPU ({said}): run them over "
        "--backend gloo, or give each rank a GPU of its own (as many visible GPUs as ranks "
        "per node, or one bound to each task)"
    )
