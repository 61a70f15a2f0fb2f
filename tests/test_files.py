"""files.Cell: what a column of a CSV that scalestudy writes holds, shared by the readers that
check a file before they compute from it (collect, analyze, the plan, the profile CSVs); and
files.write_texts, the several outputs of one command written as one."""

from __future__ import annotations

import errno
import os
import signal
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from workflow_helpers import need, other_group

from scalestudy import files


@pytest.mark.parametrize(
    ("rule", "holds", "refused"),
    [
        # a JSON integer past a float's range (10**400 in a metrics.json) was an OverflowError
        (
            files.count(1),
            ["1", " 12 ", 3],
            ["0", "-1", "1.5", "2.0", "1e3", "inf", "", "x", 10**400],
        ),
        (files.count(0), ["0", "7"], ["-0", "0.0", "-1", "", "None"]),
        # a whole number in a range: collect's epoch number, the row's place (2, once)
        (files.Cell("2", 2, 2, whole=True), ["2", " 2 "], ["1", "3", "7", "2.0", ""]),
        (
            files.NUMBER,
            ["-3.5", "0", "1e300", 10**300],
            ["inf", "-inf", "nan?", "x", "", -(10**400)],
        ),
        (files.POSITIVE, ["1e-9", "250.5"], ["0", "-0.0", "-1", "inf", ""]),
        (files.NON_NEGATIVE, ["0", "0.0", "5"], ["-1e-9", "inf", "1e400", "abc", ""]),
        (files.FRACTION, ["0", "0.5", "1"], ["1.0001", "-0.1", "83", ""]),
        (files.PERCENT, ["0", "99.5", "100"], ["100.5", "-1", ""]),
        (files.NON_NEGATIVE.or_blank(), ["", " ", "None", "nan", "2"], ["-2", "x", "inf"]),
        # words: the texts a writer writes for a value that is no number (collect.VAL_LOSS)
        (
            files.Cell("a loss, or nan or inf", 0, words=("nan", "inf")),
            ["0", "1.1", "nan", "inf", " nan "],
            ["-1", "-inf", "NaN", "None", "", "x"],
        ),
    ],
)
def test_a_cell_rule_holds_what_the_writer_writes_and_nothing_else(rule, holds, refused):
    assert [t for t in holds if not rule.holds(t)] == []
    assert [t for t in refused if rule.holds(t)] == []


def test_a_csv_header_that_names_a_column_twice_is_refused(tmp_path):
    """Each row's dict kept the last cell under a repeated name: an edited epochs.csv with a
    second val_acc was read as that column, the first one dropped without a word."""
    path = tmp_path / "epochs.csv"
    path.write_text("epoch,val_acc,lr,val_acc\n1,0.35,0.1,0.99\n")
    with pytest.raises(ValueError) as refused:
        files.read_csv_table(path, ValueError, "fix it")
    assert str(refused.value) == (
        f"{path}, line 1: column 'val_acc' appears twice in the header; fix it"
    )
    path.write_text("epoch,val_acc,lr\n1,0.35,0.1\n")
    assert files.read_csv_table(path, ValueError, "fix it")[1] == [
        {"epoch": "1", "val_acc": "0.35", "lr": "0.1"}
    ]
    # a spreadsheet's blank columns past the table (`,,`) name nothing twice: read as before
    path.write_text("epoch,val_acc,,\n1,0.35,,\n")
    assert files.read_csv_table(path, ValueError, "fix it")[1] == [
        {"epoch": "1", "val_acc": "0.35", "": ""}
    ]


def test_the_directories_an_atomic_write_makes_are_synced(tmp_path, monkeypatch):
    """A write into directories it made synced only the file's own directory: the entries of
    the new directories in their parents could be lost in a crash (fsync(2)), and the file with
    them, on a file system that orders nothing for free (a cluster's)."""
    synced = []
    sync = files.fsync_dir
    monkeypatch.setattr(files, "fsync_dir", lambda d: (synced.append(Path(d)), sync(d)))
    files.write_text(tmp_path / "a" / "b" / "c.csv", "x\n")
    assert synced == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    synced.clear()  # a rewrite makes none: its directory alone
    files.write_text(tmp_path / "a" / "b" / "c.csv", "y\n")
    assert synced == [tmp_path / "a" / "b"]


