"""The study's vocabulary, defined once: datasets, families, precisions, strategies (and their
names in the documents), ...

Every module that names one of these imports it from here; the JSON schema of the study config
(workflow/schemas/config.schema.yaml) repeats them as enums, and tests/test_vocabulary.py checks
that the two agree. No torch import: the study layer and the workflow read this at parse time.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass

# the signals that stop a command as Ctrl-C does: a batch system's time limit, `timeout`,
# Snakemake cancelling a job (SIGTERM), a closed terminal (SIGHUP); cli's handler, the launch
# passing them on to its ranks, the ranks' handlers and their rendezvous (trainer/dist.py)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

# the signals a training rank stops at, with a checkpoint (trainer/checkpoint.StopFlag), and its
# DataLoader workers must outlive (trainer/loaders.WORKER_STOPS): STOP_SIGNALS and SIGUSR1, the
# warning a batch system sends before the time limit (sbatch --signal=USR1@lead,
# study/resources.py)
RANK_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGUSR1)


@dataclass(frozen=True)
class Dataset:
    train: int  # images in the training split
    test: int  # images in the test split
    shape: str  # H x W x C of one image
    classes: int
    # whether a horizontal mirror keeps an image's label, so training augments with random
    # flips (trainer/loaders.py): CIFAR-10's objects, and the synthetic set, made so
    # (prepare_data.make_synthetic); not MNIST's digits (a mirrored 2, 3, 4, 5, 7 or 9 is none)
    flip: bool = True

    @property
    def image_bytes(self) -> int:
        """Bytes of one image in the prepared data.pt: uint8 pixels and an int64 label."""
        h, w, c = map(int, self.shape.split("x"))
        return h * w * c + 8

    def megabytes(self, images: int) -> int:
        """MB (Slurm's and torch's: 2**20 bytes) that `images` of the prepared set take, rounded
        up: what every rank holds in memory (trainer/loaders.py loads data.pt whole)."""
        return -(-images * self.image_bytes // 2**20)


# Sizes of the published splits (CIFAR-10: Krizhevsky 2009; MNIST: LeCun et al. 1998). The
# synthetic set's sizes are the defaults of `scalestudy prepare-data --dataset synthetic`
# (config key synthetic.num_train / num_test overrides them).
DATASETS: dict[str, Dataset] = {
    "cifar10": Dataset(train=50000, test=10000, shape="32x32x3", classes=10),
    "mnist": Dataset(train=60000, test=10000, shape="28x28x1", classes=10, flip=False),
    "synthetic": Dataset(train=50000, test=10000, shape="32x32x3", classes=10),
}
# sweeps of a study (config key families.<name>); order = order of tables and figures
FAMILIES = ("strong", "weak", "precision", "bucket")
# arithmetic of a run; order = sort order of the run table
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# precisions that only exist on CUDA: why, for the error message
CUDA_ONLY_PRECISIONS = {
    "fp16": "fp16 autocast with GradScaler needs CUDA",
    "tf32": "TF32 is a tensor-core mode of NVIDIA GPUs",
}
STRATEGIES = ("ddp", "fsdp", "allreduce")  # gradient synchronisation
# each strategy as the documents name it (render_report's `strategy` filter of system.csv's
# "run settings" cell, the proposal's default objectives); trainer/parallel.py implements them
STRATEGY_NAMES = {
    "ddp": "PyTorch DDP (DistributedDataParallel)",
    "fsdp": "PyTorch FSDP2 (fully_shard)",
    "allreduce": "a hand-written all-reduce of the gradients after backward (torch.distributed)",
}
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")  # DDP communication hooks
DEVICES = ("auto", "cpu", "cuda")
# a study's hardware.device (and its jobs' --device): it names its hardware, auto is for a bare
# command line only
STUDY_DEVICES = tuple(d for d in DEVICES if d != "auto")
# torch.distributed backends: auto = NCCL on CUDA, gloo on CPU; gloo on CUDA lets several ranks
# share one GPU (NCCL refuses two ranks on one device: "Duplicate GPU detected")
BACKENDS = ("auto", "nccl", "gloo")
LOADERS = ("device", "dataloader")  # input pipelines
MODELS = ("resnet18", "cnn")
SCHEDULES = ("onecycle", "cosine")  # LR schedule after warm-up
# profiling.tool: the capture's timeline tool (auto = nsys on CUDA with nsys on PATH, else
# torch.profiler; jobs/profile.py choose_tool)
PROFILERS = ("auto", "nsys", "torch")
# profiling.nsys_ranks: the ranks that write an nsys report (0: rank 0 only, a smaller capture)
NSYS_RANKS = ("all", "0")
# nsys --trace of `scalestudy profile capture` and the default of profiling.nsys_trace
NSYS_TRACE = "cuda,nvtx,osrt,cudnn,cublas"
# a switch whose default depends on the device (trainer flags --compile, --channels-last):
# auto = the fast choice where it is safe (trainer/compiling.py, trainer/numerics.py say where)
SWITCHES = ("auto", "on", "off")
# --cuda-graphs: the switches plus step, the whole training step as one CUDA graph (on: the
# compiled pieces' graphs, torch.compile mode reduce-overhead; trainer/compiling.py)
CUDA_GRAPHS = (*SWITCHES, "step")
# the reasons the trainer gives for an energy window too short for NVML's counter and for a
# counter that did not advance (their seconds follow): gpu-check tells the first from a counter
# that failed; analyze counts the runs of each, whose seconds make every run's its own sentence
ENERGY_SHORT_WINDOW = "window too short for the energy counter"
ENERGY_FROZEN = "the energy counter did not advance"
# (the figures' names are results/plot.py's FIGURES: this module is imported by the trainer, so
# an edit here reruns data preparation and every training run, and adding a figure must not)
# the columns of a run's epochs.csv, one row per epoch (trainer/loop.py writes it and says what
# each holds; collect refuses a run's file that lacks one or has a cell out of its range)
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


def time_to_target(epochs: list[dict], target: float | None) -> float | None:
    """time_to_target_s: the training time (evaluation excluded) of the epochs up to the first
    whose val_acc reaches `target`, the sum of their epoch_time_s; None without a target or
    where none reaches it. `epochs`: epochs.csv rows (collect, with train.target_acc) or the
    trainer's history of them (its metrics.json, with --target-acc)."""
    if target is None:
        return None
    total = 0.0
    for epoch in epochs:
        total += float(epoch["epoch_time_s"])
        if float(epoch["val_acc"]) >= target:
            return total
    return None


