"""`scalestudy render-report`: reports/study.md and reports/paper.tex from the analysis CSVs only.

The templates (workflow/report/study.md.j2, paper.tex.j2) receive the rows of scaling.csv,
verdicts.csv, resources.csv, system.csv, targets.csv, profile_shares.csv, waterfall.csv and the
scaling model's model.csv and bucket_advice.csv (results/model.py), and nothing else; every number
they print is a cell as it is (a count: world size, n, nodes) or through a filter: one of the
FORMATS below, fmt_num_apart and fmt_pct_apart (a value with the digits that tell it from its
target or threshold) or fmt_pct_bar (a threshold or tolerance with all its decimals).
The `strategy` filter names the runs' strategy (system.csv) as vocab.STRATEGY_NAMES does.
`numbers_backed_by_csvs` is the check that each numeric token of a rendered document is some CSV
cell under one of those formats (tests/test_report.py runs it on the tiny study's documents). The
only numbers a document may show without a cell are FORMULA_CONSTANTS, the constant 1 of the
formulas (E_w = T(N0)/T(N), Karp-Flatt's 1/S - 1/p, the n - 1 of the sample std).

    scalestudy render-report --csv-dir results/csv --templates workflow/report --out-dir reports
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
from decimal import Decimal
from pathlib import Path

import jinja2

from scalestudy import files, log, vocab
from scalestudy.errors import AnalysisError
from scalestudy.results.analyze import (
    MEASURED_COUNTS,
    NOT_PROFILED,
    PROFILING_KEY,
    SYSTEM_COLUMNS,
    TABLE_COLUMNS,
    TABLE_NAMES,
    check_table,
    check_targets,
    read_csv,
    read_table,
)
from scalestudy.results.model import ADVICE_COLUMNS, MODEL_COLUMNS
from scalestudy.results.plot import FIGURES
from scalestudy.results.printed import APART_DECIMALS, fmt_pct_apart, pct_text
from scalestudy.results.printed import cell_float as _float

logger = log.get(__name__)

# analyze's tables, then the scaling model's (results/model.py)
ANALYSIS_TABLES = TABLE_NAMES
TABLES = (*ANALYSIS_TABLES, "model", "bucket_advice")
# the tables written with rows for every study that ran, by the command that writes them
# (verdicts: one per target; targets: report.targets; resources: the total at least; model: its
# fit, or why there is none): a 0-byte copy is damage
FILLED_TABLES = {
    **dict.fromkeys(("scaling", "system", "verdicts", "targets", "resources"), "analyze"),
    "model": "model",
}
DOCUMENTS = ("study.md", "paper.tex")
# the scaling model's tables (results/model.py), checked as analyze's (check_table: columns, a
# number or blank outside the columns of words, never blank where named): a word or an inf in a
# number cell was printed "n/a", which the documents define as "not measured"
MODEL_TABLES = {
    "model": (MODEL_COLUMNS, ("kind", "name", "precision", "unit", "note"), ("kind", "name")),
    "bucket_advice": (ADVICE_COLUMNS, ("precision", "extrapolated", "note"), ()),
}
# system.csv: its columns, each of words and numbers alike (the inventory's values)
SYSTEM_SPEC = (SYSTEM_COLUMNS, SYSTEM_COLUMNS, ("section", "key"))
# model.csv's parameters a document shows (the rest, e.g. the inverse bandwidths, stay in the CSV);
# "fit" and "compute" are rows without a value whose note says why there is no fit, or no
# compute model of a precision
MODEL_PARAMS = ("fit", "compute", "alpha_s", "beta_intra_Bps", "beta_inter_Bps", "compute_c0_s",
                "compute_c1_s_per_img", "backward_frac", "fit_points", "fit_dof",
                "fit_residual_rel_sd", "fit_below_compute")  # fmt: skip
FORMULA_CONSTANTS = frozenset({"1"})
# the templates of the checkout this package runs from (src/scalestudy/results/ -> the root): a
# hand-run render-report finds them from any directory; the workflow names its own
TEMPLATES = Path(__file__).resolve().parents[3] / "workflow" / "report"
# a number standing alone, with its sign when it has one ("-5.0" and "+5.0" are different claims):
# not part of an identifier (fp32, w8_lb128, a4paper, 25mm); "n - 1" is the number 1
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?:e[-+]\d+)?(?!\w)")


def fmt_num(value) -> str:
    """3 significant digits, fixed point (fmt_sig); blank -> n/a."""
    return fmt_sig(value, 3)


def fmt_sig(value, digits: int) -> str:
    """`digits` significant digits in fixed point, and every digit before the point of a
    number of more (20520280954.2 -> 20520280954); integers (below 1e6) as they are; below
    1e-4, where fixed point would print 0.0000, in exponent form; blank -> n/a."""
    x = _float(value)
    if x is None:
        return "n/a"
    if x == int(x) and abs(x) < 1e6 and "." not in str(value).rstrip("0").rstrip("."):
        return str(int(x))
    if x == 0:
        return "0"
    if abs(x) < 1e-4:
        return f"{x:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


# the most significant digits ratio_digits gives two cells (a cell has 12)
SIG_DIGITS = 12


def fmt_num_apart(value, other) -> str:
    """3 significant digits (fmt_num), or as many more as it takes to print the cell apart
    from `other` (a target: a precision speedup against 1 + optimisation_speedup), unless
    the two are equal: a speedup of 1.19996 printed "1.20" beside a 20% target it fails. Apart
    means a text other than the target's at those digits, a printed value other than the
    target (a whole-number target prints as "2" at every digit count, and 1.9996 printed
    "2.00" beside the 2x target it fails) and on the value's side of it (1.124 printed "1.12"
    beside a target of 1.123)."""
    x, o = _float(value), _float(other)
    if o is not None:  # a cell's precision: 1 + 0.14 is 1.1400000000000001, no cell's 1.14
        o = float(f"{o:.{SIG_DIGITS}g}")
    for digits in range(3, SIG_DIGITS + 1):
        text = fmt_sig(value, digits)
        if x is None or o is None or x == o:
            return text
        shown = float(text)
        if text != fmt_sig(o, digits) and shown != o and (shown > o) == (x > o):
            return text
    return text


def ratio_digits(numerator, denominator, ratio) -> int:
    """The fewest significant digits (3 to SIG_DIGITS) at which the cells `numerator` and
    `denominator`, printed (fmt_sig), give the cell `ratio` = numerator / denominator - 1 as it
    is printed (fmt_signed_pct): the bucket advice's gain = T(default) / T(best) - 1 and the
    held-out error = predicted / measured - 1 beside the two step times. At 3 digits each,
    0.0116 and 0.0124 stood beside a gain of +7.4 (they give +6.9). 3 where a cell is blank."""
    a, b, r = _float(numerator), _float(denominator), _float(ratio)
    if a is None or b is None or r is None:
        return 3
    for digits in range(3, SIG_DIGITS + 1):
        shown = float(fmt_sig(a, digits)), float(fmt_sig(b, digits))
        if shown[1] and fmt_signed_pct(shown[0] / shown[1] - 1) == fmt_signed_pct(r):
            return digits
    return SIG_DIGITS


def fmt_pct(value, decimals: int = 1) -> str:
    """A fraction as a percentage with one decimal (0.8532 -> 85.3), or `decimals`; a share
    other than 0 that would print as 0 with two significant digits instead (printed.pct_text:
    an MFU spread of 5.6e-05 read "0.0", none, beside the TFLOP/s spread it is); blank ->
    n/a."""
    x = _float(value)
    return "n/a" if x is None else pct_text(x, decimals)


def fmt_signed_pct(value, decimals: int = 1) -> str:
    """fmt_pct with its sign."""
    x = _float(value)
    return "n/a" if x is None else pct_text(x, decimals, signed=True)


def fmt_fixed(value, decimals: int) -> str:
    """A number with `decimals` decimals (summing_decimals'); blank -> n/a."""
    x = _float(value)
    return "n/a" if x is None else f"{x:.{decimals}f}"


def summing_decimals(parts, total, scale: float = 100, least: int | None = 1) -> int:
    """The fewest decimals (least, or those fmt_num gives `total` where least is None, to
    APART_DECIMALS) at which the cells `parts` (blank ones left out), times `scale` and
    printed, add up to `total` printed: a waterfall row's four parts to its loss (percent), X
    and the loss to X_ideal (img/s). Each rounded on its own, the demo's printed +13.9 +0.1
    +0.3 -0.7 beside a loss of 13.5, and 2382 - 534 = 1849."""
    xs, t = [x for x in map(_float, parts) if x is not None], _float(total)
    if least is None:
        least = _decimals(fmt_num(total)) if t is not None and abs(t) >= 1e-4 else 1
    for k in range(least, APART_DECIMALS + 1):
        if t is None or sum(_shown(x, k, scale) for x in xs) == _shown(t, k, scale):
            return k
    return APART_DECIMALS


def _shown(x: float, decimals: int, scale: float) -> Decimal:
    """x x scale as the templates print it at `decimals`: a percentage (scale 100) by pct and
    spct (a part other than 0 never as 0: its two significant digits counted, or the row's
    printed parts did not add up to its loss), else fixed."""
    return Decimal(pct_text(x, decimals) if scale == 100 else f"{scale * x:.{decimals}f}")


def fmt_exact(value) -> str:
    """The cell's value itself (12 significant digits, as analyze.cell writes it), for numbers
    a reader recomputes: the proposal's node-hours = runs x hours per run x nodes, and their
    sums, which `num`'s 3 digits would round (and could round down); blank -> n/a."""
    x = _float(value)
    return "n/a" if x is None else f"{x:.12g}"


FORMATS = {"num": fmt_num, "pct": fmt_pct, "spct": fmt_signed_pct, "exact": fmt_exact}


def _decimals(text: str) -> int:
    """How many decimals a number printed as `text` has."""
    return len(text.partition(".")[2])


def fmt_pct_bar(value, beside=None) -> str:
    """A threshold or tolerance (a fraction) as a percentage with every decimal it has (at least
    one, at most APART_DECIMALS), and at least as many as fmt_pct_apart gives `beside`, the value
    judged against it: a threshold of 0.8425 printed ">= 84.2" beside a measured 84.24 and "fail",
    a tolerance of 0.0125 "1.2 percentage points" beside a difference of -1.24 within it. Now
    84.25 and 1.25; a threshold of 0.7 beside a measured 69.96 is 70.00. blank -> n/a."""
    x = _float(value)
    if x is None:
        return "n/a"
    own = _decimals(f"{100 * x:.{APART_DECIMALS}f}".rstrip("0"))
    shown = 0 if _float(beside) is None else _decimals(fmt_pct_apart(beside, value))
    return f"{100 * x:.{max(1, own, shown)}f}"


# the singular of the units the documents count ("1 GPUs", "1 ranks" read wrong)
def plural(unit: str, count) -> str:
    """`unit` as it reads after `count`, a cell or a number (vocab.plural)."""
    return vocab.plural(unit, _float(count))


def strategy_name(value) -> str:
    """system.csv's ("run settings", "strategy") cell, the runs' distinct strategies
    ("; "-joined), as the documents name it (the `strategy` filter): vocab.STRATEGY_NAMES of
    each, joined by "and"; a value outside the vocabulary as it is ("train.strategy not
    recorded"). Every document called an FSDP or all-reduce study "PyTorch DDP"."""
    return " and ".join(
        vocab.STRATEGY_NAMES.get(v, f"train.strategy {v}") for v in str(value).split("; ")
    )


def repeats_range(fewest, most) -> str:
    """system.csv's repeats_min and repeats_max as the documents say them before "per
    configuration": "3 repeats", "1 repeat", or "1 to 3 repeats" where they differ."""
    if fewest == most:
        return f"{fmt_num(fewest)} {plural('repeats', fewest)}"
    return f"{fmt_num(fewest)} to {fmt_num(most)} repeats"


def md_cell(value) -> str:
    """Free text (a config value, a note) as one Markdown table cell: GitHub's tables end a cell
    at every '|' not escaped, in a code span too, and a row at a line break (a study named
    "a|b" split the system table's row into four cells)."""
    return " ".join(str(value).splitlines()).replace("|", r"\|")


TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    # an argument's delimiters where a text follows a command: `[` opens an optional one
    # (\item's label, \\'s space), beamer's `<` an overlay; "[draft] ..." after \item lost
    # its brackets as the item's label, "<5 hours ..." stopped latexmk. Braced, as pandoc does
    "[": "{[}",
    "]": "{]}",
    "<": "{<}",
    # symbols a study name or proposal text may hold that pdfLaTeX's UTF-8 input does not set
    # ("Unicode character ... not set up for use with LaTeX"): as math
    "≥": r"\ensuremath{\geq}",
    "≤": r"\ensuremath{\leq}",
    "≈": r"\ensuremath{\approx}",
    "−": r"\ensuremath{-}",
    "→": r"\ensuremath{\rightarrow}",
    "μ": r"\ensuremath{\mu}",
}
# TeX's special characters and every non-ASCII character (kept, mapped or replaced: tex_escape)
_NON_ASCII = re.compile("[^\\x00-\\x7f]")
# T1's ligatures: -- (an en dash), << >> (guillemets; `<` is braced anyway: TEX_SPECIAL), ,, ''
# `` (quotes), ?` !` (inverted marks);
# a name says what it says: "ResNet--fp16" was set "ResNet–fp16". Broken with an empty group
_LIGATURE = r"-(?=-)|>(?=>)|,(?=,)|'(?=')|`(?=`)|[?!](?=`)"
_LIGATURE_AT = re.compile(_LIGATURE)
_TEX_ESCAPED = re.compile(
    "|".join([*(re.escape(c) for c in TEX_SPECIAL), _LIGATURE, _NON_ASCII.pattern])
)


