"""The study config: load its YAML, validate it against the JSON schema (filling every default,
nested ones included), then check what a schema cannot express.

    cfg = load_and_validate("config/demo.yaml", overrides=["dataset=synthetic"])

The workflow calls `validate(config)` first thing (workflow/rules/common.smk; Snakemake's own
`validate` is not used: its messages dump the schema). Every error names the config key, the bad
value and what is allowed, e.g. of strong scaling on gpus [1, 2, 6] with gpus_per_node 4:

    config key 'families.strong.gpus[2]': value 6 is not allowed: does not fit gpus_per_node 4: ...

All problems are reported at once (one `StudyConfigError`, one line each).
"""

from __future__ import annotations

import copy
import datetime
import difflib
import functools
import json
import math
import os
import re
import shlex
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from scalestudy import files, hardware, vocab
from scalestudy.errors import StudyConfigError, TrainConfigError
from scalestudy.study.profiling import config_problems
from scalestudy.study.runs import (
    FAMILY_SWEEPS,
    build_run_table,
    family_requests,
    prepared_sizes,
    run_count,
    run_problems,
)
from scalestudy.trainer.config import TrainConfig

SCHEMA_RELPATH = Path("workflow") / "schemas" / "config.schema.yaml"


# ---------------------------------------------------------------------------------------------
# schema


def schema_path() -> Path:
    """workflow/schemas/config.schema.yaml of the checkout this package runs from (editable
    install), else of the current directory (the workflow runs from the repository root)."""
    # parents[3]: src/scalestudy/study/config.py -> the checkout's root
    candidates = [Path(__file__).resolve().parents[3] / SCHEMA_RELPATH, Path.cwd() / SCHEMA_RELPATH]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"study config schema not found at {' or '.join(str(c) for c in candidates)}; run from "
        "the repository root (scalestudy is meant to be installed editable from its checkout)"
    )


