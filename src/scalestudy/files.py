"""Files and provenance shared by every layer: atomic writes, CSV text and cells, sha256 of a
file, the git commit, a shared lock held until the process exits.

Atomic writes: a reader sees the old file or the complete new one, never a half-written one.

Write to a temporary file in the same directory (same filesystem, so rename is atomic), fsync it,
rename it over the target, then fsync the directory so the rename itself survives a crash.
A symlinked target stays a link (the file it points to is replaced), an existing file keeps
its permissions (mode, group, ACL), and a new one gets what open() gives it (the umask, or the
directory's default ACL). A target that is no regular file (a device such as /dev/null, a named
pipe), or one reached through a file descriptor's link (/dev/stdout, /dev/fd/N), is written in
place, as open() would: a rename replaced it with a regular file, or the file a shell
redirected stdout to.
Several outputs of one command (write_texts) are written as one: every temp file first, then
the renames, so a failure part-way (a full disk) leaves them all old, never new beside old.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import fcntl
import functools
import hashlib
import io
import json
import math
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

# bytes of the target's name kept in its temp file's name, which adds 14 characters: a target
# name near NAME_MAX (255 bytes) was "File name too long" though the target could be written
TEMP_STEM_BYTES = 200


# a write that fails for want of room raises an OSError naming no file, which cli.main takes for
# a bug (a traceback); none of these comes from reading, so one raised inside the `with` block is
# the block's write into the file
WRITE_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _named(exc: OSError, path: str | os.PathLike) -> OSError:
    """`exc`, or where it names no file the same error naming `path` (its one line then says
    which file could not be written)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, os.fspath(path))


# the directory of a process's file-descriptor links: /dev/fd, and /dev/stdout's /proc/self/fd
_FD_DIR = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd")


def _descriptor_link(path: str | os.PathLike) -> tuple[bool, int | None]:
    """Whether `path` is, or its symlinks lead through, a file descriptor's link under
    /proc/<pid>/fd (/dev/stdout -> /proc/self/fd/1), which names what the descriptor has open:
    a pipe (its link, pipe:[N], names no file) or the file a shell redirected to; and the
    number of that descriptor when it is this process's (None: another process's, or none)."""
    hop = os.path.abspath(path)
    for _ in range(40):  # the kernel's limit of links followed (ELOOP)
        where = os.path.realpath(os.path.dirname(hop))
        if match := _FD_DIR.fullmatch(where):
            name = os.path.basename(hop)
            own = int(match[1]) == os.getpid() and name.isdigit()
            return True, int(name) if own else None
        if not os.path.islink(hop):
            return False, None
        hop = os.path.join(where, os.readlink(hop))
    return False, None


def is_own_stdout(path: str | os.PathLike) -> bool:
    """Whether `path` is this process's stdout (/dev/stdout, /dev/fd/1, /proc/self/fd/1)."""
    return _descriptor_link(path)[1] == 1


def written_in_place(path: str | os.PathLike) -> bool:
    """Whether a write to `path` goes into what it names, not into a file renamed onto it:
    `path` (followed through its links) exists and is no regular file or directory (a device
    such as /dev/null, a FIFO), or it leads through a file descriptor's link (/dev/stdout: a
    pipe, whose realpath /proc/<pid>/fd/pipe:[N] does not exist, or the file stdout was
    redirected to, written through rather than replaced)."""
    try:
        kind = os.stat(path).st_mode  # the path as given: /dev/stdout's pipe, not its realpath
    except OSError:  # a new file, or a link to one
        return _descriptor_link(path)[0]
    return not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)) or _descriptor_link(path)[0]