def test_a_rule_says_what_it_wants():
    assert files.count(1).what == "a whole number >= 1"
    assert files.FRACTION.or_blank().what == files.FRACTION.what  # blank: not measured
    assert files.FRACTION.or_blank().blank and not files.FRACTION.blank


def test_write_texts_renames_nothing_until_every_file_is_written(tmp_path, monkeypatch):
    """A command's outputs written one after another left new files beside old ones when one
    failed part-way (a full disk). write_texts writes every temp file first: a failure at any
    of them (here os.fsync's ENOSPC at the n-th file) removes them all and names its file; a
    symlinked output stays a link and a file's mode is kept, as atomic_open does."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "c.csv").write_text("old c\n")
    (tmp_path / "c.csv").symlink_to("store/c.csv")
    targets = [tmp_path / "a.csv", tmp_path / "sub" / "b.html", tmp_path / "c.csv"]
    (tmp_path / "sub").mkdir()
    for path in targets[:2]:
        path.write_text(f"old {path.name[0]}\n")
    targets[0].chmod(0o600)
    texts = {path: f"new {path.name[0]}\n" for path in targets}

    def tree():
        return {
            p.relative_to(tmp_path): p.read_text() if not p.is_symlink() else os.readlink(p)
            for p in sorted(tmp_path.rglob("*"))
            if not p.is_dir()
        }

    old = tree()
    real = os.fsync
    for n in (1, 2, 3):
        synced = []

        def fsync(fd, n=n, synced=synced):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                synced.append(fd)
                if len(synced) == n:
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        with pytest.raises(OSError) as info:
            files.write_texts(texts)
        assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(targets[n - 1]))
        assert tree() == old, n  # every file old, no temp file left
    monkeypatch.setattr(os, "fsync", real)
    files.write_texts(texts)
    assert tree() == {
        **old,
        targets[0].relative_to(tmp_path): "new a\n",
        targets[1].relative_to(tmp_path): "new b\n",
        (tmp_path / "store" / "c.csv").relative_to(tmp_path): "new c\n",
    }
    assert targets[0].stat().st_mode & 0o777 == 0o600 and targets[2].is_symlink()


def test_a_stop_between_write_texts_renames_leaves_no_temp_file(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM/SIGHUP, which cli.py raises as it) landing between the renames of a
    command's outputs: the renames' cleanup caught only an OSError, so the temp files not yet
    renamed stayed beside their targets, hidden, for good. Now they are removed (the files
    renamed before it are new: a rename cannot be undone)."""
    texts = {tmp_path / f"{name}.csv": f"new {name}\n" for name in "abc"}
    for path in texts:
        path.write_text("old\n")
    real, renamed = os.replace, []

    def replace(src, dst):  # the signal arrives as the first rename is done
        real(src, dst)
        renamed.append(dst)
        if len(renamed) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    monkeypatch.setattr(os, "replace", replace)
    try:
        with pytest.raises(KeyboardInterrupt):
            files.write_texts(texts)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(renamed) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv", "c.csv"]
    assert [p.read_text() for p in texts] == ["new a\n", "old\n", "old\n"]


def test_write_texts_writes_a_pipe_in_place_after_the_files_temp_files(tmp_path):
    """A target that is no regular file (a FIFO, /dev/stdout) cannot be renamed onto: it is
    written through, once the other files' temp files are complete."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        files.write_texts({tmp_path / "a.csv": "a\n", pipe: "through the pipe\n"})
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert got == b"through the pipe\n" and stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert (tmp_path / "a.csv").read_text() == "a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "pipe"]


def test_a_pipe_whose_reader_is_gone_raises_an_unnamed_broken_pipe(tmp_path):
    """An in-place write to a pipe whose reader left (`--out /dev/stdout | head -1`) raised an
    OSError naming the pipe, which cli.main took for an unwritable path: "scalestudy inventory:
    /dev/stdout: Broken pipe", exit 2. Unnamed, cli.main ends quietly on it (test_errors)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone
    try:
        for write in (files.write_text, lambda p, t: files.write_texts({p: t})):
            with pytest.raises(BrokenPipeError) as info:
                write(f"/dev/fd/{write_end}", "x\n")  # this process's descriptor, in place
            assert (info.value.errno, info.value.filename) == (errno.EPIPE, None)
    finally:
        os.close(write_end)
    assert list(tmp_path.iterdir()) == []


