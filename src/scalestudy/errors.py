"""Every expected error of scalestudy, under one root.

`ScalestudyError` is what the CLI (cli.py) turns into one line on stderr and a non-zero exit:
an error a user can fix (a bad config, a missing file, a tool not installed) says what is wrong,
where, and the command that fixes it, without a traceback. Anything else is a bug and keeps its
traceback. Each class also derives from the built-in exception it always was (ValueError,
RuntimeError), so `except ValueError` around a config check keeps working.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path


class ScalestudyError(Exception):
    """Root of the expected errors: the message is the whole story, printed as one line.

    `scope` says which ranks of a training job print it (log.expected_error): "rank" (the
    default: every rank that hits it, e.g. a rank without its GPU), "node" (once per node: local
    rank 0; the node's file system), "run" (once: rank 0; a pure function of the flags)."""

    scope = "rank"


# --- study configuration and planning (study/)
class StudyConfigError(ScalestudyError, ValueError):
    """An invalid study config; `problems` holds one message per problem."""

    def __init__(self, problems: str | Iterable[str], source: str | os.PathLike | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = None if source is None else str(source)
        head = f"invalid study config {self.source}" if self.source else "invalid study config"
        if len(self.problems) == 1:
            message = f"{head}: {self.problems[0]}"
        else:
            message = head + ":\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class RunTableError(ScalestudyError, ValueError):
    """A run table (results/matrix/runs.tsv) that `scalestudy matrix` did not write as it is."""


class PlanError(ScalestudyError, RuntimeError):
    """Measured runs or benchmarks that the plan cannot read."""


class WorkdirError(ScalestudyError, ValueError):
    """A working directory (`snakemake --directory`) the study cannot run in as asked; the
    message names the setting and the fix."""


# --- the trainer (trainer/)
class TrainConfigError(ScalestudyError, ValueError):
    """A `scalestudy train` flag value that fails its checks (trainer/config.py); the message
    names the flag. The same on every rank, so rank 0 alone prints it."""

    scope = "run"


class OutputDirError(TrainConfigError):
    """--out or --checkpoint-dir cannot be written here. Each node judges its own file system
    (a node-local scratch, a relative path in each rank's working directory), so local rank 0
    of each node prints it: a node where it fails alone is heard, not just rank 0's."""

    scope = "node"


class TrainingError(ScalestudyError, RuntimeError):
    """A run that cannot start or must stop: bad device, no steady-state window, NaN loss...
    `scope` "run" for a fact every rank finds alike (an all-reduced loss, the step count):
    rank 0 alone prints it; the default "rank" for one rank's own (its device)."""

    def __init__(self, message: str, scope: str = "rank") -> None:
        super().__init__(message)
        self.scope = scope


class LaunchError(ScalestudyError, RuntimeError):
    """A rank that cannot find its place (environment), or a launch that cannot be built."""


class PreparedDataError(ScalestudyError):
    """Prepared data is missing, incomplete or does not match its meta.json. Every node reads its
    own file system (usually the same shared one), so local rank 0 of each node prints it."""

    scope = "node"


class DownloadError(ScalestudyError, RuntimeError):
    """A raw file could not be downloaded."""


class ChecksumError(DownloadError):
    """A downloaded raw file does not have the expected md5."""


class CheckpointError(ScalestudyError, RuntimeError):
    """A checkpoint could not be written or read; the message names the path and the cause."""


class Preempted(ScalestudyError):
    """Training stopped on a signal after saving the checkpoint of `epoch` epochs (exit 75:
    not a failure, the same command resumes, or starts again where no checkpoint was worth
    writing)."""

    def __init__(self, epoch: int, signame: str, path: Path | None, why: str = "") -> None:
        """`path` None: no checkpoint was written, and `why` says why (the same command then
        trains from the start)."""
        where = f"checkpoint {path}" if path is not None else f"no checkpoint: {why}"
        super().__init__(f"stopped on {signame} after epoch {epoch}; {where}")
        self.epoch, self.signame, self.path = epoch, signame, path


# --- jobs (jobs/)
class DefinitionError(ScalestudyError, ValueError):
    """A definition file that cannot be parsed or fails the checks; the message names the file
    and, where there is one, the line."""


class ImageNotFound(ScalestudyError, FileNotFoundError):
    """A container image file that is not there: `path: no such image file: build it with
    `build``, an OSError with its filename as every missing file is."""

    def __init__(self, path: str | os.PathLike, build: str) -> None:
        super().__init__(errno.ENOENT, f"no such image file: build it with `{build}`", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class NotAnImage(ScalestudyError, OSError):
    """A container image path that holds no image: a file of 0 bytes (a copy that failed, a
    `touch`; `container build` writes its image whole), a directory, a device or a pipe (read
    forever): `path: <why>, not an image: <fix>`."""

    def __init__(self, path: str | os.PathLike, why: str, fix: str) -> None:
        super().__init__(errno.EINVAL, f"{why}, not an image: {fix}")
        self.filename = str(path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class ApptainerNotFound(ScalestudyError, RuntimeError):
    """`apptainer` is not on PATH."""


class ProfileError(ScalestudyError, RuntimeError):
    """A profiling job that cannot run its tool or finds no output of it."""


class GpuCheckError(ScalestudyError, RuntimeError):
    """`gpu-check` cannot start here: no CUDA GPU, an unusable --out, no data for its runs."""


# --- profiler outputs (nsight/)
class ProfileFormatError(ScalestudyError, ValueError):
    """A profile file that cannot be parsed; the message names the file (and line)."""

    def __init__(self, path, line: int | None, problem: str) -> None:
        where = f"{path}, line {line}" if line else str(path)
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.problem = path, line, problem

    def with_fix(self, fix: str) -> ProfileFormatError:
        """This error with `fix` (what makes the file again) after its problem, where the
        problem names no command yet (a command is in backquotes) and the file could be read
        (an OSError cause, a directory or no permission, is not fixed by remaking it): "no nsys
        stats header found" said what was wrong and not what to run."""
        if "`" in self.problem or isinstance(self.__cause__, OSError):
            return self  # a command named, or the file unreadable (a directory, permissions)
        return ProfileFormatError(self.path, self.line, f"{self.problem}; {fix}")


# --- results (results/)
class CollectError(ScalestudyError, RuntimeError):
    """A run's metrics.json or epochs.csv that is missing or does not match the run table."""


class AnalysisError(ScalestudyError, RuntimeError):
    """An analysis input that is missing or malformed."""
