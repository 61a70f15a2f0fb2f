"""Study config -> run table: one row per training job.

`build_run_table` is the one pure function the workflow expands over; the families (strong, weak,
precision, bucket) are values in the table, not branches in the rules. A run is identified only by
the values the families vary, so a configuration requested by two families runs once (its
`families` column lists both) and adding a GPU count or a bucket size never renames a run:

    w{world_size}_lb{local_batch}_{precision}_{strategy}_bk{number_text(bucket_cap_mb)}_r{repeat}

    scalestudy matrix --config config/demo.yaml --set dataset=synthetic   # the table -> stdout
"""

from __future__ import annotations

import csv
import dataclasses
import decimal
import hashlib
import io
import math
import os
import re
from collections.abc import Iterator
from typing import Any

from scalestudy import vocab
from scalestudy.errors import RunTableError, TrainConfigError
from scalestudy.files import atomic_open
from scalestudy.trainer.config import (
    STEP_GRAPH_WARM_STEPS,
    STEPS_BEFORE_WINDOW,
    TrainConfig,
    flag_name,
)

RUN_COLUMNS = (
    "run",
    "families",
    "nodes",
    "ranks_per_node",
    "world_size",
    "gpus",
    "device",
    "local_batch",
    "global_batch",
    "accum_steps",
    "precision",
    "strategy",
    "bucket_cap_mb",
    "comm_hook",
    "repeat",
    "seed",
    "epochs",
    "dataset",
    "model",
    "width",
    "loader",
    "num_workers",
    "compile",
    "cuda_graphs",
    "lr",
    "schedule",
    "warmup_epochs",
    "label_smoothing",
    "weight_decay",
    "momentum",
    "clip_grad",
    "target_acc",
    "warmup_steps",
    "comm_probe_steps",
    "limit_train",
    "limit_test",
)
# train.pg_timeout_s is no column: how long a hung collective may wait does not define a run
# (TrainConfig.NOT_IDENTITY), so the workflow passes --pg-timeout-s as a resource of the launch
# rules, as checkpointing's flags: a column is a param (a rerun trigger), part of runs.tsv and
# of collect's check of metrics.json, and raising it after a timeout reran every finished run.

# Run columns passed to `scalestudy train` as `--<column with dashes>` (the flag rule of
# config.py, so they are the trainer's own fields), in RUN_COLUMNS order. Not passed: target_acc
# (collect reads time_to_target_s off the run's epochs.csv: a flag, a param, changing the
# threshold retrained every run and reran every capture) and global_batch (the trainer derives
# it from local_batch x world size x accum_steps). The device is passed: a GPU study whose job
# cannot reach CUDA (no GPUs in the step, a missing --nv, a driver too old for the wheel) must
# fail, not train on CPU.
_NOT_PASSED = frozenset({"target_acc", "global_batch"})
TRAIN_FLAGS = {
    column: f"--{flag_name(column)}"
    for column in RUN_COLUMNS
    if column in {f.name for f in dataclasses.fields(TrainConfig)} and column not in _NOT_PASSED
}

# column types for reading runs.tsv back; every other column is a string
_INT_COLUMNS = frozenset(
    {
        "nodes",
        "ranks_per_node",
        "world_size",
        "gpus",
        "local_batch",
        "global_batch",
        "accum_steps",
        "repeat",
        "seed",
        "epochs",
        "width",
        "num_workers",
        "warmup_steps",
        "comm_probe_steps",
        "limit_train",
        "limit_test",
    }
)
# ... and the numbers the trainer reads as floats: each in one form (one_form) in the table,
# its flags and runs.tsv, whether the config wrote 1 or 1.0
_NUMBER_COLUMNS = frozenset(
    {
        "bucket_cap_mb",
        "lr",
        "warmup_epochs",
        "label_smoothing",
        "weight_decay",
        "momentum",
        "clip_grad",
        "target_acc",
    }
)
_OPTIONAL_COLUMNS = frozenset({"target_acc"})  # empty cell = null
# the study config's compile and cuda_graphs (auto, true, false: YAML reads on/off as booleans
# too; cuda_graphs also step) -> the trainer's --compile/--cuda-graphs values, the run table's
_SWITCH = {"auto": "auto", True: "on", False: "off", "step": "step"}


# every id run_id makes, and nothing else: the shape of a run id
RUN_ID_PATTERN = (
    rf"w\d+_lb\d+_(?:{'|'.join(vocab.PRECISIONS)})_(?:{'|'.join(vocab.STRATEGIES)})"
    r"_bk\d+(?:\.\d+)?_r\d+"
)


