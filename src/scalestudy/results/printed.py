"""How a cell is printed apart from a threshold: the documents' numbers (render_report.py) and the
figures' labels (plot.py) share it, and a figure does not depend on the documents' code (an edit
of render_report.py redraws no figure)."""

from __future__ import annotations

import math

# the most decimals fmt_pct_apart gives a percentage (a cell has 12 significant digits)
APART_DECIMALS = 10


def cell_float(value) -> float | None:
    """A cell as a finite float; None for a blank, a word, NaN or infinity (inf was an
    OverflowError in fmt_num's int(x))."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def fmt_pct_apart(value, other, signed: bool = False) -> str:
    """A fraction as a percentage with one decimal, or as many more as it takes to print it
    apart from `other` (a threshold, a tolerance: compared by magnitude), unless the two cells
    are equal: E_s = 0.6996 printed "70.0" next to ">= 70.0" and "fail"; never a share other
    than 0 as 0 (pct_text). blank -> n/a."""
    x, o = cell_float(value), cell_float(other)
    if x is None:
        return "n/a"
    for k in range(1, APART_DECIMALS + 1):
        text = pct_text(x, k, signed)
        if o is None or abs(x) == abs(o) or f"{100 * abs(x):.{k}f}" != f"{100 * abs(o):.{k}f}":
            break
    return text


# a share below this is floating-point noise, printed as 0: a waterfall residual of parts that
# cancel (1.3e-17), where no timer of a run resolves a billionth of its step
NOISE_SHARE = 1e-9


def pct_text(x: float, decimals: int, signed: bool = False) -> str:
    """The fraction x as a percentage with `decimals` decimals; a share other than 0 that
    would print as 0 there with two significant digits instead (fixed point): a weak deviation
    of 0.0002 read "+0.0", none, beside a spread of the same size printed 0.020. Below
    NOISE_SHARE it is 0."""
    sign = "+" if signed else ""
    text = f"{100 * x:{sign}.{decimals}f}"
    if abs(x) >= NOISE_SHARE and float(text) == 0:
        text = f"{100 * x:{sign}.{1 - math.floor(math.log10(abs(100 * x)))}f}"
    return text
