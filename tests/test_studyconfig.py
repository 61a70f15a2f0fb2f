"""The study config: shipped configs validate, defaults fill, and bad input is refused with a
message that names the key, the value and what is allowed."""

from __future__ import annotations

import copy
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalestudy import vocab
from scalestudy.study import config as studyconfig
from scalestudy.study import profiling, runs
from scalestudy.study.config import StudyConfigError, load_and_validate, validate
from scalestudy.trainer.config import STEP_GRAPH_WARM_STEPS, STEPS_BEFORE_WINDOW

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "config" / "config.yaml"
DEMO = ROOT / "config" / "demo.yaml"


def minimal(**families) -> dict:
    """A small valid config: strong scaling on 1-4 GPUs unless families are given; the strong
    target at 2 GPUs (the default, 8, is no world size of these sweeps)."""
    return {
        "hardware": {"gpus_per_node": 4},
        "families": families or {"strong": {"enabled": True, "gpus": [1, 2, 4]}},
        "report": {"targets": {"strong_efficiency_gpus": 2}},
    }


def refused(config, *needles, overrides=None) -> str:
    with pytest.raises(StudyConfigError) as info:
        load_and_validate(config, overrides=overrides)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"
    return message


@pytest.mark.parametrize("path", [FULL, DEMO], ids=["config", "demo"])
def test_shipped_configs_validate(path):
    cfg = load_and_validate(path)
    assert cfg["families"]["strong"]["enabled"]
    assert studyconfig.schema_path().is_file()


def test_shipped_configs_set_every_train_key():
    # the shipped configs document every train flag explicitly
    schema = yaml.safe_load(studyconfig.schema_path().read_text())
    train_keys = set(schema["properties"]["train"]["properties"])
    for path in (FULL, DEMO):
        assert set(yaml.safe_load(path.read_text())["train"]) == train_keys, path


def test_demo_runs_offline_with_synthetic_override():
    cfg = load_and_validate(DEMO, overrides=["dataset=synthetic"])
    assert cfg["dataset"] == "synthetic"
    cfg = load_and_validate(DEMO, overrides={"dataset": "synthetic"})
    assert cfg["dataset"] == "synthetic"


def test_defaults_filled_including_nested():
    cfg = load_and_validate(minimal())
    assert cfg["dataset"] == "cifar10"
    assert cfg["data_dir"] == "results/data"
    assert cfg["synthetic"] == {"num_train": 50000, "num_test": 10000}
    assert cfg["hardware"]["device"] == "cuda"
    assert cfg["train"]["bucket_cap_mb"] == 25
    assert cfg["train"]["target_acc"] is None
    assert cfg["families"]["strong"]["global_batch"] == 1024
    assert cfg["families"]["bucket"] == {
        "enabled": False,
        "gpus": 8,
        "bucket_cap_mb": [1, 5, 25, 100],
        "local_batch": [64, 128, 256],
    }
    assert cfg["container"]["image"] == "containers/trainer.sif"
    assert cfg["repeats"] == 3


def test_every_schema_key_has_description_and_default():
    schema = yaml.safe_load(studyconfig.schema_path().read_text())

    def walk(props, where):
        for name, sub in props.items():
            assert "description" in sub or "$ref" in sub, f"{where}{name}: no description"
            assert "default" in sub, f"{where}{name}: no default"
            if sub.get("type") == "object":
                assert sub.get("additionalProperties") is False, f"{where}{name}"
                assert sub["default"] == {}, f"{where}{name}: objects default to {{}}"
                walk(sub["properties"], f"{where}{name}.")

    walk(schema["properties"], "")


def test_defaults_not_shared_between_configs():
    a = load_and_validate(minimal())
    a["train"]["epochs"] = 1
    a["families"]["bucket"]["bucket_cap_mb"].append(7)
    b = load_and_validate(minimal())
    assert b["train"]["epochs"] == 30
    assert b["families"]["bucket"]["bucket_cap_mb"] == [1, 5, 25, 100]


def test_load_does_not_mutate_given_dict_but_validate_fills_in_place():
    given = minimal()
    before = copy.deepcopy(given)
    load_and_validate(given)
    assert given == before
    same = validate(given)  # the Snakefile's use: fill Snakemake's config dict in place
    assert same is given and given["train"]["model"] == "resnet18"


def test_set_overrides_dotted_yaml_values():
    cfg = load_and_validate(
        minimal(), overrides=["train.epochs=3", "families.strong.gpus=[1, 2]", "train.compile=true"]
    )
    assert cfg["train"]["epochs"] == 3
    assert cfg["families"]["strong"]["gpus"] == [1, 2]
    assert cfg["train"]["compile"] is True
    refused(minimal(), "KEY=VALUE", overrides=["train.epochs"])
    # YAML 1.1's octal and base 60, refused as in the files: `scalestudy plan --set repeats=010`
    # priced 8 repeats where Snakemake's --config trains 10
    refused(
        minimal(), "override 'train.epochs=010': '010' reads as 8", overrides=["train.epochs=010"]
    )
    refused(minimal(), "'5:00' reads as 300", overrides=["checkpointing.signal_lead_s=5:00"])
    # a key given twice in a mapping value: named, not "must be a mapping" of the text
    twice = "families.strong={enabled: true, enabled: false}"
    refused(minimal(), f"override {twice!r}: duplicate key 'enabled'", overrides=[twice])


def test_a_path_is_one_spelling_per_location():
    """The prepared data and the image are inputs of every training job, compared by Snakemake
    as text: data_dir `./results/data` or `results/data/` for `results/data` retrained all 75
    runs of the paper study. Each path key is written one way; `..` and a `./` before a `-`
    stay."""
    for given, kept in [
        ("./results/data/", "results/data"),
        ("results//data", "results/data"),
        ("/scratch//me/./data/", "/scratch/me/data"),
        ("./", "."),
        ("./-data", "./-data"),
        ("./~backup//data", "./~backup/data"),  # ~backup/data: refused as a home no shell expands
        ("../shared/data", "../shared/data"),
    ]:
        cfg = minimal()
        cfg["data_dir"] = given
        cfg["container"] = {"image": "./containers//trainer.sif"}
        validated = load_and_validate(cfg)
        assert validated["data_dir"] == kept, given
        assert validated["container"]["image"] == "containers/trainer.sif"
        assert validate(copy.deepcopy(validated)) == validated  # once written, as it stays


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("study: x\ntrain:\n  epochs: [1, 2\n  width: 8\n")
    message = refused(path, str(path), "line ", "malformed YAML")
    assert "line 4" in message or "line 5" in message


