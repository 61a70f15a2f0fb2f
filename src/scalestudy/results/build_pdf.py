"""`scalestudy build-pdf`: a document's .tex (reports/paper.tex, proposal.tex, slides.tex) -> its
PDF beside it, with latexmk (pdfLaTeX).

Without latexmk or pdflatex on PATH, or a package the documents load
(tex_gaps; a beamer document's pgf too), it fails with the packages to install, naming the
document given (where pdflatex stops before its log all the same, its own line: no_log_cause);
the workflow asks for the PDF only when TeX can build it (workflow/rules/report.smk), and says
so when it cannot. A build removes the PDF of an earlier one first: a failed build leaves none,
never an old one beside the new .tex, nor the part of one a build wrote before it failed.
latexmk runs with -norc (no ~/.latexmkrc: a personal $out_dir moved the PDF) and -g (a whole
build each time: its record of a failed build answered later ones "Nothing to do"), and a build
that exits 0 without the PDF beside the .tex fails too. A stop (Ctrl-C, SIGTERM) ends TeX's
whole process group and leaves neither the PDF nor TeX's files read back by the next build
(TEX_STATE: each build removes an earlier one's, since one cut short, the .aux or the slides'
.out and .nav, failed every later build). A build that succeeded leaves the PDF and its .log
beside the .tex, none of TeX's or latexmk's other files.

    scalestudy build-pdf reports/paper.tex
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from scalestudy import log

logger = log.get(__name__)

TEX_PACKAGES = (
    "latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended lmodern "
    "texlive-pictures"  # pgf, which beamer (reports/slides.pdf) loads
)


# the packages the documents load (workflow/report/*.tex.j2) that a TeX of latexmk alone lacks:
# `apt-get install latexmk` brings texlive-latex-base, not booktabs (texlive-latex-recommended),
# and every PDF job then failed on "File `booktabs.sty' not found"
DOCUMENT_PACKAGES = ("geometry.sty", "booktabs.sty", "tabularx.sty", "longtable.sty")
DOCUMENT_PACKAGES += ("amsmath.sty", "lmodern.sty")


PGF = "pgfcore.sty"  # beamer's graphics layer (texlive-pictures): the slides only


def tex_gaps() -> list[str]:
    """What the documents' PDFs need and this machine lacks: latexmk, or the packages TeX's
    kpsewhich does not find; [] when they can be built. Asked once per process and PATH (the
    workflow asks for each document it may request), with the slides' pgf in the same call."""
    return [g for g in _gaps(os.environ.get("PATH", "")) if g != PGF]


KPSEWHICH_TIMEOUT_S = 10  # a TeX tree on a stalled network mount: the PDFs skipped, named


