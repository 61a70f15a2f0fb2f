"""The run table: counts, dedup across families, stable ids, placement, batches, seeds, trainer
flags and the runs.tsv round trip."""

from __future__ import annotations

import argparse
import copy
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from scalestudy import vocab
from scalestudy.study import runs
from scalestudy.study.config import load_and_validate
from scalestudy.study.runs import (
    RUN_COLUMNS,
    TRAIN_FLAGS,
    build_run_table,
    read_runs_tsv,
    trainer_args,
    write_runs_tsv,
)
from scalestudy.trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def full() -> dict:
    return load_and_validate(ROOT / "config" / "config.yaml")


@pytest.fixture(scope="module")
def demo() -> dict:
    return load_and_validate(ROOT / "config" / "demo.yaml")


def table(config: dict, *overrides: str) -> list[dict]:
    return build_run_table(load_and_validate(config, overrides=list(overrides)))


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {row["run"]: row for row in rows}


def family_counts(rows: list[dict]) -> Counter:
    return Counter(f for row in rows for f in row["families"].split(";"))


def test_full_config_counts_and_unique_ids(full):
    rows = build_run_table(full)
    # strong 5 + weak 5 + precision 4x2 + bucket 4x3 = 30 requested configurations; 5 are shared
    # (weak w4 = strong w4, precision bf16 w1/w4 = weak, bucket bk25 lb128/lb256 = strong/weak w8)
    assert len(rows) == 25 * 3
    assert len({row["run"] for row in rows}) == len(rows)
    assert family_counts(rows) == {"strong": 15, "weak": 15, "precision": 24, "bucket": 36}
    assert all(list(row) == list(RUN_COLUMNS) for row in rows)


def test_demo_config_counts(demo):
    rows = build_run_table(demo)
    # strong 3 + weak 2 + precision 2 + bucket 2 = 9 requested; w2_lb16_fp32_bk25 is all four
    assert len(rows) == 6
    assert family_counts(rows) == {"strong": 3, "weak": 2, "precision": 2, "bucket": 2}
    # a demo that can learn: >= 192 optimizer steps per run (config/demo.yaml, top)
    assert max(row["global_batch"] for row in rows) == 32
    assert {row["device"] for row in rows} == {"cpu"}
    assert {row["gpus"] for row in rows} == {0}
    assert {row["precision"] for row in rows} == {"fp32", "bf16"}


def test_run_id_format(full):
    rows = by_id(build_run_table(full))
    row = rows["w8_lb128_bf16_ddp_bk25_r0"]
    assert (row["world_size"], row["local_batch"], row["bucket_cap_mb"]) == (8, 128, 25)
    assert runs.run_id(2, 64, "fp16", "ddp", 2.5, 1) == "w2_lb64_fp16_ddp_bk2.5_r1"
    # the workflow's {run} wildcard: every id the table makes, and no other name
    for run in [*rows, runs.run_id(2, 64, "fp16", "allreduce", 0.25, 1)]:
        assert re.fullmatch(runs.RUN_ID_PATTERN, run), run
    for name in ("bogus", "w2_lb64_fp64_ddp_bk25_r0", "w2_lb64_fp16_ddp_bk1e+06_r0", "w2_lb64"):
        assert not re.fullmatch(runs.RUN_ID_PATTERN, name), name


def test_dedup_across_families(full):
    rows = by_id(build_run_table(full))
    # 1024 / 4 = 256 = weak's local batch, and bf16 at 4 GPUs is the precision family's run
    assert rows["w4_lb256_bf16_ddp_bk25_r0"]["families"] == "precision;strong;weak"
    assert rows["w8_lb128_bf16_ddp_bk25_r2"]["families"] == "bucket;strong"
    assert rows["w1_lb1024_bf16_ddp_bk25_r0"]["families"] == "strong"
    minimal = {
        "families": {
            "strong": {"enabled": True, "gpus": [1, 2], "global_batch": 512},
            "weak": {"enabled": True, "gpus": [2], "local_batch": 256},
        },
        "report": {"targets": {"strong_efficiency_gpus": 2}},
        "repeats": 1,
    }
    rows = table(minimal)
    assert [(r["run"], r["families"]) for r in rows] == [
        ("w1_lb512_fp32_ddp_bk25_r0", "strong"),
        ("w2_lb256_fp32_ddp_bk25_r0", "strong;weak"),
    ]


