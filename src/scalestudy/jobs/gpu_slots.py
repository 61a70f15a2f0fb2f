"""GPU slots of one machine: local GPU runs never share a GPU.

With the local executor (`snakemake` on a GPU workstation, `cores: all`) Snakemake starts as
many training jobs as there are cores, and every rank would pick cuda:LOCAL_RANK: several runs
on the same GPUs, each one's throughput a fraction of the truth, without a warning. Slurm gives
each job its own GPUs (and launch's srun each run's step); here `scalestudy launch` does, before
it execs the ranks, and so it does inside a Slurm step for the 1-rank runs it starts directly
(snakemake in `srun --pty bash`):

- the machine's GPUs are the visible ones (CUDA_VISIBLE_DEVICES when set, else every device
  torch counts), one slot each;
- a run of W ranks waits until W slots are free, takes them all at once (all or nothing, under
  one allocation lock, so two runs can never each hold half of what both need), and its ranks
  see only those GPUs (CUDA_VISIBLE_DEVICES), as in a Slurm job;
- a slot is an flock(2) on `<lock dir>/gpu-<key>.lock`, the key one identity of the GPU
  (slot_keys): its UUID, so a study naming it "0" and one naming it "GPU-8f3e..." (or an
  abbreviation CUDA accepts) take the same slot; it was the name as written, and both trained
  on it. A MIG instance (MIG-...) is its own slot under its own UUID. The slot is taken
  exclusively (no other holder),
  then held shared by the launching process (its descriptor inherited through exec: the
  trainer of one rank, torchrun for more) and by each rank, which takes its own shared lock at
  start on the files named in SCALESTUDY_GPU_SLOT_LOCKS (files.hold_shared_locks): torchrun's
  ranks inherit no descriptor of it. An acquirer's exclusive lock fails while any holder
  lives, so the kernel frees a slot when the last of them exits, killed or not: a crashed run
  never leaves a GPU taken, and a killed launcher does not free its ranks' GPUs.

The lock directory (SCALESTUDY_GPU_SLOTS_DIR, default /tmp/scalestudy-gpu-slots) is per
machine, so runs of different Snakemake invocations and studies share the same slots.
Indices are mapped to UUIDs with `nvidia-smi --query-gpu=index,uuid,name`, whose index is the
PCI bus order. CUDA's is that order under CUDA_DEVICE_ORDER=PCI_BUS_ID; under its default,
FASTEST_FIRST, CUDA documents only that the fastest device comes first, so indices are mapped
there only where every GPU is the same model (no fastest; the order is then the PCI one, as
observed on multi-GPU nodes, not documented). Where no mapping is available (nvidia-smi absent
or failing, different models under FASTEST_FIRST, an index or UUID it does not list) a GPU is
keyed by its name as written, as before, and the "GPU slots:" line says why: a study naming it
another way could then share it. Runs naming MIG instances and runs naming their parent GPU by
index or UUID are not kept apart (CUDA picks which instance an index gets).
A run wider than the machine is refused before any job (`refusal`, through `host_refusal` in
the Snakefile's onstart) and, started by hand, by `acquire` with the same line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from scalestudy import log, vocab
from scalestudy.errors import LaunchError

logger = log.get(__name__)

DEFAULT_DIR = "/tmp/scalestudy-gpu-slots"
POLL_S = 2.0  # between tries while the slots are taken: runs last minutes, a start is seconds
SMI_TIMEOUT_S = 30.0  # nvidia-smi without persistence mode initialises every GPU: seconds each


def lock_dir(env: dict[str, str]) -> Path:
    return Path(env.get("SCALESTUDY_GPU_SLOTS_DIR") or DEFAULT_DIR)


def visible_gpus(env: dict[str, str]) -> list[str]:
    """The GPU ids ranks may use: CUDA_VISIBLE_DEVICES's entries as CUDA reads them
    (cuda_visible) when it is set, else 0..N-1 for the N devices torch counts."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return cuda_visible(env["CUDA_VISIBLE_DEVICES"])
    import torch  # only for a machine whose GPUs are not listed in the environment

    return [str(i) for i in range(torch.cuda.device_count())]


