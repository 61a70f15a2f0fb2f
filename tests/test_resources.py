"""What the workflow's jobs ask for (scalestudy.study.resources): the Slurm request of a launch,
the training time limit from the plan (computed on first use, not at parse time), the code
inputs derived from the package's imports, and the local rules."""

from __future__ import annotations

import ast
import logging
import math
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import snakemake_logger_plugin_scalestudy as logger_plugin
from scalestudy.errors import PlanError
from scalestudy.study import plan, profiling, resources
from scalestudy.study.config import validate
from scalestudy.study.runs import build_run_table

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "scalestudy"

STUDY = {
    "dataset": "synthetic",
    "synthetic": {"num_train": 1200, "num_test": 300},
    "hardware": {
        "device": "cuda",
        "gpus_per_node": 2,
        "cpus_per_rank": 3,
        "mem_mb_per_rank": 1000,
        "runtime_min": 1,
    },
    "train": {"epochs": 2, "local_batch": 8, "precision": "fp32"},
    "repeats": 1,
    "families": {
        "strong": {"enabled": True, "gpus": [1, 2, 4], "global_batch": 8},
        "precision": {"enabled": False},
    },
    "report": {"targets": {"strong_efficiency_gpus": 4}},
    "plan": {"startup_s": 300, "safety_factor": 2},
}


def study(**hardware) -> dict:
    config = yaml.safe_load(yaml.safe_dump(STUDY))
    config["hardware"].update(hardware)
    return validate(config)


def runs(config: dict) -> dict[str, dict]:
    return {r["run"]: r for r in build_run_table(config)}


def wildcards(run: str) -> SimpleNamespace:
    return SimpleNamespace(run=run)


def test_slurm_request_of_one_rank_one_node_and_two_nodes():
    config = study()
    table = runs(config)
    request = {
        w: resources.slurm_resources(table[f"w{w}_lb{8 // w}_fp32_ddp_bk25_r0"], config["hardware"])
        for w in (1, 2, 4)
    }
    # one rank: a plain job (no MPI), `tasks` (not tasks_per_node), one GPU
    assert request[1] == {
        "nodes": 1,
        "tasks_per_node": 0,
        "tasks": 1,
        "tasks_per_gpu": 0,
        "gres": "gpu:1",
        "cpus_per_task": 3,
        "mem_mb": 1000,
        "mem_mb_per_cpu": 0,
        "mpi": "",
    }
    # a full node of 2 ranks: tasks per node, gres and memory per node, srun
    assert request[2]["tasks_per_node"] == 2 and request[2]["tasks"] == 0
    assert (request[2]["gres"], request[2]["mem_mb"], request[2]["mpi"]) == ("gpu:2", 2000, "srun")
    # 4 ranks = 2 nodes x 2
    assert (request[4]["nodes"], request[4]["tasks_per_node"], request[4]["gres"]) == (
        2,
        2,
        "gpu:2",
    )
    row = table["w4_lb2_fp32_ddp_bk25_r0"]
    assert resources.launch_threads(row, config["hardware"]) == 12
    # locally a CPU run takes every core (one timed run at a time); a GPU run its own cores
    cpu = dict(config["hardware"], device="cpu")
    assert resources.launch_threads(row, cpu, local_cores=32) == 32
    assert resources.launch_threads(row, cpu, local_cores=8) == 12  # never fewer than its own
    assert resources.launch_threads(row, cpu, local_cores=None) == 12  # submitted to Slurm
    assert resources.launch_threads(row, dict(cpu, device="cuda"), local_cores=32) == 12
    assert resources.launch_layout(row, config["hardware"]) == {
        "nodes": 2,
        "ranks_per_node": 2,
        "cpus_per_rank": 3,
    }


def test_slurm_extra_is_the_usr1_warning_and_requeue_is_the_profiles():
    config = study()
    lead = config["checkpointing"]["signal_lead_s"]
    assert resources.slurm_extra(config) == f"--signal=USR1@{lead}"  # not B:USR1, no --requeue
    config["checkpointing"]["enabled"] = False
    assert resources.slurm_extra(config) == ""
    # --requeue through the executor setting, so the executor also leaves NODE_FAIL to Slurm
    for profile in ("slurm", "local-slurm"):
        settings = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
        assert settings["slurm-requeue"] is True, profile
        assert "slurm-array-jobs" not in settings, profile


def test_array_jobs_are_refused_for_the_launch_rules_only():
    def workflow(array_jobs):
        return SimpleNamespace(executor_settings=SimpleNamespace(array_jobs=array_jobs))

    for setting in ("train", "all", "collect, profile_capture", "prepare_data;profile_ncu"):
        refusal = resources.array_jobs_refusal(workflow(setting))
        assert refusal and refusal.startswith(f"slurm-array-jobs={setting!r}"), setting
        assert "--slurm-array-jobs" in refusal and "\n" not in refusal
    for setting in (None, "", "collect", "trainer"):
        assert resources.array_jobs_refusal(workflow(setting)) is None, setting
    # executors without the setting (local, the in-job jobstep), or none set yet (parse time)
    assert resources.array_jobs_refusal(SimpleNamespace(executor_settings=object())) is None
    assert resources.array_jobs_refusal(SimpleNamespace(executor_settings=None)) is None
    assert resources.array_jobs_refusal(object()) is None


