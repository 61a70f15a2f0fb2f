"""`scalestudy train`: train one configuration and measure it.

Launch (the same code on a laptop and on H100 nodes; see dist.py for how a rank finds its place):
    scalestudy train --dataset synthetic --width 8 --epochs 2                 # 1 process
    torchrun --nproc-per-node=4 -m scalestudy train --precision bf16 ...       # 1 node, 4 ranks
    srun --nodes=2 --ntasks-per-node=4 python -m scalestudy train ...         # Slurm, 8 ranks
Backend: NCCL on CUDA, gloo on CPU. Rank 0 writes --out/{metrics.json,epochs.csv} atomically.

How the numbers are measured (the analysis relies on these definitions):
- step: one optimizer step (accum_steps micro-batches on every rank).
- throughput_img_s: images processed by all ranks in the steady-state window divided by the
  window's wall time. The window starts after `warmup_steps` optimizer steps (compilation, cuDNN
  autotuning, allocator growth) and covers every later training step; evaluation is excluded
  (the device is synchronised at each edge). Images are summed over ranks; the window time is
  the maximum over ranks. throughput_img_s_per_rank = throughput_img_s / world_size.
- epoch_time_s: median over epochs of the wall time of an epoch's training steps (no evaluation).
- step_time_ms_p50/p95: rank 0's step times inside the window (CUDA events on GPU).
- data_time_frac: share of window step time spent producing the batch (index, augment, copy).
- comm_exposed_frac: after training, `comm_probe_steps` forward+backward passes are timed with
  gradient synchronisation and as many without it (DDP no_sync / FSDP without gradient sync /
  no all-reduce); exposed = max(0, 1 - t_nosync / t_sync), the share of a step that communication
  adds beyond what overlaps with backward. Optimizer steps are not taken in the probe and BN
  statistics are restored, so it cannot change the trained model. At world_size 1 the probe is
  skipped and the value is 0.0 (nothing to synchronise); null when the probe is off.
- peak_mem_mb: CUDA max_memory_allocated on GPU, the process's peak RSS on CPU (max over ranks).
- gpu_util_mean: mean NVML utilisation sampled every 0.5 s during training; null without a GPU.
- time_to_target_s: training time (evaluation excluded) until the end of the first epoch whose
  val_acc reaches --target-acc; null if never reached.
- train_time_s: wall time of the whole training loop, evaluation included.

Checkpoints and resume (--checkpoint-dir; checkpoint.py): a run saves every --checkpoint-every
epochs and, on SIGTERM/SIGUSR1, at the end of the current epoch (all ranks agree on the stop with
one all-reduce per epoch), then, once the checkpoint is complete on every rank, exits with 75
(checkpoint.PREEMPTED_EXIT; a failed save fails the run instead). The same command resumes from
the newest valid checkpoint and continues bit for bit (same data order, RNG states, optimizer,
schedule, scaler), except with --loader dataloader and persistent worker processes
(--num-workers > 0): their random state lives in the workers and is not checkpointed, so such a
run resumes correctly but not bit for bit (a warning says so at start-up).
A resumed run's numbers are accounted over its segments:
- train_time_s and time_to_target_s: the sum over segments of the loop time up to each segment's
  last checkpoint (time lost after it is not counted: that work is redone and counted then);
  start-up, checkpoint loading and the restart itself are excluded.
- the throughput window: each segment excludes its own first `warmup_steps` steps; images,
  window times and step times are summed over segments.
- restarts / resumed_from_epochs: how often and after which epoch the run resumed.
- checkpoint_stall_s: seconds rank 0's training waited for checkpoint saves (all segments).
Once training is over, the checkpoints are deleted before metrics.json is written, so a rerun of
a finished run (changed code) trains from scratch instead of resuming a final checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import math
import os
import platform
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from scalestudy import files
from scalestudy.errors import CheckpointError, Preempted, TrainingError
from scalestudy.trainer import checkpoint as ckpt
from scalestudy.trainer import dist as sdist
from scalestudy.trainer import loaders as sdata
from scalestudy.trainer.config import LR_REFERENCE_BATCH, TrainConfig
from scalestudy.trainer.config import add_arguments as _add_config_arguments
from scalestudy.trainer.models import build_model

EPOCH_COLUMNS = (
    "epoch",
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "epoch_time_s",
    "throughput_img_s",
    "lr",
)


def add_arguments(parser) -> None:
    _add_config_arguments(parser)


def run(args) -> int:
    return main(TrainConfig.from_args(args))


def main(cfg: TrainConfig) -> int:
    denv = sdist.detect()
    where = f"rank {denv.rank}/{denv.world_size} on {sdist.hostname()}"
    stop = ckpt.StopFlag()
    if cfg.checkpoint_dir:
        stop.install()  # SIGTERM/SIGUSR1: checkpoint at the epoch's end, then exit 75
    try:
        device = pick_device(cfg, denv)
        sdist.init_process_group(
            denv, "nccl" if device.type == "cuda" else "gloo", cfg.pg_timeout_s
        )
    except Exception as exc:
        print(f"[{where}] cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        train(cfg, denv, device, stop)
        return 0
    except Preempted as exc:
        print(f"[{where}] {exc}: rerun the same command to resume", file=sys.stderr, flush=True)
        return ckpt.PREEMPTED_EXIT
    except Exception as exc:
        # name the rank: with 64 ranks, "which one failed and why" is the first question
        print(
            f"[{where}] training failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True
        )
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def pick_device(cfg: TrainConfig, denv: sdist.DistEnv) -> torch.device:
    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise TrainingError("--device cuda but CUDA is not available on this host")
    if cfg.device == "cpu" or not cuda:
        if cfg.precision in ("fp16", "tf32"):
            raise TrainingError(
                f"--precision {cfg.precision} needs CUDA (none here); use fp32 or bf16 on CPU"
            )
        return torch.device("cpu")
    if denv.local_rank >= torch.cuda.device_count():
        raise TrainingError(
            f"local rank {denv.local_rank} but only {torch.cuda.device_count()} "
            "GPUs visible: one rank per GPU (check --ntasks-per-node / gres)"
        )
    torch.cuda.set_device(denv.local_rank)  # from the LOCAL rank, never the global one
    return torch.device("cuda", denv.local_rank)


def train(
    cfg: TrainConfig, denv: sdist.DistEnv, device: torch.device, stop: ckpt.StopFlag | None = None
) -> dict:
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rank, world_size = denv.rank, denv.world_size
    master = rank == 0  # writes outputs and prints progress
    cuda = device.type == "cuda"
    local_batch, global_batch = cfg.batches(world_size)
    channels_last = cfg.channels_last == "on" or (cfg.channels_last == "auto" and cuda)
    # TF32 only when asked for: "fp32" must mean IEEE fp32 so the precision family compares cleanly
    torch.backends.cuda.matmul.allow_tf32 = cfg.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = cfg.precision == "tf32"
    torch.backends.cudnn.benchmark = cuda
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)

    # --- data: the whole uint8 split lives on the device; the trainer never downloads
    prepared = sdata.load_prepared(cfg.dataset, cfg.data_dir)
    train_x, train_y = _limit(prepared.train_x, prepared.train_y, cfg.limit_train)
    test_x, test_y = _limit(prepared.test_x, prepared.test_y, cfg.limit_test)
    mean, std = prepared.meta["mean"], prepared.meta["std"]
    # what both input pipelines and the evaluation loader share: this rank's place and the data
    placement = dict(
        local_batch=local_batch, world_size=world_size, rank=rank, seed=cfg.seed, mean=mean, std=std
    )
    if cfg.loader == "device":
        train_loader = sdata.DeviceLoader(train_x, train_y, train=True, device=device, **placement)
        micro_steps = train_loader.steps_per_epoch
        sampler = None
    else:
        train_loader, sampler = sdata.make_dataloader(
            train_x,
            train_y,
            train=True,
            num_workers=cfg.num_workers,
            pin_memory=cfg.pin_memory and cuda,
            persistent_workers=cfg.persistent_workers,
            prefetch_factor=cfg.prefetch_factor,
            **placement,
        )
        micro_steps = len(train_loader)
    eval_loader = sdata.DeviceLoader(test_x, test_y, train=False, device=device, **placement)
    steps_per_epoch = math.ceil(micro_steps / cfg.accum_steps)
    total_steps = steps_per_epoch * cfg.epochs
    if total_steps <= cfg.warmup_steps:
        raise TrainingError(
            f"{total_steps} optimizer steps ({cfg.epochs} epochs x {steps_per_epoch}) leave no "
            f"steady-state window after --warmup-steps {cfg.warmup_steps}: "
            "lower --warmup-steps, raise --epochs or use more data"
        )

    # --- model: identical initialisation on every rank (same seed), then wrapped for the strategy
    torch.manual_seed(cfg.seed)
    model = build_model(
        cfg.model,
        num_classes=prepared.meta["num_classes"],
        width=cfg.width,
        in_channels=train_x.shape[1],
    ).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model, no_sync = wrap_model(model, cfg, device)
    if cfg.compile:
        model = torch.compile(model)

    # --- recipe: SGD Nesterov, label smoothing, linear LR scaling with warm-up (config.py)
    peak_lr = cfg.lr * global_batch / LR_REFERENCE_BATCH
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)  # no weight decay on BN and biases
    optimizer = torch.optim.SGD(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=peak_lr,
        momentum=cfg.momentum,
        nesterov=cfg.momentum > 0,
    )
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup, cfg.schedule)
    )
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")

    timer = StepTimer(device)
    nvml = NvmlSampler(device, out=Path(cfg.out), rank=rank) if cuda else None
    profiler = Profiler(cfg, device, rank)
    # --- fault tolerance: resume from the newest valid checkpoint (a fresh start without one)
    saver = make_checkpointer(cfg, rank, world_size)
    persistent = cfg.loader == "dataloader" and cfg.num_workers > 0 and cfg.persistent_workers
    if saver and master and persistent:
        print(
            f"WARNING: --loader dataloader with --num-workers {cfg.num_workers} and persistent "
            "workers: a resumed run is correct but not bit for bit identical to an uninterrupted "
            "one (the workers' random state is not checkpointed); for an exact resume use "
            "--num-workers 0 or --no-persistent-workers",
            file=sys.stderr,
            flush=True,
        )
    trainables = (model, optimizer, scheduler, scaler, rng_generators(train_loader))
    progress = resume(saver, cfg, rank, trainables) if saver else fresh_progress()
    history: list[dict] = progress["history"]
    window_images = progress[
        "window_images"
    ]  # images this rank processed in the steady-state window
    window_time = progress["window_time"]  # seconds of training steps in the window (no evaluation)
    window_step_times: list[float] = progress["window_step_times"]
    window_data_times: list[float] = progress["window_data_times"]
    train_seconds = progress["train_seconds"]
    time_to_target = progress["time_to_target"]
    step = segment_start = progress["step"]  # warm-up is excluded again in every segment
    if master and history:
        files.write_text(Path(cfg.out) / "epochs.csv", _csv(history))  # the epochs so far
    loop_start = time.perf_counter()
    if nvml:
        nvml.start()

    for epoch in range(progress["epoch"], cfg.epochs):
        if cfg.loader == "device":
            train_loader.set_epoch(epoch)
        else:
            sampler.set_epoch(epoch)
        model.train()
        batches = iter(train_loader)
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        correct = torch.zeros((), device=device, dtype=torch.int64)
        seen = 0
        epoch_window_start = None
        _sync(device)
        epoch_start = time.perf_counter()
        done = 0
        while done < micro_steps:
            in_window = step - segment_start >= cfg.warmup_steps
            if in_window and epoch_window_start is None:
                _sync(device)  # the window starts on an idle device
                epoch_window_start, window_images_before = time.perf_counter(), seen
            profiler.before_step(step)
            group = min(cfg.accum_steps, micro_steps - done)  # a short last group ends an epoch
            timer.start()
            for j in range(group):
                with timer.phase("data"):
                    x, y = next(batches)
                    if x.device != device:
                        x = x.to(device, non_blocking=True)
                        y = y.to(device, non_blocking=True)
                    if channels_last:
                        x = x.contiguous(memory_format=torch.channels_last)
                # accumulate locally; the last micro-batch of the group synchronises gradients
                sync_ctx = no_sync() if j < group - 1 else contextlib.nullcontext()
                with sync_ctx:
                    with (
                        timer.phase("forward"),
                        torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None),
                    ):
                        logits = model(x)
                        loss = F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing)
                    with timer.phase("backward"):
                        scaler.scale(loss / group).backward()
                loss_sum += loss.detach().double() * y.numel()
                correct += (logits.detach().argmax(1) == y).sum()
                seen += y.numel()
            if cfg.strategy == "allreduce":
                with timer.phase("communication"):
                    allreduce_gradients(model, world_size)
            with timer.phase("optimizer"):
                if cfg.clip_grad:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
            timer.stop(in_window)
            profiler.after_step(step)
            done += group
            step += 1
        _sync(device)
        epoch_time = time.perf_counter() - epoch_start
        train_seconds += epoch_time
        if epoch_window_start is not None:
            window_time += time.perf_counter() - epoch_window_start
            window_images += seen - window_images_before
        for st in timer.collect():
            if st["in_window"]:
                window_step_times.append(st["total"])
                window_data_times.append(st.get("data", 0.0))

        # --- end of epoch: reduce the epoch's sums, evaluate on the whole test set
        stats = torch.stack(
            [
                loss_sum,
                correct.double(),
                torch.tensor(float(seen), device=device, dtype=torch.float64),
            ]
        )
        dist.all_reduce(stats)
        train_loss, train_acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
        if not math.isfinite(train_loss):
            raise TrainingError(
                f"non-finite training loss ({train_loss}) in epoch {epoch + 1}: "
                f"lower --lr (peak {peak_lr:g}) or use bf16/fp32 instead of fp16"
            )
        val_loss, val_acc = evaluate(model, eval_loader, cfg, device, amp_dtype, channels_last)
        row = {
            "epoch": epoch + 1,
            "train_loss": train_loss,
            "train_acc": train_acc,
            "val_loss": val_loss,
            "val_acc": val_acc,
            "epoch_time_s": epoch_time,
            "throughput_img_s": stats[2].item() / epoch_time,
            "lr": optimizer.param_groups[0]["lr"],
        }
        history.append(row)
        if time_to_target is None and cfg.target_acc is not None and val_acc >= cfg.target_acc:
            time_to_target = train_seconds
        if master:
            files.write_text(Path(cfg.out) / "epochs.csv", _csv(history))
            print(
                f"epoch {epoch + 1:>3}/{cfg.epochs} | train loss {train_loss:.4f} "
                f"acc {100 * train_acc:5.2f}% | val loss {val_loss:.4f} acc {100 * val_acc:5.2f}% "
                f"| {epoch_time:7.2f} s | {row['throughput_img_s']:>10,.0f} img/s "
                f"| lr {row['lr']:.4g}",
                flush=True,
            )

        # --- checkpoint every N epochs, and on SIGTERM/SIGUSR1 (all ranks stop at this epoch)
        if saver and epoch + 1 < cfg.epochs:
            stopping = agree_on_stop(saver, stop, device, rank)
            if stopping and stop is not None and stop.raised:
                print(
                    f"[rank {rank}] received {stop.signame}: checkpointing after epoch "
                    f"{epoch + 1} and stopping",
                    file=sys.stderr,
                    flush=True,
                )
            if stopping or (cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0):
                progress.update(
                    epoch=epoch + 1,
                    step=step,
                    train_seconds=train_seconds,
                    time_to_target=time_to_target,
                    loop_time=progress["loop_time"] + time.perf_counter() - loop_start,
                    checkpoint_stall_s=saver.stall_s,
                )
                rank_state = {"window_images": window_images, "window_time": window_time}
                save_checkpoint(saver, epoch + 1, progress, rank_state, trainables, cfg, stopping)
                if stopping:
                    stop_after_save(saver, stop, epoch + 1, device)
    train_time = progress["loop_time"] + time.perf_counter() - loop_start
    gpu_util = nvml.stop() if nvml else None
    profiler.close()

    comm_exposed = None
    if cfg.comm_probe_steps and world_size == 1:
        # one rank synchronises nothing: the probe would time two identical arms and report
        # their difference, noise (30% seen on a CPU), as exposed communication
        comm_exposed = 0.0
    elif cfg.comm_probe_steps:
        comm_exposed = comm_probe(
            model, no_sync, train_loader, cfg, device, amp_dtype, channels_last, world_size
        )

    # every rank must end with the same weights; a silent divergence would void every number
    checksums: list = [None] * world_size
    dist.all_gather_object(checksums, param_checksum(model))
    if len(set(checksums)) != 1:
        raise TrainingError(f"ranks hold different parameters after training: {checksums}")

    # --- reduce the measurements over ranks and write metrics.json (rank 0)
    totals = torch.tensor([float(window_images), window_time], dtype=torch.float64, device=device)
    images_all = totals[:1].clone()
    dist.all_reduce(images_all)  # images: summed over ranks
    times_max = totals[1:].clone()
    dist.all_reduce(times_max, op=dist.ReduceOp.MAX)  # window: the slowest rank's wall time
    peak_mem = torch.tensor([peak_memory_mb(device)], dtype=torch.float64, device=device)
    dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
    hosts: list = [None] * world_size
    dist.all_gather_object(hosts, sdist.hostname())
    if gpu_util is not None:
        utils: list = [None] * world_size
        dist.all_gather_object(utils, gpu_util)
        gpu_util = statistics.fmean(u for u in utils if u is not None)
    nodes = len(set(hosts))
    throughput = images_all.item() / times_max.item()
    metrics = {
        **dataclasses.asdict(cfg),
        "world_size": world_size,
        "nodes": nodes,
        "ranks_per_node": max(hosts.count(h) for h in set(hosts)),
        "launcher": denv.launcher,
        "device": device_info(device),
        "local_batch": local_batch,
        "global_batch": global_batch,
        "peak_lr": peak_lr,
        "ddp_static_graph": ddp_static_graph(cfg),
        "steps_per_epoch": steps_per_epoch,
        "throughput_img_s": throughput,
        "throughput_img_s_per_rank": throughput / world_size,
        "window_steps": len(window_step_times),
        "window_images": int(images_all.item()),
        "window_time_s": times_max.item(),
        "epoch_time_s": statistics.median(r["epoch_time_s"] for r in history),
        "step_time_ms_p50": 1e3 * _quantile(window_step_times, 0.50),
        "step_time_ms_p95": 1e3 * _quantile(window_step_times, 0.95),
        "data_time_frac": sum(window_data_times) / sum(window_step_times),
        "comm_exposed_frac": comm_exposed,
        "peak_mem_mb": peak_mem.item(),
        "peak_mem_source": "cuda_max_allocated" if device.type == "cuda" else "process_max_rss",
        "gpu_util_mean": gpu_util,
        "final_val_acc": history[-1]["val_acc"],
        "best_val_acc": max(r["val_acc"] for r in history),
        "time_to_target_s": time_to_target,
        "train_time_s": train_time,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device.type == "cuda" else None,
        "nccl_version": nccl_version() if device.type == "cuda" else None,
        "hostnames": sorted(set(hosts)),
        "slurm_job_id": denv.slurm_job_id,
        "container_digest": os.environ.get("SCALESTUDY_CONTAINER_DIGEST") or None,
        "config_hash": cfg.config_hash(),
        "param_checksums": checksums,
        "started_at": started_at,
        "restarts": len(progress["resumed_from_epochs"]),
        "resumed_from_epochs": progress["resumed_from_epochs"],
        "checkpoint_stall_s": saver.stall_s if saver else 0.0,
    }
    if saver:
        saver.wait()  # a write still in flight ends before its directory is removed
        if master:  # a finished run never resumes: its checkpoints go before metrics.json
            ckpt.remove_all(saver.directory)
    if master:
        # metrics.json last: its presence means the run completed
        files.write_json(Path(cfg.out) / "metrics.json", metrics)
        print(
            f"done: {throughput:,.0f} img/s over {world_size} ranks "
            f"({metrics['throughput_img_s_per_rank']:,.0f} per rank), best val acc "
            f"{100 * metrics['best_val_acc']:.2f}%, {train_time:.1f} s -> {cfg.out}",
            flush=True,
        )
    return metrics


def fresh_progress() -> dict:
    """Where a run without a checkpoint starts; checkpoints store this dict, updated."""
    return {
        "epoch": 0,  # epochs completed
        "step": 0,  # optimizer steps completed
        "history": [],  # the epochs.csv rows so far
        "window_images": 0,
        "window_time": 0.0,
        "window_step_times": [],
        "window_data_times": [],
        "train_seconds": 0.0,
        "time_to_target": None,
        "loop_time": 0.0,  # training-loop seconds of earlier segments
        "checkpoint_stall_s": 0.0,  # stall of earlier segments
        "resumed_from_epochs": [],
    }


def make_checkpointer(cfg: TrainConfig, rank: int, world_size: int) -> ckpt.Checkpointer | None:
    if not cfg.checkpoint_dir:
        return None
    # FSDP saves through torch.distributed.checkpoint, whose collectives run in the background:
    # give them their own gloo group so they never interleave with training's collectives
    group = dist.new_group(backend="gloo") if cfg.strategy == "fsdp" else None
    return ckpt.Checkpointer(
        cfg.checkpoint_dir,
        keep=cfg.checkpoint_keep,
        identity={"config_hash": cfg.config_hash(), "world_size": world_size},
        rank=rank,
        async_write=cfg.checkpoint_async,
        dcp_group=group,
    )


def rng_generators(train_loader) -> dict[str, torch.Generator]:
    """Generators whose state carries across epochs (the DataLoader's; DeviceLoader reseeds)."""
    gen = getattr(train_loader, "generator", None)
    return {"dataloader": gen} if isinstance(gen, torch.Generator) else {}


def _sharded_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def save_checkpoint(saver, epoch, progress, rank_state, trainables, cfg, wait) -> None:
    """Snapshot everything that defines the run's future and hand it to the saver."""
    model, optimizer, scheduler, scaler, generators = trainables
    per_rank: list = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, {"rng": ckpt.rng_state(generators), **rank_state})
    fsdp = cfg.strategy == "fsdp"
    state = {
        "model": None if fsdp else model.state_dict(),
        "optimizer": None if fsdp else optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "ranks": per_rank,
        "progress": progress,
    }
    saver.save(epoch, state, _sharded_state(model, optimizer) if fsdp else None, wait=wait)


