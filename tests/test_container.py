"""The trainer image: definition parser and checks, digest, argv builders, the Apptainer stand-in,
and the clear error when Apptainer is missing. No real Apptainer is needed (nor used)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy.errors import DefinitionError
from scalestudy.jobs import container
from scalestudy.jobs.container import (
    build_command,
    check_definition,
    exec_prefix,
    image_digest,
    image_pin_problem,
    parse_definition,
    validate_definition,
)

REPO = Path(__file__).resolve().parents[1]
TRAINER_DEF = REPO / "containers" / "trainer.def"
STAND_INS = REPO / "tests" / "stand-ins"
SRC = REPO / "src"
PINNED_FROM = "From: pytorch/pytorch:2.14.1-cuda12.6-cudnn9-runtime"


def problems_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "x.def"
    path.write_text(text)
    return validate_definition(parse_definition(path))


def variant(old: str, new: str) -> str:
    text = TRAINER_DEF.read_text()
    assert old in text, old
    return text.replace(old, new, 1)


def stand_in_env(**extra: str) -> dict[str, str]:
    """PATH with the stand-in first and this Python's bin next (for `python`, `python3`)."""
    env = dict(os.environ)
    path = os.pathsep.join([str(STAND_INS), str(Path(sys.executable).parent), env["PATH"]])
    env.update(PATH=path, PYTHONPATH=str(SRC), **extra)
    return env


# --------------------------------------------------------------------- the shipped definition


def test_shipped_definition_parses_and_validates():
    defn = check_definition(TRAINER_DEF)
    assert defn.header["Bootstrap"] == "docker"
    assert list(defn.header)[0] == "Bootstrap"
    assert image_pin_problem(defn.header["From"]) is None
    assert {"files", "post", "test", "labels", "environment", "help", "arguments"} <= set(
        defn.sections
    )
    assert defn.arguments == {"GIT_COMMIT": "unknown"}
    assert defn.labels["scalestudy.git_commit"] == "{{ GIT_COMMIT }}"
    assert "SCALESTUDY_GIT_COMMIT" in defn.sections["environment"]
    # no pip resolution that could replace the image's torch
    assert "--no-deps" in defn.sections["post"]
    files = defn.sections["files"]
    assert all(src in files for src in ("pyproject.toml", "README.md", "src"))
    assert container.missing_files_sources(defn, REPO) == []
    assert "apptainer exec --nv" in defn.sections["help"]


def test_render_uses_build_arg_then_default():
    defn = parse_definition(TRAINER_DEF)
    label = defn.labels["scalestudy.git_commit"]
    assert defn.render(label) == "unknown"
    assert defn.render(label, {"GIT_COMMIT": "abc123"}) == "abc123"


# ------------------------------------------------------------------------- broken variants


def test_missing_from(tmp_path):
    text = variant("From: pytorch/pytorch:", "#From: pytorch/pytorch:")
    [problem] = problems_of(tmp_path, text)
    assert "'From:' is missing" in problem


def test_missing_bootstrap_and_wrong_order(tmp_path):
    assert any("'Bootstrap:' is missing" in p for p in problems_of(tmp_path, "From: a:1\n%post\n"))
    problems = problems_of(tmp_path, "From: a:1\nBootstrap: docker\n")
    assert any("must be the first header line" in p for p in problems)


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("pytorch/pytorch:latest", "moving tag ':latest'"),
        ("pytorch/pytorch", "has no tag"),
        ("localhost:5000/pytorch", "has no tag"),
        ("pytorch/pytorch@sha256:abc", "malformed digest"),
    ],
)
def test_unpinned_base_image(tmp_path, ref, why):
    text = variant(PINNED_FROM, f"From: {ref}")
    [problem] = problems_of(tmp_path, text)
    assert "not pinned" in problem and why in problem
    # the message points at the From line
    line = text.splitlines().index(f"From: {ref}") + 1
    assert f"x.def:{line}:" in problem


@pytest.mark.parametrize(
    "ref",
    ["ubuntu:24.04", "localhost:5000/img:1.2", "docker.io/pytorch/pytorch@sha256:" + "0" * 64],
)
def test_pinned_refs(ref):
    assert image_pin_problem(ref) is None


def test_missing_test_section(tmp_path):
    text = variant("%test\n", "%runscript\n")
    [problem] = problems_of(tmp_path, text)
    assert "section %test is missing" in problem


def test_test_section_must_import_scalestudy(tmp_path):
    text = variant("import torch, torchvision, scalestudy;", "import torch;")
    text = text.replace("python -m scalestudy --help", "true")
    [problem] = problems_of(tmp_path, text)
    assert "%test does not import scalestudy" in problem
    # a commented-out import does not count
    commented = text.replace("%test\n", "%test\n    # import scalestudy\n")
    assert any("does not import scalestudy" in p for p in problems_of(tmp_path, commented))