def test_a_run_wider_than_a_node_is_refused_where_no_slurm_allocation_can_start_it():
    runs = {
        "w2_lb32": {"world_size": 2, "nodes": 1, "ranks_per_node": 2},
        "w4_lb16": {"world_size": 4, "nodes": 2, "ranks_per_node": 2},
    }
    refusal = resources.multi_node_refusal(runs, {})
    assert refusal.startswith("1 run(s) need more than one node (e.g. w4_lb16: world size 4 on 2 ")
    assert "--profile profiles/slurm" in refusal and "\n" not in refusal
    assert resources.multi_node_refusal(runs, {"SLURM_JOB_ID": "7"}) is None  # in salloc
    assert resources.multi_node_refusal({"w2_lb32": runs["w2_lb32"]}, {}) is None
    # inside an allocation of fewer nodes than a run needs (salloc -N1 for a study with 2-node
    # runs): srun refused each in its job ("Only allocated 1 nodes asked for 2"), retried
    in_salloc = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1"}
    assert resources.multi_node_refusal(runs, in_salloc) == (
        "1 run(s) need more nodes than this Slurm allocation (job 77) has, 1 (e.g. w4_lb16: "
        "world size 4 on 2 nodes of hardware.gpus_per_node 2): srun cannot start them in it; "
        "allocate 2 nodes (salloc -N 2), submit with `snakemake --profile profiles/slurm`, or "
        "keep every world size within 2 ranks"
    )
    assert resources.multi_node_refusal(runs, {**in_salloc, "SLURM_JOB_NUM_NODES": "2"}) is None
    assert resources.multi_node_refusal(runs, {"SLURM_JOB_ID": "77", "SLURM_NNODES": "1"})


def test_the_machine_checks_judge_the_runs_the_targets_may_launch(tmp_path):
    """The Snakefile's onstart (local executor) judged every run of the study: a target of one
    1-rank run was refused because another spanned two nodes, and the re-analysis of a finished
    GPU study on a machine without CUDA too. It judges the runs the targets need whose launch
    outputs are missing."""
    runs = {run: {"run": run} for run in ("w1_lb32_r0", "w2_lb32_r0", "w4_lb16_r0")}
    done = {"w1_lb32_r0", "w2_lb32_r0"}
    for run in done:
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.json").touch()
    (tmp_path / "w2_lb32_r0" / "capture").mkdir()  # a directory output

    def outputs(run):
        extra = ["capture"] if run == "w2_lb32_r0" else []
        return [str(tmp_path / run / name) for name in ("metrics.json", *extra)]

    def launching(targets):
        return sorted(resources.launching_runs(runs, targets, outputs))

    assert launching(None) == launching([]) == launching(["results/csv/scaling.csv"])
    assert launching(None) == ["w4_lb16_r0"]  # `all`: the unfinished run
    assert launching(["plan", "./reports/plan.md", "results/plan.csv", "matrix"]) == []
    # a target of one finished run, or of its profile, launches nothing; of another, that run
    assert launching(["results/runs/w1_lb32_r0/metrics.json"]) == []
    assert launching(["results/profile/w2_lb32_r0/kernels.csv", "plan"]) == []
    assert launching(["benchmarks/train/w4_lb16_r0.tsv"]) == ["w4_lb16_r0"]
    # an output missing: the run may launch (here its profiling job)
    (tmp_path / "w2_lb32_r0" / "capture").rmdir()
    assert launching(["results/system/profile/w2_lb32_r0.json"]) == ["w2_lb32_r0"]
    # every finished: a re-analysis launches nothing
    (tmp_path / "w2_lb32_r0" / "capture").mkdir()
    (tmp_path / "w4_lb16_r0").mkdir()
    (tmp_path / "w4_lb16_r0" / "metrics.json").touch()
    assert launching(None) == launching(["reports/study.md"]) == []


def test_until_and_omit_from_are_judged_by_the_jobs_they_leave(tmp_path):
    """`snakemake --until prepare_data` (or --omit-from train profile_capture profile_ncu) gives
    Snakemake no targets: onstart judged every unfinished run, and a GPU study's dataset step on
    a machine without CUDA was refused with the advice to run the CPU demo, though the same job
    named as a target ran. --until's rules are judged as targets; an --omit-from that leaves out
    every launch rule launches nothing."""
    runs = {run: {"run": run} for run in ("w1_r0", "w2_r0")}
    needs = {"prepare_data": [], "build_container": []}

    def launching(**dag):
        settings = SimpleNamespace(**{"targets": set(), "until": set(), "omit_from": set(), **dag})
        outputs = lambda run: [str(tmp_path / run / "metrics.json")]  # noqa: E731
        return sorted(resources.onstart_launching(settings, runs, outputs, needs=needs))

    assert launching() == ["w1_r0", "w2_r0"]  # `all`
    assert launching(until={"prepare_data"}) == []
    assert launching(until={"train"}) == launching(until={"plot"}) == ["w1_r0", "w2_r0"]
    assert launching(omit_from={"train", "profile_capture", "profile_ncu"}) == []
    assert launching(omit_from={"train"}) == ["w1_r0", "w2_r0"]  # profiling may still launch
    # --omit-from leaves out what follows the rules named too: the dataset's rule is upstream
    # of every launch rule (the image's in a container study only), and a GPU study's `matrix`
    # alone was refused
    assert launching(omit_from={"prepare_data"}) == []
    assert launching(omit_from={"build_container"}) == ["w1_r0", "w2_r0"]  # no container
    settings = SimpleNamespace(targets=set(), until=set(), omit_from={"build_container"})
    upstream = resources.NO_RUN_RULES  # a container study's
    outputs = lambda run: ["/no/such"]  # noqa: E731
    assert resources.onstart_launching(settings, runs, outputs, upstream=upstream) == {}
    settings = SimpleNamespace(targets=set(), until=set(), omit_from={"train"})
    unprofiled = resources.onstart_launching(
        settings, runs, lambda run: ["/no/such"], launch_rules=["train"]
    )
    assert unprofiled == {}  # a study without profiled runs has no other launch rule
    assert launching(targets={"plan"}, until={"train"}) == []  # the targets decide
    assert sorted(resources.onstart_launching(None, runs, lambda run: ["/no/such"])) == sorted(runs)


