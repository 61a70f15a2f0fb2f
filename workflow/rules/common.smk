# Config checks, the run table, wildcard constraints and the one-line functions the rules call.
# The logic lives in the scalestudy package (study/: config, runs, profiling, plan, resources),
# unit-tested there. Nothing here prints while Snakemake parses, nor reads study data but the
# measured runs of the plan (see PLAN below).
import os
import sys
from pathlib import Path

from snakemake.logging import logger


def stop(message):
    """Refuse before any job: one line through Snakemake's logger (an error, so the dry-run's
    node-hour plan prints nothing), exit 1."""
    logger.error(message)
    sys.exit(1)


try:
    from scalestudy import log, vocab
    from scalestudy.log import (
        rule_log,
    )  # `log` inside a run: block is the rule's log file
    from scalestudy.errors import StudyConfigError, WorkdirError
    from scalestudy.jobs import container as apptainer
    from scalestudy.jobs import gpu_slots, slurm_queue
    from scalestudy.results import build_pdf as latex
    from scalestudy.results.analyze import TABLE_NAMES
    from scalestudy.results import plot as plots
    from scalestudy.results import proposal as allocation
    from scalestudy.study import config as studyconfig
    from scalestudy.study import paths, plan, profiling, resources
    from scalestudy.study import runs as matrix
except ImportError as exc:
    # the same package provides the logger plugin, which the profile names only when it exists
    stop(
        f"scalestudy: cannot import the scalestudy package ({exc}): run `bash scripts/setup.sh` "
        "(or `pip install -e .` in this repository), then snakemake from that environment"
    )

log.setup()  # scalestudy's messages: progress to stdout, problems to stderr
# Paths (study/paths.py): the repository's files from here, the study's in the working directory
REPO = Path(workflow.basedir).parent
try:
    paths.check_workdir(REPO, workflow.overwrite_configfiles)
except WorkdirError as exc:
    stop(str(exc))
# --config reaches the jobs through a shell (study/config.py): refused where it would arrive
# changed, before any job. No public API holds the arguments as typed: read defensively.
if workflow.is_main_process:
    shell_changed = studyconfig.overrides_a_shell_changes(
        getattr(getattr(workflow, "config_settings", None), "config_args", None) or []
    )
    if shell_changed:
        stop("\n".join(shell_changed))
try:  # every problem of the config, each naming key, value and what is allowed
    studyconfig.check_layered(config, REPO / "config" / "config.yaml")
    # named by the files, then the --config values they do not give (a bad override is not
    # blamed on a file): config_files.smk read the files already
    source = studyconfig.layers_source(
        ["config/config.yaml", *map(str, workflow.overwrite_configfiles or [])],
        studyconfig.config_overrides(config, CONFIG_LAYERS),
    )
    config = studyconfig.validate(
        config, schema=REPO / studyconfig.SCHEMA_RELPATH, source=source, repo=REPO
    )
except StudyConfigError as exc:
    stop(str(exc))
RUNS = {row["run"]: row for row in matrix.build_run_table(config)}
RUN_ROWS = list(RUNS.values())
DATA_DIR = config["data_dir"]
CONTAINER = config["container"]
HARDWARE = config["hardware"]
CHECKPOINTING = config["checkpointing"]
PROFILING = config["profiling"]
PROFILED = {r["run"]: r for r in profiling.profiled_runs(config, list(RUNS.values()))}
# A Slurm job's snakemake reads the config files again when the job starts: it stops where a
# launch job would run otherwise than the main snakemake submitted it (study/resources.py; the
# main one writes its plans in onstart). The job's targets are read from its command line
# (Snakemake fills its settings only after this file is read); only a launch job's snakemake
# reads the plans and digests its own runs: the one read at parse of a job.
if not workflow.is_main_process:
    launch_targets = [
        (rule, run)
        for rule, run in resources.target_jobs(sys.argv)
        if rule in resources.LAUNCH_RULES
    ]
    changed = launch_targets and resources.launch_plan_changes(
        resources.read_launch_plans(os.environ.get(resources.PLANNED_ENV)),
        resources.launch_plans(
            config, RUNS, PROFILED, only={run for _, run in launch_targets}
        ),
        launch_targets,
    )
    if changed:
        stop(f"scalestudy: {changed}")
