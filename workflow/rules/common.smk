# Config checks, the run table and the input/param functions of the rules. The logic lives in
# the scalestudy package (studyconfig.py, matrix.py), unit-tested there.
import sys

from snakemake.exceptions import WorkflowError

try:
    from scalestudy import matrix, studyconfig
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
    for name in ("atomic", "config", "data", "dist", "launch", "models", "train")
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


# --- fault tolerance (scalestudy.checkpoint): checkpoints live outside the declared outputs, so
# the cleanup of a failed or preempted job cannot delete what its retry resumes from
CHECKPOINTING = config["checkpointing"]
TRAINER_SOURCES.append("src/scalestudy/checkpoint.py")  # imported by the trainer


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


def get_slurm_extra(wildcards):
    """USR1 to the ranks (not `B:`, which signals only the batch shell) signal_lead_s seconds
    before the time limit; --requeue lets Slurm requeue the job after a node failure."""
    if not CHECKPOINTING["enabled"]:
        return ""
    return f"--signal=USR1@{CHECKPOINTING['signal_lead_s']} --requeue"