def test_the_dataset_image_and_profile_targets_need_only_the_runs_they_start(tmp_path):
    """A target that is no run's file was judged as needing every unfinished run: the dataset,
    the container image and the merged profile CSVs of a study with a 2-node run were refused
    for that run, which none of them starts. The dataset and the image need none, the merged
    profile CSVs the profiled runs; an unknown target still needs them all."""
    config = study()  # strong 1, 2, 4 ranks on nodes of 2: w4 spans two nodes
    config["profiling"].update(enabled=True, gpus=[1, 2], precisions=["fp32"])
    table = runs(config)
    profiled = [row["run"] for row in profiling.profiled_runs(config, list(table.values()))]
    wide = {run for run, row in table.items() if row["nodes"] > 1}
    assert wide and profiled and not wide & set(profiled)

    def rule(*output, log):
        return SimpleNamespace(output=list(output), log=[log])

    rules = SimpleNamespace(  # the rules' patterns, as the Snakefile's `rules` gives them
        prepare_data=rule(
            "data/{dataset}/data.pt",
            "data/{dataset}/meta.json",
            log="logs/prepare_data/{dataset}.log",
        ),
        build_container=rule("containers/trainer.sif", log="logs/build_container/build.log"),
        profile_collect=rule(
            "results/csv/profile_kernels.csv",
            "results/csv/profile_ranges.csv",
            log="logs/profile_collect/collect.log",
        ),
        profile_collect_ncu=rule(
            "results/csv/profile_ncu.csv", log="logs/profile_collect_ncu/collect.log"
        ),
    )
    needs = resources.target_needs(rules, profiled)

    def launching(*targets):
        found = resources.launching_runs(
            table, targets, lambda run: [str(tmp_path / run / "metrics.json")], needs=needs
        )
        return sorted(found)

    for target in ("data/synthetic/data.pt", "./data/cifar10/meta.json",
                   "logs/prepare_data/mnist.log", "containers/trainer.sif",
                   "build_container", "logs/build_container/build.log"):  # fmt: skip
        assert launching(target) == [], target
    for target in ("results/csv/profile_kernels.csv", "results/csv/profile_ncu.csv",
                   "profile_collect", "profile_collect_ncu"):  # fmt: skip
        assert launching(target) == sorted(profiled), target
    # the machine checks then see no 2-node run
    targets = ["containers/trainer.sif", "results/csv/profile_ranges.csv"]
    found = resources.launching_runs(table, targets, lambda run: [str(tmp_path / run)], needs=needs)
    assert resources.multi_node_refusal(found, {}) is None
    # with one run's file: that run too; an unknown target (collect's): every run
    run = min(wide)
    assert launching("data/synthetic/data.pt", f"results/runs/{run}/metrics.json") == [run]
    assert launching("results/csv/runs.csv") == launching() == sorted(table)
    # a finished profiled run starts nothing
    (tmp_path / profiled[0]).mkdir()
    (tmp_path / profiled[0] / "metrics.json").touch()
    assert launching("profile_collect") == sorted(profiled[1:])


def test_a_gpu_type_is_asked_for_as_typed_gres_on_every_node():
    """hardware.gpu_type: on a partition of mixed GPU models an untyped gpu:N could measure one
    study's runs on different GPUs."""
    config = study(gpu_type="h100")
    table = runs(config)
    gres = {
        r: resources.slurm_resources(row, config["hardware"])["gres"] for r, row in table.items()
    }
    assert gres["w1_lb8_fp32_ddp_bk25_r0"] == "gpu:h100:1"
    assert gres["w4_lb2_fp32_ddp_bk25_r0"] == "gpu:h100:2"  # per node, 2 nodes x 2
    assert set(gres.values()) == {"gpu:h100:1", "gpu:h100:2"}
    # the Slurm executor's own check of --gres (set_gres_string) accepts what is asked for
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    for typed in (gres["w4_lb2_fp32_ddp_bk25_r0"], resources.gres("cuda", "a100_80g.sxm", 4)):
        job = SimpleNamespace(resources=_Resources(gres=typed))
        assert set_gres_string(job) == f" --gres={typed}"


class _Resources(dict):
    """job.resources as the executor reads it: .get(name) and attribute access."""

    def __getattr__(self, name):
        return self[name]


