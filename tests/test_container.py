"""The trainer image: definition parser and checks (the image's torch build is the venv's, the
InfiniBand userspace, the profiler provision), digest, argv builders, the Apptainer stand-in, and
the clear error when Apptainer is missing. No real Apptainer is needed (nor used)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy.errors import DefinitionError, LaunchError, NotAnImage
from scalestudy.files import git_commit
from scalestudy.jobs import container, container_exec
from scalestudy.jobs.container import (
    BASE_IMAGE_LABEL,
    TorchBuild,
    build_command,
    check_definition,
    image_pin_problem,
    image_torch_build,
    parse_definition,
    parse_torch_version,
    validate_definition,
    venv_torch_build,
)
from scalestudy.jobs.container_exec import exec_prefix, image_digest

REPO = Path(__file__).resolve().parents[1]
TRAINER_DEF = REPO / "containers" / "trainer.def"
STAND_INS = REPO / "tests" / "stand-ins"
SRC = REPO / "src"
PINNED_FROM = "From: pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime"
# the torch build the shipped definition is made for (requirements.txt's torch, the cu130 wheel);
# the tests of single checks compare with it, test_shipped_definition_matches_this_venv with the
# venv that runs them
CU130 = TorchBuild("2.14.1", "13.0")
# the smallest definition that passes every check (tests add one fault to it)
MINIMAL = (
    "Bootstrap: docker\nFrom: pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime\n"
    "%post\n  apt-get install -y rdma-core libibverbs1 ibverbs-providers\n"
    "%labels\n  c {{ GIT_COMMIT }}\n  scalestudy.profilers host-bind\n"
    "%arguments\n  GIT_COMMIT=unknown\n%test\n  python -c 'import torch'\n"
)


def problems_of(tmp_path: Path, text: str, venv: TorchBuild | None = CU130) -> list[str]:
    path = tmp_path / "x.def"
    path.write_text(text)
    return validate_definition(parse_definition(path), venv)


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


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
    assert {"post", "test", "labels", "environment", "help", "arguments"} <= set(defn.sections)
    assert defn.arguments == {"GIT_COMMIT": "unknown"}
    assert defn.labels["scalestudy.git_commit"] == "{{ GIT_COMMIT }}"
    # the environment, not the code: no copy of the package (the checkout's src/ is bound in
    # when a rank runs), so no commit of code in the image's environment either
    assert "files" not in defn.sections
    assert container.missing_files_sources(defn, REPO) == []
    assert "SCALESTUDY_GIT_COMMIT" not in defn.sections["environment"]
    installs = [
        line
        for line in container._strip_comment_lines(defn.sections["post"]).splitlines()
        if "pip install" in line
    ]
    assert installs and not any("/opt/scalestudy" in line for line in installs)
    # no pip resolution that could replace the image's torch
    assert "--no-deps" in defn.sections["post"]
    assert "apptainer exec --nv" in defn.sections["help"]
    # what NCCL needs for InfiniBand, installed non-interactively, lists cleaned
    post = defn.sections["post"]
    assert "DEBIAN_FRONTEND=noninteractive" in post and "rm -rf /var/lib/apt/lists/*" in post
    assert "apt-get install -y -q --no-install-recommends rdma-core libibverbs1" in post
    assert "libibverbs" in defn.sections["test"]
    # the profilers: the host's bound in, none in the image
    assert defn.labels["scalestudy.profilers"] == "host-bind"
    assert "nsight" not in container._strip_comment_lines(post).lower()
    assert defn.labels["scalestudy.base_image"] == defn.header["From"]
    assert "driver >= 580" in TRAINER_DEF.read_text()
    assert "cuda12.6" not in TRAINER_DEF.read_text()  # no comment left that justified cu126


def test_shipped_definition_lets_apt_download_in_a_rootless_build():
    """apt's download sandbox (its _apt user) fails in Apptainer's root-mapped rootless build
    (setgroups refused): the recipe turns it off before the first apt-get."""
    post = (REPO / "containers/trainer.def").read_text().split("%post", 1)[1]
    assert 'APT::Sandbox::User "root";' in post
    assert post.index("APT::Sandbox::User") < post.index("\n    apt-get update")


def test_shipped_definition_matches_this_venv():
    """The image's torch build is the one of the venv these tests run in (2.14.1+cu130), so
    numbers from the container and from the venv are comparable."""
    import torch

    assert str(venv_torch_build()) == torch.__version__
    assert image_torch_build(parse_definition(TRAINER_DEF)) == venv_torch_build()
    assert validate_definition(parse_definition(TRAINER_DEF)) == []


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


def test_an_unknown_bootstrap_agent_is_named_with_the_closest_one(tmp_path):
    """'Bootstrap: dockr' passed `container check` and failed only when Apptainer started."""
    text = variant("Bootstrap: docker", "Bootstrap: dockr")
    [problem] = problems_of(tmp_path, text)
    assert f"{tmp_path / 'x.def'}:{line_of(text, 'Bootstrap:')}: 'Bootstrap: dockr'" in problem
    assert "is no Apptainer bootstrap agent (did you mean 'docker'?)" in problem
    for agent in ("docker", "localimage", "oci-archive", "dnf", "Docker"):
        assert not [
            p
            for p in problems_of(tmp_path, variant("Bootstrap: docker", f"Bootstrap: {agent}"))
            if "bootstrap agent" in p
        ], agent


@pytest.mark.parametrize(
    ("agent", "path"),
    [("localimage", "/images/base.sif"), ("docker-archive", "/images/pytorch-2.14.1.tar")],
)
def test_a_base_image_from_a_file_is_checked_by_its_label(tmp_path, agent, path):
    """An offline site builds from a local .sif or an image archive: its From: is a path, which
    `container check` called unpinned (':latest') and unequal to the scalestudy.base_image
    label, so no such definition could pass. The label alone then names the torch build."""
    text = variant("Bootstrap: docker", f"Bootstrap: {agent}")
    text = text.replace("From: pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime", f"From: {path}")
    assert problems_of(tmp_path, text) == []
    bare = "\n".join(ln for ln in text.splitlines() if BASE_IMAGE_LABEL not in ln) + "\n"
    [problem] = problems_of(tmp_path, bare)
    assert "cannot tell the image's torch build" in problem


def test_a_build_argument_in_the_base_image_label_is_filled_in(tmp_path):
    """`{{ TORCH_TAG }}` in From: and the label (Apptainer fills it in both): the label was
    compared unfilled and refused."""
    tag = "pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime"
    text = variant("%arguments\n", "%arguments\n    TORCH_TAG=2.14.1-cuda13.0-cudnn9-runtime\n")
    text = text.replace(tag, "pytorch/pytorch:{{ TORCH_TAG }}")
    assert text.count("{{ TORCH_TAG }}") == 2
    assert problems_of(tmp_path, text) == []


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
    [problem] = [p for p in problems_of(tmp_path, text) if "not pinned" in p]
    assert why in problem
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


def test_test_section_must_import_torch(tmp_path):
    text = variant("import torch, torchvision, numpy, pynvml, tensorboard;", "import numpy;")
    [problem] = problems_of(tmp_path, text)
    assert "%test does not import torch" in problem
    # a commented-out import does not count
    commented = text.replace("%test\n", "%test\n    # import torch\n")
    assert any("does not import torch" in p for p in problems_of(tmp_path, commented))


@pytest.mark.parametrize(
    "line",
    [
        "python -c 'from scalestudy import cli'",
        "python -m scalestudy --help",
        "python -c 'import torch, scalestudy'",
    ],
)
def test_test_section_must_not_import_scalestudy(tmp_path, line):
    """The package is not in the image (bound in at run time), so a %test that imports it
    would fail every build: the check says so before the build starts."""
    text = MINIMAL.replace("python -c 'import torch'", f"python -c 'import torch'\n  {line}")
    [problem] = problems_of(tmp_path, text)
    assert "%test imports scalestudy, which is not in the image" in problem
    assert f"x.def:{line_of(text, '%test')}:" in problem


@pytest.mark.parametrize(
    "line",
    [
        "python -c 'from torch import nn'",
        "python -c 'import os, torch'",
        "python -c 'import torch.distributed'",
    ],
)
def test_test_section_import_forms(tmp_path, line):
    text = MINIMAL.replace("python -c 'import torch'", line)
    assert problems_of(tmp_path, text) == []


def test_image_test_imports_what_the_code_run_inside_imports():
    """%test, run at the end of every build, imports each third-party module that the code run
    inside the image imports (the trainer and its launcher, `profile rank`'s wrapper, the
    command line): a module missing from the image then fails the build, not the first rank
    of a study. The list is found from the sources, as the rules' code inputs are."""
    import ast

    from scalestudy.study import resources

    inside = set(resources.trainer_sources(REPO)) | set(
        resources.code_sources(REPO, "__main__.py", "cli.py", "jobs/profile.py")
    )
    # the walk reached the wrapper's imports (its launcher, and the rank files' names)
    assert {"src/scalestudy/jobs/launch.py", "src/scalestudy/nsight/readers.py"} <= inside
    # torch modules that import a package torch does not depend on: torch.utils.tensorboard is
    # tensorboard's (the README's scalars of every run: the image had none, and wrote none)
    through_torch = {"torch.utils.tensorboard": "tensorboard"}
    needed = set()
    for path in inside:
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            needed |= {n.split(".")[0] for n in names}
            needed |= {through_torch[n] for n in names if n in through_torch}
    needed -= set(sys.stdlib_module_names) | {"scalestudy", "__future__"}
    assert {"torch", "torchvision", "numpy", "pynvml", "tensorboard"} <= needed
    test = container._strip_comment_lines(parse_definition(TRAINER_DEF).sections["test"])
    imported = {
        name.strip().split(".")[0]
        for m in re.finditer(r"\bimport ([\w., ]+)", test)
        for name in m.group(1).split(",")
    }
    assert needed <= imported, f"%test of {TRAINER_DEF.name} misses {sorted(needed - imported)}"