# The non-ASCII characters pdfLaTeX sets with the documents' fonts (T1 with lmodern, and the
# TS1/OMS symbols LaTeX's UTF-8 input switches to): every \\DeclareUnicodeCharacter of the LaTeX
# kernel's t1enc.dfu, ts1enc.dfu, ot1enc.dfu, omsenc.dfu and utf8.def (TeX Live 2022), as
# (first, last) code points; all of them build with the templates' preamble (checked by hand
# with pdfTeX 1.40.24). Any other character (Cyrillic, Greek, CJK, emoji) stops pdfLaTeX with
# "Unicode character ... not set up for use with LaTeX".
PDFLATEX_RANGES = (
    (0x00A0, 0x0125), (0x0128, 0x0137), (0x0139, 0x013E), (0x0141, 0x0148), (0x014A, 0x0165),
    (0x0168, 0x017E), (0x0192, 0x0192), (0x01C4, 0x01D4), (0x01E2, 0x01E3), (0x01E6, 0x01EB),
    (0x01F0, 0x01F0), (0x01F4, 0x01F5), (0x0218, 0x021B), (0x0232, 0x0233), (0x0237, 0x0237),
    (0x02C6, 0x02C7), (0x02D8, 0x02D9), (0x02DB, 0x02DD), (0x0E3F, 0x0E3F), (0x1E02, 0x1E03),
    (0x1E0D, 0x1E0D), (0x1E1E, 0x1E21), (0x1E25, 0x1E25), (0x1E30, 0x1E31), (0x1E37, 0x1E37),
    (0x1E43, 0x1E43), (0x1E45, 0x1E45), (0x1E47, 0x1E47), (0x1E5B, 0x1E5B), (0x1E63, 0x1E63),
    (0x1E6D, 0x1E6D), (0x1E8E, 0x1E91), (0x1E9E, 0x1E9E), (0x1EF2, 0x1EF3), (0x2010, 0x2016),
    (0x2018, 0x201A), (0x201C, 0x201E), (0x2020, 0x2022), (0x2026, 0x2026), (0x2030, 0x2031),
    (0x2039, 0x203B), (0x203D, 0x203D), (0x2044, 0x2044), (0x204E, 0x204E), (0x2052, 0x2052),
    (0x20A1, 0x20A1), (0x20A4, 0x20A4), (0x20A6, 0x20A6), (0x20A9, 0x20A9), (0x20AB, 0x20AC),
    (0x20B1, 0x20B1), (0x2103, 0x2103), (0x2116, 0x2117), (0x211E, 0x211E), (0x2120, 0x2120),
    (0x2122, 0x2122), (0x2126, 0x2127), (0x212E, 0x212E), (0x2190, 0x2193), (0x2329, 0x232A),
    (0x2422, 0x2423), (0x25E6, 0x25E6), (0x25EF, 0x25EF), (0x266A, 0x266A), (0x27E8, 0x27E9),
    (0x3008, 0x3009), (0xFB00, 0xFB06),
)  # fmt: skip
# set in roman, but missing from the typewriter font (ec-lmtt10, ts1-lmtt10) the documents set
# names and commands in (\texttt), where pdfLaTeX drops them with a log line only
NOT_IN_TYPEWRITER = frozenset("™℠‱Ĳĳẞ")
PDFLATEX_CHARS = (
    frozenset(chr(c) for first, last in PDFLATEX_RANGES for c in range(first, last + 1))
    - NOT_IN_TYPEWRITER
)
UNSETTABLE = "?"  # what such a character becomes in the LaTeX documents (the Markdown keeps it)


