"""`scalestudy profile parse` (its command line: jobs/profile.py): profiler output -> the
profile CSVs (schemas: scalestudy.nsight.schema), from one of
  --capture DIR   a capture directory of `profile capture`: its tool.json says which tool ran
                  and where its output is (nsys stats CSVs, or torch.profiler exports), and
                  which run it is (a capture of another --run is refused)
  --nsys-stats P  `nsys stats --format csv` output made by hand: one CSV, or a directory of them
                  (cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, nvtx_gpu_proj_sum, nvtx_sum or the
                  pre-2023.1 names; recognised by header, rank from `rank<r>` in the file name)
                  and the reports' SQLite exports, nsys_rank<r>.sqlite, for the phases' GPU time
  --ncu P         `ncu --csv --page details` output: one CSV, or every *.csv of a directory
                  (each kernel in one of them), its kernels under ncu's names; or a `profile
                  ncu` directory: the CSVs its tool.json names, each kernel under the kernels
                  CSV's name (the join key of profile_kernels and profile_ncu), none where ncu
                  was skipped (tool "none"); one of another run (tool.json's run) is refused
  The first two write --out-kernels (profile_kernels) and, when given, --out-ranges
  (profile_ranges); --ncu writes --out-ncu (profile_ncu). A file that cannot be parsed is an
  error naming the file and line (exit 2), and no CSV is written.

`scalestudy profile merge`: the runs' profile CSVs -> one CSV per schema.

Its own module, apart from the jobs that launch ranks (jobs/profile.py, jobs/profile_ncu.py):
an edit to a parser (nsight/) reruns the parse of every capture and every ncu directory, a few
seconds each, never the captures or the ncu jobs themselves.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from scalestudy import files, log
from scalestudy.errors import ProfileError, ProfileFormatError
from scalestudy.jobs import profile
from scalestudy.nsight import ncu as ncu_parser
from scalestudy.nsight import nsys, schema, torch_ops

logger = log.get(__name__)


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
    world_size = manifest.get("world_size")  # absent: a capture from before it was recorded
    if world_size is not None and not (type(world_size) is int and world_size >= 1):
        # a hand-edited "2" or 2.0 left every rank's kernels unchecked (profile.expected_ranks
        # checks none of a manifest without one): a lost rank's file left it out of every sum
        raise ProfileFormatError(
            manifest_path,
            None,
            f"has world_size {world_size!r}, not a whole number of ranks (capture writes one, "
            "e.g. 2): edited since? capture again with `scalestudy profile capture`",
        )
    return tool, capture_dir / source, manifest["why"], manifest


# a details CSV `profile ncu` names in its tool.json: a file of the directory, never a path
NCU_CSV = re.compile(r"ncu_k\d+\.csv")


def _ncu_inputs(path: Path, run: str) -> list[tuple[Path, str | None]]:
    """(details CSV, the kernels table's name of its kernel) of each file --ncu reads. A
    `profile ncu` directory: its tool.json's CSVs, each with the kernel it names (tool "none":
    ncu skipped, none), refused where tool.json names a run other than `run` (--run); else
    the CSV, or every *.csv of the directory, with ncu's names."""
    manifest_path = path / "tool.json"
    if not (path.is_dir() and manifest_path.exists()):
        return [(f, None) for f in ncu_parser.ncu_files(path)]
    again = "profile again with `scalestudy profile ncu`"
    try:
        manifest = json.loads(files.read_text(manifest_path, ProfileError, again))
    except ValueError as exc:
        raise ProfileFormatError(manifest_path, None, f"not JSON ({exc}); {again}") from None
    if isinstance(manifest, dict) and manifest.get("run", run) != run:
        # every row is labelled --run: a directory copied from another run's showed that run's
        # kernels as this one's, as a copied capture did (absent: a job before it was recorded)
        raise ProfileFormatError(
            manifest_path,
            None,
            f"the ncu profile of run {manifest['run']!r}, not of --run {run!r} (copied from "
            "another run's directory?): profile this run again with `scalestudy profile ncu`",
        )
    tool = manifest.get("tool") if isinstance(manifest, dict) else None
    if tool == "none":
        return []
    kernels, names = (manifest.get(k) if tool == "ncu" else None for k in ("kernels", "csv"))
    # profile ncu writes tool "none" where it profiled nothing, and each kernel and CSV once
    if not (
        isinstance(kernels, list)
        and isinstance(names, list)
        and 0 < len(kernels) == len(names)
        and all(isinstance(k, str) and k.strip() for k in kernels)
        and all(isinstance(n, str) and NCU_CSV.fullmatch(n) for n in names)
        and len(set(kernels)) == len(set(names)) == len(names)
    ):
        raise ProfileFormatError(
            manifest_path,
            None,
            "not the manifest of `scalestudy profile ncu` (tool none, or tool ncu with its "
            f"kernels and the ncu_k<i>.csv of each, each once); {again}",
        )
    for name in names:
        if not (path / name).is_file():
            raise ProfileFormatError(path / name, None, f"missing (tool.json names it); {again}")
    return [(path / name, kernel) for name, kernel in zip(names, kernels, strict=True)]


