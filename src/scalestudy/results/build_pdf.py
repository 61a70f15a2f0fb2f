"""`scalestudy build-pdf`: reports/paper.tex -> reports/paper.pdf with latexmk (pdfLaTeX).

Without latexmk on PATH it fails with the packages to install; the workflow asks for the PDF only
when latexmk is there (workflow/rules/report.smk), and says so when it is not.

    scalestudy build-pdf reports/paper.tex
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from scalestudy import log

logger = log.get(__name__)

TEX_PACKAGES = (
    "latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended lmodern "
    "texlive-pictures"  # pgf, which beamer (reports/slides.pdf) loads
)
MISSING = (
    "latexmk is not installed, so reports/paper.pdf is not built (reports/paper.tex is); "
    f"install TeX with `apt-get install --no-install-recommends {TEX_PACKAGES}` "
    "(scripts/setup.sh does this as root)"
)


def have_latexmk() -> bool:
    return shutil.which("latexmk") is not None


def have_beamer() -> bool:
    """latexmk and pgf (beamer's graphics layer, texlive-pictures) for reports/slides.pdf."""
    if not have_latexmk() or shutil.which("kpsewhich") is None:
        return False
    found = subprocess.run(["kpsewhich", "pgfcore.sty"], capture_output=True, text=True)
    return bool(found.stdout.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tex", help="the .tex file; the PDF is written beside it")


def run(args: argparse.Namespace) -> int:
    tex = Path(args.tex)
    if tex.suffix != ".tex" or not tex.is_file():  # latexmk would blame a log it never wrote
        why = "is not a .tex file" if tex.suffix != ".tex" else "does not exist"
        logger.error(
            f"scalestudy build-pdf: {tex} {why}: give a document `scalestudy render-report` or "
            "`scalestudy proposal` wrote (reports/paper.tex, proposal.tex, slides.tex)"
        )
        return 2
    if not have_latexmk():
        logger.error(f"scalestudy build-pdf: {MISSING}")
        return 1
    # -cd: figure paths in the .tex are relative to its directory; nonstopmode + halt: a TeX
    # error fails the job instead of waiting for input
    cmd = ["latexmk", "-pdf", "-cd", "-interaction=nonstopmode", "-halt-on-error", str(tex)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-4000:])  # latexmk's own output, passed on as it is
    if proc.returncode != 0:
        logger.error(
            f"scalestudy build-pdf: latexmk failed ({proc.returncode}); see "
            f"{tex.with_suffix('.log')}\n{proc.stderr[-2000:]}"
        )
        return 1
    logger.info(f"wrote {tex.with_suffix('.pdf')}")
    return 0