@functools.lru_cache(maxsize=8)
def _load_schema(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _strict_integer(checker, instance) -> bool:
    # JSON Schema counts 4.0 as an integer; a world size or batch of 4.0 would leak into run ids
    return isinstance(instance, int) and not isinstance(instance, bool)


_properties = Draft202012Validator.VALIDATORS["properties"]


def _fill_defaults(validator, properties, instance, schema):
    # the jsonschema FAQ's default-filling validator (as in snakemake.utils.validate), but the
    # default is copied: inserting the schema's own `{}` would alias it between configs
    if validator.is_type(instance, "object"):
        for name, subschema in properties.items():
            if "default" in subschema and name not in instance:
                instance[name] = copy.deepcopy(subschema["default"])
    yield from _properties(validator, properties, instance, schema)


def _ecma_pattern(validator, pattern, instance, schema):
    # JSON Schema's patterns are ECMA-262's, where a final $ is the end of the text; Python's $
    # also matches before a last newline, and jsonschema uses re.search: a gpu_type "h100\n"
    # (a YAML block scalar) passed ^[A-Za-z0-9_.]*$ and failed every GPU job at submission
    if not validator.is_type(instance, "string"):
        return
    python = (
        pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
    )
    if not re.search(python, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = validators.extend(
    Draft202012Validator,
    validators={"properties": _fill_defaults, "pattern": _ecma_pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)

_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping (key: value)",
    "array": "a list",
    "null": "null",
}


def key_path(parts: Iterable[str | int]) -> str:
    """['families', 'strong', 'gpus', 2] -> 'families.strong.gpus[2]'."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _fmt(value: Any) -> str:
    """A value as the user wrote it (YAML/JSON spelling: "cifar100", null, true), shortened:
    its letters as typed ("cifär10", once "cif\\u00e4r10"), only what cannot be seen (a
    control, format or separator character other than the space) escaped."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        # a YAML date or timestamp as the user wrote it, not datetime.date(2024, 5, 1)
        text = value.isoformat() if isinstance(value, datetime.date) else repr(value)
    text = "".join(
        f"\\u{ord(c):04x}" if c != " " and unicodedata.category(c)[0] in "CZ" else c for c in text
    )
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(path: str, value: Any, allowed: str) -> str:
    return f"config key '{path}': value {_fmt(value)} is not allowed: {allowed}"


# snakemake --config 'train={epochs: 3}' parses the mapping with YAML's BaseLoader, which keeps
# every scalar as text (and `train.epochs=3` is refused by Snakemake)
_TEXT_HINT = (
    " (it is text: quoted in a YAML file, or nested in snakemake --config, which reads nested "
    "values as text; write it unquoted in a --configfile)"
)


def _allowed(err: ValidationError) -> str:
    kind, rule = err.validator, err.validator_value
    if kind == "enum":
        allowed = "one of " + ", ".join(_fmt(v) for v in rule)
        if isinstance(err.instance, str) and _spells_a_choice(err.instance, rule):
            allowed += _TEXT_HINT
        elif _quoted_choice(err):
            allowed += (
                f' (YAML reads {err.instance} as a number: write it quoted, "{err.instance}")'
            )
        return allowed
    if kind == "const":
        return f"only {_fmt(rule)}"
    if kind == "type":
        kinds = [rule] if isinstance(rule, str) else rule
        allowed = "must be " + " or ".join(_TYPE_WORDS.get(k, k) for k in kinds)
        text = err.instance if isinstance(err.instance, str) else None
        if isinstance(err.instance, datetime.date) and "string" in kinds:
            # `study: 2024-05-01` is a date to YAML (it was shown as datetime.date(2024, 5, 1))
            day = err.instance.isoformat()
            allowed += f' (YAML reads {day} as a date: write it quoted, "{day}")'
        elif text is not None and "number" in kinds and _yaml_keeps_as_text(text):
            # PyYAML (YAML 1.1) reads 5e-4 as text: its floats need a dot and a signed exponent
            allowed += (
                f" (YAML reads {err.instance} as text: write {_yaml_float(float(err.instance))}, "
                "or with a dot and a signed exponent, e.g. 5.0e-4)"
            )
        elif (
            text is not None
            and "integer" in kinds
            and _yaml_keeps_as_text(text)
            and float(text).is_integer()
            and abs(float(text)) < 1e18
        ):
            # `epochs: 1e3`: the number keys' hint, for a count (its quotes were unexplained)
            allowed += f" (YAML reads {text} as text: write {int(float(text))})"
        elif isinstance(err.instance, bool) and "string" in kinds:
            # `study: yes` is YAML 1.1's true: "value true" was a value nobody typed
            allowed += (
                " (YAML 1.1 reads yes, no, on, off, true and false unquoted as true or false: "
                "write it quoted)"
            )
        elif text is not None and _reads_as(kinds, text):
            allowed += _TEXT_HINT
        return allowed
    if kind == "minLength":
        return "must not be empty" if rule == 1 else f"at least {rule} characters"
    bounds = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    if kind in bounds:
        # the fractions' bound: 20 meant as 20% asked for a 21x allocation request
        fraction = kind in ("maximum", "exclusiveMaximum") and rule == 1
        return f"must be {bounds[kind]} {_fmt(rule)}" + (" (a fraction: 0.2 = 20%)" * fraction)
    if kind == "pattern":
        return f"must match the pattern {rule}"
    if kind == "minItems":
        return f"at least {rule} item(s)"
    if kind == "uniqueItems":
        return "no duplicates"
    return err.message


def _reads_as(kinds: list[str], text: str) -> bool:
    """Whether text spells a value of one of the JSON schema types (an int, a float, a bool,
    null)."""
    number = "number" in kinds and _reads_as_float(text)
    integer = "integer" in kinds and text.strip().lstrip("+-").isdigit()
    boolean = "boolean" in kinds and text.strip().lower() in ("true", "false")
    null = "null" in kinds and text.strip().lower() in ("null", "~")
    return number or integer or boolean or null


def _spells_a_choice(text: str, choices: list) -> bool:
    """Whether text, read as YAML, is one of the choices that are not text (true of [auto,
    true, false]); the type must match too: 1 == True in Python, but 1 is no choice there."""
    try:
        value = yaml.safe_load(text)
    except Exception:  # YAML that builds no value (2024-02-30, !!bool maybe): no choice
        return False
    return any(type(c) is type(value) and c == value for c in choices if not isinstance(c, str))


def _yaml_keeps_as_text(text: str) -> bool:
    """A float that PyYAML, unquoted, would still read as text (5e-4, 1.0e4)."""
    try:
        return _reads_as_float(text) and isinstance(yaml.safe_load(text), str)
    except Exception:  # YAML that builds no value
        return False


def _yaml_float(x: float) -> str:
    """A spelling of the finite float x that yaml.safe_load reads back as x: Python's repr
    where PyYAML takes it (0.0005, 1.5e-05), else its mantissa with a dot (1e-05 and 1e+300,
    text to YAML 1.1, as 1.0e-05 and 1.0e+300: the hint said "write 1e-05")."""
    text = repr(x)
    mantissa, e, exponent = text.partition("e")
    dotted = f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    for spelling in (text, dotted, f"{x:.17e}"):  # .17e: a dot, a signed exponent, every digit
        try:
            value = yaml.safe_load(spelling)
        except yaml.YAMLError:
            continue
        if isinstance(value, float) and value == x:
            return spelling
    raise ValueError(f"no YAML spelling of {x!r}")  # a non-finite x: the callers pass none


def _reads_as_float(text: str) -> bool:
    """A finite float ("nan" and "inf" are text to YAML too: no hint to write them so)."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


# unknown keys of one level named in its line, and the count from which that line asks whether
# a config file is a study config at all (`snakemake --configfile c.yaml results/x/metrics.json`)
UNKNOWN_KEYS_SHOWN = 8
MANY_UNKNOWN_KEYS = 10


def format_schema_error(err: ValidationError) -> str:
    """One jsonschema error as "config key 'a.b': value X is not allowed: <allowed>"."""
    path = key_path(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
        known = sorted(err.schema.get("properties", {}))
        where = f"under '{path}'" if path else "at the top level"
        allowed = f"the keys {where} are {', '.join(known)}"
        unknown = [key for key in err.instance if key not in known]
        many = len(unknown) >= MANY_UNKNOWN_KEYS  # then a close match is chance, no typo
        lines, unmatched = [], []
        for key in unknown:  # a close match is a typo: its own line says which key was meant
            if not many and (hint := difflib.get_close_matches(str(key), known, n=1)):
                lines.append(
                    f"config key '{key_path([*err.absolute_path, str(key)])}': unknown key is "
                    f"not allowed: {allowed} (did you mean '{hint[0]}'?)"
                )
            else:
                unmatched.append(f"'{key_path([*err.absolute_path, str(key)])}'")
        if len(unmatched) == 1:
            lines.append(f"config key {unmatched[0]}: unknown key is not allowed: {allowed}")
        elif unmatched:  # one line, not one per key (a file of 133 keys was 133 lines)
            shown = ", ".join(unmatched[:UNKNOWN_KEYS_SHOWN])
            if len(unmatched) > UNKNOWN_KEYS_SHOWN:
                shown += f" and {len(unmatched) - UNKNOWN_KEYS_SHOWN} more"
            line = f"config keys {shown}: unknown keys are not allowed: {allowed}"
            if many:
                line += (
                    f"; {len(unknown)} unknown keys {where}: is one of the config files no "
                    "study config? (snakemake's --configfile takes every path after it, a "
                    "target too: give the targets before it)"
                )
            lines.append(line)
        return "\n".join(lines) or err.message
    return _bad(path or "<top level>", err.instance, _allowed(err))


def _holds_itself(value: Any, path: str = "", within: tuple = ()) -> str | None:
    """The problem of a mapping or list that holds itself (YAML `&a [*a]`: an alias inside
    its own anchor; the checks below recursed until Python's RecursionError), else None."""
    if not isinstance(value, (dict, list)):
        return None
    if any(value is outer for outer in within):
        return (
            f"config key '{path or '<top level>'}': its value holds itself (a YAML alias inside "
            "its own anchor): give a value"
        )
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        where = (
            (f"{path}.{key}" if path else str(key)) if isinstance(value, dict) else f"{path}[{key}]"
        )
        if found := _holds_itself(item, where, (*within, value)):
            return found
    return None


# the largest integer a config value may be, wherever it stands: a C long, and exact enough
# as a float (a 401-digit plan.eval_speedup, under no schema maximum, was the plan's
# OverflowError traceback: int too large to convert to float)
MOST_INTEGER = 2**63 - 1


def _non_finite(value: Any, path: str = "") -> list[str]:
    """YAML's .nan and .inf, wherever they are: every bound of the schema holds for NaN (each
    comparison with it is false, so `exclusiveMinimum: 0` never fails) and inf passes every
    minimum, so they would reach the jobs (a NaN learning rate, a bucket of inf MiB). And an
    integer past MOST_INTEGER, which no float arithmetic takes."""
    if isinstance(value, float) and not math.isfinite(value):
        return [_bad(path or "<top level>", value, "a finite number")]
    if isinstance(value, int) and abs(value) > MOST_INTEGER:
        return [_bad(path or "<top level>", value, f"at most {MOST_INTEGER} (64 bits)")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{path}[{i}]")]
    return []


def _quoted_choice(err: ValidationError) -> bool:
    """An enum of text choices given a number that spells one (`nsys_ranks: 0`, YAML's int)."""
    rule, value = err.validator_value, err.instance
    return (
        err.validator == "enum"
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and str(value) in [c for c in rule if isinstance(c, str)]
    )


def _schema_problems(config: dict, schema: dict) -> list[str]:
    problems: list[str] = []
    errors = list(_Validator(schema).iter_errors(config))
    # a choice written unquoted: one line saying to quote it, not "must be a string" as well
    quoted = {tuple(e.absolute_path) for e in errors if _quoted_choice(e)}
    for err in errors:
        if err.validator == "type" and tuple(err.absolute_path) in quoted:
            continue
        for line in format_schema_error(err).splitlines():
            if line not in problems:
                problems.append(line)
    return problems


# ---------------------------------------------------------------------------------------------
# semantic checks (on a schema-valid config with defaults filled)


def _check_list(problems: list[str], path: str, values: list) -> list[tuple[int, Any]]:
    """Refuse an empty list and duplicates; return the (index, value) of first occurrences."""
    if not values:
        problems.append(f"config key '{path}': value [] is not allowed: empty sweep (list a value)")
    first: dict[Any, int] = {}
    for i, value in enumerate(values):
        if value in first:
            problems.append(
                _bad(f"{path}[{i}]", value, f"duplicate of {path}[{first[value]}] (list it once)")
            )
        else:
            first[value] = i
    return [(i, value) for value, i in first.items()]


def _check_fits(problems: list[str], path: str, world_size: int, gpus_per_node: int) -> None:
    if world_size > gpus_per_node and world_size % gpus_per_node:
        problems.append(
            _bad(
                path,
                world_size,
                f"does not fit gpus_per_node {gpus_per_node}: a world size must be <= "
                f"{gpus_per_node} (one node) or a multiple of {gpus_per_node} (whole nodes)",
            )
        )


def _train_size(config: dict) -> tuple[int, str]:
    """Training images a run sees, and where that number comes from."""
    dataset, size = config["dataset"], prepared_sizes(config)[0]
    source = "synthetic.num_train" if dataset == "synthetic" else f"the {dataset} training set"
    limit = config["train"]["limit_train"]
    if 0 < limit < size:
        size, source = limit, "train.limit_train"
    return size, source


def step_graph_problems(config: dict) -> list[str]:
    """train.cuda_graphs step: a GPU study whose every run's step fits one CUDA graph (the
    trainer's own rule, TrainConfig.step_graph_misfit, asked for each precision the study runs)."""
    hw, train, families = config["hardware"], config["train"], config["families"]
    if hw["device"] != "cuda":
        why = f"hardware.device cuda (is {_fmt(hw['device'])})"
        return [_bad("train.cuda_graphs", "step", f"the whole-step CUDA graph needs {why}")]
    precisions = [train["precision"]]
    if families["precision"]["enabled"]:
        precisions += families["precision"]["precisions"]
    problems = []
    for precision in dict.fromkeys(precisions):
        flags = {k: train[k] for k in ("strategy", "comm_hook", "accum_steps")}
        try:
            misfit = TrainConfig(**flags, precision=precision).step_graph_misfit()
        except TrainConfigError:
            continue  # a combination the trainer refuses anyway: the run checks name it
        if misfit:
            problems.append(
                _bad(
                    "train.cuda_graphs",
                    "step",
                    f"a run with {misfit} cannot be one graph; "
                    "use auto (it picks torch.compile's graphs there) or true",
                )
            )
    return problems


# The most training runs a study may have. A guard against a typo, not a model of a cluster:
# each run is one Slurm job, and Snakemake builds the DAG of all of them at every invocation.
# Slurm's default MaxJobCount, the jobs slurmctld holds at once, is 10,000 too (slurm.conf(5)).
MAX_RUNS = 10_000
# the config's paths: no shell expands them (a config string reaches a command quoted) and
# Snakemake reads {braces} in a file name as wildcards
PATH_KEYS = ("data_dir", "checkpointing.dir", "container.image", "container.definition")


# the config's titles and names, each one line of the documents: a YAML block scalar's blank
# line reached \\title{} or \\author{} as a paragraph break (latexmk failed on proposal.pdf,
# slides.pdf or paper.pdf after every run) and cut proposal.md's heading to its first line
LINE_KEYS = ("study", "proposal.title", "proposal.pi", "proposal.machine")


def _at(config: dict, key: str):
    """The value of a dotted key (`checkpointing.dir`) of a validated config."""
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def line_problems(config: dict) -> list[str]:
    """A title or name of LINE_KEYS holding a line break, tab or other control character."""
    problems = []
    for key in LINE_KEYS:
        node = _at(config, key)
        # Cc: \\n, \\r, \\t, ...; Zl, Zp: the line and paragraph separators. One line break at
        # the end is a one-line block scalar's (`study: >` and a line), harmless in a title
        one_line = node[:-1] if node.endswith("\n") else node
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in one_line):
            problems.append(
                _bad(key, node, "must be one line of text, no line break, tab or other control "
                     "character (it is a title or a name in the documents)")
            )  # fmt: skip
        elif node and not node.strip():
            # blank but for spaces: a title or name of none (the Snakemake report's "Scaling
            # study ****" was broken markup), where "" means unset
            problems.append(
                _bad(key, node, "must hold some text, not spaces alone (it is a title or a "
                     "name in the documents)")
            )  # fmt: skip
    return problems


def path_problems(config: dict, repo: str | os.PathLike | None = None) -> list[str]:
    """`~/data` made a directory named `~` in the working directory, `$SCRATCH/ckpt` one named
    `$SCRATCH`; `data {x}` failed in Snakemake with a wildcard error, `-x` in the job's
    argparse, `res<line break>ults` in a directory no listing shows as typed. With `repo` (the
    repository the workflow reads its own files from, common.smk's REPO) the container
    definition must be a file of it while container.enabled: a missing one was Snakemake's
    MissingInputException of build_container, many lines and no key."""
    problems = []
    if not config["study"].strip():  # the schema's minLength passed " ", an empty title
        problems.append(_bad("study", config["study"], "must not be blank"))
    for key in PATH_KEYS:
        node = _at(config, key)
        if not node.strip():
            # " " passed minLength: prepare_data made a directory named " ", then every
            # training job failed (--data-dir must not be empty) and was retried
            problems.append(_bad(key, node, "must not be blank"))
        elif any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in node):
            # Cc: \n, \r, \t, ...; Zl, Zp: the line and paragraph separators. Snakemake only
            # warned of a path with a line break, and a trailing tab made a second data_dir
            # that looks like the first
            problems.append(
                _bad(key, node, "no line break, tab or other control character in a path; "
                     "write it on one line, e.g. results/data")
            )  # fmt: skip
        elif node.startswith("~") or "$" in node:
            problems.append(
                _bad(key, node, "no ~ or $VARIABLE: nothing expands them (a directory named "
                     f"{node.split('/')[0]!r} would be made); write the path out, e.g. "
                     "/scratch/me/data, or relative to the working directory")
            )  # fmt: skip
        elif "{" in node or "}" in node:
            problems.append(_bad(key, node, "no { or }: Snakemake reads them as wildcards"))
        elif node.startswith("-"):
            problems.append(
                _bad(key, node, f"no leading -: a command reads it as an option; write ./{node}")
            )
        elif key in CONTAINER_BOUND and config["container"]["enabled"] and _unbindable(node):
            # jobs/launch.py binds such a directory into the image, and refused every launch
            problems.append(
                _bad(key, node, "no ':' or ',' in a path outside the working directory while "
                     "container.enabled: Apptainer's --bind, which brings it into the image, "
                     "separates its fields with them; choose a directory without them")
            )  # fmt: skip
        elif key == "container.definition" and config["container"]["enabled"] and repo:
            # the rule's input, paths.repo_file: relative to the repository, an absolute kept
            found = Path(repo) / node  # an absolute node replaces repo
            if not found.is_file():
                what = "a directory" if found.is_dir() else "no such file"
                problems.append(
                    _bad(key, node, f"{what} ({found}): an Apptainer definition file, "
                         "relative to the repository (e.g. containers/trainer.def) or absolute; "
                         "or container.enabled: false")
                )  # fmt: skip
    return problems


# the paths jobs/launch.py binds into the container (those outside the working directory:
# absolute, or relative ones that leave it, `../shared/data`)
CONTAINER_BOUND = ("data_dir", "checkpointing.dir")


def _unbindable(path: str) -> bool:
    path = os.path.normpath(path)
    return (os.path.isabs(path) or path.split(os.sep)[0] == os.pardir) and files.unbindable(path)


def semantic_problems(config: dict, repo: str | os.PathLike | None = None) -> list[str]:
    """What the schema cannot check, section by section; disabled families are not checked
    (they are ignored). The run table's own checks need all of these to pass first; the strong
    target is checked whatever they find. `repo`: path_problems' (None: the repository's
    files unchecked, the proposal's trial configs)."""
    problems = [
        *path_problems(config, repo),
        *line_problems(config),
        *_family_choice_problems(config["families"]),
        *_device_problems(config),
        *_batch_problems(config),
        *memory_problems(config),
        *limit_problems(config["hardware"]),
        *proposal_problems(config["proposal"]),
    ]
    if not problems and run_count(config, most=MAX_RUNS) > MAX_RUNS:
        # built row by row, 10**9 repeats ran Snakemake out of memory while it parsed
        problems.append(too_many_runs(config))
    if not problems:
        rows = build_run_table(config)
        problems += run_problems(rows, *_train_size(config))
        problems += config_problems(config, rows)
    # not a gate of the run table's checks above: it reads only the strong family's sweep
    return problems + target_problems(config)


def too_many_runs(config: dict) -> str:
    """The refusal of a study of more than MAX_RUNS runs, naming what to lower: the repeats
    where the configurations alone fit (counted whole: at most MAX_RUNS), else a family whose
    own requests pass MAX_RUNS and its sweeps' lengths (it named `repeats: 1` for a 2,000 x
    2,000 bucket sweep), else every family's requests, too many together."""
    repeats = config["repeats"]
    configurations = run_count({**config, "repeats": 1}, most=MAX_RUNS)
    if configurations <= MAX_RUNS:
        return _bad(
            "repeats",
            repeats,
            f"the study would have {configurations * repeats:,} training runs (one Slurm job "
            f"each; {configurations:,} configurations x {repeats:,} repeats), at most "
            f"{MAX_RUNS:,}: fewer repeats or sweep values",
        )
    requests = family_requests(config)
    name = max(requests, key=requests.__getitem__)
    if requests[name] > MAX_RUNS:  # one family is too many alone: its key
        family = config["families"][name]
        sweeps = " x ".join(f"{len(family[key]):,} {key}" for key in FAMILY_SWEEPS[name])
        return (
            f"config key 'families.{name}': its sweeps ({sweeps}) request {requests[name]:,} "
            f"configurations, each a training run (one Slurm job), and a study has at most "
            f"{MAX_RUNS:,}: fewer sweep values"
        )
    each = ", ".join(f"{family} {n:,}" for family, n in requests.items())
    return (
        f"config key 'families': the families request more than {MAX_RUNS:,} configurations "
        f"together ({each}), each a training run (one Slurm job), and a study has at most "
        f"{MAX_RUNS:,}: fewer sweep values"
    )


def limit_problems(hw: dict) -> list[str]:
    """hardware.runtime_max is no shorter than hardware.runtime_min, the limit every job asks
    for at least (a run's further jobs past runtime_max: study/estimate.py split_jobs)."""
    most, least = hw["runtime_max"], hw["runtime_min"]
    if most is not None and most < least:
        return [
            _bad(
                "hardware.runtime_max",
                most,
                f"at least hardware.runtime_min ({least}), the limit every job asks for at least",
            )
        ]
    return []


def memory_problems(config: dict) -> list[str]:
    """Every rank loads the prepared data.pt whole (trainer/loaders.py, torch.load), train and
    test splits, whatever train.limit_train says: a set larger than hardware.mem_mb_per_rank
    is a training job that Slurm kills for memory (the job's --mem is mem_mb_per_rank x ranks
    per node, in Slurm's MB of 2**20 bytes), every one of them, after its wait in the queue.
    A necessary bound, not a sufficient one: torch, the model and the batches come on top
    (the demo's ranks peak at 0.96 GB with 3,048 synthetic images: config/demo.yaml)."""
    dataset, mem_mb = config["dataset"], config["hardware"]["mem_mb_per_rank"]
    n_train, n_test = prepared_sizes(config)
    lower = (
        f"; or fewer images (synthetic.num_train {n_train:,}, num_test {n_test:,})"
        if dataset == "synthetic"
        else ""
    )
    images, data = n_train + n_test, vocab.DATASETS[dataset]
    if data.megabytes(images) <= mem_mb:
        return []
    return [
        _bad(
            "hardware.mem_mb_per_rank",
            mem_mb,
            f"at least the {dataset} set that every rank loads whole: {images:,} images x "
            f"{data.image_bytes:,} bytes = {data.megabytes(images):,} MB, and torch and the "
            f"model on top; raise it{lower}",
        )
    ]


def _family_choice_problems(families: dict) -> list[str]:
    """At least one family, and the precision family compares against fp32."""
    problems = []
    if not any(families[name]["enabled"] for name in vocab.FAMILIES):
        problems.append(
            "config key 'families': no family is enabled: set families.<name>.enabled: true "
            f"for at least one of {', '.join(vocab.FAMILIES)}"
        )
    compared = families["precision"]
    if compared["enabled"] and "fp32" not in compared["precisions"]:
        # analyze's speedups and accuracy differences are against the family's own fp32 runs
        problems.append(
            _bad(
                "families.precision.precisions",
                compared["precisions"],
                "must include fp32: each precision's speedup and accuracy difference is against "
                "the family's fp32 run at the same world size (without one the figure is empty)",
            )
        )
    return problems


def _device_problems(config: dict) -> list[str]:
    """What hardware.device rules out: CUDA-only precisions on a CPU, CUDA graphs without CUDA
    or without torch.compile, and the whole-step graph's own conditions."""
    problems = []
    hw, train, families = config["hardware"], config["train"], config["families"]
    precisions = [("train.precision", train["precision"])]
    if families["precision"]["enabled"]:
        precisions += [
            (f"families.precision.precisions[{i}]", value)
            for i, value in enumerate(families["precision"]["precisions"])
        ]
    if hw["device"] == "cuda" and (units := hardware.family_precisions(hw["gpu_type"])):
        # a V100's or T4's tf32 or bf16 run: other arithmetic under the precision's label
        for path, value in precisions:
            if value not in units:
                problems.append(
                    _bad(
                        path,
                        value,
                        f"hardware.gpu_type {hw['gpu_type']} has no {value} units (hardware.py's "
                        f"table): its run would measure other arithmetic under the {value} "
                        f"label; use {', '.join(p for p in vocab.PRECISIONS if p in units)}",
                    )
                )
    if hw["device"] == "cpu":
        for path, value in precisions:
            if value in vocab.CUDA_ONLY_PRECISIONS:
                problems.append(
                    _bad(
                        path,
                        value,
                        f'{vocab.CUDA_ONLY_PRECISIONS[value]} (hardware.device is "cpu"); '
                        "on cpu use fp32 or bf16",
                    )
                )
    if train["cuda_graphs"] is True and (hw["device"] != "cuda" or train["compile"] is False):
        problems.append(
            _bad(
                "train.cuda_graphs",
                True,
                "CUDA graphs record torch.compile's graphs on a GPU: they need hardware.device "
                f"cuda (is {_fmt(hw['device'])}) and train.compile auto or true "
                f"(is {_fmt(train['compile'])})",
            )
        )
    if train["cuda_graphs"] == "step":
        problems += step_graph_problems(config)
    return problems


def _batch_problems(config: dict) -> list[str]:
    """Each enabled family's sweeps (not empty, no repeats; world sizes that fit the nodes)
    and batches: a strong global batch that splits into whole local batches, and no global
    batch larger than the training set; the bucket family needs DDP's buckets."""
    problems: list[str] = []
    train, families = config["train"], config["families"]
    gpn, accum = config["hardware"]["gpus_per_node"], train["accum_steps"]
    n_train, n_train_source = _train_size(config)

    def check_batch(path: str, value, world_size: int, local_batch: int, fix: str) -> None:
        """`path`: the key named (its `value`), the one that can fix it; `fix`: what to do."""
        global_batch = world_size * local_batch * accum
        if global_batch > n_train:
            problems.append(
                _bad(
                    path,
                    value,
                    f"its global batch {world_size} x {local_batch} x accum_steps {accum} = "
                    f"{global_batch} is larger than the {n_train} training images "
                    f"({n_train_source}); no full optimizer step would fit in an epoch: {fix}",
                )
            )

    def check_world_sizes(name: str) -> list[tuple[int, int]]:
        path = f"families.{name}.gpus"
        sizes = _check_list(problems, path, families[name]["gpus"])
        for i, w in sizes:
            _check_fits(problems, f"{path}[{i}]", w, gpn)
        return sizes

    fam = families["strong"]
    if fam["enabled"]:
        sizes = check_world_sizes("strong")
        gb = fam["global_batch"]
        bad = [(i, w) for i, w in sizes if gb % (accum * w)]
        if bad:
            need = math.lcm(*(accum * w for _, w in sizes))
            which = ", ".join(f"{accum} x {w} (families.strong.gpus[{i}])" for i, w in bad)
            problems.append(
                _bad(
                    "families.strong.global_batch",
                    gb,
                    f"not divisible by accum_steps x world size = {which}; local_batch must be "
                    f"a whole number: use a multiple of {need}",
                )
            )
        elif gb > n_train and sizes:  # the same global batch at every world size
            w = sizes[0][1]
            check_batch("families.strong.global_batch", gb, w, gb // (accum * w), "lower it")

    fam = families["weak"]
    if fam["enabled"]:
        for i, w in check_world_sizes("weak"):
            fix = "lower families.weak.local_batch or this world size"
            check_batch(f"families.weak.gpus[{i}]", w, w, fam["local_batch"], fix)

    fam = families["precision"]
    if fam["enabled"]:
        _check_list(problems, "families.precision.precisions", fam["precisions"])
        for i, w in check_world_sizes("precision"):
            fix = "lower train.local_batch or this world size"
            check_batch(f"families.precision.gpus[{i}]", w, w, train["local_batch"], fix)

    fam = families["bucket"]
    if fam["enabled"]:
        if fam["gpus"] < 2:
            # one rank all-reduces nothing: the "bucket effect" it reported was noise
            problems.append(
                _bad(
                    "families.bucket.gpus",
                    fam["gpus"],
                    "at least 2: one rank synchronises no gradients, so its runs would differ "
                    "in bucket_cap_mb in name only",
                )
            )
        _check_fits(problems, "families.bucket.gpus", fam["gpus"], gpn)
        _check_list(problems, "families.bucket.bucket_cap_mb", fam["bucket_cap_mb"])
        _check_list(problems, "families.bucket.local_batch", fam["local_batch"])
        for i, lb in enumerate(fam["local_batch"]):
            path, fix = f"families.bucket.local_batch[{i}]", "lower it"
            check_batch(path, lb, fam["gpus"], lb, fix)
        if train["strategy"] != "ddp":
            problems.append(
                _bad(
                    "families.bucket.enabled",
                    True,
                    f"the bucket family sweeps DDP's bucket_cap_mb and train.strategy is "
                    f"{_fmt(train['strategy'])} (no buckets): its runs would differ in name only; "
                    "set train.strategy ddp or families.bucket.enabled false",
                )
            )
    return problems


def target_problems(config: dict) -> list[str]:
    """report.targets.strong_efficiency_gpus: a world size the strong family runs, above its
    smallest (E_s is against that one, 1 there by definition). Any other was planned and
    trained in full, and only the report said "not measured" (analyze.verdicts). Not checked
    while the strong family is disabled, or runs one world size (no value could be measured:
    the verdict says that the family did not run or has no run at the target, and a one-size
    family is a study the proposal reads as thin evidence); weak_deviation has no world size,
    it is judged at the weak family's largest."""
    strong = config["families"]["strong"]
    sizes = sorted(set(strong["gpus"]))
    if not strong["enabled"] or len(sizes) < 2:
        return []
    want, above = config["report"]["targets"]["strong_efficiency_gpus"], sizes[1:]
    if want in above:
        return []
    return [
        _bad(
            "report.targets.strong_efficiency_gpus",
            want,
            f"one of {', '.join(map(str, above))}, the world sizes of families.strong.gpus "
            f"{_fmt(strong['gpus'])} above its smallest ({sizes[0]}, where E_s is 1 by "
            "definition): the strong target is judged at a run of the strong family, and the "
            'report would say "not measured" only after the whole study trained',
        )
    ]


def proposal_problems(proposal: dict) -> list[str]:
    """`proposal:` keys the schema cannot relate: a period longer than the allocation."""
    period = proposal["period_months"]
    if period is not None and period > proposal["total_months"]:
        return [
            _bad(
                "proposal.period_months",
                period,
                f"at most proposal.total_months ({proposal['total_months']}): a period longer "
                "than the allocation splits nothing",
            )
        ]
    return []


# ---------------------------------------------------------------------------------------------
# entry points


def validate(
    config: dict,
    *,
    schema: str | os.PathLike | None = None,
    source=None,
    repo: str | os.PathLike | None = None,
) -> dict:
    """Validate `config` IN PLACE (filling defaults, as Snakemake's validate does) and return it.

    Raises StudyConfigError listing every problem: schema problems first; the semantic checks run
    only on a schema-valid config. `repo`: the repository whose files the config names
    (container.definition), the workflow's REPO; None: the one the schema lies in at
    SCHEMA_RELPATH (schema_path(): this checkout, else the working directory), else unchecked.
    """
    if not isinstance(config, dict):
        raise StudyConfigError(
            _bad("<top level>", config, "must be a mapping (key: value)"), source=source
        )
    # Snakemake's own loading of a --configfile takes any depth, and a YAML alias inside its
    # own anchor is endless: each is no config (the checks below recursed into either until
    # Python's RecursionError)
    if problem := _depth_problem(config):
        raise StudyConfigError(problem, source=source)
    schema_file = schema_path() if schema is None else Path(schema).resolve()
    loaded = _load_schema(str(schema_file))
    if repo is None and schema_file.parts[-len(SCHEMA_RELPATH.parts) :] == SCHEMA_RELPATH.parts:
        repo = schema_file.parents[len(SCHEMA_RELPATH.parts) - 1]
    schema_problems = _schema_problems(config, loaded)
    # a NaN where the schema wants no number (--config study=nan): its line, not "a finite
    # number" as well
    keys = {line.split(": value ", 1)[0] for line in schema_problems}
    problems = [p for p in _non_finite(config) if p.split(": value ", 1)[0] not in keys]
    problems += schema_problems
    if not problems:
        problems = semantic_problems(config, repo)
    if problems:  # each once: a misfit shared by several precisions was listed per precision
        raise StudyConfigError(list(dict.fromkeys(problems)), source=source)
    one_spelling(config)
    return config


def one_spelling(config: dict) -> None:
    """Each path of PATH_KEYS in one spelling per location, in place: without a `.` segment, a
    doubled or a trailing slash (`./results/data`, `results//data` and `results/data/` are
    `results/data`). The prepared data and the image are inputs of every training job, and
    Snakemake compares inputs by their text: a data_dir written anew retrained every run. `..`
    stays (through a symbolic link it is not the parent's parent); a path that would then start
    with `-` or `~` keeps its `./` (path_problems' advice)."""
    for key in PATH_KEYS:
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        path = node[last]
        parts = [part for part in path.split("/") if part not in ("", ".")]
        text = ("/" if path.startswith("/") else "") + "/".join(parts) or "."
        # path_problems refuses a leading - and ~ (an option, a home no shell expands); ./ is
        # its advice for such a name
        node[last] = f"./{text}" if text.startswith(("-", "~")) else text


_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<`


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently).

    Merge keys (`<<: *anchor`) are YAML's own and stay PyYAML's (`flatten_mapping`): a key that a
    merge brings and the mapping also gives is no duplicate, the mapping's own value wins. Only the
    keys a mapping writes itself are compared, once per mapping: flattening puts the merged keys in
    front of them, and a merge source may be flattened before its own construction.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._checked: set[int] = set()  # id() of the mapping nodes whose own keys were compared

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if id(node) in self._checked:  # flattened already: the merged keys are in front now
            super().flatten_mapping(node)
            return
        self._checked.add(id(node))
        own = [key_node for key_node, _ in node.value if key_node.tag != _MERGE_TAG]
        super().flatten_mapping(node)  # also retags a `=` key as a string
        seen: dict[Any, int] = {}
        for key_node in own:
            key = self.construct_object(key_node)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first given on line {seen[key] + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key; SafeLoader reports it itself
                pass

    def construct_object(self, node, deep=False):
        """PyYAML's, with a value its constructor cannot build (`2024-02-30`, a date that is
        none; `!!int x`, `!!bool maybe`) refused at its line: PyYAML raises a plain
        ValueError (KeyError, AttributeError, ... for other tags), a traceback."""
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise  # its own errors, with their marks; too deep: load_yaml's line
        except Exception as e:
            what = _TAG_WHAT.get(str(node.tag).rpartition(":")[2], f"value of tag {node.tag}")
            raise _MisreadNumber(
                None,
                None,
                f"{node.value!r} is no {what} ({e}): write it correctly, or quote it for text",
                node.start_mark,
            ) from e


class _MisreadNumber(yaml.constructor.ConstructorError):
    """A number YAML 1.1 reads otherwise than it looks, or a value it cannot build (2024-02-30):
    load_yaml names it, not as malformed."""


# what a message calls the value of a tag whose constructor can fail on a value of its form
_TAG_WHAT = {"timestamp": "date", "int": "integer", "float": "number"}


def _misread_number(loader: yaml.SafeLoader, node: yaml.ScalarNode, value: Any) -> None:
    """Refuse a number written with a leading 0 (YAML 1.1's octal: `epochs: 010` is 8) or with
    colons (its base 60: `signal_lead_s: 5:00` is 300, `1:30` is 90). Snakemake reads config
    files with PyYAML, a YAML 1.1 loader, and so does this one: the value would be taken
    silently. A hexadecimal 0x.. or binary 0b.. number says what it is and stays."""
    text = node.value.replace("_", "").lstrip("+-")
    octal = len(text) > 1 and text[0] == "0" and text[1].isdigit() and "." not in text
    if not (octal or ":" in text):
        return
    why, fix = (
        ("a leading 0 makes it octal", "write it without the leading 0")
        if octal
        else ("digits joined by : are base 60", "write it as one number")
    )
    raise _MisreadNumber(
        None,
        None,
        f"{node.value!r} reads as {value!r} in YAML 1.1, as Snakemake reads config files "
        f"({why}): {fix}, or quote it for text",
        node.start_mark,
    )


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    _misread_number(loader, node, value)
    return value


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    _misread_number(loader, node, value)
    return value


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


class _DuplicateJsonKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateJsonKey(key)
        seen[key] = value
    return seen


def load_yaml(path: str | os.PathLike) -> dict:
    """The config file as a dict (one holding none is refused, as Snakemake refuses it);
    errors name the file and line. Read as Snakemake reads a config file: JSON where it is
    JSON (`1e-1` is 0.1 there, text in YAML 1.1), else YAML."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        except _DuplicateJsonKey as e:
            raise StudyConfigError(f"{path}: duplicate key {e.args[0]!r}") from None
        except ValueError:  # no JSON: YAML, as Snakemake falls back to
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except OSError as e:
        raise StudyConfigError(f"cannot read {path}: {e.strerror or e}") from e
    except RecursionError:
        raise StudyConfigError(f"{path}: nested too deep for a config file") from None
    except UnicodeDecodeError as e:  # e.g. a file saved as Latin-1
        raise StudyConfigError(
            f"{path}: byte {e.start} is not UTF-8 text ({e.reason}): save the file as UTF-8"
        ) from e
    except yaml.reader.ReaderError as e:
        # a character YAML refuses (a NUL, a control byte): its message was two lines naming
        # "<unicode string>, position N"; the line and column are counted from that offset
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise StudyConfigError(
            f"{path}, line {line}, column {column}: malformed YAML: character "
            f"{ord(e.character) if isinstance(e.character, str) else e.character:#06x} is not "
            "allowed in YAML (a control character): delete it"
        ) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        if isinstance(e, _MisreadNumber):
            raise StudyConfigError(f"{where}: {e.problem}") from e
        detail = getattr(e, "problem", None) or str(e)
        context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and context_mark and mark and context_mark.line != mark.line:
            # e.g. an unclosed [ : the problem shows up lines after the opening bracket
            detail += f" ({context.removeprefix('while ')} that starts on line "
            detail += f"{context_mark.line + 1})"
        elif context:
            detail = f"{context}: {detail}"
        raise StudyConfigError(f"{where}: malformed YAML: {detail}") from e
    if data is None:  # snakemake refuses it too ("... with keys at top level")
        raise StudyConfigError(
            f"{path}: holds no config (empty, or comments only: a copy cut short?): give the "
            "study's keys (config/config.yaml's are the defaults)"
        )
    if not isinstance(data, dict):
        raise StudyConfigError(
            _bad("<top level>", data, "must be a mapping (key: value)"), source=path
        )
    if problem := _depth_problem(data):  # before any merge's deepcopy recurses into it
        raise StudyConfigError(problem, source=path)
    return data


def _depth_problem(config: Any) -> str | None:
    """Why the checks (they recurse) cannot read `config`, None when they can: an alias inside
    its own anchor (endless: _holds_itself), or nesting deeper than MOST_DEPTH."""
    if not _too_deep(config):
        return _holds_itself(config)  # within MOST_DEPTH levels: its recursion is bounded
    return "nested too deep for a config file"


# nesting no study config comes near (the schema's is 4 levels), checked without recursion:
# JSON reads deeper nesting than the merge, the checks and copy.deepcopy can recurse into
MOST_DEPTH = 50


def _too_deep(value: Any) -> bool:
    """Whether `value` nests lists and mappings more than MOST_DEPTH levels deep, each one
    looked into once (YAML aliases share one: `&a {x: *a, y: *a}` doubled the next level's
    list at every level, for ever; one inside its own anchor ends here, _holds_itself names it)."""
    level, todo, seen = 0, [value], {id(value)}
    while todo:
        level += 1
        if level > MOST_DEPTH:
            return True
        later = []
        for item in todo:
            for v in item.values() if isinstance(item, dict) else item:
                if isinstance(v, dict | list) and id(v) not in seen:
                    seen.add(id(v))
                    later.append(v)
        todo = later
    return False


def _parse_value(text: str, item: str = "") -> Any:
    """`--set` values are YAML: 8 -> int, [1,2] -> list, null -> None; text that is no YAML is
    itself. A number YAML 1.1 reads otherwise than it looks (010: octal 8) is refused, as in
    the config files (Snakemake's --config reads 010 as 10: the plan and the workflow would
    have priced two studies)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.constructor.ConstructorError as e:  # a misread number, a key given twice
        raise StudyConfigError(f"override {item!r}: {e.problem}") from e
    except RecursionError:
        raise StudyConfigError(f"override {item!r}: nested too deep") from None
    except yaml.YAMLError:
        return text


def _merge(into: dict, new: Mapping) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def apply_overrides(config: dict, overrides: Mapping | Iterable[str]) -> dict:
    """Apply overrides to `config` in place and return it.

    A mapping is merged recursively (as Snakemake merges --config into the configfile); strings
    are "dotted.key=VALUE" with a YAML value, e.g. "train.epochs=3" or "families.strong.gpus=[1,2]",
    and a VALUE that is a mapping is merged the same way ("families.strong={gpus: [1, 2]}" keeps
    the files' families.strong.enabled).
    """
    if isinstance(overrides, Mapping):
        _merge(config, overrides)
        return config
    for item in overrides:
        try:
            str(item).encode("utf-8")
        except UnicodeEncodeError:  # a byte the locale could not decode: a lone surrogate
            raise StudyConfigError(
                f"override {ascii(item)}: not UTF-8 text (a byte the terminal's encoding could "
                "not decode); give it in UTF-8"
            ) from None
        key, sep, raw = str(item).partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise StudyConfigError(f"override {item!r}: expected KEY=VALUE, e.g. train.epochs=3")
        node = config
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise StudyConfigError(
                    f"override {item!r}: config key '{'.'.join(parts[: i + 1])}' is "
                    f"{_fmt(node)}, not a mapping"
                )
        # merged as Snakemake's --config merges `KEY={...}`: replaced, the files' other keys of
        # that mapping fell back to the schema's defaults (families.strong.enabled: false)
        _merge(node, {parts[-1]: _parse_value(raw, str(item))})
    return config


def load_and_validate(
    path_or_dict: str | os.PathLike | Mapping,
    overrides: Mapping | Iterable[str] | None = None,
) -> dict:
    """Load a study config (a YAML path, or a dict that is copied), apply overrides, validate.

    Returns a new dict with every default filled; raises StudyConfigError.
    """
    if isinstance(path_or_dict, Mapping):
        config, source = copy.deepcopy(dict(path_or_dict)), None
    else:
        config, source = load_yaml(path_or_dict), path_or_dict
    if overrides:
        apply_overrides(config, overrides)
    return validate(config, source=source)


def check_files(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """Each config file read as load_yaml reads it: malformed YAML, a key given twice, a top
    level that is no mapping, each a StudyConfigError naming the file (and line). The workflow
    calls it before its `configfile:` directive, whose own messages name neither, and which
    keeps the last of two equal keys silently. Returns what the files hold, in order (the
    workflow finds the --config overrides by them: `config_overrides`)."""
    return [load_yaml(path) for path in paths]


def default_config_path() -> Path:
    """config/config.yaml of the checkout: the workflow's `configfile:`, under every
    --configfile (workflow/Snakefile)."""
    return Path(__file__).resolve().parents[3] / "config" / "config.yaml"


def config_inputs(paths: Iterable[str | os.PathLike] | None) -> dict[str, Path]:
    """The config files load_layers reads, by the names a refused output names them (files.
    check_distinct): config/config.yaml of the checkout, read under every --config, and each
    --config (numbered when several): an output over one of them replaced the study config."""
    base = default_config_path()
    given = [Path(p) for p in paths or []]
    found = {"config/config.yaml": base} if base.is_file() else {}
    found |= {"--config" + (f" {i}" if len(given) > 1 else ""): p for i, p in enumerate(given, 1)}
    return found


def load_layers(paths: Iterable[str | os.PathLike] | None, overrides=None) -> dict:
    """The study config as the workflow sees it, validated: config/config.yaml of the
    checkout, then each file of `paths` merged over it in order (as Snakemake merges
    --configfile files over the Snakefile's configfile), then `overrides`. config/config.yaml
    given first is read once (merged over itself it changes nothing); given after another file
    it is merged there, as Snakemake does: its values win over that file's."""
    base = default_config_path()
    layers = [Path(p) for p in paths or []]
    while base.is_file() and layers and layers[0].resolve() == base:
        del layers[0]
    config = load_yaml(base) if base.is_file() else {}
    for path in layers:
        _merge(config, load_yaml(path))
    if overrides:
        apply_overrides(config, overrides)
    # named as the workflow names it (common.smk): "config/config.yaml + FILE ... + --set K=V"
    if isinstance(overrides, Mapping):
        given = [_shown_override(key, value) for key, value in _leaves(overrides)]
    else:
        given = [str(item) for item in overrides or []]
    source = layers_source(([base] if base.is_file() else []) + layers, given, "--set")
    return validate(config, source=source)


def layers_source(
    files: Iterable[str | os.PathLike], overrides: Iterable[str] = (), flag: str = "--config"
) -> str | None:
    """A layered study config as its error messages name it: the files in the order merged,
    then the command line's overrides, e.g. "config/config.yaml + demo.yaml + --config
    dataset=cifar100" (a bad value of an override is not blamed on a file that holds a good
    one). None when there is neither."""
    parts = [str(f) for f in files]
    overrides = list(overrides)
    if overrides:
        parts.append(" ".join([flag, *overrides]))
    return " + ".join(parts) or None


def config_overrides(config: Mapping, layers: Iterable[Mapping]) -> list[str]:
    """The values of `config` that its config files do not give: Snakemake's --config
    overrides, known by their effect (no public API holds them). `layers` is what the files
    hold (check_files), merged in order as Snakemake merges them; the values of `config` they
    lack or give otherwise, as --config takes them: "KEY=VALUE" per top-level key (a string as
    it is, else JSON: `'train={"epochs": 3}'`, shell-quoted; "train.epochs=3", as named once,
    is no --config argument Snakemake takes). An override equal to the files' value is not
    listed: it changes nothing. Call it before validate, which fills the defaults in."""
    merged: dict = {}
    for layer in layers:
        _merge(merged, layer)
    # shell-quoted: `train={"epochs": 3}` unquoted is split at its space, its quotes dropped
    return [shlex.quote(_shown_override(k, v)) for k, v in _changed(config, merged).items()]


def _changed(config: Mapping, given) -> dict:
    """The part of `config` (its nesting kept, by key, not by a dotted name: a key with a dot
    in it stays one key) that `given` lacks or holds otherwise, as _leaves compares."""
    given = given if isinstance(given, Mapping) else {}
    out = {}
    for key, value in config.items():
        there = given.get(key, _ABSENT)
        if isinstance(value, Mapping) and value:
            if inner := _changed(value, there):
                out[key] = inner
        elif there is _ABSENT or _canonical(value) != _canonical(there):
            out[key] = value
    return out


_ABSENT = object()


def _leaves(config: Mapping, given: Mapping | None = None, where: str = "") -> list[tuple]:
    """(dotted key, value) of each value of `config` (into its mappings) that `given` lacks or
    holds otherwise (True is not 1, 1 is not 1.0); every one without `given`."""
    given = given if isinstance(given, Mapping) else {}
    found = []
    for key, value in config.items():
        there = given.get(key, _ABSENT)
        if isinstance(value, Mapping) and value:
            found += _leaves(value, there if isinstance(there, Mapping) else {}, f"{where}{key}.")
        elif there is _ABSENT or _canonical(value) != _canonical(there):
            found.append((f"{where}{key}", value))
    return found


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _shown_override(key: str, value) -> str:
    return f"{key}={value if isinstance(value, str) else _canonical(value)}"


# Snakemake hands the --config arguments to the jobs it starts (the Slurm executor's job
# script, the local executor's `run:` jobs) through a shell, each KEY=VALUE as Python's repr()
# unless it already starts with a quote (snakemake_interface_executor_plugins.utils
# .format_cli_value). repr() single-quotes a value without ' and the shell reads it back as
# typed; a value with ' gets double quotes, inside which the shell runs $(...) and `...`,
# expands $VAR and eats backslashes; repr() itself writes a backslash, a control character or
# ' beside " as escapes the shell does not undo.
_SHELL_IN_DOUBLE_QUOTES = "$`\\"


def overrides_a_shell_changes(args: Iterable[str]) -> list[str]:
    """One line per --config argument (KEY=VALUE as typed) that Snakemake's jobs would read
    as another value, or run as a command: see above. [] when every one arrives as typed."""
    problems = []
    for arg in args:
        word = repr(arg)
        as_typed = word == f"'{arg}'" or (
            word == f'"{arg}"' and not any(c in arg for c in _SHELL_IN_DOUBLE_QUOTES)
        )
        if arg[:1] in ("'", '"'):
            why = "it starts with a quote, which their shell removes"
        elif as_typed:
            continue
        elif word[0] == '"':
            why = (
                "it holds a ' beside $, ` or \\, which their shell expands inside the double "
                "quotes Snakemake gives it"
            )
        else:
            why = (
                "it holds a backslash, a control character, or both ' and \", which "
                "Snakemake's quoting escapes and their shell keeps"
            )
        problems.append(
            f"--config {shlex.quote(arg)} would reach the jobs Snakemake starts changed: {why}. "
            "Give "
            "this key in a YAML file with --configfile instead"
        )
    return problems


def check_layered(config: Mapping, base_path: str | os.PathLike) -> None:
    """Refuse a config that Snakemake did not build by merging the --configfile files and
    --config over `base_path` (config/config.yaml), as load_layers builds it: the report's
    reproduce command and `scalestudy matrix/plan/proposal --config` would name another study.
    `--replace-workflow-config` does that, and the Snakefile has no documented way to ask for
    the flag, so it is known by its effect: merging never drops a key of a mapping, so a key of
    config/config.yaml missing where both hold a mapping was dropped with the file. Where the
    files give every key again the two builds are one study, and nothing is refused."""

    def missing(config: Mapping, base: Mapping, where: str) -> str | None:
        for key, value in base.items():
            if key not in config:
                return f"{where}{key}"
            both = isinstance(value, Mapping) and isinstance(config[key], Mapping)
            if both and (found := missing(config[key], value, f"{where}{key}.")):
                return found
        return None

    if key := missing(config, load_yaml(base_path), ""):
        raise StudyConfigError(
            f"config key '{key}' of {base_path} is missing from the study's config "
            "(--replace-workflow-config drops that file), but the report's reproduce command "
            "and `scalestudy matrix/plan/proposal --config` merge the --configfile files over "
            "it, as snakemake does without the flag: drop --replace-workflow-config (command "
            "line or profile) and set in your --configfile the values that should differ"
        )


def add_config_arguments(parser) -> None:
    """--config and --set of the subcommands that read a study config (matrix, plan,
    proposal): the files are layered as the workflow layers them (load_layers)."""
    parser.add_argument(
        "--config",
        action="append",
        metavar="FILE",
        help="study config YAML, merged over config/config.yaml as `snakemake --configfile "
        "FILE` merges it; repeatable, later files win (default: config/config.yaml alone)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (dotted path, YAML value), e.g. dataset=synthetic or "
        "families.strong.gpus=[1,2,4,8]; a mapping value is merged, as snakemake --config merges "
        "it; repeatable",
    )