# the node-hour plan: estimates computed on first use (the training jobs' runtime, the plan
# rule's digest), reading the measured runs (results/csv/runs.csv, benchmarks/train)
PLAN = resources.TrainingPlan(config, RUNS.values())
# The one read of study data while parsing: the main process computes the plan here, so a
# measured file it refuses (a throughput of 0, a runs.csv of an older collect) stops in one
# line before any job. Left to `runtime`, the refusal came wrapped in Snakemake's
# InputFunctionException (a traceback and another run's wildcards) on every dry-run; an input
# function cannot stop in one line (Snakemake wraps SystemExit too). Jobs' inner snakemake
# (Slurm) compute it on first use, as before.
if workflow.is_main_process:
    refusal = PLAN.refusal()
    if refusal:
        stop(f"scalestudy plan: {refusal}")
# analyze's tables, scaling first (the rules name its path apart: their --csv-dir): the names of
# the tables `scalestudy analyze` writes, not a list kept in step with them by hand
ANALYSIS_TABLES = TABLE_NAMES
# Code inputs: Snakemake does not track the modules a command imports. Inputs under 1 MB are
# checksummed, so touching a file without changing it reruns nothing.


wildcard_constraints:
    run=matrix.run_wildcard(RUNS),
    dataset="|".join(vocab.DATASETS),
    figure="|".join(plots.FIGURES),


# the same rules as scalestudy.study.resources.LOCAL_RULES (tests/test_resources.py checks)
localrules:
    all,
    matrix,
    prepare_data,
    collect,
    build_container,
    profile_parse,
    profile_ncu_kernels,
    profile_ncu_parse,
    profile_collect,
    profile_collect_ncu,
    analyze,
    plot,
    render_report,
    paper_pdf,


def get_run(wildcards):
    return RUNS[wildcards.run]


def get_train_flags(wildcards):
    return matrix.trainer_args(get_run(wildcards))


def get_profile_flags(wildcards):
    return profiling.profile_flags(get_run(wildcards), PROFILING)


def get_layout(wildcards):
    return resources.launch_layout(get_run(wildcards), HARDWARE)


def get_threads(wildcards):
    # a timed CPU run takes every core of a local run (one at a time): see launch_threads
    local_cores = workflow.cores if workflow.local_exec else None
    return resources.launch_threads(get_run(wildcards), HARDWARE, local_cores)


def get_prepared_data(wildcards):
    return resources.prepared_data(config)


def get_prepare_flags(wildcards):
    return resources.prepare_flags(config, wildcards.dataset)


def get_checkpoint_dir(wildcards):
    return resources.checkpoint_dir(config, wildcards.run)


# functions, not values: a param that names an input file is a lint ("hardcoded prefix")
def get_container_flags(wildcards):
    return resources.container_flags(config)


def get_software(wildcards):
    """The venv's torch, torchvision, triton and CUDA libraries (resources.software_stack; ""
    with the container, whose image is an input): upgrading them reruns the runs, as the
    trainer's code does. A function: the installed metadata is read when the DAG is built, once
    per process, not while this file is read."""
    return resources.software_stack(config)


def repo_file(path):
    """A file of the repository (code, template, recipe) as the rules name it (study/paths.py)."""
    return paths.repo_file(REPO, path)


def code_of(*modules):
    """Input function: the modules a job runs (paths under src/scalestudy) and every module
    they import (study/resources.py code_sources), listed when Snakemake builds the DAG.
    """
    return lambda wildcards: paths.repo_files(
        REPO, resources.code_sources(REPO, *modules)
    )


def get_trainer_sources(wildcards):
    """Input function: the trainer's sources and what they import (resources.trainer_sources),
    found when Snakemake builds the DAG, not when this file is read (once per process).
    """
    return paths.repo_files(REPO, resources.trainer_sources(REPO))


def get_wall_times(wildcards):
    """Input function: the training jobs' benchmarks the proposal calibrates from, a finished
    run's only where it exists (resources.optional_benchmarks): never a retrain for it.
    """
    return resources.optional_benchmarks(
        RUNS, rules.train.benchmark, rules.train.output.metrics
    )


def get_launch_outputs(run):
    """The files of a run's launch jobs the study asks for: training's, and the profiling jobs'
    where the run is profiled (onstart: a run with one missing may launch)."""
    launches = [rules.train]
    if run in PROFILED:
        launches.append(rules.profile_capture)
        if profiling.ncu_enabled(config):
            launches.append(rules.profile_ncu)
    return [path.format(run=run) for rule in launches for path in rule.output]


