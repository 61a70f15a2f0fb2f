"""The trainer's Apptainer image: check its definition, build it, name it by digest, run in it.

The workflow does not use Snakemake's `container:` directive (it hashes only the image's name and
would wrap the whole shell, srun included). Instead one rule builds `containers/trainer.sif` from
`containers/trainer.def` and every training job takes the .sif as an input and runs
`<exec_prefix(sif)> python -m scalestudy train ...`, so a rebuilt image marks training stale.

    scalestudy container check containers/trainer.def
    scalestudy container build containers/trainer.def containers/trainer.sif
    scalestudy container digest containers/trainer.sif

A definition that fails the checks, or Apptainer missing, is one message on stderr and exit 2;
a failed `apptainer build` exits 1.

Only the standard library is used here: the parser also runs inside the Apptainer stand-in of
the tests (tests/stand-ins/apptainer), which may be started by a Python without torch.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalestudy import files, log
from scalestudy.errors import ApptainerNotFound, DefinitionError
from scalestudy.files import git_commit

logger = log.get(__name__)

#: The build argument that carries the git commit into %labels and %environment.
GIT_COMMIT_ARG = "GIT_COMMIT"
#: Set by exec_prefix inside the container: the sha256 of the .sif the process runs in.
DIGEST_ENV = "SCALESTUDY_CONTAINER_DIGEST"

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

_HEADER_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:\s*(.*?)\s*$")
_SECTION_RE = re.compile(r"^%(\S+)(?:[ \t]+(.*?))?\s*$")
_TEMPLATE_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_ARGUMENT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# `import torch, scalestudy`, `from scalestudy import ...`, `python -m scalestudy ...`
_IMPORTS_SCALESTUDY_RE = re.compile(
    r"\bimport[ \t]+(?:[\w.]+[ \t]*,[ \t]*)*scalestudy\b|\bfrom[ \t]+scalestudy\b"
    r"|-m[ \t]+scalestudy\b"
)
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
    #: 1-based line of each header keyword and of each section's (first) `%name` line
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
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DefinitionError(f"{path}: cannot read the definition file: {e}") from e

    header: dict[str, str] = {}
    bodies: dict[str, list[tuple[int, str]]] = {}
    lines: dict[str, int] = {}
    section_args: dict[str, str] = {}
    current: str | None = None

    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if line.startswith("%"):
            m = _SECTION_RE.match(line)
            name, arg = (m.group(1), m.group(2) or "") if m else ("", "")
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
            if key in header:
                first = lines[key]
                raise _error(path, no, f"header keyword '{key}' repeated (first on line {first})")
            header[key] = value
            lines[key] = no
        else:
            if re.match(r"^Bootstrap\s*:", line):
                raise _error(
                    path,
                    no,
                    "a second 'Bootstrap:' header: multi-stage definitions are not supported "
                    "here (the trainer image is built in one stage)",
                )
            bodies[current].append((no, raw))

    sections = {name: "\n".join(t for _, t in body).strip("\n") for name, body in bodies.items()}
    arguments = _parse_pairs(path, bodies.get("arguments", []), "arguments")
    labels = _parse_pairs(path, bodies.get("labels", []), "labels")
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


def _parse_pairs(path: Path, body: list[tuple[int, str]], section: str) -> dict[str, str]:
    """%arguments lines are `NAME=value`; %labels lines are `name value...`."""
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
        else:
            key, _, value = s.partition(" ")
            pairs[key] = value.strip()
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


def validate_definition(defn: Definition) -> list[str]:
    """The problems of a trainer definition (empty when it is fine); each names where it is."""
    problems: list[str] = []
    header_keys = list(defn.header)
    bootstrap = defn.header.get("Bootstrap")
    if bootstrap is None:
        problems.append(f"{defn.path}: header: 'Bootstrap:' is missing (e.g. 'Bootstrap: docker')")
    elif header_keys[0] != "Bootstrap":
        problems.append(f"{defn.where('Bootstrap')}: 'Bootstrap:' must be the first header line")
    ref = defn.header.get("From")
    if ref is None:
        problems.append(
            f"{defn.path}: header: 'From:' is missing (the base image, e.g. "
            "'From: pytorch/pytorch:<version>-cuda<x.y>-cudnn9-runtime')"
        )
    elif bootstrap != "localimage":  # a local image is a path, not a registry reference
        why = image_pin_problem(defn.render(ref))
        if why:
            problems.append(
                f"{defn.where('From')}: the base image is not pinned: {why}; name a version "
                "tag or an @sha256 digest so a rebuild gets the same image"
            )
    for name in REQUIRED_SECTIONS:
        if name not in defn.sections:
            problems.append(f"{defn.path}: section %{name} is missing")
    if "test" in defn.sections and not _IMPORTS_SCALESTUDY_RE.search(
        _strip_comment_lines(defn.sections["test"])
    ):
        problems.append(
            f"{defn.where('test')}: %test does not import scalestudy (e.g. "
            'python -c "import torch, scalestudy"), so a broken install would go unnoticed'
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


def check_definition(path: str | os.PathLike) -> Definition:
    """Parse and validate; raise DefinitionError listing every problem."""
    defn = parse_definition(path)
    problems = validate_definition(defn)
    if problems:
        raise DefinitionError(
            f"{defn.path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return defn


def image_digest(sif_path: str | os.PathLike) -> str:
    """'sha256:<hex>' of the image file's bytes."""
    return f"sha256:{files.sha256(sif_path)}"


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


