"""`TrainConfig`: every flag of `scalestudy train`, typed, documented and checked in one place.

The argparse parser is built from the dataclass fields (one flag per field, `--local-batch` for
`local_batch`), so the flags, their defaults, the checks and metrics.json's copy of the flags
cannot drift apart.

Learning-rate rule: `lr` is the peak learning rate for a global batch of 512 images; the run uses
`lr * global_batch / 512` (the linear scaling rule of Goyal et al. 2017, "Accurate, Large Minibatch
SGD"), reached after `warmup_epochs` of linear warm-up, which that rule needs at large batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from scalestudy import vocab
from scalestudy.errors import TrainConfigError

# --checkpoint-every, --checkpoint-keep and --checkpoint-async where --checkpoint-dir is given and
# they are not
CHECKPOINT_DEFAULTS = {"checkpoint_every": 1, "checkpoint_keep": 2, "checkpoint_async": True}
LR_REFERENCE_BATCH = 512  # images; `lr` is quoted for this global batch
# PowerSGD's uncompressed steps before it compresses (torch's warm-start advice). Its state (this
# step count, the error feedback, the warm-start factors) is not checkpointed: every segment of a
# resumed run starts it anew, and each segment's throughput window opens after these steps
# (measure.Meter, window_warmup_steps), which would otherwise time plain all-reduces as
# PowerSGD's. Here, torch-free, so that the study checks a config against it before any job.
POWERSGD_START_ITER = 10
# --cuda-graphs step (step_graph.py): the eager steps before the capture (DDP rebuilds its buckets
# after its first iteration and must have run 11 before a capture: torch's CUDA graphs notes,
# "Usage with DistributedDataParallel"), and the optimizer steps before the throughput window can
# open: those and the capture's step. Here, torch-free, so that the study checks a config against
# it before any job (study/runs.py run_problems), as the trainer does (compiling.graphs_mode).
STEP_GRAPH_WARM_STEPS = 11
STEPS_BEFORE_WINDOW = STEP_GRAPH_WARM_STEPS + 1
SEED_MAX = 2**63 - 1  # torch.manual_seed takes a signed 64-bit integer
# the study schema's bounds (workflow/schemas/config.schema.yaml), so a flag past them is one
# line naming it, not a cryptic failure at the rendezvous or a traceback in DDP: gloo refused
# --pg-timeout-s 1e13 ("Invalid timeout"), timedelta overflowed at 1e14, 0.0004 s timed out the
# rendezvous itself; DDP's Reducer refused --bucket-cap-mb 1e30 (TypeError)
PG_TIMEOUT_S = (1, 604_800)  # a week
BUCKET_CAP_MB = (0.001, 1_000_000)  # 1 KiB to 1 TiB
# a diagnostic sleep per micro-batch: an hour is past any use; inf or 1e300 ms overflowed
# time.sleep in the first step
DIAG_DELAY_MAX_MS = 3_600_000
# the study schema's bound of train.epochs and train.warmup_epochs: 1e308 warm-up epochs
# overflowed recipe.warmup_steps (an OverflowError traceback in every training job)
WARMUP_EPOCHS_MAX = 100_000
# the study schema's bound of train.num_workers: a node's cores per GPU are far fewer, and 100000
# forked DataLoader workers ran until the job was killed
NUM_WORKERS_MAX = 64
# fields that do not define the experiment: where files go, how the run survives failures (the
# checkpoints, the process-group timeout: raising it for a rerun must not discard the rerun's
# checkpoints), what it shows while it runs
NOT_IDENTITY = (
    "out",
    "tensorboard",
    "data_dir",
    "expect_train",
    "expect_test",
    "pg_timeout_s",
    "checkpoint_dir",
    "checkpoint_every",
    "checkpoint_keep",
    "checkpoint_async",
    # a threshold read off the run's history, not a training setting (the workflow passes none:
    # collect computes time_to_target_s from epochs.csv, study/runs.py)
    "target_acc",
)


def _f(default: Any, help: str, choices: tuple | None = None, shown: Any = None) -> Any:
    """A field; `shown` is the default --help prints when it is not `default` itself."""
    shown = default if shown is None else shown
    return field(default=default, metadata={"help": help, "choices": choices, "shown": shown})


@dataclass(kw_only=True)
class TrainConfig:
    # data
    dataset: str = _f("cifar10", "prepared dataset name", tuple(vocab.DATASETS))
    data_dir: str = _f("results/data", "directory given to `scalestudy prepare-data --data-dir`")
    limit_train: int = _f(0, "use only the first N training images (0 = all)")
    limit_test: int = _f(0, "evaluate on the first N test images (0 = all)")
    # the workflow's launch rules pass the study's sizes: Snakemake's params trigger does not see
    # a data.pt prepared by hand (no metadata), which the runs then trained on whatever it held
    expect_train: int = _f(0, "training images the prepared set must hold (0 = not checked)")
    expect_test: int = _f(0, "test images the prepared set must hold (0 = not checked)")
    loader: str = _f("device", "input pipeline", vocab.LOADERS)
    num_workers: int = _f(4, "DataLoader worker processes per rank (--loader dataloader)")
    pin_memory: bool = _f(True, "DataLoader pin_memory (--loader dataloader)")
    persistent_workers: bool = _f(True, "keep DataLoader workers between epochs")
    prefetch_factor: int = _f(2, "batches prefetched per DataLoader worker")
    # model and numerics
    model: str = _f("resnet18", "network", vocab.MODELS)
    width: int = _f(64, "base channel count (resnet18: 64 -> 11,173,962 parameters)")
    precision: str = _f("fp32", "arithmetic", vocab.PRECISIONS)
    compile: str = _f(
        "auto", "torch.compile the model (auto = on for CUDA, off on CPU)", vocab.SWITCHES
    )
    cuda_graphs: str = _f(
        "auto",
        "CUDA graphs: step = the whole training step as one graph (NCCL, not fp16), on = "
        "torch.compile mode reduce-overhead, auto = step where it fits on CUDA (ddp or allreduce, "
        "no comm hook, no gradient accumulation, no --profile-steps), else on when compiled if "
        "the step could take a graph but not the whole-step one (fp16, gloo, --profile-steps, a "
        "run too short), off otherwise (fsdp, a comm hook, accumulation, CPU)",
        vocab.CUDA_GRAPHS,
    )
    channels_last: str = _f("auto", "NHWC memory format (auto = on for CUDA)", vocab.SWITCHES)
    # parallelism
    strategy: str = _f("ddp", "gradient synchronisation", vocab.STRATEGIES)
    bucket_cap_mb: float = _f(25.0, "DDP: MiB of gradients per all-reduce bucket")
    comm_hook: str = _f("none", "DDP communication hook", vocab.COMM_HOOKS)
    static_graph: bool = _f(True, "DDP static_graph (the graph is the same every step)")
    pg_timeout_s: float = _f(600.0, "process-group timeout in seconds: a dead rank fails the job")
    device: str = _f("auto", "auto = CUDA when available, else CPU", vocab.DEVICES)
    backend: str = _f(
        "auto", "process-group backend: auto = nccl on CUDA, gloo on CPU", vocab.BACKENDS
    )
    # optimisation recipe
    local_batch: int = _f(256, "images per rank per micro-step")
    global_batch: int = _f(0, "images per optimizer step over all ranks; 0 = derive from local")
    accum_steps: int = _f(1, "micro-steps accumulated (under no_sync) per optimizer step")
    epochs: int = _f(10, "passes over the training set")
    lr: float = _f(0.4, "peak learning rate for a global batch of 512, scaled linearly")
    momentum: float = _f(0.9, "SGD Nesterov momentum")
    weight_decay: float = _f(5e-4, "L2 weight decay")
    label_smoothing: float = _f(0.1, "cross-entropy label smoothing")
    schedule: str = _f("onecycle", "LR schedule after warm-up", vocab.SCHEDULES)
    warmup_epochs: float = _f(1.0, "epochs of linear LR warm-up")
    clip_grad: float = _f(0.0, "clip the gradient norm to this value (0 = off)")
    seed: int = _f(0, "seed of initialisation, data order and augmentation")
    target_acc: float | None = _f(None, "validation accuracy (0-1) for time_to_target_s")
    # measurement
    warmup_steps: int = _f(
        5,
        "optimizer steps excluded from the throughput window (at least "
        f"{POWERSGD_START_ITER} under --comm-hook powersgd, 12 under the whole-step CUDA "
        "graph: metrics.json window_warmup_steps)",
    )
    comm_probe_steps: int = _f(5, "steps per arm of the exposed-communication probe (0 = off)")
    profile_steps: str | None = _f(
        None,
        "A:B profiles optimizer steps A..B-1 (nsys range / torch.profiler); B at most the run's "
        "optimizer steps",
    )
    # diagnostics: a known cause of lost efficiency injected on purpose, for the tests of the
    # efficiency-loss waterfall and for a user checking how a cause shows in it; off by default,
    # never in a study, recorded in metrics.json under their own names (train.py)
    diag_slow_rank: str | None = _f(
        None,
        "diagnostic, not for measurements: R:MS makes rank R sleep MS ms inside the forward "
        "phase of every training micro-batch (an imbalance between ranks)",
    )
    diag_data_delay_ms: float = _f(
        0.0,
        "diagnostic, not for measurements: every rank sleeps this many ms inside the data phase "
        "of every training micro-batch (a throttled input)",
    )
    sync_debug: bool = _f(
        False,
        "diagnostic: count the host synchronisations inside the window's steps (CUDA only: "
        "torch.cuda.set_sync_debug_mode) into metrics.json host_syncs_in_window",
    )
    out: str = _f("results/runs/manual", "output directory (metrics.json, epochs.csv)")
    tensorboard: bool = _f(
        True, "TensorBoard scalars per epoch in --out/tensorboard (when tensorboard is installed)"
    )
    # fault tolerance (checkpoint.py): how a run survives, not what it measures
    # '' = checkpointing turned off by the caller: the workflow with `checkpointing.enabled:
    # false` passes --checkpoint-dir= and its every/keep settings all the same
    checkpoint_dir: str | None = _f(
        None,
        "checkpoint directory; a restart resumes from its newest valid checkpoint ('' = none, "
        "and the other --checkpoint-* flags are then checked and dropped)",
    )
    # None = not given: 1 and 2 with --checkpoint-dir; given without it, refused (no default
    # that a user could type is silently ignored)
    checkpoint_every: int | None = _f(
        None,
        "epochs between checkpoints, with --checkpoint-dir (0 = only on SIGTERM/SIGUSR1/SIGHUP)",
        shown=f"{CHECKPOINT_DEFAULTS['checkpoint_every']} with --checkpoint-dir",
    )
    checkpoint_keep: int | None = _f(
        None,
        "newest checkpoints kept, with --checkpoint-dir",
        shown=f"{CHECKPOINT_DEFAULTS['checkpoint_keep']} with --checkpoint-dir",
    )
    checkpoint_async: bool | None = _f(
        None,
        "write checkpoints in a background thread, with --checkpoint-dir",
        shown="on with --checkpoint-dir",
    )

    def __post_init__(self) -> None:
        self._checkpoint_defaults()
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            # argparse's float() takes "nan" and "inf", and no bound below fails for NaN
            if isinstance(value, float) and not math.isfinite(value):
                raise TrainConfigError(
                    f"--{flag_name(f.name)} must be a finite number, got {value}"
                )
            if choices and value not in choices:
                raise TrainConfigError(
                    f"--{flag_name(f.name)}: {value!r} is not one of {list(choices)}"
                )
        positive = ("width", "local_batch", "accum_steps", "epochs", "prefetch_factor")
        for name in positive:
            if getattr(self, name) < 1:
                raise TrainConfigError(
                    f"--{flag_name(name)} must be >= 1, got {getattr(self, name)}"
                )
        non_negative = (
            "limit_train",
            "limit_test",
            "expect_train",
            "expect_test",
            "num_workers",
            "global_batch",
            "warmup_steps",
            "comm_probe_steps",
            "clip_grad",
            "warmup_epochs",
            "weight_decay",
            "checkpoint_every",  # None: not given (no --checkpoint-dir)
            "diag_data_delay_ms",
        )
        for name in non_negative:
            if (getattr(self, name) or 0) < 0:
                raise TrainConfigError(
                    f"--{flag_name(name)} must be >= 0, got {getattr(self, name)}"
                )
        for name in ("out", "data_dir"):  # "" would be the current directory, silently
            if not getattr(self, name).strip():
                raise TrainConfigError(f"--{flag_name(name)} must not be empty")
        if self.checkpoint_dir and not self.checkpoint_dir.strip():  # a directory named "  "
            raise TrainConfigError(
                f"--checkpoint-dir {self.checkpoint_dir!r} is blank: give a directory, or '' "
                "for no checkpoints"
            )
        if not 0 <= self.seed <= SEED_MAX:  # torch.manual_seed overflowed past it, traceback
            raise TrainConfigError(f"--seed must be in [0, 2**63 - 1], got {self.seed}")
        if self.checkpoint_keep is not None and self.checkpoint_keep < 1:
            raise TrainConfigError(f"--checkpoint-keep must be >= 1, got {self.checkpoint_keep}")
        if not BUCKET_CAP_MB[0] <= self.bucket_cap_mb <= BUCKET_CAP_MB[1]:
            raise TrainConfigError(
                f"--bucket-cap-mb must be in [{BUCKET_CAP_MB[0]}, {BUCKET_CAP_MB[1]}] MiB "
                f"(1 KiB to 1 TiB), got {self.bucket_cap_mb}"
            )
        if not PG_TIMEOUT_S[0] <= self.pg_timeout_s <= PG_TIMEOUT_S[1]:
            raise TrainConfigError(
                f"--pg-timeout-s must be in [{PG_TIMEOUT_S[0]}, {PG_TIMEOUT_S[1]}] s (a week), "
                f"got {self.pg_timeout_s}"
            )
        if self.warmup_epochs > WARMUP_EPOCHS_MAX:  # >= 0 and finite: checked above
            raise TrainConfigError(
                f"--warmup-epochs must be <= {WARMUP_EPOCHS_MAX} (train.epochs' bound), got "
                f"{self.warmup_epochs:g}"
            )
        if self.num_workers > NUM_WORKERS_MAX:  # >= 0: checked above
            raise TrainConfigError(
                f"--num-workers must be <= {NUM_WORKERS_MAX} (train.num_workers' bound: "
                f"DataLoader processes per rank), got {self.num_workers}"
            )
        if self.diag_data_delay_ms > DIAG_DELAY_MAX_MS:  # >= 0 and finite: checked above
            raise TrainConfigError(
                f"--diag-data-delay-ms must be in [0, {DIAG_DELAY_MAX_MS}] ms (an hour), got "
                f"{self.diag_data_delay_ms}"
            )
        # the study schema's bounds (config.schema.yaml): torch.optim.SGD refuses lr < 0 and
        # momentum < 0 only once the model is built, with a traceback; lr 0 trains nothing
        if self.lr <= 0:
            raise TrainConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise TrainConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
        if not 0 <= self.label_smoothing < 1:
            raise TrainConfigError(
                f"--label-smoothing must be in [0, 1), got {self.label_smoothing}"
            )
        if self.target_acc is not None and not 0 < self.target_acc <= 1:
            raise TrainConfigError(f"--target-acc is a fraction in (0, 1], got {self.target_acc}")
        if self.comm_hook != "none" and self.strategy != "ddp":
            raise TrainConfigError(
                f"--comm-hook {self.comm_hook} needs --strategy ddp (DDP comm hooks)"
            )
        if self.comm_hook == "powersgd" and self.precision == "fp16":
            # an fp16 step whose gradients overflow (GradScaler skips it; its scale doubling
            # makes one every few thousand steps) leaves inf/NaN in PowerSGD's error feedback:
            # every later gradient is NaN, every step skipped, the loss finite, no error
            raise TrainConfigError(
                "--comm-hook powersgd with --precision fp16: one overflowed fp16 step leaves "
                "inf/NaN in PowerSGD's error feedback and every later step is skipped (training "
                "frozen, silently); use --precision bf16 (no loss scaling) or another --comm-hook"
            )
        if self.cuda_graphs == "on" and self.compile == "off":
            raise TrainConfigError(
                "--cuda-graphs records torch.compile's graphs: it needs --compile auto or on, "
                "not off"
            )
        if self.cuda_graphs == "step" and (why := self.step_graph_misfit()):
            raise TrainConfigError(
                f"--cuda-graphs step records the whole step as one CUDA graph: not with {why}; "
                "use --cuda-graphs on or auto"
            )
        if self.profile_steps is not None:
            self.profile_window()  # raises on a malformed window
        if self.diag_slow_rank is not None:
            self.slow_rank()  # raises on a malformed R:MS
        if self.checkpoint_dir == "":  # off, said so: checked above, recorded as not in use
            for name in CHECKPOINT_DEFAULTS:
                setattr(self, name, None)

    def _checkpoint_defaults(self) -> None:
        """--checkpoint-every/-keep/-async: refused without --checkpoint-dir (a setting that
        would do nothing), CHECKPOINT_DEFAULTS where a directory is given and they are not.
        With --checkpoint-dir= ('' = off) they stay as given until checked, then are dropped
        (__post_init__'s end)."""
        for name, default in CHECKPOINT_DEFAULTS.items():
            given = getattr(self, name)
            if self.checkpoint_dir is None and given is not None:
                # a switch is named as typed: --checkpoint-async or --no-checkpoint-async
                typed = (
                    f"--{'' if given else 'no-'}{flag_name(name)}"
                    if isinstance(given, bool)
                    else f"--{flag_name(name)} {given}"
                )
                raise TrainConfigError(
                    f"{typed} needs --checkpoint-dir: without it no checkpoint is written"
                )
            if self.checkpoint_dir and given is None:
                setattr(self, name, default)

    def step_graph_misfit(self) -> str | None:
        """None when the whole training step can be one CUDA graph (--cuda-graphs step,
        step_graph.py), else why not: --cuda-graphs step is refused and auto does not pick it."""
        if self.strategy not in ("ddp", "allreduce"):
            return f"strategy {self.strategy} (FSDP2's hooks run Python between the layers)"
        if self.precision == "fp16":
            return "precision fp16 (the GradScaler's skipped steps are unproven in a graph)"
        if self.accum_steps != 1:
            return f"accum_steps {self.accum_steps} (several forwards per optimizer step)"
        if self.comm_hook != "none":
            return f"comm_hook {self.comm_hook} (the hook keeps Python state between steps)"
        if self.backend == "gloo":
            return "backend gloo (its all-reduce runs on the CPU, outside any CUDA graph)"
        if self.diag_slow_rank or self.diag_data_delay_ms:
            return "a diagnostic delay (a sleep on the host, not in a graph)"
        if self.profile_steps is not None:
            # the profile's phase breakdown reads the NVTX/record_function ranges the loop
            # opens on the host; a replay runs none of that host code
            return "a --profile-steps window (a graph replay emits no phase ranges)"
        return None

    def window_warmup_steps(self) -> int:
        """Optimizer steps before a segment's throughput window opens: --warmup-steps, at least
        POWERSGD_START_ITER under --comm-hook powersgd (under --cuda-graphs step the Meter
        waits for the captured step too: STEPS_BEFORE_WINDOW, known on CUDA only)."""
        if self.comm_hook == "powersgd":
            return max(self.warmup_steps, POWERSGD_START_ITER)
        return self.warmup_steps

    def profile_window(self) -> tuple[int, int] | None:
        """--profile-steps A:B -> (A, B), the half-open range of optimizer steps profiled."""
        if self.profile_steps is None:
            return None
        a, sep, b = self.profile_steps.partition(":")
        # ASCII digits: isdigit() took '²' and int() raised its ValueError, a traceback
        digits = all(part.isascii() and part.isdigit() for part in (a, b))
        if not (sep and digits and int(a) < int(b)):
            raise TrainConfigError(
                f"--profile-steps must be A:B with integers 0 <= A < B, got {self.profile_steps!r}"
            )
        return int(a), int(b)

    def slow_rank(self) -> tuple[int, float] | None:
        """--diag-slow-rank R:MS -> (R, MS): the rank that sleeps and its ms per micro-batch."""
        if self.diag_slow_rank is None:
            return None
        r, sep, ms = self.diag_slow_rank.partition(":")
        try:
            rank, delay = int(r), float(ms)
        except ValueError:
            rank, delay = -1, -1.0
        if not (sep and rank >= 0 and 0 < delay <= DIAG_DELAY_MAX_MS):  # NaN fails it too
            raise TrainConfigError(
                "--diag-slow-rank must be R:MS with a rank R >= 0 and 0 < MS <= "
                f"{DIAG_DELAY_MAX_MS} milliseconds (an hour), got {self.diag_slow_rank!r}"
            )
        return rank, delay

    def batches(self, world_size: int) -> tuple[int, int]:
        """(local_batch, global_batch) for this world size; a global batch must split evenly."""
        if self.global_batch:
            split = world_size * self.accum_steps
            if self.global_batch % split:
                raise TrainConfigError(
                    f"--global-batch {self.global_batch} does not split over world_size "
                    f"{world_size} x accum_steps {self.accum_steps} = {split} ranks x micro-steps"
                )
            return self.global_batch // split, self.global_batch
        return self.local_batch, self.local_batch * world_size * self.accum_steps

    def config_hash(self) -> str:
        """Hash of what defines the experiment (not NOT_IDENTITY): equal hash, equal experiment."""
        d = dataclasses.asdict(self)
        for key in NOT_IDENTITY:
            d.pop(key)
        # --global-batch makes --local-batch ignored (batches): hashed, it gave one run two hashes
        if self.global_batch:
            d.pop("local_batch")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_argv(cls, argv: list[str]) -> TrainConfig:
        """What `scalestudy train` makes of its flags (argv; the last of a repeated flag wins),
        checked as it checks them, before any process starts: `scalestudy launch` and the
        study's run table use it. An unknown flag or value (argparse's refusal) and a failed
        check are both a TrainConfigError, one line that names the flag."""
        return cls.from_args(_refusing_parser().parse_args(argv))


def given_fields(argv: list[str]) -> set[str]:
    """The TrainConfig fields that `argv` sets, as `scalestudy train` reads its flags (an
    abbreviated one too: `--prec` is --precision); argv is checked by from_argv first. argparse
    leaves a value already in the namespace alone unless its flag is given."""
    unset = object()
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    given = argparse.Namespace(**dict.fromkeys(names, unset))
    _refusing_parser().parse_known_args(argv, namespace=given)
    return {name for name in names if getattr(given, name) is not unset}


class _RefusingParser(argparse.ArgumentParser):
    """argparse's refusals raised, not printed with the usage and exit 2."""

    def error(self, message: str):
        raise TrainConfigError(f"{message} (scalestudy train --help)")


@functools.cache
def _refusing_parser() -> _RefusingParser:
    """`scalestudy train`'s parser, built once: the study checks every run's flags at each
    Snakemake start (75 runs of the paper study: 0.22 s with a parser per run)."""
    parser = _RefusingParser(prog="scalestudy train", add_help=False)
    add_arguments(parser)
    return parser


def flag_name(name: str) -> str:
    """The `scalestudy train` flag of a TrainConfig field (no leading dashes): local_batch ->
    local-batch."""
    return name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(TrainConfig):
        flag, meta = f"--{flag_name(f.name)}", f.metadata
        if isinstance(f.default, bool) or f.type == "bool | None":
            # argparse (3.11.7+) adds no "(default: ...)" to a BooleanOptionalAction: on/off here
            if isinstance(f.default, bool):
                shown = f" (default: {'on' if f.default else 'off'})"
            else:
                shown = f" (default: {meta['shown']})"
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=meta["help"] + shown,
            )
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        if f.type == "float | None":
            kind = float
        # a switch alone means on: `--compile` = `--compile on`, `--cuda-graphs` = `... on`
        switch = meta.get("choices") in (vocab.SWITCHES, vocab.CUDA_GRAPHS)
        bare = {"nargs": "?", "const": "on"} if switch else {}
        parser.add_argument(
            flag,
            type=kind,
            default=f.default,
            choices=meta.get("choices"),
            help=f"{meta['help']} (default: {meta['shown']})",
            **bare,
        )
