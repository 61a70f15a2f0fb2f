"""The training loop: build the run, resume, train the epochs, evaluate, write the results.

`train_epochs` is the whole epoch body, batch -> forward -> backward -> step, with one-line hooks
for what is not training: the measurement (measure.Meter), the profiler window
(measure.Profiler) and checkpointing (state.Checkpointing). train.py defines the numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scalestudy import files, log, vocab
from scalestudy.errors import TrainConfigError, TrainingError
from scalestudy.trainer import checkpoint as ckpt
from scalestudy.trainer import compiling, loaders, progress
from scalestudy.trainer import dist as sdist
from scalestudy.trainer.config import (
    LR_REFERENCE_BATCH,
    POWERSGD_START_ITER,
    STEP_GRAPH_WARM_STEPS,
    STEPS_BEFORE_WINDOW,
    TrainConfig,
)
from scalestudy.trainer.measure import Meter, Profiler, comm_probe, efficiency, environment
from scalestudy.trainer.models import build_model, training_flops_per_image
from scalestudy.trainer.numerics import Numerics
from scalestudy.trainer.numerics import configure as configure_numerics
from scalestudy.trainer.numerics import in_effect as numerics_in_effect
from scalestudy.trainer.parallel import (
    allreduce_gradients,
    ddp_static_graph,
    grad_sync,
    param_checksum,
    sync_buffers,
    wrap_model,
)
from scalestudy.trainer.recipe import Recipe, build_recipe, lr_factor, warmup_steps
from scalestudy.trainer.scalars import Scalars
from scalestudy.trainer.state import Checkpointing, RunState, Trainables, rng_generators
from scalestudy.trainer.step_graph import StepGraph
from scalestudy.vocab import EPOCH_COLUMNS

logger = log.get(__name__)

# epochs.csv, one row per epoch (vocab.EPOCH_COLUMNS). train_loss is the training objective,
# label smoothing included (its floor at train.label_smoothing 0.1 over 10 classes: 0.50 nats);
# val_loss is the plain cross-entropy of the test set, so the two are not comparable. lr: the
# learning rate of the epoch's last optimizer step.


def train(
    cfg: TrainConfig, denv: sdist.DistEnv, device: torch.device, stop: ckpt.StopFlag | None = None
) -> dict:
    """Train one configuration and measure it; returns metrics.json's content (rank 0 writes
    it). Raises Preempted after a stop signal's checkpoint."""
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run = build(cfg, denv, device)
    meter = Meter(cfg, device, denv.rank, run.graphs)
    profiler = Profiler(cfg, device, denv.rank)
    # fault tolerance: resume from the newest valid checkpoint (a fresh start without one)
    checkpointing = Checkpointing(
        cfg, denv.rank, denv.world_size, device, stop, run.trainables(), run.data_sha256
    )
    state = checkpointing.resume()
    check_profile_resume(cfg, state.step)  # the same resumed step on every rank
    checkpointing.count_lost(state)  # the training earlier attempts lost (redone now)
    # a resumed run started when its first segment did (the checkpoint has it)
    started_at = state.started_at = state.started_at or started_at
    left = run.steps_per_epoch * cfg.epochs - state.step
    if meter.window_out_of_reach(state, left):
        # every segment warms up anew (a resume recompiles and recaptures): one that cannot
        # reach the window, after earlier ones that did not either, would measure nothing
        raise TrainingError(  # the same resumed step on every rank
            no_window_message(cfg, run.graphs, state.step, left, meter.warmup_steps), scope="run"
        )
    if denv.rank == 0:
        # this run's outputs from the start: an earlier run's metrics.json (the mark of a
        # finished run) and epochs.csv in the same --out (by hand: Snakemake deletes a job's
        # outputs) stayed beside this run's until it finished, or its first epoch did
        (Path(cfg.out) / "metrics.json").unlink(missing_ok=True)
        write_epochs(cfg, state.history)  # the epochs so far: none, the header, on a fresh start
        run.scalars.start(state.history)  # and TensorBoard's (scalars.py)
    meter.start(state)
    try:
        train_epochs(run, state, meter, profiler, checkpointing)
    except BaseException:  # Preempted after the stop's checkpoint, an error, Ctrl-C
        profiler.abandon()
        raise
    train_time = meter.end_loop(state)
    profiler.close()
    return finish(run, denv, state, meter, checkpointing, train_time, started_at)