def get_plan_digest(wildcards):
    return PLAN.digest()


def get_train_retries():
    return resources.train_retries(config, workflow.is_main_process)


def get_configfile():
    """The study files and --config overrides the report's reproduce commands name (run from
    the repository root). No public API holds the overrides: read defensively."""
    overrides = getattr(getattr(workflow, "config_settings", None), "config", None)
    return paths.reproduce_configfile(
        REPO, workflow.overwrite_configfiles or [], dict(overrides or {})
    )


def get_paper_pdf(wildcards):
    """reports/paper.pdf when TeX can build it (latexmk and the packages the paper loads:
    build_pdf.tex_gaps); without them only the PDF is skipped, and the warning names them.
    """
    if not (gaps := latex.tex_gaps()):
        return ["reports/paper.pdf"]
    warning = latex.missing("reports/paper.tex", gaps)
    log.get("scalestudy.workflow").warning(f"scalestudy: {warning}")
    return []


def get_proposal_settings(wildcards):
    """The config the proposal reads (proposal.settings_json: a change reruns the proposal
    rules only)."""
    return allocation.settings_json(config)


def get_proposal_documents(wildcards):
    """The proposal's documents, their PDFs when TeX can build them; none without strong."""
    if not config["families"]["strong"]["enabled"]:
        return []
    out = ["reports/proposal.md", "reports/proposal.tex", "reports/slides.tex"]
    warn = log.get("scalestudy.workflow").warning  # each PDF not built is named
    slides = "efficiency" in FIGURES  # the slides' figure
    if not (gaps := latex.tex_gaps()):
        out.append("reports/proposal.pdf")
    else:
        for tex in ("reports/proposal.tex", "reports/slides.tex")[: 1 + slides]:
            warn(f"scalestudy: {latex.missing(tex, gaps)}")
    if latex.have_beamer() and slides:
        out.append("reports/slides.pdf")
    elif not gaps and slides:
        warn(f"scalestudy: {latex.NO_PGF}")
    return out


# Values of the study the rules use as they are (computed from the config, no I/O)
IMAGE = [CONTAINER["image"]] if CONTAINER["enabled"] else []
RUN_TABLE_DIGEST = matrix.table_digest(list(RUNS.values()))
PROFILE_TARGETS = profiling.profile_targets(config, PROFILED)
PROFILE_KERNELS = PROFILE_TARGETS[:1]  # results/csv/profile_kernels.csv, or none
PROFILE_FLAG = [f"--profile={path}" for path in PROFILE_KERNELS]
FIGURES = plots.figures(config["families"], HARDWARE["device"], bool(PROFILED))
ANALYSIS_FLAGS = resources.analysis_flags(config)
REPRODUCE = get_configfile()


# The three launch rules (train, profile_capture, profile_ncu) start a run's ranks alike: the
# same Slurm request (each adds its runtime), params and `scalestudy launch` arguments.
LAUNCH_RESOURCES = {
    **resources.launch_resources(RUNS, HARDWARE),
    # a resource, not a param (a rerun trigger), as checkpointing's: how long a hung collective
    # may wait does not change what a run measures (trainer/config.py NOT_IDENTITY)
    "pg_timeout_s": config["train"]["pg_timeout_s"],
    # the prepared set's sizes the trainer checks (resources too: they change no run's numbers)
    **resources.expected_data(config),
}
LAUNCH_PARAMS = {
    "layout": get_layout,
    "container": get_container_flags,
    "software": get_software,
}
LAUNCH_ARGS = (
    "--mpi={resources.mpi:q} --nodes {params.layout[nodes]} "
    "--ranks-per-node {params.layout[ranks_per_node]} "
    "--cpus-per-rank {params.layout[cpus_per_rank]} {params.container:q} -- "
    "{params.flags:q} --pg-timeout-s {resources.pg_timeout_s} --data-dir {params.data_dir:q} "
    "--expect-train {resources.expect_train} --expect-test {resources.expect_test}"
)


def launch_shell(command, rest):
    """The shell command of a launch rule: its command, the launch arguments, the rest."""
    return f"{command} {LAUNCH_ARGS} {rest}"