@pytest.mark.parametrize("text", ["", "# a study\n\n", "null\n", "---\n"])
def test_a_config_holding_nothing_is_refused_as_snakemake_refuses_it(tmp_path, text):
    """A 0-byte or comments-only --config (a copy cut short) read as {}: `scalestudy plan
    --config` priced the default study, exit 0, where `snakemake --configfile` refuses it."""
    path = tmp_path / "study.yaml"
    path.write_text(text)
    needle = f"{path}: holds no config (empty, or comments only: a copy cut short?)"
    assert "\n" not in refused(path, needle)
    with pytest.raises(StudyConfigError, match="holds no config"):
        studyconfig.load_layers([path])
    r = subprocess.run(
        [sys.executable, "-m", "scalestudy", "matrix", "--config", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    fix = "give the study's keys (config/config.yaml's are the defaults)"
    assert r.stderr.splitlines() == [f"scalestudy matrix: invalid study config: {needle}: {fix}"]


def test_a_control_character_in_the_yaml_is_one_line_with_file_line_and_column(tmp_path):
    """A NUL or another control byte (a file cut short and padded, a paste from a terminal) was
    PyYAML's two-line ReaderError, naming "<unicode string>", position 24, not a line."""
    path = tmp_path / "study.yaml"
    for byte, line, column in [("\x00", 3, 11), ("\x07", 1, 6)]:
        text = "study: x\ntrain:\n  model: a\x00b\n" if line == 3 else "seed:\x07 1\n"
        path.write_text(text.replace("\x00", byte))
        message = refused(path, f"{path}, line {line}, column {column}: malformed YAML")
        assert f"character {ord(byte):#06x} is not allowed" in message
        assert "\n" not in message and "unicode string" not in message


@pytest.mark.parametrize(
    "text, read_as, why",
    [
        ("010", "8", "a leading 0 makes it octal"),
        ("-007", "-7", "a leading 0 makes it octal"),
        ("5:00", "300", "digits joined by : are base 60"),
        ("1:30.5", "90.5", "digits joined by : are base 60"),
    ],
)
def test_a_number_yaml_1_1_reads_otherwise_is_refused_with_file_and_line(
    tmp_path, text, read_as, why
):
    """Snakemake reads config files as YAML 1.1 (PyYAML): `epochs: 010` trained 8 epochs."""
    path = tmp_path / "study.yaml"
    path.write_text(f"study: x\ntrain:\n  epochs: {text}\n")
    message = refused(path, f"{path}, line 3, column 11: '{text}' reads as {read_as} in YAML 1.1")
    assert f"({why})" in message and "or quote it for text" in message
    assert "malformed" not in message
    # what says what it is stays: hexadecimal, binary, zero, a decimal point, digit groups
    path.write_text("a: 0x10\nb: 0b11\nc: 0\nd: 00.5\ne: 1_000\nf: '010'\n")
    assert studyconfig.load_yaml(path) == {"a": 16, "b": 3, "c": 0, "d": 0.5, "e": 1000, "f": "010"}


def test_a_value_yaml_cannot_construct_is_one_line_with_file_and_line(tmp_path):
    """PyYAML raises a plain ValueError for a date that is none (2024-02-30) or a bad !!int,
    and a RecursionError for deep nesting: each was a traceback from `scalestudy matrix`, the
    plan and the workflow's config check; a quoted "2024-02-30" too (read again as YAML to
    see whether it spells a choice)."""
    path = tmp_path / "study.yaml"
    path.write_text("study: x\ntrain:\n  epochs: 3\n  lr: 2024-02-30\n")
    message = refused(path, f"{path}, line 4, column 7: '2024-02-30' is no date")
    assert "day is out of range for month" in message and "quote it" in message
    path.write_text("study: x\ntrain:\n  epochs: !!int x\n")
    refused(path, f"{path}, line 3, column 11: 'x' is no integer")
    path.write_text("study: " + "[" * 2000 + "]" * 2000 + "\n")
    refused(path, f"{path}: nested too deep")
    refused(minimal(), "override 'study=2024-02-30': '2024-02-30' is no date",
            overrides=["study=2024-02-30"])  # fmt: skip
    refused(minimal(), "override 'train.lr=!!float abc': 'abc' is no number",
            overrides=["train.lr=!!float abc"])  # fmt: skip
    # quoted, it is text: a choice's refusal, not a traceback
    refused(minimal(), "config key 'dataset': value \"2024-02-30\" is not allowed",
            overrides=["dataset='2024-02-30'"])  # fmt: skip
    # other tags' constructors fail otherwise (KeyError, AttributeError, IndexError)
    for text, what in (("!!bool maybe", "value of tag"), ("!!timestamp x", "date")):
        path.write_text(f"study: x\ntrain:\n  epochs: {text}\n")
        refused(path, f"{path}, line 3, column 11: ", f"is no {what}")
        refused(minimal(), 'config key \'train.precision\': value "', "is not allowed",
                overrides=[f"train.precision='{text}'"])  # fmt: skip
    refused(minimal(), "override 'train.epochs=!!int \"\"': '' is no integer",
            overrides=['train.epochs=!!int ""'])  # fmt: skip
    # JSON takes deeper nesting than the merge's recursion: one line too
    path.write_text('{"study": ' + "[" * 600 + "]" * 600 + "}")
    refused(path, "nested too deep")
    # an alias inside its own anchor, twice: the depth check's levels doubled for ever
    path.write_text("study: x\nfamilies: &a {x: *a, y: *a}\n")
    refused(path, "config key 'families.x': its value holds itself")


def test_duplicate_yaml_key_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  epochs: 3\nrepeats: 1\ntrain:\n  width: 8\n")
    refused(path, str(path), "line 4", "duplicate key 'train'", "line 1")


def test_yaml_merge_keys_load_as_safe_load_does(tmp_path):
    """`<<: *anchor` was refused as "could not determine a constructor for the tag ...merge",
    though PyYAML's safe_load and Snakemake's configfile loader take it. A key a merge brings
    and the mapping gives too is no duplicate (the mapping's own wins); one the mapping gives
    twice still is, beside a merge as well."""
    text = (
        "base: &base {enabled: true, gpus: [1, 2], local_batch: 16}\n"
        "families:\n"
        "  weak: &scan {<<: *base, gpus: [1, 4]}\n"  # flattened by `bucket` before it is built
        "  bucket:\n"
        "    <<: *scan\n"
        "    gpus: 2\n"
        "    bucket_cap_mb: [1, 25]\n"
        "  strong: {<<: [*scan, {gpus: 8, epochs: 3}], local_batch: 32}\n"
    )
    path = tmp_path / "merge.yaml"
    path.write_text(text)
    loaded = studyconfig.load_yaml(path)
    assert loaded == yaml.safe_load(text)
    assert loaded["families"]["bucket"] == {
        "enabled": True,
        "gpus": 2,
        "local_batch": 16,
        "bucket_cap_mb": [1, 25],
    }
    assert loaded["families"]["strong"]["local_batch"] == 32
    twice = "    bucket_cap_mb: [1, 25]\n"
    path.write_text(text.replace(twice, twice + "    bucket_cap_mb: [5]\n"))
    refused(path, str(path), "line 8", "duplicate key 'bucket_cap_mb'", "line 7")
    path.write_text(text.replace("gpus: [1, 4]}", "gpus: [1, 4], gpus: [2]}"))
    refused(path, str(path), "line 3", "duplicate key 'gpus'", "line 3")


def test_a_json_config_file_reads_as_snakemake_reads_it(tmp_path):
    """Snakemake reads a config file as JSON first, then YAML: `"lr": 1e-1` is 0.1 to the
    workflow, but the package read every file as YAML 1.1 (text "1e-1"), so `scalestudy plan`
    refused the study the workflow ran, and the workflow's error line named its values as
    --config overrides."""
    path = tmp_path / "study.json"
    path.write_text('{\n "study": "j",\n "train": {"lr": 1e-1, "weight_decay": 5e-4}\n}\n')
    assert studyconfig.load_yaml(path) == {"study": "j", "train": {"lr": 0.1, "weight_decay": 5e-4}}
    path.write_text('{"train": {"lr": 0.1},\n "train": {"lr": 0.2}}\n')
    refused(path, str(path), "duplicate key 'train'")


def test_missing_file_refused(tmp_path):
    refused(tmp_path / "nope.yaml", "nope.yaml")


def test_unknown_top_level_key():
    cfg = minimal()
    cfg["familes"] = {}
    refused(cfg, "config key 'familes'", "unknown key", "did you mean 'families'")


def test_unknown_nested_key():
    cfg = minimal()
    cfg["train"] = {"epoch": 3}
    refused(cfg, "config key 'train.epoch'", "unknown key", "did you mean 'epochs'")
    cfg = minimal()
    cfg["families"]["strong"]["global_bach"] = 512
    refused(cfg, "families.strong.global_bach", "global_batch")


def test_many_unknown_keys_are_one_line_per_level():
    """A file that is no study config among the config files (`snakemake --configfile
    config/demo.yaml results/runs/X/metrics.json`: --configfile takes every path after it, the
    target too) was 133 lines, one per key of metrics.json, each listing every allowed key.
    The unknown keys of one level are one line now, a close match still its own line, and so
    many of them say what may have happened."""
    cfg = minimal()
    cfg.update({f"metric_{i}": i for i in range(20)}, trains=1)  # metrics.json's sort of keys
    message = refused(cfg, "config keys 'metric_0', 'metric_1'", "and 13 more")
    assert "\n" not in message, message  # one problem: one line
    assert "21 unknown keys at the top level" in message and "--configfile" in message, message
    assert "metric_19" not in message and "did you mean" not in message, message  # chance
    cfg = minimal()
    cfg.update(familes={}, tarin={}, metric_a=1)  # a few: each typo its own line, with its key
    message = refused(cfg, "did you mean 'families'", "did you mean 'train'")
    assert "config key 'metric_a': unknown key is not allowed" in message, message
    assert sum("unknown key" in line for line in message.splitlines()) == 3, message
    cfg = minimal()
    cfg["train"] = {"a_key": 1, "b_key": 2}  # two, no match: one line, no guess at a cause
    message = refused(cfg, "config keys 'train.a_key', 'train.b_key': unknown keys")
    assert "--configfile" not in message and "\n" not in message, message  # one problem


def test_wrong_type():
    cfg = minimal()
    cfg["train"] = {"epochs": "ten"}
    refused(cfg, "config key 'train.epochs'", 'value "ten"', "must be an integer")
    cfg = minimal()
    cfg["families"]["strong"]["gpus"] = [1, 2.0]
    refused(cfg, "families.strong.gpus[1]", "value 2.0", "integer")
    cfg = minimal()
    cfg["families"]["strong"]["enabled"] = "yes please"
    refused(cfg, "families.strong.enabled", "true or false")


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("repeats", 0, ">= 1"),
        ("hardware.gpus_per_node", 0, ">= 1"),
        ("train.epochs", -1, ">= 1"),
        ("train.local_batch", 0, ">= 1"),
        ("train.num_workers", -2, ">= 0"),
        ("families.strong.gpus", [1, 0], ">= 1"),
        ("families.strong.global_batch", -8, ">= 1"),
        ("train.target_acc", 1.5, "<= 1"),
        ("train.bucket_cap_mb", 0, ">= 0.001"),
        # the run id holds every digit of a bucket size: 1.0e+300 MiB was an id of 324
        # characters, longer than a file name may be, in every job's output path
        ("train.bucket_cap_mb", "1.0e+300", "<= 1000000"),
        ("train.warmup_epochs", "1.0e+308", "<= 100000"),
        ("families.bucket.bucket_cap_mb", "[1.0e-300]", ">= 0.001"),
        # gloo refused 10**13 s as an invalid timeout, in every training job, after the queue
        ("train.pg_timeout_s", 10**13, "<= 604800"),
        ("train.seed", 2**62, "<= 4611686018427387903"),  # seed + repeat: torch's 63 bits
        # 10**30 was planned: 4.7e25 node-hours, a Slurm limit of 9.5e26 minutes
        ("train.comm_probe_steps", 10**30, "<= 100000"),
        # fractions written as percentages: 20 asked for a 21x allocation, 1 accepted any accuracy
        ("plan.contingency", 20, "<= 1 (a fraction: 0.2 = 20%)"),
        ("proposal.contingency", 20, "<= 1 (a fraction: 0.2 = 20%)"),
        ("report.targets.accuracy_tolerance", 1, "< 1 (a fraction"),
        ("report.targets.weak_deviation", 10, "<= 1 (a fraction"),
    ],
)
def test_zero_and_negative_counts(key, value, rule):
    message = refused(minimal(), "value", rule, overrides=[f"{key}={value}"])
    assert f"config key '{key}" in message


