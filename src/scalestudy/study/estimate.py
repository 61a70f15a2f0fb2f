"""The node-hour estimate of one training run, and its calibration from measured runs.

The estimate of one training run (seconds), with the `plan:` section of the study config:

    T = epochs * (N_train / X + N_test / (X * eval_speedup)) + N_probe / X + startup_s
    X = x_rank * W                         images/s of the whole run (all W ranks)
    N_probe = 2 * (comm_probe_steps + 1) * W * local_batch   (0 for one rank or no probe)
    x_rank = throughput_img_s_per_gpu[precision] * eta(W)    (default)
    eta(W) = 1 (W = 1), efficiency_intra_node (one node), efficiency_inter_node (several nodes)

    node-hours = nodes * T / 3600          GPU-hours = GPUs * T / 3600 (0 on cpu)
    Slurm time limit = max(hardware.runtime_min, ceil((T_max * safety_factor + lead) / 60)) minutes
    T_max = max(T, runtime_hi_s) where the scaling model gives an interval (below), else T
    lead = checkpointing.signal_lead_s + 60 (0 with checkpointing off): USR1 comes
           signal_lead_s before the limit, and Slurm may send it up to 60 s earlier (man sbatch,
           --signal), so it never comes before T_max * safety_factor

A limit past hardware.runtime_max M (the partition's MaxTime) is M, and the run goes on in
further jobs (`split_jobs`): each is warned (USR1) `lead` before M, checkpoints at the end of the
epoch then in progress and is resubmitted (a checkpointing.retries retry) to resume there after
its own start-up S, so, with f = safety_factor,

    jobs = ceil((T_max - S) * f / (60 M - lead - S * f))   (1 within M)
    node-hours, GPU-hours: T + (jobs - 1) * S in place of T (each resumption's start-up)

refused (PlanError) before any job with checkpointing off, no training time in a job
(60 M <= lead + S * f), an epoch longer than the lead ((T_max - S) / epochs * f >
checkpointing.signal_lead_s: no job would reach a checkpoint), or checkpointing.retries below
jobs - 1.

T or the time limit beyond any float (X = 1e-310 images/s, a probe of 10**310 steps) is a PlanError
naming the keys above, not an OverflowError.

N_train / N_test: images per epoch. N_test: train.limit_test when set, else the test set's size;
evaluation runs on all of it after every epoch, spread over the ranks. N_train: the images one
epoch trains on: of n (train.limit_train when set, else the training set's size) the trainer
drops the ragged tail, N_train = floor(n / (W x local_batch)) x W x local_batch (one input shape
for every step: trainer/loaders.py), or n when that is less than one step (with
train.loader dataloader floor(n / W) x W: its DistributedSampler splits n evenly) (16 GPUs x 512
on CIFAR-10: 49,152 of 50,000). N_probe: the images of the exposed-communication probe after
training (trainer/measure.comm_probe): a warm-up pass and comm_probe_steps passes, forward and
backward of one local batch on every rank, with gradient sync and then without; one rank skips
it (trainer/loop.finish). Timed at X, about the rate of the training steps it repeats, a little
high (no optimizer, half of the passes without communication): on 2 CPU ranks 100 probe steps
added 11.9-12.5 s to a job, N_probe / X said 12.5-13.8 s (docs/benchmarks.md). The default
config's 10 steps are 22 passes beside a weak 16-GPU run's 360 training steps (12 per epoch x
30 epochs), 6% more; a typo of 10**9 steps is a plan and a time limit that say so, not a job
killed at its limit after its training.

Calibration (`Calibration`, when results/csv/runs.csv exists): measured runs of the same base
replace the default x_rank, taking the first level that has measurements (mean of the measured
throughput_img_s_per_rank). The base (`run_base`, `same_threads`) is every column of BASE_KEY:
device, model, width, strategy, loader, compile, cuda_graphs, comm_hook and accum_steps; the
image shape of the dataset (vocab.DATASETS: MNIST's 28x28x1 is not CIFAR-10's 32x32x3, synthetic
has CIFAR-10's); num_workers with loader dataloader; and the threads per rank
(hardware.cpus_per_rank: metrics.json's threads_per_rank, where recorded). A run measured with
any of them different calibrates nothing, nor does one measured on GPUs of another family than
hardware.gpu_type names (`same_gpu`: an H100 run does not price an A100 study; a gpu_type
naming no family of hardware.py's table, "" included, leaves every GPU to calibrate). The
levels, the first that has measurements taken:

    1. run        the same configuration (run id without its repeat), e.g. repeats 1, 2 of r0
    2. batch      the same precision, world size and local_batch
    3. world size the same precision and world size, at the measured local batch nearest the
                  run's (in log2, the smaller on a tie), a larger one at its step time:
                  x_rank x local_batch / measured local_batch (a smaller batch takes no longer
                  per step; a mean over local batches priced 32 at 1.9 x the rate measured at 64
                  on a GPU, whose rate grows with its batch, and its time limit fell short)
    4. model      the scaling model (study/model.py) fitted to the measured DDP runs of the
                  same base: x_rank = local_batch / T_step(W, nodes, local_batch, precision,
                  bucket_cap_mb), with T_step's 95% prediction interval carried into
                  runtime_lo_s / runtime_hi_s (runtime at the slow and fast ends of the step
                  time; the Slurm time limit takes runtime_hi_s, T_max above); "model,
                  extrapolated" beyond the measured runs (model.EXTRAPOLATED: a world size
                  above the largest measured on its kind of link, one node or several, more
                  ranks per node than any measured run, a bucket count outside the multi-rank
                  runs', or a local batch outside the 1-rank runs'). Used only where the fit
                  identifies the parameters the run depends on (a multi-node run needs a
                  measured multi-node run): the model never guesses a bandwidth; and not where
                  it cannot describe its runs (Fit.misfit)
    5. precision  the same precision at the measured world size nearest W (in log2 W, the
                  larger on a tie), as x_rank / eta(W_measured) * eta(W): a mean over every
                  measured world size let eta's guess stand in for the scaling the runs
                  measured (the CPU demo priced 8 ranks at 5.7 x its 4-rank throughput); of
                  its runs, those at the local batch nearest the run's, a larger one at its
                  step time, as in 3 (their mean over every local batch priced a local batch
                  of 2 at 5.5 x the rate measured at 4, beside a run measured at 64)

The batch and world-size levels take the runs of the run's own bucket_cap_mb before the model,
and those of any cap after it (LOOKUP: run, batch and world size at its cap, model, batch and
world size at any cap, precision): another cap is another bucket count, so another all-reduce
latency (a bucket sweep's 1 MiB run priced at the 25 MiB run's rate was given 591 s, a limit of
900 s, for 1106 s), which the model prices where it can.

startup_s is calibrated too when Snakemake's job wall times exist (benchmarks/train/<run>.tsv):
the median of wall_s - epochs * (N_train / X + N_test / (X * eval_speedup)) - N_probe / X over
measured runs of the same world size (else over all measured runs), with X the run's measured
throughput_img_s and N_train, N_test the images it trained and evaluated on per epoch, the
trainer's counts in runs.csv (train_images_per_epoch, test_images_per_epoch: the study's
synthetic.num_train may have changed since; a runs.csv of an older trainer without them: the
study's sizes). It absorbs interpreter and torch start-up, data loading, process-group set-up,
the slower warm-up steps and writing outputs.

A run is done (`is_done`) when runs.csv has it measured with this configuration: its run-table
columns, the images per epoch it trained and evaluated on and its threads per rank (each where
recorded), as the study's. A run measured with other threads per rank calibrates nothing.

Energy (GPU, training runs only): a run's kWh = J/img x epochs x N_train / 3.6e6, with J/img the
mean measured energy_j_per_img (NVML's counter over the window's training spans, train.py) of
measured runs at the first of the levels run, batch, world size (same precision and world size:
energy per image changes with communication, so it is not carried to other world sizes; at the
world-size level, where the run's own batch has none, the nearest measured batch's power per
rank, J/img x img/s, over the run's priced img/s per rank); where
those spans were too short for the counter (GPU epochs of ~2 s), energy_wall_j_per_img (the
window's wall span, the evaluations between its epochs included; the basis says "evaluation
included"). Without
such a run the energy is None ("not measured"): there is no default guess. With
plan.calibrate false the plan reads no measured run: None, "not used (plan.calibrate false)".

study/plan.py sums these estimates into the plan (tables, reports/plan.md, the dry-run table).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from scalestudy import files, hardware, vocab
from scalestudy.errors import AnalysisError, PlanError
from scalestudy.study import model
from scalestudy.study.runs import (
    RUN_COLUMNS,
    build_run_table,
    epoch_micro_steps,
    in_effect,
    prepared_sizes,
    same,
)

RUNS_CSV = "results/csv/runs.csv"
BENCHMARKS_DIR = "benchmarks/train"
SOURCE = "source_csv"  # key load_measured adds to each row: the runs.csv it was read from
PLAN_MD = "reports/plan.md"
PLAN_CSV = "results/plan.csv"
# seconds before its time a --signal=USR1@lead may come: "Due to the resolution of event handling
# by Slurm, the signal may be sent up to 60 seconds earlier than specified" (man sbatch, --signal)
SLURM_SIGNAL_EARLY_S = 60
# the longest Slurm time limit the plan asks for, in minutes: a year, the schema's bound of
# hardware.runtime_min/runtime_max (a tiny plan.eval_speedup gave a 303-digit limit)
LONGEST_LIMIT_MIN = 525600
# the longest USR1 lead the config takes, s: the schema's maximum of checkpointing.signal_lead_s
SIGNAL_LEAD_MAX_S = 65535
# measured runs must match the estimated run in these columns to calibrate it at all
BASE_KEY = (
    "device",
    "model",
    "width",
    "strategy",
    "loader",
    "compile",
    "cuda_graphs",
    "comm_hook",
    "accum_steps",
)
# ... and in the image size: MNIST's 28x28x1 images cost less than CIFAR-10's (synthetic has
# CIFAR-10's shape, so offline runs calibrate a CIFAR-10 study), and with loader dataloader in
# num_workers (`run_base`); the threads per rank must be the study's (`same_threads`)
LEVELS = ("run", "batch", "world size", "model", "precision")
MEASURED_LEVELS = tuple(level for level in LEVELS if level != "model")  # looked up in runs.csv
# (level, at the run's own cap): the order Calibration.throughput_per_rank looks a run up in.
# The levels of one world size and its rank layout come at the run's bucket cap before the model
# and at any cap after it: another cap is another bucket count, so another all-reduce latency (a
# 1 MiB run priced at the 25 MiB run's rate was given 591 s, a limit of 900 s, for 1106 s),
# which the model prices where it can
LOOKUP = (
    ("run", False),
    ("batch", True),
    ("world size", True),
    ("model", False),
    ("batch", False),
    ("world size", False),
    ("precision", False),
)
OTHER_CAP_LEVELS = tuple(level for level, own_cap in LOOKUP if own_cap)
# the levels whose measured J/img a run's energy estimate may take (same precision and world size)
ENERGY_LEVELS = ("run", "batch", "world size")
# (level, at the run's own cap): the order Calibration.energy_per_image looks them up in, as
# LOOKUP's: another cap is another communication time, so another J/img at the same power (a
# 1 MiB run priced 1.87x as long as the 25 MiB runs took their J/img, its GPUs drawing half
# their power); at another cap the measured power over the run's priced img/s
ENERGY_LOOKUP = tuple((level, own) for level, own in LOOKUP if level in ENERGY_LEVELS)
OTHER_CAP = "another bucket cap"  # said in the energy basis of a J/img so priced
J_PER_KWH = 3.6e6
# a J/img measured over the window's wall span (metrics.json energy_wall_j_per_img, train.py):
# its evaluations and checkpoints between epochs included; said in the basis
WITH_EVALUATION = "evaluation included"
# the energy basis of a run without a J/img: no comparable run measured one, or the plan reads
# none (plan.calibrate false; results/proposal.py says the same)
NOT_MEASURED = "not measured"
NOT_USED = "not used (plan.calibrate false)"


def measured_energy_per_img(row: dict) -> tuple[float | None, str | None]:
    """A measured run's J/img and its scope: energy_j_per_img (the training spans: "training")
    where measured, else energy_wall_j_per_img (WITH_EVALUATION), else (None, None)."""
    for key, scope in (
        ("energy_j_per_img", "training"),
        ("energy_wall_j_per_img", WITH_EVALUATION),
    ):
        value = as_float(row.get(key))
        if value is not None:
            return value, scope
    return None, None


# numeric columns of results/csv/runs.csv the calibration reads
MEASURED_NUMBERS = (
    "world_size",
    "nodes",
    "local_batch",
    "epochs",
    "limit_train",
    "limit_test",
    "comm_probe_steps",
    "throughput_img_s",
    "throughput_img_s_per_rank",
)
# of MEASURED_NUMBERS, the counts that may be 0 (the limits: 0 = all; the probe: 0 = off)
MEASURED_ZERO = ("limit_train", "limit_test", "comm_probe_steps")
# the trainer's counts of the images a measured run trained and evaluated on per epoch (N_train,
# N_test); blank or absent in a runs.csv of an older trainer
MEASURED_IMAGES = ("train_images_per_epoch", "test_images_per_epoch")

PLAN_COLUMNS = (
    "run",
    "families",
    "nodes",
    "world_size",
    "gpus",
    "precision",
    "local_batch",
    "epochs",
    "train_images",
    "test_images",
    "probe_images",
    "throughput_img_s",
    "throughput_basis",
    "startup_s",
    "startup_basis",
    "runtime_s",
    "runtime_lo_s",
    "runtime_hi_s",
    "interval_note",
    "extrapolated",
    "slurm_runtime_min",
    "jobs",
    "node_hours",
    "gpu_hours",
    "energy_kwh",
    "energy_basis",
    "done",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    """What one job costs. rule: the Snakemake rule; basis: where the throughput came from."""

    rule: str
    run: str
    families: str
    nodes: int
    gpus: int
    runtime_s: float
    throughput_basis: str = "default"
    startup_basis: str = "default"
    world_size: int = 0
    precision: str = ""
    local_batch: int = 0
    epochs: int = 0
    train_images: int = 0
    test_images: int = 0
    probe_images: int = 0  # N_probe: the communication probe's passes after training
    throughput_img_s: float = 0.0
    startup_s: float = 0.0
    slurm_runtime_min: int = 0
    jobs: int = 1  # Slurm jobs of the run: more than 1 past hardware.runtime_max (split_jobs)
    # the Slurm jobs training the run starts: `jobs`, but for a done run (jobs 1: the job that
    # measured it) those of training it again (a trainer update, -R)
    retrain_jobs: int = 1
    done: bool = False
    energy_j_per_img: float | None = None  # measured on comparable runs; None: not measured
    energy_basis: str = NOT_MEASURED  # or NOT_USED
    # the scaling model's 95% prediction interval of runtime_s (basis "model"); None otherwise
    runtime_lo_s: float | None = None
    runtime_hi_s: float | None = None
    interval_note: str = ""  # why a model estimate has no interval (model.Prediction.no_interval)
    # a model estimate beyond the measured runs (model.EXTRAPOLATED: world size on its kind of
    # link, ranks per node, bucket count, or a local batch outside the 1-rank runs')
    extrapolated: bool = False
    # why the run cannot go on past hardware.runtime_max in further jobs (split_jobs's
    # refusal), where it was priced unrefused (the proposal's runs on the machine): one job
    # past the limit, which the machine would not start; "" where it can run as priced
    cannot_split: str = ""

    @property
    def held_s(self) -> float:
        """Seconds its jobs hold their nodes: runtime_s, plus a start-up per resumption."""
        return self.runtime_s + (self.jobs - 1) * self.startup_s

    @property
    def node_hours(self) -> float:
        return self.nodes * self.held_s / 3600

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.held_s / 3600

    @property
    def energy_kwh(self) -> float | None:
        """GPU energy of the run's training: J/img x epochs x N_train / 3.6e6 (None unmeasured)."""
        if self.energy_j_per_img is None:
            return None
        return self.energy_j_per_img * self.epochs * self.train_images / J_PER_KWH

    @property
    def calibrated(self) -> bool:
        """Any part of it from measured runs: its throughput, or only its start-up (plan.py's
        `*` mark, `default +startup` saying which). Not a count of calibrated estimates: those
        count `throughput_calibrated` and, apart, `startup_only` (plan.md, the proposal)."""
        return self.throughput_calibrated or self.startup_basis != "default"

    @property
    def throughput_calibrated(self) -> bool:
        """Its throughput from measured runs (basis other than `default`): what plan.md and the
        proposal count as a calibrated estimate. Not a job the dry-run prices from its Slurm
        request (`requested`, plan.job_estimate) or that runs on the submitting host
        (`local`): those have no throughput at all."""
        return self.throughput_basis not in ("default", "requested", "local")

    @property
    def startup_only(self) -> bool:
        """The planner's default throughput, only the start-up from measured job wall times."""
        return self.calibrated and not self.throughput_calibrated