def resume(saver: ckpt.Checkpointer, cfg: TrainConfig, rank: int, trainables) -> dict:
    """Load the newest valid checkpoint of this configuration into the trainables; returns its
    progress (fresh_progress() when there is none). Rank 0 chooses, every rank loads."""
    model, optimizer, scheduler, scaler, generators = trainables
    choice = [None]
    if rank == 0:
        found = ckpt.find_latest(saver.directory, saver.identity)
        choice[0] = str(found[0]) if found else None
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return fresh_progress()
    path = Path(choice[0])
    state = ckpt.load_state(path)
    if cfg.strategy == "fsdp":
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
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    mine = state["ranks"][rank]
    ckpt.set_rng_state(mine["rng"], generators)
    progress = state["progress"]
    progress.update(window_images=mine["window_images"], window_time=mine["window_time"])
    progress["resumed_from_epochs"] = [*progress["resumed_from_epochs"], progress["epoch"]]
    saver.stall_s = progress["checkpoint_stall_s"]  # the stall of earlier segments carries on
    if rank == 0:
        print(f"resuming from {path} (epoch {progress['epoch']}, step {progress['step']})")
    return progress


def agree_on_stop(saver, stop, device, rank) -> bool:
    """One all-reduce per epoch: did any rank get a stop signal, did any checkpoint write fail?
    Every rank leaves with the same answer, so all stop (or fail) at the same step."""
    error = saver.poll()
    flags = torch.tensor(
        [float(bool(stop and stop.raised)), float(error is not None)],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if flags[1].item():
        if error is not None:
            raise error
        raise CheckpointError("a checkpoint write failed on another rank (see its log)")
    return bool(flags[0].item())


def stop_after_save(saver, stop, epoch: int, device) -> NoReturn:
    """After the stop signal's synchronous save: exit 75 (Preempted) only with the checkpoint
    complete, and every rank together.

    Only rank 0 writes state.pt: a rank that exited at once would, under srun
    --kill-on-bad-exit, get the job step killed with rank 0 mid-write. The all-reduce holds
    every rank until rank 0 joins it after its write is renamed and fsynced (an all-reduce
    completes on no rank before all have entered it), and it carries whether any rank's write
    failed: then every rank fails with the error instead of claiming a checkpoint."""
    error = saver.wait()
    failed = torch.tensor([float(error is not None)], dtype=torch.float64, device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item():
        if error is not None:
            raise error
        raise CheckpointError(
            f"the checkpoint of epoch {epoch} on stopping failed on another rank (see its log)"
        )
    signame = stop.signame if stop is not None and stop.raised else "another rank's signal"
    raise Preempted(epoch, signame, saver.directory / ckpt.checkpoint_name(epoch))


def wrap_model(model: torch.nn.Module, cfg: TrainConfig, device: torch.device):
    """Wrap for the strategy; returns (model, no_sync) where no_sync() skips gradient sync."""
    if cfg.strategy == "ddp":
        ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,  # MiB of gradients per all-reduce
            gradient_as_bucket_view=True,  # grads alias the buckets: no extra copy
            # static_graph records the first iteration; if that runs under no_sync (gradient
            # accumulation) the reducer asserts (torch 2.14: "expect_autograd_hooks_"), so the
            # static graph is used only without accumulation (metrics: ddp_static_graph)
            static_graph=ddp_static_graph(cfg),
        )
        register_comm_hook(ddp, cfg.comm_hook)
        return ddp, ddp.no_sync
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in model.modules():  # shard every residual block, then the root
            if module.__class__.__name__ == "BasicBlock":
                fully_shard(module)
        fully_shard(model)

        @contextlib.contextmanager
        def fsdp_no_sync():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return model, fsdp_no_sync
    # allreduce: no wrapper; same start everywhere, gradients summed by allreduce_gradients()
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    return model, contextlib.nullcontext


def ddp_static_graph(cfg: TrainConfig) -> bool:
    return cfg.strategy == "ddp" and cfg.static_graph and cfg.accum_steps == 1


def register_comm_hook(ddp: DDP, hook: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        # rank-1 approximation after 10 uncompressed steps (torch's warm-start advice)
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=10
        )
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)