def no_window_message(cfg: TrainConfig, graphs: str, step: int, left: int, warmup: int) -> str:
    """A segment whose `left` optimizer steps (from `step`) cannot reach the window after its
    `warmup` steps (Meter.warmup_steps): lowering --warmup-steps helps only when the flag set
    that warm-up, not PowerSGD's uncompressed steps or the captured step's eager ones."""
    head = (
        f"{left} optimizer steps left (from step {step}) leave no steady-state window after "
        f"this segment's warm-up of {warmup} steps"
    )
    tail = "and no earlier segment reached it"
    # the mode's own warm-up, which no --warmup-steps lowers: the flag at it (12 under the
    # whole-step graph) was told to lower it, and the same warm-up followed
    floor = max(
        STEPS_BEFORE_WINDOW if graphs == "step" else 0,
        POWERSGD_START_ITER if cfg.comm_hook == "powersgd" else 0,
    )
    if cfg.warmup_steps > floor:  # the flag's own warm-up
        return f"{head}, {tail}: lower --warmup-steps, raise --epochs or use more data"
    if graphs == "step" and warmup == STEPS_BEFORE_WINDOW:
        flag = f"--cuda-graphs {cfg.cuda_graphs}"
        if cfg.cuda_graphs != "step":
            flag += " (here the whole step as one CUDA graph)"
        cause = (
            f"{flag} runs {STEP_GRAPH_WARM_STEPS} eager steps and the capture before the "
            "window opens"
        )
    else:
        cause = f"--comm-hook powersgd's first {warmup} steps are uncompressed"
    return (
        f"{head} ({cause}; --warmup-steps {cfg.warmup_steps} is not the cause, and lowering it "
        f"cannot help), {tail}: raise --epochs or use more data"
    )


def train_epochs(
    run: Run, state: RunState, meter: Meter, profiler: Profiler, checkpointing: Checkpointing
) -> None:
    """The epochs from state.epoch on; each ends with evaluation and a checkpoint decision."""
    cfg, model, device, scheduler = run.cfg, run.model, run.device, run.recipe.scheduler
    for epoch in range(state.epoch, cfg.epochs):
        run.set_epoch(epoch, meter.window_micro_batch(state.step, cfg.accum_steps))
        model.train()
        # the loader's iterator starts inside the first step's data phase: a DataLoader's
        # workers start there (each epoch without --persistent-workers), timed as input time
        batches = None
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        correct = torch.zeros((), device=device, dtype=torch.int64)
        seen = 0
        meter.epoch_start()
        done = 0  # micro-batches of this epoch
        while done < run.micro_steps:
            meter.before_step(state.step, seen)  # opens the throughput window after warm-up
            profiler.before_step(state.step)
            group = min(cfg.accum_steps, run.micro_steps - done)  # a short last group ends an epoch
            meter.step_start()
            run.begin_step()  # CUDA graphs (--cuda-graphs, compiling.py): a new iteration
            for j in range(group):
                progress.at_micro(j, group)  # the micro-batch (hang diagnosis)
                with meter.phase("data"):
                    if batches is None:
                        batches = iter(run.train_loader)
                    x, y = run.place(*next(batches))
                    meter.diag_delay("data")  # --diag-data-delay-ms (off by default)
                # train_step, or its replay as one CUDA graph (--cuda-graphs step)
                loss, right = run.step(meter, x, y, group=group, last=j == group - 1)
                loss_sum += loss.double() * y.numel()
                correct += right
                seen += y.numel()
            lr = scheduler.get_last_lr()[0]  # this step's (the epoch's row: its last step's)
            scheduler.step()  # on the host, outside any graph: the graph reads the new LR
            meter.step_end()
            profiler.after_step(state.step)
            done += group
            state.step += 1
        epoch_time = meter.epoch_end(state, seen)
        profiler.export()  # torch.profiler's files, once the window's time is taken
        sums = (loss_sum, correct, seen)
        end_of_epoch(run, state, epoch, sums, epoch_time, lr, meter.epoch_in_window)
        state.epoch = epoch + 1
        checkpointing.mark_alive(state, meter)  # what a kill after here loses (count_lost)
        checkpointing.after_epoch(state, meter)  # every N epochs, and on SIGTERM/USR1/HUP
        meter.join_ranks()  # rank 0's writes above stay out of every rank's next window