@pytest.mark.parametrize(
    "override",
    [
        "families.strong.gpus=[1, 2, 4, 8, 16, 32]",
        "families.weak.gpus=[1, 2, 3, 4, 8, 16]",
        "families.precision.gpus=[1, 2, 4]",
        "families.bucket.bucket_cap_mb=[1, 2.5, 5, 25, 50, 100]",
        "families.bucket.local_batch=[32, 64, 128, 256]",
        "families.precision.precisions=[fp32, tf32, fp16, bf16]",
        "repeats=5",
    ],
)
def test_growing_a_sweep_only_adds_rows(override):
    config = ROOT / "config" / "config.yaml"
    old = by_id(table(config))
    new = by_id(table(config, override))
    assert set(old) <= set(new)
    for run, row in old.items():
        # the run itself is unchanged; a new request may only add a family that shares it
        assert {**new[run], "families": ""} == {**row, "families": ""}, run
        assert set(row["families"].split(";")) <= set(new[run]["families"].split(";")), run


def test_a_run_has_one_flag_text_whichever_family_asks_for_it(tmp_path):
    """train.bucket_cap_mb 25 and the bucket family's 25.0 are one run: its flags read
    `--bucket-cap-mb 25` while strong also asked for it and `25.0` with the bucket family
    alone, so Snakemake saw its params change and reran the finished run."""
    every = table(ROOT / "config" / "demo.yaml", "families.bucket.bucket_cap_mb=[0.25, 25.0]")
    alone = table(
        ROOT / "config" / "demo.yaml",
        "families.bucket.bucket_cap_mb=[0.25, 25.0]",
        *(f"families.{f}.enabled=false" for f in ("strong", "weak", "precision")),
    )
    run = "w2_lb16_fp32_ddp_bk25_r0"
    assert by_id(every)[run]["families"] != by_id(alone)[run]["families"]
    assert runs.trainer_args(by_id(every)[run]) == runs.trainer_args(by_id(alone)[run])
    assert "--bucket-cap-mb" in runs.trainer_args(by_id(alone)[run])


@pytest.mark.parametrize(
    ("key", "whole"),
    [("lr", 1), ("warmup_epochs", 1), ("clip_grad", 0), ("momentum", 0), ("label_smoothing", 0),
     ("weight_decay", 0), ("target_acc", 1)],
)  # fmt: skip
def test_a_float_written_as_a_whole_number_or_with_a_dot_is_one_flag_text(key, whole):
    """train.warmup_epochs 1 and 1.0 gave `--warmup-epochs 1` and `1.0` (only bucket_cap_mb
    had one form): Snakemake saw every training job's params change and reran every finished
    run, though the trainer reads both as the float 1.0 (the same config_hash)."""
    demo = ROOT / "config" / "demo.yaml"
    as_int, as_float = (table(demo, f"train.{key}={v}") for v in (whole, f"{whole}.0"))
    assert runs.table_digest(as_int) == runs.table_digest(as_float)
    for a, b in zip(as_int, as_float, strict=True):
        assert a == b and trainer_args(a) == trainer_args(b)
        argv = trainer_args(a)
        if key == "target_acc":  # no flag: collect's threshold (runs.tsv), one form there
            assert a[key] == whole and "--target-acc" not in argv
            continue
        assert argv[argv.index(f"--{key.replace('_', '-')}") + 1] == str(whole)
        parsed = TrainConfig.from_argv(argv)  # the trainer reads "1" as the float 1.0
        assert getattr(parsed, key) == float(whole) and isinstance(getattr(parsed, key), float)


def test_one_form_keeps_an_integer_only_where_a_float_holds_it():
    """1.0e+20 and 10**20 are one number too; 1e300 as an integer was a 301-digit flag."""
    assert runs.one_form(25.0) == 25 and isinstance(runs.one_form(25.0), int)
    assert runs.one_form(10**20) == runs.one_form(1.0e20) == 1.0e20
    assert isinstance(runs.one_form(10**20), float) and runs.one_form(0.25) == 0.25
    assert runs.one_form(10**400) == 10**400  # no float: left to the trainer's check


def test_added_world_size_is_shared_when_it_matches(full):
    # strong at 32 GPUs adds one run per repeat; nothing else changes
    rows = table(ROOT / "config" / "config.yaml", "families.strong.gpus=[1, 2, 4, 8, 16, 32]")
    assert len(rows) == 75 + 3
    assert by_id(rows)["w32_lb32_bf16_ddp_bk25_r1"]["families"] == "strong"


