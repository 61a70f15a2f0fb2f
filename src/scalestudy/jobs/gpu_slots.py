"""GPU slots of one machine: local GPU runs never share a GPU.

With the local executor (`snakemake` on a GPU workstation, `cores: all`) Snakemake starts as
many training jobs as there are cores, and every rank would pick cuda:LOCAL_RANK: several runs
on the same GPUs, each one's throughput a fraction of the truth, without a warning. Slurm gives
each job its own GPUs; here `scalestudy launch` does, before it execs the ranks:

- the machine's GPUs are the visible ones (CUDA_VISIBLE_DEVICES when set, else every device
  torch counts), one slot each;
- a run of W ranks waits until W slots are free, takes them all at once (all or nothing, under
  one allocation lock, so two runs can never each hold half of what both need), and its ranks
  see only those GPUs (CUDA_VISIBLE_DEVICES), as in a Slurm job;
- a slot is an flock(2) on `<lock dir>/gpu-<id>.lock`: taken exclusively (no other holder),
  then held shared by the launching process (its descriptor inherited through exec: the
  trainer of one rank, torchrun for more) and by each rank, which takes its own shared lock at
  start on the files named in SCALESTUDY_GPU_SLOT_LOCKS (files.hold_shared_locks): torchrun's
  ranks inherit no descriptor of it. An acquirer's exclusive lock fails while any holder
  lives, so the kernel frees a slot when the last of them exits, killed or not: a crashed run
  never leaves a GPU taken, and a killed launcher does not free its ranks' GPUs.

The lock directory (SCALESTUDY_GPU_SLOTS_DIR, default /tmp/scalestudy-gpu-slots) is per
machine, so runs of different Snakemake invocations and studies share the same slots.
A run wider than the machine is refused before any job (`refusal`, through `host_refusal` in
the Snakefile's onstart) and, started by hand, by `acquire` with the same line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from scalestudy import log, vocab
from scalestudy.errors import LaunchError

logger = log.get(__name__)

DEFAULT_DIR = "/tmp/scalestudy-gpu-slots"
POLL_S = 2.0  # between tries while the slots are taken: runs last minutes, a start is seconds


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


def host_refusal(
    world_sizes: list[int], device: str, env: Mapping[str, str], demo: str, multi_node: str = ""
) -> str:
    """The Snakefile's onstart (local executor): one line when this host cannot run the runs
    whose launch jobs the targets may start (`world_sizes`; `device`: hardware.device), else "",
    in this order: a cuda study on a host without CUDA (`demo`: the CPU demo study's config, as
    the user would type it: a laptop's user needs that advice first, not the Slurm one), then
    `multi_node` (resources.multi_node_refusal: a run wider than one node outside an
    allocation), then a run wider than the GPUs this host shows (`refusal`).
    Inside a Slurm allocation (SLURM_JOB_ID set) this host is not judged: `scalestudy launch`
    srun's the ranks onto the allocation's nodes, whose GPUs are Slurm's (as in
    launch.hold_local_gpus). salloc's shell stays on the submit host, often without a GPU, and a
    2-node allocation's run is wider than one node: both were refused here, though the launch
    the refusal told the user to run inside salloc would have started them."""
    if device != "cuda" or env.get("SLURM_JOB_ID"):
        return multi_node
    import torch  # only for a GPU study run here (the workflow imports this module at parse)

    if not torch.cuda.is_available():
        return (
            "This study asks for GPUs (hardware.device: cuda) but this machine has no CUDA "
            f"device. Run the CPU demo study instead: `snakemake --configfile {demo}`, or submit "
            "to a cluster: `snakemake --profile profiles/slurm`."
        )
    return multi_node or refusal(world_sizes, visible_gpus(env), env)


def slot_file(directory: Path, gpu: str) -> Path:
    # old-style MIG ids (MIG-GPU-<uuid>/<gi>/<ci>) hold slashes
    return directory / f"gpu-{gpu.replace('/', '_')}.lock"


def held_files(env: dict[str, str], gpus: list[str]) -> str:
    """The value of SCALESTUDY_GPU_SLOT_LOCKS for the slots `gpus` acquire took: their lock files,
    absolute (a rank may start elsewhere), os.pathsep between them."""
    return os.pathsep.join(str(slot_file(lock_dir(env).absolute(), gpu)) for gpu in gpus)


def _try_take(directory: Path, gpus: list[str], n: int) -> list[tuple[str, int]]:
    """Under the allocation lock: n free slots, locked, or none at all."""
    taken: list[tuple[str, int]] = []
    for gpu in gpus:
        fd = _open_lock(slot_file(directory, gpu))
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
    """Wait for n free GPU slots of this machine, lock them for the life of this process and
    its exec'd successors (inheritable descriptors, shared locks: the ranks add theirs, see the
    module's docstring), and return their ids."""
    gpus = visible_gpus(env)
    line = refusal([n], gpus, env)
    if line:
        raise LaunchError(line)
    directory = lock_dir(env)
    try:
        shared_dir(directory)
        return _wait_for(directory, gpus, n, poll_s)
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
    since the sticky directory keeps them from deleting it."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    with contextlib.suppress(PermissionError):  # only its owner may; another user's is theirs
        os.fchmod(fd, 0o644)
    return fd


def _wait_for(directory: Path, gpus: list[str], n: int, poll_s: float) -> list[str]:
    waited = False
    while True:
        guard = _open_lock(directory / "allocate.lock")
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            taken = _try_take(directory, gpus, n)
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
            logger.info(f"GPU slots: {','.join(ids)} of {','.join(gpus)} ({directory})")
            return ids
        if not waited:
            logger.info(f"GPU slots: waiting for {n} of {len(gpus)} GPUs ({directory})")
            waited = True
        time.sleep(poll_s)