@contextlib.contextmanager
def _open_in_place(path: str | os.PathLike, mode: str, **kwargs: Any) -> Iterator[IO]:
    """`path` opened as it is. One of this process's descriptors (/dev/stdout, /dev/fd/N) is
    written through a duplicate of it, as a shell's `> /dev/stdout` does: open() gave a file
    stdout was redirected to a second offset at 0 (truncated), and the command's own lines to
    stdout then wrote over the start of what was written there."""
    fd = _descriptor_link(path)[1]
    if fd is None:
        with open(path, mode, **kwargs) as f:
            yield f
        return
    for stream in (sys.stdout, sys.stderr):  # what the command printed before comes first
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    try:  # `--out /dev/fd/7` with no descriptor 7 open: EBADF named no file
        dup = os.dup(fd)
    except OSError as exc:
        raise _named(exc, path) from None
    with open(dup, mode, **kwargs) as f:  # closes the duplicate, not fd
        yield f


def write_target(path: str | os.PathLike) -> Path:
    """The file a write to `path` replaces: where `path` points if it is a symlink (a rename
    over the link replaced it with a regular file, and the file it pointed to kept the old
    contents), else `path`; `path` itself where it is written in place (written_in_place). A
    temp file renamed onto it goes beside it (the same filesystem). A link in a loop is an
    OSError (ELOOP) naming `path`, as open() refuses it: its realpath was the link itself,
    replaced by a regular file."""
    if os.path.islink(path) and not written_in_place(path):
        try:
            return Path(os.path.realpath(path, strict=True))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(exc.errno, exc.strerror, str(path)) from None
        # a link to a file not there yet, or not reachable (output_problems says why): where
        # it points
        return Path(os.path.realpath(path))
    return Path(path)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temp file beside `path`; on success it replaces `path`, on error it is removed.
    A target that exists and is no regular file or directory, or is reached through a file
    descriptor's link (/dev/stdout), is written in place (written_in_place). A failed write (a
    full disk) raises an OSError that names `path`; a pipe whose reader is gone raises
    BrokenPipeError unnamed (cli.main's quiet end, as SIGPIPE ends a Unix tool)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', not {mode!r}")
    if written_in_place(path):
        # a device or FIFO (--out /dev/null): a rename put a regular file in its place (as
        # root, /dev/null itself), so it is written as open() would; it has nothing to fsync.
        # The path as given: /dev/stdout on a pipe resolves to a name that does not exist
        written = False
        try:
            with _open_in_place(path, mode, **kwargs) as f:
                yield f
                written = True
        except OSError as exc:
            # a reader gone (`| head`) is no failure of this file: cli.main ends quietly on it
            if exc.errno != errno.EPIPE and (written or exc.errno in WRITE_FULL):
                raise _named(exc, path) from exc
            raise
        return
    with _staged(path, mode, **kwargs) as (f, staged):
        yield f
    _replace([staged])


@dataclass(frozen=True)
class _Staged:
    """A complete temp file (`tmp`) waiting to replace `target`; `path` is what the caller named."""

    path: str | os.PathLike
    target: Path
    tmp: str


@contextlib.contextmanager
def _staged(path: str | os.PathLike, mode: str, **kwargs: Any) -> Iterator[tuple[IO, _Staged]]:
    """Open a temp file beside `path`'s target (write_target: the same filesystem, so a rename
    onto it is atomic) with the target's permissions (_keep_permissions), or a new file's
    (_create_temp); on leaving the block it is flushed and fsynced, and replaces nothing yet
    (_replace). On error it is removed, and a failed write (a full disk) raises an OSError that
    names `path`."""
    target = write_target(path)  # a symlink stays, the file it points to is replaced
    if target.is_dir():  # the rename onto "." or "/" said "Device or resource busy"
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path) or ".")
    existing = nearest_existing(target.parent)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # "results: File exists" for a link to a purged directory
        if why := output_dir_problem(target.parent):
            raise OSError(exc.errno, f"its directory {why}", os.fspath(path)) from None
        raise
    # the directories made here survive a crash too (fsync(2): each new entry's directory is
    # synced; _replace syncs the file's own): a network file system gives no ordering for free
    made = [d for d in target.parent.parents if d == existing or existing in d.parents]
    for directory in reversed(made):
        fsync_dir(directory)
    try:  # a rewrite keeps the file's permissions (a file made 0600 on purpose stays so)
        old = os.stat(target)
    except OSError:  # a new file: made as open() makes it
        old = None
    stem = _temp_stem(target.name)
    try:  # never wider than the file it replaces: the umask can only take bits away
        fd, tmp = _create_temp(target.parent, stem, 0o666 if old is None else old.st_mode & 0o777)
    except OSError as exc:  # it named the random temp file, which the user never heard of
        raise OSError(exc.errno, _temp_failure(exc, target.parent), os.fspath(path)) from None
    written = False  # True once the caller's block is done: what fails then is this file's write
    try:
        if old is not None:
            _keep_permissions(fd, target, old)
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f, _Staged(path, target, tmp)
            written = True
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and (written or exc.errno in WRITE_FULL):
            raise _named(exc, path) from exc
        raise