def test_a_site_default_memory_per_cpu_does_not_replace_the_launch_memory():
    """The plugin prefers mem_mb_per_cpu to mem_mb wherever a job has it, a profile's
    default-resources included: `mem_mb_per_cpu: 2000` there gave a 4-rank node of 8 CPUs per
    rank --mem-per-cpu 2000 (64 GB) instead of the study's --mem 128000, and no check saw it.
    The launch rules set it to 0, which the plugin takes as unset; the rule's value wins over
    the default, as Snakemake merges them."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command

    config = study(gpu_type="h100")
    hardware = config["hardware"] | {"cpus_per_rank": 8, "mem_mb_per_rank": 32000}
    row = {**next(r for r in runs(config).values() if r["ranks_per_node"] == 2)}
    site = {"mem_mb_per_cpu": 2000, "runtime": 60, "mem_mb": 4000}
    job = SimpleNamespace(
        resources=_Resources({**site, **resources.slurm_resources(row, hardware)}),
        threads=1,
        is_group=lambda: False,
    )
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "",
              "partition": "", "workdir": ""}  # fmt: skip
    call = get_submit_command(job, params)
    assert " --mem 64000" in call and "--mem-per-cpu" not in call, call


def test_cpu_runs_ask_for_no_gpus():
    # a GPU type too: config/demo.yaml (cpu) is given over a config.yaml that may set one
    config = study(device="cpu", gpu_type="h100")
    for row in runs(config).values():
        assert resources.slurm_resources(row, config["hardware"])["gres"] == ""


def test_launch_resources_are_functions_of_the_run_wildcard():
    config = study()
    table = runs(config)
    functions = resources.launch_resources(table, config["hardware"])
    for run, row in table.items():
        assert {k: f(wildcards(run)) for k, f in functions.items()} == resources.slurm_resources(
            row, config["hardware"]
        )


def test_training_time_limit_is_the_plan_estimate_times_the_safety_factor_plus_the_lead(
    tmp_path, monkeypatch
):
    config = study()
    rows = build_run_table(config)
    calls = []
    real = plan.load_measured
    monkeypatch.setattr(plan, "load_measured", lambda *a: calls.append(a) or real(*a))
    training = resources.TrainingPlan(config, rows, tmp_path / "runs.csv", tmp_path / "bench")
    assert calls == []  # nothing is read until asked (common.smk asks once: refusal())
    expected = {e.run: e for e in plan.estimate_runs(config, rows, measured=[])}
    # USR1 comes that long before the limit, and Slurm may send it 60 s earlier (man sbatch)
    lead = config["checkpointing"]["signal_lead_s"] + 60
    for run, e in expected.items():
        assert training.runtime(wildcards(run)) == max(1, math.ceil((e.runtime_s * 2 + lead) / 60))
    assert len(calls) == 1  # read once, on first use
    assert training.digest() == plan.plan_digest(list(expected.values()), training.config)
    # what plan.md prints beside the estimates changes it too (a new contingency left the
    # page at the old one)
    changed = {**training.config, "plan": {**training.config["plan"], "contingency": 0.5}}
    assert plan.plan_digest(list(expected.values()), changed) != training.digest()
    renamed = {**training.config, "study": "renamed"}
    assert plan.plan_digest(list(expected.values()), renamed) != training.digest()
    # registered for the logger plugin of this process, with the workflow's local rules
    reg = plan.registered()
    assert reg.estimates == training.estimates and reg.is_local("collect")
    assert not reg.is_local("train")


def test_unreadable_measured_runs_fail_when_the_runtime_is_asked(tmp_path):
    (tmp_path / "runs.csv").write_text("run,precision\nx,fp32\n")
    config = study()
    training = resources.TrainingPlan(config, build_run_table(config), tmp_path / "runs.csv")
    with pytest.raises(PlanError, match="lacks the columns"):
        training.runtime(wildcards("w1_lb8_fp32_ddp_bk25_r0"))
    # what common.smk asks while parsing: the same refusal, as the one line it stops with
    refusal = training.refusal()
    assert "runs.csv lacks the columns" in refusal and "\n" not in refusal
    good = resources.TrainingPlan(config, build_run_table(config), tmp_path / "absent.csv")
    assert good.refusal() is None and good.estimates  # no measured runs: the defaults price


def scalestudy_imports(path: Path) -> set[str]:
    """Every scalestudy module a file imports, by its own ast scan (independent of the code)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.startswith("scalestudy.")}


def module_path(name: str) -> str | None:
    base = REPO / "src" / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.relative_to(REPO).as_posix()
    return None


def unlisted_imports(sources: list[str]) -> list[str]:
    """What a listed file imports from scalestudy that is not listed: [] when the list is
    closed under imports (the packages' __init__.py files run no code: tested below)."""
    return [
        f"{source} imports {name} ({path})"
        for source in sources
        for name in scalestudy_imports(REPO / source)
        if (path := module_path(name)) is not None
        and not path.endswith("/__init__.py")
        and path not in sources
    ]


def test_training_code_inputs_are_the_trainer_package_and_everything_it_imports():
    sources = resources.trainer_sources(REPO)
    assert sources == sorted(sources)
    trainer = sorted((PACKAGE / "trainer").glob("*.py"))
    assert {p.relative_to(REPO).as_posix() for p in trainer} <= set(sources)
    assert "src/scalestudy/jobs/launch.py" in sources  # the launcher that starts the ranks
    for shared in ("errors", "vocab", "files"):
        assert f"src/scalestudy/{shared}.py" in sources
    # closed under imports, but for the node record (resources.NOT_CODE_INPUTS), which launch
    # writes (--inventory) and which measures nothing
    kept_out = [f"src/scalestudy/{m}" for m in resources.NOT_CODE_INPUTS]
    assert not [
        u for u in unlisted_imports(sources) if not u.endswith(tuple(f"({m})" for m in kept_out))
    ]
    # nothing the training job does not run: results, study, nsight, the CLI
    assert not [s for s in sources if re.search(r"/(results|study|nsight)/|/cli\.py$", s)]


def test_code_inputs_follow_new_modules(tmp_path):
    """A module split off the trainer (or a new shared one) is tracked without editing a list."""
    pkg = tmp_path / "src/scalestudy"
    (pkg / "trainer").mkdir(parents=True)
    (pkg / "jobs").mkdir()
    (pkg / "__init__.py").write_text('__version__ = "0"\n')
    (pkg / "trainer/__init__.py").write_text("")
    (pkg / "trainer/loaders.py").write_text("from scalestudy import helpers\n")
    (pkg / "helpers.py").write_text("def f():\n    from scalestudy.deep import g\n")
    (pkg / "deep.py").write_text("g = 1\n")
    (pkg / "unused.py").write_text("")
    (pkg / "jobs/launch.py").write_text("import scalestudy.jobs.container\n")
    (pkg / "jobs/container.py").write_text("")
    assert resources.trainer_sources(tmp_path) == [
        "src/scalestudy/deep.py",
        "src/scalestudy/helpers.py",
        "src/scalestudy/jobs/container.py",
        "src/scalestudy/jobs/launch.py",
        "src/scalestudy/trainer/__init__.py",
        "src/scalestudy/trainer/loaders.py",
    ]


