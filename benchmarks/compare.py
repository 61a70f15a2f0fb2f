"""Our trainer against the plain reference (benchmarks/reference_train.py), side by side, repeated.

Both train the same network (scalestudy.trainer.models.resnet18 at --width), at the same local
batch, precision, world size and data, launched with torchrun; both measure throughput the same way
(images of all ranks / wall seconds over the steady-state window after --warmup-steps). Each
trainer runs --repeats times, interleaved ABBA (ours, ref, ref, ours, ours, ref, ...) so a drift of
the machine (thermals, a neighbour) falls on both alike. Reported: each trainer's median img/s with
its range (min-max) and spread ((max - min) / median), the ratio of the medians (what the targets
in docs/benchmarks.md are about) and the range of the paired ratios (run i of ours / run i of the
reference). Our run's MFU and FLOP rate come from its metrics.json (null on a CPU: no peak).
A spread needs >= 3 runs of each trainer (of 2 it is their difference, of 1 zero): --repeats 1
or 2 is refused unless --smoke (a test of the pipeline, not a measurement), and a trainer with
fewer than 3 runs (--smoke, or a comparison ended early) has no spread: null in --json, "no
spread" in the table.
A failed run ends the comparison in one line (the run, its exit code); --json then holds the runs
that finished, marked "partial", and the exit code is 1. So does a stop signal during a run, or
between two (Ctrl-C, SIGTERM from a time limit or `timeout`, SIGHUP from a closed terminal), after
which compare.py dies of it (a shell says 130, 143, 129); one after the last run, while the table
and --json are written, waits for them (the comparison whole, not partial), says so in one line,
and compare.py dies of it too.
The run's torchrun gets that signal from compare.py, once (it runs in a session of its own), and
compare.py waits for it to stop its ranks: killed outright, it left them training on. A second
stop signal, or a run not stopped in 90 s (supervise.STOP_WAIT_S), kills torchrun and its
ranks (SIGKILL).

    # CPU, the Trainer issue's configuration (docs/benchmarks.md): 2 gloo ranks, local batch 64
    python benchmarks/compare.py --data-dir /tmp/bench --dataset synthetic --nproc 2 \
        --width 64 --local-batch 64 --epochs 2 --limit-train 1024 --warmup-steps 5 \
        --ref-workers 1 --repeats 3
    # one GPU, bf16, local batch 512 (our defaults: --compile auto = on for CUDA)
    python benchmarks/compare.py --data-dir /tmp/bench --dataset synthetic --nproc 1 \
        --width 64 --local-batch 512 --precision bf16 --ref-workers 8 --repeats 3
    # a flag only for our trainer, e.g. without CUDA graphs ("=": the value starts with --);
    # one compare.py gives both trainers (--precision, --local-batch, ...) is refused
    python benchmarks/compare.py ... --ours-flags="--cuda-graphs off"

The data: `scalestudy prepare-data --dataset synthetic --data-dir /tmp/bench --num-train 16384`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scalestudy import files, vocab
from scalestudy.cli import Parser
from scalestudy.errors import TrainConfigError
from scalestudy.jobs import supervise
from scalestudy.trainer import config as train_config
from scalestudy.trainer.config import TrainConfig

HERE = Path(__file__).resolve().parent
SPREAD_RUNS = 3  # the fewest runs of a trainer whose spread is reported (fewer: null)
# flags of our trainer that --ours-flags must not give besides those compare.py gives both
# trainers (argparse keeps the last: ours would run another workload than the reference and the
# result JSON says): why not
NOT_OURS_ONLY = {
    "global_batch": "it overrides the local batch: use --local-batch",
    "model": "the reference trains resnet18 only",
    "out": "compare.py gives each run its own",
    "accum_steps": "the reference steps the optimizer every batch: its global batch is "
    "--local-batch x --nproc",
    # the reference has no --device: ours on the CPU beside its GPU run was a ratio of devices
    "device": "the reference runs on CUDA where there is one; CUDA_VISIBLE_DEVICES= runs both "
    "on the CPU",
}


# SIGTERM (a time limit, `timeout`, `kill`) or SIGHUP (the terminal closed) during the runs,
# raised as Ctrl-C raises KeyboardInterrupt: the runs that finished are still summarised and
# written. Its `signum` is the signal's.
Stopped = supervise.Stopped


def raise_stopped(signum: int, frame) -> None:
    raise Stopped(signum)


# the signals raise_stopped turns into Stopped while the runs go on: SIGHUP too, since torchrun
# runs in a session of its own (run_trainer) and a closed terminal's SIGHUP no longer reaches it
STOPPING = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_raised():
    """STOPPING's signals raise Stopped while inside (their default lost every run that had
    finished), each one's earlier handler again on leaving (an in-process caller's, the
    default). A signal ignored (nohup's SIGHUP) stays ignored."""
    before = {}
    try:
        for signum in STOPPING:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                before[signum] = signal.signal(signum, raise_stopped)
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def run_trainer(cmd: list[str], env: dict) -> int:
    """One run (torchrun) to its end: its exit code. A stop signal to compare.py (Ctrl-C,
    SIGTERM, SIGHUP) is passed on to torchrun once, which passes it on to its ranks (each in a
    session of its own) and waits for them; then it is raised here (KeyboardInterrupt, Stopped).
    A second signal, or a run not stopped in supervise.STOP_WAIT_S, kills torchrun and its
    ranks (supervise.run_to_end). Under subprocess.run torchrun was killed (SIGKILL, at once
    or 0.25 s after Ctrl-C) before or while it passed the signal on: the ranks of a SIGTERM to
    compare.py alone (`kill PID`) trained on, orphaned, holding the devices (and the next
    benchmark's measurements)."""
    return supervise.run_to_end(cmd, env, _say_kill, popen=subprocess.Popen)


def _say_kill(pid: int, why: str) -> None:
    print(f"compare.py: killing torchrun (pid {pid}): {why}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def held_stop_signals():
    """The stop signals that would raise (Ctrl-C's default handler, raise_stopped) only noted
    in the list it yields while inside; an ignored one (a background job's SIGINT) stays so."""
    held: list[int] = []
    raising = (signal.default_int_handler, raise_stopped)
    stops = [s for s in (signal.SIGINT, *STOPPING) if signal.getsignal(s) in raising]
    before = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in stops}
    try:
        yield held
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="compare.py", description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--nproc", type=int, default=2, help="ranks (GPUs, or CPU processes)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--local-batch", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=vocab.PRECISIONS)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--ref-workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--threads-per-rank", type=int, default=1, help="OMP_NUM_THREADS (CPU)")
    p.add_argument(
        "--repeats", type=int, default=3, help=f"runs of each trainer (>= {SPREAD_RUNS}: a spread)"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help=f"a test of the pipeline: allows --repeats < {SPREAD_RUNS} (no spread is reported)",
    )
    p.add_argument(
        "--ours-flags", default="", help='extra flags of our trainer only, e.g. "--compile off"'
    )
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    # before the first run: --ref-workers -1 failed in the reference's first run, after ours
    for flag, least in (("repeats", 1), ("nproc", 1), ("ref_workers", 0), ("threads_per_rank", 1)):
        if getattr(args, flag) < least:
            p.error(f"--{flag.replace('_', '-')} must be >= {least}, got {getattr(args, flag)}")
    if args.repeats < SPREAD_RUNS and not args.smoke:  # a "spread" of 1 or 2 runs reads as one
        p.error(
            f"--repeats {args.repeats}: a median and spread need >= {SPREAD_RUNS} runs of each "
            f"trainer; use --repeats {SPREAD_RUNS}, or add --smoke for a test without a spread"
        )
    try:
        args.ours_argv = shlex.split(args.ours_flags)
    except ValueError as exc:  # an unbalanced quote
        p.error(f"--ours-flags {args.ours_flags!r}: {exc}")
    try:  # what our trainer would refuse in its first run (flag and value checks, no torch)
        TrainConfig.from_argv(ours_train_flags(args, Path("ours")))
    except TrainConfigError as exc:
        p.error(f"our trainer's flags: {exc}")
    if overrides := overriding(args):
        p.error(f"--ours-flags {args.ours_flags!r} may not set {'; '.join(overrides)}")
    try:  # before the first run, not after the last
        files.check_outputs([args.json] if args.json else [], ValueError)
    except ValueError as exc:
        p.error(f"--json: {exc}")
    return args