# ---------------------------------------------------------------------------------------------
# the model


def dataset_sizes(config: dict, row: dict) -> tuple[int, int]:
    """(training, test) images per epoch of a run: N_train and N_test of the module docstring."""
    n_train, n_test = prepared_sizes(config, row["dataset"])
    limit_train, limit_test = int(row["limit_train"]), int(row["limit_test"])
    if 0 < limit_train < n_train:
        n_train = limit_train
    if 0 < limit_test < n_test:
        n_test = limit_test
    world_size = int(float(row["world_size"]))
    step_images = world_size * int(float(row["local_batch"]))
    if row.get("loader") == "dataloader" and n_train < step_images:
        # one step of all n: DistributedSampler (drop_last) gives each rank floor(n / W)
        return n_train - n_train % world_size, n_test
    return trained_images(n_train, step_images), n_test


def measured_images(config: dict, row: dict) -> tuple[int, int]:
    """(training, test) images per epoch a measured runs.csv row trained and evaluated on: the
    trainer's counts (MEASURED_IMAGES), each where recorded, else the study's dataset_sizes (a
    runs.csv of an older trainer). Not the study's: synthetic.num_train or num_test may have
    changed since the run (its wall time then taken apart with the new size gave it a start-up
    of 47 s instead of 4 s, or of 0)."""
    planned = dataset_sizes(config, row)
    return tuple(  # type: ignore[return-value]
        int(row[k]) if files.count(1).holds(row.get(k)) else n
        for k, n in zip(MEASURED_IMAGES, planned, strict=True)
    )


