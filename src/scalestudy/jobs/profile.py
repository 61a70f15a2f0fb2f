"""`scalestudy profile ...`: profiling jobs, separate from the timed runs.

    scalestudy profile capture --run R --tool auto|nsys|torch --device cuda|cpu --ranks all|0 \\
        --out results/profile/R/capture --inventory results/system/profile/R.json \\
        --nodes N --ranks-per-node K --cpus-per-rank C [--container IMG --gpu] -- <train flags>
    scalestudy profile parse --capture DIR --run R --out-kernels K.csv [--out-ranges R.csv]
    scalestudy profile parse --nsys-stats CSV|DIR --run R --out-kernels K.csv [--out-ranges R.csv]
    scalestudy profile parse --ncu CSV|DIR --run R --out-ncu N.csv
    scalestudy profile ncu --run R --kernels K.csv --top-k 5 --launch-skip S --launch-count C \\
        --out-dir results/profile/R/ncu --out N.csv --enabled auto|true ... -- <train flags>
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
  one kills it and its ranks (run_launch); killed with this process, the ranks trained on.
In the container (--container IMG): the profiler runs inside the image, around the trainer:
      apptainer exec --nv --bind <install> IMG python -m scalestudy profile rank \\
          --profiler <install>/bin/nsys ... -- python -m scalestudy train ...
  with the host's installation bound at its own path (profiler_install says why the host's);
  an nsys wrapped around `apptainer exec` from outside may trace nothing.
ncu: rank 0 only (the other ranks run plain; a profiled NCCL kernel would wait forever for its
  serialised peers, so NCCL kernels are never chosen), one ncu pass per top-K kernel:
      ncu --profile-from-start off --clock-control none --set full --metrics <FLOP counters> \\
          --kernel-name-base demangled -k regex:<the whole demangled name> \\
          --launch-skip S' --launch-count C --target-processes all -o DIR/ncu_k<i>
  (S' = S clamped so that C launches remain of the kernel's instances on rank 0 in the nsys
  window), then `ncu -i DIR/ncu_k<i>.ncu-rep --csv --page details --print-units base
  --print-metric-name name` -> DIR/ncu_k<i>.csv (whole or not at all), whose rows carry the
  kernels CSV's name. --out and DIR are checked before the first pass; an earlier run's
  tool.json and ncu_k<i>.{csv,ncu-rep,log} in DIR are removed after the command's checks
  (every pass's command built), the user's own files kept, so `parse --ncu DIR` reads only
  this run's kernels (none where ncu is skipped).
  --clock-control none: the GPU at the clocks the timed runs see (ncu locks them to base by
  default, so its durations would disagree with the timed runs). The top K are rank 0's (the
  rank ncu profiles). ncu's process autotunes cuDNN afresh (cudnn.benchmark), so it may choose
  other convolution engines than the capture did (two of an H200's top 10 never launched under
  ncu): a kernel whose filter matched no launch is left out with a warning and named in
  tool.json's `not_launched`; none profiled at all is an error under enabled true and an empty
  CSV (tool.json says why) under auto.
parse: profiler output -> the profile CSVs (schemas: scalestudy.nsight.schema), from one of
  --capture DIR   a capture directory of `profile capture`: its tool.json says which tool ran
                  and where its output is (nsys stats CSVs, or torch.profiler exports), and
                  which run it is (a capture of another --run is refused)
  --nsys-stats P  `nsys stats --format csv` output made by hand: one CSV, or a directory of them
                  (cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, nvtx_gpu_proj_sum, nvtx_sum or the
                  pre-2023.1 names; recognised by header, rank from `rank<r>` in the file name)
                  and the reports' SQLite exports, nsys_rank<r>.sqlite, for the phases' GPU time
  --ncu P         `ncu --csv --page details` output: one CSV, or every *.csv of a directory;
                  its kernels keep ncu's names (`profile ncu` labels them with the kernels
                  CSV's, the join key of profile_kernels and profile_ncu)
  The first two write --out-kernels (profile_kernels) and, when given, --out-ranges
  (profile_ranges); --ncu writes --out-ncu (profile_ncu). A file that cannot be parsed is an
  error naming the file and line (exit 2), and no CSV is written.
rank: the per-rank wrapper the launcher starts instead of the trainer (rank from SLURM_PROCID or
  RANK): it execs the profiler around CMD on the profiled ranks and CMD alone on the others.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import ProfileError, ProfileFormatError
from scalestudy.jobs import launch, local_ranks
from scalestudy.nsight import classify, nsys, readers, schema, torch_ops
from scalestudy.nsight import ncu as ncu_parser

logger = log.get(__name__)

NSYS_TRACE = "cuda,nvtx,osrt,cudnn,cublas"
NSYS_REPORTS_NEW = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "nvtx_sum")
NSYS_REPORTS_OLD = ("gpukernsum", "gpumemtimesum", "nvtxsum")
# Installation roots that cannot be bound into the image: binding them would hide its own system
# (e.g. an nsys that a distribution package put in /usr/bin).
SYSTEM_DIRS = frozenset(
    {"/", "/usr", "/usr/local", "/opt", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/var"}
)
# FLOP counters that --set full does not print in the details page: SASS f/h/d add, mul, fma
# (a fma is 2 FLOP) and the tensor-core paths (nsight.ncu.parse_ncu sums them). Tensor paths: the
# per-(source, destination) and src-only totals (ncu.TENSOR_METRIC says which one counts), not the
# _sparsity_on/_off breakdowns. A regex, not a list: a name the GPU lacks (bf16 before Ampere,
# fp16 per destination on an H100) would fail the whole ncu run, a regex just matches fewer.
NCU_METRICS = ",".join(
    [
        f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
        for p in "hfd"
        for op in ("add", "mul", "fma")
    ]
    + ["regex:" + ncu_parser.TENSOR_METRIC.pattern]
)


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
    for key in ("SLURM_PROCID", "RANK"):
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
    if str(root) in SYSTEM_DIRS:
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


_REGEX_META = set("\\^$.|?*+()[]{}")


def _regex_literal(text: str) -> str:
    # only the metacharacters every regex dialect shares: re.escape also escapes characters
    # (space, '#', '&', '~') that some engines reject as unknown escapes
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


# the spellings in which ncu's demangler differs from the one of nsys and torch.profiler (seen on
# an H200, ncu 2025.3.1, torch 2.11: tests/fixtures/gpu-h200/ncu_kernel_names.txt)
_ANON = "(anonymous namespace)"  # ncu: <unnamed>
# {lambda(long)#1}; ncu: [lambda(long) (instance 1)]
_LAMBDA = re.compile(r"\{lambda\((?:[^()]|\([^()]*\))*\)#(\d+)\}")
# a literal template argument, 4 or 3ul; ncu: (int)4, (unsigned long)3
_NUMBER = re.compile(r"(\d+)[uUlL]*(?=\s*[,>])")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _closing(text: str, at: int) -> int:
    """The index of the ')' that closes the '(' at text[at], or -1."""
    depth = 0
    for i in range(at, len(text)):
        depth += (text[i] == "(") - (text[i] == ")")
        if depth == 0:
            return i
    return -1


def _name_regex(text: str) -> str:
    """The regex of a kernel's name before its parameter list, tolerant of ncu's spellings:
    every nested parameter list (a lambda's enclosing function) is free, since ncu prints its
    template parameters (T1) where the others print types."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        lam = _LAMBDA.match(text, i)
        num = _NUMBER.match(text, i) if i and text[i - 1] in "<, " else None
        word = _IDENT.match(text, i)
        if text.startswith(_ANON, i):
            out.append(r"(\(anonymous namespace\)|<unnamed>)")
            i += len(_ANON)
        elif lam:
            n = lam.group(1)
            out.append(rf"(\{{lambda\(.*\)#{n}\}}|\[lambda\(.*\) \(instance {n}\)\])")
            i = lam.end()
        elif num:
            out.append(rf"(\([A-Za-z_][A-Za-z0-9_ ]*\))?{num.group(1)}[uUlL]*")
            i = num.end()
        elif word and word.group() in ("true", "false") and text[i - 1] in "<, ":
            out.append(f"({word.group()}|\\(bool\\){int(word.group() == 'true')})")
            i = word.end()
        elif word:
            # ncu prints the return type of a function template named in a template argument
            # ("void at::native::flip_kernel_impl<...>(...)::[lambda...]"); the others do not
            starts_argument = i and text[i - 1] in "<, " and text[i - 2 : i] != "::"
            out.append(("(void\\s+)?" if starts_argument else "") + word.group())
            i = word.end()
        elif ch == "(" and (end := _closing(text, i)) > 0:
            out.append(r"\(.*\)")
            i = end + 1
        elif ch == " ":
            i += 1
            continue
        else:
            out.append(_regex_literal(ch))
            i += 1
        out.append(r"\s*")
    return "".join(out)


def ncu_name_base(name: str) -> str:
    """ncu's --kernel-name-base for a kernels-CSV name: "mangled" for a name the profiler could
    not demangle (an Itanium symbol, "_ZN17cutlass..."), else "demangled"."""
    return "mangled" if name.strip().startswith("_Z") else "demangled"


def ncu_kernel_regex(name: str) -> str:
    """The ncu --kernel-name filter (with --kernel-name-base demangled) for one kernel of the
    kernels CSV, whose names are nsys's or torch.profiler's demangled ones. ncu demangles
    differently (seen on an H200: "<unnamed>" for "(anonymous namespace)", "(int)4" and
    "(bool)1" for the template arguments "4" and "true", "[lambda(long) (instance 1)]" for
    "{lambda(long)#1}", its template parameters "const T2 *" in the parameter list), so the
    filter is the qualified name and template arguments with those spellings allowed, any
    parameter list, anchored: one template instantiation, not its siblings. Whitespace is free
    and the leading 'void ' optional."""
    text = " ".join(name.split())
    if text.startswith("void "):
        text = text[5:]
    if not text:
        raise ProfileError(f"kernel name {name!r} is empty: nothing to give ncu --kernel-name")
    if ncu_name_base(text) == "mangled":
        return f"^{_regex_literal(text)}$"
    params = classify.parameter_list(text)
    head = text if params is None else text[:params]
    tail = "" if params is None else r"\(.*\)"
    return rf"^(void\s+)?{_name_regex(head)}{tail}$"


def ncu_command(
    output_base: str,
    kernel: str,
    launch_skip: int,
    launch_count: int,
    cmd: list[str],
    exe: str = "ncu",
) -> list[str]:
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
        NCU_METRICS,
        "--kernel-name-base",
        ncu_name_base(kernel),
        "--kernel-name",
        f"regex:{ncu_kernel_regex(kernel)}",
        "--launch-skip",
        str(launch_skip),
        "--launch-count",
        str(launch_count),
        "--target-processes",
        "all",
        "--force-overwrite",
        "--export",
        output_base,
        *cmd,
    ]


