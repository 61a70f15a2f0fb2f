"""docs/design.md is the map a newcomer reads first: every module of the package is on it. The
code's own words on which stage reads which file, and which columns a CSV has, are true too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "scalestudy"
DESIGN = ROOT / "docs" / "design.md"


def mapped(text: str) -> set[str]:
    """Module paths named in backticks, relative to src/scalestudy (`trainer/loop.py`)."""
    return set(re.findall(r"`([a-z_/]+\.py)`", text))


def test_every_module_is_on_the_map():
    modules = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "__init__.py"}
    names = mapped(DESIGN.read_text())
    missing = sorted(modules - names)
    assert not missing, f"docs/design.md does not name {missing}: add one line each"


def test_the_map_names_no_module_that_is_gone():
    """A moved or deleted module leaves no stale line behind."""
    names = mapped(DESIGN.read_text())
    stale = sorted(n for n in names if not (PKG / n).exists() and not (ROOT / n).exists())
    assert not stale, f"docs/design.md names modules that do not exist: {stale}"


# --- the code's own words on who reads which file ------------------------------------------------


def rule_inputs() -> dict[str, str]:
    """Each workflow rule's name -> the text of its input: block (workflow/rules/*.smk)."""
    inputs = {}
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"^rule ", smk.read_text(), flags=re.M)[1:]:
            name, body = block.split(":", 1)
            inputs[name.strip()] = body.split("output:")[0]
    return inputs


def test_collect_smk_names_the_rules_that_read_the_collected_csvs():
    """collect.smk said "profiling" read runs.csv and epochs.csv: no profiling rule does."""
    comment = "".join(
        line.removeprefix("#")
        for line in (ROOT / "workflow/rules/collect.smk").read_text().splitlines()
        if line.startswith("#")
    )
    named = re.search(r"Read by the rules ([^;]+);", comment)
    assert named, comment
    said = set(re.findall(r"\b([a-z_]+)\b(?= \(|,| and)", named.group(1)))
    readers = {
        name
        for name, text in rule_inputs().items()
        if "results/csv/runs.csv" in text or "results/csv/epochs.csv" in text
    }
    assert said == readers


def test_analyze_names_the_files_it_reads():
    """analyze's docstring said it reads "runs.csv (+ epochs.csv)": it never read epochs.csv."""
    import argparse

    from scalestudy.results import analyze

    parser = argparse.ArgumentParser()
    analyze.add_arguments(parser)
    # the files its arguments read, by their defaults and help
    reads = " ".join(f"{a.default} {a.help}" for a in parser._actions)
    named = re.findall(r"[\w/]+\.csv", analyze.__doc__.splitlines()[0])
    assert named and [n for n in named if Path(n).name not in reads] == []


def test_a_docstring_names_only_columns_the_csv_has():
    """train.py said resources.csv says which energy basis it used "(energy_basis)": it has no
    such column. A docstring sentence that names resources.csv or plan.csv and a column in
    parentheses names one of that file's columns."""
    import ast

    from scalestudy.results.analyze import RESOURCE_COLUMNS
    from scalestudy.study.estimate import PLAN_COLUMNS

    columns = {"resources.csv": RESOURCE_COLUMNS, "plan.csv": PLAN_COLUMNS}
    wrong = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef):
                continue
            text = re.sub(r"\s+", " ", ast.get_docstring(node) or "")
            for sentence in re.split(r"[.;:]\s", text):
                for name, has in columns.items():
                    if re.search(rf"\b{re.escape(name)}", sentence):
                        named = re.findall(r"\((\w+_\w+)\)", sentence)
                        wrong += [(path.name, name, c) for c in named if c not in has]
    assert wrong == []
