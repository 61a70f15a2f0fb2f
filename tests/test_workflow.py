"""The DAG guarantees, each read from Snakemake's own dry-run of a copy of the repository.

One real run of a tiny CPU study (synthetic data, 4 runs, Apptainer replaced by the stand-in in
tests/stand-ins so the image is a real DAG node), then one dry-run per change a user makes.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from workflow_helpers import (
    BIN,
    REPO,
    RUN_IDS,
    TINY,
    copy_repo,
    env,
    planned_jobs,
    snakemake,
    write_config,
)

from scalestudy.nsight.schema import NCU_COLUMNS
from scalestudy.results.build_pdf import have_beamer, have_latexmk
from scalestudy.results.collect import REQUIRED_METRICS
from scalestudy.study.runs import RUN_COLUMNS

pytestmark = pytest.mark.workflow

# what follows new runs.csv rows: analysis, the scaling model, the tiny study's 8 figures, the
# documents, the PDF
PDF = {"paper_pdf": 1} if have_latexmk() else {}
REPORT = {"render_report": 1, **PDF}
# the proposal (tests/test_proposal.py): its documents, PDFs where TeX builds them
SLIDES = {"slides_pdf": 1} if have_beamer() else {}
PROPOSAL = {"proposal": 1, **({"proposal_pdf": 1} if have_latexmk() else {}), **SLIDES}
DOWNSTREAM = {"analyze": 1, "model": 1, "plot": 8, **REPORT, **PROPOSAL}
# every PDF the study builds (none without TeX)
PDFS = {**PDF, **{k: v for k, v in PROPOSAL.items() if k.endswith("_pdf")}}


@pytest.fixture(scope="module")
def done(tiny_study):
    return tiny_study


@contextlib.contextmanager
def appended(path: Path, text: str):
    """`path` with `text` appended for the duration of the block, then as it was."""
    original = path.read_text()
    try:
        path.write_text(original + text)
        yield
    finally:
        path.write_text(original)


def dry(work, *args, **kw):
    return planned_jobs(
        snakemake(work, "--configfile", "tiny.yaml", "-n", *args, stand_ins=True, **kw)
    )


def test_study_produces_the_tidy_csvs(done):
    with (done / "results/csv/runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert {r["run"] for r in runs} == RUN_IDS
    columns = set(runs[0])
    assert set(RUN_COLUMNS) <= columns
    assert {k for k in REQUIRED_METRICS if k != "device"} <= columns
    assert {"device_type", "device_name"} <= columns
    shared = next(r for r in runs if r["run"] == "w2_lb32_fp32_ddp_bk25_r0")
    assert shared["families"] == "bucket;strong;weak"  # requested thrice, run once
    assert all(float(r["throughput_img_s"]) > 0 for r in runs)
    # the image digest of the (stand-in) container is recorded for every run
    assert all(r["container_digest"].startswith("sha256:") for r in runs)
    with (done / "results/csv/epochs.csv").open() as f:
        epochs = list(csv.DictReader(f))
    assert len(epochs) == len(RUN_IDS)  # one epoch each
    assert (done / "logs/train/w2_lb32_fp32_ddp_bk1_r0.log").exists()
    assert (done / "benchmarks/train/w2_lb32_fp32_ddp_bk1_r0.tsv").exists()


def test_every_training_job_records_its_system_inventory(done):
    with (done / "results/csv/runs.csv").open() as f:
        runs = {r["run"]: r for r in csv.DictReader(f)}
    for run, row in runs.items():
        inventory = json.loads((done / "results/system" / f"{run}.json").read_text())
        # the allocation the ranks ran in: same host, same image, same torch
        assert inventory["hostname"] in row["hostnames"].split(";"), run
        assert inventory["container_digest"] == row["container_digest"], run
        assert inventory["torch"] == row["torch_version"], run
        assert inventory["gpus"] and inventory["cpu"], run


def test_second_run_has_nothing_to_do(done):
    assert dry(done) == {}


def test_touching_without_changing_reruns_nothing(done):
    (done / "src/scalestudy/trainer/train.py").touch()
    assert dry(done) == {}


@pytest.mark.parametrize(
    "path, expected",
    [
        ("src/scalestudy/results/collect.py", {"collect": 1, **DOWNSTREAM}),
        # collect checks a run's measurements with analyze's rules (run_row_problem)
        ("src/scalestudy/results/analyze.py", {"collect": 1, **DOWNSTREAM}),
        # the proposal too: its slides show the efficiency figure (an input of the rule)
        ("src/scalestudy/results/plot.py", {"plot": 8, **REPORT, **PROPOSAL}),
        ("src/scalestudy/results/render_report.py", {**REPORT, **PROPOSAL}),
        ("workflow/report/paper.tex.j2", REPORT),
        # imported, not run by name: the planner prices the analysis's resources table (and
        # collect imports the analysis); the run table's module is read by the matrix, the
        # collection and the analysis
        ("src/scalestudy/study/estimate.py", {"collect": 1, **DOWNSTREAM}),
        ("src/scalestudy/study/runs.py", {"matrix": 1, "collect": 1, **DOWNSTREAM}),
        # the `scalestudy matrix` preview, which no rule runs (the matrix rule writes runs.tsv
        # with study/runs.py): it reran matrix and, through runs.tsv, collect and all after it
        ("src/scalestudy/study/matrix.py", {}),
        ("src/scalestudy/results/build_pdf.py", PDFS),
    ],
)
def test_editing_aggregation_plotting_or_report_code_reruns_only_those_rules(done, path, expected):
    with appended(done / path, "\n"):
        assert dry(done) == ({"all": 1, **expected} if expected else {})


def test_adding_a_gpu_count_adds_only_that_run(done, tmp_path):
    bigger = yaml.safe_load(yaml.safe_dump(TINY))
    bigger["families"]["strong"]["gpus"] = [1, 2, 4]  # 4 = 2 nodes x 2
    write_config(done / "bigger.yaml", bigger)
    jobs = planned_jobs(snakemake(done, "--configfile", "bigger.yaml", "-n", stand_ins=True))
    assert jobs == {"all": 1, "collect": 1, "matrix": 1, "train": 1, **DOWNSTREAM}


def test_adding_a_bucket_value_adds_only_those_runs(done):
    bigger = yaml.safe_load(yaml.safe_dump(TINY))
    bigger["families"]["bucket"]["bucket_cap_mb"] = [1, 5, 25]
    write_config(done / "bigger.yaml", bigger)
    jobs = planned_jobs(snakemake(done, "--configfile", "bigger.yaml", "-n", stand_ins=True))
    assert jobs == {"all": 1, "collect": 1, "matrix": 1, "train": 1, **DOWNSTREAM}


@pytest.mark.parametrize(
    "path, rebuild",
    [
        # every run trains again; the image, the environment without the code (the checkout's
        # src/ is bound in when a rank runs), is not rebuilt
        ("src/scalestudy/trainer/train.py", {}),
        # the recipe rebuilds the image; an edit to the package (the exec prefix, a log
        # message) does not: the build command's shape is the rule's param
        ("src/scalestudy/jobs/container_exec.py", {}),
        ("src/scalestudy/log.py", {}),
        # the recipe's checks and the build: no training job runs them (it runs only
        # container_exec.py), so neither the image nor a run is made again
        ("src/scalestudy/jobs/container.py", None),
        ("containers/trainer.def", {"build_container": 1}),
    ],
)
def test_changing_the_trainer_or_the_image_retrains_and_rebuilds_only_for_the_image(
    done, path, rebuild
):
    with appended(done / path, "\n# a change\n"):
        jobs = dry(done)
    if path.endswith("log.py"):  # every stage's code: matrix and prepare_data rerun too
        assert "build_container" not in jobs and jobs["train"] == 4
    elif rebuild is None:
        assert jobs == {}
    else:
        assert jobs == {"all": 1, **rebuild, "collect": 1, "train": 4, **DOWNSTREAM}


def test_upgrading_torch_in_the_venv_retrains_the_runs_outside_the_container(done, tmp_path):
    """README "What reruns": torch, torchvision, triton and the CUDA libraries of the venv are
    a param of every launch (resources.software_stack), so `pip install -U torch` retrains the
    runs that train in the venv (with the container the image is the software, and the venv's
    torch is no param: test_resources.py). The upgrade is a stand-in distribution's metadata
    first on PYTHONPATH (torch 99.0.0), where importlib.metadata, as pip, finds it."""
    work = tmp_path / "study"
    shutil.copytree(done, work, symlinks=True)  # mtimes and Snakemake's records kept
    upgrade = tmp_path / "upgraded-site"
    (upgrade / "torch-99.0.0.dist-info").mkdir(parents=True)
    (upgrade / "torch-99.0.0.dist-info/METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 99.0.0\n"
    )
    upgraded = {"PYTHONPATH": str(upgrade)}
    # the same runs trained in the venv (their params recorded by --touch, as a training job's)
    write_config(work / "tiny.yaml", {**TINY, "container": {"enabled": False}})
    snakemake(work, "--configfile", "tiny.yaml", "--touch", "--until", "train", "--cores", "1",
              stand_ins=True)  # fmt: skip
    assert "train" not in dry(work)
    jobs = dry(work, extra_env=upgraded)
    assert jobs["train"] == 4 and "prepare_data" not in jobs


def test_touching_the_finished_runs_keeps_them_after_a_trainer_change(done, tmp_path):
    """README "What reruns": a new trainer retrains every finished run once, unless the user,
    knowing the change cannot move a number, marks them current with `--touch --until train`:
    then nothing follows (the touched files' contents are those the later rules read), and a run
    that never finished still trains."""
    work = tmp_path / "study"
    shutil.copytree(done, work, symlinks=True)  # mtimes and Snakemake's records kept
    with (work / "src/scalestudy/trainer/train.py").open("a") as f:
        f.write("\n# a change\n")
    assert dry(work)["train"] == 4
    # one run never finished (no metrics.json), so nothing after training ran either
    (work / "results/runs" / min(RUN_IDS) / "metrics.json").unlink()
    shutil.rmtree(work / "results/csv")
    snakemake(work, "--configfile", "tiny.yaml", "--touch", "--until", "train", "--cores", "1",
              stand_ins=True)  # fmt: skip
    assert dry(work) == {"all": 1, "train": 1, "collect": 1, **DOWNSTREAM}
    assert not (work / "results/runs" / min(RUN_IDS) / "metrics.json").exists()


def test_a_parser_edit_or_touching_as_the_readme_says_keeps_the_profiles(done, tmp_path):
    """README's `--touch --until train` left a profiled study's captures to run again after a
    trainer edit (their jobs have the trainer as input): GPU jobs that measure nothing new. A
    parser edit reran the captures too (their code input was every parser), and the ncu jobs
    (their code input was the ncu parser and the classifier, and an edit to one of them reran
    the parse at once and Nsight Compute, a whole run per kernel, on the next snakemake): only
    the parses rerun now, ncu's among them. And the README's touch named
    profile_parse to --until: Snakemake starts nothing after such a rule, so a GPU study's
    Nsight Compute steps, which follow the parse, were left unmarked and ncu ran again. The GPU
    study is the same runs on CUDA, its captures those made here (touched), its Nsight Compute
    files as a GPU node leaves them where ncu was skipped; a Nsight Compute job planned on this
    machine, which has no CUDA, would fail the snakemake."""
    work = tmp_path / "study"
    shutil.copytree(done, work, symlinks=True)  # mtimes and Snakemake's records kept
    profiled = yaml.safe_load(yaml.safe_dump(TINY))
    profiled["profiling"] = {"enabled": True, "gpus": [1], "precisions": ["fp32"],
                             "tool": "torch", "start_step": 2, "steps": 2}  # fmt: skip
    write_config(work / "tiny.yaml", profiled)
    snakemake(work, "--configfile", "tiny.yaml", "--cores", "2", stand_ins=True)
    assert dry(work) == {}
    with (work / "src/scalestudy/nsight/nsys.py").open("a") as f:
        f.write("\n# a parser change\n")
    planned = dry(work)
    assert planned.get("profile_parse") == 1, planned
    assert not {"profile_capture", "profile_ncu", "train"} & set(planned), planned
    snakemake(work, "--configfile", "tiny.yaml", "--cores", "2", stand_ins=True)
    with (work / "src/scalestudy/trainer/train.py").open("a") as f:
        f.write("\n# a change\n")
    readme = (REPO / "README.md").read_text()
    touch = re.search(r"`snakemake (--touch [^`]+)`", readme).group(1).split()
    assert "--keep-going" in touch  # a GPU study's unfinished profile stopped it (ncu waits)
    snakemake(work, "--configfile", "tiny.yaml", *touch, "--cores", "1", stand_ins=True)
    assert dry(work) == {}

    gpu = {**profiled, "hardware": {**profiled["hardware"], "device": "cuda"}}
    write_config(work / "gpu.yaml", gpu)

    def on_gpu(*args: str) -> dict[str, int]:  # the targets first: --configfile takes the rest
        proc = snakemake(work, *args, "--cores", "2", "--configfile", "gpu.yaml", stand_ins=True)
        return planned_jobs(proc)

    on_gpu(*touch)  # the runs and captures made here, as a GPU node's
    # what the GPU node's Nsight Compute steps left where ncu was skipped, in their order
    (capture,) = (work / "results/profile").glob("*/capture")
    profile = capture.parent
    (profile / "ncu_kernels.json").write_text("[]\n")
    (profile / "ncu").mkdir()
    skipped = {"tool": "none", "why": "auto: `ncu` not on PATH", "not_launched": []}
    (profile / "ncu/tool.json").write_text(json.dumps(skipped))
    (profile / "ncu.csv").write_text(",".join(NCU_COLUMNS) + "\n")
    ncu_table = "results/csv/profile_ncu.csv"
    assert on_gpu(ncu_table) == {"profile_collect_ncu": 1}
    # the README's touch after a trainer edit marks the Nsight Compute steps current too
    with (work / "src/scalestudy/trainer/train.py").open("a") as f:
        f.write("\n# another change\n")
    on_gpu(*touch)
    assert on_gpu(ncu_table, "-n") == {}
    with (work / "src/scalestudy/nsight/classify.py").open("a") as f:
        f.write("\n# a classifier change\n")
    ran = on_gpu(ncu_table)
    # ncu's parse too, in this snakemake: Snakemake checks nothing below the ncu job, whose one
    # file from a rerun job is ancient, and left it to the next
    assert {"profile_parse", "profile_ncu_kernels", "profile_ncu_parse"} <= set(ran), ran
    assert not {"profile_capture", "profile_ncu", "train"} & set(ran), ran
    assert on_gpu(ncu_table, "-n") == {}


def test_touch_marks_a_gpu_study_current_on_a_machine_that_could_not_run_it(done, tmp_path):
    """`snakemake --touch --until train` (README "What reruns") starts no job, but the local
    executor's onstart judged the runs with an output missing as if it would launch them: on a
    login node (no GPU, no Slurm allocation) a GPU study with one unfinished run was refused
    ("this machine has no CUDA device ... run the CPU demo"), and the documented remedy with it."""
    work = tmp_path / "study"
    shutil.copytree(done, work, symlinks=True)  # mtimes and Snakemake's records kept
    gpu = yaml.safe_load(yaml.safe_dump(TINY))
    # the study as a cluster runs it: GPUs, one per node, so its 2-rank runs span two nodes,
    # which no local run outside a Slurm allocation starts, whatever GPUs this machine has
    gpu["hardware"].update(device="cuda", gpus_per_node=1)
    write_config(work / "gpu.yaml", gpu)
    with (work / "src/scalestudy/trainer/train.py").open("a") as f:
        f.write("\n# a change\n")
    unfinished = work / "results/runs/w2_lb32_fp32_ddp_bk25_r0/metrics.json"  # a 2-node run
    unfinished.unlink()
    args = ("--configfile", "gpu.yaml")
    proc = snakemake(work, *args, "--touch", "--until", "train", "--cores", "1", check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "scalestudy:" not in proc.stdout + proc.stderr
    # the finished runs are current, the unfinished one still trains (nothing was made up)
    assert planned_jobs(snakemake(work, *args, "-n", stand_ins=True))["train"] == 1
    assert not unfinished.exists()


def test_a_finished_run_without_its_job_benchmark_is_not_trained_again(done, tmp_path):
    """The proposal calibrates from the training jobs' benchmarks where they exist (as `scalestudy
    plan` does); it took every run's as an input, so where the proposal was to be rebuilt (a
    setting changed, reports/ not copied), a finished run whose benchmarks/train file was
    deleted (or never copied with its results) was trained again first, its metrics.json
    replaced. Now only the proposal reruns, and once: its calibration's inputs changed."""
    tsv = done / "benchmarks/train" / f"{min(RUN_IDS)}.tsv"
    aside = tmp_path / tsv.name
    tsv.rename(aside)  # mtime kept: the study is as it was once it is back
    try:
        rebuilt = dry(done, "--forcerun", "proposal")
        plain = dry(done)
    finally:
        aside.rename(tsv)
    assert rebuilt == {"all": 1, **PROPOSAL}, rebuilt
    assert plain == {"all": 1, **PROPOSAL}, plain


def test_changing_a_profile_setting_reruns_nothing(done):
    settings = "latency-wait: 7\nset-resources:\n  train:\n    runtime: 99\n    mem_mb: 1234\n"
    with appended(done / "profiles/default/config.yaml", settings):
        assert dry(done) == {}
        assert dry(done, "--profile", "profiles/slurm") == {}


def launch_flags(proc: subprocess.CompletedProcess) -> list[list[str]]:
    """The trainer flags of each `scalestudy launch` a `snakemake -n -p` printed (after `--`, up
    to the log's `>`), one per planned training job."""
    launches = [ln for ln in proc.stdout.splitlines() if "scalestudy launch " in ln]
    assert len(launches) == planned_jobs(proc)["train"] > 0
    argvs = [shlex.split(line.split("scalestudy launch ", 1)[1]) for line in launches]
    return [argv[argv.index("--") + 1 : argv.index(">")] for argv in argvs]


@pytest.mark.parametrize("change", [{"dir": "results/ckpt2"}, {"enabled": False}])
def test_changing_where_or_whether_runs_checkpoint_reruns_nothing(done, change):
    """The checkpoint directory was a param of the training rule, a rerun trigger: moving it
    (to scratch) or turning checkpoints off reran the whole study (config.yaml: "changing these
    reruns nothing")."""
    changed = yaml.safe_load(yaml.safe_dump(TINY))
    changed["checkpointing"] = {**changed.get("checkpointing", {}), **change}
    write_config(done / "ckpt.yaml", changed)
    proc = snakemake(done, "--configfile", "ckpt.yaml", "-n", "-p", stand_ins=True)
    assert planned_jobs(proc) == {}


def test_changing_a_setting_the_runs_cannot_use_retrains_nothing(done):
    """train.num_workers with the device loader, compile and cuda_graphs auto -> false on CPU:
    each was a flag of every run, a param, so a change the training cannot see reran every
    finished run (README "What reruns"). The run table holds the value in effect now."""
    changed = yaml.safe_load(yaml.safe_dump(TINY))
    changed["train"] |= {"num_workers": 3, "compile": False, "cuda_graphs": False}
    write_config(done / "unused.yaml", changed)
    proc = snakemake(done, "--configfile", "unused.yaml", "-n", stand_ins=True)
    assert "train" not in planned_jobs(proc), proc.stdout[:4000]


def test_raising_the_process_group_timeout_reruns_nothing_and_reaches_the_trainer(done):
    """train.pg_timeout_s was a run flag, a param of the launch rules: raising it after a hung
    collective timed out reran every finished run ("Params have changed"), though it does not
    define a run (TrainConfig.NOT_IDENTITY). Now a resource, as checkpointing's flags."""
    from scalestudy.jobs import launch

    changed = yaml.safe_load(yaml.safe_dump(TINY))
    changed["train"]["pg_timeout_s"] = 1800
    write_config(done / "timeout.yaml", changed)
    assert TINY["train"]["pg_timeout_s"] != 1800
    proc = snakemake(done, "--configfile", "timeout.yaml", "-n", stand_ins=True)
    assert planned_jobs(proc) == {}, proc.stdout[:4000]
    proc = snakemake(
        done, "--configfile", "timeout.yaml", "-n", "-p", "--forcerun", "train", stand_ins=True
    )
    for flags in launch_flags(proc):
        assert flags.count("--pg-timeout-s") == 1, flags
        # what `scalestudy launch` checks first, as the trainer reads the flags
        cfg = launch.check_train_args(flags)
        assert cfg.pg_timeout_s == 1800
        # the study's synthetic sizes, which the trainer holds the prepared set to (a data.pt
        # prepared by hand with others was trained on as it was): resources too, no rerun
        sizes = TINY["synthetic"]
        assert (cfg.expect_train, cfg.expect_test) == (sizes["num_train"], sizes["num_test"])


def test_a_study_without_checkpointing_starts_its_training(done):
    """With `checkpointing.enabled: false` the train rule passed `--checkpoint-dir=` and its
    every/keep settings all the same, and the trainer's check (`--checkpoint-every 1 needs
    --checkpoint-dir`) refused every training job before a rank started."""
    from scalestudy.jobs import launch

    changed = yaml.safe_load(yaml.safe_dump(TINY))
    changed["checkpointing"] = {**changed.get("checkpointing", {}), "enabled": False}
    write_config(done / "nockpt.yaml", changed)
    proc = snakemake(
        done, "--configfile", "nockpt.yaml", "-n", "-p", "--forcerun", "train", stand_ins=True
    )
    for flags in launch_flags(proc):
        assert "--checkpoint-dir=" in flags  # the rule's: checkpointing off
        launch.check_train_args(flags)  # what `scalestudy launch` runs first: no refusal


def test_changing_a_run_flag_reruns_that_run_only(done):
    changed = yaml.safe_load(yaml.safe_dump(TINY))
    changed["families"]["bucket"]["bucket_cap_mb"] = [2, 25]  # bk1 -> bk2: a new run id
    write_config(done / "changed.yaml", changed)
    jobs = planned_jobs(snakemake(done, "--configfile", "changed.yaml", "-n", stand_ins=True))
    assert jobs == {"all": 1, "collect": 1, "matrix": 1, "train": 1, **DOWNSTREAM}


def one_line_refusal(proc) -> str:
    """The config's problems as the project words them: no traceback, no schema dump
    (Snakemake's own schema validation printed both before the project's checks ran)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "invalid study config config/config.yaml + " in out, out[-3000:]
    for noise in ("Traceback", "Failed validating", "ValidationError", 'File "'):
        assert noise not in out, out[-3000:]
    return out


@pytest.mark.parametrize(
    "override, message",
    [
        ("dataset=imagenet", "'dataset': value \"imagenet\" is not allowed: one of"),
        ("repeats=0", "'repeats': value 0 is not allowed: must be >= 1"),
    ],
)
def test_bad_config_fails_before_any_job(done, tmp_path, override, message):
    proc = snakemake(
        done, "--configfile", "tiny.yaml", "--config", override, "-n", stand_ins=True, check=False
    )
    assert message in one_line_refusal(proc)


@pytest.mark.parametrize(
    "args, source",
    [  # the bad value in an override; then in the file, the override equal to the file's value
        (["--config", "dataset=imagenet"], "config/config.yaml + --config dataset=imagenet"),
        (
            [
                "--configfile",
                "tiny.yaml",
                "--config",
                "dataset=imagenet",
                "train={precision: bf16}",
            ],
            "config/config.yaml + {work}/tiny.yaml + --config dataset=imagenet "
            """'train={{"precision": "bf16"}}'""",  # as --config takes it, not train.precision=bf16
        ),
        (
            ["--configfile", "bad.yaml", "--config", "repeats=1"],
            "config/config.yaml + {work}/bad.yaml",
        ),
    ],
)
def test_a_bad_override_is_named_not_blamed_on_a_file(tmp_path, args, source):
    """`snakemake --config dataset=imagenet` was "invalid study config config/config.yaml:
    ...", a file that holds a good value. The --config values the files do not give are named
    after the files (found by comparing with the files: no public API holds them)."""
    work = copy_repo(tmp_path / "repo")
    write_config(work / "tiny.yaml", TINY)
    write_config(work / "bad.yaml", {**TINY, "dataset": "imagenet"})
    proc = snakemake(work, *args, "-n", check=False)
    out = one_line_refusal(proc)
    said = f"invalid study config {source.format(work=work)}: config key 'dataset': "
    assert said in out, out[-3000:]


def test_a_strong_target_no_strong_run_measures_fails_before_any_job(tmp_path):
    """report.targets.strong_efficiency_gpus 8 over the demo's strong family of 1, 2 and 4
    ranks: `snakemake -n` planned the study, every run would train, and only the report said
    "not measured" (no strong run at 8)."""
    work = copy_repo(tmp_path / "repo")
    write_config(work / "target.yaml", {"report": {"targets": {"strong_efficiency_gpus": 8}}})
    proc = snakemake(work, "--configfile", "config/demo.yaml", "target.yaml", "-n", check=False)
    out = one_line_refusal(proc)
    said = "'report.targets.strong_efficiency_gpus': value 8 is not allowed: one of 2, 4, the "
    assert said in out, out[-3000:]
    assert not (work / "results").exists()  # no job ran


def test_gpu_count_that_does_not_fit_the_nodes_is_refused(done):
    bad = yaml.safe_load(yaml.safe_dump(TINY))
    bad["hardware"]["gpus_per_node"] = 3
    bad["families"]["strong"]["gpus"] = [1, 2, 4]  # 4 ranks: neither <= 3 nor whole nodes of 3
    write_config(done / "bad.yaml", bad)
    proc = snakemake(done, "--configfile", "bad.yaml", "-n", check=False)
    out = one_line_refusal(proc)
    assert "families.strong.gpus[2]" in out and "does not fit gpus_per_node" in out


def test_unknown_key_is_refused(done):
    bad = yaml.safe_load(yaml.safe_dump(TINY))
    bad["train"]["bucket_cap"] = 25  # typo of bucket_cap_mb
    write_config(done / "bad.yaml", bad)
    proc = snakemake(done, "--configfile", "bad.yaml", "-n", check=False)
    assert "'train.bucket_cap': unknown key" in one_line_refusal(proc)
    assert "did you mean 'bucket_cap_mb'?" in proc.stdout + proc.stderr


def test_gpu_study_on_a_machine_without_cuda_stops_at_once(tmp_path):
    work = copy_repo(tmp_path / "gpu")
    proc = snakemake(
        work, "--cores", "1", "--config", "dataset=synthetic", check=False, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config/demo.yaml" in out and "--profile profiles/slurm" in out
    assert not (work / "results" / "runs").exists()  # no job ran
    # ... but the node-hour plan for the proposal needs no GPU: it was refused the same way
    proc = snakemake(work, "--cores", "1", "plan", "--config", "dataset=synthetic", timeout=300)
    assert (work / "reports" / "plan.md").is_file() and not (work / "results" / "runs").exists()
    shutil.rmtree(work)


def test_a_multi_node_study_run_locally_outside_slurm_stops_at_once(tmp_path, monkeypatch):
    """The local executor cannot start a run wider than one node: each such run failed in its
    job ("there is no Slurm allocation here"), three times with its retries."""
    work = copy_repo(tmp_path / "wide")
    wide = yaml.safe_load(yaml.safe_dump(TINY))
    wide["families"]["strong"]["gpus"] = [1, 4]  # 4 ranks: 2 nodes of hardware.gpus_per_node 2
    wide["report"]["targets"]["strong_efficiency_gpus"] = 4  # TINY's 2 is no run of these
    write_config(work / "wide.yaml", wide)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    proc = snakemake(work, "--configfile", "wide.yaml", "--cores", "1", check=False,
                     stand_ins=True, timeout=300)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "need more than one node (e.g. w4_" in out and "profiles/slurm" in out, out[-2000:]
    assert not (work / "results" / "runs").exists()  # no job ran
    shutil.rmtree(work)


def test_the_local_checks_judge_only_the_runs_the_targets_start(done, tmp_path):
    """onstart's refusals of what no local job can do judged the whole study: a finished GPU
    study re-analysed on a machine without CUDA (no launch job at all) was refused, and so was
    a target of one 1-rank run because another run spans two nodes. The same refusals stand
    where a run that needs them is to start."""
    work = tmp_path / "study"
    shutil.copytree(done, work, symlinks=True)  # mtimes and Snakemake's records kept
    # the finished study as a GPU study (measured on another machine's GPUs: the runs' flags
    # as recorded there, so mtimes only), its analysis redone here, where no GPU is seen
    gpu = yaml.safe_load(yaml.safe_dump(TINY))
    gpu["hardware"]["device"] = "cuda"
    write_config(work / "gpu.yaml", gpu)
    scaling = work / "results/csv/scaling.csv"
    scaling.unlink()
    args = ("--configfile", "gpu.yaml", "--rerun-triggers", "mtime", "--cores", "1")
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    snakemake(work, "results/csv/scaling.csv", *args, stand_ins=True, extra_env=no_gpu,
              timeout=300)  # fmt: skip
    assert scaling.is_file()
    # ... but not where a run is to train
    run = min(RUN_IDS)  # one rank
    metrics = work / "results/runs" / run / "metrics.json"
    metrics.unlink()
    target = str(metrics.relative_to(work))
    proc = snakemake(work, target, *args, stand_ins=True, extra_env=no_gpu, check=False,
                     timeout=300)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "has no CUDA device" in out, out[-2000:]
    assert not metrics.exists()  # no job ran
    # a CPU study one of whose runs spans two nodes: that 1-rank run alone trains here ...
    wide = yaml.safe_load(yaml.safe_dump(TINY))
    wide["families"]["strong"]["gpus"] = [1, 2, 4]  # 4 ranks: 2 nodes of gpus_per_node 2
    write_config(work / "wide.yaml", wide)
    snakemake(work, target, "--configfile", "wide.yaml", "--cores", "1", stand_ins=True,
              timeout=300)  # fmt: skip
    assert metrics.is_file()
    # ... and the study, whose 2-node run is to start, is refused before any job
    proc = snakemake(work, "--configfile", "wide.yaml", "--cores", "1", stand_ins=True,
                     check=False, timeout=300)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "1 run(s) need more than one node (e.g. w4_" in out, out[-2000:]
    assert not list(work.glob("results/runs/w4_*")) and not list(work.glob("logs/train/w4_*"))
    shutil.rmtree(work)


def test_the_dataset_image_and_profile_targets_are_judged_by_the_runs_they_start(
    tmp_path, monkeypatch
):
    """onstart judged every run for a target that is no run's file: the dataset, the container
    image and the merged profile CSVs were refused because of a 2-node run none of them starts
    (and, in a GPU study, on a machine without CUDA). The dataset and the image need no run, the
    profile CSVs the profiled runs only; another target still judges every run."""
    work = copy_repo(tmp_path / "targets")
    wide = yaml.safe_load(yaml.safe_dump(TINY))
    wide["families"]["strong"]["gpus"] = [1, 2, 4]  # 4 ranks: 2 nodes of gpus_per_node 2
    wide["profiling"] = {"enabled": True, "gpus": [1], "precisions": ["fp32"], "tool": "torch",
                         "start_step": 2, "steps": 2}  # fmt: skip
    write_config(work / "wide.yaml", wide)
    gpu = yaml.safe_load(yaml.safe_dump(wide))
    gpu["hardware"]["device"] = "cuda"
    write_config(work / "gpu.yaml", gpu)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}

    def run(config, target):
        return snakemake(work, target, "--configfile", config, "--cores", "2", stand_ins=True,
                         extra_env=no_gpu, check=False, timeout=300)  # fmt: skip

    data = "results/data/synthetic/data.pt"
    for config, target in (("gpu.yaml", data), ("wide.yaml", "containers/trainer.sif"),
                           ("wide.yaml", "results/csv/profile_kernels.csv")):  # fmt: skip
        proc = run(config, target)
        assert proc.returncode == 0, (target, (proc.stdout + proc.stderr)[-3000:])
        assert (work / target).is_file()
    profiled = {p.name for p in (work / "results/profile").iterdir()}
    assert profiled == {"w1_lb32_fp32_ddp_bk25_r0"}  # the profiled run only
    assert not (work / "results/runs").exists()  # no training job ran
    # a target that needs every run (collect) is still refused before any job
    proc = run("wide.yaml", "results/csv/runs.csv")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "1 run(s) need more than one node (e.g. w4_" in out, out[-2000:]
    assert not (work / "results/runs").exists()
    shutil.rmtree(work)


def test_a_study_name_with_braces_is_text_not_a_wildcard(done):
    """`study: "resnet18 {v2}"` passed the config's checks, then Snakemake stopped with a
    WildcardError in analyze's params that named no config key."""
    jobs = dry(done, "--config", "study=tiny {v2}")
    assert jobs["analyze"] == 1 and jobs["plot"] == 8, jobs


def test_a_local_cpu_study_runs_one_timed_job_at_a_time(tmp_path):
    """Each training and profiling job of a local CPU study takes every core (--cores 3 here):
    two 1-rank runs of the demo side by side, with a profiling job beside them, slowed the
    baseline's epochs from 5.4 to 10.3 s and gave E_s 106% and a weak deviation of -52%."""
    work = copy_repo(tmp_path / "cpu")
    write_config(work / "tiny.yaml", TINY)
    proc = snakemake(work, "--configfile", "tiny.yaml", "-n", "--cores", "3", stand_ins=True)
    jobs = re.findall(r"^rule (train|profile_capture):\n(.*?)\n\n", proc.stdout, re.S | re.M)
    threads = [re.search(r"threads: (\d+)", body) for _, body in jobs]
    assert len(jobs) >= 4 and all(t and t[1] == "3" for t in threads), proc.stdout[-3000:]


def test_the_analyze_rule_declares_the_tables_analyze_writes(tmp_path):
    """The workflow's list of analyze's tables (ANALYSIS_TABLES, and the analyze rule's outputs
    typed out one by one) was kept in step with analyze.py's by hand: a table added to analyze
    and not to them was written untracked (no rule made it again, render-report and the
    proposal read a stale one), and one named in them only was a MissingOutputException. Now
    they are analyze.TABLE_NAMES, the tables its run() writes: the dry-run's analyze job has
    their CSV and HTML files as outputs, and nothing else."""
    from scalestudy.results.analyze import TABLE_NAMES

    work = copy_repo(tmp_path / "tables")
    write_config(work / "tiny.yaml", TINY)
    proc = snakemake(work, "--configfile", "tiny.yaml", "-n", "results/csv/scaling.csv",
                     stand_ins=True)  # fmt: skip
    job = re.search(r"^rule analyze:\n(.*?)\n\n", proc.stdout, re.S | re.M)
    assert job, proc.stdout[-3000:]
    outputs = re.search(r"^\s+output: (.*)$", job[1], re.M)[1].split(", ")
    assert sorted(outputs) == sorted(
        f"results/{d}/{name}.{ext}"
        for name in TABLE_NAMES
        for d, ext in (("csv", "csv"), ("tables", "html"))
    )


def test_dry_run_of_the_full_study_plans_every_run(tmp_path):
    work = copy_repo(tmp_path / "full")
    jobs = planned_jobs(snakemake(work, "-n", timeout=300))
    assert jobs["train"] == 75 and jobs["prepare_data"] == 1 and jobs["collect"] == 1


def test_a_target_of_a_run_the_study_does_not_have_is_no_traceback(tmp_path):
    """A well-formed run id that is not the study's (the paper study's, asked for under the
    demo, as collect's fix named it once a preview had replaced the demo's run table) matched
    {run} and reached get_run: a KeyError traceback. Now {run} is the study's ids only, and
    Snakemake says it has no rule for the file; the study's own run still plans its training."""
    from scalestudy.study.config import load_layers
    from scalestudy.study.runs import build_run_table

    demo = {r["run"] for r in build_run_table(load_layers([REPO / "config/demo.yaml"]))}
    paper = {r["run"] for r in build_run_table(load_layers([REPO / "config/config.yaml"]))}
    foreign, own = sorted(paper - demo)[0], sorted(demo)[0]
    work = copy_repo(tmp_path / "wf")
    target = f"results/runs/{foreign}/metrics.json"
    proc = snakemake(work, target, "-n", "--configfile=config/demo.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "KeyError" not in text and "Traceback" not in text, text[-3000:]
    assert f"No rule to produce {target}" in text, text[-3000:]
    proc = snakemake(
        work, f"results/runs/{own}/metrics.json", "-n", "--configfile=config/demo.yaml"
    )
    assert planned_jobs(proc)["train"] == 1


def test_the_cli_and_the_reproduce_command_see_the_study_snakemake_runs(tmp_path):
    """`scalestudy matrix --config config/demo.yaml --config config/config.yaml` dropped
    config/config.yaml (the demo's 6 runs) where snakemake with the same --configfile list
    plans the paper study's 75; and under --replace-workflow-config, which drops
    config/config.yaml from Snakemake's layers, the report's reproduce command named another
    study than the one that ran. Now the CLI layers as Snakemake does, and the flag is refused
    where it changes the study."""
    from scalestudy.cli import main
    from scalestudy.study.runs import read_runs_tsv

    work = copy_repo(tmp_path / "wf")
    files = ["config/demo.yaml", "config/config.yaml"]
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", *files, timeout=300))
    table = tmp_path / "runs.tsv"
    # the checkout's files: the package's config/config.yaml is the checkout's, not the copy's
    argv = ["matrix", "--config", str(REPO / files[0]), "--config", str(REPO / files[1])]
    assert main([*argv, "--out", str(table)]) == 0
    assert jobs["train"] == len(read_runs_tsv(table)) == 75
    demo = yaml.safe_load((work / files[0]).read_text())
    part = {k: demo[k] for k in ("study", "hardware", "train", "families")}
    write_config(work / "part.yaml", part)
    proc = snakemake(
        work, "-n", "--replace-workflow-config", "--configfile", "part.yaml", check=False
    )
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "replace-workflow" in ln]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(said) == 1 and said[0].startswith("invalid study config: config key "), said
    assert "drop --replace-workflow-config" in said[0]
    # every key given again (config/config.yaml first): one study with or without the flag
    again = ["--configfile", "config/config.yaml", "config/demo.yaml"]
    replaced = snakemake(work, "-n", "--replace-workflow-config", *again, timeout=300)
    assert planned_jobs(replaced) == planned_jobs(snakemake(work, "-n", *again, timeout=300))


# --- where things are: the repository's files from the workflow, the study's in the working dir


def one_run_study(path: Path) -> Path:
    """The tiny study cut to one run (strong scaling, 1 rank), with the container stand-in."""
    one = yaml.safe_load(yaml.safe_dump(TINY))
    one["study"] = "elsewhere"
    one["families"]["strong"]["gpus"] = [1]
    for family in ("weak", "precision", "bucket"):
        one["families"][family]["enabled"] = False
    return write_config(path, one)


def test_the_study_runs_in_another_directory(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    study = tmp_path / "elsewhere" / "study"
    study.mkdir(parents=True)
    config = one_run_study(study / "one.yaml")
    # from the repository root, outputs in --directory; a relative --configfile is relative to
    # where snakemake starts, so the study's file is named by its path from here
    args = ("--directory", str(study), "--configfile", os.path.relpath(config, repo))
    jobs = planned_jobs(snakemake(repo, *args, "-n", stand_ins=True))
    assert jobs["train"] == 1 and jobs["build_container"] == 1 and jobs["render_report"] == 1
    snakemake(repo, *args, "--cores", "2", stand_ins=True, timeout=600)
    with (study / "results/csv/runs.csv").open() as f:
        assert [r["run"] for r in csv.DictReader(f)] == ["w1_lb64_fp32_ddp_bk25_r0"]
    assert (study / "reports/study.md").is_file() and (study / "containers/trainer.sif").is_file()
    assert (study / "logs/train/w1_lb64_fp32_ddp_bk25_r0.log").is_file()
    assert not any((repo / d).exists() for d in ("results", "reports", "logs", ".snakemake"))
    # the reproduce commands (run from the repository root) name the study file outside it
    assert f"--configfile {config}" in (study / "reports/study.md").read_text()
    # from the study directory with -s the same paths: nothing to do (and the default profile
    # is found beside the Snakefile: workflow/profiles)
    proc = snakemake(
        study,
        "-s",
        str(repo / "workflow/Snakefile"),
        "--configfile",
        "one.yaml",
        "-n",
        stand_ins=True,
    )
    assert planned_jobs(proc) == {}
    assert "workflow/profiles/default" in proc.stderr


def test_another_directory_without_a_study_is_refused_in_one_line(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    study = tmp_path / "study"
    study.mkdir()
    proc = snakemake(repo, "--directory", str(study), "-n", check=False)
    assert proc.returncode == 1
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    refusal = [line for line in said if "--configfile" in line]
    assert len(refusal) == 1 and "not the repository" in refusal[0]
    assert str(repo / "config/demo.yaml") in refusal[0]
    assert "Traceback" not in proc.stderr and "Node-hour plan" not in proc.stderr
    assert not (study / "results").exists()


def python_without_the_package(tmp_path: Path) -> Path:
    """A Python that sees this venv's packages but not the scalestudy install: a new venv whose
    .pth file adds this venv's site-packages to sys.path. Python reads .pth files only in site
    directories, not in directories a .pth adds, so the editable install's
    __editable__.scalestudy-*.pth is never read."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "this-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_a_clean_clone_lints_and_without_the_package_says_the_fix(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    shutil.copytree(REPO / "scripts", repo / "scripts")
    python = python_without_the_package(tmp_path)
    bin_dir = tmp_path / "bin"  # `snakemake` of this venv, run by that Python
    bin_dir.mkdir()
    (bin_dir / "snakemake").write_text(f'#!/bin/sh\nexec {python} {BIN / "snakemake"} "$@"\n')
    (bin_dir / "snakemake").chmod(0o755)
    clean = env(PATH=os.pathsep.join([str(bin_dir), str(BIN), os.environ["PATH"]]))
    clean.pop("PYTHONPATH", None)
    probe = subprocess.run([python, "-c", "import scalestudy"], env=clean, capture_output=True)
    assert probe.returncode != 0  # the package is really out of reach
    run = dict(cwd=repo, env=clean, capture_output=True, text=True, timeout=300)
    # the profile names the logger only where Snakemake finds it: the workflow's own line speaks
    proc = subprocess.run(["snakemake", "-n", "--configfile", "config/demo.yaml"], **run)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "invalid choice" not in out and "usage:" not in out
    assert [ln for ln in out.splitlines() if "bash scripts/setup.sh" in ln] == [
        "scalestudy: cannot import the scalestudy package (No module named 'scalestudy'): run "
        "`bash scripts/setup.sh` (or `pip install -e .` in this repository), then snakemake "
        "from that environment"
    ]
    # lint.sh lints the clone with the clone's package (src/ on PYTHONPATH), logger included
    proc = subprocess.run(["bash", "scripts/lint.sh"], **run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "lint: clean" in proc.stdout


def test_a_config_file_that_is_not_clean_yaml_names_its_file_and_line(tmp_path):
    """A key given twice in a --configfile was dropped silently (its first block lost), and a
    tab in config/config.yaml gave Snakemake's "Config file is not valid JSON or YAML"."""
    work = copy_repo(tmp_path / "wf")
    (work / "dup.yaml").write_text("train:\n  width: 16\nrepeats: 1\ntrain:\n  epochs: 5\n")
    proc = snakemake(work, "--configfile", "config/demo.yaml", "dup.yaml", "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert "dup.yaml, line 4, column 1: malformed YAML: duplicate key 'train'" in out, out[-3000:]
    default = work / "config/config.yaml"
    lines = default.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  epochs:"))
    lines[at] = "\t" + lines[at].lstrip()
    default.write_text("\n".join(lines) + "\n")
    proc = snakemake(work, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"config.yaml, line {at + 1}, column 1: malformed YAML" in out, out[-3000:]


def zero_throughput(runs_csv: Path) -> str:
    """The demo's real runs.csv with its first run's throughput_img_s 0 (the plan divides by it)."""
    with (REPO / "tests/fixtures/demo_runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["throughput_img_s_per_rank"]) > 0  # a run that calibrates
    rows[0]["throughput_img_s"] = "0"
    with runs_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows[0]["run"]


@pytest.mark.parametrize(
    "measured, args",
    [
        (zero_throughput, ("-n",)),  # the dry-run
        (lambda p: p.write_text("run,precision\nx,fp32\n"), ("plan", "--cores", "1")),  # old
    ],
    ids=["throughput-0-dry-run", "old-columns-plan"],
)
def test_measured_runs_the_plan_refuses_stop_the_workflow_in_one_line(tmp_path, measured, args):
    """A results/csv/runs.csv the plan refuses was Snakemake's InputFunctionException (a
    traceback, the wildcards of an unrelated run) on every dry-run and `snakemake plan`, raised
    where the train rule's runtime was evaluated; `scalestudy plan` said it in one line."""
    work = copy_repo(tmp_path / "wf")
    write_config(work / "tiny.yaml", TINY)
    (work / "results/csv").mkdir(parents=True)
    measured(work / "results/csv/runs.csv")
    proc = snakemake(work, *args, "--configfile", "tiny.yaml", stand_ins=True, check=False)
    out = proc.stdout + proc.stderr
    cli = subprocess.run(
        [str(BIN / "scalestudy"), "plan", "--config", "tiny.yaml"],
        cwd=work, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = cli.stderr.strip().splitlines()
    assert cli.returncode == 2 and len(said) == 1 and "results/csv/runs.csv" in said[0], said
    assert proc.returncode == 1, out[-3000:]
    assert [line for line in out.splitlines() if "runs.csv" in line] == said, out[-3000:]
    for noise in ("Traceback", "InputFunctionException", "Wildcards", "Node-hour plan"):
        assert noise not in out, out[-3000:]
    assert not (work / "reports/plan.md").exists() and not (work / "results/runs").exists()


def test_a_config_value_the_jobs_shell_would_change_is_refused_before_any_job(tmp_path):
    """Snakemake hands --config to the jobs it starts through a shell, in Python's quotes: the
    `plan` job (a run: job of the local executor; every job under Slurm) ran this value's
    $(...). In a config file the same value arrives as typed."""
    repo = copy_repo(tmp_path / "repo")
    value = f"study=O'Brien $(touch {tmp_path}/injected)"
    args = ["plan", "-c1", "--configfile", "config/demo.yaml"]
    proc = snakemake(repo, *args, "--config", value, check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    refusal = [line for line in said if line.startswith("--config ")]
    assert refusal == [
        f"--config {shlex.quote(value)} would reach the jobs Snakemake starts changed: it holds a "
        "' beside "
        "$, ` or \\, which their shell expands inside the double quotes Snakemake gives it. "
        "Give this key in a YAML file with --configfile instead"
    ], said
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "injected").exists() and not (repo / "reports/plan.md").exists()
    write_config(repo / "obrien.yaml", {"study": value.removeprefix("study=")})
    snakemake(repo, *args, "obrien.yaml")
    assert (repo / "reports/plan.md").exists() and not (tmp_path / "injected").exists()
