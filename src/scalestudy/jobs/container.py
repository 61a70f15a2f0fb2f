"""The trainer's Apptainer image: check its definition, build it, name it by digest.

The workflow does not use Snakemake's `container:` directive (it hashes only the image's name and
would wrap the whole shell, srun included). Instead one rule builds `containers/trainer.sif` from
`containers/trainer.def` and every training job takes the .sif as an input and runs
`<exec_prefix(sif)> python -m scalestudy train ...` (jobs/container_exec.py: all of the
container a training job runs, so an edit here reruns none), so a rebuilt image marks training
stale. The image is the environment only (torch, CUDA, cuDNN, NCCL's InfiniBand userspace): the
package's code is the checkout's, bound in read-only by exec_prefix, so an edit to it reruns
what its code inputs say (training for the trainer) and never waits for an image rebuild.

    scalestudy container check containers/trainer.def
    scalestudy container build containers/trainer.def containers/trainer.sif
    scalestudy container digest containers/trainer.sif

The checks of `check` (and of `build`, before it starts), each failure one line naming the
file:line and the fix (validate_definition):
  - the header: `Bootstrap:` first, `From:` pinned (a version tag or an @sha256 digest);
  - the image's torch is the venv's: the pytorch/pytorch tag `<torch>-cuda<x.y>-...` (or the
    scalestudy.base_image label beside a digest) names the venv's torch release and CUDA build
    (2.14.1+cu130), so a run in the container and one in the venv measure the same software;
    `--torch 2.14.1+cu130` compares with another build than this Python's;
  - %post installs the InfiniBand userspace NCCL needs (rdma-core, libibverbs1,
    ibverbs-providers), without which NCCL falls back to TCP sockets between nodes;
  - %labels says how the profilers reach the image (`scalestudy.profilers host-bind`: the host's
    nsys/ncu bound in by `scalestudy profile`, which runs them inside the container);
  - %post, %test (importing torch; not scalestudy, which is not in the image) and %labels
    (recording the git commit of the recipe) are there;
  - the build directory (`--context`, default: the current one) is a directory, and the %files
    sources exist in it.
A definition that fails the checks, or Apptainer missing, is one message on stderr and exit 2;
a failed `apptainer build` exits 1.

Only the standard library is used here: the parser also runs inside the Apptainer stand-in of
the tests (tests/stand-ins/apptainer), which may be started by a Python without torch.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalestudy import files, log
from scalestudy.errors import ApptainerNotFound, DefinitionError
from scalestudy.files import git_commit
from scalestudy.jobs.container_exec import SHIPPED_DEFINITION, image_digest

logger = log.get(__name__)

#: The build argument that carries the git commit into %labels and %environment.
GIT_COMMIT_ARG = "GIT_COMMIT"
# Sections of the Apptainer definition format (user guide, "Definition Files").
SECTIONS = frozenset(
    {"setup", "files", "environment", "post", "runscript", "startscript", "test", "labels"}
    | {"help", "arguments"}
)
# SCIF app sections take the app's name: `%apprun foo`.
APP_SECTIONS = frozenset(
    {"appinstall", "apphelp", "apprun", "applabels", "appenv", "appfiles", "apptest", "appstart"}
)
REQUIRED_SECTIONS = ("post", "test", "labels")
HEADER_KEYS = {"bootstrap": "Bootstrap", "from": "From"}  # the keywords checked, in any case
# Bootstrap agents of Apptainer's definition format (user guide, "Definition Files": preferred
# and other agents, and the appendix's dnf alias of yum): a misspelt one ('dockr') fails only
# when `apptainer build` starts, on the build node.
BOOTSTRAP_AGENTS = (
    *("library", "docker", "shub", "oras", "scratch", "localimage", "yum", "dnf"),
    *("debootstrap", "oci", "oci-archive", "docker-daemon", "docker-archive"),
    *("arch", "busybox", "zypper"),
)
#: the agents whose From: is a file (a local .sif, an image archive), not a registry reference:
#: no tag to pin or to read the torch build from (the scalestudy.base_image label names it)
FILE_AGENTS = frozenset({"localimage", "docker-archive", "oci-archive"})

_HEADER_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:\s*(.*?)\s*$")
_SECTION_RE = re.compile(r"^%(\S+)(?:[ \t]+(.*?))?\s*$")
_TEMPLATE_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_ARGUMENT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# `import torch, scalestudy`, `from scalestudy import ...`, `python -m scalestudy ...`
_IMPORTS_SCALESTUDY_RE = re.compile(
    r"\bimport[ \t]+(?:[\w.]+[ \t]*,[ \t]*)*scalestudy\b|\bfrom[ \t]+scalestudy\b"
    r"|-m[ \t]+scalestudy\b"
)
# `import torch`, `import numpy, torch`, `from torch import ...`
_IMPORTS_TORCH_RE = re.compile(r"\bimport[ \t]+(?:[\w.]+[ \t]*,[ \t]*)*torch\b|\bfrom[ \t]+torch\b")
_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass
class Definition:
    """A parsed single-stage Apptainer definition file."""

    path: Path
    #: header keywords in file order, e.g. {"Bootstrap": "docker", "From": "ubuntu:24.04"}
    header: dict[str, str]
    #: section name -> body text (repeated sections are appended, as Apptainer does);
    #: app sections are keyed "apprun NAME"
    sections: dict[str, str]
    #: %arguments: build argument -> default value
    arguments: dict[str, str]
    #: %labels: label -> value
    labels: dict[str, str] = field(default_factory=dict)
    #: 1-based line of each header keyword, of each section's (first) `%name` line, and of each
    #: %labels / %arguments name as 'labels.<name>' / 'arguments.<name>'
    lines: dict[str, int] = field(default_factory=dict)
    #: build arguments used as `{{ NAME }}` anywhere in the file -> first line used
    template_vars: dict[str, int] = field(default_factory=dict)
    #: the words after `%name` (e.g. `%files from build`, `%post -c /bin/bash`)
    section_args: dict[str, str] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """'path:line' of a header keyword or section, for messages."""
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)

    def render(self, text: str, build_args: dict[str, str] | None = None) -> str:
        """Substitute `{{ NAME }}` with a build argument, else the %arguments default."""
        values = {**self.arguments, **(build_args or {})}

        def sub(m: re.Match) -> str:
            return values.get(m.group(1), m.group(0))

        return _TEMPLATE_RE.sub(sub, text)


def _error(path: Path, line: int | None, message: str) -> DefinitionError:
    return DefinitionError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def _strip_comment_lines(body: str) -> str:
    return "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith("#"))


def parse_definition(path: str | os.PathLike) -> Definition:
    """Parse an Apptainer definition: `Key: value` header lines up to the first `%section` line,
    then sections, each from its `%name` line (at the start of a line) to the next one.

    `#` lines are comments in the header, %arguments and %labels; in script sections they are
    kept (they are the script's own comments). Raises DefinitionError naming file and line.
    """
    path = Path(path)
    fix = f"give the Apptainer recipe, UTF-8 text, e.g. {SHIPPED_DEFINITION} of the checkout"
    try:  # one line naming the file, the byte and the fix (was Python's codec message)
        text = files.read_text(path, DefinitionError, fix)
    except FileNotFoundError:
        raise DefinitionError(f"{path}: no such definition file: {fix}") from None
    except OSError as e:
        raise DefinitionError(f"{path}: cannot read the definition file: {e.strerror}") from e

    header: dict[str, str] = {}
    bodies: dict[str, list[tuple[int, str]]] = {}
    lines: dict[str, int] = {}
    section_args: dict[str, str] = {}
    current: str | None = None

    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if line[:1].isspace() and line.lstrip().startswith("%"):
            # Apptainer splits sections at any line whose first word begins with '%' (its
            # parser, deffile.go scanDefinitionFile), and then fails on the section it names
            raise _error(
                path,
                no,
                f"{line.strip()!r}: a line whose first word begins with '%' starts a section "
                "for Apptainer, indented or not: unindent it to start one, or reword it",
            )
        if line.startswith("%"):
            m = _SECTION_RE.match(line)
            # Apptainer reads section names and header keywords in any case (its definition
            # parser lowercases them): `%Post`, `BootStrap:` and `FROM:` build there
            name, arg = (m.group(1).lower(), m.group(2) or "") if m else ("", "")
            if name in APP_SECTIONS:
                if not arg:
                    raise _error(path, no, f"%{name} needs an app name (e.g. '%{name} myapp')")
                name = f"{name} {arg.split()[0]}"
            elif name not in SECTIONS:
                close = difflib.get_close_matches(name, sorted(SECTIONS | APP_SECTIONS), n=1)
                hint = f" (did you mean %{close[0]}?)" if close else ""
                known = ", ".join(f"%{s}" for s in sorted(SECTIONS))
                raise _error(path, no, f"unknown section '%{name}'{hint}; known: {known}")
            current = name
            bodies.setdefault(name, [])
            lines.setdefault(name, no)
            if arg and name not in section_args:
                section_args[name] = arg
            continue
        if current is None:  # the header
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            m = _HEADER_RE.match(stripped)
            if not m:
                raise _error(
                    path, no, f"expected a 'Keyword: value' header line or a %section: {raw!r}"
                )
            key, value = m.group(1), re.sub(r"\s+#.*$", "", m.group(2))
            key = HEADER_KEYS.get(key.lower(), key)  # the spelling the checks below use
            if key in header:
                first = lines[key]
                raise _error(path, no, f"header keyword '{key}' repeated (first on line {first})")
            header[key] = value
            lines[key] = no
        else:
            if re.match(r"^Bootstrap\s*:", line, re.IGNORECASE):
                raise _error(
                    path,
                    no,
                    "a second 'Bootstrap:' header: multi-stage definitions are not supported "
                    "here (the trainer image is built in one stage)",
                )
            bodies[current].append((no, raw))

    sections = {name: "\n".join(t for _, t in body).strip("\n") for name, body in bodies.items()}
    arguments = _parse_pairs(path, bodies.get("arguments", []), "arguments", lines)
    labels = _parse_pairs(path, bodies.get("labels", []), "labels", lines)
    template_vars: dict[str, int] = {}
    for no, raw in enumerate(text.splitlines(), start=1):
        for m in _TEMPLATE_RE.finditer(raw):
            template_vars.setdefault(m.group(1), no)
    return Definition(
        path=path,
        header=header,
        sections=sections,
        arguments=arguments,
        labels=labels,
        lines=lines,
        template_vars=template_vars,
        section_args=section_args,
    )


def _parse_pairs(
    path: Path, body: list[tuple[int, str]], section: str, lines: dict[str, int]
) -> dict[str, str]:
    """%arguments lines are `NAME=value`; %labels lines are `name value...`. The line of each
    name goes into `lines` as '<section>.<name>' (Definition.where names it in messages)."""
    pairs: dict[str, str] = {}
    for no, raw in body:
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if section == "arguments":
            m = _ARGUMENT_RE.match(s)
            if not m:
                raise _error(path, no, f"%arguments lines are 'NAME=default', not {s!r}")
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            pairs[m.group(1)] = value
            lines.setdefault(f"arguments.{m.group(1)}", no)
        else:
            key, _, value = s.partition(" ")
            pairs[key] = value.strip()
            lines.setdefault(f"labels.{key}", no)
    return pairs


def image_pin_problem(ref: str) -> str | None:
    """None when an image reference names one fixed image (a version tag or an @sha256 digest),
    else what is wrong with it."""
    if "@" in ref:
        return (
            None if _DIGEST_RE.search(ref) else f"'{ref}': malformed digest (want @sha256:<64 hex>)"
        )
    name = ref.rsplit("/", 1)[-1]  # a registry port (host:5000/img) is not a tag
    tag = name.partition(":")[2]
    if not tag:
        return f"'{ref}' has no tag, so it means ':latest', which moves"
    if tag == "latest":
        return f"'{ref}' uses the moving tag ':latest'"
    return None


# --------------------------------------------------------------- the image's torch vs the venv's


@dataclass(frozen=True)
class TorchBuild:
    """A torch release and the CUDA it was built for (None: a CPU build)."""

    version: str  # "2.14.1"
    cuda: str | None  # "13.0"

    @property
    def suffix(self) -> str:
        """The wheel's local version: 'cu130' for CUDA 13.0, 'cpu' for a CPU build."""
        return "cu" + self.cuda.replace(".", "") if self.cuda else "cpu"

    def __str__(self) -> str:
        return f"{self.version}+{self.suffix}"


_TORCH_VERSION_RE = re.compile(r"^(\d+\.\d+(?:\.\d+)?)\+(?:cu(\d+)(\d)|cpu)$")
# pytorch/pytorch's tags: <torch>-cuda<x.y>-cudnn<n>-runtime|devel (Docker Hub)
_PYTORCH_TAG_RE = re.compile(r"^(\d+\.\d+(?:\.\d+)?)-cuda(\d+\.\d+)-cudnn\d+-(?:runtime|devel)$")
#: The label naming the base image by tag where From: pins it by digest (the tag says the build).
BASE_IMAGE_LABEL = "scalestudy.base_image"


def parse_torch_version(text: str) -> TorchBuild:
    """'2.14.1+cu130' -> TorchBuild('2.14.1', '13.0'); '2.14.1+cpu' -> a CPU build."""
    m = _TORCH_VERSION_RE.match(text.strip())
    if not m:
        raise DefinitionError(
            f"torch build {text!r}: expected a release and its build, e.g. '2.14.1+cu130' or "
            "'2.14.1+cpu'"
        )
    return TorchBuild(m.group(1), f"{m.group(2)}.{m.group(3)}" if m.group(2) else None)


def venv_torch_build() -> TorchBuild | None:
    """The torch of the Python running this (the study's venv), read from torch/version.py
    (`__version__`, `cuda`) without importing torch: this module also runs in Pythons without
    it (the Apptainer stand-in). None when torch is not installed there."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    values = {}
    version_py = Path(spec.origin).with_name("version.py")
    try:
        tree = ast.parse(version_py.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as e:
        raise DefinitionError(f"cannot read the venv's torch version from {version_py}: {e}") from e
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    if "__version__" not in values:
        raise DefinitionError(f"{version_py} has no __version__: cannot tell the venv's torch")
    return TorchBuild(str(values["__version__"]).split("+")[0], values.get("cuda"))


def image_torch_build(defn: Definition) -> TorchBuild | None:
    """The torch build of a pytorch/pytorch base image, from the From: tag or, when From: pins a
    digest or names a file (FILE_AGENTS), from the scalestudy.base_image label; None when
    neither names one."""
    refs = [defn.render(defn.labels.get(BASE_IMAGE_LABEL, ""))]
    if not _from_file(defn):
        refs.insert(0, defn.render(defn.header.get("From", "")))
    for ref in refs:
        name, _, tag = ref.partition("@")[0].rpartition("/")[2].partition(":")
        m = _PYTORCH_TAG_RE.match(tag)
        if name == "pytorch" and m:
            return TorchBuild(m.group(1), m.group(2))
    return None


def _torch_problems(defn: Definition, venv: TorchBuild | None) -> list[str]:
    """The image must train with the venv's torch build: same release, same CUDA build, so the
    numbers of a run in the container and of one in the venv are comparable."""
    where = defn.where("From")
    if venv is None:
        return [
            f"{where}: cannot compare the image's torch with the venv's: this Python "
            f"({sys.executable}) has no torch; run the check from the study's venv "
            "(`bash scripts/setup.sh`, then .venv/bin/scalestudy) or name it with --torch"
        ]
    image = image_torch_build(defn)
    if image is None:
        return [
            f"{where}: cannot tell the image's torch build from 'From: {defn.header.get('From')}':"
            f" use a pytorch/pytorch:<torch>-cuda<x.y>-cudnn9-runtime tag (for a digest or a "
            f"file, name that tag in the label '{BASE_IMAGE_LABEL}')"
        ]
    if venv.cuda is None:
        return [
            f"{where}: the venv's torch is {venv}, a CPU build, so no CUDA image matches it: "
            "install the CUDA build in the venv (requirements.txt, scripts/setup.sh)"
        ]
    if image == venv:
        return []
    tag = f"pytorch/pytorch:{venv.version}-cuda{venv.cuda}-cudnn9-runtime"
    return [
        f"{where}: the image has torch {image} but the venv has {venv}, so container and venv "
        f"numbers are not comparable: use 'From: {tag}' (and the label {BASE_IMAGE_LABEL}), or "
        f"install torch {image} in the venv (requirements.txt, scripts/setup.sh)"
    ]


def _from_file(defn: Definition) -> bool:
    """From: names a file (FILE_AGENTS), not a registry reference."""
    return (defn.header.get("Bootstrap") or "").lower() in FILE_AGENTS


def _base_label_problems(defn: Definition) -> list[str]:
    """The scalestudy.base_image label, when From: is a tag, must say the same tag (build
    arguments filled in both, as Apptainer does)."""
    ref, label = defn.render(defn.header.get("From", "")), defn.labels.get(BASE_IMAGE_LABEL)
    if label is None or "@" in ref or _from_file(defn) or defn.render(label) == ref:
        return []
    return [
        f"{defn.where('labels.' + BASE_IMAGE_LABEL)}: label {BASE_IMAGE_LABEL} says '{label}' "
        f"but From: is '{ref}': make them the same (the label is what `apptainer inspect` shows)"
    ]


# ------------------------------------------------------ InfiniBand userspace and the profilers

#: Debian/Ubuntu packages of the InfiniBand/RoCE userspace NCCL's IB transport needs: the verbs
#: library, the user-space drivers of the adapters (mlx5, ...) and rdma-core's configuration.
#: `--nv` binds the GPU driver only; without libibverbs in the image NCCL finds no IB device and
#: falls back to TCP sockets between nodes (NCCL_DEBUG=INFO then says "NET/Socket").
IB_PACKAGES = ("rdma-core", "libibverbs1", "ibverbs-providers")
#: The label saying how nsys/ncu reach the image, and the one way `scalestudy profile` provides:
#: the host's installation bound in at its own path (jobs/profile.py explains why).
PROFILERS_LABEL = "scalestudy.profilers"
PROFILERS_HOST_BIND = "host-bind"


_APT_INSTALL_RE = re.compile(r"\bapt(?:-get)?\s+(?:\S+\s+)*?install\b")


def _apt_installs(script: str) -> str:
    """The `apt-get install` / `apt install` commands of a %post script (continuation lines
    joined), where the packages it installs are named."""
    joined = re.sub(r"\\\n", " ", _strip_comment_lines(script))
    return "\n".join(ln for ln in joined.splitlines() if _APT_INSTALL_RE.search(ln))


def _installs(commands: str, package: str) -> bool:
    """Whether install commands name `package` as a word (pinned 'pkg=1.2' counts too)."""
    return re.search(rf"(?<![\w.+-]){re.escape(package)}(?![\w.+-])", commands) is not None


def _ib_problems(defn: Definition) -> list[str]:
    if "post" not in defn.sections:
        return []  # reported as a missing section
    commands = _apt_installs(defn.sections["post"])
    missing = [p for p in IB_PACKAGES if not _installs(commands, p)]
    if not missing:
        return []
    return [
        f"{defn.where('post')}: %post does not install {', '.join(missing)} (InfiniBand "
        "userspace: without it NCCL falls back to TCP sockets between nodes); add "
        f"'apt-get install -y --no-install-recommends {' '.join(IB_PACKAGES)}'"
    ]


def _profiler_problems(defn: Definition) -> list[str]:
    value = defn.labels.get(PROFILERS_LABEL)
    if value == PROFILERS_HOST_BIND:
        return []
    fix = (
        f"add the label '{PROFILERS_LABEL} {PROFILERS_HOST_BIND}': `scalestudy profile` binds "
        "the host's nsys/ncu installation into the container and runs the profiler inside it, "
        "around the trainer"
    )
    if value is None:
        return [
            f"{defn.where('labels')}: %labels does not say how the profilers reach the image: {fix}"
        ]
    return [
        f"{defn.where('labels.' + PROFILERS_LABEL)}: '{PROFILERS_LABEL} {value}' is not a "
        f"provision `scalestudy profile` knows: {fix}"
    ]


def validate_definition(defn: Definition, venv: TorchBuild | None | str = "venv") -> list[str]:
    """The problems of a trainer definition (empty when it is fine); each names where it is.
    `venv`: the torch build the image must match; by default the one of this Python's venv."""
    problems = _header_problems(defn) + _section_problems(defn)
    if "From" in defn.header:
        venv_build = venv_torch_build() if venv == "venv" else venv
        problems += _torch_problems(defn, venv_build) + _base_label_problems(defn)
    return problems + _ib_problems(defn) + _profiler_problems(defn)


def _header_problems(defn: Definition) -> list[str]:
    problems: list[str] = []
    header_keys = list(defn.header)
    bootstrap = defn.header.get("Bootstrap")
    if bootstrap is None:
        problems.append(f"{defn.path}: header: 'Bootstrap:' is missing (e.g. 'Bootstrap: docker')")
    elif header_keys[0] != "Bootstrap":
        problems.append(f"{defn.where('Bootstrap')}: 'Bootstrap:' must be the first header line")
    if bootstrap is not None and bootstrap.lower() not in BOOTSTRAP_AGENTS:
        close = difflib.get_close_matches(bootstrap.lower(), BOOTSTRAP_AGENTS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(
            f"{defn.where('Bootstrap')}: 'Bootstrap: {bootstrap}' is no Apptainer bootstrap "
            f"agent{hint}; known: {', '.join(BOOTSTRAP_AGENTS)}"
        )
    ref = defn.header.get("From")
    if ref is None:
        problems.append(
            f"{defn.path}: header: 'From:' is missing (the base image, e.g. "
            "'From: pytorch/pytorch:<version>-cuda<x.y>-cudnn9-runtime')"
        )
    elif not _from_file(defn):  # a file's path, not a registry reference
        why = image_pin_problem(defn.render(ref))
        if why:
            problems.append(
                f"{defn.where('From')}: the base image is not pinned: {why}; name a version "
                "tag or an @sha256 digest so a rebuild gets the same image"
            )
    return problems


def _section_problems(defn: Definition) -> list[str]:
    problems: list[str] = []
    for name in REQUIRED_SECTIONS:
        if name not in defn.sections:
            problems.append(f"{defn.path}: section %{name} is missing")
    test = _strip_comment_lines(defn.sections.get("test", ""))
    if "test" in defn.sections and not _IMPORTS_TORCH_RE.search(test):
        problems.append(
            f"{defn.where('test')}: %test does not import torch (e.g. "
            'python -c "import torch, torchvision"), so a broken install would go unnoticed'
        )
    if _IMPORTS_SCALESTUDY_RE.search(test):
        problems.append(
            f"{defn.where('test')}: %test imports scalestudy, which is not in the image (the "
            "checkout's src/ is bound in when a rank runs: jobs/container_exec.py exec_prefix), so "
            "the build would fail: import the modules scalestudy needs instead (torch, "
            "torchvision, numpy, pynvml)"
        )
    for var, line in defn.template_vars.items():
        if var not in defn.arguments:
            problems.append(
                f"{defn.path}:{line}: build argument '{{{{ {var} }}}}' has no default in "
                f"%arguments (add '{var}=...' there)"
            )
    if "labels" in defn.sections:
        used = _TEMPLATE_RE.findall(_strip_comment_lines(defn.sections["labels"]))
        if GIT_COMMIT_ARG not in used:
            problems.append(
                f"{defn.where('labels')}: %labels does not record the git commit "
                f"(e.g. 'scalestudy.git_commit {{{{ {GIT_COMMIT_ARG} }}}}')"
            )
    return problems


def check_definition(path: str | os.PathLike, venv: TorchBuild | None | str = "venv") -> Definition:
    """Parse and validate (venv: see validate_definition); raise DefinitionError listing every
    problem."""
    defn = parse_definition(path)
    problems = validate_definition(defn, venv)
    if problems:
        raise DefinitionError(
            f"{defn.path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return defn


def build_command(
    definition: str | os.PathLike,
    image: str | os.PathLike,
    git_commit: str,
    *,
    apptainer: str = "apptainer",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """argv of `apptainer build` for the trainer image (extra_args e.g. ['--fakeroot'])."""
    return [
        apptainer,
        "build",
        *extra_args,
        "--force",
        "--build-arg",
        f"{GIT_COMMIT_ARG}={git_commit}",
        str(image),
        str(definition),
    ]


def build_signature() -> str:
    """The build command's shape (its paths and commit as placeholders): the workflow's
    build_container rule has it as a param, so an edit to how the image is built rebuilds it, and
    no other edit does. The rule had this module and all it imports (files.py, log.py, ...) as
    code inputs: an edit to a log message rebuilt the image on the login node, with a fresh
    pull of its base and fresh packages, a new environment for no change of recipe."""
    return shlex.join(build_command("DEFINITION", "IMAGE", "GIT_COMMIT"))


# --------------------------------------------------------------------------------------- CLI

# one line (cli.main's rule); the study's config, not config/config.yaml: a study's own
# --configfile that enables the container overrides that file
INSTALL_HELP = (
    "building the trainer image needs Apptainer (>= 1.2, for %arguments and --build-arg), and "
    "`apptainer` is not on PATH: on a cluster load its module (`module load apptainer`), else "
    "install it (https://apptainer.org/docs/admin/main/installation.html: packages for "
    "Debian/Ubuntu, RHEL/EPEL, or from source), or run without a container, training in the "
    "current Python environment: container.enabled: false in the study's config (or in a "
    "small YAML file added to --configfile: `container: {enabled: false}`; snakemake refuses "
    "`--config container.enabled=false`)"
)


def missing_files_sources(defn: Definition, context: str | os.PathLike) -> list[str]:
    """%files sources (relative to the build directory) that do not exist there."""
    if "files" in defn.section_args:  # `%files from <stage>` copies from another stage
        return []
    missing = []
    for line in _strip_comment_lines(defn.sections.get("files", "")).splitlines():
        words = line.split()
        if words and not (Path(context) / defn.render(words[0])).exists():
            missing.append(words[0])
    return missing


def check_files(defn: Definition, context: str | os.PathLike) -> Definition:
    """Raise DefinitionError naming the %files sources missing from the build directory
    `context` (the build would copy nothing and fail after pulling the base image), or a
    `context` that is no directory (the build runs in it: even a recipe without %files fails)."""
    if not Path(context).is_dir():
        why = "is not a directory" if Path(context).exists() else "does not exist"
        raise DefinitionError(
            f"--context {context}: {why}: give the build directory the %files paths are "
            "relative to (the repository root)"
        )
    if missing := missing_files_sources(defn, context):
        raise DefinitionError(
            f"{defn.where('files')}: %files sources not found in the build directory "
            f"{Path(context).resolve()}: {', '.join(missing)} (--context: the repository root)"
        )
    return defn


def build(
    definition: str | os.PathLike,
    image: str | os.PathLike,
    *,
    commit: str | None = None,
    context: str | os.PathLike = ".",
    extra_args: Sequence[str] = (),
    venv: TorchBuild | None | str = "venv",
) -> str:
    """Check the definition (venv: see validate_definition), build into a temp file beside
    `image`, then rename it onto `image` (a reader never sees a half-built image) with the old
    image's group, ACL and mode, fsynced first (files.replace_with: apptainer made it in the
    builder's umask, and an image shared with the project lost its readers). That is a rebuild
    by hand: the workflow's build_container has the image as its output, which Snakemake
    deletes before the job runs, so there the image is a new file (the umask, or the default
    ACL of its directory: `setfacl -d -m g:GROUP:rX containers` keeps it the group's) and
    none exists while it builds. Returns the new image's digest."""
    # the recipe replaced by the image it builds (`container build X.def X.def`), said done
    files.check_distinct({"IMAGE": image}, {"DEFINITION": definition}, DefinitionError)
    apptainer = shutil.which("apptainer")
    if apptainer is None:
        raise ApptainerNotFound(INSTALL_HELP)
    check_files(check_definition(definition, venv), context)
    if problems := files.output_problems([image]):  # found after the whole build otherwise
        raise DefinitionError(f"image {problems[0]}: give the .sif file to write")
    target = Path(image).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp.sif")
    argv = build_command(
        Path(definition).resolve(),
        tmp,
        commit or git_commit(context),
        apptainer=apptainer,
        extra_args=extra_args,
    )
    logger.info("+ " + shlex.join(argv))  # as launch logs its command: pasted back, it runs
    try:
        subprocess.run(argv, cwd=context, check=True)
        files.replace_with(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return image_digest(target)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("check", help="parse and validate a definition file")
    p.add_argument("definition")
    _torch_argument(p)
    _context_argument(p)
    p = sub.add_parser("build", help="build the image atomically with apptainer build")
    p.add_argument("definition")
    p.add_argument("image")
    _torch_argument(p)
    p.add_argument("--git-commit", help="recorded in the image (default: git HEAD of --context)")
    _context_argument(p)
    p.add_argument("--fakeroot", action="store_true", help="pass --fakeroot to apptainer build")
    p = sub.add_parser("digest", help="print the sha256 digest of an image file")
    p.add_argument("image")


def _context_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--context", default=".", help="directory %%files paths are relative to (default: .)"
    )


def _torch_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--torch",
        metavar="VERSION",
        help="the torch build the image must match, e.g. 2.14.1+cu130 (default: the torch "
        "installed in this Python, i.e. the study's venv)",
    )


def run(args: argparse.Namespace) -> int:
    # DefinitionError and ApptainerNotFound: one line from cli.main, exit 2
    venv = parse_torch_version(args.torch) if getattr(args, "torch", None) else "venv"
    try:
        if args.action == "check":
            # what `build` would refuse, refused here too: a check that passes means the build
            # gets as far as Apptainer
            defn = check_files(check_definition(args.definition, venv), args.context)
            logger.info(f"{defn.path}: ok (From: {defn.header['From']})")
        elif args.action == "build":
            digest = build(
                args.definition,
                args.image,
                commit=args.git_commit,
                context=args.context,
                extra_args=["--fakeroot"] if args.fakeroot else [],
                venv=venv,
            )
            print(f"{args.image} {digest}")  # the product: the last line of stdout
        else:
            print(image_digest(args.image))  # the product, for $(scalestudy container digest ..)
    except subprocess.CalledProcessError as e:
        logger.error(
            f"scalestudy container build: apptainer build failed with exit status {e.returncode}"
        )
        return 1
    except OSError as e:
        if e.filename is not None:  # a path given (an image that is not there): cli.main's
            raise  # one line, `path: cause`, exit 2, as every command's
        logger.error(f"scalestudy container {args.action}: {e}")
        return 1
    return 0