def exec_prefix(
    image: str | os.PathLike,
    gpu: bool,
    *,
    digest: str | None = None,
    apptainer: str = "apptainer",
) -> list[str]:
    """argv that runs a command inside the image: append the command and its arguments.

    The image's digest (computed here unless given) is passed in, so the trainer can record
    exactly which image it ran in. --nv binds the host's NVIDIA driver and devices. The host
    environment (SLURM_*, RANK, MASTER_ADDR, ...) passes through, as Apptainer does by default.
    """
    return [
        apptainer,
        "exec",
        *(["--nv"] if gpu else []),
        "--env",
        f"{DIGEST_ENV}={digest or image_digest(image)}",
        str(image),
    ]


# --------------------------------------------------------------------------------------- CLI

INSTALL_HELP = (
    "Building the trainer image needs Apptainer (>= 1.2, for %arguments and --build-arg), "
    "and `apptainer` is not on PATH.\n"
    "  - on a cluster it is usually a module: `module load apptainer`\n"
    "  - to install it: https://apptainer.org/docs/admin/main/installation.html "
    "(packages for Debian/Ubuntu, RHEL/EPEL, or from source)\n"
    "  - or run without a container: set `container.enabled: false` in config/config.yaml; "
    "training then runs in the current Python environment."
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


def build(
    definition: str | os.PathLike,
    image: str | os.PathLike,
    *,
    commit: str | None = None,
    context: str | os.PathLike = ".",
    extra_args: Sequence[str] = (),
) -> str:
    """Check the definition, build into a temp file beside `image`, then rename it onto `image`
    (a reader never sees a half-built image). Returns the new image's digest."""
    apptainer = shutil.which("apptainer")
    if apptainer is None:
        raise ApptainerNotFound(INSTALL_HELP)
    defn = check_definition(definition)
    missing = missing_files_sources(defn, context)
    if missing:
        raise DefinitionError(
            f"{defn.where('files')}: %files sources not found in the build directory "
            f"{Path(context).resolve()}: {', '.join(missing)} (build from the repository root)"
        )
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
    logger.info("+ " + " ".join(argv))
    try:
        subprocess.run(argv, cwd=context, check=True)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return image_digest(target)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("check", help="parse and validate a definition file")
    p.add_argument("definition")
    p = sub.add_parser("build", help="build the image atomically with apptainer build")
    p.add_argument("definition")
    p.add_argument("image")
    p.add_argument("--git-commit", help="recorded in the image (default: git HEAD of --context)")
    p.add_argument(
        "--context", default=".", help="directory %%files paths are relative to (default: .)"
    )
    p.add_argument("--fakeroot", action="store_true", help="pass --fakeroot to apptainer build")
    p = sub.add_parser("digest", help="print the sha256 digest of an image file")
    p.add_argument("image")


def run(args: argparse.Namespace) -> int:
    # DefinitionError and ApptainerNotFound: one line from cli.main, exit 2
    try:
        if args.action == "check":
            defn = check_definition(args.definition)
            logger.info(f"{defn.path}: ok (From: {defn.header['From']})")
        elif args.action == "build":
            digest = build(
                args.definition,
                args.image,
                commit=args.git_commit,
                context=args.context,
                extra_args=["--fakeroot"] if args.fakeroot else [],
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
        logger.error(f"scalestudy container {args.action}: {e}")
        return 1
    return 0
