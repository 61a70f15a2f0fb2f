# Config checks, the run table and the input/param functions of the rules. The logic lives in
# the scalestudy package (studyconfig.py, matrix.py), unit-tested there.
import os
import sys

from snakemake.exceptions import WorkflowError

try:
    from scalestudy.results import build_pdf as latex
    from scalestudy.results import plot as plots
    from scalestudy.errors import PlanError
    from scalestudy.study import config as studyconfig
    from scalestudy.study import plan, profiling
    from scalestudy.study import runs as matrix
except ImportError as exc:
    raise WorkflowError(
        f"cannot import the scalestudy package ({exc}): run `pip install -e .` in this "
        "repository (see README.md), then run snakemake from that environment"
    )

config = studyconfig.validate(config)
RUNS = {row["run"]: row for row in matrix.build_run_table(config)}
DATA_DIR = config["data_dir"]
CONTAINER = config["container"]

# Files whose change reruns training: Snakemake does not track modules imported by a command.
# Inputs smaller than 1 MB are checksummed, so touching a file without changing it reruns nothing.
TRAINER_SOURCES = [
    f"src/scalestudy/{name}.py"
    for name in (
        "atomic",
        "checkpoint",
        "config",
        "data",
        "dist",
        "launch",
        "models",
        "train",
    )
]


wildcard_constraints:
    run=r"[A-Za-z0-9_.\-]+",
    dataset=r"cifar10|mnist|synthetic",


localrules:
    all,
    matrix,
    prepare_data,
    collect,
    build_container,
    profile_parse,
    profile_collect,
    profile_collect_ncu,
    analyze,
    plot,
    render_report,
    paper_pdf,


onstart:
    # A GPU study run by the local executor on a host without CUDA would fail run after run:
    # stop before the first job (dry-runs never reach onstart, so planning still works).
    if config["hardware"]["device"] == "cuda" and workflow.local_exec:
        import torch

        if not torch.cuda.is_available():
            sys.exit(
                "This study asks for GPUs (hardware.device: cuda) but this machine has no CUDA "
                "device. Run the CPU demo study instead: `snakemake --configfile "
                "config/demo.yaml`, or submit to a cluster: `snakemake --executor slurm -j 20`."
            )


def get_run(wildcards):
    return RUNS[wildcards.run]


def get_train_flags(wildcards):
    """`scalestudy train` flags of the run (config values: each shell-quoted by :q)."""
    return matrix.trainer_args(get_run(wildcards))


def get_layout(wildcards):
    """How the ranks are placed; a change reruns the run (it is a different experiment)."""
    row = get_run(wildcards)
    return {
        "nodes": row["nodes"],
        "ranks_per_node": row["ranks_per_node"],
        "cpus_per_rank": config["hardware"]["cpus_per_rank"],
    }


def get_prepared_data(wildcards):
    return {
        "data": f"{DATA_DIR}/{config['dataset']}/data.pt",
        "meta": f"{DATA_DIR}/{config['dataset']}/meta.json",
    }


def get_prepare_flags(wildcards):
    if wildcards.dataset != "synthetic":
        return []
    sizes = config["synthetic"]
    return ["--num-train", sizes["num_train"], "--num-test", sizes["num_test"]]


def get_container_image(wildcards):
    return [CONTAINER["image"]] if CONTAINER["enabled"] else []


def get_container_flags(wildcards):
    if not CONTAINER["enabled"]:
        return []
    gpu = ["--gpu"] if config["hardware"]["device"] == "cuda" else []
    return ["--container", CONTAINER["image"], *gpu]


def get_inventory_flags(wildcards):
    """The image whose digest the system inventory records (none without a container)."""
    return ["--image", CONTAINER["image"]] if CONTAINER["enabled"] else []


def get_container_sources(wildcards):
    """What goes into the image: its recipe and the installed package."""
    return [CONTAINER["definition"], "pyproject.toml", *TRAINER_SOURCES]


def get_run_table_digest(wildcards):
    """The run table's content as a param: any change to the study rewrites runs.tsv."""
    return matrix.table_digest(list(RUNS.values()))


# --- Slurm resources of one training job (the local executor uses threads only)
def get_mpi(wildcards):
    # the executor refuses MPI jobs of one task; a 1-rank run is a plain job (launch.py)
    return "srun" if get_run(wildcards)["world_size"] > 1 else ""


def get_nodes(wildcards):
    return get_run(wildcards)["nodes"]


def get_tasks_per_node(wildcards):
    """--ntasks-per-node for multi-rank nodes; the plugin wants it > 1, else `tasks`."""
    row = get_run(wildcards)
    return row["ranks_per_node"] if row["ranks_per_node"] > 1 else 0


def get_tasks(wildcards):
    row = get_run(wildcards)
    return row["world_size"] if row["ranks_per_node"] == 1 else 0


def get_gres(wildcards):
    row = get_run(wildcards)
    return f"gpu:{row['ranks_per_node']}" if row["device"] == "cuda" else ""


def get_mem_mb(wildcards):
    # sbatch --mem is per node
    return config["hardware"]["mem_mb_per_rank"] * get_run(wildcards)["ranks_per_node"]


def get_threads(wildcards):
    # locally: the cores the run occupies, so the local scheduler never oversubscribes
    return get_run(wildcards)["world_size"] * config["hardware"]["cpus_per_rank"]


# --- profiling (workflow/rules/profile.smk): chosen runs again, for a short window, in their own
# jobs and directories; the choice and the window flags live in scalestudy.study.profiling.
PROFILING = config["profiling"]
PROFILED = {
    row["run"]: row for row in profiling.profiled_runs(config, list(RUNS.values()))
}
NCU = (
    PROFILING["ncu"]["enabled"] is not False and config["hardware"]["device"] == "cuda"
)


