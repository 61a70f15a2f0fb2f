"""`scalestudy inventory --out results/system/<name>.json`: what the allocation runs on.

GPU model, driver, CUDA, NCCL, torch, `nvidia-smi topo -m`, CPU, network interfaces (with speed and
the RDMA devices: InfiniBand or RoCE, each port's rate and state), Slurm version and job, container
digest, hostname, time. Every probe is independent, each command it runs bounded (10 s; torch's
versions are read in this process): a tool that is absent is recorded as "absent", a failing one as
"error: ...", so the inventory never fails a job (only `scalestudy inventory --image` refuses an
image it cannot read). The Slurm job's node list, partition, node count and GPUs come from the
environment, else from `scontrol -d show job` (see SLURM_FIELDS). Every training job writes one
before its ranks start (results/system/<run>.json, rule train: on Slurm, on the first node of the
job's allocation) and `scalestudy profile capture` one per profiling job
(results/system/profile/<run>.json).

It is taken where the ranks run (`for_job`). Snakemake's local executor in `salloc`'s shell
runs the rule on the submit host (salloc's shell stays there unless the site sets
LaunchParameters=use_interactive_step), while `scalestudy launch` srun's the ranks onto the
allocation's nodes: the inventory recorded the login node's GPUs, CPU and network as the run's.
Inside a Slurm job, outside a step (no SLURM_STEP_ID) and on none of its nodes (neither
SLURMD_NODENAME nor the hostname in its node list, `scontrol show hostnames`), it is collected
by `srun --overlap` on the job's first node (beside the running steps, never waiting for their
CPUs or GPUs) and says so ("collected_through"). Where srun fails this host's inventory is
written with a "warning" naming it, and the log says it too. "slurm_node" is SLURMD_NODENAME,
the node as Slurm names it (what the ranks' hostnames are).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from scalestudy import files, hardware, log, vocab
from scalestudy.errors import ScalestudyError

logger = log.get(__name__)

ABSENT = "absent"
# where the network devices are read (tests point them elsewhere; the CPU's model: hardware.py)
SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")


def _run(argv: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess | str:
    """The finished command, or "absent" when it is not installed, "error: ..." when it could
    not run."""
    if shutil.which(argv[0]) is None:
        return ABSENT
    try:
        # a tool may print bytes that are not UTF-8 (a Latin-1 directory in scontrol's WorkDir,
        # a vendor's (R) in lscpu): a strict decode raised UnicodeDecodeError out of the job
        return subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"


def _said(text: str) -> str:
    """A tool's output on one line, its end: a Python tool's cause is its traceback's last."""
    return " / ".join(x.strip() for x in text.splitlines() if x.strip())[-500:]


def _cmd(argv: list[str], timeout: float = 10.0) -> str:
    """Output of a command; "absent" when it is not installed, "error: ..." when it fails."""
    proc = _run(argv, timeout)
    if isinstance(proc, str):
        return proc
    if proc.returncode != 0:
        return f"error: exit {proc.returncode}: {_said(proc.stderr or proc.stdout)}"
    return proc.stdout.strip()


GPU_KEYS = ("index", "name", "driver_version", "memory_total_mib", "pci_bus_id", "serial")


def _gpus() -> dict:
    """{"gpus": nvidia-smi's GPUs}: the GPUs it listed are kept when it exits non-zero after
    them (14: a corrupted infoROM, a warning), the exit and its other lines in "gpus_warning"."""
    proc = _run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,driver_version,memory.total,pci.bus_id,serial",  # GPU_KEYS
            "--format=csv,noheader,nounits",
        ]
    )
    if isinstance(proc, str):
        return {"gpus": proc}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    rows = [line for line in lines if len(line.split(",")) == len(GPU_KEYS)]
    gpus = [dict(zip(GPU_KEYS, (c.strip() for c in r.split(",")), strict=True)) for r in rows]
    if proc.returncode == 0:
        return {"gpus": gpus}
    said = _said("\n".join([*(x for x in lines if x not in rows), proc.stderr]))
    if not gpus:
        return {"gpus": f"error: exit {proc.returncode}: {said}"}
    return {"gpus": gpus, "gpus_warning": f"nvidia-smi exit {proc.returncode}: {said}"}