def allreduce_gradients(model: torch.nn.Module, world_size: int) -> None:
    """The hand-written baseline: one flat all-reduce of every gradient after backward."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def param_checksum(model: torch.nn.Module) -> str:
    """sha256 of all parameters (FSDP shards gathered), to prove the ranks agree bit for bit."""
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2 DTensor
        h.update(full.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def sync_buffers(model: torch.nn.Module) -> None:
    """BN running statistics from rank 0 (DDP does this in every forward; the others do not)."""
    for buf in model.buffers():
        dist.broadcast(buf, src=0)


@torch.no_grad()
def evaluate(model, loader, cfg, device, amp_dtype, channels_last) -> tuple[float, float]:
    """Loss and accuracy over the whole test set; each sample counted once across ranks."""
    if cfg.strategy != "ddp":
        sync_buffers(model)
    model.eval()
    sums = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, count
    for x, y in loader:
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(x)
        sums[0] += F.cross_entropy(logits.float(), y, reduction="sum").double()
        sums[1] += (logits.argmax(1) == y).sum()
        sums[2] += y.numel()
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def comm_probe(model, no_sync, loader, cfg, device, amp_dtype, channels_last, world_size):
    """Exposed communication: 1 - t(fwd+bwd without sync) / t(fwd+bwd with sync); see top."""
    model.train()
    saved = [b.detach().clone() for b in model.buffers()]  # BN stats change in train mode
    if cfg.loader == "device":
        loader.set_epoch(0)
    batches = iter(loader)
    first = next(batches)
    x, y = (t.to(device) for t in first)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def one(sync: bool) -> float:
        _sync(device)
        t0 = time.perf_counter()
        with no_sync() if not sync else contextlib.nullcontext():
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
        if sync and cfg.strategy == "allreduce":
            allreduce_gradients(model, world_size)
        _sync(device)
        # the slowest rank sets the pace of a synchronous step
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        for p in model.parameters():
            p.grad = None
        return t.item()

    one(True)  # warm both paths once
    one(False)
    with_sync = [one(True) for _ in range(cfg.comm_probe_steps)]
    without = [one(False) for _ in range(cfg.comm_probe_steps)]
    with torch.no_grad():
        for b, s in zip(model.buffers(), saved, strict=True):
            b.copy_(s)
    return max(0.0, 1.0 - statistics.median(without) / statistics.median(with_sync))


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """LR multiplier: linear warm-up to 1, then onecycle (linear to 0) or cosine (to 0)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "onecycle":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


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

    def collect(self) -> list[dict[str, float]]:
        """Seconds per phase and in total for each step since the last call (device synced)."""

        def dt(a, b) -> float:
            return a.elapsed_time(b) / 1e3 if self.cuda else b - a

        out = []
        for in_window, marks in self.steps:
            start, end = marks[0][1], marks[-1][1]
            step = {"total": dt(start, end), "in_window": in_window}
            for name, a, b in marks[1:-1]:
                step[name] = step.get(name, 0.0) + dt(a, b)
            out.append(step)
        self.steps = []
        return out