def _settable(c: str, unset: set[str] | None) -> str:
    """A non-ASCII character itself where pdfLaTeX sets it, else UNSETTABLE (noted in unset)."""
    if c in PDFLATEX_CHARS:
        return c
    if unset is not None:
        unset.add(c)
    return UNSETTABLE


def tex_escape(value, unset: set[str] | None = None) -> str:
    """Text for LaTeX (the `e` filter): one pass, so the braces of \\textbackslash{} are not
    escaped again; a character pdfLaTeX cannot set becomes UNSETTABLE (and is added to `unset`)."""

    def one(m: re.Match) -> str:
        c = m.group()
        if c in TEX_SPECIAL:
            return TEX_SPECIAL[c]
        return c + "{}" if c.isascii() else _settable(c, unset)  # a ligature's first, or not

    return _TEX_ESCAPED.sub(one, str(value))


# a line may break here: layout, not content (numbers_backed_by_csvs reads past it)
BREAK = "\\allowbreak{}"
_BREAK_AFTER = frozenset(";,/:.=-_@+")
_BREAK_EVERY = 8  # characters of a letter-and-digit run (a sha256, a node name)


def tex_breakable(value, unset: set[str] | None = None) -> str:
    """tex_escape's text for a \\texttt table cell that must fit its column (the `b` filter):
    a line may break after a separator and every 8 characters of a longer run. A commit, an
    image digest or a host list in \\texttt never broke, and ran off the page (440 pt)."""
    pieces, run, text = [], 0, str(value)
    for i, c in enumerate(text):
        # escaped a character at a time: a ligature's first (<<, ?`) is broken here
        pieces.append(tex_escape(c, unset) + ("{}" if _LIGATURE_AT.match(text, i) else ""))
        run = run + 1 if c.isalnum() else 0
        if c in _BREAK_AFTER or run == _BREAK_EVERY:
            pieces.append(BREAK)
            run = 0
    return "".join(pieces).removesuffix(BREAK)