def test_every_rule_reruns_when_code_it_runs_changes():
    """code_sources: what a rule's command executes, found by following imports from the modules
    it runs, and nothing else (an edit elsewhere reruns nothing)."""
    analyze = resources.code_sources(REPO, "results/analyze.py")
    assert analyze == sorted(analyze)
    # what the analysis imports, directly or not: the planner that prices the resources table,
    # the profile CSVs' schema, the shared modules
    for module in ("results/analyze.py", "study/estimate.py", "nsight/schema.py", "errors.py"):
        assert f"src/scalestudy/{module}" in analyze
    assert not unlisted_imports(analyze)
    # not the trainer (but its flag vocabulary, trainer/config.py, through study/runs.py), the
    # jobs, the CLI or the other results modules
    assert not [
        s for s in analyze if re.search(r"/trainer/(?!config\.py)|/jobs/|/plot\.py$|/cli\.py$", s)
    ]
    assert resources.code_sources(REPO, "results/build_pdf.py") == [
        "src/scalestudy/log.py",
        "src/scalestudy/results/build_pdf.py",
    ]
    # several modules: the union
    both = resources.code_sources(REPO, "results/build_pdf.py", "results/collect.py")
    assert set(both) == set(resources.code_sources(REPO, "results/build_pdf.py")) | set(
        resources.code_sources(REPO, "results/collect.py")
    )


def declared_code(path: Path, rule_name: str) -> list[str]:
    """The modules a rule's code=code_of(...) names, in a workflow rule file."""
    for rule in re.split(r"^rule ", path.read_text(), flags=re.MULTILINE)[1:]:
        if rule.split(":", 1)[0] == rule_name:
            return re.findall(r'"([^"]+)"', re.search(r"code=code_of\(([^)]*)\)", rule).group(1))
    raise AssertionError(f"{path.name} has no rule {rule_name}")


def test_a_profile_parser_edit_reruns_no_job_that_launches_ranks():
    """The profiling jobs that launch the ranks (a training window under nsys on every GPU, a
    whole run per kernel under ncu: hours of an allocation) have as code what they execute, not
    the parsers of their output: an edit to the nsys/torch.profiler phase parsers or the kernel
    classifier reran every GPU capture of a study, which `profile parse` alone reads (and every
    ncu job, whose kernels table the parse rewrote)."""
    smk = REPO / "workflow/rules/profile.smk"
    nsight = "src/scalestudy/nsight/"
    parsers = {nsight + m for m in ("nsys.py", "torch_ops.py", "projection.py", "classify.py")}
    parsers.add(nsight + "tables.py")  # numbers with units: readers.py's parse_number was it
    capture = set(resources.code_sources(REPO, *declared_code(smk, "profile_capture")))
    assert not capture & (parsers | {nsight + "ncu.py", nsight + "schema.py"})
    # the one nsight module it imports holds only what the capture calls: readers.py's number
    # parsing (the parsers' units) was in it
    assert {p for p in capture if p.startswith(nsight)} == {nsight + "readers.py"}
    tree = ast.parse((REPO / nsight / "readers.py").read_text())
    public = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name[0] != "_"}
    called = set(
        re.findall(r"readers\.(\w+)\(", (REPO / "src/scalestudy/jobs/profile.py").read_text())
    )
    assert public == called, public - called
    # nor is any parser or the classifier code of the ncu job (a whole run per kernel): it
    # imports what the capture does and the counters it asks ncu for, nothing else of nsight/;
    # the kernels step (the classifier, the kernels table) and the parse of its reports
    # (nsight/ncu.py, with tables.py's numbers) are local steps of their own
    ncu = set(resources.code_sources(REPO, *declared_code(smk, "profile_ncu")))
    assert ncu - capture == {"src/scalestudy/jobs/profile_ncu.py", nsight + "ncu_metrics.py"}
    kernels = set(resources.code_sources(REPO, *declared_code(smk, "profile_ncu_kernels")))
    assert {nsight + "classify.py", nsight + "schema.py"} <= kernels
    ncu_parse = set(resources.code_sources(REPO, *declared_code(smk, "profile_ncu_parse")))
    assert {nsight + "ncu.py", nsight + "tables.py"} <= ncu_parse
    # and no parse imports the ncu job's counters: an edit to them reran the parse first, and
    # Snakemake, which checks nothing below a rerun job whose one file from it is ancient (the
    # kernels file), left Nsight Compute to the next snakemake, unpriced by this dry-run. The
    # parser's copy of their tensor-core rule is theirs
    from scalestudy.nsight import ncu as ncu_parser
    from scalestudy.nsight import ncu_metrics

    assert nsight + "ncu_metrics.py" not in ncu_parse
    parse_code = set(resources.code_sources(REPO, *declared_code(smk, "profile_parse")))
    assert nsight + "ncu_metrics.py" not in parse_code
    assert ncu_parser.TENSOR_METRIC.pattern == ncu_metrics.TENSOR_METRIC.pattern
    # nor does the kernels file the parse's table rewrites rerun it (Snakemake: "Input files
    # updated by another job"), only a new capture
    rule = re.split(r"^rule ", smk.read_text(), flags=re.MULTILINE)
    ncu_rule = next(r for r in rule if r.startswith("profile_ncu:"))
    assert 'kernels=ancient("results/profile/{run}/ncu_kernels.json")' in ncu_rule
    assert 'capture="results/profile/{run}/capture"' in ncu_rule
    # parse runs the parsers, and the checks of the capture's manifest (rank coverage)
    parse = set(resources.code_sources(REPO, *declared_code(smk, "profile_parse")))
    assert parsers <= parse and capture <= parse


def test_a_node_record_edit_reruns_no_job_that_launches_ranks():
    """jobs/inventory.py is no input of training (design.md): an edit to the node record would
    rerun every run's GPU hours. The capture command imports it (--inventory), and such an
    edit reran every profiling capture, every ncu job and all after them; launch imports it
    too (--inventory, the rule train's), and such an edit would rerun every training job."""
    smk = REPO / "workflow/rules/profile.smk"
    inventory = "src/scalestudy/jobs/inventory.py"
    for importer in ("profile.py", "launch.py"):  # they do import it
        assert "from scalestudy.jobs import inventory" in (PACKAGE / "jobs" / importer).read_text()
    for rule in ("profile_capture", "profile_ncu", "profile_parse"):
        assert inventory not in resources.code_sources(REPO, *declared_code(smk, rule)), rule
    assert inventory not in resources.trainer_sources(REPO)
    # the modules it imports stay inputs where the rule's own code imports them
    capture = resources.code_sources(REPO, *declared_code(smk, "profile_capture"))
    assert "src/scalestudy/jobs/container_exec.py" in capture