def train_step(
    run: Run, meter, x: torch.Tensor, y: torch.Tensor, group: int = 1, last: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch: forward and backward; the group's last one also synchronises the
    gradients (DDP does it in backward) and steps the optimizer. Returns the loss and the count
    of correct predictions, on the device (no host sync). Under --cuda-graphs step this is the
    function captured (meter then times nothing: step_graph.NullMeter)."""
    cfg, model = run.cfg, run.model
    optimizer, scaler = run.recipe.optimizer, run.recipe.scaler
    # accumulate locally; the last micro-batch of the group synchronises gradients
    with contextlib.nullcontext() if last else run.no_sync():
        with meter.phase("forward"), run.autocast():
            logits = model(x)
            loss = F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing)
            meter.diag_delay("forward")  # --diag-slow-rank (off by default)
        with meter.phase("backward"):
            scaler.scale(loss / group).backward()
    if last:
        if cfg.strategy == "allreduce":
            with meter.phase("communication"):
                allreduce_gradients(model, run.world_size)
        with meter.phase("optimizer"):
            if cfg.clip_grad:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            # a captured step keeps its gradients' memory (the graph writes there): zeroed
            optimizer.zero_grad(set_to_none=run.graphs != "step")
    return loss.detach(), (logits.detach().argmax(1) == y).sum()


def end_of_epoch(
    run: Run,
    state: RunState,
    epoch: int,
    sums: tuple,
    epoch_time: float,
    lr: float,
    in_window: bool,
) -> None:
    """Reduce the epoch's sums over ranks, evaluate on the whole test set, record the epoch (lr:
    its last optimizer step's learning rate; in_window: every step of it was in the window)."""
    cfg, device = run.cfg, run.device
    progress.at("evaluation")  # the epoch's reduction and the evaluation (hang diagnosis)
    loss_sum, correct, seen = sums
    stats = torch.stack(
        [loss_sum, correct.double(), torch.tensor(float(seen), device=device, dtype=torch.float64)]
    )
    dist.all_reduce(stats)
    train_loss, train_acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
    state.epoch_images = round(stats[2].item())
    if not math.isfinite(train_loss):
        # all-reduced: the same on every rank, so rank 0 alone says it
        fp16 = " or use bf16/fp32 instead of fp16" if cfg.precision == "fp16" else ""
        raise TrainingError(
            f"non-finite training loss ({train_loss}) in epoch {epoch + 1}: "
            f"lower --lr (peak {run.recipe.peak_lr:g}){fp16}",
            scope="run",
        )
    val_loss, val_acc = evaluate(run)
    row = {
        "epoch": epoch + 1,
        "train_loss": train_loss,
        "train_acc": train_acc,
        "val_loss": val_loss,
        "val_acc": val_acc,
        "epoch_time_s": epoch_time,
        "throughput_img_s": state.epoch_images / epoch_time,
        "lr": lr,  # its last optimizer step's (the optimizer holds the next step's by now)
        # no warm-up step in it (not an epochs.csv column): epoch_time_s's epochs
        "in_window": in_window,
    }
    state.history.append(row)
    if run.rank == 0:
        write_epochs(cfg, state.history)
        run.scalars.epoch(state.history)  # TensorBoard, flushed each epoch (scalars.py)
        logger.info(
            f"epoch {epoch + 1:>3}/{cfg.epochs} | train loss {train_loss:.4f} "
            f"acc {100 * train_acc:5.2f}% | val loss {val_loss:.4f} acc {100 * val_acc:5.2f}% "
            f"| {epoch_time:7.2f} s | {row['throughput_img_s']:>10,.0f} img/s "
            f"| lr {row['lr']:.4g}"
        )


@torch.no_grad()
def evaluate(run: Run) -> tuple[float, float]:
    """Loss and accuracy over the whole test set; each sample counted once across ranks."""
    # under --compile the eager module evaluates (it shares the weights): eval mode and the
    # evaluation batch shapes would otherwise compile new graphs, logged as recompilations
    model, device = run.eval_model, run.device
    sync_buffers(model)  # rank 0's BN statistics on every rank (no strategy syncs them per step)
    model.eval()
    sums = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, count
    for x, y in run.eval_loader:
        x, y = run.place(x, y)
        with run.autocast():
            logits = model(x)
        sums[0] += F.cross_entropy(logits.float(), y, reduction="sum").double()
        sums[1] += (logits.argmax(1) == y).sum()
        sums[2] += y.numel()
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def finish(
    run: Run,
    denv: sdist.DistEnv,
    state: RunState,
    meter: Meter,
    checkpointing: Checkpointing,
    train_time: float,
    started_at: str,
) -> dict:
    """After training: the communication probe, the check that every rank holds the same
    weights, the metrics over ranks; rank 0 writes metrics.json, then the checkpoints go (a
    failed metrics.json write keeps them: the rerun resumes from the last one)."""
    cfg, world_size = run.cfg, run.world_size
    if (stop := checkpointing.stop) is not None and stop.raised:
        # in the last epoch: nothing is left to checkpoint, so the run finishes (it went on
        # without a word, as if no signal had come)
        logger.warning(
            f"WARNING: received {stop.signame} in the last epoch: finishing the run instead of "
            "stopping (nothing is left to resume)"
        )
    comm_exposed = probe_sync_ms = probe_nosync_ms = None
    if cfg.comm_probe_steps and world_size == 1:
        # one rank synchronises nothing: the probe would time two identical arms and report
        # their difference, noise (30% seen on a CPU), as exposed communication
        comm_exposed = 0.0
    elif cfg.comm_probe_steps:
        progress.at("comm probe")
        comm_exposed, probe_sync_ms, probe_nosync_ms = comm_probe(
            run.model,
            run.no_sync,
            run.train_loader,
            cfg,
            run.device,
            run.place,
            run.autocast,
            world_size,
            run.begin_step,
        )

    # every rank must end with the same weights; a silent divergence would void every number
    progress.at("final checksum")
    checksums: list = [None] * world_size
    dist.all_gather_object(checksums, param_checksum(run.model))
    if len(set(checksums)) != 1:
        raise TrainingError(  # all-gathered: every rank holds the same list
            f"ranks hold different parameters after training: {checksums}", scope="run"
        )

    progress.at("metrics")
    measured = meter.reduce(state, world_size)
    metrics = {
        **dataclasses.asdict(cfg),
        "backend": dist.get_backend(),  # in effect: --backend auto resolved
        **numerics_in_effect(run.numerics),
        "world_size": world_size,
        "launcher": denv.launcher,
        "local_batch": run.local_batch,
        "global_batch": run.global_batch,
        "peak_lr": run.recipe.peak_lr,
        "lr_max_reached": run.lr_max_reached,
        "ddp_static_graph": ddp_static_graph(cfg),
        **grad_sync(run.model, cfg),  # param_count, grad_sync_bytes: the scaling model's P
        "steps_per_epoch": run.steps_per_epoch,
        # counted, not steps x global batch: a short last accumulation group trains fewer
        "train_images_per_epoch": state.epoch_images,
        # evaluated after every epoch: the whole (limited) test set; the plan's N_test
        "test_images_per_epoch": run.eval_loader.n,
        # each rank's intra-op threads (launch: hardware.cpus_per_rank); they set a CPU rank's
        # speed, and the plan calibrates a run only from runs of the same count
        "threads_per_rank": torch.get_num_threads(),
        **measured,
        # the FLOP rate and MFU against the device's published peak (hardware.py)
        **efficiency(
            measured["throughput_img_s"],
            run.flops_per_img,
            run.device.type,
            measured["device_names"],
            cfg.precision,
            measured["mfu_gpus"],
        ),
        "comm_exposed_frac": comm_exposed,
        "comm_probe_sync_ms_p50": probe_sync_ms,
        "comm_probe_nosync_ms_p50": probe_nosync_ms,
        "final_val_acc": state.history[-1]["val_acc"],
        "best_val_acc": max(r["val_acc"] for r in state.history),
        # off the whole history, epochs before a resume included: --target-acc is no part of
        # a checkpoint's identity, so a resume may bring the first one or another
        "time_to_target_s": vocab.time_to_target(state.history, cfg.target_acc),
        "train_time_s": train_time,
        # null without --checkpoint-dir: a rerun starts over, its lost attempt unknown
        "lost_time_s": state.lost_time_s if cfg.checkpoint_dir else None,
        **environment(run.device),
        "slurm_job_id": denv.slurm_job_id,
        "config_hash": cfg.config_hash(),
        "data_sha256": run.data_sha256,  # the data as this run read it (loaders.data_sha256)
        "param_checksums": checksums,
        "started_at": started_at,
        "restarts": len(state.resumed_from_epochs),
        "resumed_from_epochs": state.resumed_from_epochs,
        "checkpoint_stall_s": checkpointing.stall_s,
        "net_interface": sdist.net_interface_over_ranks(world_size),
    }
    if run.rank == 0:
        # metrics.json last of the outputs: its presence means the run completed. Then the
        # checkpoints go (a finished run never resumes); a failed write keeps them, so the
        # rerun resumes from the last one instead of training from the start.
        files.write_json(Path(cfg.out) / "metrics.json", metrics)
    checkpointing.finish()
    if run.rank == 0:
        logger.info(
            f"done: {metrics['throughput_img_s']:,.0f} img/s over {world_size} "
            f"{vocab.plural('ranks', world_size)} "
            f"({metrics['throughput_img_s_per_rank']:,.0f} per rank), best val acc "
            f"{100 * metrics['best_val_acc']:.2f}%, {train_time:.1f} s -> {cfg.out}"
        )
    return metrics


def write_epochs(cfg: TrainConfig, history: list[dict]) -> None:
    """--out/epochs.csv: one row per epoch so far (EPOCH_COLUMNS, 6 significant digits)."""
    lines = [",".join(EPOCH_COLUMNS)]
    for r in history:
        lines.append(",".join(str(r[c]) if c == "epoch" else f"{r[c]:.6g}" for c in EPOCH_COLUMNS))
    files.write_text(Path(cfg.out) / "epochs.csv", "\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# building the run


@dataclass
class Run:
    """What one training run is made of (built once by `build`): data, model and recipe."""

    cfg: TrainConfig
    device: torch.device
    rank: int
    world_size: int
    local_batch: int
    global_batch: int
    numerics: Numerics  # autocast dtype, memory format (numerics.py)
    train_loader: Any  # loaders.DeviceLoader or a DataLoader
    sampler: Any  # the DataLoader's DistributedSampler; None with the DeviceLoader
    eval_loader: loaders.DeviceLoader
    data_sha256: str  # loaders.data_sha256: data.pt + what of meta.json the run reads; checkpoint
    # identity and metrics.json
    micro_steps: int  # micro-batches per epoch
    steps_per_epoch: int  # optimizer steps per epoch
    lr_max_reached: float  # the schedule's highest LR: peak_lr unless the warm-up outlasts the run
    model: torch.nn.Module  # wrapped for the strategy (and compiled under --compile)
    eval_model: torch.nn.Module  # the same weights, never compiled
    graphs: str  # CUDA graphs: "step", "compiled" or "off" (compiling.graphs_mode)
    step: Callable  # step(meter, x, y, group, last): train_step, or its CUDA graph (step_graph.py)
    flops_per_img: int  # FLOPs of one training image, forward + backward (models.py)
    no_sync: Callable  # no_sync(): a context without gradient synchronisation
    recipe: Recipe
    scalars: Scalars  # TensorBoard scalars per epoch (rank 0)

    def set_epoch(self, epoch: int, window_at: int | None = None) -> None:
        """`window_at`: the epoch's micro-batch at which the throughput window opens, where the
        device loader starts preparing a group of batches (loaders.DeviceLoader.set_epoch)."""
        if self.sampler is None:
            self.train_loader.set_epoch(epoch, window_at)
        else:
            self.sampler.set_epoch(epoch)

    def place(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch on the device in the model's input dtype and memory format. The device
        loader emits its batches so (loaders.normalize): then nothing is copied; the DataLoader's
        float32 NCHW batches are converted in one copy."""
        nhwc = self.numerics.channels_last_inputs
        layout = torch.channels_last if nhwc else torch.contiguous_format
        dtype = self.numerics.input_dtype
        x = x.to(self.device, dtype=dtype, memory_format=layout, non_blocking=True)
        return x, y.to(self.device, non_blocking=True)

    def begin_step(self) -> None:
        """A training step begins: CUDA graph trees may reuse the previous step's memory."""
        if self.graphs == "compiled":
            compiling.mark_step()

    def autocast(self) -> torch.autocast:
        dtype = self.numerics.amp_dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def trainables(self) -> Trainables:
        r = self.recipe
        return Trainables(
            self.model, r.optimizer, r.scheduler, r.scaler, rng_generators(self.train_loader)
        )


def build(cfg: TrainConfig, denv: sdist.DistEnv, device: torch.device) -> Run:
    """Data (the whole uint8 split on the device; the trainer never downloads), the model
    (identical initialisation on every rank, wrapped for the strategy) and the recipe."""
    rank, world_size = denv.rank, denv.world_size
    local_batch, global_batch = cfg.batches(world_size)
    numerics = configure_numerics(cfg, device)  # TF32 only for tf32, autocast, NHWC, cuDNN

    progress.at("data load")  # this rank's own work up to wrap_model's collective
    prepared = loaders.load_prepared(cfg.dataset, cfg.data_dir)
    progress.at("data check")  # a collective: a rank still reading its data is behind
    check_same_data(cfg, loaders.data_sha256(prepared.meta), world_size)
    progress.at("data load")  # the loaders and the model: this rank's own work again
    loaded = build_loaders(cfg, prepared, numerics, device, rank, world_size, local_batch)
    train_loader, sampler, eval_loader, micro_steps = loaded  # --limit-train/--limit-test
    n_train = len(_limit(prepared.train_x, prepared.train_y, cfg.limit_train)[1])
    if global_batch > n_train:  # the study's config check refuses it too (check_batch)
        raise TrainingError(
            f"the global batch {world_size} x {local_batch} x --accum-steps {cfg.accum_steps} = "
            f"{global_batch} is larger than the {n_train} training images: no optimizer step "
            f"would hold it, and the learning rate is scaled for it (--lr x global batch / "
            f"{LR_REFERENCE_BATCH}): lower the batch or use more data",
            scope="run",  # alike on every rank
        )
    steps_per_epoch = math.ceil(micro_steps / cfg.accum_steps)
    total_steps = steps_per_epoch * cfg.epochs
    # a longer warm-up than the flag's (PowerSGD's uncompressed steps) is train()'s to refuse,
    # with no_window_message's cause: "lower --warmup-steps" cannot help there
    if total_steps <= cfg.warmup_steps == cfg.window_warmup_steps():
        raise TrainingError(
            f"{total_steps} optimizer steps ({cfg.epochs} {vocab.plural('epochs', cfg.epochs)} x "
            f"{steps_per_epoch}) leave no "
            f"steady-state window after --warmup-steps {cfg.warmup_steps}: "
            "lower --warmup-steps, raise --epochs or use more data",
            scope="run",  # the same step count on every rank
        )
    check_profile_window(cfg, steps_per_epoch, total_steps)

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = build_model(
        cfg.model,
        num_classes=prepared.meta["num_classes"],
        width=cfg.width,
        in_channels=prepared.train_x.shape[1],
    ).to(device)
    if numerics.channels_last_weights:
        model = model.to(memory_format=torch.channels_last)
    loaders.seed_rank_draws(cfg.seed, rank)  # from here on, each rank's own random draws
    graphs = compiling.graphs_mode(cfg, device, total_steps)  # --cuda-graphs auto: compiling.py
    side = torch.cuda.Stream(device) if graphs == "step" else None
    # a step captured with DDP's all-reduces needs DDP built on the capture's side stream. A
    # new stream does not wait for the default one (torch's CUDA semantics: the user orders
    # them), so its broadcast of rank 0's weights waits for the copies and the channels_last
    # conversion queued above, and the default stream for the broadcast
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    progress.at("model broadcast")  # DDP's broadcast of rank 0's weights (hang diagnosis)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        model, no_sync = wrap_model(model, cfg, device)
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)
    progress.at("model set-up")  # this rank's own work again
    eval_model = model
    if compiling.compile_on(cfg, device):  # --compile auto: on CUDA (compiling.py)
        model = compiling.compile_model(model, cfg, device, graphs == "compiled")
    # SGD Nesterov, label smoothing, linear LR scaling with warm-up (recipe.py, config.py)
    recipe = build_recipe(model, cfg, device, global_batch, steps_per_epoch, total_steps)
    lr_max = lr_max_reached(cfg, recipe.peak_lr, steps_per_epoch, total_steps, rank)
    run = Run(
        cfg=cfg,
        device=device,
        rank=rank,
        world_size=world_size,
        local_batch=local_batch,
        global_batch=global_batch,
        numerics=numerics,
        train_loader=train_loader,
        sampler=sampler,
        eval_loader=eval_loader,
        data_sha256=loaders.data_sha256(prepared.meta),
        micro_steps=micro_steps,
        steps_per_epoch=steps_per_epoch,
        lr_max_reached=lr_max,
        model=model,
        eval_model=eval_model,
        graphs=graphs,
        step=None,  # below: it needs the run
        flops_per_img=training_flops_per_image(
            cfg.model,
            num_classes=prepared.meta["num_classes"],
            width=cfg.width,
            image_shape=tuple(prepared.train_x.shape[1:]),
        ),
        no_sync=no_sync,
        recipe=recipe,
        scalars=Scalars(cfg, rank),
    )
    # over a proxy: the run holding a step that holds the run would be a reference cycle, and
    # the model, DDP, gloo's process group (its threads) and the device's data would then live
    # on after train() until a garbage collection, or until the interpreter's teardown at exit
    run.step = functools.partial(train_step, weakref.proxy(run))
    if graphs == "step":  # the whole step as one CUDA graph (step_graph.py)
        run.step = StepGraph(run.step, recipe.optimizer, device, side=side)
    return run


def check_profile_window(cfg: TrainConfig, steps_per_epoch: int, total_steps: int) -> None:
    """--profile-steps A:B must lie inside the run's optimizer steps 0..total_steps-1: past the
    last one the profiler never opened (exit 0, no profile, metrics.json naming the window), and
    a window across it profiled fewer steps than asked, both silently."""
    window = cfg.profile_window()
    if window is None or window[1] <= total_steps:
        return
    raise TrainConfigError(
        f"--profile-steps {cfg.profile_steps} profiles optimizer steps {window[0]} to "
        f"{window[1] - 1}, but this run takes {total_steps} ({cfg.epochs} "
        f"{vocab.plural('epochs', cfg.epochs)} x {steps_per_epoch}: steps 0 to "
        f"{total_steps - 1}): give A:B with B <= {total_steps}, "
        "or raise --epochs or use more data"
    )


def check_profile_resume(cfg: TrainConfig, step: int) -> None:
    """A run resumed at optimizer step `step` cannot profile a --profile-steps window whose
    first step an earlier segment trained: the profiler opens at step A only, so the resumed
    segment profiled nothing (and a window the earlier segment left open at its stop was never
    written) while the run ended with exit 0 and metrics.json naming the window."""
    window = cfg.profile_window()
    if window is None or step <= window[0]:
        return
    raise TrainingError(
        f"--profile-steps {cfg.profile_steps} profiles optimizer steps {window[0]} to "
        f"{window[1] - 1}, but this run resumes at step {step} from a checkpoint in "
        f"--checkpoint-dir {cfg.checkpoint_dir}: the profiler opens at step {window[0]}, "
        "which an earlier segment trained, so this one would profile nothing; remove that "
        "directory's checkpoints to profile from the start",
        scope="run",
    )


def lr_max_reached(
    cfg: TrainConfig, peak_lr: float, steps_per_epoch: int, total_steps: int, rank: int
) -> float:
    """The highest learning rate the schedule reaches in the run's steps. The warm-up is
    linear over round(warmup_epochs x steps_per_epoch) steps (recipe.lr_factor): one as long
    as the run, or longer, never lets the LR decay, and one longer never reaches peak_lr,
    which metrics.json reports. Not refused (a 1-epoch run with the default warm-up of 1 epoch
    is the tests' and the tiny study's): rank 0 warns at start, metrics.json records this."""
    warmup = warmup_steps(cfg, steps_per_epoch)
    if warmup < total_steps:
        return peak_lr
    # still warming up at the last step: its LR is the highest
    reached = peak_lr * lr_factor(total_steps - 1, total_steps, warmup, cfg.schedule)
    if rank == 0:
        never = (
            f"never reaches its peak peak_lr {peak_lr:.4g} (at most {reached:.4g})"
            if warmup > total_steps
            else f"reaches its peak peak_lr {peak_lr:.4g} only at the last step"
        )
        logger.warning(
            f"WARNING: --warmup-epochs {cfg.warmup_epochs:g} warms the learning rate up for "
            f"{warmup} steps, and --epochs {cfg.epochs} trains {total_steps}: it {never} and "
            "does not decay (metrics.json lr_max_reached); give fewer warm-up epochs than "
            "--epochs for the whole schedule"
        )
    return reached


def check_same_data(cfg: TrainConfig, digest: str, world_size: int) -> None:
    """Every rank loaded the same prepared data (loaders.data_sha256), else one TrainingError
    (rank 0's line) naming the first rank whose data differs: each rank reads --data-dir
    itself, and a node-local copy can differ. Rank 1 on another seed's set trained on other
    images unseen (metrics.json records rank 0's digest), and on a set of another size the
    ranks' step counts differed and gloo aborted mid-collective. A collective beyond 1 rank."""
    if world_size == 1:
        return
    every: list = [None] * world_size
    dist.all_gather_object(every, (digest, sdist.hostname(), os.path.realpath(cfg.data_dir)))
    odd = next((r for r, (d, _, _) in enumerate(every) if d != every[0][0]), None)
    if odd is not None:
        (d0, host0, dir0), (d1, host1, dir1) = every[0], every[odd]
        raise TrainingError(
            f"the ranks loaded different prepared data: rank 0 on {host0} {dir0} (data_sha256 "
            f"{d0[:12]}...), rank {odd} on {host1} {dir1} ({d1[:12]}...): prepare the data once "
            "where every node reads it (`scalestudy prepare-data`), or give every node the same "
            "copy",
            scope="run",
        )


def build_loaders(
    cfg: TrainConfig,
    prepared: loaders.Prepared,
    numerics: Numerics,
    device: torch.device,
    rank: int,
    world_size: int,
    local_batch: int,
) -> tuple[Any, Any, loaders.DeviceLoader, int]:
    """This rank's training loader and its DistributedSampler (a DataLoader's; None with the
    device loader), the evaluation loader (the device loader) and the training micro-batches
    per epoch, over the first --limit-train and --limit-test images."""
    train_x, train_y = _limit(prepared.train_x, prepared.train_y, cfg.limit_train)
    test_x, test_y = _limit(prepared.test_x, prepared.test_y, cfg.limit_test)
    mean, std = prepared.meta["mean"], prepared.meta["std"]
    # what both input pipelines and the evaluation loader share: this rank's place and the data
    placement = dict(
        local_batch=local_batch, world_size=world_size, rank=rank, seed=cfg.seed, mean=mean, std=std
    )
    flip = vocab.DATASETS[cfg.dataset].flip  # not MNIST's digits
    # the device loader's batches leave it as the model consumes them: in autocast's dtype, NHWC
    # on CUDA (the DataLoader's are converted by Run.place)
    layout = dict(dtype=numerics.input_dtype, channels_last=numerics.channels_last_inputs)
    if cfg.loader == "device":
        train_loader = loaders.DeviceLoader(
            train_x, train_y, train=True, device=device, flip=flip, **placement, **layout
        )
        sampler, micro_steps = None, train_loader.steps_per_epoch
    else:
        train_loader, sampler = loaders.make_dataloader(
            train_x,
            train_y,
            train=True,
            num_workers=cfg.num_workers,
            pin_memory=cfg.pin_memory and device.type == "cuda",
            persistent_workers=cfg.persistent_workers,
            prefetch_factor=cfg.prefetch_factor,
            flip=flip,
            **placement,
        )
        micro_steps = len(train_loader)
    eval_loader = loaders.DeviceLoader(
        test_x, test_y, train=False, device=device, **placement, **layout
    )
    return train_loader, sampler, eval_loader, micro_steps


def _limit(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    if n and n < len(x):
        return x[:n], y[:n]
    return x, y