# a temp file is new (O_EXCL), never a link planted in its place (O_NOFOLLOW), and no child
# process inherits it
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# where Linux keeps a file's POSIX ACL (setfacl -m), beyond its mode's three classes
_ACL_XATTR = "system.posix_acl_access"


def _temp_stem(name: str) -> str:
    """The part of a target's file name its temp file carries (cut to TEMP_STEM_BYTES)."""
    while len(os.fsencode(name)) > TEMP_STEM_BYTES:
        name = name[:-1]
    return name


def is_temp_of(name: str, target_name: str) -> bool:
    """Whether a file named `name` is a temp file of a write of a file named `target_name`
    (_create_temp's `.{stem}.<8 hex>.tmp`), as a process killed inside the write leaves it."""
    pattern = rf"\.{re.escape(_temp_stem(target_name))}\.[0-9a-f]{{8}}\.tmp"
    return re.fullmatch(pattern, name) is not None


def _create_temp(directory: Path, stem: str, mode: int) -> tuple[int, str]:
    """A new temp file `.{stem}.<8 hex>.tmp` in `directory`, open for writing: (fd, its path).
    The kernel makes it as open() makes a file, `mode` less the umask, or what the directory's
    default ACL gives (`setfacl -d -m g:proj:rwx`, how a project shares a directory whatever
    a member's umask): mkstemp's 0600, then a chmod to 0666 less the umask, ignored that ACL
    and rewrote its mask, so the project's group could not read the file."""
    for _ in range(100):  # another writer's name: draw again
        tmp = os.path.join(directory, f".{stem}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, _TEMP_FLAGS, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", os.fspath(directory))


def _temp_failure(exc: OSError, directory: Path) -> str:
    """Why no temp file could be made in `directory`: "Permission denied" beside the target's
    name blamed the file, which may well be writable (`ls -l` says so) in a directory this user
    may not write; the directory is the cause. So is ENOENT in a directory that exists: a file
    system that makes no new files (/proc, /sys) said "No such file or directory" of the
    target, as if a path were mistyped."""
    where = directory if str(directory) != "." else Path.cwd()
    if exc.errno == errno.ENOENT and directory.is_dir():
        return (
            f"cannot create a file in {where}: its file system makes no new files there "
            "(e.g. /proc, /sys); write somewhere else"
        )
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return exc.strerror
    return (
        f"cannot create a temporary file in {where} (the write is atomic: it needs write "
        "permission on the directory)"
    )


