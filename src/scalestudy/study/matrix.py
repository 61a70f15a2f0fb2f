"""`scalestudy matrix`: the run table of a study config (study/runs.py builds it).

scalestudy matrix --config config/demo.yaml --set dataset=synthetic   # table -> stdout
scalestudy matrix --config config/demo.yaml --out runs.tsv            # table -> runs.tsv

Without --out the table goes to stdout and the summary per family to stderr: a preview writes
no file. Its default was results/matrix/runs.tsv, the output of the workflow's rule `matrix`
(which writes it itself, workflow/rules/data.smk): a preview of another study replaced it, and
Snakemake, seeing the file newer and its params unchanged, kept it, so collect gathered the other
study's runs.
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import StudyConfigError
from scalestudy.study.config import add_config_arguments, config_inputs, load_layers
from scalestudy.study.runs import build_run_table, number_text, runs_tsv_text, write_runs_tsv

logger = log.get(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--out",
        help="run table to write (default: to stdout, the summary to stderr; the workflow's "
        "results/matrix/runs.tsv is snakemake's to write)",
    )


def _family_summary(config: dict, rows: list[dict], family: str) -> str:
    fam = config["families"][family]
    if not fam["enabled"]:
        return f"{family:<9}  disabled"
    mine = [r for r in rows if family in r["families"].split(";")]
    shared = sum(1 for r in mine if ";" in r["families"])
    if family == "bucket":
        sweep = (
            f"bucket_cap_mb {','.join(map(number_text, fam['bucket_cap_mb']))} x local_batch "
            f"{','.join(map(str, fam['local_batch']))} at world size {fam['gpus']}"
        )
    else:
        sizes = f"{vocab.plural('world sizes', len(fam['gpus']))} " + ",".join(
            map(str, fam["gpus"])
        )
        sweep = {
            "strong": f"{sizes} at global_batch {fam.get('global_batch')}",
            "weak": f"{sizes} at local_batch {fam.get('local_batch')}",
            "precision": f"{','.join(fam.get('precisions', []))} at {sizes}",
        }[family]
    return (
        f"{family:<9} {len(mine):4d} {vocab.plural('runs', len(mine))} ({shared} shared with other "
        f"families): {sweep}, x{config['repeats']} {vocab.plural('repeats', config['repeats'])}"
    )


def run(args: argparse.Namespace) -> int:
    log.setup()
    try:
        config = load_layers(args.config, overrides=args.set)
        if args.out is not None:  # the table over a config file it was built from
            files.check_distinct({"--out": args.out}, config_inputs(args.config), StudyConfigError)
    except StudyConfigError as e:
        logger.error(f"scalestudy matrix: {e}")
        return 2
    rows = build_run_table(config)
    summary = [_family_summary(config, rows, family) for family in vocab.FAMILIES]
    if args.out is None:
        _print_table(runs_tsv_text(rows))
        for line in [
            *summary,
            f"{'total':<9} {len(rows):4d} {vocab.plural('runs', len(rows))} (the table: stdout)",
        ]:
            print(line, file=sys.stderr)
        return 0
    write_runs_tsv(rows, args.out)
    for line in summary:
        logger.info(line)
    logger.info(
        f"{'total':<9} {len(rows):4d} {vocab.plural('runs', len(rows))} -> {Path(args.out)}"
    )
    return 0


def _print_table(text: str) -> None:
    """The table to stdout; a reader gone early (`| head`) is no error: stdout then writes to
    /dev/null (Python's advice, signal module, "Note on SIGPIPE"), so the exit flush is quiet."""
    if sys.stdout is None:  # closed (`>&-`): the table has nowhere to go, said in one line
        raise OSError(errno.EBADF, "closed: the table goes to stdout (or give --out)", "stdout")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        log.to_devnull(sys.stdout)
    except OSError as e:  # `> runs.tsv` on a full disk (or /dev/full): named, one line (cli)
        log.to_devnull(sys.stdout)  # the rest of the buffer would fail again at exit
        raise OSError(e.errno, e.strerror, "stdout") from e