def test_empty_sweep():
    refused(
        minimal(strong={"enabled": True, "gpus": []}),
        "config key 'families.strong.gpus'",
        "value []",
        "empty sweep",
    )
    refused(
        minimal(bucket={"enabled": True, "gpus": 4, "bucket_cap_mb": []}),
        "families.bucket.bucket_cap_mb",
        "empty sweep",
    )


def test_disabled_family_is_not_checked():
    load_and_validate(minimal(strong={"enabled": True, "gpus": [1]}, weak={"gpus": [3, 5]}))


def test_no_family_enabled():
    refused({"families": {"strong": {"enabled": False}}}, "'families'", "no family is enabled")
    refused({}, "no family is enabled")


def test_duplicates_in_lists():
    refused(
        minimal(strong={"enabled": True, "gpus": [1, 2, 2]}),
        "families.strong.gpus[2]",
        "value 2",
        "duplicate of families.strong.gpus[1]",
    )
    refused(
        minimal(precision={"enabled": True, "gpus": [1], "precisions": ["bf16", "bf16"]}),
        "families.precision.precisions[1]",
        "duplicate",
    )


def test_world_size_must_fit_gpus_per_node():
    refused(
        minimal(strong={"enabled": True, "gpus": [1, 2, 6], "global_batch": 1536}),
        "config key 'families.strong.gpus[2]'",
        "value 6",
        "does not fit gpus_per_node 4",
        "multiple of 4",
    )
    refused(minimal(bucket={"enabled": True, "gpus": 6}), "'families.bucket.gpus'", "value 6")
    # 3 <= 4 fits one node; 8 and 12 are whole nodes
    load_and_validate(minimal(weak={"enabled": True, "gpus": [3, 8, 12]}))


def test_strong_global_batch_divisible():
    refused(
        minimal(strong={"enabled": True, "gpus": [1, 2, 3], "global_batch": 1000}),
        "config key 'families.strong.global_batch'",
        "value 1000",
        "3 (families.strong.gpus[2])",
        "multiple of 6",
    )
    cfg = minimal(strong={"enabled": True, "gpus": [1, 2, 4], "global_batch": 16})
    cfg["train"] = {"accum_steps": 8}
    refused(cfg, "accum_steps x world size = 8 x 4", "multiple of 32")


def test_global_batch_larger_than_training_set():
    cfg = minimal(weak={"enabled": True, "gpus": [1, 4], "local_batch": 256})
    cfg["train"] = {"limit_train": 512}
    refused(cfg, "families.weak.gpus[1]", "1024", "train.limit_train", "families.weak.local_batch")


def test_a_global_batch_larger_than_the_training_set_names_the_key_that_sets_it():
    """A strong global batch beyond the training set was blamed on every world size (three
    lines, 'families.strong.gpus[0]: value 1 is not allowed'), never on global_batch, the
    one key that could fix it; a bucket local batch on families.bucket.gpus (at least 2: it
    cannot go lower), not on the local_batch entry; the precision family's on its world size
    without train.local_batch, which sets it."""
    cfg = minimal(strong={"enabled": True, "gpus": [1, 2, 4], "global_batch": 1024})
    cfg["train"] = {"limit_train": 512}
    message = refused(cfg, "config key 'families.strong.global_batch': value 1024", "512")
    assert "families.strong.gpus" not in message, message
    cfg = minimal(bucket={"enabled": True, "gpus": 2, "local_batch": [16, 512]})
    cfg["train"] = {"limit_train": 512}
    message = refused(cfg, "config key 'families.bucket.local_batch[1]': value 512", "1024")
    assert "'families.bucket.gpus'" not in message, message
    cfg = minimal(precision={"enabled": True, "gpus": [1, 2], "precisions": ["fp32"]})
    cfg["train"] = {"limit_train": 512, "local_batch": 512}
    refused(cfg, "families.precision.gpus[1]", "lower train.local_batch")


def test_a_profile_window_beyond_the_epoch_names_the_key_that_can_change():
    """profiling.start_step 0 with too many steps was 'value 0 is not allowed ... profile
    earlier': it cannot start earlier. Then profiling.steps is named, with the most it may be."""
    cfg = minimal()
    cfg["dataset"] = "synthetic"
    cfg["synthetic"] = {"num_train": 2048, "num_test": 100}
    cfg["profiling"] = {"enabled": True, "start_step": 0, "steps": 200}
    message = refused(cfg, "config key 'profiling.steps': value 200 is not allowed")
    assert "profile earlier" not in message, message
    assert re.search(r"at most \d+ steps", message), message
    # a start_step too late: the latest that fits is named (it was "profile earlier or fewer
    # steps", and config.yaml's comment promised a number)
    cfg["profiling"] = {"enabled": True, "start_step": 5, "steps": 1}
    message = refused(cfg, "config key 'profiling.start_step': value 5 is not allowed")
    latest = int(re.search(r"start_step at most (\d+)", message)[1])
    batch = int(re.search(r"x global batch (\d+)", message)[1])
    assert (latest + 1 + 1) * batch <= 2048 < (latest + 1 + 1 + 1) * batch, message
    # a later start_step with more steps than the epoch holds from any start: the steps are
    # what changes (start_step was named, with "at most N steps" as its fix)
    cfg["synthetic"]["num_train"] = 16 * batch  # 16 steps an epoch
    cfg["profiling"] = {"enabled": True, "start_step": 1, "steps": 16}
    refused(cfg, "config key 'profiling.steps': value 16 is not", "; at most 14 steps")
    cfg["synthetic"]["num_train"] = 2048
    cfg["profiling"] = {"enabled": True, "start_step": 5, "steps": 10}  # no start fits
    refused(cfg, "value 5 is not allowed", "fewer steps from an earlier start_step")
    # an epoch of one step holds no window from any start: "fewer steps from an earlier
    # start_step" was its advice, and start_step 0 with 1 step was refused in turn
    cfg["synthetic"]["num_train"] = batch
    cfg["profiling"] = {"enabled": True, "start_step": 3, "steps": 5}
    refused(cfg, "config key 'profiling.steps': value 5 is not allowed", "no window fits")
    # with PowerSGD no start before its uncompressed steps is named (refused on its own)
    cfg["synthetic"]["num_train"] = 16 * 1024
    cfg.setdefault("train", {})["comm_hook"] = "powersgd"
    cfg["profiling"] = {"enabled": True, "start_step": 10, "steps": 6}
    message = refused(cfg, "config key 'profiling.steps': value 6 is not allowed", "at most 5 st")
    assert "start_step at most" not in message, message


def test_a_profile_window_beyond_several_runs_epochs_is_one_line_with_the_tightest_fix():
    """config.yaml with profiling.start_step 10000: a line per profiled run, two saying
    "start_step at most 184" and two "at most 37"; who followed the first was refused again.
    One line now, for the run of the largest global batch, whose fix fits every run."""
    from scalestudy.study.runs import build_run_table

    message = refused(FULL, "config key 'profiling.start_step': value 10000 is not allowed: run ",
                      overrides=["profiling.start_step=10000"])  # fmt: skip
    assert len(message.splitlines()) == 1, message
    latest = int(re.search(r"start_step at most (\d+)", message)[1])
    others = int(re.search(r"\(and (\d+) more profiled runs?\)", message)[1])
    config = load_and_validate(FULL)
    profiled = profiling.profiled_runs(config, build_run_table(config))
    assert others == len(profiled) - 1
    fixed = load_and_validate(FULL, overrides=[f"profiling.start_step={latest}"])
    assert fixed["profiling"]["start_step"] == latest  # the fix it names fits every run


def test_a_partitions_max_time_below_the_shortest_limit_is_refused():
    """hardware.runtime_max below hardware.runtime_min: every job asks for runtime_min at least,
    which the partition would never grant."""
    cfg = minimal()
    cfg["hardware"].update(runtime_min=30, runtime_max=20)
    refused(
        cfg,
        "config key 'hardware.runtime_max': value 20 is not allowed: at least "
        "hardware.runtime_min (30), the limit every job asks for at least",
    )
    cfg["hardware"]["runtime_max"] = 30
    assert load_and_validate(cfg)["hardware"]["runtime_max"] == 30
    del cfg["hardware"]["runtime_max"]
    assert load_and_validate(cfg)["hardware"]["runtime_max"] is None  # no bound by default


def test_unknown_dataset():
    refused(
        minimal(),
        "config key 'dataset'",
        'value "cifar100"',
        '"cifar10", "mnist", "synthetic"',
        overrides=["dataset=cifar100"],
    )


def test_fp16_and_tf32_refused_on_cpu():
    cfg = minimal()
    cfg["hardware"]["device"] = "cpu"
    cfg["train"] = {"precision": "fp16"}
    refused(cfg, "config key 'train.precision'", 'value "fp16"', "needs CUDA", "fp32 or bf16")
    cfg = minimal(precision={"enabled": True, "gpus": [1], "precisions": ["fp32", "tf32"]})
    cfg["hardware"]["device"] = "cpu"
    refused(cfg, "families.precision.precisions[1]", "tf32")
    cfg["hardware"]["device"] = "cuda"
    load_and_validate(cfg)