def common_flags(args: argparse.Namespace) -> list[str]:
    """The flags both trainers get, with the same values."""
    return [
        *("--data-dir", args.data_dir, "--dataset", args.dataset),
        *("--width", str(args.width), "--local-batch", str(args.local_batch)),
        *("--epochs", str(args.epochs), "--precision", args.precision),
        *("--warmup-steps", str(args.warmup_steps), "--limit-train", str(args.limit_train)),
    ]


def overriding(args: argparse.Namespace) -> list[str]:
    """The flags of --ours-flags that compare.py gives both trainers (or NOT_OURS_ONLY), each
    with what to do instead; the names as argparse reads them (`--prec` is --precision)."""
    given = train_config.given_fields(args.ours_argv)
    shared = [flag[2:].replace("-", "_") for flag in common_flags(args)[::2]]
    why = {name: f"use compare.py's --{train_config.flag_name(name)}" for name in shared}
    why |= NOT_OURS_ONLY
    return [f"--{train_config.flag_name(name)} ({why[name]})" for name in why if name in given]


def ours_train_flags(args: argparse.Namespace, ours_out: Path) -> list[str]:
    """`scalestudy train`'s flags: the common ones, then ours only, then --ours-flags."""
    # evaluation is outside both windows; a short test set and no probe keep the runs short
    ours = [*common_flags(args), "--comm-probe-steps", "0", "--limit-test", "512"]
    return [*ours, "--no-tensorboard", "--out", str(ours_out), *args.ours_argv]