def test_a_symlinked_output_is_checked_where_it_is_written(tmp_path):
    """An output that is a symlink is written beside the file it points to (write_target), but
    output_problems judged the link's own directory: `model.csv -> ../blocked/model.csv`,
    with `blocked` a file, passed, and the command failed at its write, after the work."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory goes\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.csv").symlink_to(blocked / "model.csv")
    assert files.output_problems([out / "model.csv"]) == [f"{blocked}: is a file, not a directory"]
    with pytest.raises(OSError):
        files.write_text(out / "model.csv", "a\n")
    # a link to a directory: the write would replace nothing it may
    (out / "dir.csv").symlink_to(tmp_path / "out", target_is_directory=True)
    assert files.output_problems([out / "dir.csv"]) == [
        f"{out / 'dir.csv'}: is a directory, not a file"
    ]


def test_a_symlink_loop_is_refused_not_replaced_by_a_file(tmp_path):
    """`loop1 -> loop2 -> loop1`: realpath gave the link itself, and the rename replaced the
    link with a regular file ("a symlink stays a link"); open() refuses it (ELOOP), so does
    the write now, naming the path, and the check before the work."""
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    loop = tmp_path / "loop1"
    assert files.output_problems([loop]) == [f"{loop}: Too many levels of symbolic links"]
    with pytest.raises(OSError) as info:
        files.write_text(loop, "a\n")
    assert (info.value.errno, info.value.filename) == (errno.ELOOP, str(loop))
    assert loop.is_symlink()


def test_an_output_under_a_symlink_to_a_missing_directory_is_refused_before_the_work(tmp_path):
    """`results -> /scratch/...` after the scratch was purged: the check walked up with
    exists(), False for a dangling link, and passed; the first write (after an epoch of
    training) then failed "results: File exists", which names no cause."""
    scratch = tmp_path / "scratch" / "results"  # purged: not there
    link = tmp_path / "results"
    link.symlink_to(scratch)
    says = f"cannot be made: {link} is a symlink to missing {scratch}: create it or remove the link"
    assert files.output_dir_problem(link) == says
    assert files.output_dir_problem(link / "runs" / "r1") == says
    assert files.output_problems([link / "csv" / "runs.csv"]) == [f"{link / 'csv'}: {says}"]
    with pytest.raises(OSError) as info:
        files.write_text(link / "csv" / "runs.csv", "a\n")
    assert (info.value.filename, info.value.strerror) == (
        str(link / "csv" / "runs.csv"),
        f"its directory {says}",
    )
    scratch.mkdir(parents=True)  # what the message asks for: then the link is a way through
    assert files.output_dir_problem(link / "runs" / "r1") is None
    files.write_text(link / "csv" / "runs.csv", "a\n")
    assert (scratch / "csv" / "runs.csv").read_text() == "a\n"


def test_a_write_onto_a_directory_says_so_for_the_current_and_root_directory(tmp_path, monkeypatch):
    """`scalestudy matrix --out ''` and `inventory --out /` said "Device or resource busy" (the
    rename onto the directory), a cause nobody looks for; every atomic write says it is a
    directory, before a temp file is made, and leaves the directory as it was."""
    monkeypatch.chdir(tmp_path)
    for path, named in (("", "."), (".", "."), (str(tmp_path), str(tmp_path))):
        with pytest.raises(IsADirectoryError) as info:
            files.write_text(path, "a\n")
        assert (info.value.filename, info.value.strerror) == (named, "Is a directory")
        assert os.listdir(tmp_path) == []


def test_a_new_file_gets_the_umask_of_its_write_not_of_the_first(tmp_path):
    """The mode of a new file was 0666 less the umask read at the first write and kept: a
    later umask (077 for a private output) was ignored. The kernel now makes the temp file as
    open() makes a file."""
    old = os.umask(0o022)
    try:
        files.write_text(tmp_path / "first.csv", "x\n")
        os.umask(0o077)
        files.write_text(tmp_path / "later.csv", "x\n")
        (tmp_path / "plain.csv").write_text("x\n")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"first.csv": 0o644, "later.csv": 0o600, "plain.csv": 0o600}


def test_a_rewrite_keeps_the_files_group_and_mode_from_its_first_byte(tmp_path):
    """A file shared by its group (`chgrp proj; chmod 640`) came back from a rewrite in the
    writer's group: the project's members could no longer read it. The group and mode are the
    temp file's before anything is written into it."""
    other = other_group()
    path = tmp_path / "runs.csv"
    path.write_text("old\n")
    os.chown(path, -1, other)
    path.chmod(0o640)
    with files.atomic_open(path) as f:
        early = os.fstat(f.fileno())
        f.write("new\n")
    assert (early.st_gid, stat.S_IMODE(early.st_mode)) == (other, 0o640)
    st = path.stat()
    assert (path.read_text(), st.st_gid, stat.S_IMODE(st.st_mode)) == ("new\n", other, 0o640)