def get_profile_targets(wildcards):
    """The merged profile CSVs for `rule all`; none when profiling is off."""
    if not PROFILED:
        return []
    targets = ["results/csv/profile_kernels.csv", "results/csv/profile_ranges.csv"]
    return targets + (["results/csv/profile_ncu.csv"] if NCU else [])


def get_profile_flags(wildcards):
    """The run's trainer flags, then the window's (argparse: the last value of a flag wins)."""
    row = get_run(wildcards)
    window = profiling.window_flags(row, PROFILING["start_step"], PROFILING["steps"])
    return [*matrix.trainer_args(row), *(x for kv in window.items() for x in kv)]


def get_profile_tool(wildcards):
    return {
        "tool": PROFILING["tool"],
        "ranks": PROFILING["nsys_ranks"],
        "trace": PROFILING["nsys_trace"],
        "device": config["hardware"]["device"],
    }


def get_ncu_settings(wildcards):
    ncu = PROFILING["ncu"]
    return {
        "enabled": "true" if ncu["enabled"] is True else "auto",
        "top_k": ncu["top_k"],
        "skip": ncu["launch_skip"],
        "count": ncu["launch_count"],
    }


# --- analysis, plots and report (logic in scalestudy.results.analyze / plots / report / latex)
ANALYSIS_TABLES = (
    "scaling",
    "verdicts",
    "resources",
    "system",
    "targets",
    "profile_shares",
)


def get_profile_kernels(wildcards=None):
    """results/csv/profile_kernels.csv of the profiling stage (profile.smk); none when profiling
    is off: the report then says that profiling was not captured."""
    return ["results/csv/profile_kernels.csv"] if PROFILED else []


def get_figures(wildcards=None):
    """The figures this study can draw (results/plots/<name>.{png,pdf})."""
    return plots.figures(
        config["families"], config["hardware"]["device"], bool(get_profile_kernels())
    )


def get_analysis_flags(wildcards):
    targets = config["report"]["targets"]
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in targets.items()]
    flags += [f"--gpus-per-node={config['hardware']['gpus_per_node']}"]
    flags += [f"--study={config['study']}", f"--configfile={get_configfile()}"]
    return flags


def get_configfile():
    """The study file to name in the report's reproduce commands (the last --configfile)."""
    files = list(workflow.overwrite_configfiles) or ["config/config.yaml"]
    return os.path.relpath(str(files[-1]))


def get_profile_flag(wildcards):
    files = get_profile_kernels()
    return [f"--profile={files[0]}"] if files else []


def get_paper_pdf(wildcards=None):
    """reports/paper.pdf when latexmk is installed; without it only the PDF is skipped."""
    if latex.have_latexmk():
        return ["reports/paper.pdf"]
    print(f"scalestudy: {latex.MISSING}", file=sys.stderr)
    return []


# --- Node-hour plan: every run's estimated runtime (plan.py), calibrated from finished runs.
# Registered for the logger plugin (snakemake_logger_plugin_scalestudy), which prints the plan
# of the jobs a dry-run would start; the Slurm time limit of training comes from it too.
def is_local_rule(name):
    # not workflow.is_local(): a dry-run executes everything "locally", so it would call every
    # rule local; what counts is whether the rule is a declared localrule (runs on the host)
    declared = workflow.get_rule(name)
    return declared.group is None and (name in workflow._localrules or declared.norun)


# measured runs: results/csv/runs.csv + benchmarks/train (none before the first run)
try:
    MEASURED = plan.load_measured()
except PlanError as exc:
    raise WorkflowError(str(exc))
PLAN = plan.register(config, RUNS.values(), MEASURED, is_local_rule)


def get_runtime(wildcards):
    """Slurm time limit of a training job, minutes: estimate x plan.safety_factor, floored."""
    return PLAN[wildcards.run].slurm_runtime_min


def get_plan_digest(wildcards):
    """The plan's content as a param: the plan files are rewritten when an estimate changes."""
    return plan.plan_digest(list(PLAN.values()))


# --- fault tolerance (scalestudy.trainer.checkpoint): checkpoints live outside the declared outputs, so
# the cleanup of a failed or preempted job cannot delete what its retry resumes from
CHECKPOINTING = config["checkpointing"]


def get_checkpoint_dir(wildcards):
    """results/checkpoints/<run>; "" turns checkpointing off (scalestudy train --checkpoint-dir=)."""
    if not CHECKPOINTING["enabled"]:
        return ""
    return f"{CHECKPOINTING['dir']}/{wildcards.run}"


def get_checkpoint_every(wildcards):
    # a resource, not a param: params are a rerun trigger, and how often a run checkpoints
    # does not change what it measures
    return CHECKPOINTING["every_epochs"]


def get_checkpoint_keep(wildcards):
    return CHECKPOINTING["keep"]


def get_train_retries():
    """Retries of a training job, counted by the main Snakemake process only. Inside a Slurm job
    the executor's inner `snakemake --execute` also honours a rule's `retries:` (it overrides the
    `--retries 0` it is given; snakemake-executor-plugin-slurm issue #284) and would rerun the
    trainer in the same allocation, whose time limit the USR1 just announced: the preempted run
    must end its job (exit 75) so the main process resubmits it as a new one."""
    return CHECKPOINTING["retries"] if workflow.is_main_process else 0


def get_slurm_extra(wildcards):
    """USR1 to the ranks (not `B:`, which signals only the batch shell) signal_lead_s seconds
    before the time limit; --requeue lets Slurm requeue the job after a node failure."""
    if not CHECKPOINTING["enabled"]:
        return ""
    return f"--signal=USR1@{CHECKPOINTING['signal_lead_s']} --requeue"
