"""`scalestudy collect`: every run's metrics.json and epochs.csv -> tidy CSVs.

results/csv/runs.csv   one row per run: the run-table columns, then every metrics.json key,
                       sorted (device -> device_type, device_name; lists joined with ';').
results/csv/epochs.csv one row per run and epoch: run, the identifying run columns, the epoch row.

time_to_target_s is read off the run's epochs.csv with the run table's target_acc (the training
job is given none: a flag, changing the threshold retrained every run; vocab.time_to_target).
A key present in both the run table and metrics.json must agree (the run table's device with
metrics.json's device type; target_acc aside): a disagreement means the result
on disk came from another configuration (a stale or hand-copied run) and is refused, naming the
run, the key and both values; so are runs of one dataset that read different prepared data
(data_sha256: data_problem). A run without a complete metrics.json is an error that names the
file and the command that produces it, never a silent blank row; one that lacks a key of
REQUIRED_METRICS (an older trainer's) names the keys and the commit that trained it
(metrics.json's git_commit), whose collect reads it, before training it again. The fix named
is Snakemake's for the study's own runs (RUNS_DIR): train it, or delete the run and train it
again; a --runs-dir given by hand may hold the user's own runs, never to be deleted
(run_fix). --out-runs and --out-epochs naming one file, or one naming the run table (--runs),
is refused before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import CollectError
from scalestudy.results import analyze
from scalestudy.study import model
from scalestudy.study.runs import RUN_COLUMNS, read_runs_tsv, same, trainer_args
from scalestudy.trainer.config import NOT_IDENTITY, TrainConfig

logger = log.get(__name__)

# the workflow's directory of the runs (rules/train.smk's outputs, rules/collect.smk's --runs-dir)
RUNS_DIR = "results/runs"

# metrics.json keys the trainer always writes (issue "Trainer"); collect checks them. Not the
# keys added since (data_sha256, energy_*, ...): a finished run of an older trainer, which
# Snakemake keeps, would be refused, to be collected by the older scalestudy or trained again
REQUIRED_METRICS = (
    "world_size",
    "nodes",
    "ranks_per_node",
    "device",
    "global_batch",
    "throughput_img_s",
    "throughput_img_s_per_rank",
    "epoch_time_s",
    "step_time_ms_p50",
    "step_time_ms_p95",
    "data_time_frac",
    "comm_exposed_frac",
    "peak_mem_mb",
    "gpu_util_mean",
    "final_val_acc",
    "best_val_acc",
    "time_to_target_s",
    "train_time_s",
    "git_commit",
    "torch_version",
    "cuda_version",
    "nccl_version",
    "hostnames",
    "slurm_job_id",
    "container_digest",
    "seed",
    "config_hash",
    "started_at",
    "restarts",
    "resumed_from_epochs",
)
EPOCH_ID_COLUMNS = (
    "run",
    "families",
    "world_size",
    "local_batch",
    "global_batch",
    "precision",
    "bucket_cap_mb",
    "repeat",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", required=True, help="run table (results/matrix/runs.tsv)")
    parser.add_argument("--runs-dir", default=RUNS_DIR, help="directory of the run outputs")
    parser.add_argument("--out-runs", default="results/csv/runs.csv")
    parser.add_argument("--out-epochs", default="results/csv/epochs.csv")


def run(args: argparse.Namespace) -> int:
    # a CollectError: one line from cli.main, exit 2
    # the two tables one file: the epochs were written over the runs, and the command said both
    outputs = {"--out-runs": args.out_runs, "--out-epochs": args.out_epochs}
    table = read_runs_tsv(args.runs)
    # nor a run's own record, its only one (a path's typo replaced it with the merged table)
    records = [Path(args.runs_dir, row["run"], name) for row in table for name in RUN_FILES]
    files.check_distinct(
        outputs, {"--runs": args.runs, **{str(p): p for p in records}}, CollectError
    )
    runs_rows, epoch_rows = collect(table, Path(args.runs_dir))
    files.check_outputs([args.out_runs, args.out_epochs], CollectError)
    # both or neither: a write that fails (a full disk) leaves the old pair
    files.write_texts(
        {
            args.out_runs: files.csv_text(runs_columns(runs_rows), runs_rows),
            args.out_epochs: files.csv_text(None, epoch_rows),
        }
    )
    logger.info(
        f"collected {len(runs_rows)} runs, {len(epoch_rows)} epoch rows -> "
        f"{args.out_runs}, {args.out_epochs}"
    )
    return 0


def runs_columns(runs_rows: list[dict]) -> list[str]:
    """runs.csv's columns: the run table's (RUN_COLUMNS order), then every metrics.json key
    sorted, as the trainer writes them (json sort_keys), device's device_type and device_name
    where device sorts. In first-seen order a run of an older trainer (fewer keys) put the
    newer keys last where it came first, and elsewhere among the others: one study's runs.csv
    had its columns in an order that depended on the order of its runs."""
    seen = dict.fromkeys(key for row in runs_rows for key in row)
    table = [c for c in RUN_COLUMNS if c in seen]
    device = {f"device_{k}": i for i, k in enumerate(DEVICE)}  # flatten's columns of device

    def place(column: str) -> tuple[str, int]:
        return ("device", device[column]) if column in device else (column, 0)

    return table + sorted((c for c in seen if c not in table), key=place)


RUN_FILES = ("metrics.json", "epochs.csv")  # what collect reads of each run
GRAD_BYTES = model.GRAD_BYTES_CELL.or_blank()  # blank: a trainer from before it was recorded


def collect(table: list[dict], runs_dir: Path) -> tuple[list[dict], list[dict]]:
    runs_rows, epoch_rows = [], []
    for row in table:
        run_dir = runs_dir / row["run"]
        metrics = load_metrics(run_dir / "metrics.json")
        merged = dict(row)
        flat = flatten(metrics)
        # metrics.json's device is a dict (type, name): the run table's device is its type
        shared = {**flat, **({"device": flat["device_type"]} if "device_type" in flat else {})}
        for key, value in shared.items():
            # the threshold applied below, the run table's (the trainer is given none)
            if key == "target_acc":
                continue
            if key in merged and not same(merged[key], value):
                raise CollectError(
                    f"run {row['run']}: {key} is {merged[key]!r} in the run table but {value!r} in "
                    f"{run_dir / 'metrics.json'}: the result is from another configuration; "
                    f"{run_fix(run_dir / 'metrics.json')}"
                )
            merged.setdefault(key, value)
        if differs := flag_differences(row, metrics):
            raise CollectError(
                f"run {row['run']}: {run_dir / 'metrics.json'} was trained with {differs}: the "
                f"result is from another configuration; {run_fix(run_dir / 'metrics.json')}"
            )
        # the measurements analyze reads, checked as analyze checks runs.csv, here where the
        # fix is to rerun the run: refused in runs.csv, the value came back with every collect
        measured = {k: v for k, v in merged.items() if k not in row}
        if bad := analyze.run_row_problem(measured) or model_cell_problem(measured):
            column, what = bad
            raise CollectError(
                f"{run_dir / 'metrics.json'}: {column} is {measured[column]!r}, not {what}: not "
                f"the trainer's; {run_fix(run_dir / 'metrics.json')}"
            )
        epochs = load_epochs(run_dir / "epochs.csv")
        if problem := history_problem(epochs, merged):
            raise CollectError(
                f"{run_dir / 'epochs.csv'}: {problem}: not this run's whole history; "
                f"{run_fix(run_dir / 'epochs.csv')}"
            )
        merged["time_to_target_s"] = vocab.time_to_target(epochs, row["target_acc"])
        runs_rows.append(merged)
        for epoch in epochs:
            epoch_rows.append({**{c: row[c] for c in EPOCH_ID_COLUMNS}, **epoch})
    if problem := data_problem(runs_rows, runs_dir):
        raise CollectError(problem)
    return runs_rows, epoch_rows


SHOWN_RUNS = 5  # runs named per prepared data in data_problem's line; the rest are counted


def data_problem(runs_rows: list[dict], runs_dir: Path) -> str | None:
    """One line where runs of one dataset read different prepared data (metrics.json's
    data_sha256, loaders.data_sha256), else None. The study's runs of a dataset all read one
    data/<dataset>/; a run trained on a set prepared by hand with another seed or mean/std
    (sizes that pass --expect-train/--expect-test) was collected with them, and the figures
    compared runs that saw different images. A run of a trainer before data_sha256 (blank) is
    not compared. The runs of each data are named, the fewest last: the likely odd ones."""
    by_dataset: dict[str, dict[str, list[str]]] = {}
    for merged in runs_rows:
        if sha := merged.get("data_sha256"):
            data = by_dataset.setdefault(str(merged["dataset"]), {})
            data.setdefault(str(sha), []).append(merged["run"])
    for dataset, data in by_dataset.items():
        if len(data) > 1:
            groups = sorted(data.items(), key=lambda item: -len(item[1]))
            said = " and ".join(
                ", ".join(runs[:SHOWN_RUNS])
                + (f" and {len(runs) - SHOWN_RUNS} more" if len(runs) > SHOWN_RUNS else "")
                + f" (data_sha256 {sha[:12]})"
                for sha, runs in groups
            )
            odd = groups[-1][1][0]
            return (
                f"the runs of dataset {dataset} read different prepared data: {said}; the "
                "figures would compare runs that saw different images. Keep the runs of the "
                f"data the study prepares now: if {odd} is not one, "
                f"{run_fix(runs_dir / odd / 'metrics.json')}"
            )
    return None


def model_cell_problem(measured: dict) -> tuple[str, str] | None:
    """(column, what it must be) of a cell the scaling model reads and refuses (study/model.py:
    grad_sync_bytes, the phase shares), else None: its refusal names collect as the fix, which
    wrote the same value again, so a damaged metrics.json is refused here, where the fix is to
    rerun the run. Blank: not measured."""
    for column, value in measured.items():
        rule = GRAD_BYTES if column == "grad_sync_bytes" else None
        if column.startswith("phase_frac_"):  # a phase's share of the step
            rule = files.FRACTION.or_blank()
        if rule is not None and not rule.holds(value):
            return column, rule.what
    return None


# the TrainConfig fields whose metrics.json value is what was in effect, not the flag (the
# device's type and name, --backend auto resolved, the batches --global-batch sets): the run
# table's device and batches are compared with them as columns, the backend resolved
IN_EFFECT = ("device", "backend", "local_batch", "global_batch")


def flag_differences(row: dict, metrics: dict) -> str:
    """The trainer flags of the run's experiment (TrainConfig's, not NOT_IDENTITY) that
    metrics.json records with another value than the run table's flags give them, where its
    config_hash is not theirs ("" where it is, or where no recorded flag differs: an older
    trainer's hash covers fewer flags). A run trained by hand with a diagnostic delay,
    --sync-debug or another --backend was collected as one more repeat."""
    flags = TrainConfig.from_argv(trainer_args(row))
    if metrics.get("config_hash") in (None, flags.config_hash()):
        return ""
    expected = dataclasses.asdict(flags)
    device = metrics.get("device")
    if flags.backend == "auto" and isinstance(device, dict):  # as train.pick_backend resolves it
        expected["backend"] = "nccl" if device.get("type") == "cuda" else "gloo"
    return ", ".join(
        f"{key} {metrics[key]!r}, the run table's flags give {value!r}"
        for key, value in expected.items()
        if (key not in (*NOT_IDENTITY, *IN_EFFECT) or key == "backend")
        and key in metrics
        and not same(value, metrics[key])
    )


def history_problem(epochs: list[dict], metrics: dict) -> str | None:
    """Why a run's epochs.csv is not the history its metrics.json ends: the trainer writes
    every epoch (no early stop; a resume rewrites the file from the checkpoint's history), and
    its last val_acc is metrics.json's final_val_acc (6 significant digits). A cut file, or
    another run's, was collected, and the accuracy figure averaged epochs over fewer repeats,
    its clock running backwards."""
    want = files.number(metrics.get("epochs"))
    if want is not None and len(epochs) != want:
        return f"{len(epochs)} epoch rows, and metrics.json's run trained {want:g} epochs"
    final = files.number(metrics.get("final_val_acc"))
    last = files.number(epochs[-1].get("val_acc")) if epochs else None
    if final is not None and last is not None and f"{final:.6g}" != f"{last:.6g}":
        return f"its last val_acc is {last:.6g}, and metrics.json's final_val_acc {final:.6g}"
    return None


def run_target(path: Path) -> str:
    """The Snakemake target that trains the run of `path` (a file of DIR/<run>/) in the study."""
    return f"{RUNS_DIR}/{path.parent.name}/metrics.json"


def study_run(path: Path) -> bool:
    """Whether `path` is a file of the study's own run (RUNS_DIR/<run>/, however spelled:
    files.one_file), not of a --runs-dir given by hand."""
    return files.one_file(path.parent, Path(RUNS_DIR, path.parent.name))


def run_fix(path: Path, missing: bool = False) -> str:
    """What a line refusing a run's file (`path`, in DIR/<run>/) tells to do. The study's own
    run is Snakemake's: trained where missing, deleted and trained again where damaged. A
    --runs-dir given by hand may hold the user's own runs (a copy from the cluster, an
    archive): "delete DIR/<run> and rerun it" deleted one, and `snakemake DIR/<run>/...` named
    a target no rule makes; it is the user's to fix, or to give --runs-dir the study's
    (files.input_fix's rule). `missing`: the file is not there."""
    if not study_run(path):
        return files.input_fix(path, run_target(path), "--runs-dir", RUNS_DIR, missing)
    if missing:
        return f"run `snakemake {run_target(path)}` (or the whole study) first"
    return f"delete {path.parent} and train it again: `snakemake {run_target(path)}`"


def load_metrics(path: Path) -> dict:
    if not path.exists():
        raise CollectError(f"missing {path}: {run_fix(path, missing=True)}")
    fix = run_fix(path)
    try:
        metrics = json.loads(files.read_text(path, CollectError, fix))
    except json.JSONDecodeError as exc:
        raise CollectError(f"{path} is not valid JSON ({exc}); {fix}") from exc
    if not isinstance(metrics, dict):
        raise CollectError(
            f"{path} holds {json.dumps(metrics)[:40]}, not the trainer's object of metrics; {fix}"
        )
    missing = [k for k in REQUIRED_METRICS if k not in metrics]
    if missing:
        # the usual cause: a run an older trainer finished (Snakemake keeps it) read by a newer
        # collect. Retraining it spends its allocation hours again: the last choice, not the one
        commit = metrics.get("git_commit")
        version = f"commit {commit}" if commit else "the version that trained it"
        keys = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        if study_run(path):
            retrain = fix
        else:  # a run of the user's own: trained again in the study, never deleted
            retrain = (
                f"give --runs-dir the study's {RUNS_DIR} (`snakemake {run_target(path)}` writes it)"
            )
        raise CollectError(
            f"{path} lacks {keys}, which this collect reads: trained by an older scalestudy "
            f"({version if commit else 'its commit not recorded'}) or not by the trainer; "
            f"collect it with `scalestudy collect` of {version}, or, if its numbers are needed "
            f"from this version, {retrain}"
        )
    device = metrics["device"]
    if not (isinstance(device, dict) and all(isinstance(device.get(k), str) for k in DEVICE)):
        # the trainer writes {"type": "cuda", "name": "NVIDIA H100 ..."} (measure.device_info):
        # a bare "cuda" matched the run table's device and left device_type and device_name
        # blank, so system.csv's device and the documents said "not recorded"
        raise CollectError(
            f"{path}: device is {json.dumps(device)[:60]}, not the trainer's object of "
            f"{' and '.join(DEVICE)} (e.g. {json.dumps(DEVICE_EXAMPLE)}); {fix}"
        )
    return metrics


DEVICE = ("type", "name")  # metrics.json's device: runs.csv's device_type and device_name
DEVICE_EXAMPLE = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}