def _torch() -> dict:
    """torch's version, the CUDA it was built for (cuda_runtime: the same, recorded only where
    a GPU is usable: torch has no public call for the runtime loaded), and the NCCL and cuDNN
    in use:
    "absent" without a usable GPU (a CPU node: the wheel's bundled libraries are not in use),
    "error: ..." where a probe fails (torch refuses a cuDNN other than its build's, from a
    `module load` first on LD_LIBRARY_PATH: that failed the job before a launch that would
    have run)."""
    try:
        import torch
    except ImportError:
        return {"torch": ABSENT}
    except Exception as exc:  # torch re-raises a library's OSError it cannot load (a libcudnn)
        return {"torch": f"error: {exc}"}
    info = {"torch": torch.__version__, "torch_built_for_cuda": torch.version.cuda or ABSENT}
    gpu = torch.cuda.is_available()
    info["cuda_runtime"] = (torch.version.cuda or ABSENT) if gpu else ABSENT
    try:
        v = torch.cuda.nccl.version() if gpu else None
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else (str(v) if v else ABSENT)
    except Exception as exc:
        info["nccl"] = f"error: {exc}"
    try:
        usable = gpu and torch.backends.cudnn.is_available()
        info["cudnn"] = str(torch.backends.cudnn.version()) if usable else ABSENT
    except Exception as exc:
        info["cudnn"] = f"error: {exc}"
    return info


def _read(path: Path) -> str:
    """A kernel file's text; a byte that is not UTF-8 (a vendor string, a device name) becomes
    U+FFFD instead of a UnicodeDecodeError that failed the job, as the tools' output does."""
    return path.read_text(errors="replace")


def _cpu() -> dict:
    """The CPU: its model from /proc/cpuinfo's "model name", else lscpu's "Model name" (an
    aarch64 cpuinfo, e.g. a Grace CPU's, has no such line: the inventory of an ARM node had no
    "model" at all), else "absent" (not platform.processor(), `uname -p`: the architecture,
    already the "machine")."""
    lscpu = _cmd(["lscpu"])
    model = hardware.cpu_model(lambda: lscpu)
    return {
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "model": model or ABSENT,
        "lscpu": lscpu,
    }


def _network() -> list[dict]:
    out = []
    base = SYS_NET
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        entry = {"name": dev.name}
        for key in ("operstate", "speed", "mtu", "address"):
            try:
                entry[key] = _read(dev / key).strip()
            except OSError:
                entry[key] = ABSENT
        out.append(entry)
    ib = SYS_IB
    for dev in sorted(ib.iterdir()) if ib.is_dir() else []:
        # an RDMA device: InfiniBand, or RoCE (its ports' link layer Ethernet); a port's state
        # says whether NCCL can use it (DOWN: NCCL falls back to sockets)
        entry = {"name": dev.name, "type": "infiniband"}
        for port in sorted((dev / "ports").glob("*")):
            for key in ("rate", "state", "link_layer"):
                with contextlib.suppress(OSError):
                    entry[f"port{port.name}_{key}"] = _read(port / key).strip()
            if entry.get(f"port{port.name}_link_layer") == "Ethernet":
                entry["type"] = "roce"
        out.append(entry)
    return out


def collect(image: str | None = None) -> dict:
    """The inventory of this host and allocation (see the module docstring); `image`: the
    Apptainer image the ranks run in, whose digest is recorded."""
    return {
        "format": "scalestudy-inventory-1",
        "hostname": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME") or ABSENT,
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "os": platform.platform(),
        "python": platform.python_version(),
        "software_of": _software_of(image or os.environ.get(vocab.CONTAINER_DIGEST_ENV)),
        **_gpus(),
        "nvidia_smi_topo": _cmd(["nvidia-smi", "topo", "-m"]),
        "nvidia_smi_version": _cmd(["nvidia-smi", "--version"]),
        **_torch(),
        "nsys": _cmd(["nsys", "--version"]),
        "ncu": _cmd(["ncu", "--version"]),
        "cpu": _cpu(),
        "network": _network(),
        "slurm_version": _cmd(["sinfo", "--version"]),
        "slurm": slurm_job(dict(os.environ)),
        "container_digest": _digest(image),
        "apptainer": _cmd(["apptainer", "--version"]),
    }


def _software_of(container: str | None) -> str:
    """Whose python, torch, CUDA, NCCL and cuDNN the inventory records: those of the Python it
    runs in, on the host, also in a container study (`container`: the image, or its digest,
    the ranks run in), whose ranks run the image's (each run's metrics.json records those, and
    the report's software table reads them)."""
    where = f"this host's Python ({sys.executable})"
    if not container:
        return where
    return (
        f"{where}, not the image's the ranks run in (container_digest): each run's metrics.json "
        "records the image's torch, CUDA and NCCL"
    )


SRUN_TIMEOUT_S = 300.0  # the step's start, and collect()'s probes (10 s each) on the node


