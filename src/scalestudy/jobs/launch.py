"""`scalestudy launch`: start the ranks of one run, the same way locally and on Slurm.

Inside a Slurm allocation (SLURM_JOB_ID is set; Snakemake's slurm executor keeps it in the job's
shell) it execs
    <mpi> --nodes=N --ntasks=N*K --ntasks-per-node=K --cpus-per-task=C [--gres=gpu:K] \
        --kill-on-bad-exit=1 --disable-status [apptainer exec --nv IMAGE] \
        python -m scalestudy train ...
one rank per GPU (or per CPU slot), every rank finding its place from SLURM_* (dist.py), a run of
one rank too: `sbatch --signal=USR1@lead` (without `B:`) signals the job's steps only, so every
rank must be a task of a step to get the preemption warning. The workflow's launch rules always
have an `mpi` resource ("" for one rank), and snakemake-executor-plugin-slurm-jobstep 0.6.1 runs
a job with that key in the batch shell itself (no `srun -n1` wrapper, which it puts around jobs
without the key): this launcher's srun is the step. Already inside a step (SLURM_STEP_ID: e.g. a
rule without the key, `srun scalestudy launch` by hand, or snakemake run in `srun --pty bash`)
one rank starts directly, since a nested srun would wait forever for the CPUs that step holds,
and more ranks are refused in one line for the same reason, as is one rank in a step of several
tasks (`srun --pty bash` in `salloc -n 2`), where it would read the step's SLURM_NTASKS.
salloc's shell in the job's interactive step (LaunchParameters=use_interactive_step) is no such
step: it holds nothing, and runs start with srun there as in salloc's shell on the submit host
(vocab.slurm_step).
Inside an array task it refuses to run: the plugin submits every task of an array with the
first job's nodes, GPUs and time limit.
Outside Slurm it runs torchrun on this host (`--standalone`: a free rendezvous port), which only
works for N = 1; a multi-node run without Slurm is refused with a pointer to the Slurm profile.
torchrun's agent runs in `python -m scalestudy.jobs.local_ranks`, which ends the run as the
rest of scalestudy does: Ctrl-C is rank 0's one line (then killed by SIGINT), a failed rank one
line and that rank's exit status (a stop's 75 too, a SIGTERM to the launch itself included),
where torchrun printed its own traceback and exited 1.
srun is given --cpus-per-task because srun stopped inheriting it from sbatch in Slurm 22.05, and
--kill-on-bad-exit so a crashed rank ends the job instead of leaving the others in a collective;
a CUDA run's step gets --gres=gpu:K, its ranks' GPUs on each node, since a step that names none
gets all of the job's (man srun): runs started at once in one `salloc` shared its first GPU.
And --disable-status: srun's answer to one SIGINT was a status line ("one more within 1 sec to
abort") and nothing for the ranks, which trained on: a Ctrl-C in salloc's shell reaches srun
alone (the ranks run on the nodes), and `scalestudy profile` passes a stop on to its launch
once. Now it is sent on to the ranks, whose end is rank 0's one `interrupted` line.

Every argument is passed as an argv list (never through a shell), and the command is printed
(shell-quoted) first, so the log shows exactly what ran.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import LaunchError, TrainConfigError
from scalestudy.jobs import local_ranks
from scalestudy.jobs.gpu_slots import held_files as gpu_slot_files
from scalestudy.jobs.gpu_slots import step_refusal, visible_gpus
from scalestudy.jobs.gpu_slots import take as take_gpu_slots
from scalestudy.trainer.config import TrainConfig, flag_name

logger = log.get(__name__)

# Thread pools a rank's libraries size from the environment (OpenMP, MKL, OpenBLAS, ...).
# Snakemake's shell sets every one of them to the rule's `threads`, the cores of all ranks
# together; a rank given that many MKL threads oversubscribes the node and, since MKL's
# reductions depend on its thread count, trains to different numbers than the same run started
# by hand or by torchrun (seen: the Slurm preemption test). Each rank gets its own cores.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


# one node's ranks without Slurm: torchrun (its arguments, agent and rendezvous) in a process
# whose end is one line and the ranks' exit status, 75 included (jobs/local_ranks.py); torchrun
# itself ended Ctrl-C, a failed rank and a stop in its own traceback and exit 1
LOCAL_RANKS = local_ranks.__name__


# an env:// launcher's per-rank variables: the launch's own launcher (srun, torchrun) says
# where each rank stands; a caller's (a shell inside a torchrun job, a notebook) reached the
# ranks, and the trainer (dist.detect) takes them before SLURM_PROCID: one rank waited for a
# second that never came, and srun's tasks, each told RANK 0 of 1, trained as 1-rank runs into
# one --out. MASTER_ADDR and MASTER_PORT stay: they are overrides a user sets on purpose.
CALLER_RANK_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)


# ... and a torchrun worker's agent variables (TORCHELASTIC_USE_AGENT_STORE=True in every shell
# inside a torchrun job): rank 0 of the launch connected to an agent's store no one ran, as a
# client, and the run hung until its process-group timeout. The launch's torchrun sets its own
CALLER_AGENT_PREFIX = "TORCHELASTIC_"


def rank_env(env: dict[str, str], cpus_per_rank: int) -> dict[str, str]:
    """`env` with every THREAD_VARS variable set to the cores of one rank, without a caller's
    CALLER_RANK_VARS and TORCHELASTIC_* variables."""
    kept = {
        k: v
        for k, v in env.items()
        if k not in CALLER_RANK_VARS and not k.startswith(CALLER_AGENT_PREFIX)
    }
    return {**kept, **dict.fromkeys(THREAD_VARS, str(cpus_per_rank))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mpi", default="srun", help="MPI-style launcher inside Slurm (srun)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the run")
    parser.add_argument("--ranks-per-node", type=int, default=1, help="ranks (GPUs) per node")
    parser.add_argument(
        "--cpus-per-rank",
        type=int,
        default=1,
        help="CPU cores per rank; also OMP_NUM_THREADS (intra-op threads)",
    )
    parser.add_argument(
        "--container",
        default=None,
        help="Apptainer image: run each rank in `apptainer exec IMAGE` (--nv with --gpu)",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="with --container: pass --nv to apptainer (the host's NVIDIA driver and GPUs "
        "inside the image; a --device cuda run in a container needs it)",
    )
    parser.add_argument(
        "--rank-prefix",
        default=None,
        help="command (one shell-quoted string) every rank runs the trainer under, e.g. the "
        "profiler wrapper `python -m scalestudy profile rank ... --` (jobs/profile.py)",
    )
    parser.add_argument(
        "--inventory",
        default=None,
        metavar="OUT",
        help="write the system inventory of the run's allocation (`scalestudy inventory`) to "
        "this JSON file before the ranks start; with --container the image is read once for "
        "both (its digest)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument(
        "train_args", nargs=argparse.REMAINDER, help="-- then the flags of `scalestudy train`"
    )


def refuse_array_task(env: dict[str, str]) -> None:
    """A LaunchError inside a Slurm array task: snakemake-executor-plugin-slurm's array mode
    (`slurm-array-jobs`) submits all tasks of an array with the first job's nodes, GPUs and time
    limit, so every other run would train on a layout that is not its own."""
    if "SLURM_ARRAY_TASK_ID" in env:
        raise LaunchError(
            f"this run was started as task {env['SLURM_ARRAY_TASK_ID']} of Slurm array job "
            f"{env.get('SLURM_ARRAY_JOB_ID', '?')}, which has the first run's nodes, GPUs and "
            "time limit: take train, profile_capture, profile_ncu and `all` out of the Slurm "
            "executor's --slurm-array-jobs (slurm-array-jobs: in the profile)"
        )


def rank_prefix(text: str | None) -> list[str]:
    """--rank-prefix as argv (a LaunchError where the shell quoting is broken)."""
    try:
        return shlex.split(text) if text else []
    except ValueError as exc:  # "No closing quotation"
        raise LaunchError(f"--rank-prefix {text!r}: {exc} (one shell-quoted string)") from None


def check_train_args(train_args: list[str]) -> TrainConfig:
    """The trainer's own flag checks (trainer/config.py) before any rank starts: with several
    local ranks a bad flag was each rank's one line under torchrun's 40-line failure report.
    The flags as the trainer reads them, which is how launch reads them too: its parser also
    takes `--dev cuda` and `--data-d DIR`, which a look for `--device` missed."""
    try:
        return TrainConfig.from_argv(trainer_flags(train_args))
    except TrainConfigError as exc:  # one line, exit 2
        raise LaunchError(f"the trainer's flags after --: {exc}") from None


def trainer_flags(train_args: list[str]) -> list[str]:
    """The flags after launch's own: argparse's REMAINDER keeps the `--` that separates them."""
    return train_args[1:] if train_args[:1] == ["--"] else list(train_args)


def build_command(args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    train_args = trainer_flags(args.train_args)
    for name in ("nodes", "ranks_per_node", "cpus_per_rank"):
        if getattr(args, name) < 1:
            raise LaunchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    # a per-rank wrapper (the profiler, jobs/profile.py) goes inside the container, so nsys/ncu
    # run in the image's namespace with the trainer as their child; wrapped around `apptainer
    # exec` from outside they may trace nothing
    prefix = rank_prefix(getattr(args, "rank_prefix", None))
    if args.gpu and not args.container:  # it was ignored: the run was not in a container at all
        raise LaunchError("--gpu passes --nv to apptainer: it needs --container IMAGE")
    config = check_train_args(args.train_args)  # as the trainer reads them
    if args.container and not args.gpu and train_device(config, env) == "cuda":
        # each rank then failed at start-up (torch.cuda.is_available() is False without --nv),
        # or with --device auto trained on the CPU of a GPU machine
        raise LaunchError(
            f"--device {config.device} in a container needs --gpu (apptainer --nv: the GPUs "
            f"inside){'' if config.device == 'cuda' else ', or --device cpu'}"
        )
    python = [*prefix, sys.executable]
    if args.container:
        # the image's own python; its digest goes into metrics.json (container_digest)
        from scalestudy.jobs.container_exec import exec_prefix, image_digest

        own_binds, real_paths = container_paths(config, Path.cwd())
        # the wrapper's, then the trainer's: each directory once
        binds = list(dict.fromkeys([*getattr(args, "container_binds", ()), *own_binds]))
        # hashed once (a multi-GB .sif on a shared file system), kept for run's --inventory
        if not getattr(args, "container_digest", None):
            args.container_digest = image_digest(args.container)
        digest = args.container_digest
        python = [*exec_prefix(args.container, gpu=args.gpu, binds=binds, digest=digest)]
        python += [*prefix, "python"]
        train_args = [*train_args, *real_paths]  # the last of a flag wins (argparse)
    refuse_array_task(env)
    one_rank = args.nodes * args.ranks_per_node == 1
    step = vocab.slurm_step(env)  # salloc's interactive step is none: srun works there
    # a task of an srun step: one rank as its one task, no more (the onstart refuses alike)
    if refusal := step_refusal(args.nodes * args.ranks_per_node, env):
        raise LaunchError(refusal)
    if one_rank and (not env.get("SLURM_JOB_ID") or step):
        # one rank outside Slurm, or already the one task of a job step (the module docstring)
        return [*python, "-m", "scalestudy", "train", *train_args]
    if env.get("SLURM_JOB_ID"):
        mpi = args.mpi or "srun"  # a 1-rank job's `mpi` resource is "" (see the docstring)
        if shutil.which(mpi, path=env.get("PATH")) is None:
            raise LaunchError(f"inside Slurm job {env['SLURM_JOB_ID']} but {mpi!r} is not on PATH")
        if config.device == "auto" and not visible_gpus(env):
            # auto is decided here, the ranks run on the job's nodes: in salloc's shell on a
            # submit host without GPUs a GPU job's step asked for no --gres (runs at once all
            # trained on its first GPU) and a container run was not given --nv
            raise LaunchError(
                f"--device auto is decided on this host, which shows no GPU, but srun starts "
                f"the ranks on the nodes of Slurm job {env['SLURM_JOB_ID']}: pass --device cuda "
                "(the job's GPUs) or --device cpu"
            )
        # a step that names no --gres gets every GPU of the job (man srun): in salloc's shell
        # (the local executor) runs at once all trained on its first GPU. Under the Slurm
        # executor a job's --gres is the run's own GPUs per node, so this asks for no other
        gres = [f"--gres=gpu:{args.ranks_per_node}"] if train_device(config, env) == "cuda" else []
        return [
            mpi,
            f"--nodes={args.nodes}",
            # srun takes SLURM_NTASKS (`salloc -n`, `sbatch -n`) as --ntasks, which wins over
            # --ntasks-per-node: in `salloc -n1 -c2` a 2-rank run trained as 1 rank
            f"--ntasks={args.nodes * args.ranks_per_node}",
            f"--ntasks-per-node={args.ranks_per_node}",
            f"--cpus-per-task={args.cpus_per_rank}",
            *gres,
            "--kill-on-bad-exit=1",
            "--disable-status",  # one SIGINT reaches the ranks (the module docstring)
            *python,
            "-m",
            "scalestudy",
            "train",
            *train_args,
        ]
    if args.nodes > 1:
        raise LaunchError(
            f"this run needs {args.nodes} nodes, and there is no Slurm allocation here: run the "
            "study on a cluster (`snakemake --executor slurm -j 20` or --profile profiles/slurm), "
            "or choose world sizes <= hardware.gpus_per_node for a single machine"
        )
    if prefix:  # torchrun starts the wrapper itself, which starts python
        return [
            sys.executable,
            "-m",
            LOCAL_RANKS,
            "--standalone",
            f"--nproc-per-node={args.ranks_per_node}",
            "--no-python",
            *python,
            "-m",
            "scalestudy",
            "train",
            *train_args,
        ]
    return [
        *python,
        "-m",
        LOCAL_RANKS,
        "--standalone",
        f"--nproc-per-node={args.ranks_per_node}",
        "-m",
        "scalestudy",
        "train",
        *train_args,
    ]


def train_device(config: TrainConfig, env: dict[str, str]) -> str:
    """The device the ranks train on: --device, where auto (the default) is cuda when this
    machine shows a GPU, as the trainer decides it (torch.cuda.is_available())."""
    if config.device != "auto":
        return config.device
    return "cuda" if visible_gpus(env) else "cpu"


# the trainer's directories (TrainConfig fields), which a rank in the container must see at the
# host's path
PATH_FLAGS = ("data_dir", "checkpoint_dir", "out")


def container_paths(config: TrainConfig, cwd: Path) -> tuple[list[str], list[str]]:
    """(binds, flags): host directories to bind into the container at their own path, and the
    trainer's flags that give it the real path where that is not the path as written. For each
    path of
    PATH_FLAGS outside the working directory `cwd`, its nearest existing directory (the trainer
    makes its checkpoint and output directories). Apptainer binds only $HOME, the working
    directory and /tmp by default; a cluster's /scratch, where config/README.md tells users to
    put data and checkpoints, is inside the image only where the site binds it, and without it
    every rank found no data or could not write its checkpoints.
    A relative path is taken against `cwd` first: Apptainer binds the working directory at its
    own path and starts the ranks in it, so inside the image `../shared/data` is the host's
    `cwd/../shared/data`, which is outside cwd and needs its bind as an absolute path does (it
    was skipped: only absolute paths were looked at).
    "Outside" is judged by the real path (os.path.realpath, symlinks resolved, of the path and
    of `cwd`): inside the image a symlink still points where it does on the host, so
    `results/data -> /scratch/me/data` needs /scratch/me/data bound (it was judged by the path
    as written, inside cwd, and got no bind). The real path is what is bound, and what the
    trainer is given where a symlink is on the way (`/scratch -> /gpfs/scratch`, a cluster's
    usual): inside the image neither /scratch nor a link's target there exists, and every rank
    found no data at /scratch/me/data, bound at /gpfs/scratch/me/data."""
    binds: list[str] = []
    flags: list[str] = []
    for name in PATH_FLAGS:
        flag, value = f"--{flag_name(name)}", getattr(config, name)
        if not value:
            continue
        there = bind_of(f"{flag} {value}", cwd / value, cwd)
        if there is None:  # inside the working directory
            continue
        # an absolute value stays itself; realpath resolves the symlinks of the part that exists
        if (path := os.path.realpath(cwd / value)) != os.path.abspath(cwd / value):
            flags += [flag, path]
        if there not in binds:
            binds.append(there)
    return binds, flags


def bind_of(what: str, path: str | os.PathLike, cwd: Path) -> str | None:
    """The directory to bind into the container for `path` (`what` names it in errors): its
    real path's nearest existing directory, or None inside the working directory (Apptainer
    binds that itself); see container_paths."""
    real = Path(os.path.realpath(cwd / path))
    if real.is_relative_to(os.path.realpath(cwd)):
        return None
    there = next(p for p in (real, *real.parents) if p.is_dir())
    if there == Path("/") and real != there:
        raise LaunchError(
            f"{what}: none of its directories exists, so there is nothing to bind into the "
            "container: make the directory first (or check the path)"
        )
    if str(there) in files.SYSTEM_DIRS:
        # bound, the host's /opt hid the image's (its Python: every rank "executable file not
        # found"), as a directory to be made in it would
        raise LaunchError(
            f"{what}: its nearest existing directory is the system directory {there}, which "
            "cannot be bound into the container (it would hide the image's own): make the "
            "directory first, or choose one outside the system directories"
        )
    if files.unbindable(there):
        raise LaunchError(
            f"{what}: Apptainer's --bind cannot name {there} (':' and ',' separate its "
            "fields): choose a directory without them"
        )
    return str(there)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if inventory_out := getattr(args, "inventory", None):  # the image replaced by its JSON
        files.check_distinct({"--inventory": inventory_out}, {"--container": args.container},
                             LaunchError)  # fmt: skip
    # a LaunchError (the trainer's flags checked too): one line from cli.main, exit 2
    cmd = build_command(args, env)
    # intra-op threads per rank = the cores Slurm (or the config) gave it
    env = rank_env(env, args.cpus_per_rank)
    logger.info("+ " + shlex.join(cmd))
    if args.dry_run:
        return 0
    # the --rank-prefix program too: with 2+ local ranks it is torchrun's to start (cmd[0] is
    # python), and its absence was torchrun's 60-line traceback. In the container the image's
    # PATH finds it, which cannot be looked at from here.
    prefix = [] if args.container else rank_prefix(args.rank_prefix)[:1]
    needed = [*prefix, cmd[0], *(["apptainer"] if args.container else [])]
    for program in needed:  # else os.exec's "No such file or directory", or each rank's
        if shutil.which(program, path=env.get("PATH")) is None:
            why = ""
            if program in prefix:
                why = f" (the program of --rank-prefix {args.rank_prefix!r})"
            elif program == "apptainer":
                why = " (--container runs each rank in the image: `module load apptainer`)"
            raise LaunchError(f"{program} is not on PATH{why}")
    if inventory_out:  # the rule train's record of the allocation: where the ranks run
        from scalestudy.jobs import inventory

        if args.container:  # its digest as hashed for the command: not read again
            os.environ[vocab.CONTAINER_DIGEST_ENV] = args.container_digest
        inventory.write_for_job(inventory_out)
    hold_local_gpus(env, args.nodes * args.ranks_per_node, args.train_args)
    os.execvpe(cmd[0], cmd, env)


def hold_local_gpus(env: dict[str, str], ranks: int, train_args: list[str]) -> None:
    """Outside Slurm, a CUDA run's ranks (train_device: --device auto too, the default, where
    the machine shows a GPU) get `ranks` GPU slots of this machine, held by this process and
    what it execs or starts until it ends, and named in env's CUDA_VISIBLE_DEVICES: nothing
    else keeps two runs off one GPU (jobs/gpu_slots.py). Every command that starts ranks takes
    them: `launch`, and the profiling jobs, which run beside training jobs (a profile on a
    timed run's GPU slowed both). Each rank holds them too: env's SCALESTUDY_GPU_SLOT_LOCKS
    names the lock files (torchrun's ranks inherit no descriptor). Inside a Slurm job, srun
    gives each run's step its own GPUs (build_command's --gres); a run started directly in a
    step (one rank in `srun --pty bash`) takes slots of that step's GPUs, as outside Slurm:
    every such run trained on the step's first GPU."""
    env.pop(vocab.GPU_SLOT_LOCKS_ENV, None)  # none held here: a caller's is not ours
    started_here = not env.get("SLURM_JOB_ID") or vocab.slurm_step(env)  # not by our srun
    if started_here and train_device(check_train_args(train_args), env) == "cuda":
        gpus, keys = take_gpu_slots(ranks, env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # as the study names them (CUDA's order)
        env[vocab.GPU_SLOT_LOCKS_ENV] = gpu_slot_files(env, keys)