# the kernel's POSIX ACL xattr (what setfacl writes): version 2, then (tag, permissions, id)
ACL_TAGS = {
    "user_obj": 0x01,
    "user": 0x02,
    "group_obj": 0x04,
    "group": 0x08,
    "mask": 0x10,
    "other": 0x20,
}
NO_ID = 0xFFFFFFFF


def acl(*entries: tuple[str, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", ACL_TAGS[tag], perm, ident) for tag, perm, ident in entries
    )


def set_acl(path, name: str, value: bytes) -> None:
    try:
        os.setxattr(path, name, value)
    except OSError as exc:  # a file system mounted without ACLs
        need(f"POSIX ACLs on {path} ({exc.strerror})", "a tmpfs or ext4 (CI's /tmp has them)")


def test_a_new_file_gets_the_directorys_default_acl_as_open_gives_it(tmp_path):
    """A project directory shared by a default ACL (`setfacl -d -m g:proj:rwx`), whatever a
    member's umask: open() gives a new file the group's rw, but the atomic write made it 0600
    (mkstemp) and chmod'ed it to 0666 less the umask, which set the ACL's mask to nothing."""
    shared = tmp_path / "shared"
    shared.mkdir()
    set_acl(
        shared,
        "system.posix_acl_default",
        acl(
            ("user_obj", 7, NO_ID),
            ("group_obj", 5, NO_ID),
            ("group", 7, 4242),
            ("mask", 7, NO_ID),
            ("other", 0, NO_ID),
        ),
    )
    old = os.umask(0o077)  # a member's private umask, which the ACL overrides
    try:
        files.write_text(shared / "atomic.csv", "x\n")
        (shared / "plain.csv").write_text("x\n")
    finally:
        os.umask(old)

    def permissions(name):
        p = shared / name
        return stat.S_IMODE(p.stat().st_mode), os.getxattr(p, "system.posix_acl_access")

    assert permissions("atomic.csv") == permissions("plain.csv")
    assert permissions("plain.csv")[0] == 0o660  # the group's rw: the ACL, not the umask


def test_a_rewrite_keeps_the_files_acl(tmp_path):
    """A file given to a second group by an ACL (`setfacl -m g:proj:rw`) lost it on a rewrite
    (the new file had only its mode)."""
    path = tmp_path / "runs.csv"
    path.write_text("old\n")
    path.chmod(0o640)
    given = acl(
        ("user_obj", 6, NO_ID),
        ("group_obj", 4, NO_ID),
        ("group", 6, 4242),
        ("mask", 6, NO_ID),
        ("other", 0, NO_ID),
    )
    set_acl(path, "system.posix_acl_access", given)
    before = stat.S_IMODE(path.stat().st_mode)  # 0660: the mode's group bits are the mask
    files.write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert os.getxattr(path, "system.posix_acl_access") == given
    assert stat.S_IMODE(path.stat().st_mode) == before == 0o660


def as_ordinary_user(work: Callable[[], object]) -> str:
    """What `work()` returned, or the error it raised (`Type: message`), done as a user whom
    the kernel's permission checks apply to: as root in a forked child that became nobody
    (root may write any directory); here itself otherwise."""
    if os.geteuid() != 0:
        try:
            return repr(work())
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                said = repr(work())
            except Exception as exc:
                said = f"{type(exc).__name__}: {exc}"
            os.write(write_end, said.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def shared_dir():
    """A directory in /tmp that every user can reach (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        os.chmod(d, 0o755)
        yield Path(d)


def test_a_directory_without_write_permission_is_named_not_the_writable_file(shared_dir):
    """A file the user may write (0666) in a directory the user may not (an admin's shared
    results directory): the atomic write cannot make its temp file there, and said
    "<file>: Permission denied", which `ls -l` of the file contradicts."""
    out = shared_dir / "runs.tsv"
    out.write_text("old\n")
    out.chmod(0o666)
    said = as_ordinary_user(lambda: files.write_text(out, "new\n"))
    assert said == (
        f"PermissionError: [Errno 13] cannot create a temporary file in {shared_dir} (the "
        f"write is atomic: it needs write permission on the directory): '{out}'"
    )
    assert out.read_text() == "old\n"


def test_a_write_where_the_file_system_makes_no_files_names_the_directory():
    """/proc exists and root may "write" it (os.access says so), yet it makes no new files:
    the temp file's ENOENT was "/proc/plan.md: No such file or directory", as if the path
    were mistyped."""
    target = Path("/proc/scalestudy-plan.md")
    with pytest.raises(FileNotFoundError) as refused:
        files.write_text(target, "x\n")
    assert str(refused.value) == (
        "[Errno 2] cannot create a file in /proc: its file system makes no new files there "
        "(e.g. /proc, /sys); write somewhere else: '/proc/scalestudy-plan.md'"
    )


def test_a_write_into_a_directory_the_user_may_not_list_succeeds(shared_dir):
    """A drop-box (0733: write, no read): the temp file was renamed into place, then opening
    the directory for its fsync failed, "Permission denied", exit 2 for a file written."""
    box = shared_dir / "box"
    box.mkdir()
    box.chmod(0o733)
    said = as_ordinary_user(lambda: files.write_texts({box / "a.tsv": "a\n", box / "b.tsv": "b\n"}))
    assert said == "None"
    assert sorted(p.name for p in box.iterdir()) == ["a.tsv", "b.tsv"]  # no temp file left
    assert (box / "a.tsv").read_text() == "a\n"


def test_check_distinct_finds_one_file_under_two_names_but_not_a_shared_device(tmp_path):
    """Two outputs naming one file (a link, `..`, a hard link) or an output naming an input:
    one line naming both; two outputs to /dev/null discard both and are no collision."""
    (tmp_path / "a.csv").write_text("x\n")
    os.link(tmp_path / "a.csv", tmp_path / "hard.csv")
    (tmp_path / "sym.csv").symlink_to(tmp_path / "new.csv")  # a link to a file not made yet
    for a, b in (("a.csv", "hard.csv"), ("new.csv", "sym.csv"), ("new.csv", "d/../new.csv")):
        with pytest.raises(ValueError, match=rf"--x and --y are one file \(.*{b}\)"):
            files.check_distinct({"--x": tmp_path / a, "--y": tmp_path / b}, {}, ValueError)
    with pytest.raises(ValueError, match=r"--x is the input --in \(.*hard\.csv\)"):
        files.check_distinct(
            {"--x": tmp_path / "a.csv"}, {"--in": tmp_path / "hard.csv"}, ValueError
        )
    files.check_distinct({"--x": "/dev/null", "--y": "/dev/null"}, {"--in": ""}, ValueError)
    files.check_distinct({"--x": tmp_path / "a.csv", "--y": tmp_path / "b.csv"}, {}, ValueError)


def test_an_ordinary_user_writes_outputs_to_dev_stdout_and_dev_null():
    """output_problems checked the directory of every output, /dev for /dev/stdout, which only
    root may write in: for every other user `scalestudy plan --out-md /dev/stdout` (cli.py's
    own example) was "nothing written: /dev: cannot be written". A file written in place
    needs no directory."""
    said = as_ordinary_user(lambda: files.output_problems(["/dev/stdout", "/dev/null"]))
    assert said == "[]", said


def test_two_outputs_to_dev_stdout_are_refused_two_to_dev_null_are_not():
    """write_texts keys its files by path: `plan --out-md /dev/stdout --out-csv /dev/stdout`
    printed the CSV alone and said it wrote both."""
    with pytest.raises(ValueError, match="--out-md and --out-csv are one file"):
        files.check_distinct(
            {"--out-md": "/dev/stdout", "--out-csv": "/dev/stdout"}, {}, ValueError
        )
    files.check_distinct({"--out-md": "/dev/null", "--out-csv": "/dev/null"}, {}, ValueError)


def test_a_rewrite_of_a_file_without_an_acl_adds_none(tmp_path):
    """The temp file took the directory's default ACL (`setfacl -d -m u:4242:rw`, set after
    the file was made), and the rewrite of a 0640 file without an ACL gave user 4242 its
    contents: a rewrite keeps the file's permissions, an absent ACL among them."""
    shared = tmp_path / "shared"
    shared.mkdir()
    path = shared / "runs.csv"
    path.write_text("old\n")
    path.chmod(0o640)
    set_acl(
        shared,
        "system.posix_acl_default",
        acl(
            ("user_obj", 7, NO_ID),
            ("user", 6, 4242),
            ("group_obj", 5, NO_ID),
            ("mask", 7, NO_ID),
            ("other", 0, NO_ID),
        ),  # fmt: skip
    )
    files.write_text(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    with pytest.raises(OSError) as err:
        os.getxattr(path, "system.posix_acl_access")
    assert err.value.errno == errno.ENODATA


def test_a_text_cell_with_a_carriage_return_reads_back(tmp_path):
    """csv's writer quotes what its line terminator holds ("\\n"): a lone "\\r" (a path typed at
    the end of a CRLF job script, recorded in metrics.json) was written bare, and read back
    as a row cut in two."""
    rows = [{"run": "w1_r0", "checkpoint_dir": "/scratch/ck\r", "x": "1"}]
    path = tmp_path / "runs.csv"
    path.write_text(files.csv_text(None, rows))
    assert files.read_csv_rows(path, ValueError, "fix it") == rows


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('run,x\nw1,"' + "y" * 200_000 + "\n", "field larger than field limit"),
        ('run,x\nw1,"unmatched\nw2,3\n', "unexpected end of data"),
    ],
)
def test_a_csv_the_csv_module_refuses_is_one_line_naming_it(tmp_path, text, says):
    """A quote left open: a traceback (csv.Error) past 128 KiB of cell, and below that the rows
    after it swallowed into one cell without a word."""
    path = tmp_path / "runs.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"runs\.csv, line \d+: .*{says}.*; fix it"):
        files.read_csv_rows(path, ValueError, "fix it")


