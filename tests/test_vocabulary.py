"""One vocabulary: the study schema, vocab.py and the trainer's flags name the same things.

The JSON schema (workflow/schemas/config.schema.yaml) must repeat its enums for users and
editors; this test keeps the repetition honest. Defaults may differ only where a difference is
intended, and each is listed here with its reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from scalestudy import vocab
from scalestudy.trainer.config import TrainConfig

SCHEMA = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml").read_text()
)
TRAIN = SCHEMA["properties"]["train"]["properties"]
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}

# schema default of train.<key> != `scalestudy train` default, on purpose: the paper study is
# not a one-off command line
INTENDED_DEFAULT_DIFFERENCES = {
    "epochs": "the paper study trains to convergence (30); a bare `train` is a quick 10",
    "warmup_epochs": "the study's global batches reach 8 x 256: a longer LR warm-up (2 vs 1)",
    "warmup_steps": "GPU runs need more steps before the window (cuDNN autotuning): 20 vs 5",
    "comm_probe_steps": "more probe steps per arm for a steadier median in the study: 10 vs 5",
}
# train.<key> of the schema that are no TrainConfig field (the run table adds them)
NOT_FLAGS = set()


def schema_enum(prop: dict) -> list | None:
    if "$ref" in prop:
        prop = SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[1]]
    return prop.get("enum")


@pytest.mark.parametrize(
    "key, names",
    [
        ("dataset", tuple(vocab.DATASETS)),
        ("model", vocab.MODELS),
        ("precision", vocab.PRECISIONS),
        ("strategy", vocab.STRATEGIES),
        ("comm_hook", vocab.COMM_HOOKS),
        ("loader", vocab.LOADERS),
        ("schedule", vocab.SCHEDULES),
    ],
)
def test_schema_enums_are_the_vocabulary_and_the_trainer_choices(key, names):
    prop = SCHEMA["properties"]["dataset"] if key == "dataset" else TRAIN[key]
    assert schema_enum(prop) == list(names)
    assert tuple(FIELDS[key].metadata["choices"]) == tuple(names)


def test_schema_devices_are_the_trainers_without_auto():
    """A study names its hardware; `auto` is for a bare command line only."""
    device = SCHEMA["properties"]["hardware"]["properties"]["device"]
    assert set(device["enum"]) == set(vocab.STUDY_DEVICES) == set(vocab.DEVICES) - {"auto"}


def test_families_are_the_vocabulary():
    assert tuple(SCHEMA["properties"]["families"]["properties"]) == vocab.FAMILIES


def test_synthetic_sizes_are_the_vocabulary():
    sizes = SCHEMA["properties"]["synthetic"]["properties"]
    synthetic = vocab.DATASETS["synthetic"]
    assert (sizes["num_train"]["default"], sizes["num_test"]["default"]) == (
        synthetic.train,
        synthetic.test,
    )


@pytest.mark.parametrize("key", sorted(TRAIN))
def test_train_defaults_agree_with_the_trainer(key):
    assert key in FIELDS or key in NOT_FLAGS, f"train.{key} is no `scalestudy train` flag"
    prop, flag_default = TRAIN[key], FIELDS[key].default
    described = {**SCHEMA["$defs"].get(prop.get("$ref", "").rsplit("/", 1)[-1], {}), **prop}
    assert "description" in described, f"train.{key} has no description"
    assert "default" in prop, f"train.{key} has no default"
    if key in INTENDED_DEFAULT_DIFFERENCES:
        assert prop["default"] != flag_default, f"train.{key}: no longer differs, drop the entry"
    else:
        assert prop["default"] == flag_default, (
            f"train.{key}: schema default {prop['default']!r}, `scalestudy train` default "
            f"{flag_default!r}; make them agree or list the difference with its reason"
        )


# train: keys that are no run column, and how they reach `scalestudy train` instead
NOT_COLUMNS = {"pg_timeout_s": "--pg-timeout-s, a resource of the launch rules (common.smk)"}


@pytest.mark.parametrize("key", sorted(TRAIN))
def test_every_train_key_reaches_the_trainer(key):
    """A train: key reaches the jobs only as a column of the run table (RUN_COLUMNS): one
    missing there validated, and every run trained at the trainer's own default."""
    from scalestudy.study import runs

    assert key in runs.RUN_COLUMNS or key in NOT_COLUMNS, (
        f"train.{key} is no column of study/runs.py RUN_COLUMNS: no run would get its value"
    )
    if key in NOT_COLUMNS:
        common = (Path(__file__).parents[1] / "workflow/rules/common.smk").read_text()
        assert f'config["train"]["{key}"]' in common, NOT_COLUMNS[key]
    elif key not in runs._NOT_PASSED:
        assert key in runs.TRAIN_FLAGS, f"train.{key}: a column, but no `scalestudy train` flag"