def commands(args: argparse.Namespace, ours_out: Path, ref_out: Path) -> dict[str, list[str]]:
    """The two trainers' command lines, the same flags where both have them."""
    ours = [*torchrun(args.nproc), "-m", "scalestudy", "train", *ours_train_flags(args, ours_out)]
    ref = [*torchrun(args.nproc), str(HERE / "reference_train.py"), *common_flags(args)]
    ref += ["--num-workers", str(args.ref_workers), "--out", str(ref_out)]
    return {"ours": ours, "reference": ref}


def order(repeats: int) -> list[str]:
    """ABBA: ours, reference, reference, ours, ours, reference, ..."""
    pairs = [("ours", "reference"), ("reference", "ours")]
    return [name for i in range(repeats) for name in pairs[i % 2]]


def summary(values: list[float]) -> dict:
    """Median, range and spread of one trainer's runs; the spread null under SPREAD_RUNS runs
    (of 2 it is their difference, of 1 zero: no measure of the noise)."""
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if len(values) >= SPREAD_RUNS else None
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread": spread,
        "runs": values,
    }


def compare(ours: list[float], ref: list[float]) -> dict:
    """Medians, ranges, the ratio of the medians and the range of the paired ratios (run i of
    each; None where a trainer has no run: the runs that finished before one failed)."""
    paired = [a / b for a, b in zip(ours, ref, strict=False)]  # the pairs complete so far
    both = bool(ours and ref)
    return {
        "ours": summary(ours) if ours else None,
        "reference": summary(ref) if ref else None,
        "ratio": statistics.median(ours) / statistics.median(ref) if both else None,
        "paired_ratio_min": min(paired) if paired else None,
        "paired_ratio_max": max(paired) if paired else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta = Path(args.data_dir) / args.dataset / "meta.json"
    if not meta.exists():
        sys.exit(
            f"missing {meta}: run `scalestudy prepare-data --dataset {args.dataset} "
            f"--data-dir {args.data_dir}` first"
        )
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads_per_rank), PYTHONUNBUFFERED="1")
    results: dict[str, list[dict]] = {"ours": [], "reference": []}
    failed = None  # (run, exit code): the runs stop at a failed one, those that finished are kept
    stopped = None  # the signal that stopped a run: its runs that finished are kept too
    runs = order(args.repeats)
    label = [f"{name} run {i // 2 + 1}/{args.repeats}" for i, name in enumerate(runs)]
    tmp = tempfile.TemporaryDirectory()
    try:
        with stop_signals_raised():
            # a stop signal during a run stops it (torchrun, its ranks) before it is raised; one
            # between two runs (none to stop) is caught here too: around the run only, it was a
            # traceback that lost the runs that had finished
            try:
                for i, name in enumerate(runs):
                    ours_out = Path(tmp.name) / f"ours{i}"
                    ref_out = Path(tmp.name) / f"reference{i}.json"
                    cmd = commands(args, ours_out, ref_out)[name]
                    print(
                        f"--- {name} ({i // 2 + 1}/{args.repeats}): {shlex.join(cmd)}", flush=True
                    )
                    rc = run_trainer(cmd, env)
                    out = ours_out / "metrics.json" if name == "ours" else ref_out
                    if rc != 0 or not out.exists():
                        failed = (label[i], rc)
                        break
                    results[name].append(json.loads(out.read_text()))
            except (KeyboardInterrupt, Stopped) as exc:
                stopped = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum
                done = len(results["ours"]) + len(results["reference"])  # the runs go in order
                if done < len(runs):  # (else it came after the last one: the comparison is whole)
                    failed = (label[done], 128 + stopped)  # as a shell reports a signal's end
            # the runs are over: a stop signal now (the milliseconds of the table and the --json
            # write) is noted and acted on once they are done; raised, or at its default once
            # the runs' handlers were gone, it was a traceback or a silent death before --json
            with held_stop_signals() as held:
                tmp.cleanup()
                result = summarize(args, results["ours"], results["reference"])
                result.update(partial=failed is not None, failed_run=None, failed_exit_code=None)
                if failed:
                    result.update(failed_run=failed[0], failed_exit_code=failed[1])
                if result["ratio"] is not None:
                    print_table(result, args)
                written = write_result(args.json, result)
    finally:
        tmp.cleanup()  # after an error in a run (else done above, the signals held)
    late = None if stopped or not held else signal.Signals(held[0])  # a stop after the runs
    done = len(results["ours"]) + len(results["reference"])
    kept = f", written to {args.json}" if args.json and written else ""
    if failed:
        if stopped:
            why = f"stopped by {stopped.name}"
        elif failed[1]:
            why = f"failed (exit code {failed[1]})"
        else:
            why = f"failed (exit code 0 but no {out.name})"
        kept += " (partial)" if kept else ""
        print(f"compare.py: {failed[0]} {why}; {done} runs had finished{kept}", file=sys.stderr)
        if late:  # the failure's line, then the signal's end: a script running it stops too
            return 128 + late
        return failed[1] if stopped else 1
    if stopped := stopped or late:  # after the last run: all written; a script running it stops
        why = f"stopped by {stopped.name} after the last run"
        print(f"compare.py: {why}; {done} runs had finished{kept}", file=sys.stderr)
        return 128 + stopped
    return 0 if written else 1