@functools.cache
def _gaps(path: str) -> tuple[str, ...]:
    """Of latexmk, pdflatex (missing from PATH, it stopped latexmk before any log, and
    build-pdf's line was the tail of latexmk's advice), DOCUMENT_PACKAGES and PGF, those
    missing where PATH is `path`. Not pdflatex's format: a TeX without one builds it on first
    use (kpathsea's mktexfmt); one it cannot build or read is named after the build
    (no_log_cause)."""
    names = (*DOCUMENT_PACKAGES, PGF)
    tools = {tool: shutil.which(tool, path=path) for tool in ("latexmk", "pdflatex", "kpsewhich")}
    if lacking := [tool for tool, found in tools.items() if found is None]:
        return (lacking[0],)
    try:
        found = subprocess.run(
            [tools["kpsewhich"], *names],
            capture_output=True,
            text=True,
            timeout=KPSEWHICH_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return (f"a working kpsewhich ({exc})",)
    got = {Path(line.strip()).name for line in found.stdout.splitlines() if line.strip()}
    return tuple(n for n in names if n not in got)


def missing(tex: str | Path, gaps: list[str] | None = None) -> str:
    """Why `tex`'s PDF is not built without latexmk (or a package it loads), and what to
    install: the document given, not always the paper (build-pdf of slides.tex named
    reports/paper.pdf)."""
    gaps = ["latexmk"] if gaps is None else gaps
    lacks = "latexmk is not installed" if gaps == ["latexmk"] else f"TeX lacks {', '.join(gaps)}"
    return (
        f"{lacks}, so {Path(tex).with_suffix('.pdf')} is not built ({tex} is); "
        f"install TeX with `apt-get install --no-install-recommends {TEX_PACKAGES}` "
        "(scripts/setup.sh does this as root)"
    )


MISSING = missing("reports/paper.tex")  # paper.pdf's line without latexmk (tests skip with it)
# the workflow's slides.pdf, skipped without pgf (beamer's graphics layer)
NO_PGF = (
    "pgf (texlive-pictures) is not installed, so reports/slides.pdf is not built "
    "(reports/slides.tex is); install it with `apt-get install --no-install-recommends "
    "texlive-pictures`"
)


# what TeX writes for the next pass to read back: the .aux, hyperref's bookmarks (.out), the
# table of contents (.toc), beamer's navigation (.nav, .snm); one cut short by a stop fails
# every later build ("File ended while scanning use of \@@BOOKMARK")
TEX_STATE = (".aux", ".out", ".toc", ".nav", ".snm")


# latexmk's own records of a build: with TEX_STATE, removed after one that succeeded, so that
# a document leaves its PDF and its .log (TeX's warnings: overfull boxes) beside the .tex, not
# files no rule declares (`snakemake --delete-all-output` left 16 of them in reports/)
LATEXMK_RECORDS = (".fls", ".fdb_latexmk")


def _remove_state(tex: Path, suffixes: tuple[str, ...] = TEX_STATE) -> None:
    for suffix in suffixes:
        tex.with_suffix(suffix).unlink(missing_ok=True)


def _latexmk(argv: list[str], pdf: Path) -> subprocess.CompletedProcess:
    """latexmk to its end, in a session of its own. Stopped (Ctrl-C, SIGTERM: cli's Stopped),
    its whole group goes, pdflatex too (killing latexmk alone left it writing the PDF), and
    what TeX wrote of the PDF and TEX_STATE with it: "a failed build leaves none"."""
    # errors="replace": an overfull-box warning prints the line in its font's 8-bit encoding
    # (T1 bytes for "Zürich", not UTF-8), which strict decoding turned into a traceback
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pdf.unlink(missing_ok=True)
        _remove_state(pdf)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def have_latexmk() -> bool:
    """latexmk and every package the documents load (tex_gaps)."""
    return not tex_gaps()


def have_beamer() -> bool:
    """What the documents need and pgf (beamer's graphics layer, texlive-pictures) for
    reports/slides.pdf."""
    return not _gaps(os.environ.get("PATH", ""))


MAX_PRINT_LINE = 79  # TeX Live's texmf.cnf: the log breaks a longer line after this many bytes


def first_tex_error(log_text: str) -> str | None:
    """TeX's first error in a .log: its whole `! message` and the `l.NN` line it names, e.g.
    "LaTeX Error: Unicode character ≥ (U+2265) not set up for use with LaTeX. (line 12)".

    The message goes on over the lines that follow it, up to the blank line, the `l.NN` line or
    TeX's context (`<argument> ...`) that ends it: a line of 79 bytes is TeX's break, joined to
    the next as it is; an indented line, or one starting `(pkg)` in a `Package pkg Error`, is
    LaTeX's \\MessageBreak, joined with a space. TeX counts bytes, so read the log with
    errors="surrogateescape": a character the break split in two is then joined again."""
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("! "):
            continue
        text, width = line[2:], _bytes(line)
        owner = re.match(r"(?:Package|Class) (\S+) Error: ", text)
        label = f"({owner.group(1)})" if owner else None
        end = i + 1
        for after in lines[i + 1 :]:
            if not after.strip() or re.match(r"l\.\d+\b|<[^<>]*>", after):
                break
            if width == MAX_PRINT_LINE:  # TeX's break, perhaps mid-word: nothing to add
                text += after
            elif after.startswith(" ") or (label and after.startswith(label)):
                rest = after.removeprefix(label) if label else after
                text = f"{text.rstrip()} {rest.strip()}"
            else:  # not the message (TeX's context of a macro, say)
                break
            width, end = _bytes(after), end + 1
        message = text.strip().encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        for after in lines[end : end + 20]:
            if m := re.match(r"l\.(\d+)\b", after):
                return f"{message} (line {m.group(1)})"
        return message
    return None


# what pdflatex (or the shell starting it) prints when it stops before writing a log: its format
# not found ("I can't find the format file"), damaged ("pdflatex: fatal: Could not undump") or
# of another TeX ("---! ... was written by ..."), itself or a program it runs not found
NO_LOG_CAUSE = re.compile(
    r"I can't find|fatal:|Fatal format file error|^---!|: not found|command not found"
    r"|Permission denied"
)


def no_log_cause(stdout: str, stderr: str) -> str:
    """Why latexmk failed where TeX wrote no log: the first line of its output (pdflatex's is
    on its stdout) that NO_LOG_CAUSE matches, else latexmk's last line on stderr. That last
    line alone was the tail of its -f advice ("to try to force complete processing.")."""
    lines = [line.strip() for line in (stdout + "\n" + stderr).splitlines()]
    cause = next((line for line in lines if NO_LOG_CAUSE.search(line)), None)
    return cause or (stderr.strip().splitlines() or ["no error in its log"])[-1]


def _bytes(line: str) -> int:
    """The width TeX gave a log line: its bytes, as they were read (surrogateescape)."""
    return len(line.encode("utf-8", "surrogateescape"))


def _beamer(tex: Path) -> bool:
    """Whether `tex` is a beamer document (slides.tex): its \\documentclass line, read
    leniently (an unreadable file is latexmk's to refuse)."""
    try:
        head = tex.read_text(errors="replace")[:4000]
    except OSError:
        return False
    return re.search(r"^\s*\\documentclass\s*(\[[^\]]*\])?\s*\{beamer\}", head, re.M) is not None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tex", help="the .tex file; the PDF is written beside it")


def run(args: argparse.Namespace) -> int:
    tex = Path(args.tex)
    if tex.suffix != ".tex" or not tex.is_file():  # latexmk would blame a log it never wrote
        if tex.suffix != ".tex":
            why = "is not a .tex file"
        elif tex.exists():  # a directory named x.tex, a device: "does not exist" misled
            why = "is a directory, not a file" if tex.is_dir() else "is not a regular file"
        else:
            why = "does not exist"
        logger.error(
            f"scalestudy build-pdf: {tex} {why}: give a document `scalestudy render-report` or "
            "`scalestudy proposal` wrote (reports/paper.tex, proposal.tex, slides.tex)"
        )
        return 2
    # slides (beamer) need pgf too: a build by hand without it printed TeX's error inside
    # beamer, not the package to install (the workflow asks have_beamer() first)
    gaps = list(_gaps(os.environ.get("PATH", ""))) if _beamer(tex) else tex_gaps()
    if gaps:
        logger.error(f"scalestudy build-pdf: {missing(tex, gaps)}")
        return 1
    # the PDF of an earlier build goes first: TeX stopping before its first page (a missing
    # package, an error in the title) left the old document beside the new .tex, and a failed
    # build looked like a finished one to anyone opening the PDF
    pdf = tex.with_suffix(".pdf")
    pdf.unlink(missing_ok=True)
    # -norc: no ~/.latexmkrc, $XDG_CONFIG_HOME/latexmk/latexmkrc, ./latexmkrc or system rc file.
    # A personal `$out_dir = 'build';` sent the PDF and the log to reports/build/ (build-pdf
    # still said "wrote reports/paper.pdf"), and any rc setting ($jobname, a previewer,
    # continuous mode) can move, rename or never finish what the workflow names as its output;
    # -outdir would undo only the first. This build needs nothing an rc file gives: everything
    # it asks for is below. -cd: figure paths in the .tex are relative to its directory;
    # nonstopmode + halt: a TeX error fails the job instead of waiting for input. -g: a whole
    # build every time: after a build that failed for a cause outside its inputs (a full quota,
    # a figure missing a moment) latexmk's .fdb_latexmk answered every later one with "Nothing
    # to do" and the old log's error, and the PDF never came back
    cmd = ["latexmk", "-norc", "-g", "-pdf", "-cd", "-interaction=nonstopmode", "-halt-on-error"]
    by_hand = f"`{shlex.join([*cmd[:5], str(tex)])}`"  # a path to paste: quoted
    log_file = tex.with_suffix(".log")
    log_file.unlink(missing_ok=True)  # an earlier build's error is none of this one's
    _remove_state(tex)  # and its files read back: one cut short failed every later build
    proc = _latexmk([*cmd, str(tex)], pdf)
    if proc.returncode != 0:  # one line: TeX's first error, not latexmk's 90 lines
        pdf.unlink(missing_ok=True)  # what TeX wrote of it before it stopped (a full quota)
        try:
            first = first_tex_error(log_file.read_text(errors="surrogateescape"))
        except OSError:  # latexmk stopped before TeX wrote one
            first = None
        why = first or no_log_cause(proc.stdout, proc.stderr)
        more = (
            f"the whole log: {log_file}"
            if log_file.is_file()
            else f"TeX wrote no log; run {by_hand} for latexmk's whole output"
        )
        logger.error(f"scalestudy build-pdf: latexmk failed on {tex}: {why}; {more}")
        return 1
    if not pdf.is_file():  # the exit status alone once reported a PDF that was not there
        logger.error(
            f"scalestudy build-pdf: latexmk exited 0 on {tex} but {pdf} is not there (it wrote "
            f"its output elsewhere or none); run {by_hand} and read where it writes"
        )
        return 1
    sys.stdout.write(proc.stdout[-4000:])  # latexmk's own output, passed on as it is
    _remove_state(tex, (*TEX_STATE, *LATEXMK_RECORDS))
    logger.info(f"wrote {pdf}")
    return 0