def test_an_edit_to_the_recipes_checks_reruns_no_job_that_launches_ranks():
    """jobs/container.py (the definition's checks, the build) is no input of training or
    profiling: the launch runs only jobs/container_exec.py (the exec prefix, the digest), and
    an edit to a recipe check's message reran every run's GPU hours."""
    checks = "src/scalestudy/jobs/container.py"
    assert "src/scalestudy/jobs/container_exec.py" in resources.trainer_sources(REPO)
    assert checks not in resources.trainer_sources(REPO)
    smk = REPO / "workflow/rules/profile.smk"
    for rule in ("profile_capture", "profile_ncu"):
        assert checks not in resources.code_sources(REPO, *declared_code(smk, rule)), rule


def test_package_init_files_run_no_code():
    """code_sources and trainer_sources follow imports, not the __init__.py files an import of
    scalestudy.a.b also runs (only trainer/__init__.py is an input: training takes the whole
    trainer package): sound only while those hold a docstring and nothing else (the top
    package: also its __version__)."""
    for path in sorted(PACKAGE.rglob("__init__.py")):
        body = ast.parse(path.read_text()).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        if path == PACKAGE / "__init__.py":
            body = [
                n
                for n in body
                if not (
                    isinstance(n, ast.Assign)
                    and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__version__"]
                )
            ]
        assert not body, f"{path.relative_to(REPO)} runs code: list it as a code input"


def test_every_rule_that_runs_the_package_has_its_code_as_input():
    """In the workflow's rule files, every rule whose command runs the package (a `scalestudy`
    shell command or a `run:` block) names its code: code_of(...) or the trainer's sources.
    The one exception is the container image, the environment without the code: what of the
    package shapes it is the build command, its param (container.build_signature)."""
    for path in sorted((REPO / "workflow/rules").glob("*.smk")):
        for rule in re.split(r"^rule ", path.read_text(), flags=re.MULTILINE)[1:]:
            name = rule.split(":", 1)[0]
            runs_package = "scalestudy " in rule or re.search(r"^    run:", rule, re.MULTILINE)
            if name == "build_container":
                assert "build=apptainer.build_signature()" in rule
            elif runs_package:
                assert re.search(r"code_of\(|get_trainer_sources", rule), (
                    f"{path.name}: rule {name} runs the package without its code as input"
                )


def workflow_imports() -> dict[str, str]:
    """The names common.smk imports from the package -> the module file each runs (a path under
    src/scalestudy): `from scalestudy.study import runs as matrix` -> study/runs.py,
    `from scalestudy.log import rule_log` -> log.py."""
    smk = (REPO / "workflow/rules/common.smk").read_text()
    block = smk.split("\ntry:\n", 1)[1].split("\nexcept ImportError", 1)[0]
    names = {}
    for node in ast.walk(ast.parse(textwrap.dedent(block))):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "scalestudy":
            for alias in node.names:
                base = Path(*node.module.split(".")[1:])
                module = base / f"{alias.name}.py"
                if not (PACKAGE / module).is_file():  # a name defined in the module
                    module = base.with_suffix(".py") if base.parts else Path("__init__.py")
                names[alias.asname or alias.name] = module.as_posix()
    return names


def test_a_run_block_rule_has_the_code_its_block_executes_as_input():
    """A `run:` rule's code inputs are the modules its block calls (through common.smk's imports)
    and what they import, nothing else: the matrix rule had the preview command's module
    (study/matrix.py, which its block never runs) as code, so an edit to the `scalestudy matrix`
    summary reran matrix and, through runs.tsv, collect and everything after it."""
    imports = workflow_imports()
    assert imports["matrix"] == "study/runs.py" and imports["rule_log"] == "log.py"
    checked = set()
    for path in sorted((REPO / "workflow/rules").glob("*.smk")):
        for rule in re.split(r"^rule ", path.read_text(), flags=re.MULTILINE)[1:]:
            name = rule.split(":", 1)[0]
            if not re.search(r"^    run:", rule, re.MULTILINE):
                continue
            block = re.split(r"^    run:\n", rule, flags=re.MULTILINE)[1]
            called = {imports[n] for n in re.findall(r"\b(\w+)[.(]", block) if n in imports}
            declared = re.search(r"code=code_of\(([^)]*)\)", rule).group(1)
            modules = re.findall(r'"([^"]+)"', declared)
            assert called and set(resources.code_sources(REPO, *modules)) == set(
                resources.code_sources(REPO, *called)
            ), f"{path.name}: rule {name}'s code_of({declared}) is not what its run: executes"
            checked.add(name)
    assert checked == {"matrix", "plan", "proposal"}


def declared_localrules() -> set[str]:
    """Rule names in the `localrules:` directives of the workflow's files."""
    names = set()
    for path in [REPO / "workflow/Snakefile", *sorted((REPO / "workflow/rules").glob("*.smk"))]:
        for block in re.findall(r"^localrules:\n((?:[ \t]+\w+,?\n)+)", path.read_text(), re.M):
            names |= set(re.findall(r"\w+", block))
    return names


def test_local_rules_are_the_workflows_localrules():
    # `all` runs nowhere (no command): Snakemake treats it as local without a directive
    assert declared_localrules() | {"all"} == set(resources.LOCAL_RULES)
    assert not resources.is_local_rule("train") and resources.is_local_rule("plan")


