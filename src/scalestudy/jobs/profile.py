"""`scalestudy profile ...`: profiling jobs, separate from the timed runs.

    scalestudy profile capture --run R --tool auto|nsys|torch --device cuda|cpu --ranks all|0 \\
        --out results/profile/R/capture --inventory results/system/profile/R.json \\
        --nodes N --ranks-per-node K --cpus-per-rank C [--container IMG --gpu] -- <train flags>
    scalestudy profile parse --capture DIR --run R --out-kernels K.csv [--out-ranges R.csv]
    scalestudy profile parse --nsys-stats CSV|DIR --run R --out-kernels K.csv [--out-ranges R.csv]
    scalestudy profile parse --ncu CSV|DIR --run R --out-ncu N.csv
    scalestudy profile ncu-kernels --kernels K.csv --out results/profile/R/ncu_kernels.json
    scalestudy profile ncu --run R --kernels results/profile/R/ncu_kernels.json --top-k 5 \\
        --launch-skip S --launch-count C --out-dir results/profile/R/ncu --enabled auto|true \\
        ... -- <train flags>
    scalestudy profile rank --tool nsys|ncu --ranks all|0 --dir DIR [...] -- CMD...
    scalestudy profile merge --schema kernels|ranges|ncu --out X.csv [--run R]... IN.csv...

capture: the tool is chosen here, on the compute node, and stated in DIR/tool.json and the log:
  auto -> nsys when the run is on CUDA and `nsys` is on PATH, else torch.profiler (on the GPU when
  there is one: SCALESTUDY_PROFILER=torch). An explicit nsys where nsys or CUDA is missing is an
  error. nsys: every rank (or rank 0) runs under
      nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop \\
          --trace=<nsys_trace> --cuda-graph-trace=node --output=DIR/nsys_rank<r> ...
  (the trainer's --profile-steps A:B opens and closes the range: capture and ncu refuse train
  flags without it before any rank starts, since the whole run would train for nothing), then
      nsys stats --report cuda_gpu_kern_sum --report cuda_gpu_mem_time_sum --report nvtx_sum \\
          --format csv --force-export=true --sqlite DIR/stats/nsys_rank<r>.sqlite \\
          --output DIR/stats/nsys_rank<r> DIR/nsys_rank<r>.nsys-rep
  (before 2023.1: gpukernsum, gpumemtimesum, nvtxsum). The phases' GPU time is read from that
  SQLite export (nsight/nsys.py export_phases), not from nsys's nvtx_gpu_proj_sum, which counts
  only the launches of a range's own thread and so misses most of the backward (autograd
  launches it from its own thread: nsight/projection.py). The trainer's own outputs go to
  DIR/train/, never to results/runs/, so no profiling overhead reaches the throughput figures.
  tool.json also records the world size and --ranks: a capture (and a later parse) that lacks
  a profiled rank's output fails, rather than sum over the ranks that are there.
  The ranks' launch (capture's, and each ncu pass's) runs in a session of its own: a stop
  signal to this process (Ctrl-C, SIGTERM, SIGHUP) is passed on to it and waited for, a second
  one kills it and its ranks (run_launch; then one line and 128 + N, run); killed with this
  process, the ranks trained on. Before and after the launch (the GPU-slot wait, the inventory,
  `nsys stats`, `ncu --import`) a stop signal is cli.py's: the tool is killed, the atomic
  writes' temp files are removed, one line and death by the signal (no handler there, the job
  died on the spot and the tool ran on, orphaned, without its TOOL_TIMEOUT_S).
In the container (--container IMG): the profiler runs inside the image, around the trainer:
      apptainer exec --nv --bind <install> IMG python -m scalestudy profile rank \\
          --profiler <install>/bin/nsys ... -- python -m scalestudy train ...
  with the host's installation bound at its own path (profiler_install says why the host's);
  an nsys wrapped around `apptainer exec` from outside may trace nothing.
ncu-kernels: the kernels table -> the kernels ncu may profile (filters): jobs/ncu_kernels.py.
ncu: Nsight Compute on the run's top-K kernels, rank 0 only: jobs/profile_ncu.py.
parse, merge: profiler output -> the profile CSVs, and the runs' CSVs -> one: jobs/profile_parse.py.
  Four modules, one command line (this one's): each job's code input is the module of its
  action and what that imports (workflow/rules/profile.smk), so an edit to the parsers reruns
  the cheap parse of every capture and ncu directory, never the capture (a training window on
  every GPU) or ncu (a run per kernel) itself.
rank: the per-rank wrapper the launcher starts instead of the trainer (rank from SLURM_PROCID or
  RANK): it execs the profiler around CMD on the profiled ranks and CMD alone on the others.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import ProfileError
from scalestudy.jobs import launch, supervise
from scalestudy.nsight import readers

logger = log.get(__name__)

NSYS_TRACE = vocab.NSYS_TRACE
NSYS_REPORTS_NEW = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "nvtx_sum")
NSYS_REPORTS_OLD = ("gpukernsum", "gpumemtimesum", "nvtxsum")
# ---------------------------------------------------------------------------------------------
# pure command construction (unit-tested; the cluster runs exactly these)


# the study config keys (workflow/schemas/config.schema.yaml) the profiling jobs' flags come from:
# their messages name these, the keys a user sets (tests check each resolves in the schema)
TOOL_KEY = "profiling.tool"
NCU_KEY = "profiling.ncu.enabled"


def choose_tool(requested: str, device: str, nsys_path: str | None) -> tuple[str, str]:
    """(tool, why): nsys or torch. Explicit nsys without nsys or without CUDA is an error."""
    if requested == "torch":
        return "torch", f"{TOOL_KEY} is torch"
    if requested == "nsys":
        if device != "cuda":
            raise ProfileError(
                f"{TOOL_KEY} is nsys but this study runs on CPU (hardware.device: cpu); "
                f"Nsight Systems profiles GPUs: use {TOOL_KEY} auto or torch"
            )
        if nsys_path is None:
            raise ProfileError(
                f"{TOOL_KEY} is nsys but `nsys` is not on PATH on this node: load the Nsight "
                f"Systems module (e.g. `module load nsight-systems`) or use {TOOL_KEY} auto"
            )
        return "nsys", f"{TOOL_KEY} is nsys ({nsys_path})"
    if device != "cuda":
        return "torch", "auto: no GPU (hardware.device: cpu), torch.profiler over the same window"
    if nsys_path is None:
        return "torch", "auto: `nsys` not on PATH, torch.profiler (CPU + CUDA) over the same window"
    return "nsys", f"auto: CUDA and {nsys_path}"


def rank_from_env(env: dict[str, str]) -> int:
    """The rank as the trainer reads it (dist.py): RANK (torchrun's, one per node inside an
    allocation too) before SLURM_PROCID (srun's)."""
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 0


def profiler_install(exe: str) -> tuple[str, str]:
    """(the profiler's real path, its installation directory) for binding the host's nsys/ncu
    into the image at the same path: .../nsight-systems/<v>/bin/nsys (or target-linux-x64/nsys)
    -> .../nsight-systems/<v>, .../nsight-compute/<v>/ncu -> .../nsight-compute/<v>,
    <cuda>/bin/ncu -> <cuda> (the tools reach their parts through paths relative to themselves,
    so the whole directory goes in and the real path means the same file inside as outside).

    Why the host's and not one installed in the image: nsys and ncu must support the host's
    driver, and the cluster's profiler module is the one kept in step with it; ncu's access to
    the GPU performance counters is a host setting in any case; and the image stays small."""
    real = os.path.realpath(exe)
    parent = Path(real).parent
    root = parent.parent if parent.name == "bin" or parent.name.startswith("target-") else parent
    if str(root) in files.SYSTEM_DIRS:
        raise ProfileError(
            f"{exe} is installed in the system directory {root}, which cannot be bound into the "
            "container (it would hide the image's own): use a standalone Nsight installation "
            "(NVIDIA's .run/.deb into /opt/nvidia/..., or the cluster's module)"
        )
    return real, str(root)


def nsys_profile_command(
    output_base: str, trace: str, cmd: list[str], exe: str = "nsys"
) -> list[str]:
    return [
        exe,
        "profile",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        f"--trace={trace}",
        # kernels inside CUDA graphs one by one (the trainer replays its compiled graphs as CUDA
        # graphs by default, compiling.py); nsys's default, graph, records each replay as one
        # item and the kernel tables would lack the step's kernels
        "--cuda-graph-trace=node",
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=true",
        f"--output={output_base}",
        *cmd,
    ]


def nsys_version(text: str) -> tuple[int, int] | None:
    """'NVIDIA Nsight Systems version 2023.4.1.97-...' -> (2023, 4)."""
    m = re.search(r"(\d{4})\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nsys_stats_command(
    report: str, output_base: str, version: tuple[int, int] | None, sqlite: str
) -> list[str]:
    """`nsys stats` of the kernel and NVTX tables, exporting the report to `sqlite` first: the
    export is what the phases' GPU time is read from (nsight/nsys.py export_phases)."""
    names = NSYS_REPORTS_OLD if version is not None and version < (2023, 1) else NSYS_REPORTS_NEW
    argv = ["nsys", "stats"]
    for name in names:
        argv += ["--report", name]
    return [
        *argv,
        "--format",
        "csv",
        "--force-export=true",
        "--sqlite",
        sqlite,
        "--output",
        output_base,
        report,
    ]


def ncu_argv(
    output_base: str,
    cmd: list[str],
    exe: str = "ncu",
    *,
    name_base: str,
    kernel_regex: str,
    metrics: str,
    skip: int,
    count: int,
) -> list[str]:
    """ncu around `cmd`, profiling `count` launches of the kernels that `kernel_regex` matches
    (after `skip` of them) with the full set and `metrics`; the ncu job chooses the filter
    (jobs/profile_ncu.py kernel_options), `profile rank` runs this on rank 0."""
    return [
        exe,
        "--profile-from-start",
        "off",
        # ncu locks the GPU clocks to their base frequency by default (--clock-control base),
        # for repeatable counters; the timed runs run at the clocks the GPU boosts to, so
        # durations under locked clocks would disagree with them. none: the clocks as they are.
        "--clock-control",
        "none",
        "--set",
        "full",
        "--metrics",
        metrics,
        "--kernel-name-base",
        name_base,
        "--kernel-name",
        f"regex:{kernel_regex}",
        "--launch-skip",
        str(skip),
        "--launch-count",
        str(count),
        "--target-processes",
        "all",
        "--force-overwrite",
        "--export",
        output_base,
        *cmd,
    ]


def rank_command(args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    """What one rank runs: the profiler around CMD when this rank is profiled, else CMD."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ProfileError("no command after --")
    rank = rank_from_env(env)
    if args.ranks == "0" and rank != 0:
        return cmd
    exe = getattr(args, "profiler", None) or args.tool
    if args.tool == "nsys":
        return nsys_profile_command(f"{args.dir}/nsys_rank{rank}", args.trace, cmd, exe)
    return ncu_argv(
        f"{args.dir}/ncu_k{args.index}",
        cmd,
        exe,
        name_base=args.name_base,
        kernel_regex=args.kernel_regex,
        metrics=args.metrics,
        skip=args.skip,
        count=args.count,
    )


def rank_prefix(*, python: str = sys.executable, **options: str) -> str:
    """The `<python> -m scalestudy profile rank ... --` prefix for `scalestudy launch
    --rank-prefix`; python is the image's `python` when the ranks run in the container."""
    argv = [python, "-m", "scalestudy", "profile", "rank"]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join([*argv, "--"])


def hash_image_once(args: argparse.Namespace) -> None:
    """args.container_digest: the image's sha256, read once for every command of this job (the
    inventory, each ncu pass): a multi-GB .sif on a shared file system was read whole again for
    each of them, inside the job's time limit."""
    if args.container and not getattr(args, "container_digest", None):
        from scalestudy.jobs.container_exec import image_digest

        args.container_digest = image_digest(args.container)


def launch_command(
    args: argparse.Namespace, prefix: str | None, binds: list[str] | None = None
) -> list[str]:
    """The ranks' command: with a container, `apptainer exec [--bind B] IMAGE <prefix> python -m
    scalestudy train ...` (the profiler inside the image, around the trainer), else
    `<prefix> python -m scalestudy train ...`."""
    ns = argparse.Namespace(
        mpi=args.mpi,
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        cpus_per_rank=args.cpus_per_rank,
        container=args.container,
        container_digest=getattr(args, "container_digest", None),
        gpu=args.gpu,
        rank_prefix=prefix,
        container_binds=binds or [],
        train_args=list(args.train_args),
    )
    return launch.build_command(ns, dict(os.environ))


def wrapper_dir(args: argparse.Namespace, out: Path) -> Path:
    """The directory the per-rank wrapper writes the profiler's reports to, as the ranks see
    it: in the container its real path, as the trainer's --out is given (launch.
    container_paths binds only the real path: through `/scratch -> /gpfs/scratch` the path as
    written does not exist in the image)."""
    return Path(os.path.realpath(out)) if args.container else out


def wrapper_options(
    args: argparse.Namespace, exe: str, out: Path | None = None
) -> tuple[dict, list[str]]:
    """(rank_prefix keywords, container binds) that run the profiler `exe` on each rank: in the
    container (the image's python runs the wrapper, the host's installation bound in at its own
    path) when there is one, else on the host. `out`: the directory the wrapper writes the
    reports to, bound too where it is outside the working directory: the trainer's --out
    (out/train) was the only bind, and where a by-hand rerun found out/train left over, the
    reports went to a directory the host never saw ("nsys wrote no report")."""
    if not args.container:
        return {"profiler": exe}, []
    real, root = profiler_install(exe)
    binds = [root]
    if out is not None and (there := launch.bind_of(f"--out {out}", out, Path.cwd())):
        binds.append(there)
    return {"python": "python", "profiler": real}, binds


# ---------------------------------------------------------------------------------------------
# running


# seconds a tool's post-processing may take (`nsys stats` with its SQLite export of one rank's
# report, `ncu --import` of one kernel's): minutes for a large report; beyond this it hangs, and
# outside Slurm (no job time limit) it would hold the job forever
TOOL_TIMEOUT_S = 1800
VERSION_TIMEOUT_S = 60  # `nsys --version`


def run_tool(
    argv: list[str],
    env: dict[str, str],
    stdout=None,
    timeout: float | None = None,
    what: str = "",
    fix: str = "",
) -> None:
    """argv to its end (`timeout` seconds at most, when given: a ProfileError beyond); `what`:
    the file it reads (a rank's report) where argv[1:3] does not show it, and `fix`, what to do
    about its failure, both named in its errors."""
    logger.info("+ " + shlex.join(argv))
    of = f" of {what}" if what else ""
    try:
        proc = subprocess.run(argv, env=env, stdout=stdout, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProfileError(
            f"{argv[0]} {' '.join(argv[1:3])} ...{of} did not finish in {timeout:g} s: stopped"
        ) from None
    if proc.returncode != 0:
        raise failed(argv, proc.returncode, f" (its output is above){fix and '; ' + fix}", of)


def failed(argv: list[str], code: int, where: str = "", of: str = "") -> ProfileError:
    return ProfileError(f"{argv[0]} {' '.join(argv[1:3])} ...{of} failed with exit {code}{where}")


# a stop signal to this process while the ranks' launch ran, raised once it ended (run_launch)
Stopped = supervise.Stopped


def profiler_env(env: dict[str, str], tool: str) -> dict[str, str]:
    """The ranks' environment for `tool`: vocab.PROFILER_ENV=torch for torch.profiler, and removed
    for nsys and ncu, whose capture range is the trainer's cudaProfilerStart: left over from
    the caller's shell it made nsys capture nothing and ncu profile nothing."""
    env = {k: v for k, v in env.items() if k != vocab.PROFILER_ENV}
    if tool == "torch":
        env[vocab.PROFILER_ENV] = "torch"
    return env


def run_launch(argv: list[str], env: dict[str, str], stdout=None, stderr=None) -> int:
    """The ranks' launch (launch.build_command's argv) to its end, its exit status: passed a
    stop signal once, killed on a second or after supervise.STOP_WAIT_S (run_to_end)."""
    return supervise.run_to_end(argv, env, _say_kill, stdout=stdout, stderr=stderr)


def _say_kill(pid: int, why: str) -> None:
    logger.error(f"scalestudy profile: killing the ranks' launch (pid {pid}): {why}")


def run_logged(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[int, str]:
    """(exit code, output) of the ranks' launch argv (run_launch), its stdout and stderr kept
    in log_path and then written to this job's stdout (the rule's log) as well."""
    logger.info("+ " + shlex.join(argv))
    with log_path.open("w") as f:
        code = run_launch(argv, env, stdout=f, stderr=subprocess.STDOUT)
    output = log_path.read_text(errors="replace")
    sys.stdout.write(output)
    sys.stdout.flush()
    return code, output


# what a capture writes into --out: an earlier capture's are removed first, so that a rank it
# profiled and this one did not (--ranks 0 after all) is not parsed with this capture's
CAPTURED = ("tool.json", "nsys_rank*.nsys-rep", "nsys_rank*.qdstrm", "stats", "train/profile")


def _clear_earlier_capture(out: Path) -> None:
    for pattern in CAPTURED:
        for old in out.glob(pattern):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()


def trainer_args(args: argparse.Namespace, train_dir: Path) -> list[str]:
    return [*launch.trainer_flags(args.train_args), "--out", str(train_dir)]


def require_window(train_args: list[str], what: str) -> None:
    """A ProfileError unless the trainer's flags give --profile-steps A:B: the profilers see
    only that window (nsys's cudaProfilerApi capture range, ncu --profile-from-start off,
    torch.profiler's window), so without it the whole run trained (hours on a cluster; under
    ncu once per kernel) and then nothing had been profiled."""
    if launch.check_train_args(train_args).profile_steps is None:
        raise ProfileError(
            f"the trainer's flags after -- have no --profile-steps A:B, the window {what} "
            "profiles (without it the whole run trains and nothing is profiled): add "
            "--profile-steps, e.g. 20:30 (the study's profiling.start_step and steps)"
        )


def capture(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if why := files.output_dir_problem(out):  # "File exists" from mkdir otherwise
        raise ProfileError(f"--out {out} {why}")
    # the inventory too, before the earlier capture is cleared: a bad path cost that capture
    if args.inventory and (problems := files.output_problems([args.inventory])):
        raise ProfileError(f"--inventory {args.inventory}: {'; '.join(problems)}")
    tool, why = choose_tool(args.tool, args.device, shutil.which("nsys"))
    train_dir = out / "train"
    args.train_args = trainer_args(args, train_dir)
    prefix, binds = None, []
    if tool == "nsys":
        options, binds = wrapper_options(args, shutil.which("nsys"), out)
        prefix = rank_prefix(
            tool="nsys", ranks=args.ranks, dir=wrapper_dir(args, out), trace=args.nsys_trace,
            **options,
        )  # fmt: skip
    # the layout and the trainer's flags are checked (the ranks' command built) before the
    # earlier capture is removed or the inventory written: a typo cost the earlier capture
    hash_image_once(args)
    command = launch_command(args, prefix, binds)
    require_window(args.train_args, "profile capture")
    logger.info(f"profile {args.run}: tool {tool} ({why})")
    env = profiler_env(launch.rank_env(dict(os.environ), args.cpus_per_rank), tool)
    # this machine's GPU slots too (a run wider than its GPUs is refused), as `profile ncu`
    # takes them before its earlier results go
    world_size = args.nodes * args.ranks_per_node
    launch.hold_local_gpus(env, world_size, args.train_args)
    out.mkdir(parents=True, exist_ok=True)
    _clear_earlier_capture(out)
    if args.inventory:
        from scalestudy.jobs import inventory

        if args.container:
            from scalestudy.jobs.container_exec import DIGEST_ENV

            os.environ.setdefault(DIGEST_ENV, args.container_digest)
        files.write_json(args.inventory, inventory.for_job())
    logger.info("+ " + shlex.join(command))
    if code := run_launch(command, env):
        raise failed(command, code)
    manifest = {
        "run": args.run,
        "tool": tool,
        "why": why,
        "ranks": args.ranks,
        "world_size": world_size,
    }
    if tool == "nsys":
        made, entries = nsys_stats(out, env)
        manifest.update(entries, in_container=bool(args.container), binds=binds)
    else:
        manifest["input"] = "train/profile"
        made = list((train_dir / "profile").glob("torch_ops_rank*.json"))
        if not made:
            # the trainer ran, but its profile window never opened: parse found nothing later
            raise ProfileError(
                f"torch.profiler wrote no torch_ops_rank*.json in {train_dir / 'profile'}: did "
                "the trainer reach --profile-steps (none given? a window past the run's last step "
                "it refuses before training)?"
            )
    if missing := missing_ranks(manifest, {readers.rank_of(f) for f in made}):
        # a rank that died or wrote nowhere: its kernels would be missing from every sum
        raise ProfileError(
            f"{out}: no profile of rank(s) {', '.join(map(str, missing))} of {world_size} "
            f"({tool}): see the ranks' output above; capture again"
        )
    # `nsys stats` exits 0 where it SKIPs the kernel summary (no CUDA kernel data), and an
    # export may hold no op: such a capture succeeded and its parse then failed at every
    # rerun, which reran the parse alone; failed here, Snakemake removes it and captures again
    check = kernel_tables_problem if tool == "nsys" else torch_exports_problem
    if problem := check(out, made):
        raise ProfileError(
            f"{out}: no usable profile in this capture ({problem}); see the ranks' output "
            "above, and capture again"
        )
    files.write_json(out / "tool.json", manifest)
    return 0


def kernel_tables_problem(out: Path, reports: list[Path]) -> str:
    """Why the `nsys stats` kernel summaries of `reports` are no profile ("" where each has
    one): none written, nsys's SKIPPED line in its place, or a header alone. Read without the
    parsers (which are no code of a job that launches ranks: an edit to them reruns no
    capture)."""
    for report in reports:
        base = report.name.removesuffix(".nsys-rep")
        # cuda_gpu_kern_sum, or gpukernsum before nsys 2023.1 (nsight/nsys.py READ_REPORTS)
        tables = sorted((out / "stats").glob(f"{base}_*kern*sum.csv"))
        if not tables:
            return f"no kernel summary of {report.name} in {out / 'stats'}"
        for table in tables:
            lines = readers.read_text(table).splitlines()
            if said := readers.skipped_line(lines):
                return f"{table}: {said}"
            if sum("," in line for line in lines) < 2:  # a header alone: cut short
                return f"{table}: no kernel row"
    return ""


def torch_exports_problem(out: Path, exports: list[Path]) -> str:
    """Why torch.profiler's exports are no profile ("" where each lists ops): not JSON, or no
    op recorded. Read without the parser (kernel_tables_problem says why)."""
    for export in exports:
        try:
            ops = json.loads(readers.read_text(export)).get("ops")
        except (ValueError, AttributeError):
            return f"{export}: not a torch.profiler export (JSON with its ops)"
        if not isinstance(ops, list) or not ops:
            return f"{export}: no profiled ops (the window recorded nothing)"
        if api := _cuda_without_device_time(ops):
            # the parse refuses it (nsight/torch_ops.py, the same rule): a finished capture
            # was kept, and every rerun repeated only the parse, refused every time
            return (
                f"{export}: no GPU activity: the host called the CUDA runtime ({api!r}) but no "
                "op has device time: CUPTI recorded nothing on the GPU (another profiler "
                "holding it, nsys for one, or CUPTI unavailable)"
            )
    return ""


def _cuda_without_device_time(ops: list) -> str | None:
    """A CUDA runtime or driver call (cudaXxx, cuXxx) among ops none of which has device time,
    else None: torch.profiler's export of a GPU rank whose CUPTI recorded nothing."""
    entries = [op for op in ops if isinstance(op, dict)]
    if any(isinstance(t := op.get("self_device_us"), int | float) and t > 0 for op in entries):
        return None
    names = (str(op.get("name", "")) for op in entries)
    return next((name for name in names if readers.cuda_api(name)), None)


def missing_ranks(manifest: dict, found: set[int]) -> list[int]:
    """The ranks a capture's tool.json says were profiled that are not in `found`."""
    return sorted(set(expected_ranks(manifest)) - found)


def expected_ranks(manifest: dict) -> list[int]:
    """The ranks a capture profiled, from its tool.json: every rank, or rank 0 for nsys with
    --ranks 0 (torch.profiler always profiles every rank); [] for a manifest from before
    world_size was recorded (nothing to check)."""
    world_size = manifest.get("world_size")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return []
    if manifest.get("tool") == "nsys" and manifest.get("ranks") == "0":
        return [0]
    return list(range(world_size))


def nsys_stats(out: Path, env: dict[str, str]) -> tuple[list[Path], dict]:
    """`nsys stats` of every rank's report into out/stats (on the host: it reads files only);
    returns the reports and the manifest's nsys entries."""
    reports = sorted(out.glob("nsys_rank*.nsys-rep"))
    if not reports and (raw := sorted(out.glob("nsys_rank*.qdstrm"))):
        # an nsys installed without its host directory (QdstrmImporter) captures and never
        # converts: "did the trainer reach --profile-steps?" was not the cause
        raise ProfileError(
            f"nsys wrote its raw capture ({raw[0]}, {len(raw)} {vocab.plural('ranks', len(raw))}) "
            "but no report: this nsys cannot convert a .qdstrm (an install without its host "
            "directory, QdstrmImporter); install Nsight Systems whole, or set "
            "profiling.tool: torch"
        )
    if not reports:
        raise ProfileError(
            f"nsys wrote no report in {out}: did the trainer reach --profile-steps "
            "(cudaProfilerStart)?"
        )
    try:
        printed = subprocess.run(
            ["nsys", "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S
        ).stdout
    except subprocess.TimeoutExpired:
        printed = ""  # the version is unknown: the report names of the newest nsys are tried
    version = nsys_version(printed)
    (out / "stats").mkdir(exist_ok=True)
    for rep in reports:
        base = str(out / "stats" / rep.name.removesuffix(".nsys-rep"))
        run_tool(
            nsys_stats_command(str(rep), base, version, base + ".sqlite"),
            env,
            timeout=TOOL_TIMEOUT_S,
            what=str(rep),
            fix="a report cut short (a rank killed) needs the capture again",
        )
    return reports, {
        "nsys_version": ".".join(map(str, version)) if version else "unknown",
        "input": "stats",
    }


def rank(args: argparse.Namespace) -> int:
    cmd = rank_command(args, dict(os.environ))
    logger.info(f"+ [rank {rank_from_env(dict(os.environ))}] " + shlex.join(cmd))
    if shutil.which(cmd[0]) is None:  # os.execvp's FileNotFoundError, a traceback per rank
        raise ProfileError(f"{cmd[0]} is not on PATH here (inside the container, if any)")
    os.execvp(cmd[0], cmd)


# ---------------------------------------------------------------------------------------------
# CLI


def _layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="run id (a row of the run table)")
    p.add_argument("--device", choices=vocab.STUDY_DEVICES, required=True, help="hardware.device")
    p.add_argument("--mpi", default="srun", help="launcher inside Slurm (srun)")
    # argparse's one line before anything starts (capture clears its --out, ncu runs for hours)
    p.add_argument("--nodes", type=files.whole_number(1), default=1)
    p.add_argument("--ranks-per-node", type=files.whole_number(1), default=1)
    p.add_argument("--cpus-per-rank", type=files.whole_number(1), default=1)
    p.add_argument("--container", default=None, help="Apptainer image (scalestudy launch)")
    p.add_argument("--gpu", action="store_true", help="apptainer --nv")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `scalestudy train` flags")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("capture", help="run the profiled window of one run")
    p.add_argument("--tool", choices=vocab.PROFILERS, default="auto")
    p.add_argument("--ranks", choices=vocab.NSYS_RANKS, default="all", help="nsys reports of ranks")
    p.add_argument("--nsys-trace", default=NSYS_TRACE, help="nsys --trace (%(default)s)")
    p.add_argument("--out", required=True, help="capture directory")
    p.add_argument("--inventory", default=None, help="also write the system inventory here")
    _layout(p)
    p = sub.add_parser(
        "parse",
        help="capture dir, nsys stats or ncu details -> profile CSVs",
        description="Profiler output -> the profile CSVs: one of --capture (a `profile capture` "
        "directory), --nsys-stats (nsys stats CSVs) or --ncu (ncu details CSVs).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--capture", metavar="DIR", help="capture directory (its tool.json names the tool)"
    )
    source.add_argument(
        "--nsys-stats", metavar="PATH", help="nsys stats --format csv output: a CSV or a dir"
    )
    source.add_argument(
        "--ncu",
        metavar="PATH",
        help="ncu --csv --page details output: a CSV or a dir (kernels keep ncu's names)",
    )
    p.add_argument("--run", required=True, help="run id written into every row")
    p.add_argument(
        "--out-kernels",
        metavar="CSV",
        help="kernels CSV (profile_kernels; --capture, --nsys-stats)",
    )
    p.add_argument(
        "--out-ranges", metavar="CSV", help="phase ranges CSV (profile_ranges; optional)"
    )
    p.add_argument("--out-ncu", metavar="CSV", help="Nsight Compute CSV (profile_ncu; --ncu)")
    p = sub.add_parser(
        "ncu-kernels", help="a run's kernels CSV -> the kernels profile ncu may profile (JSON)"
    )
    p.add_argument("--kernels", required=True, help="the run's kernels CSV (profile parse)")
    p.add_argument("--out", required=True, help="the JSON list `profile ncu --kernels` reads")
    p = sub.add_parser("ncu", help="Nsight Compute on the top-K kernels of a run")
    p.add_argument("--kernels", required=True, help="the run's ncu kernels (profile ncu-kernels)")
    p.add_argument("--enabled", choices=("auto", "true"), default="auto")
    # checked before anything starts: each kernel is a whole training run under ncu
    p.add_argument(
        "--top-k", type=files.whole_number(1), default=5, help="kernels to profile (>= 1)"
    )
    p.add_argument("--launch-skip", type=files.whole_number(0), default=0)
    p.add_argument("--launch-count", type=files.whole_number(1), default=1)
    p.add_argument(
        "--out-dir", required=True, help="ncu's reports, details CSVs, tool.json (parse --ncu)"
    )
    _layout(p)
    p = sub.add_parser("rank", help="per-rank wrapper (started by scalestudy launch)")
    p.add_argument("--tool", choices=("nsys", "ncu"), required=True)
    p.add_argument("--ranks", choices=vocab.NSYS_RANKS, default="all")
    p.add_argument("--dir", required=True)
    p.add_argument("--trace", default=NSYS_TRACE)
    # ncu's: the profile ncu job gives them (jobs/profile_ncu.py kernel_options)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--name-base", choices=("demangled", "mangled"), default="demangled")
    p.add_argument("--kernel-regex", default="")
    p.add_argument("--metrics", default="")
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--profiler", default=None, help="the nsys/ncu executable (default: on PATH)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("merge", help="per-run profile CSVs -> one CSV")
    p.add_argument("--schema", choices=("kernels", "ranges", "ncu"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--run",
        action="append",
        dest="runs",
        help="the run of each input, in input order (one per input): a row of another run is "
        "refused",
    )
    p.add_argument("inputs", nargs="+")
    # whole flag names only: argparse took `profile ncu --out N.csv`, a flag the job no longer
    # has, for --out-dir, and the job wrote its reports into a directory named N.csv
    for action in sub.choices.values():
        action.allow_abbrev = False


# action -> the function that runs it, by name: imported when it runs, so that the capture's
# code input (this module and what it imports) is not every parser's (the module docstring)
ACTIONS = {
    "capture": "scalestudy.jobs.profile:capture",
    "rank": "scalestudy.jobs.profile:rank",
    "ncu-kernels": "scalestudy.jobs.ncu_kernels:kernels",
    "ncu": "scalestudy.jobs.profile_ncu:ncu",
    "parse": "scalestudy.jobs.profile_parse:parse",
    "merge": "scalestudy.jobs.profile_parse:merge",
}


def run(args: argparse.Namespace) -> int:
    # ProfileError and ProfileFormatError: one line from cli.main, exit 2
    module, name = ACTIONS[args.action].split(":")
    try:
        return getattr(importlib.import_module(module), name)(args)
    except Stopped as exc:  # the ranks' launch ended after it: its lines said how
        logger.error(
            f"scalestudy profile {args.action}: stopped by {exc.signum.name} (passed on to the "
            "ranks' launch)",
            exc_info=log.debug(),
        )
        return 128 + exc.signum