def _keep_permissions(fd: int, target: Path, old: os.stat_result) -> None:
    """Give the temp file `fd` the permissions of `target`, the file it will replace: its group
    (a rename left the writer's, and a file shared by `chgrp proj; chmod 640` lost its
    readers), its ACL where it has one, and its mode. Each as far as the writer may and the
    file system keeps it: a group the writer is not a member of (EPERM), a file system without
    ACLs or modes, leave the new file as open() made it."""
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_gid != old.st_gid:
            os.fchown(fd, -1, old.st_gid)
    if hasattr(os, "getxattr"):  # Linux
        try:
            os.setxattr(fd, _ACL_XATTR, os.getxattr(target, _ACL_XATTR))
        except OSError as exc:
            if exc.errno == errno.ENODATA:  # no ACL beyond its mode: none from the directory's
                # default either (it gave a file the owner kept 0640 to another user)
                with contextlib.suppress(OSError):
                    os.removexattr(fd, _ACL_XATTR)
            # else no ACLs here, or none this writer may set: as open() made it
    with contextlib.suppress(OSError):  # last: fchown cleared set-id bits, the ACL its mask
        os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _replace(staged: Sequence[_Staged]) -> None:
    """Rename each complete temp file onto its target, then fsync their directories so the
    renames survive a crash (where this user may open the directory and the file system syncs
    one). A rename that fails removes the temp files not yet renamed and
    raises an OSError naming its file; so does Ctrl-C, or a stop signal (cli.py), between two
    renames (the files renamed before it are new)."""
    done = 0
    try:
        for s in staged:
            os.replace(s.tmp, s.target)
            done += 1
    except BaseException as exc:
        # the rename at `done` failed, or the signal came after it (its temp file is then
        # gone): KeyboardInterrupt too, else its temp files stayed beside their targets
        _discard(staged[done:])
        if isinstance(exc, OSError):
            raise _named(exc, staged[done].path) from exc
        raise
    for directory in dict.fromkeys(s.target.parent for s in staged):
        fsync_dir(directory)


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory, so that the renames and new entries in it survive a crash. The files
    are in place: a directory this user may write but not read (a drop-box, 0733: EACCES), or
    a file system that cannot sync one (EINVAL), is no failed write."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EINVAL):
            raise _named(exc, directory) from exc  # a failing disk (EIO): this directory's