def tex_prose(value, unset: set[str] | None = None) -> str:
    """tex_escape's text for prose that names columns (a waterfall note's
    data_time_ms_mean_by_rank; the `p` filter): a line may break after each underscore, else
    such a name ran 33 pt past the margin."""
    return tex_escape(value, unset).replace("\\_", "\\_" + BREAK)


def tex_verbatim(value, unset: set[str] | None = None) -> str:
    """Text for a verbatim block (the `v` filter): as written, since TeX's special characters
    are literal there, but a character pdfLaTeX cannot set becomes UNSETTABLE as in tex_escape."""
    return _NON_ASCII.sub(lambda m: _settable(m.group(), unset), str(value))


def warn_unsettable(tex: jinja2.Environment, documents: list[str]) -> None:
    """One warning naming the characters the LaTeX environment's filters replaced so far."""
    chars = sorted(tex.unsettable)
    if chars:
        logger.warning(
            f"{', '.join(documents)}: pdfLaTeX cannot set {len(chars)} distinct characters "
            f"({' '.join(chars[:20])}{' ...' if len(chars) > 20 else ''}) of the study's text "
            f"(its name, the proposal's words): each is {UNSETTABLE} in the PDF; the Markdown "
            "keeps them"
        )


def load_tables(csv_dir: Path, names: tuple[str, ...] = TABLES) -> dict[str, list[dict]]:
    """csv_dir's (--csv-dir) tables by name; analyze's checked as it writes them (read_table).
    A damaged one of the study's results/csv is made again by snakemake; of another directory
    (`snakemake {csv_dir}/scaling.csv` was the fix, which snakemake cannot make) the user's to
    fix (files.input_fix)."""
    tables = {}
    for name in names:
        path, flag, own = csv_dir / f"{name}.csv", "--csv-dir", "results/csv"
        if name in TABLE_COLUMNS:
            tables[name] = read_table(path, name, flag, own)
            continue
        target = f"results/csv/{name}.csv"
        tables[name] = rows = read_csv(path, "", target, flag, own)
        fix = files.input_fix(path, target, flag, own)
        if not rows and name in FILLED_TABLES:  # its own line, naming the command that writes it
            continue
        if name in MODEL_TABLES:  # without rows (bucket_advice): its header (0 bytes, another's)
            check_table(path, rows, MODEL_TABLES[name], fix, "scalestudy model")
        elif name == "targets":
            check_targets(path, rows, fix)
        elif name == "system":  # its values are words and numbers alike (the inventory's)
            check_table(path, rows, SYSTEM_SPEC, fix, "scalestudy analyze")
    return tables