def test_a_gpu_type_is_a_gres_word_on_a_cuda_study():
    cfg = minimal()
    cfg["hardware"]["gpu_type"] = "a100 80g"
    refused(cfg, "config key 'hardware.gpu_type'", 'value "a100 80g"', "must match the pattern")
    # a YAML block scalar's final newline: Python's $ matched before it, and "gpu:h100\n:2"
    # failed every GPU job at submission (the executor's GRES check)
    cfg["hardware"]["gpu_type"] = "h100\n"
    refused(cfg, "config key 'hardware.gpu_type'", "must match the pattern ^[A-Za-z0-9_.]*$")
    cfg["hardware"]["gpu_type"] = "h100"
    assert load_and_validate(cfg)["hardware"]["gpu_type"] == "h100"
    cfg["hardware"]["device"] = "cpu"  # config/demo.yaml given over a config.yaml that sets one
    load_and_validate(cfg)
    cfg["hardware"]["device"] = "cuda"
    del cfg["hardware"]["gpu_type"]
    assert load_and_validate(cfg)["hardware"]["gpu_type"] == ""


def test_cuda_graphs_need_a_cuda_study_that_compiles():
    cfg = minimal()
    cfg["hardware"]["device"] = "cpu"
    cfg["train"] = {"cuda_graphs": True}
    refused(cfg, "config key 'train.cuda_graphs'", 'hardware.device cuda (is "cpu")')
    cfg["hardware"]["device"] = "cuda"
    cfg["train"]["compile"] = False
    refused(cfg, "config key 'train.cuda_graphs'", "train.compile auto or true (is false)")
    for compile_value in ("auto", True):
        cfg["train"]["compile"] = compile_value
        assert load_and_validate(cfg)["train"]["cuda_graphs"] is True
    # auto (the default) is a switch the trainer resolves: valid on a CPU and without compiling
    assert load_and_validate(minimal())["train"]["cuda_graphs"] == "auto"
    cfg["train"] = {"cuda_graphs": "auto", "compile": False}
    cfg["hardware"]["device"] = "cpu"
    load_and_validate(cfg)
    cfg["train"]["cuda_graphs"] = "sometimes"
    refused(cfg, "config key 'train.cuda_graphs'", "sometimes")


def test_the_precision_family_needs_its_fp32_baseline():
    """Without fp32 analyze claimed no speedup and the precision figure was drawn empty."""
    cfg = minimal(precision={"enabled": True, "gpus": [1], "precisions": ["bf16"]})
    refused(
        cfg, "config key 'families.precision.precisions': value [\"bf16\"]", "must include fp32"
    )
    cfg["families"]["precision"]["precisions"] = ["bf16", "fp32"]
    load_and_validate(cfg)


def test_a_whole_step_cuda_graph_needs_a_gpu_study_whose_runs_fit_one_graph():
    cfg = minimal()
    cfg["hardware"]["device"] = "cpu"
    cfg["train"] = {"cuda_graphs": "step"}
    refused(cfg, "config key 'train.cuda_graphs'", 'hardware.device cuda (is "cpu")')
    cfg["hardware"]["device"] = "cuda"
    assert load_and_validate(cfg)["train"]["cuda_graphs"] == "step"
    # every run must fit: a precision family with fp16 does not (its GradScaler)
    cfg["families"]["precision"] = {"enabled": True, "precisions": ["bf16", "fp16"]}
    refused(cfg, "config key 'train.cuda_graphs'", "precision fp16", "use auto")
    cfg["families"]["precision"]["precisions"] = ["fp32", "bf16", "tf32"]
    load_and_validate(cfg)
    cfg["train"]["accum_steps"] = 2
    message = refused(cfg, "config key 'train.cuda_graphs'", "accum_steps 2")
    assert message.count("accum_steps 2") == 1, message  # once, not once per precision


def test_compile_is_auto_true_or_false():
    assert load_and_validate(minimal())["train"]["compile"] == "auto"  # the default
    cfg = minimal()
    cfg["train"] = {"compile": "sometimes"}
    refused(cfg, "config key 'train.compile'", 'value "sometimes"', '"auto", true, false')


def test_all_problems_reported_at_once():
    cfg = minimal(strong={"enabled": True, "gpus": [1, 1, 6]})
    with pytest.raises(StudyConfigError) as info:
        load_and_validate(cfg)
    assert len(info.value.problems) >= 2


def test_format_schema_error_shape():
    from jsonschema import Draft202012Validator

    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}}}
    schema["properties"]["a"]["properties"]["b"] = {"enum": [1, 2]}
    (err,) = Draft202012Validator(schema).iter_errors({"a": {"b": 3}})
    assert studyconfig.format_schema_error(err) == (
        "config key 'a.b': value 3 is not allowed: one of 1, 2"
    )


def test_cpu_scaling_overlay_is_a_valid_study_of_world_sizes_1_to_8():
    """config/cpu-scaling.yaml is given after the demo; Snakemake merges them key by key."""
    from snakemake.utils import update_config

    from scalestudy.study.runs import build_run_table

    config = yaml.safe_load(DEMO.read_text())
    update_config(config, yaml.safe_load((DEMO.parent / "cpu-scaling.yaml").read_text()))
    cfg = load_and_validate(config, overrides=["dataset=synthetic"])
    rows = build_run_table(cfg)
    assert sorted({r["world_size"] for r in rows}) == [1, 2, 4, 8]
    assert {r["bucket_cap_mb"] for r in rows if r["world_size"] == 4} == {1, 25}
    assert len(rows) == 8 and all(r["nodes"] == 1 for r in rows)


def strong_target_refusal(layers, overrides=()) -> str:
    """The one line a layered config (as the workflow layers it) is refused with."""
    with pytest.raises(StudyConfigError) as info:
        studyconfig.load_layers(layers, overrides=list(overrides))
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_strong_target_the_strong_family_does_not_run_is_refused_before_any_job(tmp_path):
    """report.targets.strong_efficiency_gpus 8 over the demo's strong family of 1, 2 and 4
    ranks passed validation: `snakemake -n` planned the whole study, every run trained, and only
    then did the report say "not measured" (analyze.verdicts: no strong run at 8)."""
    target = tmp_path / "target8.yaml"
    target.write_text("report:\n  targets:\n    strong_efficiency_gpus: 8\n")
    line = strong_target_refusal([DEMO, target])
    assert line.startswith(f"invalid study config {studyconfig.default_config_path()} + ")
    assert (
        "config key 'report.targets.strong_efficiency_gpus': value 8 is not allowed: one of "
        "2, 4, the world sizes of families.strong.gpus [1, 2, 4] above its smallest (1,"
    ) in line, line
    # narrowed by --set, the sweep no longer reaches the demo's target of 4
    line = strong_target_refusal([DEMO], ["families.strong.gpus=[1, 2]"])
    assert "value 4 is not allowed: one of 2, the world sizes" in line, line
    # said with the run table's own problems, not in place of them
    both = ["report.targets.strong_efficiency_gpus=8", "profiling.gpus=[3]"]
    refused(DEMO, "strong_efficiency_gpus': value 8", "'profiling.gpus': value [3]", overrides=both)


@pytest.mark.parametrize(
    "gpus, target, allowed",
    [([2, 4], 2, "one of 4,"), ([4, 8], 2, "one of 8,"), ([4, 8, 16], 4, "one of 8, 16,")],
)
def test_a_strong_target_at_or_below_the_smallest_strong_world_size_is_refused(
    gpus, target, allowed
):
    """E_s is against the strong family's smallest world size, where it is 1 by definition:
    a target there (or below it) passed validation and could never be judged, every run
    trained for a verdict of "not measured"."""
    line = strong_target_refusal(
        [DEMO],
        [f"families.strong.gpus={gpus}", f"report.targets.strong_efficiency_gpus={target}"],
    )
    assert f"value {target} is not allowed: {allowed} the world sizes of families.strong" in line


@pytest.mark.parametrize(
    "overrides",
    [
        ["families.strong.enabled=false"],  # the verdict says the strong family did not run
        ["families.strong.gpus=[4]"],  # one world size: no target could be measured
    ],
)
def test_a_strong_target_is_not_checked_where_no_value_could_be_measured(overrides):
    cfg = studyconfig.load_layers([DEMO], [*overrides, "report.targets.strong_efficiency_gpus=8"])
    assert cfg["report"]["targets"]["strong_efficiency_gpus"] == 8


def test_the_shipped_studies_judge_their_strong_target_at_a_strong_run():
    """config/config.yaml (8 of 1-16), the demo (4 of 1-4), cpu-scaling (8 of 1-8) and the
    local Slurm overlay validate as the workflow layers them."""
    config = ROOT / "config"
    for layers in (
        [],
        [DEMO],
        [DEMO, config / "cpu-scaling.yaml"],
        [DEMO, config / "local-slurm.yaml"],
    ):
        cfg = studyconfig.load_layers(layers)
        want = cfg["report"]["targets"]["strong_efficiency_gpus"]
        assert want in sorted(cfg["families"]["strong"]["gpus"])[1:], layers


def test_a_flag_combination_the_trainer_refuses_fails_here_not_in_each_job():
    """The trainer's own checks (TrainConfig) run on every run's flags while validating: a DDP
    comm hook with FSDP used to pass here and then fail in every training job."""
    cfg = minimal()
    cfg["train"] = {"strategy": "fsdp", "comm_hook": "powersgd"}
    refused(cfg, "runs w1_lb", "`scalestudy train` refuses", "--comm-hook powersgd needs")


