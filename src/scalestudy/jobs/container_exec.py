"""Run a command in the trainer's Apptainer image: the `apptainer exec` prefix, the image's digest.

Split off jobs/container.py (the definition's checks and the build): this is the only part of
it a training job runs (`scalestudy launch --container` puts exec_prefix in front of every rank),
so this module is a code input of every training and profiling job (study/resources.py), and an
edit to the recipe's checks or to the build's messages reruns none of them.

Only the standard library (and scalestudy's shared modules) is used here, as in container.py.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path

from scalestudy import files, vocab
from scalestudy.errors import ImageNotFound, LaunchError, NotAnImage
from scalestudy.files import git_commit

#: Set by exec_prefix inside the container (vocab.py): the sha256 of the .sif the process runs
#: in, and the commit of the source bound in (files.git_commit).
DIGEST_ENV, COMMIT_ENV = vocab.CONTAINER_DIGEST_ENV, vocab.GIT_COMMIT_ENV

# the repository's recipe (config key container.definition's default), named in the fix for a
# missing image
SHIPPED_DEFINITION = "containers/trainer.def"


def build_fix(sif_path: str | os.PathLike) -> str:
    """The command that builds the image `sif_path` from the checkout's recipe, from any
    directory: the recipe by its path and --context the checkout (its %files are relative to
    it). containers/trainer.def, relative, failed from a study's own directory. Relative as
    shipped where this scalestudy runs from no checkout."""
    root = Path(__file__).resolve().parents[3]  # src/scalestudy/jobs/ -> the checkout
    if not (root / SHIPPED_DEFINITION).is_file():
        return shlex.join(["scalestudy", "container", "build", SHIPPED_DEFINITION, str(sif_path)])
    definition = str(root / SHIPPED_DEFINITION)
    return shlex.join(
        ["scalestudy", "container", "build", definition, str(sif_path), "--context", str(root)]
    )


# sha256 of no bytes (FIPS 180-4's test vector): an empty image's digest, not hashed again
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def image_digest(sif_path: str | os.PathLike) -> str:
    """'sha256:<hex>' of the image file's bytes; ImageNotFound (one line, the build command)
    where there is no such file, NotAnImage where it has no bytes (apptainer's own error came
    only inside the job, and the empty file's digest went into the record) or is no regular
    file (a directory; a pipe was read forever): every command given an image hashes it
    first."""
    try:
        mode = os.stat(sif_path).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a device or a pipe"
            fix = "give the image's .sif file (`scalestudy container build` writes one)"
            raise NotAnImage(sif_path, f"is {what}", fix)
        digest = files.sha256(sif_path)
    except FileNotFoundError as exc:
        raise ImageNotFound(sif_path, build_fix(sif_path)) from exc
    if digest == EMPTY_SHA256:
        raise NotAnImage(sif_path, "is empty", f"rebuild it with `{build_fix(sif_path)}`")
    return f"sha256:{digest}"


def exec_prefix(
    image: str | os.PathLike,
    gpu: bool,
    *,
    digest: str | None = None,
    apptainer: str = "apptainer",
    binds: Sequence[str] = (),
    source: str | os.PathLike | None = None,
) -> list[str]:
    """argv that runs a command inside the image: append the command and its arguments.

    The image is the software environment (torch, CUDA, the InfiniBand userspace), not the
    code: scalestudy's source directory (`source`, by default this package's, see
    source_dir) is bound read-only at its own path and put first on PYTHONPATH, so the ranks
    run the very files Snakemake tracks as the rules' code inputs. An image holding a copy
    would go stale whenever a module outside its rebuild trigger changed (the profiler's
    wrapper, the nsight parsers, cli.py all run inside), and every trainer edit would rebuild
    it. The code's commit goes in as SCALESTUDY_GIT_COMMIT (the image may have no git), when
    the source is a git checkout.
    The image's digest (computed here unless given) is passed in, so the trainer can record
    exactly which image it ran in. --nv binds the host's NVIDIA driver and devices. The host
    environment (SLURM_*, RANK, MASTER_ADDR, ...) passes through, as Apptainer does by default.
    `binds`: host directories bound at the same path inside (the profilers' installations,
    jobs/profile.py), so a host path given to a command means the same file inside.
    PYTHONNOUSERSITE: Apptainer binds $HOME, and Python puts the user's ~/.local site-packages
    before the image's own, so a torch the user installed there for the same Python version
    would silently replace the image's (and its measured numbers with it).
    """
    code = Path(source) if source is not None else source_dir()
    commit = git_commit(code)
    return [
        apptainer,
        "exec",
        *(["--nv"] if gpu else []),
        "--bind",
        f"{code}:{code}:ro",
        *(arg for path in binds for arg in ("--bind", str(path))),
        "--env",
        f"PYTHONPATH={code}",
        *(["--env", f"{COMMIT_ENV}={commit}"] if commit != "unknown" else []),
        "--env",
        f"{DIGEST_ENV}={digest or image_digest(image)}",
        "--env",
        "PYTHONNOUSERSITE=1",
        str(image),
    ]


def source_dir() -> Path:
    """The directory holding this scalestudy package (a checkout's src/), which exec_prefix
    binds into the image. Refused where it would bring other packages with it (an installed,
    not editable, scalestudy lives in a site-packages, whose torch would shadow the image's),
    and where Apptainer's --bind could not name it (':' and ',' separate its fields)."""
    here = Path(__file__).resolve().parents[2]
    if here.name in ("site-packages", "dist-packages") or (here / "torch").exists():
        raise LaunchError(
            f"the container runs scalestudy from its source directory, bound in and put on "
            f"PYTHONPATH, but this scalestudy is installed in {here}, a directory of installed "
            "packages whose torch would shadow the image's: install it editable from its "
            "checkout (`pip install -e <checkout>`; scripts/setup.sh does)"
        )
    if files.unbindable(here):
        raise LaunchError(
            f"the container binds scalestudy's source directory {here} into the image, and "
            "Apptainer's --bind cannot name a path with ':' or ',': move the checkout"
        )
    return here