# characters a --figure-dir cannot hold: paper.tex and slides.tex give it to \includegraphics
# as typed, where % starts a comment, # { } \ are TeX's syntax and " trips graphicx's parser of
# file names ("Use of ... doesn't match its definition") (pdfLaTeX fails on each; spaces,
# _ & ~ $ ^ and UTF-8 letters build), and study.md links to it, where a space ends the link
# (CommonMark: `![c](a b/f.png)` is text, not an image), as do an unbalanced parenthesis and a
# leading < (a destination "includes parentheses only if ... part of a balanced pair"; <...> is
# the bracketed form)
FIGURE_DIR_UNSAFE = re.compile(r'[%#{}\\"\s]')


def _parentheses_balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def figure_dir_problem(figure_dir: str) -> str | None:
    """Why the documents could not link to figures in `figure_dir`, or None."""
    bad = sorted(set(FIGURE_DIR_UNSAFE.findall(figure_dir)))
    if not _parentheses_balanced(figure_dir):
        bad.append("unbalanced parentheses")
    if figure_dir.startswith("<"):
        bad.append("a leading '<'")
    if not bad:
        return None
    return (
        f"--figure-dir {figure_dir!r} has {', '.join(map(_named, bad))}, which paper.tex's "
        "\\includegraphics (% # { } \\ \") or study.md's image links (spaces, unbalanced "
        "parentheses, a leading <) cannot take: give a path without them (a symbolic link to the "
        "figures will do)"
    )


def _named(bad: str) -> str:
    return repr(bad) if len(bad) == 1 else bad


def context(tables: dict[str, list[dict]], figures: list[str], figure_dir: str) -> dict:
    """What the templates see: the CSV rows, grouped for convenience, and the figure names.
    A table of FILLED_TABLES without rows, or a CSV without a column grouped here, is refused:
    the documents would say a family was not part of the study, leave the verdicts out, or
    fail mid-way. So is
    a figure directory the documents could not link to (figure_dir_problem)."""
    if why := figure_dir_problem(figure_dir):
        raise AnalysisError(why)
    for name, command in FILLED_TABLES.items():
        if name in tables and not tables[name]:
            raise AnalysisError(
                f"{name}.csv has no rows: `scalestudy {command}` writes rows for every study "
                f"that ran; write it again (snakemake results/csv/{name}.csv)"
            )
    try:
        return _context(tables, figures, figure_dir)
    except KeyError as exc:
        raise AnalysisError(
            f"a CSV lacks the column {exc}: it is older than this version, or not written by "
            "scalestudy; write them again with `scalestudy analyze` and `scalestudy model`"
        ) from exc


