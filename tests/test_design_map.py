"""docs/design.md is the map a newcomer reads first: every module of the package is on it."""

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