@pytest.mark.parametrize(
    ("world_size", "gpus_per_node", "nodes", "ranks_per_node"),
    [
        (1, 4, 1, 1),
        (2, 4, 1, 2),
        (4, 4, 1, 4),
        (8, 4, 2, 4),
        (16, 4, 4, 4),
        (3, 4, 1, 3),
        (16, 8, 2, 8),
    ],
)
def test_nodes_and_ranks_per_node(world_size, gpus_per_node, nodes, ranks_per_node):
    assert runs.placement(world_size, gpus_per_node) == (nodes, ranks_per_node)
    (row,) = table(
        {
            "hardware": {"gpus_per_node": gpus_per_node},
            "families": {"weak": {"enabled": True, "gpus": [world_size]}},
            "repeats": 1,
        }
    )
    assert (row["nodes"], row["ranks_per_node"]) == (nodes, ranks_per_node)
    assert row["nodes"] * row["ranks_per_node"] == row["world_size"] == row["gpus"]


def test_local_batch_from_global_batch(full):
    strong = [r for r in build_run_table(full) if "strong" in r["families"]]
    assert {r["world_size"]: r["local_batch"] for r in strong} == {
        1: 1024,
        2: 512,
        4: 256,
        8: 128,
        16: 64,
    }
    assert {r["global_batch"] for r in strong} == {1024}
    rows = table(
        {
            "train": {"accum_steps": 2},
            "families": {"strong": {"enabled": True, "gpus": [1, 4], "global_batch": 512}},
            "report": {"targets": {"strong_efficiency_gpus": 4}},
            "repeats": 1,
        }
    )
    assert [(r["world_size"], r["local_batch"], r["global_batch"]) for r in rows] == [
        (1, 256, 512),
        (4, 64, 512),
    ]


def test_weak_and_bucket_batches(full):
    rows = build_run_table(full)
    weak = [r for r in rows if "weak" in r["families"]]
    assert {r["local_batch"] for r in weak} == {256}
    assert {r["world_size"]: r["global_batch"] for r in weak}[16] == 4096
    bucket = [r for r in rows if "bucket" in r["families"]]
    assert {r["world_size"] for r in bucket} == {8}
    assert {(r["bucket_cap_mb"], r["local_batch"]) for r in bucket} == {
        (b, lb) for b in (1, 5, 25, 100) for lb in (64, 128, 256)
    }


def test_seeds_per_repeat(full):
    rows = build_run_table(full)
    assert {(r["repeat"], r["seed"]) for r in rows} == {(0, 0), (1, 1), (2, 2)}
    rows = table(ROOT / "config" / "config.yaml", "train.seed=100")
    assert {r["seed"] - r["repeat"] for r in rows} == {100}


def test_order_is_deterministic_and_numeric(full):
    rows = build_run_table(full)
    assert rows == build_run_table(copy.deepcopy(full))
    sizes = [r["world_size"] for r in rows]
    assert sizes == sorted(sizes)  # w2 before w16


def test_build_is_pure(full):
    before = copy.deepcopy(full)
    build_run_table(full)
    assert full == before