def trained_images(n: int, step_images: int) -> int:
    """Of n training images, those an epoch trains on in steps of step_images (all ranks, one
    micro-step): the ragged tail is dropped, unless no full step fits (then one step takes all
    n). The trainer's rule (runs.epoch_micro_steps); a test holds it equal to the trainer's."""
    return n if n < step_images else epoch_micro_steps(n, step_images) * step_images


def efficiency(plan: dict, world_size: int, nodes: int) -> float:
    """Expected scaling efficiency eta(W): per-rank throughput at W relative to one rank."""
    if world_size <= 1:
        return 1.0
    return plan["efficiency_intra_node"] if nodes <= 1 else plan["efficiency_inter_node"]


def compute_seconds(
    epochs: int, n_train: int, n_test: int, throughput: float, plan: dict, n_probe: int = 0
):
    """Training plus per-epoch evaluation time at `throughput` images/s (all ranks), plus the
    communication probe's n_probe images after training."""
    evaluation = n_test / (throughput * plan["eval_speedup"])
    return epochs * (n_train / throughput + evaluation) + n_probe / throughput


def probe_images(world_size: int, local_batch: int, comm_probe_steps: int) -> int:
    """N_probe of the module docstring: 2 x (steps + 1) passes of W x local_batch images."""
    if world_size <= 1 or not comm_probe_steps:
        return 0  # off, or one rank, which synchronises nothing: trainer/loop.finish skips it
    return 2 * (comm_probe_steps + 1) * world_size * local_batch