@pytest.mark.parametrize(
    "line",
    [
        "python -c 'from scalestudy import cli'",
        "python -m scalestudy --help",
        "import os, scalestudy",
    ],
)
def test_test_section_import_forms(tmp_path, line):
    text = "Bootstrap: docker\nFrom: a:1\n%post\n  true\n%labels\n  c {{ GIT_COMMIT }}\n"
    text += f"%arguments\n  GIT_COMMIT=unknown\n%test\n  {line}\n"
    assert problems_of(tmp_path, text) == []


def test_missing_post_and_labels(tmp_path):
    problems = problems_of(tmp_path, "Bootstrap: docker\nFrom: a:1\n%test\n  import scalestudy\n")
    assert sorted(p.split("section ")[1] for p in problems) == [
        "%labels is missing",
        "%post is missing",
    ]


def test_build_arg_without_default(tmp_path):
    text = variant("    GIT_COMMIT=unknown\n", "")
    problems = problems_of(tmp_path, text)
    assert problems and all(
        "'{{ GIT_COMMIT }}' has no default in %arguments" in p for p in problems
    )
    first_use = next(i for i, ln in enumerate(text.splitlines(), 1) if "{{ GIT_COMMIT }}" in ln)
    assert f"x.def:{first_use}:" in problems[0]


def test_labels_must_record_commit(tmp_path):
    text = variant("    scalestudy.git_commit {{ GIT_COMMIT }}\n", "")
    text = text.replace("org.opencontainers.image.revision {{ GIT_COMMIT }}", "x y")
    [problem] = problems_of(tmp_path, text)
    assert "%labels does not record the git commit" in problem


def test_section_typo_names_line_and_suggests(tmp_path):
    text = variant("%test\n", "%tset\n")
    path = tmp_path / "x.def"
    path.write_text(text)
    line = text.splitlines().index("%tset") + 1
    with pytest.raises(DefinitionError, match=rf"x\.def:{line}: unknown section '%tset'") as e:
        check_definition(path)
    assert "did you mean %test?" in str(e.value)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("Bootstrap: docker\nthis is not a header\n", 2, "expected a 'Keyword: value'"),
        ("Bootstrap: docker\nFrom: a:1\nFrom: b:2\n", 3, "repeated (first on line 2)"),
        ("Bootstrap: docker\n%arguments\n  # c\n  GIT COMMIT\n", 4, "'NAME=default'"),
        ("Bootstrap: docker\n%apprun\n", 2, "needs an app name"),
        ("Bootstrap: docker\n%post\n  true\nBootstrap: docker\n", 4, "multi-stage"),
    ],
)
def test_parser_errors_name_the_line(tmp_path, text, line, message):
    path = tmp_path / "bad.def"
    path.write_text(text)
    with pytest.raises(DefinitionError) as e:
        parse_definition(path)
    assert f"bad.def:{line}:" in str(e.value) and message in str(e.value)


def test_parser_sections_repeat_comments_and_apps(tmp_path):
    path = tmp_path / "x.def"
    path.write_text(
        "# leading comment\nBootstrap: docker\nFrom: a:1  # trailing\n\n"
        "%post -c /bin/bash\n  echo one\n%labels\n  # not a label\n  Author Jane Doe\n"
        "%post\n  echo two\n%apprun foo\n  exec foo\n"
    )
    defn = parse_definition(path)
    assert defn.header == {"Bootstrap": "docker", "From": "a:1"}
    assert defn.sections["post"] == "  echo one\n  echo two"
    assert defn.section_args["post"] == "-c /bin/bash"
    assert defn.labels == {"Author": "Jane Doe"}
    assert defn.sections["apprun foo"] == "  exec foo"
    assert defn.lines["post"] == 5 and defn.lines["From"] == 3


def test_check_definition_lists_every_problem(tmp_path):
    path = tmp_path / "x.def"
    path.write_text("Bootstrap: docker\nFrom: a:latest\n")
    with pytest.raises(DefinitionError, match=r"4 problem\(s\)") as e:
        check_definition(path)
    for part in ("not pinned", "%post is missing", "%test is missing", "%labels is missing"):
        assert part in str(e.value)


def test_unreadable_definition(tmp_path):
    with pytest.raises(DefinitionError, match="cannot read"):
        parse_definition(tmp_path / "nope.def")


# ------------------------------------------------------------------------ digest and argv


def test_image_digest_follows_content(tmp_path):
    image = tmp_path / "a.sif"
    image.write_bytes(b"x" * (3 * (1 << 20) + 5))  # spans several 1 MiB chunks
    d1 = image_digest(image)
    assert d1.startswith("sha256:") and len(d1) == len("sha256:") + 64
    assert image_digest(image) == d1
    image.write_bytes(b"x" * (3 * (1 << 20) + 4) + b"y")
    assert image_digest(image) != d1
    empty = tmp_path / "e.sif"
    empty.write_bytes(b"")
    assert image_digest(empty) == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_build_command_argv():
    argv = build_command("containers/trainer.def", Path("containers/trainer.sif"), "abc123")
    assert argv == [
        "apptainer",
        "build",
        "--force",
        "--build-arg",
        "GIT_COMMIT=abc123",
        "containers/trainer.sif",
        "containers/trainer.def",
    ]
    argv = build_command("d", "i", "c", apptainer="/opt/bin/apptainer", extra_args=["--fakeroot"])
    assert argv[:3] == ["/opt/bin/apptainer", "build", "--fakeroot"]


