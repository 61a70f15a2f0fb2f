"""`scalestudy matrix`: write the run table of a study config (study/runs.py builds it).

scalestudy matrix --config config/demo.yaml --set dataset=synthetic   # -> results/matrix/
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scalestudy import log, vocab
from scalestudy.errors import StudyConfigError
from scalestudy.study.config import add_config_arguments, load_layers
from scalestudy.study.runs import build_run_table, number_text, write_runs_tsv

logger = log.get(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--out", default="results/matrix/runs.tsv", help="run table to write (%(default)s)"
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
        sizes = "world sizes " + ",".join(map(str, fam["gpus"]))
        sweep = {
            "strong": f"{sizes} at global_batch {fam.get('global_batch')}",
            "weak": f"{sizes} at local_batch {fam.get('local_batch')}",
            "precision": f"{','.join(fam.get('precisions', []))} at {sizes}",
        }[family]
    return (
        f"{family:<9} {len(mine):4d} runs ({shared} shared with other families): {sweep}, "
        f"x{config['repeats']} repeats"
    )


def run(args: argparse.Namespace) -> int:
    log.setup()
    try:
        config = load_layers(args.config, overrides=args.set)
    except StudyConfigError as e:
        logger.error(f"scalestudy matrix: {e}")
        return 2
    rows = build_run_table(config)
    write_runs_tsv(rows, args.out)
    for family in vocab.FAMILIES:
        logger.info(_family_summary(config, rows, family))
    logger.info(f"{'total':<9} {len(rows):4d} runs -> {Path(args.out)}")
    return 0