def slurm_runtime_min(runtime_s: float, config: dict, warned: bool = True) -> int:
    """Slurm time limit (minutes) of a job estimated at runtime_s: the estimate times the safety
    factor, plus checkpointing's warning lead (the ranks get USR1 signal_lead_s before the
    limit, or up to SLURM_SIGNAL_EARLY_S earlier, and stop at their next epoch's end: without
    the lead a run within its safety margin would still be stopped and resubmitted), then the
    floor hardware.runtime_min. The warning never comes before runtime_s x safety_factor.
    warned False: a job that gets no warning (a profiling job: train's slurm_extra only)."""
    checkpointing = config["checkpointing"]
    # no checkpointing, no --signal (resources.slurm_extra): no warning to leave room for
    on = checkpointing["enabled"] and warned
    lead = checkpointing["signal_lead_s"] + SLURM_SIGNAL_EARLY_S if on else 0
    limit = math.ceil((runtime_s * config["plan"]["safety_factor"] + lead) / 60)
    return max(config["hardware"]["runtime_min"], limit)


def split_jobs(
    run: str,
    t_max: float,
    startup_s: float,
    epoch_s: float,
    limit: int,
    config: dict,
    refuse: bool = True,
) -> tuple[int, int, str]:
    """(jobs, time limit in minutes, "") of a training run whose one job would ask for `limit`
    minutes: (1, limit) within hardware.runtime_max M, else (jobs, M) with jobs of the module
    docstring (`epoch_s`: one epoch at T_max's rate). A PlanError, before any job, where the
    run cannot go on in further jobs: no checkpoints, a job of M minutes that its start-up and
    the USR1 lead fill, an epoch that would not end within the lead (the ranks stop at an
    epoch's end: such a job was killed at M with no checkpoint, every time), or too few
    checkpointing.retries. refuse False (the proposal's runs priced on the machine, not this
    study's jobs): (1, limit, the refusal's line) instead (Estimate.cannot_split)."""
    most = config["hardware"].get("runtime_max")
    if most is None or limit <= most:
        return 1, limit, ""
    checkpointing, safety = config["checkpointing"], config["plan"]["safety_factor"]
    past = f"run {run} needs a Slurm time limit of {limit} min, past hardware.runtime_max {most}"
    lead = checkpointing["signal_lead_s"] + SLURM_SIGNAL_EARLY_S
    # training seconds of one job before its warning, each resumption's start-up with the
    # safety factor too (a resumed run's start-up, its checkpoint's load, is never measured)
    per_job = most * 60 - lead - startup_s * safety
    jobs = math.ceil((t_max - startup_s) * safety / per_job) if per_job > 0 else 0
    if not checkpointing["enabled"]:
        problem = (
            "config key 'checkpointing.enabled': value false is not allowed: "
            f"{past}, and only a run that checkpoints goes on in another job; enable "
            "checkpointing, or shorten the run (fewer epochs, more GPUs)"
        )
    elif per_job <= 0:
        problem = (
            f"config key 'hardware.runtime_max': value {most} is not allowed: {past}, and a "
            f"job of {most} min holds no training: its start-up ({startup_s:.0f} s x "
            f"plan.safety_factor) and the USR1 warning's lead ({lead} s: "
            f"checkpointing.signal_lead_s + {SLURM_SIGNAL_EARLY_S}) fill it: at least "
            f"{math.floor((lead + startup_s * safety) / 60) + 1}, or a shorter "
            "checkpointing.signal_lead_s"
        )
    elif epoch_s * safety > checkpointing["signal_lead_s"]:
        need = math.ceil(epoch_s * safety)  # s: the lead that one epoch ends within
        stops = (
            f"{past}, so each of its jobs stops at the end of the epoch in progress at its USR1 "
            f"warning, and an epoch ({epoch_s:.0f} s x plan.safety_factor) would not end within "
            "the lead"
        )
        # s of a job that such a lead, Slurm's early minute and the start-up leave to training
        left = most * 60 - need - SLURM_SIGNAL_EARLY_S - startup_s * safety
        if need <= SIGNAL_LEAD_MAX_S and left > 0:
            problem = (
                f"config key 'checkpointing.signal_lead_s': value "
                f"{checkpointing['signal_lead_s']} is not allowed: {stops}: at least {need}, or "
                "shorter epochs (more GPUs)"
            )
        else:
            # a lead of an epoch would fill the job (then refused as holding no training) or
            # pass the schema's maximum: the epoch must fit in one job of its own
            why = (
                f"past its maximum {SIGNAL_LEAD_MAX_S}"
                if need > SIGNAL_LEAD_MAX_S
                else f"with Slurm's early {SLURM_SIGNAL_EARLY_S} s and the start-up "
                f"({startup_s:.0f} s x plan.safety_factor) leaves a job of {most} min no training"
            )
            # runtime_max's schema maximum is a year: past it only shorter epochs help
            one_job = (
                f"at least {limit} (the run in one job), or " if limit <= LONGEST_LIMIT_MIN else ""
            )
            problem = (
                f"config key 'hardware.runtime_max': value {most} is not allowed: {stops}; a "
                f"lead of {need} s (checkpointing.signal_lead_s) {why}: {one_job}shorter epochs "
                "(more GPUs)"
            )
    elif jobs - 1 > checkpointing["retries"]:
        problem = (
            f"config key 'checkpointing.retries': value {checkpointing['retries']} is not "
            f"allowed: {past}, so it runs as {jobs} jobs of {most} min, each after the first a "
            f"resubmission (a retry): at least {jobs - 1}, or shorten the run (fewer epochs, "
            "more GPUs)"
        )
    else:
        return jobs, most, ""
    if refuse:
        raise PlanError(problem)
    return 1, limit, problem


# ---------------------------------------------------------------------------------------------
# measured runs