def summarize(args: argparse.Namespace, ours: list[dict], ref: list[dict]) -> dict:
    """The result JSON: compare() of the two trainers' throughputs (the runs that finished), the
    configuration, our runs' MFU (null where ours has no finished run)."""
    result = compare([m["throughput_img_s"] for m in ours], [m["throughput_img_s"] for m in ref])
    keys = ("device", "compiled", "flops_per_img", "mfu_unmeasured", "torch_version")
    last = ours[-1] if ours else dict.fromkeys(keys)
    result.update(
        device=last["device"],
        world_size=args.nproc,
        width=args.width,
        local_batch=args.local_batch,
        precision=args.precision,
        epochs=args.epochs,
        limit_train=args.limit_train,
        repeats=args.repeats,
        smoke=args.smoke,
        ours_flags=args.ours_flags,
        ours_compiled=last["compiled"],
        ours_flops_per_img=last["flops_per_img"],
        ours_mfu=[m["mfu"] for m in ours],
        ours_mfu_unmeasured=last["mfu_unmeasured"],
        ours_model_flops_per_s=[m["model_flops_per_s"] for m in ours],
        ours_best_val_acc=[m["best_val_acc"] for m in ours],
        reference_final_train_loss=[m["final_train_loss"] for m in ref],
        reference_num_workers=args.ref_workers,
        torch_version=last["torch_version"],
        python=platform.python_version(),
        cpu_count=os.cpu_count(),
    )
    return result