class Profiler:
    """--profile-steps A:B profiles optimizer steps A..B-1.

    On a GPU: cudaProfilerStart/Stop around the window, the capture range of `nsys profile
    --capture-range=cudaProfilerApi` and `ncu --profile-from-start off`. On a CPU, or on a GPU when
    SCALESTUDY_PROFILER=torch (set by `scalestudy profile capture` where nsys is missing):
    torch.profiler over the window, saved in --out/profile/ as torch_ops_rank{r}.json (key_averages,
    machine-readable: profiling.parse_torch), torch_ops_rank{r}.txt (the table) and
    trace_rank{r}.json (chrome trace).
    """

    def __init__(self, cfg: TrainConfig, device: torch.device, rank: int) -> None:
        self.window = cfg.profile_window()
        self.cuda_api = device.type == "cuda" and os.environ.get("SCALESTUDY_PROFILER") != "torch"
        self.device = device
        self.dir = Path(cfg.out) / "profile"
        self.rank = rank
        self.prof = None

    def before_step(self, step: int) -> None:
        if not self.window or step != self.window[0]:
            return
        _sync(self.device)
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
            self.close()

    def close(self) -> None:
        if not self.window:
            return
        _sync(self.device)
        if self.cuda_api:
            torch.cuda.profiler.stop()
        elif self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.dir.mkdir(parents=True, exist_ok=True)
            averages = self.prof.key_averages()
            files.write_json(
                self.dir / f"torch_ops_rank{self.rank}.json", torch_ops_export(averages)
            )
            table = averages.table(sort_by="self_cpu_time_total", row_limit=50)
            files.write_text(self.dir / f"torch_ops_rank{self.rank}.txt", table + "\n")
            trace = self.dir / f"trace_rank{self.rank}.json"
            tmp = trace.with_suffix(".json.tmp")
            self.prof.export_chrome_trace(str(tmp))
            os.replace(tmp, trace)
            self.prof = None
        self.window = None


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