def test_powersgd_with_an_fp16_run_is_refused_before_any_job():
    cfg = minimal()
    cfg["train"] = {"comm_hook": "powersgd"}
    load_and_validate(cfg)
    cfg["families"]["precision"] = {"enabled": True, "gpus": [1], "precisions": ["fp32", "fp16"]}
    refused(cfg, "`scalestudy train` refuses", "--comm-hook powersgd with --precision fp16")


def test_a_run_too_short_for_its_steady_state_window_is_refused():
    """A run whose optimizer steps are all warm-up has no window: the trainer refuses it in its
    job (loop.py); the config check names the key, the limit and the run."""
    cfg = minimal()
    cfg["train"] = {"epochs": 1, "warmup_steps": 20}  # CIFAR-10 at 4 x 256: 48 steps: fine
    load_and_validate(cfg)
    cfg["families"]["strong"]["global_batch"] = 4096  # 12 steps of 4,096 images
    refused(
        cfg,
        "config key 'train.warmup_steps': value 20 is not allowed: at most 11 here",
        "takes 12 optimizer steps",
    )


def test_a_powersgd_run_too_short_for_its_uncompressed_steps_is_refused():
    """The trainer's window opens after PowerSGD's 10 uncompressed steps, whatever
    train.warmup_steps says: 6 optimizer steps passed the check (warmup_steps 2) and every
    training job was refused."""
    cfg = minimal()
    cfg["train"] = {"epochs": 1, "warmup_steps": 2, "limit_train": 1024}
    cfg["families"]["strong"] = {"enabled": True, "gpus": [2], "global_batch": 128}
    load_and_validate(cfg)  # 8 steps: enough for a warm-up of 2
    cfg["train"]["comm_hook"] = "powersgd"
    refused(
        cfg,
        "config key 'train.comm_hook': value powersgd is not allowed here",
        "takes 8 optimizer steps",
        "after its 10 uncompressed steps",
    )


def test_a_run_too_short_for_the_whole_step_graph_is_refused_and_auto_is_not():
    """Under train.cuda_graphs step the trainer refuses a run of <= STEPS_BEFORE_WINDOW optimizer
    steps (its eager steps and the capture leave no window: compiling.graphs_mode); such a study
    passed this check and every training job failed. auto leaves the graph out of a run that
    short (the trainer's own test: test_fastpath.py), so it stays valid."""
    cfg = minimal()
    cfg["hardware"]["device"] = "cuda"
    cfg["train"] = {"epochs": 1, "warmup_steps": 3, "precision": "bf16"}
    cfg["families"]["strong"] = {"enabled": True, "gpus": [2], "global_batch": 128}
    # limit_train in whole global batches: exactly as many optimizer steps
    cfg["train"]["limit_train"] = 128 * STEPS_BEFORE_WINDOW
    load_and_validate(cfg)  # auto (the default): enough steps for a warm-up of 3
    cfg["train"]["cuda_graphs"] = "step"
    refused(
        cfg,
        "config key 'train.cuda_graphs': value step is not allowed here: run w2_lb64_bf16",
        f"takes {STEPS_BEFORE_WINDOW} optimizer steps",
        f"needs more than {STEPS_BEFORE_WINDOW} ({STEP_GRAPH_WARM_STEPS} eager steps and the "
        "capture) before its throughput window",
        "or use auto",
    )
    cfg["train"]["limit_train"] = 128 * (STEPS_BEFORE_WINDOW + 1)  # one step of window
    load_and_validate(cfg)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("data_dir", "~/data", "no ~ or $VARIABLE: nothing expands them (a directory named '~'"),
        ("checkpointing.dir", "$SCRATCH/ckpt", "a directory named '$SCRATCH' would be made"),
        ("container.image", "${HOME}/t.sif", "no ~ or $VARIABLE"),
        ("data_dir", "data {x}", "no { or }: Snakemake reads them as wildcards"),
        # `--data-dir -x`: argparse took the path for an option, in the job ("expected one
        # argument", and its usage)
        ("data_dir", "-x", "no leading -: a command reads it as an option; write ./-x"),
        ("container.image", "-t.sif", "write ./-t.sif"),
    ],
)
def test_paths_a_shell_or_a_command_would_misread_are_refused(key, value, says):
    """They were used literally: `prepare-data --data-dir '~/data'` made ./~/data."""
    refused(minimal(), f"config key '{key}': value \"{value}\" is not allowed: ", says,
            overrides=[f"{key}={value}"])  # fmt: skip


@pytest.mark.parametrize("key", ["data_dir", "checkpointing.dir", "container.image", "study"])
def test_empty_paths_are_refused(key):
    """An empty data_dir became `--data-dir /`, an empty checkpoint dir `/<run>`; an empty
    study name the report's title `Scaling study ****` (workflow/report/workflow.rst)."""
    refused(
        minimal(),
        f"config key '{key}': value \"\" is not allowed: must not be empty",
        overrides=[f'{key}=""'],
    )


def test_a_number_yaml_reads_as_text_says_how_to_write_it():
    refused(
        minimal(),
        "must be a number (YAML reads 5e-4 as text: write 0.0005",
        overrides=["train.lr=5e-4"],
    )
    # it has a dot already (PyYAML wants a signed exponent too): the hint said "with a dot"
    refused(minimal(), "(YAML reads 1.0e4 as text: write 10000.0,", overrides=["train.lr=1.0e4"])


def test_a_count_yaml_reads_as_text_or_a_name_it_reads_as_a_boolean_says_how_to_write_it():
    """`epochs: 1e3` (an integer key) was "value "1e3" ... must be an integer", its quotes
    unexplained, where a number key got the YAML hint; `study: yes` (YAML 1.1's boolean) was
    "value true ... must be a string", a value the user never typed."""
    refused(
        minimal(),
        "config key 'train.epochs': value \"1e3\" is not allowed: must be an integer (YAML "
        "reads 1e3 as text: write 1000)",
        overrides={"train": {"epochs": "1e3"}},
    )
    for typed, read in (("yes", True), ("On", True), ("No", False)):
        assert yaml.safe_load(f"study: {typed}") == {"study": read}
        refused(
            minimal(),
            f"config key 'study': value {str(read).lower()} is not allowed: must be a string "
            "(YAML 1.1 reads yes, no, on, off, true and false unquoted as true or false: "
            "write it quoted)",
            overrides={"study": read},
        )
    # one line for one value: the schema's type and its enum said it twice
    message = refused(
        minimal(),
        "config key 'profiling.ncu.enabled': value 1 is not allowed: one of \"auto\", true, false",
        overrides={"profiling": {"ncu": {"enabled": 1}}},
    )
    assert message.count("profiling.ncu.enabled") == 1, message


@pytest.mark.parametrize(
    ("key", "text", "spelling"),
    [("train.weight_decay", "1e-5", "1.0e-05"), ("train.weight_decay", "1e+300", "1.0e+300")],
)
def test_the_spelling_the_hint_proposes_is_a_number_to_yaml(key, text, spelling):
    """The hint printed Python's repr, "write 1e-05" and "write 1e+300": YAML 1.1 reads those
    as text too, so following it was refused again."""
    message = refused(minimal(), f"(YAML reads {text} as text: write {spelling},",
                      overrides=[f"{key}={text}"])  # fmt: skip
    proposed = message.split(" as text: write ", 1)[1].split(",", 1)[0]
    assert yaml.safe_load(proposed) == float(text)
    section, name = key.split(".")
    config = load_and_validate(minimal(), overrides=[f"{key}={proposed}"])
    assert config[section][name] == float(text)


def test_a_refused_value_is_spelled_as_typed_and_only_the_invisible_escaped():
    """JSON's ASCII escapes wrote `dataset=cifär10` as "cif\\u00e4r10", a word the user never
    typed; a zero-width space inside a name, which no one can see, stays escaped."""
    refused(minimal(), "config key 'dataset': value \"cifär10\" is not allowed",
            overrides=["dataset=cifär10"])  # fmt: skip
    message = refused(minimal(), overrides=["dataset=cifar\u200b10"])
    assert 'value "cifar\\u200b10" is not allowed' in message, message


def test_a_value_yaml_reads_as_a_date_or_a_number_says_to_quote_it():
    """`study: 2024-05-01` was "value datetime.date(2024, 5, 1) ... must be a string";
    `profiling.nsys_ranks: 0` two lines, one of which listed "0" as allowed."""
    message = refused(minimal(), "config key 'study': value 2024-05-01 is not allowed: must be a "
                      'string (YAML reads 2024-05-01 as a date: write it quoted, "2024-05-01")',
                      overrides=["study=2024-05-01"])  # fmt: skip
    assert "datetime" not in message
    message = refused(minimal(), "config key 'profiling.nsys_ranks': value 0 is not allowed: one "
                      'of "all", "0" (YAML reads 0 as a number: write it quoted, "0")',
                      overrides=["profiling.nsys_ranks=0"])  # fmt: skip
    assert message.count("profiling.nsys_ranks") == 1, message


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            {"train": {"epochs": "3"}},
            "'train.epochs': value \"3\" is not allowed: must be an integer",
        ),
        ({"train": {"lr": "0.1"}}, "'train.lr': value \"0.1\" is not allowed: must be a number"),
        ({"checkpointing": {"enabled": "true"}}, "'checkpointing.enabled': value \"true\" is not"),
        # a choice of words and booleans, and null: the hint was given for numbers and booleans
        ({"train": {"compile": "false"}}, "'train.compile': value \"false\" is not allowed: one"),
        ({"train": {"target_acc": "null"}}, "'train.target_acc': value \"null\" is not allowed"),
    ],
)
def test_a_value_given_as_text_says_where_text_comes_from(override, says):
    """snakemake --config 'train={epochs: 3}' gives epochs "3" (YAML's BaseLoader): the error
    said only 'must be an integer' of a value the user wrote as an integer."""
    refused(minimal(), says, "(it is text: quoted in a YAML file, or nested in snakemake --config",
            "write it unquoted in a --configfile)", overrides=override)  # fmt: skip


