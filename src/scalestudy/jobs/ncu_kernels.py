"""`scalestudy profile ncu-kernels` (its command line: jobs/profile.py): a run's kernels table
(`profile parse`'s kernels.csv) -> the kernels its Nsight Compute job may profile, in the order
it takes them (the workflow's results/profile/<run>/ncu_kernels.json), a JSON list of
    {"kernel": <the kernels CSV's name>, "name_base": "demangled" | "mangled",
     "kernel_regex": "^...$", "instances": <its launches in the capture's window>}
rank 0's kernels by time (the rank ncu profiles; each rank autotunes its own cuDNN engines),
every rank's where the capture has no rank 0 (then the fewest launches of any rank), NCCL and
memcpy left out (ncu serialises launches: a profiled NCCL kernel would wait forever for its
peers). kernel_regex is ncu's --kernel-name filter (with --kernel-name-base name_base) for the
name as nsys or torch.profiler demangled it; `profile ncu` profiles the first top_k.

A local step of its own: the ncu job (jobs/profile_ncu.py) reads this file and imports none of
the parsers or the classifier (nsight/), so an edit to one of them reruns the parse and this
step, seconds, never Nsight Compute, a whole training run per kernel (the workflow reads the
file as ancient(), as it read the kernels table before).
"""

from __future__ import annotations

import argparse
import re

from scalestudy import files, log
from scalestudy.errors import ProfileError
from scalestudy.nsight import classify, schema

logger = log.get(__name__)


_REGEX_META = set("\\^$.|?*+()[]{}")


def _regex_literal(text: str) -> str:
    # only the metacharacters every regex dialect shares: re.escape also escapes characters
    # (space, '#', '&', '~') that some engines reject as unknown escapes
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


# the spellings in which ncu's demangler differs from the one of nsys and torch.profiler (seen on
# an H200, ncu 2025.3.1, torch 2.11: tests/fixtures/gpu-h200/ncu_kernel_names.txt)
_ANON = "(anonymous namespace)"  # ncu: <unnamed>
# {lambda(long)#1}; ncu: [lambda(long) (instance 1)]
_LAMBDA = re.compile(r"\{lambda\((?:[^()]|\([^()]*\))*\)#(\d+)\}")
# a literal template argument, 4, -1 or 3ul; ncu: (int)4, (int)-1, (unsigned long)3
_NUMBER = re.compile(r"(-?\d+)[uUlL]*(?=\s*[,>])")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _closing(text: str, at: int) -> int:
    """The index of the ')' that closes the '(' at text[at], or -1."""
    depth = 0
    for i in range(at, len(text)):
        depth += (text[i] == "(") - (text[i] == ")")
        if depth == 0:
            return i
    return -1


def _name_regex(text: str) -> str:
    """The regex of a kernel's name before its parameter list, tolerant of ncu's spellings:
    every nested parameter list (a lambda's enclosing function) is free, since ncu prints its
    template parameters (T1) where the others print types."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        lam = _LAMBDA.match(text, i)
        num = _NUMBER.match(text, i) if i and text[i - 1] in "<, " else None
        word = _IDENT.match(text, i)
        if text.startswith(_ANON, i):
            out.append(r"(\(anonymous namespace\)|<unnamed>)")
            i += len(_ANON)
        elif lam:
            n = lam.group(1)
            out.append(rf"(\{{lambda\(.*\)#{n}\}}|\[lambda\(.*\) \(instance {n}\)\])")
            i = lam.end()
        elif num:
            out.append(rf"(\([A-Za-z_][A-Za-z0-9_ ]*\))?{num.group(1)}[uUlL]*")
            i = num.end()
        elif word and word.group() in ("true", "false") and text[i - 1] in "<, ":
            out.append(f"({word.group()}|\\(bool\\){int(word.group() == 'true')})")
            i = word.end()
        elif word:
            # ncu prints the return type of a function template named in a template argument
            # ("void at::native::flip_kernel_impl<...>(...)::[lambda...]"); the others do not
            starts_argument = i and text[i - 1] in "<, " and text[i - 2 : i] != "::"
            out.append(("(void\\s+)?" if starts_argument else "") + word.group())
            i = word.end()
        elif ch == "(" and (end := _closing(text, i)) > 0:
            out.append(r"\(.*\)")
            i = end + 1
        elif ch == " ":
            i += 1
            continue
        else:
            out.append(_regex_literal(ch))
            i += 1
        out.append(r"\s*")
    return "".join(out)


def ncu_name_base(name: str) -> str:
    """ncu's --kernel-name-base for a kernels-CSV name: "mangled" for a name the profiler could
    not demangle (an Itanium symbol, "_ZN17cutlass..."), else "demangled"."""
    return "mangled" if name.strip().startswith("_Z") else "demangled"


def ncu_kernel_regex(name: str) -> str:
    """The ncu --kernel-name filter (with --kernel-name-base demangled) for one kernel of the
    kernels CSV, whose names are nsys's or torch.profiler's demangled ones. ncu demangles
    differently (seen on an H200: "<unnamed>" for "(anonymous namespace)", "(int)4" and
    "(bool)1" for the template arguments "4" and "true", "[lambda(long) (instance 1)]" for
    "{lambda(long)#1}", its template parameters "const T2 *" in the parameter list), so the
    filter is the qualified name and template arguments with those spellings allowed, any
    parameter list, anchored: one template instantiation, not its siblings. Whitespace is free
    and the leading 'void ' optional."""
    text = " ".join(name.split())
    if text.startswith("void "):
        text = text[5:]
    if not text:
        raise ProfileError(f"kernel name {name!r} is empty: nothing to give ncu --kernel-name")
    if ncu_name_base(text) == "mangled":
        return f"^{_regex_literal(text)}$"
    params = classify.parameter_list(text)
    head = text if params is None else text[:params]
    tail = "" if params is None else r"\(.*\)"
    return rf"^(void\s+)?{_name_regex(head)}{tail}$"


def candidate(kernel: str, instances: int) -> dict:
    """One entry of the ncu kernels file: the kernel, its ncu name filter, its launches."""
    return {
        "kernel": kernel,
        "name_base": ncu_name_base(kernel),
        "kernel_regex": ncu_kernel_regex(kernel),
        "instances": instances,
    }


def candidates(kernel_rows: list[dict]) -> list[dict]:
    """The ncu kernels file's entries for the rows of a kernels table (the module docstring)."""
    mine = [r for r in kernel_rows if str(r["rank"]) == "0"] or kernel_rows
    return [
        candidate(name, min(int(r["instances"]) for r in mine if r["kernel"] == name))
        for name in schema.top_kernels(mine, len(mine))
    ]


def kernels(args: argparse.Namespace) -> int:
    """`profile ncu-kernels --kernels CSV --out JSON`."""
    files.check_distinct({"--out": args.out}, {"--kernels": args.kernels}, ProfileError)
    files.check_outputs([args.out], ProfileError)
    found = candidates(schema.read_csv(args.kernels, schema.KERNEL_COLUMNS))
    files.write_json(args.out, found)
    logger.info(f"{len(found)} kernels ncu may profile, by time -> {args.out}")
    return 0