def _context(tables: dict[str, list[dict]], figures: list[str], figure_dir: str) -> dict:
    scaling = tables["scaling"]
    system = {(r["section"], r["key"]): r["value"] for r in tables["system"]}
    families = list(dict.fromkeys(r["family"] for r in scaling))
    commit = system.get(("system", "git commit of the runs"), "not recorded")
    model_rows = tables.get("model", [])  # the proposal renders without the model's tables
    return {
        "tables": tables,
        "scaling": scaling,
        "family": {f: [r for r in scaling if r["family"] == f] for f in families},
        "families_run": families,
        "families_missing": [f for f in vocab.FAMILIES if f not in families],
        "system": system,
        "system_rows": tables["system"],
        "targets": {r["target"]: r["value"] for r in tables["targets"]},
        "verdicts": tables["verdicts"],
        "measured": [r for r in tables["resources"] if r["kind"] == "measured"],
        "projected": [r for r in tables["resources"] if r["kind"] == "projected"],
        "profile": tables["profile_shares"],
        # what the shares are from: the kernel table given to analyze, not_profiled without
        # one, None in a system.csv older than that row (the documents say which, not guess)
        "kernel_table": system.get(PROFILING_KEY),
        "not_profiled": NOT_PROFILED,
        "waterfall": tables["waterfall"],
        # the scaling model (results/model.py): identified parameters, held-out rows, advice
        "model_params": [
            r for r in model_rows if r["kind"] == "parameter" and r["name"] in MODEL_PARAMS
        ],
        "model_holdout": [r for r in model_rows if r["kind"] == "holdout"],
        # why the model has no fit at all (its note without the "no fit: " it opens with), None
        # when it has one
        "model_no_fit": next(
            (
                r["note"].removeprefix("no fit: ")
                for r in model_rows
                if r["kind"] == "parameter" and r["name"] == "fit"
            ),
            None,
        ),
        "model_level": next(
            (r["value"] for r in model_rows if r["name"] == "interval_level"), None
        ),
        # advice at a world size; a study the advisor cannot advise on has one row without a
        # world size whose note says why ("not enough data: no bucket family modelled")
        "bucket_advice": [r for r in tables.get("bucket_advice", []) if r["world_size"]],
        "bucket_no_advice": next(
            (r["note"] for r in tables.get("bucket_advice", []) if not r["world_size"]), None
        ),
        "gpu_util_measured": any(r["gpu_util_mean_mean"] not in ("", None) for r in scaling),
        # the communication probe's share (train.comm_probe_steps; off: blank)
        "comm_measured": any(
            r.get("comm_exposed_frac_mean") not in ("", None)
            for r in scaling
            if r["family"] in ("strong", "weak")
        ),
        "mfu_measured": any(r.get("mfu_mean") not in ("", None) for r in scaling),
        "energy_measured": any(r.get("energy_kwh") not in ("", None) for r in tables["resources"]),
        # a configuration with a J/img, or repeats on two bases (mixed): the energy per image table
        "energy_per_img": any(r.get("energy_basis") not in ("", None) for r in scaling),
        # ... with a mean (the figure's points): not all its configurations' repeats mixed
        "energy_per_img_measured": any(
            r.get("energy_j_per_img_mean") not in ("", None) for r in scaling
        ),
        # where a flag above is false though some runs measured it: how many (system.csv),
        # told apart from "no run recorded it"; None where none did, or system.csv is older
        "partly": {
            what: count
            if (count := system.get(("measured", label))) not in (None, "", "0")
            else None
            for what, label, _ in MEASURED_COUNTS
        },
        # every configuration measured once (analyze's repeats_max: scaling.csv's largest n)
        "single_repeat": system.get(("study", "repeats_max")) == "1",
        # `git checkout` only for one clean commit; "<sha>-dirty", several commits ("a; b") or
        # "not recorded" are stated instead of printed as a command that would not reproduce
        "commit": commit,
        "checkout": commit if re.fullmatch(r"[0-9a-f]{7,40}", commit) else None,
        "figures": figures,
        "figure_dir": figure_dir,
    }


def environment(templates: Path) -> tuple[jinja2.Environment, jinja2.Environment]:
    """(Markdown env, LaTeX env); LaTeX uses <<var>> and <% block %> so braces stay TeX's."""
    common = {
        "undefined": jinja2.StrictUndefined,
        "trim_blocks": True,
        "lstrip_blocks": True,
        "keep_trailing_newline": True,
    }
    loader = jinja2.FileSystemLoader(str(templates))
    md = jinja2.Environment(loader=loader, **common)
    tex = jinja2.Environment(
        loader=loader,
        block_start_string="<%",
        block_end_string="%>",
        variable_start_string="<<",
        variable_end_string=">>",
        comment_start_string="<#",
        comment_end_string="#>",
        **common,
    )
    for env in (md, tex):
        env.filters.update(FORMATS)
        env.filters["plural"] = plural
        env.filters["strategy"] = strategy_name
        env.globals["repeats_range"] = repeats_range
        env.filters["pct_apart"] = fmt_pct_apart
        env.filters["spct_apart"] = functools.partial(fmt_pct_apart, signed=True)
        env.filters["pct_bar"] = fmt_pct_bar
        env.filters["fixed"] = fmt_fixed
        env.filters["summing_decimals"] = summing_decimals
        env.filters["sig"] = fmt_sig
        env.filters["num_apart"] = fmt_num_apart
        env.filters["ratio_digits"] = ratio_digits
    md.filters["cell"] = md_cell
    # what the filters replaced, for warn_unsettable once the documents are rendered
    tex.unsettable = set()
    tex.filters["e"] = functools.partial(tex_escape, unset=tex.unsettable)
    tex.filters["v"] = functools.partial(tex_verbatim, unset=tex.unsettable)
    tex.filters["b"] = functools.partial(tex_breakable, unset=tex.unsettable)
    tex.filters["p"] = functools.partial(tex_prose, unset=tex.unsettable)
    return md, tex