# Environment variables jobs/container_exec.py's exec_prefix sets inside the container, read by the
# trainer (metrics.json) and jobs/inventory.py: the sha256 of the .sif the process runs in, and
# the commit of the source bound in (the image may have no git).
CONTAINER_DIGEST_ENV = "SCALESTUDY_CONTAINER_DIGEST"
GIT_COMMIT_ENV = "SCALESTUDY_GIT_COMMIT"
# The GPU slot lock files (os.pathsep between them) a local GPU launch holds (jobs/gpu_slots.py),
# which each rank holds too (files.hold_shared_locks, from trainer/train.py): torchrun's ranks
# inherit no descriptor of it.
GPU_SLOT_LOCKS_ENV = "SCALESTUDY_GPU_SLOT_LOCKS"
# The trainer's switch from cudaProfilerStart/Stop (the capture range of nsys and ncu) to
# torch.profiler on a GPU (trainer/measure.py Profiler): "torch", set by `scalestudy profile
# capture` where nsys is missing (jobs/profile.py profiler_env) and by gpu-check's checks.
PROFILER_ENV = "SCALESTUDY_PROFILER"
# SLURM_STEP_ID of salloc's shell where a site sets LaunchParameters=use_interactive_step
# (slurm.conf(5)): SLURM_INTERACTIVE_STEP (0xfffffffa) of slurm.h. That step holds none of the
# job's resources (srun starts steps from it), and its SLURM_NTASKS is the job's (srun
# --preserve-env), not its own one task: it is salloc's shell on a node, no task of a run.
SLURM_INTERACTIVE_STEP = "4294967290"


def slurm_step(env: Mapping[str, str]) -> str:
    """SLURM_STEP_ID where this process is a task of an srun step, "" elsewhere: outside Slurm,
    in a job's batch shell, in salloc's shell (on the submit host or in its interactive step)."""
    step = env.get("SLURM_STEP_ID", "")
    return "" if step == SLURM_INTERACTIVE_STEP else step


# The counted units the documents, the plan and the figures write, singular after a count of 1
# ("1 ranks" and "(1 repeats)" read wrong): one rule for render_report's `plural` filter,
# plan.md and the figures' legends.
SINGULAR = {
    "GPUs": "GPU",
    "ranks": "rank",
    "nodes": "node",
    "runs": "run",
    "training runs": "training run",
    "repeats": "repeat",
    "jobs": "job",
    "profiled runs": "profiled run",
    "profiling jobs": "profiling job",
    "measured runs": "measured run",
    "months": "month",
    "world sizes": "world size",
    "epochs": "epoch",
}


def plural(unit: str, count: float) -> str:
    """`unit` as it reads after `count`: "GPUs" after 2, "GPU" after 1."""
    return SINGULAR.get(unit, unit) if count == 1 else unit