def test_exec_prefix_argv(tmp_path):
    image = tmp_path / "t.sif"
    image.write_bytes(b"image")
    digest = image_digest(image)
    env = f"SCALESTUDY_CONTAINER_DIGEST={digest}"
    assert exec_prefix(image, gpu=True) == ["apptainer", "exec", "--nv", "--env", env, str(image)]
    assert exec_prefix(image, gpu=False) == ["apptainer", "exec", "--env", env, str(image)]
    given = exec_prefix(image, gpu=False, digest="sha256:given")
    assert given[3] == "SCALESTUDY_CONTAINER_DIGEST=sha256:given"


# ------------------------------------------------------------------------- the stand-in


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_stand_in_builds_and_execs(tmp_path):
    env = stand_in_env()
    version = run(["apptainer", "--version"], env, tmp_path)
    assert version.stdout.strip() == "apptainer version 0.0.0-stand-in"

    image = tmp_path / "trainer.sif"
    r = run(build_command(TRAINER_DEF, image, "c0ffee"), env, REPO)
    assert r.returncode == 0, r.stderr
    assert image.read_text().startswith("SCALESTUDY APPTAINER STAND-IN IMAGE")
    assert "build-arg: GIT_COMMIT=c0ffee" in image.read_text()
    digest = image_digest(image)

    code = "import os, scalestudy; print(os.environ['SCALESTUDY_CONTAINER_DIGEST'])"
    r = run([*exec_prefix(image, gpu=True), "python", "-c", code], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == digest

    # another commit, or a changed definition, gives another image digest
    assert run(build_command(TRAINER_DEF, image, "beef"), env, REPO).returncode == 0
    assert image_digest(image) != digest
    changed = tmp_path / "changed.def"
    changed.write_text(TRAINER_DEF.read_text() + "\n# changed\n")
    assert run(build_command(changed, image, "c0ffee"), env, REPO).returncode == 0
    assert image_digest(image) != digest


def test_stand_in_refuses_bad_definition_and_foreign_image(tmp_path):
    env = stand_in_env()
    bad = tmp_path / "bad.def"
    bad.write_text(variant(PINNED_FROM, "From: pytorch/pytorch:latest"))
    r = run(["apptainer", "build", str(tmp_path / "x.sif"), str(bad)], env, REPO)
    assert r.returncode != 0 and "not pinned" in r.stderr
    assert not (tmp_path / "x.sif").exists()

    foreign = tmp_path / "foreign.sif"
    foreign.write_bytes(b"\x00SIF")
    r = run(["apptainer", "exec", str(foreign), "true"], env, tmp_path)
    assert r.returncode != 0 and "not an image made by the Apptainer stand-in" in r.stderr

    r = run(["apptainer", "shell", str(foreign)], env, tmp_path)
    assert r.returncode == 2 and "not supported by the stand-in" in r.stderr


def build_argv(image) -> list[str]:
    """`scalestudy container build` of the trainer's definition into `image`."""
    return [sys.executable, "-m", "scalestudy", "container", "build", str(TRAINER_DEF), str(image)]


def test_cli_build_with_stand_in_is_atomic(tmp_path):
    image = tmp_path / "out" / "trainer.sif"
    argv = build_argv(image)
    r = run([*argv, "--git-commit", "abc"], stand_in_env(), REPO)
    assert r.returncode == 0, r.stderr
    assert "build-arg: GIT_COMMIT=abc" in image.read_text()
    assert r.stdout.splitlines()[-1].split() == [str(image), image_digest(image)]
    assert [p.name for p in image.parent.iterdir()] == ["trainer.sif"]  # no temp file left

    r = run(
        [sys.executable, "-m", "scalestudy", "container", "digest", str(image)],
        stand_in_env(),
        REPO,
    )
    assert r.stdout.strip() == image_digest(image)
    r = run(
        [sys.executable, "-m", "scalestudy", "container", "check", str(TRAINER_DEF)],
        {"PYTHONPATH": str(SRC)},
        REPO,
    )
    assert r.returncode == 0 and "ok" in r.stdout


def test_cli_build_from_wrong_directory_names_missing_files(tmp_path):
    argv = [sys.executable, "-m", "scalestudy", "container", "build", str(TRAINER_DEF), "t.sif"]
    r = run(argv, stand_in_env(), tmp_path)
    assert r.returncode == 2
    assert "%files sources not found" in r.stderr and "pyproject.toml" in r.stderr


def test_cli_build_without_apptainer_says_what_to_do(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {"PATH": str(empty_bin), "PYTHONPATH": str(SRC)}
    image = tmp_path / "trainer.sif"
    argv = build_argv(image)
    r = run(argv, env, REPO)
    assert r.returncode == 2
    assert "Apptainer" in r.stderr and "not on PATH" in r.stderr
    assert "install" in r.stderr and "container.enabled: false" in r.stderr
    assert not image.exists()