class NvmlSampler:
    """This rank's GPU sampled every 0.5 s (GPU_SAMPLE_COLUMNS) during training.

    stop() returns the mean utilisation (None without NVML, never a made-up 0) and, given `out`,
    writes the time series to out/gpu_samples_rank{rank}.csv (time_s: seconds since start()).
    `read(handle) -> dict` is nvml_read unless given (tests pass a stand-in: no GPU there).
    """

    def __init__(
        self,
        device: torch.device,
        interval_s: float = 0.5,
        out: Path | None = None,
        rank: int = 0,
        read=None,
    ) -> None:
        self.index, self.interval = device.index or 0, interval_s
        self.out, self.rank, self.read = out, rank, read
        self.samples: list[dict] = []
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.physical = self.index

    def start(self) -> None:
        # NVML counts devices physically; map through CUDA_VISIBLE_DEVICES when it is set
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        with contextlib.suppress(ValueError, IndexError):
            self.physical = int(visible.split(",")[self.index]) if visible else self.index
        handle = None
        if self.read is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                handle = pynvml.nvmlDeviceGetHandleByIndex(self.physical)
                self.read = functools.partial(nvml_read, pynvml)
            except Exception as exc:  # no NVML: the value stays null, never a made-up 0
                print(f"NVML unavailable ({exc}); gpu_util_mean will be null", file=sys.stderr)
                return
        t0 = time.monotonic()

        def loop() -> None:
            while not self.stop_event.wait(self.interval):
                try:
                    sample = self.read(handle)
                except Exception as exc:  # a failing query ends sampling, never training
                    print(f"NVML sampling stopped: {exc}", file=sys.stderr)
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

    def stop(self) -> float | None:
        if self.thread is None:
            return None
        self.stop_event.set()
        self.thread.join()
        if self.out is not None:
            lines = [",".join(GPU_SAMPLE_COLUMNS)]
            for s in self.samples:
                lines.append(",".join(f"{s[c]:.6g}" for c in GPU_SAMPLE_COLUMNS))
            files.write_text(
                Path(self.out) / f"gpu_samples_rank{self.rank}.csv", "\n".join(lines) + "\n"
            )
        util = [s["util_pct"] for s in self.samples]
        return statistics.fmean(util) if util else None


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB -> MiB


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device)}
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return {"type": "cpu", "name": name}