def test_a_worker_count_no_node_has_cores_for_is_refused():
    refused(minimal(), "config key 'train.num_workers': value 100000 is not allowed: must be <= 64",
            overrides=["train.num_workers=100000"])  # fmt: skip
    load_and_validate(minimal(), overrides=["train.num_workers=64"])


def test_text_that_is_no_value_of_the_type_gets_no_text_hint():
    message = refused(minimal(), "'train.epochs'", overrides={"train": {"epochs": "three"}})
    assert "it is text" not in message
    # "1" is no choice of train.compile (auto, true, false), though 1 == True in Python
    message = refused(minimal(), "'train.compile'", overrides={"train": {"compile": "1"}})
    assert "it is text" not in message
    # YAML reads nan unquoted as text too: the hints told to write it unquoted ("write nan")
    message = refused(minimal(), "'train.lr': value \"nan\" is not allowed: must be a number",
                      overrides={"train": {"lr": "nan"}})  # fmt: skip
    assert "(it is text" not in message and "YAML reads" not in message


@pytest.mark.parametrize("key", ["data_dir", "checkpointing.dir", "container.image", "study"])
def test_blank_paths_and_names_are_refused(key):
    """A blank value passed the schema's minLength: prepare_data made a directory named " ",
    then every training job failed (--data-dir must not be empty) and was retried."""
    refused(
        minimal(),
        f"config key '{key}': value \" \" is not allowed: must not be blank",
        overrides=[f'{key}=" "'],
    )


@pytest.mark.parametrize("key", ["study", "proposal.title", "proposal.pi", "proposal.machine"])
def test_a_title_or_name_over_several_lines_is_refused(key):
    """A YAML block scalar (`pi: |` with an empty line) kept its blank line, which reached
    \\title{} or \\author{} as a paragraph break: proposal.pdf, slides.pdf (or paper.pdf, the
    study's name) failed in latexmk after every run, and proposal.md's heading kept the first
    line only. The objectives, a paragraph, may hold lines."""
    parent, _, name = key.rpartition(".")
    many = ("Scaling\n\non the GPU partition", "Jane Doe\r\nUniversity X", "a\tb\x0c", "a\u2029b")
    for text in many:
        overrides = {parent: {name: text}} if parent else {name: text}
        refused(
            minimal(),
            f"config key '{key}': value {studyconfig._fmt(text)} is not allowed: must be one "
            "line of text, no line break, tab or other control character (it is a title or a "
            "name in the documents)",
            overrides=overrides,
        )
    # spaces alone name nothing ("" is the proposal keys' unset)
    overrides = {parent: {name: "   "}} if parent else {name: "   "}
    refused(
        minimal(),
        f"config key '{key}': value \"   \" is not allowed: must hold some text, not spaces "
        "alone (it is a title or a name in the documents)",
        overrides=overrides,
    )
    # a name in another script, a non-breaking space (Zs, not a line's end) are one line
    assert load_and_validate(minimal(), overrides={"proposal": {"pi": "Jörg\u00a0Müller 李"}})
    # a one-line block scalar (`study: >` and one line) ends in a line break, harmless there
    assert yaml.safe_load("study: >\n  CPU scaling of ResNet-18\n") == {
        "study": "CPU scaling of ResNet-18\n"
    }
    assert load_and_validate(minimal(), overrides={"study": "CPU scaling of ResNet-18\n"})
    objectives = "Scale ResNet-18 training.\n\nThen write it up.\n"
    assert load_and_validate(minimal(), overrides={"proposal": {"objectives": objectives}})


@pytest.mark.parametrize("key", studyconfig.PATH_KEYS)
def test_a_path_over_several_lines_or_with_a_tab_is_refused(key):
    """`data_dir: "res\\nults/data"` passed (Snakemake only warned that the data's path
    "contains line break"), `"results/data\\t"` made a second data directory that lists as
    the first, while a title with a line break was refused (line_problems): a path of PATH_KEYS
    holding a control character (Cc), a line or paragraph separator is refused the same way."""
    parent, _, name = key.rpartition(".")
    for text in ("res\nults/data", "results/data\t", "results/data\n", "a\rb", "a\u2028b"):
        overrides = {parent: {name: text}} if parent else {name: text}
        refused(
            minimal(),
            f"config key '{key}': value {studyconfig._fmt(text)} is not allowed: no line break, "
            "tab or other control character in a path; write it on one line, e.g. results/data",
            overrides=overrides,
        )
    # other scripts and a non-breaking space (Zs) are one line
    text = "données\u00a02024/数据"
    overrides = {parent: {name: text}} if parent else {name: text}
    assert load_and_validate(minimal(), overrides=overrides)


def test_a_missing_container_definition_is_refused_naming_the_key(tmp_path, monkeypatch):
    """container.definition naming no file (container.enabled) was Snakemake's multi-line
    MissingInputException from build_container. It is refused in one line, the file looked up
    as the rule's input is (paths.repo_file): relative to the repository the workflow runs
    from (common.smk's REPO, validate's repo), an absolute path as it is; container off, the
    definition is no input and not looked up."""
    on = ["container.enabled=true", "container.definition=containers/nonexistent.def"]
    refused(
        minimal(),
        "config key 'container.definition': value \"containers/nonexistent.def\" is not allowed: "
        f"no such file ({ROOT / 'containers' / 'nonexistent.def'}): an Apptainer definition "
        "file, relative to the repository (e.g. containers/trainer.def) or absolute; or "
        "container.enabled: false",
        overrides=on,
    )
    assert load_and_validate(minimal(), overrides=on[1:])  # no container: no input
    refused(minimal(), "config key 'container.definition': value \"containers\" is not allowed: "
            f"a directory ({ROOT / 'containers'})", overrides=[on[0], "container."
            "definition=containers"])  # a directory, not "no such file"  # fmt: skip
    mine = tmp_path / "mine.def"
    refused(minimal(), f"no such file ({mine})", overrides=[on[0], f"container.definition={mine}"])
    mine.write_text("Bootstrap: docker\nFrom: ubuntu:24.04\n")
    assert load_and_validate(minimal(), overrides=[on[0], f"container.definition={mine}"])
    # the repository's, not the working directory's: the default containers/trainer.def
    monkeypatch.chdir(tmp_path)
    assert load_and_validate(minimal(), overrides=on[:1])
    # the repository the workflow names (repo=REPO) is the one looked in
    config = load_and_validate(minimal())
    config["container"]["enabled"] = True
    with pytest.raises(StudyConfigError, match=re.escape(f"({tmp_path / 'containers'}")):
        validate(copy.deepcopy(config), repo=tmp_path)
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / "trainer.def").write_text("Bootstrap: docker\n")
    assert validate(copy.deepcopy(config), repo=tmp_path)


@pytest.mark.parametrize(("key", "most"), [("top_k", 500), ("launch_count", 100)])
def test_the_ncu_kernel_and_launch_counts_have_a_maximum(key, most):
    """profiling.ncu.top_k 200000 over config/config.yaml planned profile_ncu jobs of two years
    (each kernel a whole run under ncu, each launch ~40 replays): the schema bounds both."""
    refused(minimal(), f"config key 'profiling.ncu.{key}': value {most + 1} is not allowed: "
            f"must be <= {most}", overrides=[f"profiling.ncu.{key}={most + 1}"])  # fmt: skip
    assert load_and_validate(minimal(), overrides=[f"profiling.ncu.{key}={most}"])


@pytest.mark.parametrize(("key", "most"), [("proposal.production.runs", 10000), ("train.lr", 1000)])
def test_the_production_runs_and_the_learning_rate_have_a_maximum(key, most):
    """proposal.production.runs 10^9 passed every check, and the proposal job, after the whole
    study trained, built a run-table row per run (hours, terabytes); train.lr 1e308 scaled to
    an infinite peak, and every training job failed on its first loss. The schema bounds both."""
    refused(minimal(), f"config key '{key}': value {most + 1} is not allowed: must be <= {most}",
            overrides=[f"{key}={most + 1}"])  # fmt: skip
    assert load_and_validate(minimal(), overrides=[f"{key}={most}"])


@pytest.mark.parametrize("key", ["data_dir", "checkpointing.dir"])
def test_a_path_apptainer_cannot_bind_is_refused_when_the_container_is_on(key):
    """jobs/launch.py binds a data or checkpoint directory outside the working directory into
    the image (absolute, or relative and leaving it), and refused every launch of one with ':'
    or ',' (Apptainer's --bind field separators)."""
    for value in ("/scratch/st,data", "/scratch/a:b", "../shared/st,data"):
        on = [f"{key}={value}", "container.enabled=true"]
        refused(minimal(), f"config key '{key}'", "Apptainer's --bind", overrides=on)
        load_and_validate(minimal(), overrides=on[:1])  # no container: nothing is bound
    load_and_validate(minimal(), overrides=[f"{key}=st,data", "container.enabled=true"])


