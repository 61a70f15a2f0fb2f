"""The package's layers point one way: shared <- trainer <- study <- jobs, results.

nsight (pure parsers) sits on shared only.

Read with `ast`, not by importing: a wrong import fails here even in a module no test imports.
A module may import its own layer and the layers below it, at the top of the file. An import
inside a function may not cross layers either (that is how the old import cycle hid).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "scalestudy"

# layer -> the layers it may import (itself included). nsight is pure parsing: shared only.
SHARED = {"shared"}
ALLOWED = {
    "shared": SHARED,
    "trainer": SHARED | {"trainer"},
    "nsight": SHARED | {"nsight"},
    "study": SHARED | {"trainer", "study"},
    "jobs": SHARED | {"trainer", "nsight", "study", "jobs"},
    "results": SHARED | {"trainer", "nsight", "study", "results"},
    "entry": {"shared", "trainer", "nsight", "study", "jobs", "results", "entry"},
}


def layer(module: str) -> str:
    """scalestudy.trainer.loop -> trainer; scalestudy.files -> shared; scalestudy.cli -> entry."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()):
        return parts[1]
    return "entry" if parts[-1] in ("cli", "__main__") else "shared"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def scalestudy_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported scalestudy module, line, inside a function) for every import in the file."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py", str(path))


def absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute name of `from <level dots><module> import ...` in module `importer`."""
    if not level:
        return module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def imports_in(
    text: str, importer: str, is_package: bool = False, filename: str = "<text>"
) -> list[tuple[str, int, bool]]:
    """scalestudy_imports of source `text` of module `importer`; a relative import (from ..results
    import plot) by its absolute name: it slipped past as no import at all."""
    tree = ast.parse(text, filename=filename)
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = absolute(child.module, child.level, importer, is_package)
                if base == "scalestudy" or (child.level and not child.module):
                    # from scalestudy import files, vocab; from . import loop
                    found.extend(
                        (f"{base}.{a.name}", child.lineno, in_function) for a in child.names
                    )
                else:
                    found.append((base, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return [(m, line, f) for m, line, f in found if m.split(".")[0] == "scalestudy"]


MODULES = sorted(PKG.rglob("*.py"))


def test_every_module_has_a_layer():
    layers = {layer(module_name(p)) for p in MODULES}
    assert layers <= set(ALLOWED), f"unknown layer(s) {layers - set(ALLOWED)}: add them to ALLOWED"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down_the_layers(path):
    mine = layer(module_name(path))
    wrong = []
    for target, line, in_function in scalestudy_imports(path):
        theirs = layer(target)
        if theirs not in ALLOWED[mine]:
            wrong.append(f"line {line}: {mine} imports {target} ({theirs})")
        elif in_function and theirs != mine:
            wrong.append(f"line {line}: function-level import of {target} crosses {mine}->{theirs}")
    assert not wrong, f"{path.relative_to(PKG)}:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("source", "imported"),
    [
        ("from ..results import plot", "scalestudy.results"),
        ("from .. import files", "scalestudy.files"),
        ("from . import loop", "scalestudy.trainer.loop"),
        ("from .loop import train", "scalestudy.trainer.loop"),
        ("from scalestudy.results import plot", "scalestudy.results"),
    ],
)
def test_relative_imports_are_read_as_their_absolute_module(source, imported):
    """Relative imports were left out (level 0 only): `from ..results import plot` in a trainer
    module passed the layer test. Read as what they import, a wrong one fails it."""
    (found,) = imports_in(source + "\n", "scalestudy.trainer.measure")
    assert found[0] == imported


@pytest.mark.parametrize("path", sorted((PKG / "study").glob("*.py")), ids=lambda p: p.name)
def test_the_study_layer_does_not_import_torch(path):
    """study/ runs at Snakemake parse time and on login nodes: no torch (seconds to import)."""
    tree = ast.parse(path.read_text())
    heavy = [
        (n.lineno, name)
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for name in ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""])
        if name.split(".")[0] in ("torch", "torchvision")
    ]
    assert not heavy, f"study/{path.name} imports {heavy}"


def loaded(code: str, packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` that running `code` in a fresh interpreter has imported."""
    code += f"\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {packages}))"
    code = "import sys\n" + code
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_what_the_workflow_imports_while_parsing_loads_no_torch_or_scipy():
    """common.smk's imports (and the logger plugin's, which Snakemake loads first), in a fresh
    interpreter: torch is seconds to import on a login node and must not be reached through any
    chain (the test above reads only each study module's own imports); nor scipy, 1.2 s of
    every snakemake call and of each Slurm job's inner one (study/model.py imports it where it
    fits)."""
    common = (PKG.parents[1] / "workflow/rules/common.smk").read_text()
    block = common[common.index("try:\n") + 5 : common.index("except ImportError")]
    imports = textwrap.dedent(block)
    assert "from scalestudy.study import" in imports  # the block was found
    code = f"import snakemake_logger_plugin_scalestudy\n{imports}\n"
    assert loaded(code, ("torch", "torchvision", "scipy")) == []


def test_a_rank_starts_without_torchvision():
    """`scalestudy train` imports no torchvision (its package imports torch._dynamo through
    torchvision.ops: 2.7 s on 2 cores before a bad flag can be refused); only the DataLoader
    path's transforms and prepare-data's download need it, lazily."""
    assert loaded("import scalestudy.trainer.train\n", ("torchvision",)) == []


def test_the_checker_sees_a_wrong_import(tmp_path, monkeypatch):
    """The test above can fail: a trainer module importing results is caught, at any depth."""
    fake = tmp_path / "scalestudy"
    (fake / "trainer").mkdir(parents=True)
    (fake / "results").mkdir()
    bad = fake / "trainer" / "bad.py"
    bad.write_text("def f():\n    from scalestudy.results import plot\n")
    monkeypatch.setattr(__import__(__name__), "PKG", fake)
    [(target, line, in_function)] = scalestudy_imports(bad)
    assert (target, line, in_function) == ("scalestudy.results", 2, True)
    assert layer(module_name(bad)) == "trainer"
    assert layer(target) not in ALLOWED["trainer"]