def test_profiling_glue():
    config = study()
    config["profiling"].update(enabled=True, gpus=[1, 2], precisions=["fp32"])
    rows = build_run_table(config)
    chosen = profiling.profiled_runs(config, rows)
    assert profiling.profile_targets(config, chosen)[-1] == "results/csv/profile_ncu.csv"
    assert profiling.profile_targets(config, []) == []
    config["profiling"]["ncu"]["enabled"] = False
    assert len(profiling.profile_targets(config, chosen)) == 2
    flags = profiling.profile_flags(chosen[0], config["profiling"])
    assert flags[-2] == "--profile-steps" and "--epochs" in flags
    assert profiling.ncu_settings(config["profiling"])["enabled"] == "auto"
    assert profiling.tool_settings(config)["device"] == "cuda"


def test_nsys_settings_rerun_no_capture_that_cannot_run_nsys():
    """profiling.nsys_trace and nsys_ranks, the capture rule's param, reran every capture of a
    CPU study or under tool torch, whose torch.profiler they change nothing of. They are in the
    param only where nsys may run (a GPU study, tool auto or nsys)."""
    config = study()
    other = {"nsys_trace": "cuda,nvtx", "nsys_ranks": "0"}

    def settings(device, tool, **prof):
        c = yaml.safe_load(yaml.safe_dump(config))
        c["hardware"]["device"] = device
        c["profiling"].update(tool=tool, **prof)
        return profiling.tool_settings(c)

    for tool in ("auto", "nsys"):
        assert settings("cuda", tool) != settings("cuda", tool, **other)
        assert settings("cuda", tool, **other)["trace"] == "cuda,nvtx"
    for device, tool in (("cuda", "torch"), ("cpu", "torch"), ("cpu", "auto")):
        assert settings(device, tool) == settings(device, tool, **other), (device, tool)
    # the capture's defaults: the schema's, the CLI's
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    nsys_trace = schema["properties"]["profiling"]["properties"]["nsys_trace"]["default"]
    assert settings("cpu", "auto")["trace"] == nsys_trace
    assert settings("cpu", "auto")["ranks"] == "all"


class Settings:
    dryrun, stdout, quiet = True, False, None


