"""What the workflow's jobs ask for, as plain functions of the study config and its run table.

No torch and no Snakemake: workflow/rules/common.smk turns these into one-line input, param and
resource functions, and the tests check them here.

- Slurm resources of a launch: the training job and the two profiling jobs (profile_capture,
  profile_ncu) start the ranks of one run with `scalestudy launch`, so they ask for the same
  nodes, tasks, GPUs, CPUs and memory (`launch_resources`).
- The Slurm time limit of a training job: the node-hour plan's estimate (its 95% upper end where
  the scaling model prices it) x plan.safety_factor plus the USR1 lead (`TrainingPlan`; the
  formula: study/estimate.py). The measured runs that calibrate the plan are read on first
  use, once per process: in the main Snakemake process while common.smk is parsed
  (`TrainingPlan.refusal`: a measured file the plan refuses stops the workflow in one line
  before any job), in a job's inner snakemake when it asks for the job's `runtime`.
- Code inputs: the source files whose change reruns a rule (`trainer_sources`, and
  `code_sources` for every other rule that runs the package), found by globbing the package and
  following its imports, so a new or split module is tracked without a hand-kept list. The
  container image holds none of them (its code is the checkout's, bound in when a rank runs:
  jobs/container_exec.py), so only its recipe rebuilds it.
- The rules that run on the submitting host (`LOCAL_RULES`): the `localrules:` of the workflow,
  and the rules the dry-run node-hour plan counts at 0 node-hours.
- The runs whose launch jobs the targets given to snakemake may start (`launching_runs`, with
  `target_needs`): the runs the Snakefile's onstart judges under the local executor.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from scalestudy import files, vocab
from scalestudy.errors import PlanError
from scalestudy.study import plan, profiling
from scalestudy.study.runs import prepared_sizes, trainer_args

# Rules that run on the host that runs snakemake (not as Slurm jobs): cheap steps, and
# prepare_data because login nodes have the internet access compute nodes often lack. The
# workflow's `localrules:` directives name the same rules (tests/test_resources.py checks).
LOCAL_RULES = (
    "all",
    "matrix",
    "prepare_data",
    "collect",
    "build_container",
    "profile_parse",
    "profile_ncu_kernels",
    "profile_ncu_parse",
    "profile_collect",
    "profile_collect_ncu",
    "analyze",
    "model",
    "plot",
    "render_report",
    "paper_pdf",
    "plan",
    "proposal",
    "proposal_pdf",
    "slides_pdf",
)

# Rules that start the ranks of one run with `scalestudy launch` (one Slurm request each)
LAUNCH_RULES = ("train", "profile_capture", "profile_ncu")
# Targets that need no launch rule, by rule name or output: `snakemake plan` on a login node or a
# laptop, for an allocation proposal, asks nothing of the machine's GPUs or nodes
NO_LAUNCH_TARGETS = (
    "plan",
    "reports/plan.md",
    "results/plan.csv",
    "matrix",
    "results/matrix/runs.tsv",
)


# Rules that start no launch job, whose targets need no run (the dataset, the image) or the
# profiled runs only (the merged profile CSVs read the profiled runs' profiles): `target_needs`
NO_RUN_RULES = ("prepare_data", "build_container")
PROFILED_RULES = ("profile_collect", "profile_collect_ncu")


def target_needs(
    rules, profiled: Iterable[str], datasets: Iterable[str] = tuple(vocab.DATASETS)
) -> dict[str, frozenset[str]]:
    """The runs each target of NO_RUN_RULES (none) and PROFILED_RULES (`profiled`) needs, by
    every name snakemake may be given for it: the rule's name and each file the rule writes
    (outputs and log; prepare_data's for every dataset of its {dataset} wildcard), normalised.
    `rules`: the workflow's `rules` (each with .output and .log patterns)."""
    datasets = tuple(datasets)
    needs: dict[str, frozenset[str]] = {}
    for names, runs in ((NO_RUN_RULES, frozenset()), (PROFILED_RULES, frozenset(profiled))):
        for name in names:
            rule = getattr(rules, name)
            needs[name] = runs
            for pattern in (*rule.output, *rule.log):
                for dataset in datasets:
                    needs[os.path.normpath(str(pattern).format(dataset=dataset))] = runs
    return needs


def onstart_launching(
    dag_settings,
    runs: dict[str, dict],
    outputs: Callable[[str], Iterable[str]],
    needs: Mapping[str, Iterable[str]] | None = None,
    launch_rules: Iterable[str] = LAUNCH_RULES,
    upstream: Iterable[str] = ("prepare_data",),
) -> dict[str, dict]:
    """launching_runs of this snakemake's targets (the workflow's dag_settings, read
    defensively: no public API holds them, None: `all`); where it names none, of --until's
    (Snakemake runs the jobs up to those: their needs), or none where --omit-from leaves out
    every launch rule the study has (`launch_rules`: train alone without profiled runs), by
    name or as what follows a rule `upstream` of them all (the dataset's; the image's where the
    study runs in a container): `--until prepare_data` was judged as `all`, and a GPU study's
    dataset step refused on a machine without CUDA."""
    targets = getattr(dag_settings, "targets", None)
    if not targets:
        omitted = set(getattr(dag_settings, "omit_from", None) or ())
        if set(launch_rules) <= omitted or omitted & set(upstream):
            return {}
        targets = getattr(dag_settings, "until", None)
    return launching_runs(runs, targets, outputs, needs=needs)


def launching_runs(
    runs: dict[str, dict],
    targets,
    outputs: Callable[[str], Iterable[str]],
    exists: Callable[[str], bool] = os.path.exists,
    needs: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, dict]:
    """The runs of `runs` whose launch jobs (LAUNCH_RULES) the targets given to snakemake may
    start: the runs the Snakefile's onstart judges under the local executor (CUDA, nodes, GPU
    slots). Judging every run of the study refused a target of one 1-rank run because another
    spanned two nodes, and the re-analysis of a finished GPU study on a machine without CUDA;
    judging every run for any other target refused the dataset, the container image and the
    merged profile CSVs because of a 2-node run none of them starts.

    - the runs the targets need: none for NO_LAUNCH_TARGETS; for a target of `needs` (its
      normalised path or rule name -> the runs it needs: `target_needs`, the dataset's and
      the image's none, the merged profile CSVs' the profiled runs) those; for a target that
      is one run's file (the run id a directory or the file's stem:
      results/runs/<run>/metrics.json, results/profile/<run>/..., benchmarks/train/<run>.tsv)
      that run; every run for any other target (unknown: it may need them all) and for none
      (`all`);
    - of those, the runs with a launch output missing (`outputs(run)`: the files of the run's
      launch jobs the study asks for): a finished run starts no launch job.

    Snakemake has no public API for the jobs it will start, so a finished run it starts again
    (its code or flags changed, or forced with -R) is not judged here: `scalestudy launch` in
    its job refuses the same runs in one line (jobs/launch.py: a multi-node run outside Slurm;
    jobs/gpu_slots.py: a CUDA run wider than the visible GPUs, none visible included)."""
    needed: set[str] = set()
    for target in targets or ("all",):
        path = os.path.normpath(str(target))
        if path in NO_LAUNCH_TARGETS:
            continue
        if needs and path in needs:
            needed |= set(needs[path])
            continue
        named = {*Path(path).parts, Path(path).stem} & set(runs)
        needed |= named if len(named) == 1 else set(runs)
    return {
        run: row
        for run, row in runs.items()
        if run in needed and not all(exists(str(path)) for path in outputs(run))
    }


PACKAGE = Path("src") / "scalestudy"
# what a training job runs: the trainer package and the launcher that starts its ranks
TRAINER_PACKAGES = ("trainer",)
TRAINER_MODULES = ("jobs/launch.py",)
# never a code input, though a launch job runs it: the node record (`launch --inventory`, the
# rule train's, and `profile capture --inventory`) says where a job ran and measures nothing,
# and an edit to it would rerun every training or profiling job's GPU hours
NOT_CODE_INPUTS = ("jobs/inventory.py",)


def is_local_rule(name: str) -> bool:
    """True for a rule that runs on the submitting host (0 node-hours in the plan)."""
    return name in LOCAL_RULES


# ---------------------------------------------------------------------------------------------
# Slurm resources of a launch (train, profile_capture, profile_ncu)


def launch_layout(row: dict, hardware: dict) -> dict:
    """How the ranks of a run are placed (a param: a change reruns the run, another experiment)."""
    return {
        "nodes": row["nodes"],
        "ranks_per_node": row["ranks_per_node"],
        "cpus_per_rank": hardware["cpus_per_rank"],
    }


def slurm_resources(row: dict, hardware: dict) -> dict:
    """The Slurm request of one launch of a run-table row (runtime aside: each rule sets it).

    tasks_per_node for multi-rank nodes (the Slurm executor wants it > 1), else tasks; gres
    gpu:N (gpu:<hardware.gpu_type>:N where typed) per node on GPUs; mem_mb per node (sbatch
    --mem), never a site's default mem_mb_per_cpu; mpi "srun" for several ranks, "" for one
    (the executor refuses MPI jobs of one task). The key is there for one rank too: the
    in-job executor (jobstep 0.6.1) tests its presence, not its value, and then runs the
    rule's shell without its `srun -n1` wrapper, so `scalestudy launch` can start the rank as
    a job step that gets the USR1 preemption warning (jobs/launch.py)."""
    multi = row["ranks_per_node"] > 1
    return {
        "nodes": row["nodes"],
        "tasks_per_node": row["ranks_per_node"] if multi else 0,
        "tasks": 0 if multi else row["world_size"],
        "tasks_per_gpu": 0,
        "gres": gres(row["device"], hardware.get("gpu_type", ""), row["ranks_per_node"]),
        "cpus_per_task": hardware["cpus_per_rank"],
        "mem_mb": hardware["mem_mb_per_rank"] * row["ranks_per_node"],
        # 0: unset for the plugin, which prefers a profile's default mem_mb_per_cpu to mem_mb
        # (--mem-per-cpu 2000 x 16 CPUs replaced the study's --mem 128000)
        "mem_mb_per_cpu": 0,
        "mpi": "srun" if row["world_size"] > 1 else "",
    }


def gres(device: str, gpu_type: str, gpus: int) -> str:
    """sbatch --gres of a node: gpu:<N>, typed gpu:<type>:<N> where hardware.gpu_type names the
    model (Slurm's gres.conf Type); none on CPUs."""
    if device != "cuda":
        return ""
    return f"gpu:{gpu_type}:{gpus}" if gpu_type else f"gpu:{gpus}"


def launch_threads(row: dict, hardware: dict, local_cores: int | None = None) -> int:
    """Locally: the cores the run occupies, so the local scheduler never oversubscribes; a CPU
    run run by the local executor (`local_cores`: its --cores, None when submitted to Slurm)
    takes them all, so no other job runs beside it. Its ranks compute on this machine's cores:
    two 1-rank runs of the CPU demo side by side (and a profiling job beside them) slowed the
    baseline's epochs from 5.4 to 10.3 s, and the study reported E_s 106% and a weak
    deviation of -52%. A GPU run computes on its own GPUs (jobs/gpu_slots.py)."""
    cores = row["world_size"] * hardware["cpus_per_rank"]
    if hardware["device"] == "cpu" and local_cores:
        return max(cores, local_cores)
    return cores


def launch_resources(runs: dict[str, dict], hardware: dict) -> dict[str, Callable]:
    """`resources: **LAUNCH_RESOURCES, runtime=...` of the launch rules: one function of the
    job's wildcards per resource of `slurm_resources`."""

    def resource(name: str) -> Callable:
        def value(wildcards):
            return slurm_resources(runs[wildcards.run], hardware)[name]

        value.__name__ = f"get_{name}"
        return value

    names = slurm_resources(next(iter(runs.values())), hardware) if runs else {}
    return {name: resource(name) for name in names}


# ---------------------------------------------------------------------------------------------
# the node-hour plan: Slurm time limit of training, and the dry-run table


class TrainingPlan:
    """The estimates of every training run of a study (scalestudy.study.plan), computed on first
    use (`refusal`, `runtime` or `digest`): then the measured runs (results/csv/runs.csv,
    benchmarks/train) are read, once, and the estimates are registered for the logger plugin of
    this process (snakemake_logger_plugin_scalestudy prints them after a dry-run)."""

    def __init__(
        self,
        config: dict,
        rows: Iterable[dict],
        runs_csv: str | Path = plan.RUNS_CSV,
        benchmarks_dir: str | Path = plan.BENCHMARKS_DIR,
    ) -> None:
        self.config, self.rows = config, list(rows)
        self.runs_csv, self.benchmarks_dir = runs_csv, benchmarks_dir

    @functools.cached_property
    def measured(self) -> list[dict]:
        """The measured runs the estimates are calibrated from, read once."""
        return plan.read_measured(self.config, self.runs_csv, self.benchmarks_dir)

    @functools.cached_property
    def estimates(self) -> dict[str, plan.Estimate]:
        return plan.register(self.config, self.rows, self.measured, is_local_rule)

    def refusal(self) -> str | None:
        """The plan's refusal of the measured runs (PlanError's one line, e.g. a runs.csv row
        with throughput 0) or of a job's time limit (hardware.runtime_max), None when the
        estimates compute. common.smk asks before any job:
        raised inside `runtime` or `digest`, Snakemake wraps any error (SystemExit too) in an
        InputFunctionException with a traceback and another run's wildcards."""
        try:
            self.estimates  # noqa: B018 - computed (and cached) for its refusal
            # and the profiling jobs' limits (hardware.runtime_max), asked of each by its rule
            profiling.profiling_jobs(self.config, self.rows, self.estimates)
        except PlanError as exc:
            return str(exc)
        return None

    def runtime(self, wildcards) -> int:
        """Slurm time limit of a training job, minutes: estimate (its 95% upper end where the
        scaling model prices it) x safety_factor plus the USR1 lead, floored at
        hardware.runtime_min (estimate.slurm_runtime_min)."""
        return self.estimates[wildcards.run].slurm_runtime_min

    def capture_runtime(self, wildcards) -> int:
        """Slurm time limit of the run's profile_capture job, minutes (profiling.job_minutes)."""
        return self._profiling_minutes(wildcards.run, profiling.CAPTURE)

    def ncu_runtime(self, wildcards) -> int:
        """Slurm time limit of the run's profile_ncu job: its ncu.top_k passes, minutes."""
        return self._profiling_minutes(wildcards.run, profiling.NCU)

    def _profiling_minutes(self, run: str, rule: str) -> int:
        row = next(r for r in self.rows if r["run"] == run)
        return profiling.job_minutes(self.config, row, self.estimates[run], rule)

    def digest(self, wildcards=None) -> str:
        """The plan's content: changes whenever an estimate does."""
        return plan.plan_digest(list(self.estimates.values()), self.config, self.measured)


# ---------------------------------------------------------------------------------------------
# code inputs


def _module_file(root: Path, module: str) -> Path | None:
    """src/scalestudy/a/b.py (or a/b/__init__.py) of module scalestudy.a.b, if it exists."""
    parts = module.split(".")
    if parts[0] != PACKAGE.name:
        return None
    base = root / PACKAGE.parent / Path(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path, root: str | Path = ".") -> set[str]:
    """The scalestudy modules a source file imports, anywhere in it (lazy imports included):
    `import scalestudy.a`; `from scalestudy.a import b`: scalestudy.a.b when b is a module
    (a file under `root`), else scalestudy.a (b is a name defined in it)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != PACKAGE.name:
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _module_file(Path(root), sub) else node.module)
    return found


def package_sources(
    root: str | Path, packages: Iterable[str] = (), modules: Iterable[str] = ()
) -> list[str]:
    """Every .py file of the given subpackages of src/scalestudy and the given modules (paths
    under src/scalestudy), plus every scalestudy module they import, transitively, but
    NOT_CODE_INPUTS and what only they import: sorted paths relative to the repository root
    `root`."""
    root = Path(root)
    pending = [p for pkg in packages for p in sorted((root / PACKAGE / pkg).rglob("*.py"))]
    pending += [root / PACKAGE / m for m in modules]
    left_out = {root / PACKAGE / m for m in NOT_CODE_INPUTS}
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen or path in left_out or "__pycache__" in path.parts:
            continue
        seen.add(path)
        for module in imported_modules(path, root):
            found = _module_file(root, module)
            if found is not None and found not in seen:
                pending.append(found)
    return sorted(p.relative_to(root).as_posix() for p in seen)


def trainer_sources(root: str | Path) -> list[str]:
    """Files whose change reruns training: the trainer package, the launcher, and the shared
    modules they import (Snakemake does not track modules a command imports). Computed once per
    process and root (every training and profiling job asks for it)."""
    return list(_cached_sources(Path(root), TRAINER_PACKAGES, TRAINER_MODULES))


def code_sources(root: str | Path, *modules: str) -> list[str]:
    """A rule's code inputs: the modules it runs (paths under src/scalestudy, e.g.
    "results/analyze.py") and every scalestudy module they import, transitively, so an edit to
    anything the rule's command executes reruns it, and an edit elsewhere does not. Computed
    once per process, root and modules."""
    return list(_cached_sources(Path(root), (), modules))


@functools.cache
def _cached_sources(root: Path, packages: tuple, modules: tuple) -> tuple[str, ...]:
    """package_sources, once per process and arguments (each rule asks per job)."""
    return tuple(package_sources(root, packages, modules))


# ---------------------------------------------------------------------------------------------
# arguments of the jobs' commands


def prepared_data(config: dict) -> dict[str, str]:
    """The prepared dataset every launch reads (written once by prepare_data)."""
    where = f"{config['data_dir']}/{config['dataset']}"
    return {"data": f"{where}/data.pt", "meta": f"{where}/meta.json"}


def prepare_flags(config: dict, dataset: str) -> list:
    """`scalestudy prepare-data` flags beyond the dataset: the sizes of the synthetic set."""
    if dataset != "synthetic":
        return []
    sizes = config["synthetic"]
    return ["--num-train", sizes["num_train"], "--num-test", sizes["num_test"]]


def expected_data(config: dict) -> dict[str, int]:
    """The (training, test) images of the prepared set the study makes (prepare_flags' sizes
    of a synthetic one, the dataset's own else), `--expect-train`/`--expect-test` of every
    launch: the trainer refuses a set of other sizes before its rendezvous (a data.pt prepared
    by hand, which Snakemake's params trigger does not see without its metadata)."""
    n_train, n_test = prepared_sizes(config)
    return {"expect_train": n_train, "expect_test": n_test}


def container_flags(config: dict) -> list[str]:
    """`scalestudy launch` flags that run the ranks in the image (none without a container)."""
    container = config["container"]
    if not container["enabled"]:
        return []
    gpu = ["--gpu"] if config["hardware"]["device"] == "cuda" else []
    return ["--container", container["image"], *gpu]


# the installed distributions whose version can move a measured number: the framework, the
# model's library, the compiler of torch.compile's kernels, and the CUDA libraries pip installs
# with torch (cuDNN, cuBLAS, NCCL, ...: nvidia-*, NVML's bindings, which read the energy,
# included)
SOFTWARE = ("torch", "torchvision", "triton")
SOFTWARE_PREFIX = "nvidia-"


def software_stack(config: dict) -> str:
    """The training software of a run outside the container, a param of every launch rule (a
    rerun trigger): `pip install -U torch` in the study's venv changes what a run measures, and
    a study retrained only the runs whose code changed, mixing two torch builds as repeats of
    one configuration. "name==version" of each SOFTWARE distribution (and nvidia-*) installed in
    this Python, as pip names them, sorted. "" with the container: the image is the software
    (an input of the rules, by digest), and the venv's torch does not run in it."""
    return "" if config["container"]["enabled"] else _installed_software()


@functools.cache
def _installed_software() -> str:
    """software_stack's list, once per process (importlib.metadata reads every installed
    distribution's metadata: ~0.1 s); the first of a name on sys.path, as an import finds it."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in SOFTWARE or name.startswith(SOFTWARE_PREFIX):
            found.setdefault(name, dist.version)
    return " ".join(f"{name}=={version}" for name, version in sorted(found.items()))


def checkpoint_dir(config: dict, run: str) -> str:
    """results/checkpoints/<run>, outside the declared outputs, so the cleanup of a failed or
    preempted job cannot delete what its retry resumes from; "" turns checkpointing off."""
    checkpointing = config["checkpointing"]
    return f"{checkpointing['dir']}/{run}" if checkpointing["enabled"] else ""


def train_retries(config: dict, main_process: bool) -> int:
    """Retries of a training job, counted by the main Snakemake process only. Inside a Slurm job
    the executor's inner `snakemake --execute` also honours a rule's `retries:` (it overrides the
    `--retries 0` it is given; snakemake-executor-plugin-slurm issue #284) and would rerun the
    trainer in the same allocation, whose time limit the USR1 just announced: the preempted run
    must end its job (exit 75) so the main process resubmits it as a new one."""
    return config["checkpointing"]["retries"] if main_process else 0


def slurm_extra(config: dict) -> str:
    """USR1 to the ranks (not `B:`, which signals only the batch shell) signal_lead_s seconds
    before the time limit. --requeue is not here but in the profiles (`slurm-requeue: true`): the
    executor then also leaves a NODE_FAIL job to Slurm's requeue instead of failing it and
    submitting a second job that resumes the same checkpoint directory (docs/design.md)."""
    checkpointing = config["checkpointing"]
    if not checkpointing["enabled"]:
        return ""
    return f"--signal=USR1@{checkpointing['signal_lead_s']}"


def array_jobs_refusal(workflow) -> str | None:
    """One line refusing snakemake-executor-plugin-slurm's array mode for the launch rules, else
    None. The plugin submits every task of an array with the FIRST job's nodes, tasks, GPUs and
    time limit, wrong for every other run. Snakemake has no public API for executor settings:
    `workflow.executor_settings` (set before `onstart:`) is read defensively, and an executor
    without the setting (local, jobstep) is fine. `scalestudy launch` refuses array tasks too."""
    setting = getattr(getattr(workflow, "executor_settings", None), "array_jobs", None)
    named = {rule.strip() for rule in str(setting or "").replace(";", ",").split(",")}
    if not named & {*LAUNCH_RULES, "all"}:
        return None
    return (
        f"slurm-array-jobs={setting!r} would submit training runs as one Slurm array with the "
        "first run's nodes, GPUs and time limit: take train, profile_capture, profile_ncu and "
        "`all` out of --slurm-array-jobs (slurm-array-jobs: in the profile)"
    )


# Under Slurm a job's own snakemake reads the config files again when the job starts, maybe
# hours after the main snakemake submitted it with the nodes, GPUs and time limit of the config
# as it was then: an edited config trained other settings (more epochs, another batch) under
# those limits, and a run taken out of the config failed in Snakemake's words. Before its first
# job the main snakemake writes what each launch job runs, a digest per job, to a file whose
# path its jobs inherit (sbatch --export=ALL, the plugin's default): the digests themselves in
# one variable passed Linux's 128 KiB limit on one (MAX_ARG_STRLEN) near 2,400 jobs, and every
# process the snakemake started then failed (E2BIG). The job's snakemake computes its own
# digests and stops on a difference (launch_plan_changes).
PLANNED_ENV = "SCALESTUDY_PLANNED_LAUNCHES"  # the absolute path of the plans file
PLANS_DIR = Path(".snakemake") / "scalestudy"  # in the working directory, which jobs share


def _digest(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def launch_plans(
    config: dict, runs: dict[str, dict], profiled: dict[str, dict], only: set | None = None
) -> dict:
    """'rule:run' -> a digest of what that launch job runs, from the config: the trainer's (or
    the profiler's) flags, the ranks' layout, the container, the venv's training software
    (software_stack: a job's snakemake records the main process's, so a torch upgraded while
    jobs wait in the queue trained them on a build the study lists as the other), the dataset,
    the profiling tool's settings. Not its threads (the local executor's cores) nor its
    resources: a changed memory request does not change what runs. `only`: the runs to digest
    (a job's own), else all."""
    hardware, profiling_config = config["hardware"], config["profiling"]
    shared = [container_flags(config), software_stack(config), prepared_data(config)]
    if only is not None:
        runs = {r: row for r, row in runs.items() if r in only}
        profiled = {r: row for r, row in profiled.items() if r in only}

    def launch(row: dict) -> list:
        return [launch_layout(row, hardware), *shared]

    plans = {f"train:{r}": _digest([trainer_args(row), *launch(row)]) for r, row in runs.items()}
    for run, row in profiled.items():
        base = [profiling.profile_flags(row, profiling_config), *launch(row)]
        plans[f"profile_capture:{run}"] = _digest([*base, profiling.tool_settings(config)])
        ncu = [profiling.ncu_settings(profiling_config), hardware["device"]]
        plans[f"profile_ncu:{run}"] = _digest([*base, *ncu])
    return plans


def write_launch_plans(plans: dict[str, str], directory: str | Path = PLANS_DIR) -> str:
    """Write launch_plans atomically to `directory`, named by their content (a rerun with the
    same config reuses the file, and one of another config never replaces a file that queued
    jobs read); returns its absolute path, for PLANNED_ENV."""
    text = json.dumps(plans, sort_keys=True, separators=(",", ":"))
    path = (
        Path(directory).resolve()
        / f"launch-plans-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    )
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_text(path, text)
    return str(path)


def read_launch_plans(path: str | None) -> dict | None:
    """The plans the main snakemake wrote (PLANNED_ENV's file), None without one: a job not
    started by this workflow's snakemake, or a file gone or unreadable (nothing compared)."""
    if not path:
        return None
    try:
        plans = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return plans if isinstance(plans, dict) else None


def target_jobs(argv: list[str]) -> list[tuple[str, str | None]]:
    """(rule, run) of each job a job's snakemake runs, from its command line: Snakemake's
    `--target-jobs RULE:KEY=VALUE,... [...]` (how every executor starts a job's snakemake;
    its settings object is filled only after the Snakefile is read). [] in the main snakemake.
    """
    found: list[tuple[str, str | None]] = []
    taking = False
    for arg in argv:
        if arg.startswith("--target-jobs="):
            values, taking = [arg.split("=", 1)[1]], False
        elif arg == "--target-jobs":
            taking = True
            continue
        elif taking and not arg.startswith("-"):
            values = [arg]
        else:
            taking = False
            continue
        for value in values:
            rule, _, wildcards = value.partition(":")
            pairs = dict(p.split("=", 1) for p in wildcards.split(",") if "=" in p)
            found.append((rule, pairs.get("run")))
    return found


def launch_plan_changes(before: dict | None, plans: dict[str, str], targets: Iterable) -> str:
    """A job's snakemake: one line when a launch job it runs (`targets`: (rule, run) pairs) would
    run otherwise than the main snakemake planned it (`before`: read_launch_plans; `plans`:
    launch_plans of the config now), else "". Nothing is compared without the main snakemake's
    plans or for another rule."""
    if not before:
        return ""
    changed = [
        f"{rule} of run {run}" + ("" if f"{rule}:{run}" in plans else " (no longer in it)")
        for rule, run in targets
        if f"{rule}:{run}" in before and before[f"{rule}:{run}"] != plans.get(f"{rule}:{run}")
    ]
    if not changed:
        return ""
    return (
        "the study config or the venv's training software (torch, torchvision, triton, "
        f"nvidia-*) changed after snakemake submitted this job: {', '.join(changed)} "
        "would now run other settings than the job was planned and given its nodes, GPUs and "
        "time limit for. Stop the snakemake that submitted it (Ctrl-C) and start it again: it "
        "plans every job with the config as it is now"
    )


def multi_node_refusal(runs: dict[str, dict], env) -> str | None:
    """Why a run wider than one node cannot start here, or None; asked by the Snakefile's
    onstart of the local executor only. It starts a training job on this host, where
    `scalestudy launch` reaches other nodes only through srun inside a Slurm allocation:
    outside one, every such run failed in its job, and was retried; inside one, so did every
    run wider than the allocation's nodes (SLURM_JOB_NUM_NODES: srun "Only allocated 1 nodes
    asked for 2")."""
    if "SLURM_JOB_ID" in env:
        allocated = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
        if not allocated.isdigit():
            return None
        wide = [(run, row) for run, row in runs.items() if int(row["nodes"]) > int(allocated)]
        if not wide:
            return None
        run, row = wide[0]
        most = max(int(r["nodes"]) for _, r in wide)
        return (
            f"{len(wide)} run(s) need more nodes than this Slurm allocation (job "
            f"{env['SLURM_JOB_ID']}) has, {allocated} (e.g. {run}: world size "
            f"{row['world_size']} on {row['nodes']} nodes of hardware.gpus_per_node "
            f"{row['ranks_per_node']}): srun cannot start them in it; allocate {most} nodes "
            f"(salloc -N {most}), submit with `snakemake --profile profiles/slurm`, or keep every "
            f"world size within {int(allocated) * int(row['ranks_per_node'])} ranks"
        )
    wide = [(run, row) for run, row in runs.items() if int(row["nodes"]) > 1]
    if not wide:
        return None
    run, row = wide[0]
    return (
        f"{len(wide)} run(s) need more than one node (e.g. {run}: world size "
        f"{row['world_size']} on {row['nodes']} nodes of hardware.gpus_per_node "
        f"{row['ranks_per_node']}), and this local run has no Slurm allocation to reach them: "
        "submit with `snakemake --profile profiles/slurm`, run inside `salloc`, or keep every "
        "world size within one node"
    )


def optional_benchmarks(
    runs: Iterable[str], benchmark: str, output: str, exists: Callable[[str], bool] = os.path.exists
) -> list[str]:
    """The job benchmarks (`benchmark`: train's pattern, benchmarks/train/{run}.tsv) a rule that
    reads them where they exist (the proposal's start-up calibration, as `scalestudy plan`
    does: study/estimate.py) names as inputs: a run's where the file exists (a new timing reruns
    the rule) or where the run's `output` (its metrics.json) does not (it is to train, and the
    rule must wait for its timing). A benchmark file is an output of training: asked for every
    run, a finished run whose file was deleted or never copied was trained again (its
    metrics.json replaced) to build a document that does without it."""
    wanted = []
    for run in runs:
        path = benchmark.format(run=run)
        if exists(path) or not exists(output.format(run=run)):
            wanted.append(path)
    return wanted


def analysis_flags(config: dict) -> list[str]:
    """`scalestudy analyze` flags: the report targets, the node size and the study's name (the
    reproduce command is the rule's resource: how the study was named changes no number)."""
    targets = config["report"]["targets"]
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in targets.items()]
    flags += [f"--gpus-per-node={config['hardware']['gpus_per_node']}"]
    return flags + [f"--study={config['study']}"]