def test_a_descriptor_that_is_not_open_is_named(tmp_path):
    """`--out /dev/fd/7` with no descriptor 7 (or /dev/stdout after `>&-`): os.dup's EBADF was
    a traceback naming no file."""
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)  # a number no descriptor has now
    with pytest.raises(OSError) as err:
        files.write_text(f"/dev/fd/{fd}", "x\n")
    assert err.value.filename == f"/dev/fd/{fd}" and err.value.errno == errno.EBADF


# in a mount namespace of its own: directory a bound onto b, two new outputs a/x and b/x
BOUND = """
set -e
mkdir -p "$WORK/a" "$WORK/b"
mount --bind "$WORK/a" "$WORK/b"
"$PYTHON" -c '
import os, sys
from scalestudy import files
w = os.environ["WORK"]
print(files.one_file(w + "/a/plan.out", w + "/b/plan.out"), files.one_file(w + "/a/x", w + "/a/y"))
'
"""


def test_two_new_outputs_in_one_directory_reached_by_two_mounts_are_one_file(tmp_path):
    """One file system mounted at /scratch and /gpfs/scratch (a bind mount): realpath does not
    join them and samefile needs the files, so `--out-md a/plan.out --out-csv b/plan.out`
    wrote the CSV over the Markdown and said it wrote both."""
    try:
        usable = subprocess.run(["unshare", "-rm", "true"], timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        usable = False
    if not usable:
        need("a mount namespace of its own (unshare -rm)", "run the tests as root (CI does)")
    from workflow_helpers import child_env

    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", BOUND],
        capture_output=True,
        text=True,
        env={**child_env(), "PYTHON": sys.executable, "WORK": str(tmp_path)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"], proc.stdout


def test_a_failing_disk_inside_a_write_names_the_file(tmp_path, monkeypatch):
    """EIO from a write inside write_files (a text over the buffer size reaches the disk there)
    or from the directory's fsync after the renames named no file: the CLI took it for a bug,
    a traceback and exit 1, where a full disk was one line naming the file."""
    target = tmp_path / "plan.csv"

    def failing(f):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError) as failed:
        files.write_files({target: failing})
    assert failed.value.filename == str(target) and failed.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []  # no temp file, no target

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(OSError) as failed:
        files.fsync_dir(tmp_path)
    assert failed.value.filename == str(tmp_path) and failed.value.errno == errno.EIO