def _parse_flags(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for flag in TRAIN_FLAGS.values():
        parser.add_argument(flag, required=True)
    parser.add_argument("--target-acc", type=float, default=None)
    return parser.parse_args(argv)


def test_trainer_args_round_trip(full):
    row = by_id(build_run_table(full))["w16_lb64_bf16_ddp_bk25_r2"]
    argv = trainer_args(row)
    assert all(isinstance(a, str) for a in argv)
    args = _parse_flags(argv)
    for column, flag in TRAIN_FLAGS.items():
        assert getattr(args, flag[2:].replace("-", "_")) == str(row[column]), column
    assert args.local_batch == "64" and args.seed == "2" and args.precision == "bf16"
    assert row["target_acc"] == 0.94 and args.target_acc is None  # collect's, not a flag
    assert args.compile == "auto"  # the study's default: the trainer compiles on CUDA only
    assert args.cuda_graphs == "auto" and argv.count("--cuda-graphs") == 1


def test_trainer_args_conditional_flags(demo):
    row = dict(build_run_table(demo)[0])
    assert row["target_acc"] is None
    assert "--target-acc" not in trainer_args(row)
    row.update(target_acc=0.5)
    argv = trainer_args(row)
    assert "--target-acc" not in argv  # collect applies it to epochs.csv
    assert argv[argv.index("--cuda-graphs") + 1] == "off"  # the demo's cuda_graphs auto, on CPU
    assert argv[argv.index("--compile") + 1] == "off"  # the demo's compile: false


def test_a_setting_the_run_cannot_use_is_one_value_so_changing_it_retrains_nothing():
    """train.num_workers with the device loader (no DataLoader), and compile or cuda_graphs auto
    on CPU (both off there): changing one changed every run's flags, so every finished run and
    capture reran (75 GPU jobs of the paper study) for the same training. The run table holds
    the setting in effect: 0 workers, off."""
    paper, cpu = ROOT / "config" / "config.yaml", ROOT / "config" / "demo.yaml"
    assert table(paper, "train.num_workers=2") == table(paper, "train.num_workers=8")
    assert {row["num_workers"] for row in table(paper)} == {0}  # loader: device
    dataloader = table(paper, "train.loader=dataloader", "train.num_workers=2")
    assert {row["num_workers"] for row in dataloader} == {2}  # used: kept
    for key in ("compile", "cuda_graphs"):
        assert table(cpu, f"train.{key}=auto") == table(cpu, f"train.{key}=false"), key
        assert {row[key] for row in table(cpu, f"train.{key}=auto")} == {"off"}
        assert {row[key] for row in table(paper, f"train.{key}=auto")} == {"auto"}  # CUDA
    assert {row["compile"] for row in table(cpu, "train.compile=true")} == {"on"}


@pytest.mark.parametrize(("value", "switch"), [("auto", "auto"), (True, "on"), (False, "off")])
def test_compile_becomes_the_trainers_switch(full, value, switch):
    """The study's compile (auto, true, false; YAML reads on/off as booleans) is the trainer's
    --compile auto|on|off, in the table and on the command line (a CUDA study: on CPU auto is
    off)."""
    config = copy.deepcopy(full)
    config["train"]["compile"] = value
    row = build_run_table(config)[0]
    assert row["compile"] == switch
    argv = trainer_args(row)
    assert argv[argv.index("--compile") + 1] == switch


def test_tsv_round_trip(tmp_path, full, demo):
    for config in (full, demo):
        rows = build_run_table(config)
        path = tmp_path / "matrix" / "runs.tsv"
        write_runs_tsv(rows, path)
        header = path.read_text().splitlines()[0].split("\t")
        assert header == list(RUN_COLUMNS)
        back = read_runs_tsv(path)
        assert back == rows
        for a, b in zip(back, rows, strict=True):
            assert {k: type(v) for k, v in a.items()} == {k: type(v) for k, v in b.items()}
            assert trainer_args(a) == trainer_args(b)
    assert not list((tmp_path / "matrix").glob(".*.tmp"))  # atomic write left no temp file


def test_table_digest_follows_content(full):
    rows = build_run_table(full)
    digest = runs.table_digest(rows)
    assert digest == runs.table_digest(copy.deepcopy(rows))
    assert digest != runs.table_digest(rows[:-1])
    changed = copy.deepcopy(rows)
    changed[0]["epochs"] += 1
    assert digest != runs.table_digest(changed)


def test_read_refuses_a_foreign_header(tmp_path):
    path = tmp_path / "runs.tsv"
    path.write_text("run\tfamilies\nx\tstrong\n")
    with pytest.raises(ValueError, match="its header is not the run table's"):
        read_runs_tsv(path)


def test_cli_writes_table_and_summary(tmp_path, capsys):
    from scalestudy.cli import main

    out = tmp_path / "runs.tsv"
    argv = ["matrix", "--config", str(ROOT / "config" / "demo.yaml"), "--out", str(out)]
    assert main([*argv, "--set", "dataset=synthetic"]) == 0
    text = capsys.readouterr().out
    for family in vocab.FAMILIES:
        assert family in text
    assert "6 runs" in text
    assert {r["dataset"] for r in read_runs_tsv(out)} == {"synthetic"}
    assert main([*argv, "--set", "train.precision=fp16"]) == 2
    assert "train.precision" in capsys.readouterr().err
    # the summary spells bucket sizes as the run ids do (`:g` wrote 1e+06 and 1.0000001 as 1)
    sweep = "families.bucket.bucket_cap_mb=[1000000, 1.0000001, 1]"
    assert main([*argv, "--set", "dataset=synthetic", "--set", sweep]) == 0
    assert "bucket_cap_mb 1000000,1.0000001,1 x local_batch" in capsys.readouterr().out
    # a study of one run: "total 1 runs" (the family lines said "1 run" already)
    one = ["families.strong.gpus=[1]", "repeats=1"]
    one += [f"families.{f}.enabled=false" for f in vocab.FAMILIES if f != "strong"]
    assert main([*argv, *(a for o in one for a in ("--set", o))]) == 0
    total = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("total")]
    assert total == [f"total        1 run -> {out}"], total