def ncu_import_command(report: str) -> list[str]:
    # metric names, not labels: labels changed between versions ("SM [%]", "Compute (SM) [%]",
    # "Compute (SM) Throughput"); nsight.ncu.parse_ncu reads both
    return [
        "ncu",
        "--import",
        report,
        "--csv",
        "--page",
        "details",
        "--print-units",
        "base",
        "--print-metric-name",
        "name",
    ]


def ncu_launch_skip(kernel_rows: list[dict], kernel: str, skip: int, count: int) -> int:
    """--launch-skip for one kernel: ncu counts only launches of the filtered kernel, and ncu
    profiles rank 0, so at most (rank 0's instances in the nsys window - count) may be skipped;
    a larger skip (10 of a once-per-step kernel in a 10-step window) would profile nothing."""
    mine = [r for r in kernel_rows if r["kernel"] == kernel]
    # rank 0 missing (a capture of other ranks only): the fewest instances of any rank
    seen = [int(r["instances"]) for r in mine if str(r["rank"]) == "0"] or [
        int(r["instances"]) for r in mine
    ]
    if not seen:
        return skip
    return min(skip, max(0, min(seen) - count))


def rank_command(args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    """What one rank runs: the profiler around CMD when this rank is profiled, else CMD."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ProfileError("scalestudy profile rank: no command after --")
    rank = rank_from_env(env)
    if args.ranks == "0" and rank != 0:
        return cmd
    exe = getattr(args, "profiler", None) or args.tool
    if args.tool == "nsys":
        return nsys_profile_command(f"{args.dir}/nsys_rank{rank}", args.trace, cmd, exe)
    return ncu_command(
        f"{args.dir}/ncu_k{args.index}", args.kernel, args.skip, args.count, cmd, exe
    )


def rank_prefix(*, python: str = sys.executable, **options: str) -> str:
    """The `<python> -m scalestudy profile rank ... --` prefix for `scalestudy launch
    --rank-prefix`; python is the image's `python` when the ranks run in the container."""
    argv = [python, "-m", "scalestudy", "profile", "rank"]
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    return shlex.join([*argv, "--"])


def _hash_image_once(args: argparse.Namespace) -> None:
    """args.container_digest: the image's sha256, read once for every command of this job (the
    inventory, each ncu pass): a multi-GB .sif on a shared file system was read whole again for
    each of them, inside the job's time limit."""
    if args.container and not getattr(args, "container_digest", None):
        from scalestudy.jobs.container import image_digest

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


def wrapper_options(args: argparse.Namespace, exe: str) -> tuple[dict, list[str]]:
    """(rank_prefix keywords, container binds) that run the profiler `exe` on each rank: in the
    container (the image's python runs the wrapper, the host's installation bound in at its own
    path) when there is one, else on the host."""
    if not args.container:
        return {"profiler": exe}, []
    real, root = profiler_install(exe)
    return {"python": "python", "profiler": real}, [root]


# ---------------------------------------------------------------------------------------------
# running


# seconds a tool's post-processing may take (`nsys stats` with its SQLite export of one rank's
# report, `ncu --import` of one kernel's): minutes for a large report; beyond this it hangs, and
# outside Slurm (no job time limit) it would hold the job forever
TOOL_TIMEOUT_S = 1800
VERSION_TIMEOUT_S = 60  # `nsys --version`


def _run(argv: list[str], env: dict[str, str], stdout=None, timeout: float | None = None) -> None:
    """argv to its end (`timeout` seconds at most, when given: a ProfileError beyond)."""
    logger.info("+ " + shlex.join(argv))
    try:
        proc = subprocess.run(argv, env=env, stdout=stdout, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProfileError(
            f"{argv[0]} {' '.join(argv[1:3])} ... did not finish in {timeout:g} s: stopped"
        ) from None
    if proc.returncode != 0:
        raise _failed(argv, proc.returncode)


def _failed(argv: list[str], code: int, where: str = "") -> ProfileError:
    return ProfileError(f"{argv[0]} {' '.join(argv[1:3])} ... failed with exit {code}{where}")


# a stop signal to this process while the ranks' launch ran, raised once it ended (run_launch)
Stopped = local_ranks.Stopped


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
    stop signal once, killed on a second or after local_ranks.STOP_WAIT_S (run_to_end)."""
    return local_ranks.run_to_end(argv, env, _say_kill, stdout=stdout, stderr=stderr)


def _say_kill(pid: int, why: str) -> None:
    logger.error(f"scalestudy profile: killing the ranks' launch (pid {pid}): {why}")


def _run_logged(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[int, str]:
    """(exit code, output) of the ranks' launch argv (run_launch), its stdout and stderr kept
    in log_path and then written to this job's stdout (the rule's log) as well."""
    logger.info("+ " + shlex.join(argv))
    with log_path.open("w") as f:
        code = run_launch(argv, env, stdout=f, stderr=subprocess.STDOUT)
    output = log_path.read_text(errors="replace")
    sys.stdout.write(output)
    sys.stdout.flush()
    return code, output


# What ncu prints when the node lets only administrators read the GPU's performance counters
# (the NVIDIA driver's default, NVreg_RestrictProfilingToAdminUsers=1): it still runs the
# program, profiles nothing and writes no report.
NCU_NO_PERMISSION = "ERR_NVGPUCTRPERM"


def ncu_refusal(output: str) -> str | None:
    """Why ncu could not profile on this node, from its output; None when it says nothing so."""
    if NCU_NO_PERMISSION in output:
        return (
            f"ncu may not read this node's GPU performance counters ({NCU_NO_PERMISSION}: "
            "administrators only): ask the site to allow them "
            f"(NVreg_RestrictProfilingToAdminUsers=0), or set {NCU_KEY}: false"
        )
    return None


# what a capture writes into --out: an earlier capture's are removed first, so that a rank it
# profiled and this one did not (--ranks 0 after all) is not parsed with this capture's
CAPTURED = ("tool.json", "nsys_rank*.nsys-rep", "stats", "train/profile")


def _clear_earlier_capture(out: Path) -> None:
    for pattern in CAPTURED:
        for old in out.glob(pattern):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()


# what `profile ncu` writes into --out-dir: an earlier run's are removed first, so that a kernel
# it profiled and this run did not (a smaller top_k, ncu skipped) is not parsed as this run's
# (`profile parse --ncu DIR` reads every *.csv of the directory)
NCU_MADE = re.compile(r"tool\.json|ncu_k\d+\.(csv|ncu-rep|log)")


def _clear_earlier_ncu(out_dir: Path) -> None:
    for old in out_dir.iterdir():
        if NCU_MADE.fullmatch(old.name) and not old.is_dir():
            old.unlink()


def _train_args(args: argparse.Namespace, train_dir: Path) -> list[str]:
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
    args.train_args = _train_args(args, train_dir)
    prefix, binds = None, []
    if tool == "nsys":
        options, binds = wrapper_options(args, shutil.which("nsys"))
        prefix = rank_prefix(
            tool="nsys", ranks=args.ranks, dir=out, trace=args.nsys_trace, **options
        )
    # the layout and the trainer's flags are checked (the ranks' command built) before the
    # earlier capture is removed or the inventory written: a typo cost the earlier capture
    _hash_image_once(args)
    command = launch_command(args, prefix, binds)
    require_window(args.train_args, "profile capture")
    logger.info(f"profile {args.run}: tool {tool} ({why})")
    out.mkdir(parents=True, exist_ok=True)
    _clear_earlier_capture(out)
    env = profiler_env(launch.rank_env(dict(os.environ), args.cpus_per_rank), tool)
    if args.inventory:
        from scalestudy.jobs import inventory

        if args.container:
            from scalestudy.jobs.container import DIGEST_ENV

            os.environ.setdefault(DIGEST_ENV, args.container_digest)
        files.write_json(args.inventory, inventory.for_job())
    world_size = args.nodes * args.ranks_per_node
    launch.hold_local_gpus(env, world_size, args.train_args)
    logger.info("+ " + shlex.join(command))
    if code := run_launch(command, env):
        raise _failed(command, code)
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
    files.write_json(out / "tool.json", manifest)
    return 0


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
        _run(
            nsys_stats_command(str(rep), base, version, base + ".sqlite"),
            env,
            timeout=TOOL_TIMEOUT_S,
        )
    return reports, {
        "nsys_version": ".".join(map(str, version)) if version else "unknown",
        "input": "stats",
    }


def _capture_input(capture_dir: Path) -> tuple[str, Path, str, dict]:
    """(tool, its output, why that tool, tool.json) of a capture directory, from its
    tool.json."""
    manifest_path = capture_dir / "tool.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(
            manifest_path, None, f"unreadable ({exc}); made by `scalestudy profile capture`"
        ) from exc
    keys = ("tool", "input", "why")
    if not isinstance(manifest, dict) or not all(k in manifest for k in keys):
        raise ProfileFormatError(
            manifest_path,
            None,
            f"has no {'/'.join(keys)}: not a capture's manifest (written "
            "by `scalestudy profile capture`; profile ncu's directory is parsed with --ncu)",
        )
    tool, source = manifest["tool"], manifest["input"]
    if tool not in ("nsys", "torch") or not isinstance(source, str):
        raise ProfileFormatError(
            manifest_path,
            None,
            f"has tool {tool!r} and input {source!r}: a capture's manifest names tool nsys or "
            "torch and its input directory; capture again with `scalestudy profile capture`",
        )
    return tool, capture_dir / source, manifest["why"], manifest


def parse(args: argparse.Namespace) -> int:
    """One of --capture, --nsys-stats, --ncu -> the profile CSVs (see the module docstring)."""
    # two outputs one file (k.csv and ./k.csv: two keys of write_texts, the second written over
    # the first), or an output one of the inputs: refused before any work
    outputs = {"--out-kernels": args.out_kernels, "--out-ranges": args.out_ranges}
    outputs["--out-ncu"] = args.out_ncu
    inputs = {"--nsys-stats": args.nsys_stats, "--ncu": args.ncu}
    files.check_distinct({k: v for k, v in outputs.items() if v}, inputs, ProfileError)
    if args.ncu:
        if args.out_kernels or args.out_ranges or not args.out_ncu:
            raise ProfileError(
                "--ncu writes --out-ncu (profile_ncu), not --out-kernels or --out-ranges"
            )
        rows = []
        for f in ncu_parser.ncu_files(args.ncu):
            rows.extend(ncu_parser.parse_ncu(f, args.run))
        files.write_text(args.out_ncu, schema.csv_text(schema.NCU_COLUMNS, rows))
        logger.info(f"{args.run}: {len(rows)} kernels -> {args.out_ncu}")
        return 0
    if not args.out_kernels or args.out_ncu:
        raise ProfileError(
            f"--{'capture' if args.capture else 'nsys-stats'} writes --out-kernels "
            "(and --out-ranges), not --out-ncu"
        )
    manifest: dict = {}  # --nsys-stats: no manifest, no ranks to expect
    if args.capture:
        tool, source, why, manifest = _capture_input(Path(args.capture))
        if manifest.get("run", args.run) != args.run:
            # every row is labelled --run: a capture copied from another run's directory would
            # show that run's profile as this one's (and merge's --run check sees only labels)
            raise ProfileFormatError(
                Path(args.capture) / "tool.json",
                None,
                f"the capture of run {manifest['run']!r}, not of --run {args.run!r} (copied "
                "from another run's directory?): capture this run again with `scalestudy "
                "profile capture`",
            )
    else:
        tool, source, why = "nsys", Path(args.nsys_stats), f"stats {args.nsys_stats}"
    if tool == "nsys":
        kernels, ranges = nsys.parse_nsys(source, args.run)
    else:
        kernels, ranges = torch_ops.parse_torch(source, args.run)
    if missing := missing_ranks(manifest, {int(r["rank"]) for r in kernels}):
        # the capture had them: a file lost since would leave those ranks out of every sum
        raise ProfileFormatError(
            source,
            None,
            f"no kernels of rank(s) {', '.join(map(str, missing))}, which the capture profiled "
            f"(tool.json: world size {manifest['world_size']}, ranks {manifest['ranks']}); "
            "capture again with `scalestudy profile capture`",
        )
    outputs = {args.out_kernels: schema.csv_text(schema.KERNEL_COLUMNS, kernels)}
    if args.out_ranges:
        outputs[args.out_ranges] = schema.csv_text(schema.RANGE_COLUMNS, ranges)
    files.check_outputs(outputs, ProfileError)  # else a new kernels CSV beside old ranges
    files.write_texts(outputs)  # both or neither: a full disk at the ranges leaves both old
    bare = sorted({r["rank"] for r in kernels} - {r["rank"] for r in ranges})
    if bare:
        # a warning, not an error: the kernel breakdown stands on its own, and a trainer that
        # records its phases in a form this tool does not see must not cost the kernels
        where = f"; {args.out_ranges} has no rows for them" if args.out_ranges else ""
        seen = "export / nvtx_gpu_proj_sum / nvtx_sum" if tool == "nsys" else "record_function"
        logger.warning(
            f"WARNING {args.run}: rank(s) {', '.join(map(str, bare))} have kernels but none of "
            f"the phase ranges {', '.join(schema.RANGES)} in {source} "
            f"({seen})"
            f"{where}"
        )
    if tool == "nsys":
        _warn_phase_time_base(args.run, source, ranges)
    logger.info(
        f"{args.run}: {len(kernels)} kernel rows, {len(ranges)} range rows (tool {tool}: {why})"
    )
    return 0


def _warn_phase_time_base(run: str, source: Path, ranges: list[dict]) -> None:
    """Say which ranks' nsys phase times are not the GPU projection of every thread (the
    trainer's GPU phase times are also in metrics.json: the step timer's CUDA events)."""
    for base, what in (
        (
            schema.GPU_PROJECTION_SAME_THREAD,
            "nvtx_gpu_proj_sum's GPU time of the launches from each range's own thread (time_base "
            f"{schema.GPU_PROJECTION_SAME_THREAD}), which misses the backward's kernels autograd "
            "launches from its own thread",
        ),
        (
            schema.HOST_RANGE,
            f"host NVTX push/pop times (time_base {schema.HOST_RANGE}), the time to enqueue each "
            "phase, not GPU time",
        ),
    ):
        ranks = sorted({r["rank"] for r in ranges if r["time_base"] == base})
        if ranks:
            logger.warning(
                f"WARNING {run}: rank(s) {', '.join(map(str, ranks))} have no SQLite export "
                f"(nsys_rank<r>.sqlite) in {source}: their phase times are {what}; export the "
                "report with `nsys export --type sqlite --output <dir>/nsys_rank<r>.sqlite "
                "<report>.nsys-rep`"
            )


def ncu(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    # before the first pass (each a whole training run under ncu): an --out found unwritable
    # after them cost hours and left a tool.json naming kernels whose CSV was never written
    outputs = {"--out": args.out, "tool.json of --out-dir": out_dir / "tool.json"}
    files.check_distinct(outputs, {"--kernels": args.kernels}, ProfileError)
    files.check_outputs([args.out, out_dir / "tool.json"], ProfileError)
    out_dir.mkdir(parents=True, exist_ok=True)
    ncu_path = shutil.which("ncu")
    if args.device != "cuda" or ncu_path is None:
        missing = "no GPU (hardware.device: cpu)" if args.device != "cuda" else "`ncu` not on PATH"
        if args.enabled == "true":
            raise ncu_required(
                f"{missing}: load Nsight Compute (e.g. `module load nsight-compute`) or set "
                f"{NCU_KEY}: auto"
            )
        why = f"auto: {missing}, no Nsight Compute metrics for {args.run}"
        logger.info(why)
        _clear_earlier_ncu(out_dir)
        return _no_ncu(out_dir, args.out, why)
    # before the first pass: without a window each pass trained the whole run and ncu, which
    # profiles only inside it, profiled no kernel (under auto: an empty CSV, after hours)
    require_window(args.train_args, "profile ncu")
    kernel_rows = schema.read_csv(args.kernels, schema.KERNEL_COLUMNS)
    # rank 0's top kernels: the rank ncu profiles (each rank autotunes its own cuDNN engines)
    kernels = schema.top_kernels(
        [r for r in kernel_rows if str(r["rank"]) == "0"] or kernel_rows, args.top_k
    )
    if not kernels:
        raise ProfileError(f"{args.kernels}: no non-NCCL kernel to profile with ncu")
    env = profiler_env(launch.rank_env(dict(os.environ), args.cpus_per_rank), "ncu")
    train_args = _train_args(args, out_dir / "train")
    launch.hold_local_gpus(env, args.nodes * args.ranks_per_node, train_args)
    options, binds = wrapper_options(args, ncu_path)
    args.train_args = list(train_args)
    _hash_image_once(args)
    passes = []  # (index, kernel, --launch-skip, the ranks' command): all built, every check
    for i, kernel in enumerate(kernels):  # made, before the earlier run's results are removed
        skip = ncu_launch_skip(kernel_rows, kernel, args.launch_skip, args.launch_count)
        if skip != args.launch_skip:
            logger.info(
                f"ncu k{i}: --launch-skip {skip}, not {args.launch_skip}: rank 0 launches "
                f"{kernel[:80]!r} too few times in the window to skip {args.launch_skip} and "
                f"profile {args.launch_count}",
            )
        prefix = rank_prefix(
            tool="ncu",
            ranks="0",
            dir=out_dir,
            index=i,
            kernel=kernel,
            skip=skip,
            count=args.launch_count,
            **options,
        )
        passes.append((i, kernel, skip, launch_command(args, prefix, binds)))
    _clear_earlier_ncu(out_dir)
    profiled, not_launched = [], []
    for i, kernel, skip, argv in passes:
        report = out_dir / f"ncu_k{i}.ncu-rep"
        code, output = _run_logged(argv, env, out_dir / f"ncu_k{i}.log")
        refused = ncu_refusal(output)
        if refused and not report.exists():
            if args.enabled == "true":
                raise ncu_required(refused)
            why = f"auto: {refused}; no Nsight Compute metrics for {args.run}"
            logger.warning(f"WARNING {why}")
            return _no_ncu(out_dir, args.out, why)
        if code != 0:
            raise _failed(argv, code, f" (its output: {out_dir / f'ncu_k{i}.log'})")
        if not report.exists():
            # ncu writes no report when its filter matched no launch: this process's cuDNN
            # autotuning chose other engines than the capture's (or the skip was too large)
            logger.warning(
                f"WARNING {args.run}: ncu k{i} profiled nothing: no launch of {kernel[:120]!r} "
                f"matched --kernel-name regex:{ncu_kernel_regex(kernel)} (--launch-skip {skip}) "
                "on rank 0 (cudnn.benchmark may have chosen another engine in ncu's process); "
                "left out of the ncu metrics"
            )
            not_launched.append(kernel)
            continue
        # whole or not at all: a failed or stopped import left a half-written CSV
        with files.atomic_open(out_dir / f"ncu_k{i}.csv") as f:
            _run(ncu_import_command(str(report)), env, stdout=f, timeout=TOOL_TIMEOUT_S)
        profiled.append((i, kernel))
    if not profiled:
        why = (
            f"none of the top {len(kernels)} kernels of {args.kernels} launched on rank 0 "
            "under ncu (see the WARNING lines above)"
        )
        if args.enabled == "true":
            raise ncu_required(why)
        logger.warning(f"WARNING auto: {why}; no Nsight Compute metrics for {args.run}")
        return _no_ncu(out_dir, args.out, f"auto: {why}", not_launched)
    rows = []
    for i, kernel in profiled:
        # the kernels CSV's name, not ncu's spelling of it: profile_ncu joins profile_kernels
        rows.extend(ncu_parser.parse_ncu(out_dir / f"ncu_k{i}.csv", args.run, kernel=kernel))
    manifest = {"tool": "ncu", "why": ncu_path, "kernels": [k for _, k in profiled]}
    _write_ncu(out_dir, args.out, {**manifest, "not_launched": not_launched}, rows)
    return 0


def _write_ncu(out_dir: Path, out: str, manifest: dict, rows: list[dict]) -> None:
    """tool.json and the --out CSV both or neither: a full disk at the CSV left a new tool.json
    naming kernels beside the old CSV."""
    files.write_texts(
        {
            out_dir / "tool.json": files.json_text(manifest),
            out: schema.csv_text(schema.NCU_COLUMNS, rows),
        }
    )


def ncu_required(why: str) -> ProfileError:
    """The error of `profile ncu --enabled true` (the study's profiling.ncu.enabled: true) where
    ncu cannot profile; under auto the same `why` skips ncu instead."""
    return ProfileError(f"{NCU_KEY} is true but {why}")


def _no_ncu(out_dir: Path, out: str, why: str, not_launched: list[str] = ()) -> int:
    """ncu skipped under enabled auto: the manifest says why, the run's profile_ncu CSV is empty."""
    _write_ncu(out_dir, out, {"tool": "none", "why": why, "not_launched": list(not_launched)}, [])
    return 0


def rank(args: argparse.Namespace) -> int:
    cmd = rank_command(args, dict(os.environ))
    logger.info(f"+ [rank {rank_from_env(dict(os.environ))}] " + shlex.join(cmd))
    if shutil.which(cmd[0]) is None:  # os.execvp's FileNotFoundError, a traceback per rank
        raise ProfileError(f"{cmd[0]} is not on PATH here (inside the container, if any)")
    os.execvp(cmd[0], cmd)


def merge(args: argparse.Namespace) -> int:
    columns = {
        "kernels": schema.KERNEL_COLUMNS,
        "ranges": schema.RANGE_COLUMNS,
        "ncu": schema.NCU_COLUMNS,
    }[args.schema]
    # --out one of the inputs: the merge replaced it
    inputs = {f"CSV {i}": path for i, path in enumerate(args.inputs, start=1)}
    files.check_distinct({"--out": args.out}, inputs, ProfileError)
    files.write_text(args.out, schema.merge_csvs(args.inputs, columns, args.runs))
    return 0


# ---------------------------------------------------------------------------------------------
# CLI


def _layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="run id (a row of the run table)")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True, help="hardware.device")
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
    p = sub.add_parser("ncu", help="Nsight Compute on the top-K kernels of a run")
    p.add_argument("--kernels", required=True, help="the run's kernels CSV (profile parse)")
    p.add_argument("--enabled", choices=("auto", "true"), default="auto")
    # checked before anything starts: each kernel is a whole training run under ncu
    p.add_argument(
        "--top-k", type=files.whole_number(1), default=5, help="kernels to profile (>= 1)"
    )
    p.add_argument("--launch-skip", type=files.whole_number(0), default=0)
    p.add_argument("--launch-count", type=files.whole_number(1), default=1)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--out", required=True, help="the run's profile_ncu CSV")
    _layout(p)
    p = sub.add_parser("rank", help="per-rank wrapper (started by scalestudy launch)")
    p.add_argument("--tool", choices=("nsys", "ncu"), required=True)
    p.add_argument("--ranks", choices=vocab.NSYS_RANKS, default="all")
    p.add_argument("--dir", required=True)
    p.add_argument("--trace", default=NSYS_TRACE)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--kernel", default="")
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


def run(args: argparse.Namespace) -> int:
    # ProfileError and ProfileFormatError: one line from cli.main, exit 2
    action = {"capture": capture, "parse": parse, "ncu": ncu, "rank": rank, "merge": merge}
    try:
        return action[args.action](args)
    except Stopped as exc:  # the ranks' launch ended after it: its lines said how
        logger.error(
            f"scalestudy profile {args.action}: stopped by {exc.signum.name} (passed on to the "
            "ranks' launch)",
            exc_info=log.debug(),
        )
        return 128 + exc.signum