def record(rule: str, resources_: dict, level: int = logging.INFO, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("snakemake", level, "", 0, f"rule {rule}", None, None)
    rec.__dict__.update(
        event=logger_plugin.LogEvent.JOB_INFO, rule_name=rule, resources=resources_, **extra
    )
    return rec


def test_logger_plugin_without_a_registered_plan_counts_local_rules_free(monkeypatch, capsys):
    """A dry-run with no training job (all runs finished) never evaluates a training runtime:
    the plan still prints, local rules at 0 node-hours, other jobs at their Slurm request."""
    monkeypatch.setattr(plan, "_REGISTERED", None)
    handler = logger_plugin.LogHandler(Settings(), None)
    handler.handle(record("collect", {"runtime": 60}, wildcards={}))
    handler.handle(record("profile_capture", {"runtime": 30, "nodes": 2}, wildcards={"run": "x"}))
    handler.close()
    text = capsys.readouterr().err
    assert "no estimate registered" not in text
    # no registered study, no job on a GPU: GPUs and GPU-hours n/a (a CPU study's, or unknown)
    assert re.search(r"^collect\s+-\s+0\s+n/a\s+0:00:00\s+0\.000\s+n/a", text, re.M), text
    assert "total: 2 jobs, 1.000 node-hours, n/a GPU-hours" in text


def test_logger_plugin_prints_nothing_after_an_error(capsys):
    handler = logger_plugin.LogHandler(Settings(), None)
    handler.handle(record("collect", {}, wildcards={}))
    handler.handle(logging.LogRecord("snakemake", logging.ERROR, "", 0, "boom", None, None))
    handler.close()
    assert "Node-hour plan" not in capsys.readouterr().err


def test_logger_plugin_under_quiet_with_nothing_to_do_says_so(capsys):
    """`snakemake -n --quiet` with every output up to date: the plugin told the user --quiet
    hid the jobs, and without --quiet the table was empty. It says there is nothing to run;
    with jobs hidden by --quiet it still gives that advice."""

    class Quiet(Settings):
        quiet = {"rules"}

    handler = logger_plugin.LogHandler(Quiet(), None)
    done = "Nothing to be done (all requested files are present and up to date)."
    handler.handle(logging.LogRecord("snakemake", logging.INFO, "", 0, done, None, None))
    handler.close()
    err = capsys.readouterr().err
    assert "--quiet hides the jobs" not in err and "0 jobs" in err, err
    handler = logger_plugin.LogHandler(Quiet(), None)
    handler.close()
    assert "--quiet hides the jobs" in capsys.readouterr().err


def test_the_proposal_asks_for_a_finished_runs_job_benchmark_only_where_it_exists(tmp_path):
    """A job benchmark is an output of training: asked for a finished run without one (deleted,
    or results copied from elsewhere), Snakemake trained the run again to build the proposal,
    which reads the benchmarks that exist, as `scalestudy plan` does."""
    bench, metrics = str(tmp_path / "bench/{run}.tsv"), str(tmp_path / "runs/{run}/metrics.json")
    for run, files in {"done": (bench, metrics), "no_tsv": (metrics,), "new": ()}.items():
        for pattern in files:
            path = Path(pattern.format(run=run))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    wanted = resources.optional_benchmarks(["done", "no_tsv", "new"], bench, metrics)
    # a run still to train is waited for (its benchmark comes with it)
    assert wanted == [bench.format(run="done"), bench.format(run="new")]


def profiled_study(**hardware) -> dict:
    config = yaml.safe_load(yaml.safe_dump(STUDY))
    config["hardware"].update(hardware)
    config["profiling"] = {"enabled": True}
    return validate(config)


def _plans(config: dict) -> dict[str, str]:
    table = runs(config)
    profiled = {r["run"]: r for r in profiling.profiled_runs(config, list(table.values()))}
    return resources.launch_plans(config, table, profiled)


def test_launch_plans_change_for_the_jobs_a_config_edit_changes_only():
    config = profiled_study()
    plans = _plans(config)
    table = runs(config)
    assert {k for k in plans if k.startswith("train:")} == {f"train:{r}" for r in table}
    profiled = [k.split(":", 1)[1] for k in plans if k.startswith("profile_capture:")]
    assert profiled and all(f"profile_ncu:{r}" in plans for r in profiled)
    # the same config: the same plans, in another process too
    assert _plans(profiled_study()) == plans
    # a job digests its own runs only, to the same digests
    rows = {r["run"]: r for r in profiling.profiled_runs(config, list(table.values()))}
    one = profiled[0]
    assert resources.launch_plans(config, table, rows, only={one}) == {
        k: v for k, v in plans.items() if k.split(":", 1)[1] == one
    }
    # another learning rate: every run trains otherwise, and every profiled run's window too
    faster = profiled_study()
    faster["train"]["lr"] = faster["train"]["lr"] * 2
    assert {k for k, v in _plans(faster).items() if plans[k] != v} == set(plans)
    # more epochs: every run trains longer; a profiled window is one epoch whatever they are
    longer = profiled_study()
    longer["train"]["epochs"] = 3
    assert {k for k, v in _plans(longer).items() if plans[k] != v} == {
        k for k in plans if k.startswith("train:")
    }
    # another ncu setting changes the ncu jobs only
    ncu = profiled_study()
    ncu["profiling"]["ncu"]["launch_count"] = ncu["profiling"]["ncu"]["launch_count"] + 1
    assert {k for k, v in _plans(ncu).items() if plans[k] != v} == {
        f"profile_ncu:{r}" for r in profiled
    }
    # a memory request is not what runs: the jobs are not stopped for it
    more_memory = profiled_study(mem_mb_per_rank=2000)
    assert _plans(more_memory) == plans


def test_a_torch_upgraded_while_jobs_wait_changes_their_launch_plans(tmp_path, monkeypatch):
    """The venv's training software is in each launch job's plan outside the container (a
    job's snakemake records the main process's params: a torch upgraded while jobs waited
    trained them on a build the study recorded as the old one), not with it (the image)."""
    config = study()
    config["container"]["enabled"] = False
    contained = {**config, "container": {**config["container"], "enabled": True}}
    before, image_before = _plans(config), _plans(contained)
    upgrade = tmp_path / "site"
    (upgrade / "torch-99.0.0.dist-info").mkdir(parents=True)
    (upgrade / "torch-99.0.0.dist-info/METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 99.0.0\n"
    )
    monkeypatch.syspath_prepend(str(upgrade))
    resources._installed_software.cache_clear()
    try:
        assert "torch==99.0.0" in resources.software_stack(config)
        assert resources.software_stack(contained) == ""  # no rerun trigger in the container
        after, image_after = _plans(config), _plans(contained)
    finally:
        monkeypatch.undo()
        resources._installed_software.cache_clear()
    assert before.keys() == after.keys() and all(before[k] != after[k] for k in before)
    # with the container the image is the software: the venv's upgrade changes no plan
    assert image_before == image_after and image_before != before


def test_a_jobs_targets_are_read_from_its_command_line():
    argv = ["/venv/bin/python", "-m", "snakemake", "--snakefile", "Snakefile"]
    assert resources.target_jobs(argv) == []
    job = [*argv, "--target-jobs", "train:run=w2_lb8_fp32_ddp_bk25_r0", "--cores", "all"]
    assert resources.target_jobs(job) == [("train", "w2_lb8_fp32_ddp_bk25_r0")]
    group = [*argv, "--target-jobs", "profile_capture:run=a", "collect:", "--mode", "remote"]
    assert resources.target_jobs(group) == [("profile_capture", "a"), ("collect", None)]
    assert resources.target_jobs([*argv, "--target-jobs=train:run=b"]) == [("train", "b")]


def test_a_job_whose_config_changed_after_submission_is_stopped_in_one_line(tmp_path):
    config = study()
    plans = _plans(config)
    path = resources.write_launch_plans(plans, tmp_path / "plans")
    assert Path(path).is_absolute() and resources.read_launch_plans(path) == plans
    assert resources.write_launch_plans(plans, tmp_path / "plans") == path  # reused
    before = resources.read_launch_plans(path)
    run = sorted(runs(config))[0]
    assert resources.launch_plan_changes(before, plans, [("train", run)]) == ""
    longer = study()
    longer["train"]["epochs"] = 3
    line = resources.launch_plan_changes(before, _plans(longer), [("train", run)])
    assert line.startswith(
        "the study config or the venv's training software (torch, torchvision, triton, "
        f"nvidia-*) changed after snakemake submitted this job: train of run {run} "
        "would now run other settings"
    )
    assert "\n" not in line and "start it again" in line
    gone = resources.launch_plan_changes(before, {}, [("train", run)])
    assert f"train of run {run} (no longer in it)" in gone
    # not judged: no plans (a job started otherwise, a file gone), another rule, a run not
    # planned
    assert resources.read_launch_plans(None) is None
    assert resources.read_launch_plans(str(tmp_path / "gone.json")) is None
    (tmp_path / "bad.json").write_text("not json")
    assert resources.read_launch_plans(str(tmp_path / "bad.json")) is None
    assert resources.launch_plan_changes(None, {}, [("train", run)]) == ""
    assert resources.launch_plan_changes(before, {}, [("collect", None)]) == ""
    assert resources.launch_plan_changes(before, {}, [("train", "another")]) == ""


def test_the_jobs_inherit_a_path_not_the_plans_of_a_study_of_ten_thousand_runs(tmp_path):
    """The plans in the variable itself passed Linux's 128 KiB limit on one environment string
    near 2,400 jobs: every process the main snakemake started then failed (E2BIG)."""
    plans = {f"train:w1_lb8_fp32_ddp_bk25_r{i}": f"{i:016x}" for i in range(10_000)}
    path = resources.write_launch_plans(plans, tmp_path)
    assert len(path) < 4096 and resources.read_launch_plans(path) == plans
