"""Where the workflow finds things, wherever Snakemake runs (`--directory D`, `-s <repo>/...`).

Two kinds of path:
- the REPOSITORY's files: the package sources (code inputs), the report templates, the container
  definition and the directory its %files name, the config schema, the default study config
  config/config.yaml. They are found from the workflow's base directory (Snakemake's
  `workflow.basedir`, <repo>/workflow), so the working directory does not matter.
- the STUDY's files: results/, reports/, logs/, benchmarks/, .snakemake/ and the config's own
  paths (data_dir, checkpointing.dir, container.image), all relative to the working directory,
  which is what `--directory` chooses. The runs a study measured live there.

The study config is layered (Snakemake's order): the repository's config/config.yaml, then each
--configfile over it, then --config. Snakemake makes a --configfile path absolute against the
directory it was started in, before it changes to --directory (snakemake.settings.types.
ConfigSettings, 9.27), so `snakemake --directory D --configfile D/study.yaml` names D's file
and `--configfile study.yaml` the one where the command is typed. Outside the repository root a
study must be named with --configfile (`check_workdir`): the default is the paper's GPU study,
which nobody should start in another directory by forgetting a flag.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from scalestudy.errors import WorkdirError

#: the default study config, relative to the repository (the Snakefile's `configfile:`)
DEFAULT_CONFIG = "config/config.yaml"
#: the CPU demo study, named by the messages that send a user to it
DEMO_CONFIG = "config/demo.yaml"


def repo_file(repo: str | os.PathLike, path: str | os.PathLike) -> str:
    """A file of the repository as a rule names it: relative to the working directory, so from
    the repository root the text is the same as ever (an existing study sees no changed input);
    an absolute path (a user's own container definition) is kept as it is."""
    if os.path.isabs(path):
        return str(path)
    return os.path.relpath(Path(repo) / path)


def repo_files(repo: str | os.PathLike, paths: Iterable[str | os.PathLike]) -> list[str]:
    """repo_file of each path (the code inputs that study/resources.py lists per repository)."""
    return [repo_file(repo, p) for p in paths]


def is_repo_root(repo: str | os.PathLike, cwd: str | os.PathLike | None = None) -> bool:
    """True when the working directory is the repository itself."""
    return Path(cwd or os.getcwd()).resolve() == Path(repo).resolve()


def shown(repo: str | os.PathLike, path: str, cwd: str | os.PathLike | None = None) -> str:
    """A repository file as a message names it for the user to type: as it is from the
    repository root, else absolute (the shell may be anywhere with --directory)."""
    return path if is_repo_root(repo, cwd) else str(Path(repo).resolve() / path)


def check_workdir(
    repo: str | os.PathLike,
    configfiles: Sequence[str | os.PathLike],
    cwd: str | os.PathLike | None = None,
) -> None:
    """Refuse, before any job, a working directory other than the repository root whose study
    is not named by a --configfile."""
    if configfiles or is_repo_root(repo, cwd):
        return
    here, root = Path(cwd or os.getcwd()).resolve(), Path(repo).resolve()
    raise WorkdirError(
        f"scalestudy: the working directory {here} is not the repository {root} and no study "
        f"is named: add --configfile with the study's YAML (e.g. --configfile {root / DEMO_CONFIG}"
        f", or {root / DEFAULT_CONFIG} for the paper study); a relative --configfile is relative "
        "to where snakemake starts, not to --directory"
    )


def reproduce_configfile(
    repo: str | os.PathLike,
    configfiles: Sequence[str | os.PathLike],
    overrides: Mapping[str, object] | None = None,
) -> str:
    """What the report's reproduce commands put after `--configfile` (they run from the
    repository root): every --configfile in order (Snakemake merges them, the last winning), else
    the default, each relative to the repository when inside it, else absolute; then the
    `--config` overrides, if any (the demo's dataset=synthetic). Shell-quoted."""
    root = Path(repo).resolve()

    def shown(path: Path) -> str:
        path = (root / path).resolve()
        return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)

    args = [shown(Path(f)) for f in configfiles] or [DEFAULT_CONFIG]
    if overrides:
        args += ["--config"]
        args += [
            f"{key}={value if isinstance(value, str) else json.dumps(value)}"
            for key, value in overrides.items()
        ]
    return shlex.join(args)