def test_the_summary_counts_in_words_that_agree_with_the_number(demo):
    """demo.yaml's precision family printed "at world sizes 2, x1 repeats"."""
    from scalestudy.study.matrix import _family_summary

    line = _family_summary(demo, build_run_table(demo), "precision")
    assert "at world size 2, x1 repeat" in line and "repeats" not in line, line
    one = copy.deepcopy(demo)
    one["families"]["precision"]["precisions"] = ["fp32"]
    assert " 1 run (" in _family_summary(one, build_run_table(one), "precision")


def test_collect_of_a_damaged_run_table_is_one_line_naming_the_line(tmp_path, capsys):
    """A run table cut short or edited by hand: `scalestudy collect` says which line and how to
    rebuild it, exit 2, no traceback (it raised ValueError before)."""
    from scalestudy.cli import main
    from scalestudy.errors import RunTableError

    out = tmp_path / "runs.tsv"
    argv = ["matrix", "--config", str(ROOT / "config" / "demo.yaml"), "--out", str(out)]
    assert main([*argv, "--set", "dataset=synthetic"]) == 0
    lines = out.read_text().splitlines()
    cut, bad, bare = tmp_path / "cut.tsv", tmp_path / "bad.tsv", tmp_path / "bare.tsv"
    cut.write_text("\n".join([*lines[:2], lines[2][:40]]) + "\n")
    cells = lines[1].split("\t")
    cells[RUN_COLUMNS.index("world_size")] = "two"
    bad.write_text("\n".join([lines[0], "\t".join(cells)]) + "\n")
    bare.write_text(lines[0] + "\n")  # collect wrote an empty runs.csv and epochs.csv from it
    # a run twice: collected twice, and analyze's fix for runs.csv ("write it again with
    # `scalestudy collect`") wrote the same two rows again
    twice = tmp_path / "twice.tsv"
    twice.write_text("\n".join([*lines, lines[1]]) + "\n")
    run = lines[1].split("\t")[RUN_COLUMNS.index("run")]
    # a cell past csv's field limit (131072 characters): a _csv.Error traceback
    huge = tmp_path / "huge.tsv"
    cells = lines[1].split("\t")
    cells[RUN_COLUMNS.index("dataset")] = "x" * 200_000
    huge.write_text("\n".join([lines[0], "\t".join(cells)]) + "\n")
    empty, other = tmp_path / "empty.tsv", tmp_path / "other.tsv"
    empty.write_text("")
    other.write_text("run,throughput_img_s\nw1,10\n")  # runs.csv given for the run table
    for path, says in (
        (cut, "line 3: "),
        (huge, "line 2: field larger than field limit"),
        (bad, "line 2: world_size is 'two', not a number"),
        (bare, "a header and no runs"),
        (twice, f"line {len(lines) + 1}: run {run!r} again (line 2)"),
        # none at all: "No such file or directory", naming no command that writes it
        (tmp_path / "none.tsv", "no such file; write the study's run table:"),
        # 0 bytes, another table: "header is not matrix.RUN_COLUMNS", a name only the code knows
        (empty, "empty (not even a header): cut short?; rebuild it: "),
        (other, "its header is not the run table's (run, families, nodes, ...; written by "),
        # a directory in its place: "PATH: Is a directory", no command named
        (tmp_path, "is a directory, not a file; rebuild it: "),
    ):
        with pytest.raises(RunTableError, match=re.escape(says)):
            read_runs_tsv(path)
        capsys.readouterr()
        csv = tmp_path / "results"
        outs = ["--out-runs", str(csv / "runs.csv"), "--out-epochs", str(csv / "epochs.csv")]
        assert main(["collect", "--runs", str(path), "--runs-dir", str(tmp_path), *outs]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"scalestudy collect: {path}") and says in err, err
        assert "scalestudy matrix" in err and not csv.exists()
        # Snakemake keeps a damaged table (params unchanged): the fix forces the rule
        assert "snakemake --forcerun=matrix" in err and f"--out {path}`" in err
        assert "Traceback" not in err