def _check_outside(outputs: dict, inputs: dict) -> None:
    """An output inside an input directory replaced a file parse reads (the raw ncu or nsys
    output, the capture's export: GPU time to make again) and exited 0, or joined its files
    (every *.csv of --ncu is read): refused before any work."""
    for flag, directory in inputs.items():
        if not directory or not Path(directory).is_dir():
            continue
        inside = Path(directory).resolve()
        for what, path in outputs.items():
            if Path(path).resolve().is_relative_to(inside):
                raise ProfileError(
                    f"nothing written: {what} {path} is inside {flag} {directory}, which parse "
                    "reads: the write would replace or join its files; give the output a path "
                    "outside it"
                )


def parse(args: argparse.Namespace) -> int:
    """One of --capture, --nsys-stats, --ncu -> the profile CSVs (see the module docstring)."""
    # two outputs one file (k.csv and ./k.csv: two keys of write_texts, the second written over
    # the first), or an output one of the inputs: refused before any work
    outputs = {"--out-kernels": args.out_kernels, "--out-ranges": args.out_ranges}
    outputs["--out-ncu"] = args.out_ncu
    inputs = {"--nsys-stats": args.nsys_stats, "--ncu": args.ncu}
    outputs = {k: v for k, v in outputs.items() if v}
    files.check_distinct(outputs, inputs, ProfileError)
    _check_outside(outputs, {**inputs, "--capture": args.capture})
    if args.ncu:
        if args.out_kernels or args.out_ranges or not args.out_ncu:
            raise ProfileError(
                "--ncu writes --out-ncu (profile_ncu), not --out-kernels or --out-ranges"
            )
        rows = []
        first_in: dict[str, Path] = {}  # kernel -> the file its row came from
        for f, kernel in _ncu_inputs(Path(args.ncu), args.run):
            try:
                parsed = ncu_parser.parse_ncu(f, args.run, kernel=kernel)
            except ProfileFormatError as exc:  # a damaged details CSV: and what remakes it
                raise exc.with_fix(ncu_parser.REEXPORT) from exc.__cause__
            for row in parsed:
                # each file is averaged on its own: a kernel in two (a report exported twice,
                # or the kernel profiled twice) was two profile_ncu rows of one run and kernel.
                # Refused, naming both: one mean of the two would weigh each by its launches
                if (first := first_in.setdefault(row["kernel"], f)) != f:
                    raise ProfileFormatError(
                        f,
                        None,
                        f"kernel {row['kernel']!r} again, also in {first}: each file's "
                        "launches are averaged on their own, so one kernel would be two "
                        f"profile_ncu rows; move one of the two out of {args.ncu}",
                    )
            rows.extend(parsed)
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
        kernels, ranges, gpu_ranks = torch_ops.read_torch(source, args.run)
    found = {int(r["rank"]) for r in kernels}
    expected = profile.expected_ranks(manifest)  # [] where tool.json does not say
    if stray := sorted(found - set(expected)) if expected else []:
        # a rank the capture never profiled (a file copied in by hand): its rows went into
        # profile_kernels.csv beside the run's own
        raise ProfileFormatError(
            source,
            None,
            f"kernels of rank(s) {', '.join(map(str, stray))}, which the capture did not profile "
            f"(tool.json: world size {manifest['world_size']}, ranks {manifest.get('ranks')}): "
            "a file not of this capture; capture again with `scalestudy profile capture`",
        )
    if missing := profile.missing_ranks(manifest, found):
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
    else:
        _warn_torch_host_phases(args.run, source, ranges, gpu_ranks)
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


def _warn_torch_host_phases(
    run: str, source: Path, ranges: list[dict], gpu_ranks: list[int]
) -> None:
    """Say which GPU ranks' torch.profiler phase times are the host's (host_range: the time to
    enqueue each phase, not GPU time), as _warn_phase_time_base says it of nsys's: their trace
    (trace_rank<r>.json) is missing or has no GPU operation. A CPU run's are its real time."""
    ranks = sorted(
        {r["rank"] for r in ranges if r["time_base"] == schema.HOST_RANGE} & set(gpu_ranks)
    )
    if ranks:
        logger.warning(
            f"WARNING {run}: GPU rank(s) {', '.join(map(str, ranks))} have no GPU operation in "
            f"a trace_rank<r>.json beside their export in {source} (missing, or written "
            f"without them): their phase times are host times (time_base {schema.HOST_RANGE}), "
            f"the time to enqueue each phase, not GPU time; {torch_ops.RECAPTURE}"
        )


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
