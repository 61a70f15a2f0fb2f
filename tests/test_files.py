"""files.Cell: what a column of a CSV that scalestudy writes holds, shared by the readers that
check a file before they compute from it (collect, analyze, the plan, the profile CSVs)."""

from __future__ import annotations

import pytest

from scalestudy import files


@pytest.mark.parametrize(
    ("rule", "holds", "refused"),
    [
        (files.count(1), ["1", " 12 ", 3], ["0", "-1", "1.5", "2.0", "1e3", "inf", "", "x"]),
        (files.count(0), ["0", "7"], ["-0", "0.0", "-1", "", "None"]),
        # a whole number in a range: collect's epoch number, the row's place (2, once)
        (files.Cell("2", 2, 2, whole=True), ["2", " 2 "], ["1", "3", "7", "2.0", ""]),
        (files.NUMBER, ["-3.5", "0", "1e300"], ["inf", "-inf", "nan?", "x", ""]),
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


def test_a_rule_says_what_it_wants():
    assert files.count(1).what == "a whole number >= 1"
    assert files.FRACTION.or_blank().what == files.FRACTION.what  # blank: not measured
    assert files.FRACTION.or_blank().blank and not files.FRACTION.blank