def write_result(path: str | None, result: dict) -> bool:
    """--json, atomically (a failed write keeps the file that was there); one line if it fails."""
    if path:
        try:
            files.write_json(path, result)  # the trainers' JSON is strict: no NaN to write
        except OSError as exc:
            print(f"compare.py: --json {path}: {files.write_cause(exc)}", file=sys.stderr)
            return False
    return True


def print_table(r: dict, args: argparse.Namespace) -> None:
    print(f"\n{'':10} {'median img/s':>14} {'min':>10} {'max':>10} {'spread':>8}")
    for name in ("ours", "reference"):
        s = r[name]
        spread = f"{100 * s['spread']:7.1f}%" if s["spread"] is not None else f"{'none':>8}"
        print(f"{name:10} {s['median']:14,.1f} {s['min']:10,.1f} {s['max']:10,.1f} {spread}")
    mfu = [m for m in r["ours_mfu"] if m is not None]
    n = (len(r["ours"]["runs"]), len(r["reference"]["runs"]))
    runs = (
        f"{n[0]} {vocab.plural('runs', n[0])} each" if n[0] == n[1] else f"{n[0]} and {n[1]} runs"
    )
    mfu_text = f"MFU {100 * statistics.median(mfu):.1f}%" if mfu else r["ours_mfu_unmeasured"]
    if None in (r["ours"]["spread"], r["reference"]["spread"]):  # said, not left to a blank
        smoke = " (--smoke)" if args.smoke else ""
        finished = "" if n == (args.repeats, args.repeats) else f", {runs} finished"
        print(
            f"no spread: {args.repeats} repeats{smoke}{finished}; a spread needs >= "
            f"{SPREAD_RUNS} runs of each trainer"
        )
    print(
        f"ratio      {r['ratio']:14.2f}x  (paired runs {r['paired_ratio_min']:.2f}-"
        f"{r['paired_ratio_max']:.2f}; {runs}, {args.nproc} {vocab.plural('ranks', args.nproc)}, "
        f"{r['device']['name']}, width {args.width}, local batch {args.local_batch}, "
        f"{args.precision}; ours: {mfu_text})"
    )


def exit_with(code: int) -> None:
    """Exit with main's code; after a stop signal (code 128 + its number), die of that signal:
    a shell running compare.py (gpu_node.sh's steps) goes on to its next command unless its
    child died of the Ctrl-C it got too (bash's wait-and-cooperative-exit), and exit 130 is not
    dying of it."""
    if code - 128 in (signal.SIGINT, *STOPPING):
        sys.stdout.flush()
        signal.signal(code - 128, signal.SIG_DFL)
        os.kill(os.getpid(), code - 128)
    raise SystemExit(code)


if __name__ == "__main__":
    exit_with(main())