def replace_with(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename `tmp`, a complete file another program wrote beside `path` (apptainer build's
    image), onto `path` as atomic_open's temp files are: with `path`'s group, ACL and mode where
    it exists (_keep_permissions), fsynced, then the rename, then its directory fsynced. A
    failure removes `tmp` and raises an OSError that names `path`."""
    target = write_target(path)
    staged = _Staged(path, target, os.fspath(tmp))
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            with contextlib.suppress(FileNotFoundError):  # a new file: as the program made it
                _keep_permissions(fd, target, os.stat(target))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _discard([staged])
        raise _named(exc, path) from exc
    _replace([staged])


def _discard(staged: Iterable[_Staged]) -> None:
    for s in staged:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(s.tmp)


def write_texts(texts: Mapping[str | os.PathLike, str]) -> None:
    """write_files for texts: each path gets its text (UTF-8)."""
    write_files({path: _writer(text) for path, text in texts.items()}, "w", encoding="utf-8")


def _writer(content: str | bytes) -> Callable[[IO], Any]:
    return lambda f: f.write(content)


def write_files(
    writers: Mapping[str | os.PathLike, Callable[[IO], Any]], mode: str = "w", **kwargs: Any
) -> None:
    """Write several files as one output: each writer writes its file into the open file it is
    given, a temp file (as atomic_open: the target's group, ACL and mode, fsynced), and, all of
    them complete, they are renamed onto their targets. A failure before the renames (a full
    disk at the third file) removes the temp files and leaves every target as it was, so a
    command's outputs are all new or all old, never new beside old (what check_outputs checks
    before the work, this keeps during the writes). A target written in place (a device,
    /dev/stdout: written_in_place) has no temp file: it is written after the others' temp
    files, before their renames. `mode` is "w" or "wb"; `kwargs` go to open()."""
    if mode not in ("w", "wb"):
        raise ValueError(f"write_files: mode must be 'w' or 'wb', not {mode!r}")
    staged: list[_Staged] = []
    try:
        in_place = [p for p in writers if written_in_place(p)]
        for path, write in writers.items():
            if path not in in_place:
                with _staged(path, mode, **kwargs) as (f, s):
                    try:
                        write(f)
                    except OSError as exc:  # a failing disk (EIO) under a write: this file's
                        raise _named(exc, path) from exc
                staged.append(s)
        for path in in_place:
            with atomic_open(path, mode, **kwargs) as f:
                writers[path](f)
    except BaseException:
        _discard(staged)
        raise
    _replace(staged)


# Apptainer's --bind separates a spec's fields (src:dest:options) with ':' and its specs with ',':
# a path holding either cannot be bound (the launcher, the image's source directory and the study
# config all refuse one)
BIND_SEPARATORS = (":", ",")


# shared flock(2) descriptors this process holds until it exits (hold_shared_locks)
_HELD_LOCKS: list[int] = []


def hold_shared_locks(paths: str) -> list[str]:
    """Take a shared flock(2) on each existing file of `paths` (os.pathsep between them) and hold
    it until this process exits, killed or not: a rank's hold on its GPU slots
    (jobs/gpu_slots.py), whose exclusive lock no other run can then take. One line for each file
    that could not be held (an exclusive lock on it: another run took the GPU after the launcher
    ended; not there: a container without the lock directory), and none is fatal: the launcher
    holds the slots too while it lives."""
    problems = []
    for path in filter(None, paths.split(os.pathsep)):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            taken = isinstance(exc, BlockingIOError)
            problems.append(f"{path}: {'locked by another run' if taken else exc.strerror}")
            continue
        _HELD_LOCKS.append(fd)  # never closed: the kernel releases it when the process ends
    return problems


# Directories that cannot be bound into the image: binding one hides the image's own system
# (the pytorch images' Python under /opt/conda; an nsys a distribution put in /usr/bin)
SYSTEM_DIRS = frozenset(
    {"/", "/usr", "/usr/local", "/opt", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/var"}
)


def unbindable(path: str | os.PathLike) -> bool:
    """Whether Apptainer's --bind cannot name `path` (BIND_SEPARATORS)."""
    return any(sep in os.fspath(path) for sep in BIND_SEPARATORS)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def json_text(obj: Any) -> str:
    """`obj` as write_json writes it (for write_texts)."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json_text(obj))


def _as_is(value: Any) -> Any:
    return value


def csv_text(
    columns: Sequence[str] | None,
    rows: Iterable[Mapping[str, Any]],
    cell: Callable[[Any], Any] = _as_is,
) -> str:
    """A header of `columns`, then one line per row with cell(row[column]) in each column.

    columns None: every key of the rows in first-seen order. A missing key is None; the default
    cell leaves values to the csv module (None -> blank, other values str())."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    # csv quotes what its line terminator holds, not a lone "\r" (a path typed at the end of a
    # CRLF job script), which a reader took for the row's end: such a row is quoted whole
    quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writerow(columns)
    for row in rows:
        cells = [cell(row.get(c)) for c in columns]
        (quoted if any("\r" in str(c) for c in cells if c is not None) else writer).writerow(cells)
    return out.getvalue()


def write_csv(
    path: str | os.PathLike,
    columns: Sequence[str] | None,
    rows: Iterable[Mapping[str, Any]],
    cell: Callable[[Any], Any] = _as_is,
) -> None:
    """csv_text(columns, rows, cell), written atomically."""
    write_text(path, csv_text(columns, rows, cell))


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` or its nearest ancestor that exists, a dangling symlink included (lexists:
    exists() is False for one, which a walk by exists() passed over unnamed)."""
    existing = Path(path)
    while not os.path.lexists(existing):
        existing = existing.parent
    return existing


def output_dir_problem(path: str | os.PathLike) -> str | None:
    """Why files cannot be written into directory `path` (made where missing), or None: a file
    in its place or on its way, a symlink on its way to something missing (`results` ->
    a purged scratch directory: mkdir said "results: File exists"), or the nearest existing
    directory not writable. Checked before work whose results would be lost at the first
    write."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "is a file, not a directory"
    existing = nearest_existing(path)
    if existing.is_symlink() and not existing.exists():
        missing = os.path.realpath(existing)
        return (
            f"cannot be made: {existing} is a symlink to missing {missing}: create it or "
            "remove the link"
        )
    if not existing.is_dir():
        return f"cannot be made: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be written: no permission to write in {existing}"
    return None


def output_problems(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Why the files `paths` cannot be written ([] = they can): a directory where a file goes,
    or output_dir_problem of its directory. A command that writes several files checks them
    all first, so that a failure leaves no new file beside old ones."""
    problems = []
    for path in map(Path, paths):
        if written_in_place(path):  # /dev/stdout: no file made in /dev, which only root may
            continue
        try:  # a symlink is written where it points (write_target): judged there
            target = write_target(path)
        except OSError as exc:  # a link in a loop
            problems.append(f"{path}: {exc.strerror}")
            continue
        if target.is_dir():
            problems.append(f"{path}: is a directory, not a file")
        elif why := output_dir_problem(target.parent):
            problems.append(f"{target.parent}: {why}")
    return list(dict.fromkeys(problems))


def check_outputs(paths: Iterable[str | os.PathLike], error: type[Exception]) -> None:
    """`error("nothing written: ...")` naming output_problems of `paths`, before the first
    write of a command that writes several files."""
    if problems := output_problems(paths):
        raise error(f"nothing written: {'; '.join(problems)}")


def one_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name one file: one path once links, `.` and `..` are resolved (a
    write goes where a link points: write_target), two names of one inode (a hard link), or,
    not there yet, one name in one directory reached by two paths (a bind mount)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is not there (a new output): one name in one directory?
        pass
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    try:  # a directory reached by two mounts (a bind mount: /scratch and /gpfs/scratch)
        return a.name == b.name and os.path.samefile(a.parent, b.parent)
    except OSError:  # a directory not there either
        return False


def input_fix(
    path: str | Path, target: str, flag: str, own: str = "", missing: bool = False
) -> str:
    """What a message refusing an input file tells to do. The study's own file (`target`: the
    workflow's path of it, from the study directory, where the commands run) is snakemake's to
    make again: delete it and run snakemake. Any other path was given by hand (`flag`), maybe a
    file of the user's own: "delete it and run `snakemake results/csv/runs.csv`" said to delete
    it, and named a command that writes another file. `own`: what `flag` takes of the study's
    (--csv-dir its directory; default `target`). No `target`: neither is known. `missing`: the
    file is not there (snakemake makes the study's; a path given by hand is the user's to fix)."""
    if not target:
        made = "write it again with the scalestudy command that made it"
        return "fix the path" if missing else made
    if one_file(path, target) and missing:
        return f"run `snakemake {target}` first"
    if one_file(path, target):
        return f"delete it and run `snakemake {target}`"
    fix = "fix the path" if missing else "fix it"
    return f"{fix}, or give {flag} the study's {own or target} (`snakemake {target}` writes it)"


def check_distinct(
    outputs: Mapping[str, str | os.PathLike],
    inputs: Mapping[str, str | os.PathLike | None],
    error: type[Exception],
) -> None:
    """`error("nothing written: ...")` where two of a command's `outputs` ({what: path}, what
    a flag or a file of an --out-dir) are one file (one_file: the second write replaced the
    first, and the command said it wrote both), or an output is one of its `inputs` (the write
    replaced a file the user keeps as an input); checked before any work. A blank input is
    none. An output written in place (written_in_place: /dev/null, /dev/stdout) is no file of
    its own: two outputs to /dev/null discard both; two to one path of another stream
    (/dev/stdout twice) are one file (write_texts, keyed by path, printed one of them)."""

    def one(other: str, what: str, path) -> Exception:
        return error(
            f"nothing written: {other} and {what} are one file ({path}): the second write "
            "would replace the first; give each its own path"
        )

    streams: dict[str, str] = {}
    for what, path in outputs.items():
        stream = os.path.normpath(path) if written_in_place(path) else os.devnull
        if stream != os.devnull and (other := streams.setdefault(stream, what)) != what:
            raise one(other, what, path)
    outs = [(what, path) for what, path in outputs.items() if not written_in_place(path)]
    for i, (what, path) in enumerate(outs):
        for other, earlier in outs[:i]:
            if one_file(earlier, path):
                raise one(other, what, path)
        for other, source in inputs.items():
            if source and one_file(source, path):
                raise error(
                    f"nothing written: {what} is the input {other} ({source}): the write "
                    "would replace it; give the output another path"
                )


def write_cause(exc: BaseException) -> str:
    """A failed write's error in plain words: a full disk, no permission, or the error itself."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device ({exc})"
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"no permission to write ({exc})"
    return f"{type(exc).__name__}: {exc}"


def write_failure(
    exc: BaseException, directory: str | os.PathLike, cause: str | None = None
) -> str:
    """write_cause (or the given `cause`), called a full disk where the error is no OSError and
    `directory` has no space left: torch.save reports ENOSPC as "enforce fail at
    inline_container.cc: unexpected pos", and DCP loses the OSError when it gathers the ranks'
    errors. Judge it while the partial file is still there."""
    cause = cause or write_cause(exc)
    if not isinstance(exc, OSError):
        with contextlib.suppress(OSError):
            if shutil.disk_usage(directory).free == 0:
                return f"no space left on the device ({cause})"
    return cause


def number(value: Any) -> float | None:
    """A CSV cell as a float; blank / None / null / nan -> None. A boolean (a metrics.json value
    edited by hand) is no number: ValueError, as for a word (True was read as 1)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a number")
    if isinstance(value, int | float):
        if isinstance(value, float):
            return None if math.isnan(value) else value
        try:  # a JSON integer past a float's range (10**400): OverflowError, a traceback
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf  # as float("1e400") reads its text
    text = str(value).strip()
    if text in ("", "None", "null", "nan", "NaN"):
        return None
    return float(text)


def number_or_nan(value: Any) -> float | None:
    """A cell as `number` reads it (blank: None), NaN where it is not a number at all, so that
    a range check refuses it like any other value out of range."""
    try:
        return number(value)
    except ValueError:
        return math.nan


def is_count(x: float | None, least: int = 1) -> bool:
    """x (a cell read by `number`) is a finite whole number >= least: a count of ranks, nodes,
    images or a repeat index."""
    return x is not None and math.isfinite(x) and x >= least and x == int(x)


@dataclass(frozen=True)
class Cell:
    """What a column of a CSV that scalestudy writes holds, for the readers that check a file
    before they compute from it (collect's epochs.csv, analyze's runs.csv, the plan's runs.csv,
    the profile CSVs). `holds(text)` is False for a cell the writer never writes, and each
    reader names the file, row, column, the cell, `what` and its fix. A word is NaN here,
    which every range refuses; infinity is outside every range; `words` are the exceptions,
    texts the writer does write for a value that is no number (the trainer's "nan")."""

    what: str  # how a message says it: "a whole number >= 1"
    least: float = -math.inf
    most: float = math.inf
    above: bool = False  # > least, not >= (a time or rate that something is divided by)
    whole: bool = False  # digits only: a re-saved "2.0" passes is_count, then fails int()
    blank: bool = False  # blank allowed: not measured
    words: tuple[str, ...] = ()  # texts allowed besides the numbers ("nan", "inf")

    def holds(self, text: Any) -> bool:
        if isinstance(text, str) and text.strip() in self.words:
            return True
        x = number_or_nan(text)
        if x is None:
            return self.blank
        if self.whole:
            # most too: collect's epoch number is its row's place (least = most), and a rule
            # without it took any later epoch, a duplicated or skipped one
            return is_count(x, int(self.least)) and x <= self.most and str(text).strip().isdecimal()
        return (
            math.isfinite(x)
            and (x > self.least if self.above else x >= self.least)
            and (x <= self.most)
        )

    def or_blank(self) -> Cell:
        """The same, or blank where the run did not measure it."""
        return replace(self, blank=True)


def count(least: int) -> Cell:
    """A count of ranks, nodes, images or instances (least 1), or an index (least 0)."""
    return Cell(f"a whole number >= {least}", least, whole=True)


NUMBER = Cell("a finite number")
POSITIVE = Cell("a number > 0", 0, above=True)  # a time or rate divided by
NON_NEGATIVE = Cell("a number >= 0", 0)  # a time summed, a loss, a learning rate
FRACTION = Cell("a fraction in [0, 1]", 0, 1)  # an accuracy, a share
PERCENT = Cell("a percentage in [0, 100]", 0, 100)  # NVML's utilisation


def whole_number(least: int) -> Callable[[str], int]:
    """argparse type: an integer >= least, else argparse's one line naming the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
        return value

    return parse


def _not_text(path: str | os.PathLike, exc: UnicodeDecodeError, error: type, fix: str):
    return error(f"{path}: byte {exc.start} is not UTF-8 text ({exc.reason}): {fix}")


def read_text(path: str | os.PathLike, error: type[Exception], fix: str) -> str:
    """A text file (JSON, ...) the tool wrote; one that is not UTF-8 raises `error`, one line
    naming the file, the byte and `fix` (the command that writes it again)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")  # as written: no newline translation
    except UnicodeDecodeError as exc:
        raise _not_text(path, exc, error, fix) from exc
    except IsADirectoryError:  # "PATH: Is a directory", no fix named
        raise error(f"{path} is a directory, not a file; {fix}") from None
    return text.removeprefix("\ufeff")  # the byte-order mark a spreadsheet may save


def read_csv_rows(
    path: str | os.PathLike, error: type[Exception], fix: str, delimiter: str = ","
) -> list[dict]:
    """The rows of a CSV (TSV) file as dicts: read_csv_table's, without its header."""
    return read_csv_table(path, error, fix, delimiter)[1]


def read_csv_table(
    path: str | os.PathLike, error: type[Exception], fix: str, delimiter: str = ","
) -> tuple[list[str], list[dict]]:
    """(header, rows) of a CSV (TSV) file, the rows as dicts; a 0-byte file has header []. The
    header is for a reader that checks the columns of a file without rows too: an empty file or
    a foreign table, read as rows only, passed for "nothing in it". Not UTF-8: `error`, as
    read_text. A row with more or fewer cells than the header is `error` too: csv.DictReader
    would file the extra cells under None and fill the missing ones with None, which a reader
    took for values (a file cut off before a row's last cell, by a full disk or an interrupted
    copy, passed as complete). A cut inside the last cell keeps the count and is not seen here:
    the tool's own writes are atomic (write_files), so only a copy cut short can be."""
    # decoded whole (the tool's CSVs are small): the byte a decode error names is then the
    # file's own offset, not one within a read chunk
    text = read_text(path, error, fix)
    # strict: a quote left open is an error ("unexpected end of data"), not the rest of the
    # file swallowed into one cell
    lines = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows = []
    try:
        header = next(lines, [])
        # a name twice: each row's dict kept the last cell under it, and every reader took
        # that column for the first (an edited epochs.csv's second val_acc, silently); not
        # a spreadsheet's blank-named columns past the table's (`target,value,,`), read before
        if twice := sorted({name for name in header if name and header.count(name) > 1}):
            raise error(f"{path}, line 1: column {twice[0]!r} appears twice in the header; {fix}")
        for cells in lines:
            if not cells:  # a blank line, skipped (as csv.DictReader does)
                continue
            if len(cells) != len(header):
                raise error(
                    f"{path}, line {lines.line_num}: {len(header)} columns in the header but "
                    f"{len(cells)} cells here; {fix}"
                )
            rows.append(dict(zip(header, cells, strict=True)))
    except csv.Error as exc:  # a cell past the field limit, a quote left open: one line
        raise error(f"{path}, line {lines.line_num}: {exc}; {fix}") from None
    return header, rows


def sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB pieces (data sets and images are GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def git_commit(cwd: str | os.PathLike = ".") -> str:
    """HEAD's sha, with '-dirty' when tracked files differ from it; 'unknown' outside git."""
    try:
        git = functools.partial(
            subprocess.run, cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        )
        sha = git(["git", "rev-parse", "HEAD"]).stdout.strip()
        dirty = git(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout, or a hung git
        return "unknown"
    return f"{sha}-dirty" if dirty else sha