def test_the_image_pins_what_the_venv_pins():
    """The packages the image installs itself (nvidia-ml-py, tensorboard) at requirements.txt's
    version: the venv's was unpinned, so a fresh setup and a container run could read NVML
    through different bindings."""
    post = parse_definition(TRAINER_DEF).sections["post"]
    in_image = dict(re.findall(r'"([\w-]+)==([\w.]+)"', post))
    pins = dict(re.findall(r"^([\w-]+)==([\w.]+)$", (REPO / "requirements.txt").read_text(), re.M))
    assert {"nvidia-ml-py", "tensorboard"} <= set(in_image), post
    assert {name: pins.get(name) for name in in_image} == in_image


@pytest.mark.parametrize("line", ["    %labels records the commit", "\t%test runs"])
def test_an_indented_percent_word_is_refused_as_apptainer_reads_it(tmp_path, line):
    """Apptainer's parser ends a section at any line whose first word begins with '%', indented
    or not (deffile.go, scanDefinitionFile), and the build fails on the section it then names;
    the check read only lines starting with '%' and said "ok"."""
    text = variant("%help\n", f"%help\n{line}\n")
    with pytest.raises(DefinitionError, match=rf"x\.def:{line_of(text, line.strip())}: "):
        problems_of(tmp_path, text)