def test_the_bucket_family_needs_two_ranks():
    """One rank synchronises nothing: a 1-rank bucket family reported a 2.2x "bucket effect"
    with 0 % exposed communication, which was noise."""
    refused(minimal(bucket={"enabled": True, "gpus": 1}), "config key 'families.bucket.gpus'",
            "at least 2: one rank synchronises no gradients")  # fmt: skip
    load_and_validate(minimal(bucket={"enabled": True, "gpus": 2}))


def test_the_bucket_family_needs_ddp():
    cfg = minimal(bucket={"enabled": True, "gpus": 4})
    cfg["train"] = {"strategy": "fsdp"}
    refused(cfg, "config key 'families.bucket.enabled'", "differ in name only")


@pytest.mark.parametrize(
    ("value", "text"), [(25, "25"), (0.5, "0.5"), (1e6, "1000000"), (1.0000001, "1.0000001")]
)
def test_run_ids_keep_every_digit_of_the_bucket_size_and_no_exponent(value, text):
    """`:g` wrote 1e+06 (outside the workflow's run wildcard) and 1.0000001 as 1 (two runs, one
    id)."""
    assert runs.run_id(8, 64, "bf16", "ddp", value, 0) == f"w8_lb64_bf16_ddp_bk{text}_r0"


def test_non_finite_numbers_are_refused_before_any_job():
    """YAML's .nan passes every bound of the schema (a comparison with NaN is never true) and
    .inf every minimum: both are refused, naming the key, before the run table is built (once:
    where the schema's bound refuses it, in the bound's words)."""
    message = refused(
        minimal(),
        "config key 'train.lr': value NaN is not allowed: a finite number",
        "config key 'train.bucket_cap_mb': value Infinity is not allowed: must be <= 1000000",
        "config key 'families.bucket.bucket_cap_mb[1]': value -Infinity",
        overrides=["train.lr=.nan", "train.bucket_cap_mb=.inf", "families.bucket.gpus=[2]",
                   "families.bucket.bucket_cap_mb=[1, -.inf]"],
    )  # fmt: skip
    assert "Traceback" not in message and message.count("'train.bucket_cap_mb'") == 1


def test_a_non_finite_value_of_a_key_that_is_no_number_is_one_line():
    """`--config study=nan` (Snakemake reads nan as a float): "value NaN is not allowed: a
    finite number", as if a number were wanted, then "must be a string" for the same key. One
    line per key, the schema's; a number's NaN still gets the finite-number line."""
    config = minimal()
    config |= {"study": math.nan, "repeats": math.inf, "plan": {"eval_speedup": math.nan}}
    with pytest.raises(StudyConfigError) as info:
        load_and_validate(config)
    lines = info.value.problems
    for key in ("study", "repeats", "plan.eval_speedup"):
        said = [line for line in lines if line.startswith(f"config key '{key}':")]
        assert len(said) == 1, lines
    assert "finite" not in next(line for line in lines if "'study'" in line), lines
    assert any("'plan.eval_speedup'" in line and "a finite number" in line for line in lines)


def test_integers_past_64_bits_are_refused_before_any_job():
    """A 401-digit plan.eval_speedup, plan.throughput_img_s_per_gpu or profiling.ncu.top_k
    passed the schema (no maximum) and was the plan's OverflowError traceback (int too large
    to convert to float): an integer past 64 bits is refused wherever it stands."""
    big = 10**400
    message = refused(
        minimal(),
        "config key 'plan.eval_speedup': value 1000000000000000000000000000000000000000000000000",
        "not allowed: at most 9223372036854775807 (64 bits)",
        "config key 'profiling.ncu.top_k'",
        overrides=[f"plan.eval_speedup={big}", f"profiling.ncu.top_k={big}"],
    )
    assert "Traceback" not in message and "Overflow" not in message
    assert load_and_validate(minimal(), overrides=["train.seed=4611686018427387903"])


def test_config_files_are_layered_in_the_order_given_as_snakemake_layers_them():
    """load_layers dropped config/config.yaml wherever it stood in the list: with it given
    after the demo, `scalestudy matrix` saw the demo (6 runs) and snakemake the paper study
    (75). Snakemake merges every --configfile in order, then all of them over the Snakefile's
    configfile (snakemake.utils.update_config, its own merge); only a leading config/config.yaml
    is the base again, which changes nothing."""
    from snakemake.utils import update_config

    def snakemakes(*paths):
        given: dict = {}
        for path in paths:
            update_config(given, yaml.safe_load(path.read_text()))
        config = yaml.safe_load(FULL.read_text())
        update_config(config, given)
        return validate(config)

    for layers in ([DEMO, FULL], [FULL, DEMO], [FULL, FULL, DEMO], [DEMO, FULL, DEMO]):
        assert studyconfig.load_layers(layers) == snakemakes(*layers), layers
    assert len(runs.build_run_table(studyconfig.load_layers([DEMO, FULL]))) == 75
    assert len(runs.build_run_table(studyconfig.load_layers([FULL, DEMO]))) == 6
    with pytest.raises(StudyConfigError) as info:  # the base read once where it leads
        studyconfig.load_layers([FULL, DEMO], overrides=["repeats=0"])
    assert f"invalid study config {FULL} + {DEMO} + --set repeats=0: " in str(info.value)


def test_an_override_of_set_is_named_after_the_files():
    """`scalestudy matrix --set dataset=cifar100` said "invalid study config
    .../config/config.yaml: ...", a file that holds a good value."""
    for overrides in (["dataset=cifar100", "repeats=2"], {"dataset": "cifar100", "repeats": 2}):
        with pytest.raises(StudyConfigError) as info:
            studyconfig.load_layers([DEMO], overrides=overrides)
        said = f"invalid study config {FULL} + {DEMO} + --set dataset=cifar100 repeats=2: "
        assert str(info.value).startswith(said), str(info.value)


def test_the_config_overrides_are_found_by_comparing_with_the_files():
    """Snakemake's --config overrides, which no public API holds, are the values of the
    config it built (snakemake.utils.update_config, its own merge) that its files do not give:
    a changed value, a new key, a changed type; not an override equal to the file's value."""
    from snakemake.utils import update_config

    layers = studyconfig.check_files([FULL, DEMO])
    overrides = {
        "dataset": "cifar100",  # a bad value
        "train": {"epochs": 9, "width": layers[1]["train"]["width"]},  # one changed, one not
        "repeats": layers[1]["repeats"],  # the demo's own value: changes nothing
        "profiling": {"enabled": 1},  # 1, not True
        "extra": {"a": [1, 2]},  # a key no file has
    }
    config = copy.deepcopy(layers[0])
    for layer in (layers[1], overrides):
        update_config(config, copy.deepcopy(layer))
    assert layers[1]["profiling"]["enabled"] is True
    # as --config takes them: "train.epochs=9", as named once, Snakemake refuses ("Config
    # entry must start with a valid identifier")
    assert studyconfig.config_overrides(config, layers) == [
        "dataset=cifar100",
        """'train={"epochs": 9}'""",
        """'profiling={"enabled": 1}'""",
        """'extra={"a": [1, 2]}'""",
    ]
    # a key with a dot in it stays one key (it was nested by its dotted name, or a TypeError)
    dotted = {**copy.deepcopy(layers[0]), "x": {"a": 2, "a.b": 3}}
    assert studyconfig.config_overrides(dotted, layers[:1]) == ["""'x={"a": 2, "a.b": 3}'"""]
    assert studyconfig.config_overrides(studyconfig.load_yaml(FULL), layers[:1]) == []
    assert studyconfig.layers_source(["a.yaml"], ["k=v"]) == "a.yaml + --config k=v"
    assert studyconfig.layers_source([], []) is None


def test_a_config_built_without_config_yaml_under_it_is_refused():
    """--replace-workflow-config drops config/config.yaml from Snakemake's layers, while the
    report's reproduce command and the CLI merge the files over it: another study. Known by its
    effect (a key of config/config.yaml missing); where the files give every key again the
    two builds are one study and it passes."""
    base = yaml.safe_load(FULL.read_text())
    merged = yaml.safe_load(FULL.read_text())
    merged["train"].update(epochs=3, extra_key=1)
    studyconfig.check_layered(merged, FULL)  # merged over it: every key there
    replaced = copy.deepcopy(base)
    del replaced["train"]["pg_timeout_s"]
    with pytest.raises(StudyConfigError) as info:
        studyconfig.check_layered(replaced, FULL)
    message = str(info.value)
    assert f"config key 'train.pg_timeout_s' of {FULL} is missing from the study's" in message
    assert "drop --replace-workflow-config" in message and "\n" not in message
    replaced["profiling"] = None  # a mapping set to null by a file: the schema's to refuse
    replaced["train"]["pg_timeout_s"] = 60
    studyconfig.check_layered(replaced, FULL)


