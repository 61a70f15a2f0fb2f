"""`scalestudy profile ncu` (its command line: jobs/profile.py): Nsight Compute on the run's
top-K kernels by time, rank 0 only (the other ranks run plain; a profiled NCCL kernel would
wait forever for its serialised peers, so NCCL kernels are never chosen), one ncu pass each:
      ncu --profile-from-start off --clock-control none --set full --metrics <FLOP counters> \\
          --kernel-name-base demangled -k regex:<the whole demangled name> \\
          --launch-skip S' --launch-count C --target-processes all -o DIR/ncu_k<i>
  (S' = S clamped so that C launches remain of the kernel's instances on rank 0 in the nsys
  window), then `ncu -i DIR/ncu_k<i>.ncu-rep --csv --page details --print-units base
  --print-metric-name name` -> DIR/ncu_k<i>.csv (whole or not at all). The kernels, their name
  filters and launches come from --kernels, the file `profile ncu-kernels` made of the capture's
  kernels table (jobs/ncu_kernels.py); the first --top-k of it are profiled. DIR/tool.json
  names the kernel of each CSV (`kernels`, `csv`: the kernels table's names, which `profile
  parse --ncu DIR` gives the rows, the join key of profile_kernels and profile_ncu) and the
  `run` (the parse refuses the directory under another --run: a copied one). DIR is
  checked before the first pass; an earlier run's tool.json and ncu_k<i>.{csv,ncu-rep,log} in
  DIR are removed after the command's checks (every pass's command built), the user's own files
  kept, so the parse reads only this run's kernels (none where ncu is skipped).
  --clock-control none: the GPU at the clocks the timed runs see (ncu locks them to base by
  default, so its durations would disagree with the timed runs). ncu's process autotunes cuDNN
  afresh (cudnn.benchmark), so it may choose other convolution engines than the capture did
  (two of an H200's top 10 never launched under ncu): a kernel whose filter matched no launch
  is left out with a warning and named in tool.json's `not_launched`; none profiled at all is
  an error under enabled true and, under auto, a tool.json of tool "none" saying why (the
  parse writes an empty CSV of it).

Its own module, apart from the capture (jobs/profile.py), and it imports no parser: the parse
of its reports is a step of its own (the workflow's profile_ncu_parse), so an edit to a parser
(nsight/) reruns that parse, never this job, a whole training run per kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from pathlib import Path

from scalestudy import files, log
from scalestudy.errors import ProfileError
from scalestudy.jobs import launch, profile
from scalestudy.nsight.ncu_metrics import NCU_METRICS

logger = log.get(__name__)


# an entry of the --kernels file (jobs/ncu_kernels.py writes it): its keys and their types
KERNEL_KEYS = {"kernel": str, "name_base": str, "kernel_regex": str, "instances": int}
NAME_BASES = ("demangled", "mangled")  # ncu --kernel-name-base
KERNELS_FIX = "make it again with `scalestudy profile ncu-kernels --kernels <the kernels CSV>`"
# an empty --kernels list: rank 0's capture window (every rank's, where rank 0 has none) held no
# kernel but NCCL, memcpy and memset ones (jobs/ncu_kernels.py; config checks keep cuda in
# profiling.nsys_trace, and a capture of no kernel at all is refused when it is made)
NO_KERNEL_FIX = (
    "its capture's window held none but NCCL, memcpy and memset kernels (rank 0's; the run's "
    "kernels.csv, and its logs/profile_capture log says how it was captured): capture it again "
    "over training steps (profiling.start_step, profiling.steps), or set "
    f"{profile.NCU_KEY}: false"
)


def kernel_problem(entry: object) -> str | None:
    """What is wrong with one entry of the --kernels file, None when ncu can use it."""
    if not isinstance(entry, dict) or set(entry) != set(KERNEL_KEYS):
        return f"not an object of the keys {sorted(KERNEL_KEYS)}"
    for key, kind in KERNEL_KEYS.items():
        value = entry[key]  # type(): a bool is no count of launches
        if type(value) is not kind or (value.strip() == "" if kind is str else value < 0):
            what = "a non-empty string" if kind is str else "a whole number >= 0"
            return f"its {key} is {value!r}, not {what}"
    if entry["name_base"] not in NAME_BASES:
        return f"its name_base is {entry['name_base']!r}, not one of {list(NAME_BASES)}"
    try:  # ncu's regex dialect and Python's share what ncu_kernels writes
        re.compile(entry["kernel_regex"])
    except re.error as exc:
        return f"its kernel_regex {entry['kernel_regex']!r} is no regex ({exc})"
    return None


def read_kernels(path: str | Path) -> list[dict]:
    """The --kernels file: a list of KERNEL_KEYS entries, or one ProfileError line naming the
    file, the entry and the fix (a job that read a damaged file ran for hours, then failed)."""
    text = files.read_text(path, ProfileError, KERNELS_FIX)
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise ProfileError(f"{path}: not JSON ({exc}); {KERNELS_FIX}") from None
    if not isinstance(entries, list):
        raise ProfileError(f"{path}: not a JSON list of kernels; {KERNELS_FIX}")
    seen = set()
    for i, entry in enumerate(entries):
        if problem := kernel_problem(entry):
            raise ProfileError(f"{path}, kernel {i}: {problem}; {KERNELS_FIX}")
        if entry["kernel"] in seen:  # a second whole run under ncu for the same kernel
            raise ProfileError(f"{path}, kernel {i}: {entry['kernel']!r} again; {KERNELS_FIX}")
        seen.add(entry["kernel"])
    return entries


def launch_skip(entry: dict, skip: int, count: int) -> int:
    """--launch-skip for one kernel: ncu counts only launches of the filtered kernel, and ncu
    profiles rank 0, so at most (its instances in the nsys window - count) may be skipped; a
    larger skip (10 of a once-per-step kernel in a 10-step window) would profile nothing."""
    return min(skip, max(0, entry["instances"] - count))


def kernel_options(entry: dict, launch_skip: int, launch_count: int) -> dict:
    """`profile rank`'s ncu options (jobs/profile.py ncu_argv) for one kernel of the --kernels
    file: its name filter, the FLOP counters, the launches to skip and profile."""
    return {
        "name_base": entry["name_base"],
        "kernel_regex": entry["kernel_regex"],
        "metrics": NCU_METRICS,
        "skip": launch_skip,
        "count": launch_count,
    }


def ncu_command(
    output_base: str,
    entry: dict,
    launch_skip: int,
    launch_count: int,
    cmd: list[str],
    exe: str = "ncu",
) -> list[str]:
    """ncu around `cmd` for one kernel of the --kernels file: what `profile rank` runs on rank 0."""
    return profile.ncu_argv(
        output_base, cmd, exe, **kernel_options(entry, launch_skip, launch_count)
    )


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
            f"(NVreg_RestrictProfilingToAdminUsers=0), or set {profile.NCU_KEY}: false"
        )
    return None


# what `profile ncu` writes into --out-dir: an earlier run's are removed first, so that a kernel
# it profiled and this run did not (a smaller top_k, ncu skipped) is not parsed as this run's
NCU_MADE = re.compile(r"tool\.json|ncu_k\d+\.(csv|ncu-rep|log)")


def _clear_earlier_ncu(out_dir: Path) -> None:
    for old in out_dir.iterdir():
        if NCU_MADE.fullmatch(old.name) and not old.is_dir():
            old.unlink()


def check_own_dir(out_dir: Path) -> None:
    """ProfileError where --out-dir holds a tool.json that is not ncu's (a capture's: it has
    an `input`): removing it (_clear_earlier_ncu) left that capture unparseable."""
    manifest = out_dir / "tool.json"
    if not manifest.is_file():
        return
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        doc = None
    if not (isinstance(doc, dict) and doc.get("tool") in ("ncu", "none") and "input" not in doc):
        raise ProfileError(
            f"--out-dir {out_dir}: its tool.json is not ncu's (a capture's?): give profile ncu "
            "a directory of its own (the workflow's results/profile/<run>/ncu)"
        )


def ncu(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    manifest = out_dir / "tool.json"
    # before the first pass (each a whole training run under ncu): a tool.json found unwritable
    # after them cost hours
    files.check_distinct(
        {"tool.json of --out-dir": manifest}, {"--kernels": args.kernels}, ProfileError
    )
    files.check_outputs([manifest], ProfileError)
    check_own_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ncu_path = shutil.which("ncu")
    if args.device != "cuda" or ncu_path is None:
        missing = "no GPU (hardware.device: cpu)" if args.device != "cuda" else "`ncu` not on PATH"
        if args.enabled == "true":
            raise ncu_required(
                f"{missing}: load Nsight Compute (e.g. `module load nsight-compute`) or set "
                f"{profile.NCU_KEY}: auto"
            )
        why = f"auto: {missing}, no Nsight Compute metrics for {args.run}"
        logger.info(why)
        _clear_earlier_ncu(out_dir)
        return _no_ncu(out_dir, args.run, why)
    # before the first pass: without a window each pass trained the whole run and ncu, which
    # profiles only inside it, profiled no kernel (under auto: an empty CSV, after hours)
    profile.require_window(args.train_args, "profile ncu")
    kernels = read_kernels(args.kernels)[: args.top_k]
    if not kernels:
        raise ProfileError(
            f"{args.kernels}: no non-NCCL kernel of {args.run} to profile with ncu: {NO_KERNEL_FIX}"
        )
    env = profile.profiler_env(launch.rank_env(dict(os.environ), args.cpus_per_rank), "ncu")
    train_args = profile.trainer_args(args, out_dir / "train")
    launch.hold_local_gpus(env, args.nodes * args.ranks_per_node, train_args)
    options, binds = profile.wrapper_options(args, ncu_path, out_dir)
    args.train_args = list(train_args)
    profile.hash_image_once(args)
    passes = []  # (index, kernel, --launch-skip, the ranks' command): all built, every check
    for i, entry in enumerate(kernels):  # made, before the earlier run's results are removed
        skip = launch_skip(entry, args.launch_skip, args.launch_count)
        if skip != args.launch_skip:
            logger.info(
                f"ncu k{i}: --launch-skip {skip}, not {args.launch_skip}: rank 0 launches "
                f"{entry['kernel'][:80]!r} too few times in the window to skip "
                f"{args.launch_skip} and profile {args.launch_count}",
            )
        prefix = profile.rank_prefix(
            tool="ncu",
            ranks="0",
            dir=profile.wrapper_dir(args, out_dir),
            index=i,
            **kernel_options(entry, skip, args.launch_count),
            **options,
        )
        passes.append((i, entry, skip, profile.launch_command(args, prefix, binds)))
    _clear_earlier_ncu(out_dir)
    profiled, not_launched = [], []
    for i, entry, skip, argv in passes:
        kernel = entry["kernel"]
        report = out_dir / f"ncu_k{i}.ncu-rep"
        code, output = profile.run_logged(argv, env, out_dir / f"ncu_k{i}.log")
        refused = ncu_refusal(output)
        if refused and not report.exists():
            if args.enabled == "true":
                raise ncu_required(refused)
            why = f"auto: {refused}; no Nsight Compute metrics for {args.run}"
            logger.warning(f"WARNING {why}")
            return _no_ncu(out_dir, args.run, why)
        if code != 0:
            raise profile.failed(argv, code, f" (its output: {out_dir / f'ncu_k{i}.log'})")
        if not report.exists():
            # ncu writes no report when its filter matched no launch: this process's cuDNN
            # autotuning chose other engines than the capture's (or the skip was too large)
            logger.warning(
                f"WARNING {args.run}: ncu k{i} profiled nothing: no launch of {kernel[:120]!r} "
                f"matched --kernel-name regex:{entry['kernel_regex']} (--launch-skip {skip}) "
                "on rank 0 (cudnn.benchmark may have chosen another engine in ncu's process); "
                "left out of the ncu metrics"
            )
            not_launched.append(kernel)
            continue
        # whole or not at all: a failed or stopped import left a half-written CSV
        with files.atomic_open(out_dir / f"ncu_k{i}.csv") as f:
            profile.run_tool(
                ncu_import_command(str(report)),
                env,
                stdout=f,
                timeout=profile.TOOL_TIMEOUT_S,
                fix="a report cut short needs this `scalestudy profile ncu` again",
            )
        profiled.append((f"ncu_k{i}.csv", kernel))
    if not profiled:
        why = (
            f"none of the top {len(kernels)} kernels of {args.kernels} launched on rank 0 "
            "under ncu (see the WARNING lines above)"
        )
        if args.enabled == "true":
            raise ncu_required(why)
        logger.warning(f"WARNING auto: {why}; no Nsight Compute metrics for {args.run}")
        return _no_ncu(out_dir, args.run, f"auto: {why}", not_launched)
    # the kernels table's names, not ncu's spellings of them: the parse labels each CSV's rows
    # with its kernel (profile_ncu joins profile_kernels by name); the run, so that the parse
    # of a directory copied into another run's refuses it instead of labelling it that run's
    files.write_json(
        manifest,
        {
            "run": args.run,
            "tool": "ncu",
            "why": ncu_path,
            "kernels": [k for _, k in profiled],
            "csv": [name for name, _ in profiled],
            "not_launched": not_launched,
        },
    )
    logger.info(f"{args.run}: ncu profiled {len(profiled)} kernels -> {out_dir}")
    return 0


def ncu_required(why: str) -> ProfileError:
    """The error of `profile ncu --enabled true` (the study's profiling.ncu.enabled: true) where
    ncu cannot profile; under auto the same `why` skips ncu instead."""
    return ProfileError(f"{profile.NCU_KEY} is true but {why}")


def _no_ncu(out_dir: Path, run: str, why: str, not_launched: list[str] = ()) -> int:
    """ncu skipped under enabled auto: the manifest says why (the parse writes an empty CSV)
    and whose run it is (as ncu's own manifest)."""
    manifest = {"run": run, "tool": "none", "why": why, "not_launched": list(not_launched)}
    files.write_json(out_dir / "tool.json", manifest)
    return 0