def test_every_schema_key_has_a_description_and_a_default():
    missing = []

    def walk(prop: dict, path: str) -> None:
        if "$ref" in prop:
            prop = {**SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[1]], **prop}
        if path and "description" not in prop:
            missing.append(f"{path}: description")
        if path and "default" not in prop:
            missing.append(f"{path}: default")
        for name, child in prop.get("properties", {}).items():
            walk(child, f"{path}.{name}" if path else name)

    walk(SCHEMA, "")
    assert not missing, missing


def test_figures_are_the_vocabulary_in_the_plotters_the_study_and_the_captions():
    """plot.FIGURES is what render-report's --figures accepts: a figure plot.py draws but the
    vocabulary lacks could not be shown, and one without a caption in a template failed the
    render with an error that blamed the CSVs."""
    import re

    from scalestudy.results import plot

    every = {name: {"enabled": True, "gpus": [1, 2]} for name in vocab.FAMILIES}
    assert tuple(plot.figures(every, "cuda", True)) == plot.FIGURES  # same order as the report
    report = Path(__file__).resolve().parents[1] / "workflow/report"
    for template in ("study.md.j2", "paper.tex.j2"):
        text = (report / template).read_text()
        block = text[text.index("set captions = {") : text.index("}", text.index("captions = {"))]
        assert sorted(re.findall(r'^\s*"(\w+)":', block, re.M)) == sorted(plot.FIGURES), template
    rst = (report / "figure.rst").read_text()  # snakemake --report's caption of each figure
    assert sorted(re.findall(r'if f == "(\w+)"', rst)) == sorted(plot.FIGURES)
    # defined where neither training nor data preparation looks: a figure added to
    # vocab.FIGURES reran prepare_data and every training and profiling job
    from scalestudy.study import resources

    root = Path(__file__).resolve().parents[1]
    training = resources.trainer_sources(root)
    training += resources.code_sources(root, "trainer/prepare_data.py")
    defined = Path(plot.__file__).resolve().relative_to(root).as_posix()
    assert defined == "src/scalestudy/results/plot.py" and defined not in training
    assert not hasattr(vocab, "FIGURES")


@pytest.mark.parametrize(
    "key, names", [("tool", vocab.PROFILERS), ("nsys_ranks", vocab.NSYS_RANKS)]
)
def test_the_profiling_enums_are_the_vocabulary(key, names):
    """profiling.tool and profiling.nsys_ranks reach `scalestudy profile capture` as --tool and
    --ranks, whose choices are these names (jobs/profile.py)."""
    assert schema_enum(SCHEMA["properties"]["profiling"]["properties"][key]) == list(names)


def test_every_trainer_flag_shows_its_default_in_help():
    """`scalestudy train --help` gave no default for its on/off flags (--static-graph,
    --pin-memory, ...): a comment said argparse adds "(default: True)" itself, which Python
    3.11.7's BooleanOptionalAction does not. Every flag's help names its default."""
    import argparse

    from scalestudy.trainer.config import add_arguments, flag_name

    helps = {}

    class Recording(argparse.ArgumentParser):
        def add_argument(self, flag, **kwargs):
            helps[flag] = kwargs.get("help", "")
            return super().add_argument(flag, **kwargs)

    add_arguments(Recording(add_help=False))
    missing = [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if "(default: " not in helps[f"--{flag_name(f.name)}"]
    ]
    assert missing == []
    assert helps["--static-graph"].endswith("(default: on)")
    assert helps["--sync-debug"].endswith("(default: off)")


def test_every_strategy_has_one_name_in_the_documents():
    """The documents name the runs' strategy by vocab.STRATEGY_NAMES (render_report's
    `strategy` filter): every strategy the trainer accepts, and only those."""
    assert tuple(vocab.STRATEGY_NAMES) == vocab.STRATEGIES
    assert len(set(vocab.STRATEGY_NAMES.values())) == len(vocab.STRATEGIES)


def test_the_other_copies_of_the_vocabulary_are_the_vocabulary():
    """Lists that repeat vocab.py outside the schema's enums: each fell out of step silently
    (a precision added to vocab and the precision enum was the plan's KeyError traceback at
    parse time; a dataset the proposal's; a family skipped analyze's one-configuration check)."""
    from scalestudy.results import analyze, proposal
    from scalestudy.study import runs

    plan = SCHEMA["properties"]["plan"]["properties"]
    assert tuple(plan["throughput_img_s_per_gpu"]["properties"]) == vocab.PRECISIONS
    assert set(proposal.DATA_TERMS) == set(vocab.DATASETS)
    profiling = SCHEMA["properties"]["profiling"]["properties"]
    assert profiling["nsys_trace"]["default"] == vocab.NSYS_TRACE
    assert tuple(analyze.FAMILY_VARIES) == vocab.FAMILIES
    switches = {k: [runs._SWITCH[v] for v in TRAIN[k]["enum"]] for k in ("compile", "cuda_graphs")}
    assert switches["compile"] == list(vocab.SWITCHES)
    assert switches["cuda_graphs"] == list(vocab.CUDA_GRAPHS)