def cuda_visible(text: str) -> list[str]:
    """The devices CUDA shows for CUDA_VISIBLE_DEVICES=text: indices, or GPU-/MIG- UUIDs (the
    first entry says which), up to the first entry that is not one, and none at all when one
    is repeated. Each entry taken as written had '-1' and 'NoDevFiles' (no GPU) count as one
    GPU, '0,-1,1' (GPU 0 only) as three, and '0,0' (none) as two: a run then waited forever
    for slots, or took a slot of a GPU its ranks cannot see. Indices are read as strtoul does
    ('01' and '1gpu' are 1), so one GPU is one slot however it is written."""
    entries = [entry.strip() for entry in text.split(",")]
    uuids = entries[0][:4] if entries[0][:4] in ("GPU-", "MIG-") else ""
    ids: list[str] = []
    for entry in entries:
        if uuids:
            if not entry.startswith(uuids):
                break
            gpu = entry
        else:
            digits = re.match(r"[+-]?\d+", entry)
            if digits is None or int(digits.group()) < 0:
                break
            gpu = str(int(digits.group()))
        if gpu in ids:
            return []
        ids.append(gpu)
    return ids


def visible_setting(env: Mapping[str, str], gpus: list[str]) -> str:
    """How the GPUs `gpus` (visible_gpus(env)) came to be visible, as a message says it: the
    variable as it is set, or unset and what torch counts."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return f"CUDA_VISIBLE_DEVICES is unset and torch counts {len(gpus)}"
    return f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}"


def refusal(world_sizes: list[int], gpus: list[str], env: Mapping[str, str]) -> str:
    """One line when a run needs more GPUs than this machine shows (`gpus`: visible_gpus(env)),
    else "". With none visible it says so, not "lower the world sizes to at most 0"."""
    widest = max(world_sizes, default=0)
    if widest <= len(gpus):
        return ""
    setting = visible_setting(env, gpus)
    if not gpus:
        return (
            f"no CUDA GPU is visible on this machine ({setting}), and a cuda run of {widest} "
            f"{vocab.plural('ranks', widest)} needs {widest} {vocab.plural('GPUs', widest)}: "
            "use --device cpu (a study: hardware.device cpu), or run it on a GPU node"
        )
    return (
        f"a run of this study needs {widest} {vocab.plural('GPUs', widest)} on one machine, "
        f"and this one shows {len(gpus)} ({setting}): local GPU runs get one GPU per rank and "
        f"never share; lower the study's world sizes to at most {len(gpus)} (families.*.gpus) "
        "or run it on a cluster (`snakemake --profile profiles/slurm`)"
    )


def step_refusal(ranks: int, env: Mapping[str, str]) -> str:
    """Why a run of `ranks` ranks cannot start from this shell, a task of an srun step
    (vocab.slurm_step), "" where it can: `scalestudy launch`'s refusal in the run's job, and
    the Snakefile's onstart's before any job (it let such a study through, and every job of it
    failed, retried checkpointing.retries times). One rank runs here only as the step's one
    task; more would be a nested srun."""
    step = vocab.slurm_step(env)
    job = env.get("SLURM_JOB_ID")
    tasks = env.get("SLURM_NTASKS", "1")
    if not step or (ranks == 1 and tasks == "1"):
        return ""
    if ranks == 1:
        # the rank reads the step's SLURM_PROCID and SLURM_NTASKS (trainer/dist.py): rank 0 of
        # 2 waited out the process-group timeout for a peer nobody starts
        return (
            f"this shell is task {env.get('SLURM_PROCID', '?')} of the {tasks} tasks of step "
            f"{step} of Slurm job {job}, and a run started here would be a rank of {tasks}, "
            "waiting for the others: start the shell as one task (`srun -n 1 --pty bash`), or "
            "run from `salloc`'s own shell"
        )
    # a nested srun waits forever for the CPUs and GPUs the enclosing step holds
    return (
        f"this run needs {ranks} ranks, and this shell is already a task of step {step} of "
        f"Slurm job {job} (e.g. `srun --pty bash`), where starting them with srun would wait "
        "forever: run snakemake from the login node with the Slurm executor (--profile "
        "profiles/slurm), or from `salloc`'s own shell"
    )


def host_refusal(
    world_sizes: list[int], device: str, env: Mapping[str, str], demo: str, multi_node: str = ""
) -> str:
    """The Snakefile's onstart (local executor): one line when this host cannot run the runs
    whose launch jobs the targets may start (`world_sizes`; `device`: hardware.device), else "",
    in this order: a cuda study on a host without CUDA (`demo`: the CPU demo study's config, as
    the user would type it: a laptop's user needs that advice first, not the Slurm one), then
    `multi_node` (resources.multi_node_refusal: a run wider than one node outside an
    allocation, or than the allocation's nodes inside one), then a run wider than the GPUs
    this host shows (`refusal`).
    Inside a Slurm allocation (SLURM_JOB_ID set) this host is not judged: `scalestudy launch`
    srun's the ranks onto the allocation's nodes, whose GPUs are Slurm's (as in
    launch.hold_local_gpus). salloc's shell stays on the submit host, often without a GPU, and a
    2-node allocation's run is wider than one node: both were refused here, though the launch
    the refusal told the user to run inside salloc would have started them. A task of an srun
    step (`srun --pty bash`) is judged, as launch judges it: no run wider than one rank
    (step_refusal), and the one-rank runs on the step's own GPUs."""
    sizes = sorted(set(world_sizes), reverse=True)  # the widest run's refusal first
    nested = next((line for line in (step_refusal(w, env) for w in sizes) if line), "")
    if device != "cuda" or (env.get("SLURM_JOB_ID") and not vocab.slurm_step(env)):
        return multi_node or nested
    import torch  # only for a GPU study run here (the workflow imports this module at parse)

    if not torch.cuda.is_available():
        return (
            "This study asks for GPUs (hardware.device: cuda) but this machine has no CUDA "
            f"device. Run the CPU demo study instead: `snakemake --configfile {demo}`, or submit "
            "to a cluster: `snakemake --profile profiles/slurm`."
        )
    return multi_node or nested or refusal(world_sizes, visible_gpus(env), env)


def slot_file(directory: Path, key: str) -> Path:
    # old-style MIG ids (MIG-GPU-<uuid>/<gi>/<ci>) hold slashes
    return directory / f"gpu-{key.replace('/', '_')}.lock"


def held_files(env: dict[str, str], keys: list[str]) -> str:
    """The value of SCALESTUDY_GPU_SLOT_LOCKS for the slots `keys` (take's): their lock files,
    absolute (a rank may start elsewhere), os.pathsep between them."""
    return os.pathsep.join(str(slot_file(lock_dir(env).absolute(), key)) for key in keys)


def slot_keys(env: Mapping[str, str], gpus: list[str]) -> tuple[list[str], str]:
    """The slot key of each GPU of `gpus` (visible_gpus(env)): the GPU's UUID for an index or
    a (possibly abbreviated) GPU- UUID, a MIG- name itself; and "" or why some GPU is keyed by
    its name as written (see the module's docstring for when, and the device order)."""
    listed = _nvidia_smi_gpus(env)
    if isinstance(listed, str):
        return list(gpus), f"nvidia-smi {listed}"
    uuids = [uuid for _, uuid, _ in listed]
    order = env.get("CUDA_DEVICE_ORDER") or "FASTEST_FIRST"  # CUDA's default
    # same model everywhere: FASTEST_FIRST has no fastest, and CUDA's order is the PCI one
    pci_order = order == "PCI_BUS_ID" or len({name for *_, name in listed}) == 1
    by_index = {index: uuid for index, uuid, _ in listed} if pci_order else {}
    keys, unmapped = [], []
    for gpu in gpus:
        if gpu.startswith("GPU-"):  # CUDA takes any prefix that names one GPU
            matches = [uuid for uuid in uuids if uuid.startswith(gpu)]
            key = matches[0] if len(matches) == 1 else gpu
        elif gpu.startswith("MIG-"):
            key = gpu
        else:
            key = by_index.get(gpu, gpu)
        if key == gpu and not gpu.startswith("MIG-"):
            unmapped.append(gpu)
        keys.append(key)
    if not unmapped:
        return keys, ""
    if not pci_order and not any(g.startswith("GPU-") for g in unmapped):
        why = (
            f"CUDA_DEVICE_ORDER={order} on GPUs of different models orders CUDA's indices "
            "otherwise than nvidia-smi (set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name GPUs by UUID)"
        )
    else:
        why = f"nvidia-smi lists no GPU {','.join(unmapped)}"
    return keys, why


def _nvidia_smi_gpus(env: Mapping[str, str]) -> list[tuple[str, str, str]] | str:
    """(index, uuid, name) of each GPU nvidia-smi lists (all of the machine's: it ignores
    CUDA_VISIBLE_DEVICES), else why not, e.g. "is absent"."""
    argv = ["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"]
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        return "is absent"
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=SMI_TIMEOUT_S,
            env=dict(env),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        return f"failed: exit {proc.returncode}{': ' + said[0] if said else ''}"
    listed = []
    for line in proc.stdout.splitlines():
        fields = [field.strip() for field in line.split(",", 2)]
        if len(fields) == 3 and fields[1].startswith("GPU-"):
            listed.append((fields[0], fields[1], fields[2]))
    return listed or f"listed no GPU ({proc.stdout.strip()[:200]!r})"


def _try_take(directory: Path, gpus: list[str], keys: list[str], n: int) -> list[tuple[str, int]]:
    """Under the allocation lock: n free slots (gpus[i]'s is keys[i]'s file), locked, or none."""
    taken: list[tuple[str, int]] = []
    for gpu, key in zip(gpus, keys, strict=True):
        fd = _open_lock(slot_file(directory, key))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        taken.append((gpu, fd))
        if len(taken) == n:
            return taken
    for _, fd in taken:  # not enough: give back what was taken, all or nothing
        os.close(fd)
    return []


def acquire(n: int, env: dict[str, str], poll_s: float = POLL_S) -> list[str]:
    """take's GPU ids."""
    return take(n, env, poll_s)[0]


def take(n: int, env: dict[str, str], poll_s: float = POLL_S) -> tuple[list[str], list[str]]:
    """Wait for n free GPU slots of this machine, lock them for the life of this process and
    its exec'd successors (inheritable descriptors, shared locks: the ranks add theirs, see the
    module's docstring), and return their GPUs as CUDA_VISIBLE_DEVICES names them (the ranks'
    CUDA_VISIBLE_DEVICES) and their slot keys (held_files)."""
    gpus = visible_gpus(env)
    line = refusal([n], gpus, env)
    if line:
        raise LaunchError(line)
    keys, unkeyed = slot_keys(env, gpus)
    directory = lock_dir(env)
    try:
        shared_dir(directory)
        return _wait_for(directory, gpus, keys, n, poll_s, unkeyed)
    except OSError as exc:  # not writable (another user's), not a directory, read-only, ...
        raise LaunchError(
            f"cannot lock GPU slots in {directory} ({exc.strerror}): set "
            "SCALESTUDY_GPU_SLOTS_DIR to a directory every user of this machine can write"
        ) from exc


def shared_dir(directory: Path) -> None:
    """The lock directory, made like /tmp (every user may add files, sticky) when this creates
    it: users of one machine share its GPUs. Lock files are opened read-only (flock needs no
    write access), so one made by another user can be locked too."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):  # made by someone else meanwhile
            directory.chmod(0o1777)


def _open_lock(path: Path) -> int:
    """A lock file opened read-only, made readable by every user whatever the umask: under
    umask 077 it was 0600, and every other user got EACCES ("cannot lock GPU slots") for good,
    since the sticky directory keeps them from deleting it. An existing file is opened without
    O_CREAT: under fs.protected_regular=1 (systemd's default) O_CREAT of another user's file in
    a sticky world-writable directory is EACCES, root's too, unless the directory's owner owns
    it, so the slot of a GPU a second user had taken was refused to everyone else for good."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:  # another process made it meanwhile: open that one
                if path.is_symlink():  # a link to nothing: both opens fail again, for ever
                    raise OSError(
                        errno.ENOENT,
                        f"{path.name} is a symlink to missing {os.readlink(path)}: remove it",
                    ) from None
                continue
        with contextlib.suppress(PermissionError):  # only its owner may; another user's is theirs
            os.fchmod(fd, 0o644)
        return fd


def _wait_for(
    directory: Path, gpus: list[str], keys: list[str], n: int, poll_s: float, unkeyed: str
) -> tuple[list[str], list[str]]:
    key_of = dict(zip(gpus, keys, strict=True))
    # the slots' identity where it is not the name as written, or why a GPU has none
    keyed = f"; keyed by name as written: {unkeyed}" if unkeyed else ""
    waited = False
    while True:
        guard = _open_lock(directory / "allocate.lock")
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            taken = _try_take(directory, gpus, keys, n)
            if taken:
                for _, fd in taken:
                    # shared, so each rank can hold the slot too (files.hold_shared_locks);
                    # under the allocation lock: the conversion is not atomic, and every
                    # acquirer tries its exclusive locks only under this one
                    fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(guard)  # closing the descriptor releases the allocation lock
        if taken:
            for _, fd in taken:
                os.set_inheritable(fd, True)  # held by the trainer or torchrun after exec
            ids = [gpu for gpu, _ in taken]
            uuids = [key_of[gpu] for gpu in ids if key_of[gpu] != gpu]
            named = f" = {','.join(uuids)}" if uuids else ""
            logger.info(
                f"GPU slots: {','.join(ids)} of {','.join(gpus)}{named} ({directory}{keyed})"
            )
            return ids, [key_of[gpu] for gpu in ids]
        if not waited:
            logger.info(f"GPU slots: waiting for {n} of {len(gpus)} GPUs ({directory}{keyed})")
            waited = True
        time.sleep(poll_s)