def render(csv_dir: Path, templates: Path, figures: list[str], figure_dir: str) -> dict[str, str]:
    md, tex = environment(templates)
    # the templates first: a wrong --templates is named before the tables are judged
    study, paper = md.get_template("study.md.j2"), tex.get_template("paper.tex.j2")
    ctx = context(load_tables(csv_dir), figures, figure_dir)
    docs = {"study.md": study.render(ctx), "paper.tex": paper.render(ctx)}
    warn_unsettable(tex, ["paper.tex"])
    return docs


# --- the honesty check ---------------------------------------------------------------------------
# the LaTeX documents' forms of a text cell (the e, b and v filters): a character they replace
# can leave a digit standing alone that was part of a word in the cell (a study "эксперимент7" is
# "???7" in paper.tex, "5μs" is "5\ensuremath{\mu}s")
TEX_FORMS = (tex_escape, tex_breakable, tex_verbatim)


# the cells the documents print with fmt_fixed (summing_decimals' decimals): the waterfall's
# X_ideal, X and loss in img/s, which add up as printed
FIXED_CELLS = {"waterfall": ("x_ideal", "x_measured", "loss_img_s")}
# the cells printed with fmt_sig (ratio_digits' or fmt_num_apart's digits): the step times whose
# ratio is printed, a speedup beside its target
SIG_CELLS = {
    "bucket_advice": ("predicted_step_s", "default_step_s"),
    "model": ("measured", "predicted"),
    "scaling": ("precision_speedup",),  # fmt_num_apart: apart from its target
}


def allowed_numbers(tables: dict[str, list[dict]]) -> set[str]:
    """Every numeric token any CSV cell yields, raw, as the LaTeX documents print its text
    (TEX_FORMS, read past tex_breakable's breaks as numbers_backed_by_csvs does), under any of
    FORMATS, or as a percentage with the decimals fmt_pct_apart, fmt_pct_bar and
    summing_decimals may give it, or, a cell of FIXED_CELLS, as itself with those of
    summing_decimals (fmt_fixed), or, a cell of SIG_CELLS, with the significant digits
    ratio_digits may give it (fmt_sig)."""
    allowed = set(FORMULA_CONSTANTS)
    for name, rows in tables.items():
        fixed, sig = FIXED_CELLS.get(name, ()), SIG_CELLS.get(name, ())
        for row in rows:
            for column, value in row.items():
                allowed.update(NUMBER.findall(str(value)))
                for form in TEX_FORMS:
                    allowed.update(NUMBER.findall(form(value).replace(BREAK, "")))
                x = _float(value)
                if x is not None:
                    for f in FORMATS.values():
                        allowed.update(NUMBER.findall(f(value)))
                    for k in range(2, APART_DECIMALS + 1):
                        allowed.update((f"{100 * x:.{k}f}", f"{100 * x:+.{k}f}"))
                    if column in fixed:
                        allowed.update(f"{x:.{k}f}" for k in range(APART_DECIMALS + 1))
                    if column in sig:
                        allowed.update(fmt_sig(x, k) for k in range(3, SIG_DIGITS + 1))
    return allowed


def numbers_backed_by_csvs(text: str, tables: dict[str, list[dict]]) -> list[str]:
    """The numeric tokens of a document that no CSV cell accounts for ([] = honest); the line
    breaks tex_breakable allows are no part of a token."""
    text = text.replace(BREAK, "")
    allowed = allowed_numbers(tables)
    return sorted({tok for tok in NUMBER.findall(text) if tok not in allowed})


# --- CLI -----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--csv-dir", default="results/csv")
    parser.add_argument("--templates", default=str(TEMPLATES), help="(default: %(default)s)")
    parser.add_argument(
        "--figures",
        nargs="*",
        default=[],
        choices=FIGURES,
        metavar="FIGURE",
        help=f"figures of results/plots to show, of: {', '.join(FIGURES)}",
    )
    parser.add_argument(
        "--figure-dir", default="../results/plots", help="figures, relative to the documents"
    )
    parser.add_argument("--out-dir", default="reports")


def missing_figures(out_dir: Path, figure_dir: str, figures: list[str]) -> list[str]:
    """The figure files the documents would link to and that are not there: study.md shows
    <figure_dir>/<name>.png and paper.tex includes .pdf, both relative to the documents."""
    where = out_dir / figure_dir
    wanted = [where / f"{name}.{ext}" for name in figures for ext in ("png", "pdf")]
    # a documents directory not made yet (render-report by hand) holds no link, so `..` is its
    # parent: the path walked as written named nothing, and every figure was "not found"
    found = os.path.isfile if out_dir.is_dir() else lambda p: os.path.isfile(os.path.normpath(p))
    return [str(p) for p in wanted if not found(p)]