def for_job(image: str | None = None, env: Mapping[str, str] | None = None) -> dict:
    """collect(image) where the job's ranks run: on this host, or, where this host is not a
    node of the Slurm job it runs in (off_job_nodes), through srun on the job's first node
    (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    elsewhere = off_job_nodes(env)
    if elsewhere is None:
        return collect(image)
    nodes, nodelist = elsewhere
    here = socket.gethostname()
    job = f"Slurm job {env['SLURM_JOB_ID']} ({nodelist})"
    code = "import json, sys; from scalestudy.jobs import inventory; "
    code += "json.dump(inventory.collect(sys.argv[1] or None), sys.stdout)"
    # --overlap: beside the steps the job runs (other runs' ranks), never waiting for their
    # CPUs or GPUs; sys.executable on the node, as launch's srun assumes (a shared install)
    argv = ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={nodes[0]}"]
    out = _cmd([*argv, sys.executable, "-c", code, image or ""], timeout=SRUN_TIMEOUT_S)
    try:
        info = json.loads(out) if out != ABSENT and not out.startswith("error:") else out
    except ValueError:
        info = f"error: not an inventory: {out[:300]!r}"
    if isinstance(info, dict):
        info["collected_through"] = f"srun on {nodes[0]}: {here} is not a node of {job}"
        return info
    info = collect(image)
    info["warning"] = (
        f"{here} is not a node of {job}, where the ranks run, and srun on {nodes[0]} failed "
        f"({'srun: absent' if out == ABSENT else out}): these GPUs, CPU and network are {here}'s"
    )
    logger.warning(f"WARNING inventory: {info['warning']}")
    return info


def off_job_nodes(env: Mapping[str, str]) -> tuple[list[str], str] | None:
    """The nodes of the Slurm job this process runs in (and its node list as Slurm writes it)
    where it runs on none of them (salloc's shell on the submit host); None outside Slurm, in a
    task of a step (SLURM_STEP_ID), on one of them, or where the nodes are unknown."""
    if not env.get("SLURM_JOB_ID") or env.get("SLURM_STEP_ID"):
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or slurm_job(dict(env))["SLURM_JOB_NODELIST"]
    shown = _cmd(["scontrol", "show", "hostnames", nodelist]) if nodelist != ABSENT else ABSENT
    if shown == ABSENT or shown.startswith("error:") or not shown.split():
        return None  # unknown: taken here, as before (its hostname and slurm fields say where)
    nodes = shown.split()
    host = socket.gethostname()
    # SLURMD_NODENAME: the batch step's and a task's node, which may differ from the hostname
    here = {env.get("SLURMD_NODENAME"), host, host.split(".")[0]}
    return None if here & set(nodes) else (nodes, nodelist)


# The job's fields, as Slurm names them in a task's environment. The in-job Snakemake executor
# (snakemake-executor-plugin-slurm-jobstep 0.6.1) strips every SLURM_* variable but the job id,
# cluster name, submit dir/host and array ids from the rule's shell, so inside the workflow the
# rest comes from `scontrol -d show job $SLURM_JOB_ID` (slurm_job).
SLURM_FIELDS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_PARTITION",
    "SLURM_NNODES",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_CLUSTER_NAME",
)
# `scontrol show job` key of each field (the cluster name is not among them)
SCONTROL_KEYS = {
    "SLURM_JOB_ID": "JobId",
    "SLURM_JOB_NODELIST": "NodeList",
    "SLURM_JOB_PARTITION": "Partition",
    "SLURM_NNODES": "NumNodes",
}
# `-d` detail of a node's allocation: GRES=gpu[:type]:<count>(IDX:<indices>), e.g.
# `GRES=gpu:a100:4(IDX:0-3)`, one entry per GPU type, comma-separated
# (`gpu:a100:4(IDX:0-3),gpu:v100:2(IDX:4-5)`); older Slurm wrote no count (`GRES=gpu(IDX:5)`,
# `gpu:3090(IDX:0,3)`: a type, or the key GRES_IDX); empty on a node without GPUs
GPU_GRES = re.compile(r"(?:^|,)gpu(?::([^:(,\s]+))?(?::(\d+))?\(IDX:([^)]*)\)")


def slurm_job(env: dict[str, str]) -> dict[str, str]:
    """SLURM_FIELDS of this job: the environment's values, the missing ones from `scontrol -d
    show job` when a job id is known; a field neither has is "absent", and a failing scontrol
    is recorded under "scontrol"."""
    found = {k: env.get(k, ABSENT) for k in SLURM_FIELDS}
    # the job's node count: in a step (srun --overlap, srun --pty bash) SLURM_NNODES is the
    # step's, SLURM_JOB_NUM_NODES the job's everywhere (as study/resources.py reads it)
    found["SLURM_NNODES"] = env.get("SLURM_JOB_NUM_NODES") or found["SLURM_NNODES"]
    job_id = env.get("SLURM_JOB_ID")
    if not job_id or ABSENT not in found.values():
        return found
    shown = _cmd(["scontrol", "-d", "show", "job", job_id])
    if shown == ABSENT or shown.startswith("error:"):
        return {**found, "scontrol": shown}
    from_slurm = scontrol_job_fields(shown)
    return {k: v if v != ABSENT else from_slurm.get(k, ABSENT) for k, v in found.items()}


def scontrol_job_fields(text: str) -> dict[str, str]:
    """SLURM_FIELDS from the text of `scontrol -d show job <id>` (one job; multi-line or -o).
    GPUs are those of the first node's allocation (the batch host, where this runs), every gpu
    entry of its GRES summed: their count and indices as SLURM_GPUS_ON_NODE / SLURM_JOB_GPUS
    write them ("4", "0,1,2,3"). The count is that of the indices where they are a list of
    numbers (`gpu:3090(IDX:0,3)` is 2 GPUs of type 3090, not 3090 GPUs), else the one written.
    Only the first entry was read: `gpu:a100:4(IDX:0-3),gpu:v100:2(IDX:4-5)` gave 4 GPUs."""
    pairs: dict[str, str] = {}
    for key, value in re.findall(r"(?:^|\s)([A-Za-z_/:]+)=(\S*)", text):
        pairs.setdefault(key, value)  # the first: the job's own, then the first node's detail
    fields = {env: pairs[key] for env, key in SCONTROL_KEYS.items() if pairs.get(key)}
    entries = GPU_GRES.findall(pairs.get("GRES") or pairs.get("GRES_IDX") or "")
    counts: list[int | None] = []
    ids: list[str] = []
    for kind, count, spec in entries:
        indices = _indices(spec)
        if indices is not None:
            counts.append(len(indices))
        elif count:
            counts.append(int(count))
        else:  # gpu:4(IDX:N/A): a count without a type, else nothing says how many
            counts.append(int(kind) if kind.isdigit() else None)
        # as Slurm wrote them where they are no list of numbers (recorded, not guessed)
        ids.append(spec if indices is None else ",".join(map(str, indices)))
    if entries:
        if None not in counts:
            fields["SLURM_GPUS_ON_NODE"] = str(sum(counts))
        fields["SLURM_JOB_GPUS"] = ",".join(filter(None, ids))
    return fields


def _indices(spec: str) -> list[int] | None:
    """`0-2,5` -> [0, 1, 2, 5]; None for text that is no such list (`N/A`)."""
    out: list[int] = []
    try:
        for part in filter(None, spec.split(",")):
            first, _, last = part.partition("-")
            out.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        return None
    return out


def _digest(image: str | None) -> str:
    """sha256 of the image file; else what the launcher exported; else absent."""
    if image:
        from scalestudy.jobs.container_exec import image_digest

        try:
            return image_digest(image)
        except OSError as exc:
            return f"error: {exc}"
    return os.environ.get(vocab.CONTAINER_DIGEST_ENV) or ABSENT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write (atomically)")
    parser.add_argument("--image", default=None, help="the Apptainer image of the run, if any")


def write_for_job(out: str | os.PathLike, image: str | None = None) -> dict:
    """for_job(image) written to `out` (atomically) and said in the log: `scalestudy inventory`
    and `scalestudy launch --inventory` (the rule train's, with the image's digest in
    CONTAINER_DIGEST_ENV: the image read once for the command and the record)."""
    info = for_job(image)
    files.write_json(out, info)
    gpus = info["gpus"]
    what = f"{len(gpus)} GPU(s)" if isinstance(gpus, list) else f"GPUs: {gpus}"
    logger.info(f"inventory of {info['hostname']}: {what}, torch {info['torch']} -> {out}")
    if info.get("gpus_warning"):
        logger.warning(f"WARNING {info['gpus_warning']}")
    return info


def run(args: argparse.Namespace) -> int:
    # the run's image replaced by its JSON (`--out X.sif --image X.sif`), said done
    files.check_distinct({"--out": args.out}, {"--image": args.image}, ScalestudyError)
    if args.image:
        # typed by hand: a mistyped image is one line, exit 2 (it was an "error: ..." digest in
        # the record and exit 0); the digest then goes where launch puts it, the image read once
        from scalestudy.jobs.container_exec import image_digest

        os.environ[vocab.CONTAINER_DIGEST_ENV] = image_digest(args.image)
    write_for_job(args.out)
    return 0