def test_a_config_that_is_not_utf8_names_the_byte_and_the_fix(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("study: café\n".encode("latin-1"))
    refused(path, str(path), "byte 10 is not UTF-8 text", "save the file as UTF-8")


def test_a_study_of_more_runs_than_the_limit_is_refused_before_any_row_is_built(monkeypatch):
    """repeats: 1000000000 (a typo) was built row by row: Snakemake ran out of memory while it
    parsed the workflow. Now the runs are counted first and the key is named."""
    for path in (FULL, DEMO, ROOT / "config" / "cpu-scaling.yaml"):
        layers = [DEMO, path] if path.name == "cpu-scaling.yaml" else [path]
        cfg = studyconfig.load_layers(layers)
        assert runs.run_count(cfg) == len(runs.build_run_table(cfg)) > 0, path
    cfg = minimal(
        strong={"enabled": True, "gpus": [1, 2, 4]},
        precision={"enabled": True, "gpus": [1, 4], "precisions": ["fp32", "bf16"]},
    )  # 7 requests; strong's fp32 run at 4 GPUs (local batch 256) is precision's too: 6 runs
    cfg["hardware"]["device"] = "cuda"
    cfg["repeats"] = 2
    rows = runs.build_run_table(validated := load_and_validate(cfg))
    assert len(rows) == runs.run_count(validated) == 12
    built = []
    monkeypatch.setattr(studyconfig, "build_run_table", lambda c: built.append(c) or [])
    cfg["repeats"] = 10**9
    refused(
        cfg,
        "config key 'repeats': value 1000000000 is not allowed: the study would have "
        "6,000,000,000 training runs (one Slurm job each; 6 configurations x 1,000,000,000 "
        "repeats), at most 10,000",
    )
    assert built == []
    cfg["repeats"] = studyconfig.MAX_RUNS // 6  # at the limit: built and checked as before
    load_and_validate(cfg)
    assert len(built) == 1


def test_a_sweep_of_too_many_runs_is_counted_only_to_the_limit_and_named(monkeypatch):
    """A bucket sweep of 2,000 x 2,000 values was counted whole (every request built, 0.8 GB
    and 3 s; 3,000 x 3,000: 1.8 GB and 10 s, at every Snakemake invocation) and refused as
    `repeats: 1`, which was no cause. Now counting stops past MAX_RUNS and the family is named."""
    built = []
    real = runs._requests

    def counted(config):
        for request in real(config):
            built.append(request)
            yield request

    monkeypatch.setattr(runs, "_requests", counted)
    n = 2000
    sweep = list(range(1, n + 1))
    cfg = minimal(bucket={"enabled": True, "bucket_cap_mb": sweep, "local_batch": sweep})
    message = refused(
        cfg,
        "config key 'families.bucket': its sweeps (2,000 bucket_cap_mb x 2,000 local_batch) "
        "request 4,000,000 configurations, each a training run (one Slurm job), and a study has "
        "at most 10,000: fewer sweep values",
    )
    assert "repeats" not in message
    # counted to the limit, twice (the check, then the refusal's own count), never 4,000,000
    assert len(built) <= 2 * (studyconfig.MAX_RUNS + 1), len(built)
    # no family too many alone, the families together: each named, none blamed
    sweep = list(range(1, 81))
    cfg = minimal(
        bucket={"enabled": True, "bucket_cap_mb": sweep, "local_batch": sweep},
        weak={"enabled": True, "gpus": list(range(1, 4001)), "local_batch": 8},
    )
    cfg["hardware"]["gpus_per_node"] = 4000
    refused(
        cfg,
        "config key 'families': the families request more than 10,000 configurations together "
        "(weak 4,000, bucket 6,400), each a training run",
    )


def test_a_dataset_larger_than_a_ranks_memory_is_refused_before_any_job():
    """Every rank loads data.pt whole: synthetic.num_train 10**7 (31 GB) against the demo's
    1,500 MB per rank was a study whose every training job Slurm would kill for memory, and
    prepare-data, which holds the set in memory too, a traceback where it could not."""
    cfg = minimal()
    cfg["dataset"], cfg["synthetic"] = "synthetic", {"num_train": 10**7}
    cfg["hardware"]["mem_mb_per_rank"] = 1500
    refused(
        cfg,
        "config key 'hardware.mem_mb_per_rank': value 1500 is not allowed: at least the "
        "synthetic set that every rank loads whole: 10,010,000 images x 3,080 bytes = "
        "29,403 MB, and torch and the model on top; raise it; or fewer images "
        "(synthetic.num_train 10,000,000, num_test 10,000)",
    )
    cfg["hardware"]["mem_mb_per_rank"] = 29403  # the set fits (nothing else would)
    load_and_validate(cfg)
    cfg["dataset"], cfg["hardware"]["mem_mb_per_rank"] = "cifar10", 100  # 60,000 x 3,080 bytes
    message = refused(cfg, "the cifar10 set that every rank loads whole: 60,000 images", "177 MB")
    assert "synthetic.num_train" not in message
    cfg["hardware"]["mem_mb_per_rank"] = 177
    load_and_validate(cfg)
    assert vocab.DATASETS["mnist"].image_bytes == 28 * 28 + 8


def test_a_mapping_given_to_set_is_merged_as_snakemake_merges_config():
    """`--set 'families.strong={gpus: [1, 2]}'` replaced the demo's strong mapping: its
    `enabled: true` and global_batch 32 went back to the schema's defaults, so `scalestudy
    matrix` and `plan` showed a study without the strong family (and `--set 'train={width:
    16}'` one of 30-epoch runs at local batch 256), where Snakemake's --config, which `--set`
    follows, merges a mapping into the files' (snakemake.utils.update_config)."""
    from snakemake.utils import update_config

    for key, value in (
        ("families.strong", {"gpus": [2, 4]}),  # the demo's strong target, 4, still above 2
        ("families", {"strong": {"gpus": [2, 4]}}),
        ("train", {"width": 16}),
    ):
        cfg = studyconfig.load_layers([DEMO], overrides=[f"{key}={value}"])
        expected = yaml.safe_load(FULL.read_text())
        update_config(expected, yaml.safe_load(DEMO.read_text()))
        nested = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        update_config(expected, nested)
        assert cfg == validate(expected), key
    cfg = studyconfig.load_layers([DEMO], overrides=["families.strong={gpus: [2, 4]}"])
    assert cfg["families"]["strong"] == {"enabled": True, "gpus": [2, 4], "global_batch": 32}
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["width"] == 8
    # a mapping over a value that is none replaces it, as Snakemake's merge does
    cfg = load_and_validate(minimal(), overrides=["train=null", "train={epochs: 2}"])
    assert cfg["train"]["epochs"] == 2


def test_config_overrides_a_jobs_shell_would_change_are_named_one_line_each():
    typed_as_is = ["dataset=synthetic", "study=demo $(date) `id` $HOME", "study=O'Brien"]
    assert studyconfig.overrides_a_shell_changes(typed_as_is) == []
    changed = [
        "study=O'Brien $(date)",  # double-quoted by repr(): the shell runs $(...)
        "study=it's `id`",
        "study=O'Brien \\",
        'proposal={pi: "O\'Brien"}',  # ' and ": repr escapes \', which the shell keeps
        "study=a\tb",  # repr writes \t
        "study=a\\b",  # repr doubles it; single quotes keep both
        "'study=x'",  # passed on as it is: the shell removes the quotes
    ]
    problems = studyconfig.overrides_a_shell_changes(changed)
    assert len(problems) == len(changed)
    for arg, line in zip(changed, problems, strict=True):
        # shell-quoted, as typed again (Python's repr gave 'O\\'Brien', which bash cannot parse)
        said = f"--config {shlex.quote(arg)} would reach the jobs Snakemake starts changed"
        assert line.startswith(said), line
        assert shlex.split(line.split(" would reach")[0])[1] == arg
        assert "\n" not in line and line.endswith("in a YAML file with --configfile instead")
    assert "' beside $, ` or \\" in problems[0] and "' beside $" in problems[2]
    assert "both ' and \"" in problems[3] and "control character" in problems[4]
    assert "backslash" in problems[5] and "starts with a quote" in problems[6]


def test_an_override_that_is_no_utf8_or_a_value_that_holds_itself_is_one_line(tmp_path):
    """A --set value with a byte the locale could not decode (a lone surrogate: $'caf\\xe9')
    passed the schema as a string and was a UnicodeEncodeError traceback when plan.md was
    written; a YAML alias inside its own anchor (`&a [*a]`) a RecursionError in the check of
    non-finite numbers."""
    refused(minimal(), "override", "not UTF-8", overrides=["study=caf\udce9"])
    message = refused(
        minimal(), "config key 'study[0]'", "holds itself", overrides=["study=&a [*a]"]
    )
    assert "Recursion" not in message
    path = tmp_path / "loop.yaml"
    path.write_text("study: loop\nfamilies: &f {strong: {enabled: true, gpus: [1]}, x: *f}\n")
    with pytest.raises(StudyConfigError, match=r"config key 'families.x': .*holds itself"):
        load_and_validate(path)


def test_a_precision_the_gpu_type_has_no_units_for_is_refused():
    """hardware.py records that a V100 or a T4 has no TF32 and no BF16 units, yet a study of
    gpu_type v100 with a tf32 run was accepted: its numbers would be plain fp32 under the
    tf32 label. A gpu_type of a family of the table allows only the precisions it has; a
    gpu_type the table does not know (b200, "") is not judged."""
    cfg = minimal(precision={"enabled": True, "gpus": [1], "precisions": ["fp32", "tf32", "fp16"]})
    cfg["hardware"] |= {"device": "cuda", "gpu_type": "v100"}
    message = refused(cfg, "config key 'families.precision.precisions[1]'", 'value "tf32"',
                      "hardware.gpu_type v100", "fp32, fp16")  # fmt: skip
    assert "precisions[2]" not in message and "precisions[0]" not in message
    cfg["train"] = {"precision": "bf16"}
    refused(cfg, "config key 'train.precision'", 'value "bf16"')
    for gpu_type in ("a100", "b200", ""):
        cfg["hardware"]["gpu_type"] = gpu_type
        load_and_validate(cfg)