def run(args: argparse.Namespace) -> int:
    csv_dir = Path(args.csv_dir)
    # an AnalysisError: one line from cli.main, exit 2
    try:
        docs = render(csv_dir, Path(args.templates), args.figures, args.figure_dir)
    except jinja2.TemplateNotFound as exc:
        raise AnalysisError(
            f"--templates {args.templates}: no template {exc.name} there (the report templates "
            "are workflow/report of the repository)"
        ) from exc
    except jinja2.UndefinedError as exc:
        raise stale_csvs(csv_dir, exc) from exc
    except (jinja2.TemplateError, UnicodeDecodeError) as exc:
        raise template_error(args.templates, exc) from exc
    check_numbers(docs, load_tables(csv_dir), (args.figure_dir,))
    missing = missing_figures(Path(args.out_dir), args.figure_dir, args.figures)
    if missing:  # the documents would link to nothing, and paper.tex would not build
        raise AnalysisError(
            f"--figures: {', '.join(missing)} not found (--figure-dir {args.figure_dir} is "
            f"relative to --out-dir {args.out_dir}): make them with `scalestudy plot --figure "
            "NAME` (snakemake results/plots/NAME.png), or give the --figure-dir that holds them"
        )
    outputs = {Path(args.out_dir) / name: text for name, text in docs.items()}
    files.check_outputs(outputs, AnalysisError)
    before = texts_before(outputs)
    # only once every document passed, and all or none: a full disk at paper.tex leaves both old
    files.write_texts(outputs)
    for path in outputs:
        logger.info(f"wrote {path}")
    drop_stale_pdfs(outputs, before)
    return 0


def template_error(templates, exc: Exception) -> AnalysisError:
    """One line for a template of --templates that jinja cannot read: its syntax (file and line)
    or its bytes (no UTF-8). A TemplateSyntaxError was a traceback in proposal, a line without
    the file in render-report; a byte that is no UTF-8 a UnicodeDecodeError traceback."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        where = f"{exc.filename or exc.name or 'a template'}, line {exc.lineno}: {exc.message}"
    elif isinstance(exc, UnicodeDecodeError):  # jinja's loader names no file: found here
        where = f"{_not_utf8(templates) or 'a template'} is no UTF-8 text ({exc.reason} at byte "
        where += f"{exc.start})"
    else:
        where = str(exc)
    return AnalysisError(
        f"--templates {templates}: {where}; fix the template, or leave --templates out (the "
        "repository's workflow/report)"
    )


def _not_utf8(templates) -> str | None:
    """The first template (*.j2) of the directory `templates` whose bytes are no UTF-8 text,
    by its name, or None."""
    for path in sorted(Path(templates).glob("*.j2")):
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return path.name
        except OSError:
            continue
    return None


def texts_before(paths) -> dict[Path, str | None]:
    """What each .tex of `paths` held before it is written (None: nothing readable), for
    drop_stale_pdfs; no other path is read (a --out-csv of /dev/stdout: reading it waited for
    input forever)."""
    before: dict[Path, str | None] = {}
    for path in map(Path, paths):
        if path.suffix != ".tex" or files.written_in_place(path):
            continue
        try:
            before[path] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            before[path] = None
    return before


def drop_stale_pdfs(written: dict, before: dict) -> None:
    """Remove the PDF beside each .tex of `written` (path -> the text just written) whose text
    changed (`before`: texts_before): it was built from the old text. Without latexmk the
    workflow asks for no PDF, and the old one stayed beside the new .tex looking current; where
    TeX is, the PDF rules build it again. A .tex written again unchanged by hand keeps its PDF
    (one the user built, or copied in, was removed on every rerun); in the workflow, which
    removes a job's outputs before it runs, the PDF goes on every rewrite."""
    for tex, text in ((Path(p), t) for p, t in written.items() if Path(p).suffix == ".tex"):
        pdf = tex.with_suffix(".pdf")
        if pdf.is_file() and before.get(tex) != text:
            pdf.unlink()
            logger.info(f"removed {pdf}: built from the {tex} written before")


def check_numbers(
    docs: dict[str, str], tables: dict[str, list[dict]], paths: tuple[str, ...] = ()
) -> None:
    """The honesty check of every document, before any is written. `paths` (the --figure-dir
    the documents link into) are no claims: the digits of a figure's reference
    (/scratch/u123/efficiency.png), as typed (a link, \\includegraphics) or as the LaTeX
    documents print it in a sentence (tex_escape: ../a&2024 is ../a\\&2024 there), are not
    checked, and only those (a --figure-dir of "." must not take every decimal point out of the
    document)."""
    for name, text in docs.items():
        for path in filter(None, paths):
            for form in dict.fromkeys((path, tex_escape(path))):
                text = re.sub(re.escape(form) + r"/(?:\\_|[\w.-])+\.(?:png|pdf)", "", text)
        unbacked = numbers_backed_by_csvs(text, tables)
        if unbacked:  # a number typed into a template instead of read from a CSV
            raise AnalysisError(
                f"{name} shows numbers that are in no CSV cell: {unbacked}; put them in a CSV "
                "of `scalestudy analyze`"
            )


def stale_csvs(csv_dir: Path, exc: jinja2.UndefinedError) -> AnalysisError:
    """A template read a column or row the CSVs lack: CSVs older than the templates, or not
    written by scalestudy."""
    return AnalysisError(
        f"a CSV in {csv_dir} lacks what the templates read ({exc}): it is older than this "
        "version's templates, or not written by scalestudy; write them again with `scalestudy "
        "analyze` and `scalestudy model` (snakemake reruns both after an update)"
    )