def run_wildcard(run_ids) -> str:
    """The workflow's {run} wildcard: exactly the study's run ids, so a target of a run the
    study does not have, mistyped (results/runs/bogus/metrics.json) or well-formed but another
    study's, has no rule to make it (Snakemake's MissingRuleException) instead of reaching
    get_run, whose KeyError Snakemake printed as a traceback. Python's re tries the alternatives
    in turn: matching one path against 10,000 ids (config.MAX_RUNS) took 0.09 ms."""
    return "|".join(re.escape(run) for run in run_ids)


def run_id(
    world_size: int, local_batch: int, precision: str, strategy: str, bucket_cap_mb, repeat: int
) -> str:
    """The stable id of a run, built only from the values the families vary."""
    bucket = number_text(bucket_cap_mb)
    return f"w{world_size}_lb{local_batch}_{precision}_{strategy}_bk{bucket}_r{repeat}"


def number_text(value: float) -> str:
    """A number in a run id: every digit it has (1.0000001 is not 1) and no exponent (a `+` is
    outside the workflow's run wildcard): 25, 0.5, 1000000."""
    text = format(decimal.Decimal(repr(float(value))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def placement(world_size: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, ranks_per_node): one node when it fits, else whole nodes."""
    if world_size <= gpus_per_node:
        return 1, world_size
    return world_size // gpus_per_node, gpus_per_node


def _requests(config: dict) -> Iterator[tuple[str, int, int, str, Any]]:
    """(family, world_size, local_batch, precision, bucket_cap_mb) of every requested config,
    one at a time (run_count stops early: a sweep's product need not fit in memory)."""
    train, families = config["train"], config["families"]
    accum, precision, bucket = train["accum_steps"], train["precision"], train["bucket_cap_mb"]
    fam = families["strong"]
    if fam["enabled"]:
        for w in fam["gpus"]:
            yield ("strong", w, fam["global_batch"] // (w * accum), precision, bucket)
    fam = families["weak"]
    if fam["enabled"]:
        for w in fam["gpus"]:
            yield ("weak", w, fam["local_batch"], precision, bucket)
    fam = families["precision"]
    if fam["enabled"]:
        for w in fam["gpus"]:
            for p in fam["precisions"]:
                yield ("precision", w, train["local_batch"], p, bucket)
    fam = families["bucket"]
    if fam["enabled"]:
        for bk in fam["bucket_cap_mb"]:
            for lb in fam["local_batch"]:
                yield ("bucket", fam["gpus"], lb, precision, bk)


# each family's sweep lists, whose lengths multiply to its requests (_requests' loops)
FAMILY_SWEEPS = {
    "strong": ("gpus",),
    "weak": ("gpus",),
    "precision": ("gpus", "precisions"),
    "bucket": ("bucket_cap_mb", "local_batch"),
}


def family_requests(config: dict) -> dict[str, int]:
    """How many configurations each enabled family requests, from its sweeps' lengths (no
    request built): an upper bound of its runs per repeat (families merge shared ones)."""
    return {
        name: math.prod(len(config["families"][name][key]) for key in sweeps)
        for name, sweeps in FAMILY_SWEEPS.items()
        if config["families"][name]["enabled"]
    }


def _row(config: dict, world_size: int, local_batch: int, precision: str, bucket, repeat: int):
    hw, train = config["hardware"], config["train"]
    nodes, ranks_per_node = placement(world_size, hw["gpus_per_node"])
    # every run column that is a train key (defaults filled); the per-run ones are set below
    values = {name: train[name] for name in RUN_COLUMNS if name in train}
    values.update(
        run=run_id(world_size, local_batch, precision, train["strategy"], bucket, repeat),
        families="",
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        world_size=world_size,
        gpus=world_size if hw["device"] == "cuda" else 0,
        device=hw["device"],
        local_batch=local_batch,
        global_batch=world_size * local_batch * train["accum_steps"],
        precision=precision,
        bucket_cap_mb=one_form(bucket),
        repeat=repeat,
        seed=train["seed"] + repeat,
        dataset=config["dataset"],
        compile=_SWITCH[train["compile"]],
        cuda_graphs=_SWITCH[train["cuda_graphs"]],
    )
    values = in_effect(values)
    for name in _NUMBER_COLUMNS:  # train.lr 1 or 1.0: one flag text, one runs.tsv cell
        if values[name] is not None:
            values[name] = one_form(values[name])
    return {name: values[name] for name in RUN_COLUMNS}


def in_effect(row: dict) -> dict:
    """The run's columns with a setting it cannot use as the one value in effect, so that
    changing it changes no run's flags (its params: every finished run and capture reran for
    the same training) and a measured run of either value calibrates the plan (estimate): the
    device loader starts no DataLoader workers (num_workers 0), and auto is off on CPU (the
    trainer's --compile and --cuda-graphs; on and step stay, for the trainer to use or refuse)."""
    row = dict(row)
    if row.get("loader") == "device":
        row["num_workers"] = 0
    if row.get("device") == "cpu":
        for name in ("compile", "cuda_graphs"):
            if row.get(name) == "auto":
                row[name] = "off"
    return row


def _sort_key(row: dict):
    return (
        row["world_size"],
        row["local_batch"],
        vocab.PRECISIONS.index(row["precision"]),
        row["strategy"],
        row["bucket_cap_mb"],
        row["repeat"],
    )


def run_count(config: dict, most: int | None = None) -> int:
    """How many rows build_run_table returns, counted without building them: the distinct
    requested configurations (families merged) times the repeats. `most`: counting stops once
    the count passes it (the result is then above `most`, not the whole count): a bucket sweep
    of 3,000 x 3,000 values took 10 s and 1.8 GB to count whole."""
    distinct: set[tuple] = set()
    for _, w, lb, p, bk in _requests(config):
        distinct.add((w, lb, p, bk))
        if most is not None and len(distinct) * config["repeats"] > most:
            break
    return len(distinct) * config["repeats"]


def build_run_table(config: dict) -> list[dict]:
    """Rows (dicts keyed by RUN_COLUMNS) of a validated config, defaults filled. Pure: no I/O.

    Identical configurations requested by several families become one row whose `families` is
    the ';'-joined sorted family names. Order: world_size, local_batch, precision, strategy,
    bucket_cap_mb, repeat.
    """
    merged: dict[tuple, tuple[dict, set[str]]] = {}
    for family, world_size, local_batch, precision, bucket in _requests(config):
        for repeat in range(config["repeats"]):
            row = _row(config, world_size, local_batch, precision, bucket, repeat)
            key = tuple(row[c] for c in RUN_COLUMNS if c not in ("run", "families"))
            merged.setdefault(key, (row, set()))[1].add(family)
    rows, seen = [], {}
    for row, families in merged.values():
        row["families"] = ";".join(sorted(families))
        if row["run"] in seen:  # cannot happen while the id holds every varying value
            raise AssertionError(f"run id {row['run']} names two runs:\n{seen[row['run']]}\n{row}")
        seen[row["run"]] = row
        rows.append(row)
    rows.sort(key=_sort_key)
    return rows


def one_form(x: float) -> int | float:
    """A number in one form whichever way the config wrote it: 25 for 25 and 25.0, 1e+20 for
    10**20 and 1.0e+20 (an integer only below 2**53, where a float holds every one). A run of
    train.bucket_cap_mb 25 that the bucket family also asked for as 25.0 was one run (one id)
    whose flag read `--bucket-cap-mb 25` or `25.0` by which family asked for it: Snakemake saw
    its params change and reran the finished run; train.warmup_epochs 1 rewritten as 1.0 (or
    lr, clip_grad, ...: every number column, _NUMBER_COLUMNS) reran every run, though the
    trainer, which reads them as floats, ran the same experiment (the same config_hash)."""
    try:
        value = float(x)
    except OverflowError:  # an integer past every float: the trainer's check refuses its flag
        return x
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return str(value)


def epoch_micro_steps(n: int, step_images: int) -> int:
    """Micro-steps of an epoch of n training images in steps of step_images (all ranks): the
    trainer drops the ragged tail, and when no full step fits one step takes all n (its rule:
    trainer/loaders.py `_global_slices`)."""
    return max(1, n // step_images)


def run_problems(rows: list[dict], n_train: int, n_train_source: str) -> list[str]:
    """Each distinct run's `scalestudy train` flags through the trainer's own checks, before any
    job: a combination TrainConfig refuses (a comm hook without DDP, ...) and a run whose
    optimizer steps leave no steady-state window after train.warmup_steps (trainer/loop.py), or
    after the whole-step graph's eager steps and capture under cuda_graphs step (the trainer's
    compiling.graphs_mode; auto leaves the graph out of a run that short), would otherwise fail
    in every job. n_train: the training images (study/config.py)."""
    refused: dict[str, list[str]] = {}
    shortest: tuple[int, dict] | None = None
    graph_short: tuple[int, dict] | None = None  # the shortest `step` run without a window
    for row in rows:
        try:
            cfg = TrainConfig.from_argv(trainer_args(row))
        except TrainConfigError as exc:
            refused.setdefault(str(exc), []).append(row["run"])
            continue
        micro = epoch_micro_steps(n_train, row["world_size"] * row["local_batch"])
        steps = math.ceil(micro / row["accum_steps"]) * row["epochs"]
        warm = cfg.window_warmup_steps()  # the Meter's: powersgd's uncompressed steps too
        if steps <= warm and (shortest is None or steps < shortest[0]):
            shortest = (steps, warm, row)
        graph_fails = row["cuda_graphs"] == "step" and steps <= STEPS_BEFORE_WINDOW
        if graph_fails and (graph_short is None or steps < graph_short[0]):
            graph_short = (steps, row)
    problems = [
        f"runs {', '.join(runs[:3])}{' ...' if len(runs) > 3 else ''}: `scalestudy train` refuses "
        f"their flags, which come from the config's train: keys and its families' sweeps "
        f"(--comm-hook is train.comm_hook; --precision train.precision or "
        f"families.precision.precisions, --local-batch train.local_batch or a family's "
        f"local_batch, and so on): {why}"
        for why, runs in refused.items()
    ]
    if shortest:
        steps, warm, row = shortest
        if warm > row["warmup_steps"]:  # powersgd: its uncompressed steps, not warmup_steps
            problems.append(
                f"config key 'train.comm_hook': value powersgd is not allowed here: run "
                f"{row['run']} takes {steps} optimizer steps ({row['epochs']} epochs of "
                f"{n_train} images ({n_train_source}) in global batches of "
                f"{row['global_batch']}), and PowerSGD's throughput window opens after its "
                f"{warm} uncompressed steps; raise train.epochs or use more data"
            )
        else:
            problems.append(
                f"config key 'train.warmup_steps': value {row['warmup_steps']} is not allowed: "
                f"at most {steps - 1} here: run {row['run']} takes {steps} optimizer steps ("
                f"{row['epochs']} epochs of {n_train} images ({n_train_source}) in global "
                f"batches of {row['global_batch']}), which leave no steady-state window after "
                "the warm-up; lower train.warmup_steps or raise train.epochs"
            )
    if graph_short:
        steps, row = graph_short
        problems.append(
            f"config key 'train.cuda_graphs': value step is not allowed here: run {row['run']} "
            f"takes {steps} optimizer steps ({row['epochs']} epochs of {n_train} images "
            f"({n_train_source}) in global batches of {row['global_batch']}), and the whole-step "
            f"graph needs more than {STEPS_BEFORE_WINDOW} ({STEP_GRAPH_WARM_STEPS} eager steps "
            "and the capture) before its throughput window; raise train.epochs or use more "
            "data, or use auto (it leaves the whole-step graph out of a run this short)"
        )
    return problems


def trainer_args(row: dict) -> list[str]:
    """The `scalestudy train` flags of a row as an argv list (--data-dir, --out, --pg-timeout-s
    and the checkpointing flags come from the workflow)."""
    argv = []
    for column, flag in TRAIN_FLAGS.items():
        argv += [flag, _arg(row[column])]
    return argv


# ---------------------------------------------------------------------------------------------
# runs.tsv


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return _arg(value)


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _parse(column: str, text: str) -> Any:
    if column in _OPTIONAL_COLUMNS and text == "":
        return None
    if column in _INT_COLUMNS:
        return int(text)
    if column in _NUMBER_COLUMNS:
        return _number(text)
    return text


def runs_tsv_text(rows: list[dict]) -> str:
    """The run table as TSV text: header RUN_COLUMNS, tab-separated, null as an empty cell."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(RUN_COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[c]) for c in RUN_COLUMNS])
    return out.getvalue()


def table_digest(rows: list[dict]) -> str:
    """sha256 (first 16 hex digits) of the table's TSV text: changes whenever any cell does."""
    return hashlib.sha256(runs_tsv_text(rows).encode("utf-8")).hexdigest()[:16]


def write_runs_tsv(rows: list[dict], path: str | os.PathLike) -> None:
    """Write the run table (runs_tsv_text) atomically."""
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        f.write(runs_tsv_text(rows))


def read_runs_tsv(path: str | os.PathLike) -> list[dict]:
    """Read a table written by write_runs_tsv back into rows with the same types; a table it
    did not write (another version's, cut short, edited by hand) is a RunTableError naming the
    file, the line and the fix."""
    # the workflow's table: Snakemake sees a damaged file as up to date (params unchanged)
    write = (
        "`snakemake --forcerun=matrix results/matrix/runs.tsv` (with the study's "
        f"--configfile), or `scalestudy matrix --config FILE --out {path}`"
    )
    fix = f"rebuild it: {write}"
    if not os.path.lexists(path):  # "No such file or directory" named no command
        raise RunTableError(f"{path}: no such file; write the study's run table: {write}")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t")
            header = next(reader, None)
            if header is None:  # was "header is not matrix.RUN_COLUMNS": the cause, unnamed
                raise RunTableError(f"{path}: empty (not even a header): cut short?; {fix}")
            if tuple(header) != RUN_COLUMNS:
                raise RunTableError(
                    f"{path}: its header is not the run table's ({', '.join(RUN_COLUMNS[:3])}, "
                    f"...; written by another version?); {fix}"
                )
            rows = [_parse_row(path, line, cells, fix) for line, cells in enumerate(reader, 2)]
    except UnicodeDecodeError as e:
        raise RunTableError(f"{path}: not UTF-8 text (byte {e.start}); {fix}") from e
    except IsADirectoryError:  # "PATH: Is a directory", no fix named (files.read_text's words)
        raise RunTableError(f"{path} is a directory, not a file; {fix}") from None
    except csv.Error as e:  # a cell past csv's field limit, a NUL byte: one line
        raise RunTableError(f"{path}, line {reader.line_num}: {e}; {fix}") from None
    if not rows:  # a study has at least one run (config.py refuses one without a family)
        raise RunTableError(f"{path}: a header and no runs (cut short?); {fix}")
    first: dict[str, int] = {}  # build_run_table writes each run once: collected twice, runs.csv
    for line, row in enumerate(rows, 2):  # had two rows of it, which analyze refuses
        if (seen := first.setdefault(row["run"], line)) != line:
            raise RunTableError(
                f"{path}, line {line}: run {row['run']!r} again (line {seen}); {fix}"
            )
    return rows


def _parse_row(path, line: int, cells: list[str], fix: str) -> dict:
    if len(cells) != len(RUN_COLUMNS):
        raise RunTableError(
            f"{path}, line {line}: {len(cells)} cells, not {len(RUN_COLUMNS)}; {fix}"
        )
    row = {}
    for column, text in zip(RUN_COLUMNS, cells, strict=True):
        try:
            row[column] = _parse(column, text)
        except ValueError as e:
            raise RunTableError(
                f"{path}, line {line}: {column} is {text!r}, not a number; {fix}"
            ) from e
    return row


def prepared_sizes(config: dict, dataset: str | None = None) -> tuple[int, int]:
    """(training, test) images of the prepared set of `dataset` (the study's by default): a
    synthetic set's synthetic.num_train and num_test, another dataset's own (vocab.DATASETS);
    whole, before train.limit_train and limit_test (their callers take those)."""
    dataset = dataset or config["dataset"]
    if dataset == "synthetic":
        return config["synthetic"]["num_train"], config["synthetic"]["num_test"]
    return vocab.DATASETS[dataset].train, vocab.DATASETS[dataset].test


def same(table_value, metric_value) -> bool:
    """Compare a run-table value (read back from TSV: a string) with a metrics.json value:
    whole numbers exactly, other numbers within a relative 1e-9 (their text's rounding)."""
    if metric_value is None or table_value is None:
        return str(table_value) in ("", "None") and metric_value in (None, "")
    if isinstance(metric_value, bool):
        return str(table_value).lower() == str(metric_value).lower()
    if isinstance(metric_value, int):
        try:  # exact: within a relative 1e-9, seeds 10**9 and 10**9 + 1 were the same
            return int(str(table_value).strip()) == metric_value
        except ValueError:
            pass  # "1.0": compared as floats, below
    if isinstance(metric_value, int | float):
        try:
            return math.isclose(float(table_value), float(metric_value), rel_tol=1e-9)
        except ValueError:
            return False
    return str(table_value) == str(metric_value)
