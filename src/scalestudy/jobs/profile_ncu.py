"""`scalestudy profile ncu` (its command line: jobs/profile.py): Nsight Compute on the run's
top-K kernels by time, rank 0 only (the other ranks run plain; a profiled NCCL kernel would
wait forever for its serialised peers, so NCCL kernels are never chosen), one ncu pass each:
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

Its own module, apart from the capture (jobs/profile.py): the job runs the ncu parser
(nsight/ncu.py) on its reports, and an edit to that parser reruns it, never the capture.
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
from scalestudy.nsight import classify, schema
from scalestudy.nsight import ncu as ncu_parser

logger = log.get(__name__)


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
# a literal template argument, 4, -1 or 3ul; ncu: (int)4, (int)-1, (unsigned long)3
_NUMBER = re.compile(r"(-?\d+)[uUlL]*(?=\s*[,>])")
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


def kernel_options(kernel: str, launch_skip: int, launch_count: int) -> dict:
    """`profile rank`'s ncu options (jobs/profile.py ncu_argv) for one kernel of the kernels CSV:
    its name filter, the FLOP counters, the launches to skip and profile."""
    return {
        "name_base": ncu_name_base(kernel),
        "kernel_regex": ncu_kernel_regex(kernel),
        "metrics": NCU_METRICS,
        "skip": launch_skip,
        "count": launch_count,
    }


def ncu_command(
    output_base: str,
    kernel: str,
    launch_skip: int,
    launch_count: int,
    cmd: list[str],
    exe: str = "ncu",
) -> list[str]:
    """ncu around `cmd` for one kernel of the kernels CSV: what `profile rank` runs on rank 0."""
    return profile.ncu_argv(
        output_base, cmd, exe, **kernel_options(kernel, launch_skip, launch_count)
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
# (`profile parse --ncu DIR` reads every *.csv of the directory)
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
    # before the first pass (each a whole training run under ncu): an --out found unwritable
    # after them cost hours and left a tool.json naming kernels whose CSV was never written
    outputs = {"--out": args.out, "tool.json of --out-dir": out_dir / "tool.json"}
    files.check_distinct(outputs, {"--kernels": args.kernels}, ProfileError)
    files.check_outputs([args.out, out_dir / "tool.json"], ProfileError)
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
        return _no_ncu(out_dir, args.out, why)
    # before the first pass: without a window each pass trained the whole run and ncu, which
    # profiles only inside it, profiled no kernel (under auto: an empty CSV, after hours)
    profile.require_window(args.train_args, "profile ncu")
    kernel_rows = schema.read_csv(args.kernels, schema.KERNEL_COLUMNS)
    # rank 0's top kernels: the rank ncu profiles (each rank autotunes its own cuDNN engines)
    kernels = schema.top_kernels(
        [r for r in kernel_rows if str(r["rank"]) == "0"] or kernel_rows, args.top_k
    )
    if not kernels:
        raise ProfileError(f"{args.kernels}: no non-NCCL kernel to profile with ncu")
    env = profile.profiler_env(launch.rank_env(dict(os.environ), args.cpus_per_rank), "ncu")
    train_args = profile.trainer_args(args, out_dir / "train")
    launch.hold_local_gpus(env, args.nodes * args.ranks_per_node, train_args)
    options, binds = profile.wrapper_options(args, ncu_path, out_dir)
    args.train_args = list(train_args)
    profile.hash_image_once(args)
    passes = []  # (index, kernel, --launch-skip, the ranks' command): all built, every check
    for i, kernel in enumerate(kernels):  # made, before the earlier run's results are removed
        skip = ncu_launch_skip(kernel_rows, kernel, args.launch_skip, args.launch_count)
        if skip != args.launch_skip:
            logger.info(
                f"ncu k{i}: --launch-skip {skip}, not {args.launch_skip}: rank 0 launches "
                f"{kernel[:80]!r} too few times in the window to skip {args.launch_skip} and "
                f"profile {args.launch_count}",
            )
        prefix = profile.rank_prefix(
            tool="ncu",
            ranks="0",
            dir=profile.wrapper_dir(args, out_dir),
            index=i,
            **kernel_options(kernel, skip, args.launch_count),
            **options,
        )
        passes.append((i, kernel, skip, profile.launch_command(args, prefix, binds)))
    _clear_earlier_ncu(out_dir)
    profiled, not_launched = [], []
    for i, kernel, skip, argv in passes:
        report = out_dir / f"ncu_k{i}.ncu-rep"
        code, output = profile.run_logged(argv, env, out_dir / f"ncu_k{i}.log")
        refused = ncu_refusal(output)
        if refused and not report.exists():
            if args.enabled == "true":
                raise ncu_required(refused)
            why = f"auto: {refused}; no Nsight Compute metrics for {args.run}"
            logger.warning(f"WARNING {why}")
            return _no_ncu(out_dir, args.out, why)
        if code != 0:
            raise profile.failed(argv, code, f" (its output: {out_dir / f'ncu_k{i}.log'})")
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
            profile.run_tool(
                ncu_import_command(str(report)),
                env,
                stdout=f,
                timeout=profile.TOOL_TIMEOUT_S,
                fix="a report cut short needs this `scalestudy profile ncu` again",
            )
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
    return ProfileError(f"{profile.NCU_KEY} is true but {why}")


def _no_ncu(out_dir: Path, out: str, why: str, not_launched: list[str] = ()) -> int:
    """ncu skipped under enabled auto: the manifest says why, the run's profile_ncu CSV is empty."""
    _write_ncu(out_dir, out, {"tool": "none", "why": why, "not_launched": list(not_launched)}, [])
    return 0