def as_float(value) -> float | None:
    """A measured value as a float; None when it is missing or not a number (NaN, which a CSV
    cell "nan" reads as blank, and infinity: a nan J/img gave plan.csv a nan kWh)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _text(value) -> str:
    return str(value).strip().lower() if value is not None else ""


def run_base(row: dict) -> tuple:
    row = in_effect(row)  # a measured CPU run of compile auto is one of compile off
    shape = (
        vocab.DATASETS[row["dataset"]].shape if row.get("dataset") in vocab.DATASETS else "32x32x3"
    )
    # the DataLoader's worker processes feed its ranks (the device loader has none)
    workers = _text(row.get("num_workers")) if _text(row.get("loader")) == "dataloader" else ""
    return (*(_text(row.get(k)) for k in BASE_KEY), shape, workers)


def same_threads(config: dict, measured: dict) -> bool:
    """A measured run ran with the study's threads per rank (hardware.cpus_per_rank; the
    launch sets each rank's intra-op threads to it): 454 vs 590 img/s at 1 vs 2 on a CPU
    (docs/benchmarks.md). True where runs.csv does not record them (an older trainer's)."""
    threads = measured.get("threads_per_rank")
    if not files.count(1).holds(threads):
        return True
    return int(threads) == config["hardware"]["cpus_per_rank"]


def same_gpu(config: dict, measured: dict) -> bool:
    """A measured run ran on GPUs of the family hardware.gpu_type names (hardware.gpu_family:
    h100, a100_80g -> a100): every rank's (runs.csv device_names, else rank 0's device_name).
    True where gpu_type names no family of the table ("", a site's own name), on device cpu
    (which ignores gpu_type), for a run measured on no GPU (its CPU's name is no GPU's: the
    base's device leaves it out) and for a run that records no device name (an older
    trainer's)."""
    hw = config["hardware"]
    wanted = hardware.gpu_family(hw.get("gpu_type", "")) if hw["device"] == "cuda" else None
    names = _text(measured.get("device_names")) or _text(measured.get("device_name"))
    if wanted is None or not names or _text(measured.get("device")) not in ("cuda", ""):
        return True
    return {hardware.gpu_family(name) for name in names.split(";")} == {wanted}


def calibrating(config: dict, measured: list[dict]) -> list[dict]:
    """The measured runs that may calibrate the study's estimates: measured with its threads
    per rank (same_threads) on its GPU family (same_gpu)."""
    return [m for m in measured if same_threads(config, m) and same_gpu(config, m)]


def _level_key(level: str, row: dict) -> tuple:
    """What a measured row and a run must share at `level`. The node count is part of every
    level but precision's (which rescales by eta(W, nodes)): W ranks within one node and W
    across two are different runs (gpus_per_node changed, or --runs-csv from another cluster):
    the model prices such a run, extrapolated where no fitted run had its ranks per node or
    its width on its kind of link (model.Fit.beyond_fitted). The bucket cap is added to the
    batch and world-size levels' keys where they are looked up at the run's own cap (LOOKUP)."""
    w, lb, p = int(float(row["world_size"])), int(float(row["local_batch"])), row["precision"]
    nodes = int(float(row["nodes"]))
    if level == "run":
        return (row["run"].rsplit("_r", 1)[0], nodes)
    if level == "batch":
        return (p, w, lb, nodes)
    if level == "world size":
        return (p, w, nodes)
    return (p,)


def _filed_caps(level: str, row: dict) -> set[float | None]:
    """The caps a measured row is filed under at `level`: OTHER_CAP_LEVELS at its own cap and
    at any cap (None), the others at any cap alone (a blank cap is None: once, not twice)."""
    return {_cap(row), None} if level in OTHER_CAP_LEVELS else {None}


def _cap(row: dict) -> float | None:
    """A row's bucket_cap_mb as a number (runs.csv's text or the run table's), None where blank."""
    try:
        return float(row.get("bucket_cap_mb"))
    except (TypeError, ValueError):
        return None


def resumed(row: dict) -> bool:
    """The run was resumed from a checkpoint: Snakemake's wall time (benchmarks/train) is its
    last attempt's, which trained only the epochs after the checkpoint."""
    return (as_float(row.get("restarts")) or 0) > 0


def read_wall_seconds(path: Path) -> float | None:
    """Snakemake's benchmark file of a job: the `s` column of its first row (None if absent).

    A row whose `s` is missing, no number, not above 0 or infinite is refused: it would give
    the run a start-up overhead (wall_s minus the compute time) that no job had, and the plan's
    calibration check divides by it. The fix it names: the study's own file is deleted, its run
    then left out of the start-up calibration (Snakemake writes it only with the job, and never
    reruns a finished one for it: "writes it again with the job" read as a file that comes
    back); one of a --benchmarks given by hand is the user's to fix (files.input_fix's rule)."""
    if not path.is_file():
        return None
    if files.one_file(path.parent, BENCHMARKS_DIR):
        fix = (
            "delete it, and the run's job time is left out of the start-up calibration: "
            "Snakemake writes it again only when it trains the run again"
        )
    else:
        fix = f"fix it, or leave --benchmarks out to read the study's {BENCHMARKS_DIR}"
    # a file without a row, or without the `s` column, is refused as a bad `s` is: Snakemake
    # writes its header and a row (a 0-byte file, a copy cut short, was "not measured")
    header, rows = files.read_csv_table(path, PlanError, fix, delimiter="\t")
    if not rows or "s" not in header:
        what = "no `s` column" if header and "s" not in header else "no row"
        raise PlanError(
            f"{path} has {what}: it is not a Snakemake benchmark file (a header with `s`, the "
            f"wall time in seconds, and a row); {fix}"
        )
    seconds = rows[0].get("s")
    if not files.POSITIVE.holds(seconds):
        raise PlanError(
            f"{path}: the wall time `s` is {seconds!r}, not a number of seconds > 0; {fix}"
        )
    return float(seconds)


def add_measured_arguments(
    parser, runs_csv: str = RUNS_CSV, benchmarks: str = BENCHMARKS_DIR
) -> None:
    """--runs-csv and --benchmarks of the commands that calibrate with measured runs; their
    defaults as --help names them (the proposal's are --csv-dir's study's)."""
    # None: the study's own files, read when they exist (a study before its first run has
    # none). A path typed here must exist: a typo would otherwise give an uncalibrated
    # estimate that looks like a calibrated one.
    parser.add_argument(
        "--runs-csv", default=None, help=f"measured runs (default {runs_csv}, if it exists)"
    )
    parser.add_argument(
        "--benchmarks",
        default=None,
        help=f"Snakemake's job benchmarks (default {benchmarks}, if it exists)",
    )


def given_path(value: str | None, flag: str, default: str | Path, directory: bool = False) -> Path:
    """The path typed for `flag`, refused when it does not exist; `default` when none was typed."""
    if value is None:
        return Path(default)
    path = Path(value)
    want, other = ("directory", "file") if directory else ("file", "directory")
    if not (path.is_dir() if directory else path.is_file()):
        # one that exists is named as what it is ("no such directory" of a file misled; a
        # device, /dev/null, was "a directory")
        if not path.exists():
            what = f"no such {want}"
        elif path.is_file() if directory else path.is_dir():
            what = f"a {other}, not a {want}"
        else:
            what = f"not a {'directory' if directory else 'regular file'}"
        raise PlanError(
            f"{flag} {value}: {what}; give an existing {want}, or leave {flag} out to read the "
            f"study's own ({default}, where it exists)"
        )
    return path


def measured_paths(runs_csv: str | None, benchmarks: str | None) -> tuple[Path, Path]:
    """(runs.csv, benchmarks dir) from add_measured_arguments' values."""
    return (
        given_path(runs_csv, "--runs-csv", RUNS_CSV),
        given_path(benchmarks, "--benchmarks", BENCHMARKS_DIR, directory=True),
    )


def load_measured(
    runs_csv: str | Path = RUNS_CSV, benchmarks_dir: str | Path = BENCHMARKS_DIR
) -> list[dict]:
    """Rows of results/csv/runs.csv (none if it does not exist) with `wall_s` added from
    benchmarks/train/<run>.tsv (None when there is no benchmark file) and SOURCE, the file
    read (for on_measured's messages)."""
    path = Path(runs_csv)
    if not path.is_file():
        return []
    # the study's own is collect's to write again; a --runs-csv given by hand may be the user's
    fix = files.input_fix(path, RUNS_CSV, "--runs-csv")
    header, rows = files.read_csv_table(path, PlanError, fix)
    needed = {"run", "precision", "dataset", *BASE_KEY, *MEASURED_NUMBERS}
    # the header of a file without rows too: a 0-byte or foreign file passed for "no run
    # measured" (an uncalibrated estimate that looked like a calibrated one)
    if not header:
        raise PlanError(f"{path} is empty (not even a header): a copy cut short?; {fix}")
    if not needed <= set(header):
        raise PlanError(
            f"{path} lacks the columns {sorted(needed - set(header))}: it is not written by "
            f"this version of `scalestudy collect`; {fix}"
        )
    measured = []
    for row in rows:
        for column in MEASURED_NUMBERS:
            # counts whole (>= 1; the limits >= 0, 0 = all), throughputs finite
            if column.startswith("throughput"):
                rule = files.NUMBER
            else:
                rule = files.count(0 if column in MEASURED_ZERO else 1)
            if not rule.holds(row[column]):
                raise PlanError(
                    f"{path}, run {row['run']!r}: {column} is {row[column]!r}, not {rule.what}; "
                    f"{fix}"
                )
        if row["dataset"] not in vocab.DATASETS:
            raise PlanError(
                f"{path}, run {row['run']!r}: unknown dataset {row['dataset']!r}; {fix}"
            )
        if float(row["throughput_img_s_per_rank"]) <= 0:
            continue  # a run without a steady-state window calibrates nothing
        # what the calibration divides by, and the J/img it multiplies: a 0 was a
        # ZeroDivisionError traceback (in `snakemake -n` too), a -50 or a nan a silent estimate
        for column, rule in (
            ("throughput_img_s", files.POSITIVE),
            ("energy_j_per_img", files.POSITIVE.or_blank()),
            ("energy_wall_j_per_img", files.POSITIVE.or_blank()),
            *((column, files.count(1).or_blank()) for column in MEASURED_IMAGES),
            ("threads_per_rank", files.count(1).or_blank()),
        ):
            if column in row and not rule.holds(row[column]):
                raise PlanError(
                    f"{path}, run {row['run']!r}: {column} is {row[column]!r}, not {rule.what}; "
                    f"{fix}"
                )
        wall_s = read_wall_seconds(Path(benchmarks_dir) / f"{row['run']}.tsv")
        row = dict(row, wall_s=wall_s, **{SOURCE: str(path)})
        measured.append(row)
    return measured


def _startup_overhead(config: dict, row: dict) -> float | None:
    """wall_s minus the modelled compute time at the run's own measured throughput; None for a
    resumed run, whose wall time is its last attempt's (all its epochs subtracted, a negative
    start-up lowered every estimate and Slurm limit of its world size)."""
    if row.get("wall_s") is None or resumed(row):
        return None
    n_train, n_test = measured_images(config, row)
    throughput = float(row["throughput_img_s"])
    epochs = int(float(row["epochs"]))
    n_probe = probe_images(
        *(int(row[k]) for k in ("world_size", "local_batch", "comm_probe_steps"))
    )
    compute = compute_seconds(epochs, n_train, n_test, throughput, config["plan"], n_probe)
    return row["wall_s"] - compute


def on_measured(fn, rows: list[dict]):
    """study/model.py's fn (fit_study, holdout) over measured runs.csv rows; a cell it cannot
    read (AnalysisError) becomes the plan's one-line PlanError naming the file the rows came
    from (--runs-csv, not always the study's own)."""
    try:
        return fn(rows)
    except AnalysisError as exc:
        source = rows[0].get(SOURCE, RUNS_CSV) if rows else RUNS_CSV
        raise PlanError(f"{source}: {exc}") from None


def _at_nearest_batch(batches: dict[int, list[float]], local_batch: int) -> float:
    """The mean per-rank rate measured at the local batch nearest `local_batch` (in log2; the
    smaller on a tie), a larger one at its step time: a smaller batch takes no longer per step,
    and its rate is no more than that (a GPU's per-rank rate grows with its batch)."""
    nearest = min(batches, key=lambda m: (abs(math.log2(m / local_batch)), m))
    return statistics.fmean(batches[nearest]) * min(1.0, local_batch / nearest)


@dataclasses.dataclass
class Calibration:
    """Measured per-rank throughput and start-up per level, ready to look runs up in."""

    config: dict
    measured: list[dict]

    def __post_init__(self) -> None:
        plan = self.config["plan"]
        # a run measured with other threads per rank, or on another GPU, says nothing about
        # this study's speed
        self.measured = calibrating(self.config, self.measured)
        # (base, level, key) -> measured world size (world size's: measured local batch;
        # precision's: both) -> per-rank images/s (precision's: / eta)
        self._levels: dict[tuple, dict] = {}
        self._startup: dict[tuple, list[float]] = {}
        # (base, level, key, scope, cap) -> measured local batch -> (J/img, per-rank img/s) of
        # its runs (cap None: any cap, as _levels)
        self._energy: dict[tuple, dict[int, list[tuple[float, float]]]] = {}
        self._fits: dict[tuple, model.Fit | None] = {}  # per base, fitted when first asked
        for row in self.measured if plan["calibrate"] else []:
            base = run_base(row)
            per_img, scope = measured_energy_per_img(row)
            w, nodes = int(float(row["world_size"])), int(float(row["nodes"]))
            lb = int(float(row["local_batch"]))
            rate = float(row["throughput_img_s_per_rank"])  # > 0: a run without is left out
            for level in ENERGY_LEVELS if per_img is not None else ():
                for cap in _filed_caps(level, row):
                    key = (base, level, _level_key(level, row), scope, cap)
                    self._energy.setdefault(key, {}).setdefault(lb, []).append((per_img, rate))
            per_rank = float(row["throughput_img_s_per_rank"])
            for level in MEASURED_LEVELS:
                value = per_rank / efficiency(plan, w, nodes) if level == "precision" else per_rank
                inner = {"world size": lb, "precision": (w, lb)}.get(level, w)
                for cap in _filed_caps(level, row):
                    key = (base, level, _level_key(level, row), cap)
                    self._levels.setdefault(key, {}).setdefault(inner, []).append(value)
            overhead = _startup_overhead(self.config, row)
            if overhead is not None:
                self._startup.setdefault((base, w), []).append(overhead)
                self._startup.setdefault((base, None), []).append(overhead)

    def throughput_per_rank(self, row: dict) -> tuple[float, str, model.Prediction | None]:
        """(images/s per rank, basis, the model's prediction when the basis is the model)."""
        plan = self.config["plan"]
        eta = efficiency(plan, row["world_size"], row["nodes"])
        for level, cap in LOOKUP:
            if level == "model":
                if (pred := self.model_step(row)) is not None:
                    basis = "model, extrapolated" if pred.extrapolated else "model"
                    return row["local_batch"] / pred.step_s, basis, pred
                continue
            mine = _cap(row) if cap else None  # None: any cap (the levels' other key)
            sizes = self._levels.get((run_base(row), level, _level_key(level, row), mine))
            if cap and mine is None:  # no cap to look up: left to the any-cap pass
                sizes = None
            if level == "world size" and sizes:
                return _at_nearest_batch(sizes, row["local_batch"]), level, None
            if level == "precision" and sizes:
                w = row["world_size"]  # the nearest measured world size (the larger on a tie)
                nearest = min({m for m, _ in sizes}, key=lambda m: (abs(math.log2(m / w)), -m))
                batches = {lb: values for (m, lb), values in sizes.items() if m == nearest}
                return _at_nearest_batch(batches, row["local_batch"]) * eta, level, None
            if sizes:  # the run and batch levels, which hold one world size, W itself
                w = row["world_size"]
                nearest = min(sizes, key=lambda m: (abs(math.log2(m / w)), -m))
                return statistics.fmean(sizes[nearest]), level, None
        return plan["throughput_img_s_per_gpu"][row["precision"]] * eta, "default", None

    def model_step(self, row: dict) -> model.Prediction | None:
        """The scaling model's step time of the run (fitted to the measured runs of its base),
        or None where it has none: no fit, or the fit does not identify what the run needs."""
        fit = self.fit(row)
        # a fit that cannot describe its runs (multi-rank steps shorter than the 1-rank
        # compute: study/model.py, Fit.misfit) prices nothing
        if fit is None or fit.misfit or int(row.get("accum_steps", 1)) != 1:
            return None
        pred = fit.predict(
            row["world_size"], row["nodes"], row["local_batch"], row["precision"],
            float(row["bucket_cap_mb"]),
        )  # fmt: skip
        return pred if pred.step_s else None

    def fit(self, row: dict) -> model.Fit | None:
        base = run_base(row)
        if base not in self._fits:
            rows = [m for m in self.measured if run_base(m) == base]
            calibrate = rows and self.config["plan"]["calibrate"]
            self._fits[base] = on_measured(model.fit_study, rows) if calibrate else None
        return self._fits[base]

    def energy_per_image(
        self, row: dict, per_rank: float | None = None
    ) -> tuple[float | None, str]:
        """Mean measured J/img at the first level that has one, the training spans' before the
        wall spans' at each level (never mixed in one mean); at the world-size level, where the
        run's own batch has none, from the measured local batch nearest the run's (in log2, the
        smaller on a tie, as _at_nearest_batch): its measured power per rank (J/img x img/s,
        their mean) over the run's priced `per_rank` img/s, the run drawing that power for its
        throughput (a mean J/img over every batch, weighted by their repeats, priced a batch of
        4 at 1.575 J/img where the nearest measured, 8, had 0.3). The batch and world-size
        levels at the run's bucket cap first, then at any cap (ENERGY_LOOKUP), where the J/img
        is the measured power over the run's img/s too, and the basis says OTHER_CAP;
        (None, NOT_MEASURED) else, and (None, NOT_USED) with plan.calibrate false (no measured
        run read, measured or not)."""
        if not self.config["plan"]["calibrate"]:
            return None, NOT_USED
        lb = int(float(row["local_batch"]))
        for level, own_cap in ENERGY_LOOKUP:
            mine = _cap(row) if own_cap else None  # None: any cap
            if own_cap and mine is None:  # no cap to look up: left to the any-cap pass
                continue
            # the any-cap pass comes after the run's own cap had none: its runs are of others
            other = level in OTHER_CAP_LEVELS and not own_cap and _cap(row) is not None
            for scope in ("training", WITH_EVALUATION):
                key = (run_base(row), level, _level_key(level, row), scope, mine)
                if not (batches := self._energy.get(key)):
                    continue
                basis = level + (f", {OTHER_CAP}" if other else "")
                basis += "" if scope == "training" else f", {scope}"
                nearest = min(batches, key=lambda m: (abs(math.log2(m / lb)), m))
                if (nearest == lb and not other) or not per_rank:  # its own batch and cap
                    return statistics.fmean(j for j, _ in batches[nearest]), basis
                power = statistics.fmean(j * rate for j, rate in batches[nearest])
                return power / per_rank, basis
        return None, NOT_MEASURED

    def startup(self, row: dict) -> tuple[float, str]:
        for key, basis in (
            ((run_base(row), row["world_size"]), "world size"),
            ((run_base(row), None), "all"),
        ):
            values = self._startup.get(key)
            if values:
                return max(0.0, statistics.median(values)), basis
        return float(self.config["plan"]["startup_s"]), "default"


def estimate_run(
    config: dict, row: dict, calibration: Calibration, done: bool = False, refuse: bool = True
):
    """The Estimate of one run-table row; refuse: split_jobs's refusal raised (False: the
    proposal's runs, priced as one job where they cannot be split)."""
    per_rank, basis, pred = calibration.throughput_per_rank(row)
    startup, startup_basis = calibration.startup(row)
    per_img, energy_basis = calibration.energy_per_image(row, per_rank)
    n_train, n_test = dataset_sizes(config, row)
    n_probe = probe_images(row["world_size"], row["local_batch"], row["comm_probe_steps"])
    throughput = per_rank * row["world_size"]

    def seconds(x: float) -> float:  # T of the module docstring at x images/s
        return compute_seconds(row["epochs"], n_train, n_test, x, config["plan"], n_probe) + startup

    try:
        runtime = seconds(throughput)
        lo = hi = None
        if pred is not None and pred.lo_s is not None:
            lo, hi = (
                seconds(x)
                for x in (
                    row["global_batch"] / max(pred.lo_s, 1e-12),
                    row["global_batch"] / pred.hi_s,
                )
            )
        # the plan's own 95% upper end where it has one: the limit at T alone was below it
        t_max = max(runtime, hi or runtime)
        limit = slurm_runtime_min(t_max, config)
    except OverflowError:  # a 311-digit train.epochs in float arithmetic, ceil(inf) minutes
        raise _overflow(config, row, throughput, basis, (startup, startup_basis)) from None
    if not all(math.isfinite(t) for t in (runtime, lo or 0, hi or 0)):
        raise _overflow(config, row, throughput, basis, (startup, startup_basis))
    epoch_s = (t_max - startup) / max(1, row["epochs"])  # the probe's share too
    # a measured run takes no job in the plan (priced as the one job it was, never refused),
    # yet Snakemake trains it again after a trainer update, a deleted output or -R: its job
    # then asks for the limit a new run's gets (runtime_max where it can go on in further
    # jobs: retrain_jobs), not the one-job limit past the partition's MaxTime, which sbatch
    # refuses
    retrain_jobs, limit, cannot_split = split_jobs(
        row["run"], t_max, startup, epoch_s, limit, config, refuse and not done
    )
    if refuse and not done and limit > LONGEST_LIMIT_MIN:  # finite, but no sbatch takes it
        past = (
            f"a Slurm time limit of {short(limit)} min, more than a year ({LONGEST_LIMIT_MIN} min)"
        )
        raise _overflow(config, row, throughput, basis, (startup, startup_basis), past)
    jobs = 1 if done else retrain_jobs
    return Estimate(
        rule="train",
        run=row["run"],
        families=row["families"],
        nodes=row["nodes"],
        gpus=row["gpus"],
        runtime_s=runtime,
        throughput_basis=basis,
        startup_basis=startup_basis,
        world_size=row["world_size"],
        precision=row["precision"],
        local_batch=row["local_batch"],
        epochs=row["epochs"],
        train_images=n_train,
        test_images=n_test,
        probe_images=n_probe,
        throughput_img_s=throughput,
        startup_s=startup,
        slurm_runtime_min=limit,
        jobs=jobs,
        retrain_jobs=retrain_jobs,
        done=done,
        energy_j_per_img=per_img,
        energy_basis=energy_basis,
        runtime_lo_s=lo,
        runtime_hi_s=hi,
        interval_note="" if pred is None else pred.no_interval,
        extrapolated=basis == "model, extrapolated",
        cannot_split="" if done else cannot_split,  # a done run ran: it was one job
    )


def short(value) -> str:
    """A number for an error line: a 311-digit epochs is not printed whole."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 12 else f"a {len(text)}-digit number"


def _overflow(
    config: dict,
    row: dict,
    throughput: float,
    basis: str,
    startup: tuple[float, str],
    past: str = "",
):
    """The PlanError of a run whose runtime estimate or Slurm time limit is no finite number
    (it was an OverflowError traceback from the plan and from Snakemake's parse), or `past`, a
    finite limit no sbatch takes: the keys the estimate is made of, with their values, and
    where X came from."""
    plan, train = config["plan"], config["train"]
    if basis == "default":
        precision = row["precision"]
        source = (
            f"plan.throughput_img_s_per_gpu.{precision} "
            f"({short(plan['throughput_img_s_per_gpu'][precision])})"
        )
    else:
        source = f"the measured runs it is calibrated from ({basis}: {RUNS_CSV} or --runs-csv)"
    if basis in ("default", "precision") and row["world_size"] > 1:
        # x_rank = that rate x eta(W) (Calibration.throughput_per_rank): a tiny efficiency
        # makes X tiny whatever the per-GPU rate
        eta = "efficiency_intra_node" if row["nodes"] <= 1 else "efficiency_inter_node"
        source += f" x plan.{eta} ({short(plan[eta])})"
    seconds, startup_basis = startup
    name = "plan.startup_s" if startup_basis == "default" else f"start-up ({startup_basis})"
    what = (
        f"its runtime estimate at X = {throughput:g} images/s asks for {past}"
        if past
        else "its runtime estimate overflows (no finite number of seconds or Slurm minutes at "
        f"X = {throughput:g} images/s)"
    )
    runtime_max = ", or set hardware.runtime_max to the partition's MaxTime" if past else ""
    return PlanError(
        f"run {row['run']}: {what}: check train.epochs "
        f"({short(row['epochs'])}), train.comm_probe_steps ({short(train['comm_probe_steps'])}),"
        f" {name} ({short(float(seconds))}), plan.eval_speedup ({short(plan['eval_speedup'])}),"
        f" plan.safety_factor ({short(plan['safety_factor'])}) and X's {source}{runtime_max}"
    )


def estimate_runs(
    config: dict,
    rows: Iterable[dict],
    measured: list[dict],
    refuse: bool = True,
    new: bool = False,
) -> list[Estimate]:
    """Estimates of every run-table row, in table order; `done`: the run has a measurement;
    `refuse`: estimate_run's. `new`: every run is one still to train, whatever `measured`
    holds under its id (the proposal's production runs: their ids leave out the epochs, and a
    study on the whole data set measured runs of the same ids, which were priced as done: one
    job, without the jobs they go on in past hardware.runtime_max)."""
    calibration = Calibration(config, measured)
    rows = list(rows)
    done = [False] * len(rows) if new else runs_done(config, rows, measured)
    return [
        estimate_run(config, r, calibration, d, refuse) for r, d in zip(rows, done, strict=True)
    ]


def runs_done(config: dict, rows: list[dict], measured: list[dict]) -> list[bool]:
    """is_done of every run-table row, in table order, against its run's row in `measured`."""
    finished = {m["run"]: m for m in measured}
    return [is_done(config, r, finished.get(r["run"])) for r in rows]


def is_done(config: dict, row: dict, measured: dict | None) -> bool:
    """The run has a measurement made with this configuration: the same run id is not enough
    (run ids leave out dataset, epochs, lr, ...; a changed config reruns it under the same id),
    nor are the run-table columns (synthetic.num_train and num_test and hardware.cpus_per_rank
    are in none: the images per epoch it trained and evaluated on and its threads per rank
    must be the study's, where runs.csv records them)."""
    if measured is None:
        return False
    columns = [c for c in RUN_COLUMNS if c not in ("run", "families") and c in measured]
    if not all(same(measured[c], row[c]) for c in columns) or not same_threads(config, measured):
        return False
    return measured_images(config, measured) == dataset_sizes(config, row)


def calibration_check(config: dict, measured: list[dict]) -> list[dict]:
    """Each measured run with a wall time, made with this configuration (is_done) on the
    study's GPU family (same_gpu) and not resumed (its wall time would be one attempt's),
    estimated two ways against Snakemake's
    measured job wall time: calibrated on all measured runs (what the plan says a repeat of it
    costs), and leave-one-out, from the measured runs of the *other* configurations only, its
    own repeats left out too (how well the plan predicts a configuration it has not measured).
    error = estimate / measured - 1."""
    rows = {r["run"]: r for r in build_run_table(config)}
    everything = Calibration(config, measured)
    out = []
    for m in measured:
        if m.get("wall_s") is None or m["run"] not in rows:
            continue
        if not is_done(config, rows[m["run"]], m) or resumed(m) or not same_gpu(config, m):
            continue
        # done: a finished run takes no job, and is never refused (split_jobs)
        est = estimate_run(config, rows[m["run"]], everything, done=True)
        mine = _level_key("run", m)
        others = Calibration(config, [o for o in measured if _level_key("run", o) != mine])
        loo = estimate_run(config, rows[m["run"]], others, done=True)
        out.append(
            {
                "run": m["run"],
                "measured_s": m["wall_s"],
                "estimate_s": est.runtime_s,
                "error": est.runtime_s / m["wall_s"] - 1,
                "loo_estimate_s": loo.runtime_s,
                "loo_error": loo.runtime_s / m["wall_s"] - 1,
                "loo_basis": loo.throughput_basis,
            }
        )
    return out