# val_loss of an evaluation that overflowed (fp16 logits, or weights that diverged in the
# epoch's last steps): the trainer stops on a non-finite train_loss only (loop.end_of_epoch),
# so a run that finished may record its val_loss as f"{x:.6g}" writes NaN or +infinity, and a
# seeded rerun records the same. Cross-entropy is never negative: "-inf" is not the trainer's.
VAL_LOSS = files.Cell(
    "a number >= 0, or nan or inf (an evaluation that overflowed)", 0, words=("nan", "inf")
)


def epoch_cell(column: str) -> files.Cell:
    """What a column of the trainer's epochs.csv holds: accuracies fractions, times and rates
    > 0, losses and the learning rate >= 0 (cross-entropy, label smoothing included, is never
    negative); val_loss also "nan" or "inf" (VAL_LOSS: the trainer writes it; no reader of
    epochs.csv computes with val_loss)."""
    if column.endswith("_acc"):
        return files.FRACTION
    if column in ("epoch_time_s", "throughput_img_s"):
        return files.POSITIVE
    if column == "val_loss":
        return VAL_LOSS
    return files.NON_NEGATIVE


def load_epochs(path: Path) -> list[dict]:
    if not path.exists():
        raise CollectError(f"missing {path}: {run_fix(path, missing=True)}")
    fix = run_fix(path)
    rows = files.read_csv_rows(path, CollectError, fix)
    if not rows:
        raise CollectError(f"{path} has no epochs; {fix}")
    missing = [c for c in vocab.EPOCH_COLUMNS if c not in rows[0]]
    if missing:
        raise CollectError(f"{path} has no column {', '.join(missing)}: not the trainer's; {fix}")
    # epochs.csv's rows carry the run's identity from the run table (EPOCH_ID_COLUMNS): a
    # column of one of those names in the file replaced it, and another run's world_size or
    # run name went into the accuracy figure under this run's (the trainer writes none of them)
    if clash := [c for c in EPOCH_ID_COLUMNS if c in rows[0]]:
        raise CollectError(
            f"{path} has {', '.join(clash)} among its columns, which collect takes from the "
            f"run table: not the trainer's; {fix}"
        )
    for line, row in enumerate(rows, start=2):  # read_csv_rows refused a row of other length
        # the trainer's rows: epochs 1, 2, ... once each (a resume rewrites the file from the
        # checkpoint's history), the other columns as epoch_cell says. A damaged cell was
        # collected as it was and refused only by the accuracy figure, which then named
        # results/csv/epochs.csv, a file that collect writes again from this one unchanged.
        for column in vocab.EPOCH_COLUMNS:
            if column == "epoch":
                rule = files.Cell(f"{line - 1} (the row's place)", line - 1, line - 1, whole=True)
            else:
                rule = epoch_cell(column)
            if not rule.holds(row[column]):
                raise CollectError(
                    f"{path}, line {line}: {column} is {row[column]!r}, not {rule.what}; {fix}"
                )
    return rows


def flatten(metrics: dict) -> dict:
    """metrics.json's keys as runs.csv's cells: device -> device_type, device_name; a list
    joined with ';'; a byte of a path that is not UTF-8 (json's lone surrogate) as its escape."""
    out = {}
    for key, value in metrics.items():
        if key == "device" and isinstance(value, dict):
            out["device_type"], out["device_name"] = value.get("type"), value.get("name")
        elif isinstance(value, list):
            out[key] = _text(";".join(map(str, value)))
        else:
            out[key] = _text(value)
    return out


def _text(value):
    """A string with a lone surrogate (a path's byte that is not UTF-8, as json.dumps writes a
    Python path) as text UTF-8 can hold: \\xfc for the byte 0xfc (runs.csv's write failed with
    a UnicodeEncodeError traceback); anything else as it is."""
    if not isinstance(value, str):
        return value
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte gave: \\udXXX
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


__all__ = ["RUN_COLUMNS", "collect", "CollectError"]