def test_config_files_layer_as_the_workflow_layers_them(tmp_path, capsys):
    """`matrix --config config/cpu-scaling.yaml` said "no family is enabled" while `snakemake
    --configfile` of the same file planned its runs (over config/config.yaml); a second --config
    was dropped. Now config/config.yaml, then each file in order, then --set."""
    from scalestudy.cli import main

    out = tmp_path / "runs.tsv"
    demo, overlay = str(ROOT / "config" / "demo.yaml"), str(ROOT / "config" / "cpu-scaling.yaml")
    # alone, over config.yaml's 20 warm-up steps, its runs are too short: the workflow's error
    assert main(["matrix", "--config", overlay, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"config/config.yaml + {overlay}: config key 'train.warmup_steps'" in err, err
    # demo then the overlay (its documented use): the overlay's keys win, the demo's stay
    assert main(["matrix", "--config", demo, "--config", overlay, "--out", str(out)]) == 0
    layered = read_runs_tsv(out)
    assert {r["world_size"] for r in layered if "strong" in r["families"]} == {1, 2, 4, 8}
    assert {r["epochs"] for r in layered} == {2}
    demo_alone = yaml.safe_load(Path(demo).read_text())
    assert {r["width"] for r in layered} == {16}  # the overlay's width
    assert {r["limit_train"] for r in layered} == {512}
    assert {r["local_batch"] for r in layered if "weak" in r["families"]} == {8}
    assert demo_alone["train"]["width"] != 16
    # a broken file among them is named
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  epochs: [1\n")
    assert main(["matrix", "--config", demo, "--config", str(broken), "--out", str(out)]) == 2
    assert f"{broken}, line" in capsys.readouterr().err


def test_cli_without_out_previews_and_leaves_the_workflows_table_alone(tmp_path, monkeypatch):
    """`scalestudy matrix` wrote results/matrix/runs.tsv by default, the output of the
    workflow's rule `matrix`: a preview of the paper study after a demo run replaced the demo's
    table, Snakemake (file newer, params unchanged) kept it, and collect asked for the paper's
    runs. Now the table goes to stdout, the summary to stderr, and no file is written."""
    import contextlib
    import io

    from scalestudy.cli import main

    monkeypatch.chdir(tmp_path)
    table = tmp_path / "results" / "matrix" / "runs.tsv"
    demo_rows = build_run_table(load_and_validate(ROOT / "config" / "demo.yaml"))
    write_runs_tsv(demo_rows, table)  # what snakemake --configfile config/demo.yaml wrote
    before = table.read_bytes()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["matrix", "--config", str(ROOT / "config" / "config.yaml")]) == 0
    assert table.read_bytes() == before
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "results",
        "results/matrix",
        "results/matrix/runs.tsv",
    ]
    preview = tmp_path / "preview.tsv"
    preview.write_text(out.getvalue())
    paper = build_run_table(load_and_validate(ROOT / "config" / "config.yaml"))
    assert read_runs_tsv(preview) == paper and len(paper) != len(demo_rows)
    summary = err.getvalue().splitlines()
    assert [line.split()[0] for line in summary] == [*vocab.FAMILIES, "total"]
    assert f"{len(paper)} runs" in summary[-1]


def _preview(tmp_path, stdout) -> subprocess.CompletedProcess:
    """`scalestudy matrix --config config/demo.yaml` in a fresh interpreter, its table to
    `stdout`."""
    argv = [
        sys.executable,
        "-m",
        "scalestudy",
        "matrix",
        "--config",
        str(ROOT / "config/demo.yaml"),
    ]
    return subprocess.run(
        argv, cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120
    )


def test_cli_preview_into_a_closed_pipe_is_quiet(tmp_path):
    """`scalestudy matrix --config ... | head -1`: the reader gone, the write of the table is
    no error (no traceback, no "Exception ignored" at exit)."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first byte
    try:
        proc = _preview(tmp_path, write_end)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("total")
    assert not list(tmp_path.iterdir())  # a preview writes no file


def test_cli_preview_onto_a_full_disk_is_one_line(tmp_path):
    """`scalestudy matrix --config ... > runs.tsv` on a full disk: a traceback ("a bug"), now
    one line naming stdout and the cause, exit 2. /dev/full: every write fails ENOSPC."""
    with open("/dev/full", "w") as full:
        proc = _preview(tmp_path, full)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["scalestudy matrix: stdout: No space left on device"]