def test_missing_post_and_labels(tmp_path):
    head = "Bootstrap: docker\nFrom: pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime\n"
    problems = problems_of(tmp_path, head + "%test\n  import scalestudy\n")
    assert sorted(p.split("section ")[1] for p in problems if "section " in p) == [
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


def test_header_keywords_and_section_names_are_read_in_any_case_as_apptainer_reads_them(
    tmp_path,
):
    """Apptainer lowercases header keywords and section names (its definition parser), so
    `BootStrap: docker`, common in older Singularity recipes, `FROM:` and `%Post` build; here
    they were "'Bootstrap:' is missing" and "unknown section '%Post'"."""
    text = variant("Bootstrap: docker", "BootStrap: docker").replace("From: ", "FROM: ", 1)
    text = text.replace("%post\n", "%Post\n", 1)
    assert problems_of(tmp_path, text) == []
    defn = parse_definition(tmp_path / "x.def")
    assert defn.header["Bootstrap"] == "docker" and "post" in defn.sections
    # a keyword repeated in another case is repeated all the same (Apptainer keeps the last)
    (tmp_path / "r.def").write_text("Bootstrap: docker\nFROM: a:1\nFrom: b:2\n")
    with pytest.raises(DefinitionError, match="repeated"):
        parse_definition(tmp_path / "r.def")
    (tmp_path / "m.def").write_text("Bootstrap: docker\n%post\n  true\nbootstrap: docker\n")
    with pytest.raises(DefinitionError, match="multi-stage"):
        parse_definition(tmp_path / "m.def")


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
    with pytest.raises(DefinitionError, match=r"6 problem\(s\)") as e:
        check_definition(path, CU130)
    for part in (
        "not pinned",
        "cannot tell the image's torch build",
        "%post is missing",
        "%test is missing",
        "%labels is missing",
        "does not say how the profilers reach the image",
    ):
        assert part in str(e.value)


# ------------------------------------------- the image's torch build, IB userspace, profilers


@pytest.mark.parametrize(
    ("text", "build"),
    [
        ("2.14.1+cu130", TorchBuild("2.14.1", "13.0")),
        ("2.14.1+cu126", TorchBuild("2.14.1", "12.6")),
        ("2.6.0+cu118", TorchBuild("2.6.0", "11.8")),
        ("2.14.1+cpu", TorchBuild("2.14.1", None)),
    ],
)
def test_torch_versions(text, build):
    assert parse_torch_version(text) == build and str(build) == text


@pytest.mark.parametrize("text", ["2.14.1", "2.14.1+rocm6.2", "cu130", ""])
def test_torch_version_without_a_build_is_refused(text):
    with pytest.raises(DefinitionError, match="e.g. '2.14.1\\+cu130'"):
        parse_torch_version(text)


@pytest.mark.parametrize(
    ("tag", "image", "fix"),
    [
        # the cu126 image of the old definition beside the cu130 venv
        ("2.14.1-cuda12.6-cudnn9-runtime", "2.14.1+cu126", "pytorch/pytorch:2.14.1-cuda13.0"),
        ("2.13.0-cuda13.0-cudnn9-runtime", "2.13.0+cu130", "pytorch/pytorch:2.14.1-cuda13.0"),
    ],
)
def test_image_torch_build_must_be_the_venvs(tmp_path, tag, image, fix):
    text = variant(PINNED_FROM, f"From: pytorch/pytorch:{tag}")
    text = text.replace("2.14.1-cuda13.0-cudnn9-runtime", tag)  # the label says it too
    [problem] = problems_of(tmp_path, text)
    assert f"x.def:{line_of(text, 'From: pytorch')}:" in problem
    assert f"the image has torch {image} but the venv has 2.14.1+cu130" in problem
    assert fix in problem and "not comparable" in problem


def test_venv_without_torch_or_with_a_cpu_build(tmp_path):
    [problem] = problems_of(tmp_path, MINIMAL, venv=None)
    assert "has no torch" in problem and "scripts/setup.sh" in problem
    [problem] = problems_of(tmp_path, MINIMAL, venv=TorchBuild("2.14.1", None))
    assert "2.14.1+cpu, a CPU build" in problem


@pytest.mark.parametrize(
    "ref",
    ["ubuntu:24.04", "nvcr.io/nvidia/pytorch:25.01-py3", "pytorch/pytorch@sha256:" + "0" * 64],
)
def test_base_image_whose_torch_build_cannot_be_told(tmp_path, ref):
    text = MINIMAL.replace("pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime", ref)
    [problem] = problems_of(tmp_path, text)
    assert "x.def:2: cannot tell the image's torch build" in problem
    assert "scalestudy.base_image" in problem


def test_digest_pinned_base_image_reads_the_build_from_the_label(tmp_path):
    digest = "pytorch/pytorch@sha256:" + "0" * 64
    text = MINIMAL.replace("pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime", digest)
    label = "  scalestudy.base_image pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime\n"
    text = text.replace("%arguments", label + "%arguments")
    assert problems_of(tmp_path, text) == []
    assert image_torch_build(parse_definition(tmp_path / "x.def")) == CU130
    [problem] = problems_of(tmp_path, text.replace("cuda13.0", "cuda12.6"))
    assert "the image has torch 2.14.1+cu126" in problem


def test_base_image_label_must_say_the_from_tag(tmp_path):
    text = variant(
        "scalestudy.base_image pytorch/pytorch:2.14.1-cuda13.0",
        "scalestudy.base_image pytorch/pytorch:2.14.1-cuda12.6",
    )
    [problem] = problems_of(tmp_path, text)
    assert f"x.def:{line_of(text, '    scalestudy.base_image')}:" in problem
    assert "label scalestudy.base_image says" in problem and "make them the same" in problem


@pytest.mark.parametrize("package", ["rdma-core", "libibverbs1", "ibverbs-providers"])
def test_post_must_install_the_infiniband_userspace(tmp_path, package):
    install = "--no-install-recommends rdma-core libibverbs1 ibverbs-providers"
    text = variant(install, install.replace(f" {package}", ""))
    [problem] = problems_of(tmp_path, text)
    assert f"x.def:{line_of(text, '%post')}: %post does not install {package}" in problem
    assert "TCP sockets" in problem
    assert "apt-get install -y --no-install-recommends rdma-core libibverbs1" in problem


@pytest.mark.parametrize(
    ("install", "missing"),
    [
        ("# apt-get install -y rdma-core libibverbs1 ibverbs-providers", "rdma-core"),  # comment
        ("apt-get install -y rdma-core libibverbs1-dev ibverbs-providers", "libibverbs1"),
        ("apt-get install -y rdma-core=50.0-2 libibverbs1=50.0-2 ibverbs-providers=50.0-2", None),
        # named, but not installed
        ("dpkg-query -W rdma-core libibverbs1 ibverbs-providers", "rdma-core"),
        # continuation lines belong to the install command
        ("apt-get install -y \\\n    rdma-core libibverbs1 \\\n    ibverbs-providers", None),
    ],
)
def test_infiniband_packages_are_words_of_the_script(tmp_path, install, missing):
    text = MINIMAL.replace("apt-get install -y rdma-core libibverbs1 ibverbs-providers", install)
    problems = problems_of(tmp_path, text)
    if missing is None:
        assert problems == []
    else:
        [problem] = problems
        assert f"does not install {missing}" in problem


def test_labels_must_state_the_profiler_provision(tmp_path):
    text = variant("    scalestudy.profilers host-bind\n", "")
    [problem] = problems_of(tmp_path, text)
    assert f"x.def:{line_of(text, '%labels')}: %labels does not say how the profilers" in problem
    assert "'scalestudy.profilers host-bind'" in problem
    text = variant("scalestudy.profilers host-bind", "scalestudy.profilers image")
    [problem] = problems_of(tmp_path, text)
    assert f"x.def:{line_of(text, '    scalestudy.profilers')}:" in problem
    assert "'scalestudy.profilers image' is not a provision" in problem


def test_cli_check_compares_with_the_given_torch(tmp_path):
    argv = [sys.executable, "-m", "scalestudy", "container", "check", str(TRAINER_DEF)]
    env = {"PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]}
    r = run([*argv, "--torch", "2.14.1+cu126"], env, REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the image has torch 2.14.1+cu130 but the venv has 2.14.1+cu126" in r.stderr
    assert "pytorch/pytorch:2.14.1-cuda12.6-cudnn9-runtime" in r.stderr  # the fix
    r = run([*argv, "--torch", "2.14.1"], env, REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "e.g. '2.14.1+cu130'" in r.stderr
    assert run([*argv, "--torch", "2.14.1+cu130"], env, REPO).returncode == 0


def test_cli_check_reads_the_venvs_torch_without_importing_it(tmp_path):
    """The venv's torch build comes from torch/version.py of the torch this Python would import
    (here a fake one put first on the path, which would fail if imported)."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch must not be imported')\n")
    (fake / "version.py").write_text("__version__ = '2.14.1+cu126'\ncuda: str = '12.6'\n")
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{SRC}", "PATH": os.environ["PATH"]}
    argv = [sys.executable, "-m", "scalestudy", "container", "check", str(TRAINER_DEF)]
    r = run(argv, env, REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the image has torch 2.14.1+cu130 but the venv has 2.14.1+cu126" in r.stderr
    (fake / "version.py").unlink()
    r = run(argv, env, REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "cannot read the venv's torch version" in r.stderr


def test_an_unreadable_definition_is_one_line_with_its_fix(tmp_path):
    """A missing file, a directory and bytes that are no UTF-8: each one line naming the file
    and the recipe to give (Python's "[Errno 2] No such file or directory: 'nope.def'" and
    codec message came through as they were)."""
    (tmp_path / "latin1.def").write_bytes(b"Bootstrap: docker\nFrom: caf\xe9\n")
    for name, says in (
        ("nope.def", "nope.def: no such definition file: "),
        ("latin1.def", "latin1.def: byte 27 is not UTF-8 text (invalid continuation byte): "),
        (".", " is a directory, not a file; "),
    ):
        with pytest.raises(DefinitionError) as e:
            parse_definition(tmp_path / name)
        message = str(e.value)
        assert says in message and "\n" not in message and "Errno" not in message, message
        assert message.endswith("give the Apptainer recipe, UTF-8 text, e.g. "
                                "containers/trainer.def of the checkout"), message  # fmt: skip


# ------------------------------------------------------------------------ digest and argv


def test_image_digest_follows_content(tmp_path):
    image = tmp_path / "a.sif"
    image.write_bytes(b"x" * (3 * (1 << 20) + 5))  # spans several 1 MiB chunks
    d1 = image_digest(image)
    assert d1.startswith("sha256:") and len(d1) == len("sha256:") + 64
    assert image_digest(image) == d1
    image.write_bytes(b"x" * (3 * (1 << 20) + 4) + b"y")
    assert image_digest(image) != d1
    assert hashlib.sha256(b"").hexdigest() == container_exec.EMPTY_SHA256


def test_empty_image_is_refused_with_the_build_command(tmp_path):
    """A 0-byte image (a failed copy, a `touch`) is no image: one line naming it and the
    command that rebuilds it, from `container digest` as from every command that hashes it."""
    empty = tmp_path / "e.sif"
    empty.write_bytes(b"")
    with pytest.raises(NotAnImage) as info:
        image_digest(empty)
    assert str(info.value).startswith(f"{empty}: is empty, not an image: rebuild it with `")
    assert "container build" in str(info.value) and str(empty) in str(info.value)
    argv = [sys.executable, "-m", "scalestudy", "container", "digest", str(empty)]
    r = run(argv, {"PYTHONPATH": str(SRC)}, REPO)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert r.stderr.count("\n") == 1 and "is empty, not an image" in r.stderr, r.stderr
    # a directory ("Is a directory", no fix), a device (/dev/null: "rebuild it" into it) or a
    # pipe (read until killed): no regular file, said so, with what to give
    fifo = tmp_path / "pipe.sif"
    os.mkfifo(fifo)
    for path, what in [(tmp_path, "a directory"), ("/dev/null", "a device or a pipe"),
                       (fifo, "a device or a pipe")]:  # fmt: skip
        with pytest.raises(NotAnImage) as info:
            image_digest(path)
        assert str(info.value) == (
            f"{path}: is {what}, not an image: give the image's .sif file (`scalestudy "
            "container build` writes one)"
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


def test_the_build_signature_follows_the_build_command_only(monkeypatch):
    """The rule's rebuild trigger: the build command's shape, not the module's text."""
    from scalestudy.jobs import container

    before = container.build_signature()
    assert before == "apptainer build --force --build-arg GIT_COMMIT=GIT_COMMIT IMAGE DEFINITION"
    real = container.build_command
    monkeypatch.setattr(
        container, "build_command", lambda *a, **k: [*real(*a, **k)[:2], "--fix-perms"]
    )
    assert container.build_signature() != before
    smk = (REPO / "workflow/rules/container.smk").read_text()
    assert "build=apptainer.build_signature()" in smk and "code_of(" not in smk


def test_exec_prefix_argv(tmp_path):
    image = tmp_path / "t.sif"
    image.write_bytes(b"image")
    digest = image_digest(image)
    src = tmp_path / "src"  # not a git checkout: no commit to pass
    src.mkdir()
    code = ["--bind", f"{src}:{src}:ro"]
    env = ["--env", f"PYTHONPATH={src}"]
    env += ["--env", f"SCALESTUDY_CONTAINER_DIGEST={digest}", "--env", "PYTHONNOUSERSITE=1"]
    gpu = exec_prefix(image, gpu=True, source=src)
    assert gpu == ["apptainer", "exec", "--nv", *code, *env, str(image)]
    assert exec_prefix(image, gpu=False, source=src) == [*gpu[:2], *gpu[3:]]
    given = exec_prefix(image, gpu=False, digest="sha256:given", source=src)
    assert "SCALESTUDY_CONTAINER_DIGEST=sha256:given" in given
    bound = exec_prefix(image, gpu=True, binds=["/opt/nsys", "/opt/ncu"], source=src)
    assert bound[3:9] == [*code, "--bind", "/opt/nsys", "--bind", "/opt/ncu"]
    assert bound[-1] == str(image)


def test_exec_prefix_binds_this_checkouts_source_and_its_commit(tmp_path):
    """By default the ranks run this checkout's src/ (the files the rules track as code
    inputs), bound read-only, with its commit passed in for metrics.json."""
    image = tmp_path / "t.sif"
    image.write_bytes(b"image")
    argv = exec_prefix(image, gpu=True)
    assert container_exec.source_dir() == SRC
    assert argv[argv.index("--bind") + 1] == f"{SRC}:{SRC}:ro"
    assert f"PYTHONPATH={SRC}" in argv
    assert f"SCALESTUDY_GIT_COMMIT={git_commit(SRC)}" in argv


def test_an_installed_scalestudy_is_not_bound_into_the_image(tmp_path, monkeypatch):
    """A non-editable install lives in a site-packages, whose torch would shadow the image's
    once on PYTHONPATH: refused, naming the directory and the fix."""
    for where in ("lib/python3.12/site-packages", "dist/lib"):
        package = tmp_path / where / "scalestudy"
        (package / "jobs").mkdir(parents=True)
        if package.parent.name != "site-packages":
            (package.parent / "torch").mkdir()  # the image's torch would be shadowed
        monkeypatch.setattr(container_exec, "__file__", str(package / "jobs" / "container_exec.py"))
        with pytest.raises(LaunchError, match=r"pip install -e") as e:
            container_exec.source_dir()
        assert str(package.parent) in str(e.value) and "shadow the image's" in str(e.value)
    # a checkout whose path --bind cannot name
    package = tmp_path / "a,b" / "src" / "scalestudy"
    (package / "jobs").mkdir(parents=True)
    monkeypatch.setattr(container_exec, "__file__", str(package / "jobs" / "container_exec.py"))
    with pytest.raises(LaunchError, match=r"cannot name a path with ':' or ','"):
        container_exec.source_dir()


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
    # the user's ~/.local site-packages never shadow the image's packages
    code = "import site, sys; print(site.ENABLE_USER_SITE, site.USER_SITE in sys.path)"
    r = run([*exec_prefix(image, gpu=True), "python", "-c", code], env, tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stdout + r.stderr

    # the code that runs is the bound source's, ahead of any scalestudy the image's python has
    # (here the venv's own editable install): a copy of src/ with a marker shows which ran
    copy = tmp_path / "checkout" / "src"
    shutil.copytree(SRC / "scalestudy", copy / "scalestudy", ignore=shutil.ignore_patterns("*.pyc"))
    (copy / "scalestudy" / "marker.py").write_text("HERE = 'the bound copy'\n")
    code = "import scalestudy.marker as m; print(m.HERE, m.__file__)"
    r = run([*exec_prefix(image, gpu=True, source=copy), "python", "-c", code], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"the bound copy {copy / 'scalestudy' / 'marker.py'}"

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


def test_stand_in_binds_host_directories_at_their_own_path(tmp_path):
    env = stand_in_env()
    image = tmp_path / "trainer.sif"
    assert run(build_command(TRAINER_DEF, image, "c0ffee"), env, REPO).returncode == 0
    tools = tmp_path / "nsight"
    tools.mkdir()
    code = "import os; print(os.environ['SCALESTUDY_STAND_IN_BINDS'])"
    argv = [*exec_prefix(image, gpu=True, binds=[str(tools)]), "python", "-c", code]
    r = run(argv, env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.pathsep.join([str(SRC), str(tools.resolve())])
    r = run(["apptainer", "exec", "--bind", f"{tools}:/opt/x", str(image), "true"], env, tmp_path)
    assert r.returncode != 0 and "only at its own path" in r.stderr
    r = run(["apptainer", "exec", "-B", str(tmp_path / "gone"), str(image), "true"], env, tmp_path)
    assert r.returncode != 0 and "is not a directory" in r.stderr


def build_argv(image) -> list[str]:
    """`scalestudy container build` of the trainer's definition into `image`."""
    return [sys.executable, "-m", "scalestudy", "container", "build", str(TRAINER_DEF), str(image)]


def test_cli_build_with_stand_in_is_atomic(tmp_path):
    image = tmp_path / "out dir" / "trainer.sif"
    argv = build_argv(image)
    r = run([*argv, "--git-commit", "abc"], stand_in_env(), REPO)
    assert r.returncode == 0, r.stderr
    assert "build-arg: GIT_COMMIT=abc" in image.read_text()
    # the command as run, shell-quoted: a path with a space read as two words in the log
    (logged,) = [line for line in (r.stdout + r.stderr).splitlines() if " build " in line]
    words = shlex.split(logged.split("+ ", 1)[1])
    assert words[1] == "build" and words[-1] == str(TRAINER_DEF), logged
    assert r.stdout.splitlines()[-1].rsplit(" ", 1) == [str(image), image_digest(image)]
    assert [p.name for p in image.parent.iterdir()] == ["trainer.sif"]  # no temp file left

    r = run(
        [sys.executable, "-m", "scalestudy", "container", "digest", str(image)],
        stand_in_env(),
        REPO,
    )
    assert r.stdout.strip() == image_digest(image)
    gone = tmp_path / "gone.sif"  # was `[Errno 2] ...: '<path>'` and exit 1
    argv = [sys.executable, "-m", "scalestudy", "container", "digest", str(gone)]
    r = run(argv, {"PYTHONPATH": str(SRC)}, REPO)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"scalestudy container digest: {gone}: no such image file: build it with "
        f"`scalestudy container build {TRAINER_DEF} {gone} --context {REPO}`"
    ]
    # the command named builds from any directory (a study's own; STAND-IN apptainer):
    # containers/trainer.def, relative and without --context, failed there
    elsewhere = tmp_path / "study"
    elsewhere.mkdir()
    fix = shlex.split(r.stderr.split("`")[1])
    assert fix[0] == "scalestudy"
    built = run([sys.executable, "-m", *fix, "--git-commit", "abc"], stand_in_env(), elsewhere)
    assert built.returncode == 0 and gone.is_file(), built.stderr
    r = run(
        [sys.executable, "-m", "scalestudy", "container", "check", str(TRAINER_DEF)],
        {"PYTHONPATH": str(SRC)},
        REPO,
    )
    assert r.returncode == 0 and "ok" in r.stdout


def test_cli_build_keeps_the_images_permissions(tmp_path):
    """The rebuilt image came back as apptainer made it, in the builder's umask: a study's image
    shared with `chmod 640` (or 644 under a site's umask 077) lost its mode, and every
    other user's training job failed to read it. It keeps the old image's mode (its group and
    ACL too, as every rewrite of files.py), as a real process rewrites it."""
    image = tmp_path / "trainer.sif"
    assert run([*build_argv(image), "--git-commit", "a"], stand_in_env(), REPO).returncode == 0
    for mode in (0o640, 0o604):
        image.chmod(mode)
        r = run([*build_argv(image), "--git-commit", "b"], stand_in_env(), REPO)
        assert r.returncode == 0, r.stderr
        assert "build-arg: GIT_COMMIT=b" in image.read_text()
        assert oct(image.stat().st_mode & 0o777) == oct(mode)
    assert [p.name for p in tmp_path.iterdir()] == ["trainer.sif"]  # no temp file left


def test_cli_build_into_a_directory_is_refused_before_apptainer_runs(tmp_path):
    """The whole build ran, then the rename failed: "Is a directory"."""
    image = tmp_path / "images"
    image.mkdir()
    r = run(build_argv(image), stand_in_env(), REPO)
    assert r.returncode == 2 and "apptainer" not in r.stdout
    assert r.stderr.splitlines() == [
        f"scalestudy container build: image {image}: is a directory, not a file: give the .sif "
        "file to write"
    ]
    assert list(image.iterdir()) == []


def test_cli_build_from_wrong_directory_names_missing_files(tmp_path):
    """A recipe that copies files (a site's own, e.g. a config) is built from the directory
    they are relative to; from another one the build stops before Apptainer starts."""
    recipe = tmp_path / "site.def"
    recipe.write_text(variant("%post\n", "%files\n    pyproject.toml /opt/pyproject.toml\n%post\n"))
    argv = [sys.executable, "-m", "scalestudy", "container", "build", str(recipe), "t.sif"]
    r = run(argv, stand_in_env(), tmp_path)
    assert r.returncode == 2
    assert "%files sources not found" in r.stderr and "pyproject.toml" in r.stderr
    assert not (tmp_path / "t.sif").exists()
    r = run([*argv[:-1], str(tmp_path / "t.sif"), "--context", str(REPO)], stand_in_env(), REPO)
    assert r.returncode == 0, r.stderr


def test_cli_check_names_missing_files_as_build_would(tmp_path):
    """`container check` passed a recipe whose %files sources were not in the build directory;
    only `build` found them missing. Its --context is build's."""
    recipe = tmp_path / "site.def"
    recipe.write_text(variant("%post\n", "%files\n    pyproject.toml /opt/pyproject.toml\n%post\n"))
    argv = [sys.executable, "-m", "scalestudy", "container", "check", str(recipe)]
    env = {"PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]}
    r = run(argv, env, tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = recipe.read_text().splitlines().index("%files") + 1
    assert r.stderr.splitlines() == [
        f"scalestudy container check: {recipe}:{line}: %files "
        f"sources not found in the build directory {tmp_path.resolve()}: pyproject.toml "
        "(--context: the repository root)"
    ]
    assert run([*argv, "--context", str(REPO)], env, tmp_path).returncode == 0
    assert run(argv, env, REPO).returncode == 0


@pytest.mark.parametrize("action", ["check", "build"])
@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_context_that_is_no_directory_is_one_line(tmp_path, action, kind):
    """`container check` passed a --context that is missing or a file when the recipe has no
    %files, and `container build` then failed in subprocess.run(cwd=context), after the check
    said the build would get as far as Apptainer. Now both refuse it in one line."""
    context = tmp_path / "ctx"
    if kind == "a file":
        context.write_text("not a directory\n")
    argv = [sys.executable, "-m", "scalestudy", "container", action, str(TRAINER_DEF)]
    if action == "build":
        argv.append(str(tmp_path / "t.sif"))
    r = run([*argv, "--context", str(context)], stand_in_env(), REPO)
    assert r.returncode == 2, r.stderr
    why = "does not exist" if kind == "missing" else "is not a directory"
    assert r.stderr.splitlines() == [
        f"scalestudy container {action}: --context {context}: {why}: give the build "
        "directory the %files paths are relative to (the repository root)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if kind == "missing" else ["ctx"])


def test_cli_build_without_apptainer_says_what_to_do(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {"PATH": str(empty_bin), "PYTHONPATH": str(SRC)}
    image = tmp_path / "trainer.sif"
    argv = build_argv(image)
    r = run(argv, env, REPO)
    assert r.returncode == 2
    # one line (cli.main's rule), naming the study's config, not config/config.yaml, which a
    # study's own --configfile overrides
    (line,) = r.stderr.strip().splitlines()
    assert "Apptainer" in line and "not on PATH" in line and "module load apptainer" in line
    assert "install" in line and "container.enabled: false in the study's config" in line
    # snakemake refuses a dotted --config key ("must start with a valid identifier")
    assert "added to --configfile: `container: {enabled: false}`" in line
    assert "refuses `--config container.enabled=false`" in line
    assert "config/config.yaml" not in line
    assert not image.exists()


def test_a_build_onto_its_own_definition_is_refused_and_writes_nothing(tmp_path):
    """`container build X.def X.def` (the image path typed as the recipe's) replaced the recipe
    with the built image and exited 0: the study's definition was gone."""
    recipe = tmp_path / "trainer.def"
    shutil.copy(TRAINER_DEF, recipe)
    before = recipe.read_bytes()
    argv = [sys.executable, "-m", "scalestudy", "container", "build", str(recipe), str(recipe)]
    r = run([*argv, "--context", str(REPO)], stand_in_env(), REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"nothing written: IMAGE is the input DEFINITION ({recipe})" in r.stderr, r.stderr
    assert recipe.read_bytes() == before