def git_commit() -> str | None:
    """The commit of the code that ran: from the container label, else from the source tree."""
    if os.environ.get("SCALESTUDY_GIT_COMMIT"):
        return os.environ["SCALESTUDY_GIT_COMMIT"]
    sha = files.git_commit(Path(__file__).resolve().parent)
    return None if sha == "unknown" else sha


def nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _limit(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    if n and n < len(x):
        return x[:n], y[:n]
    return x, y


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _csv(rows: list[dict]) -> str:
    lines = [",".join(EPOCH_COLUMNS)]
    for r in rows:
        lines.append(",".join(str(r[c]) if c == "epoch" else f"{r[c]:.6g}" for c in EPOCH_COLUMNS))
    return "\n".join(lines) + "\n"


def torch_ops_export(key_averages) -> dict:
    """The trainer's machine-readable export of prof.key_averages() (parse_torch reads it)."""
    ops = []
    for evt in key_averages:
        self_dev = getattr(evt, "self_device_time_total", None)
        if self_dev is None:
            self_dev = getattr(evt, "self_cuda_time_total", 0)
        ops.append(
            {
                "name": evt.key,
                "count": int(evt.count),
                "self_cpu_us": float(evt.self_cpu_time_total),
                "cpu_total_us": float(evt.cpu_time_total),
                "self_device_us": float(self_dev or 0),
                "device_type": str(getattr(evt, "device_type", "CPU")).rsplit(".", 1)[-1],
            }
        )
    return {"format": "scalestudy-torch-ops-1", "time_unit": "us", "ops": ops}
