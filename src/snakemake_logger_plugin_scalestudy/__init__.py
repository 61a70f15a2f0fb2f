"""Snakemake logger plugin `scalestudy`: the node-hour plan after `snakemake --dry-run`.

Turned on by `logger: [scalestudy]` in profiles/default/config.yaml alone (where Snakemake finds
the plugin): Snakemake loads that workflow profile with every call in this repository, under
`--profile profiles/slurm` or profiles/local-slurm too, so the Slurm profiles do not name it. It
collects the JOB_INFO record Snakemake logs for every job a dry-run would start (rule,
wildcards, resources) and, when Snakemake closes its loggers, prints the plan: one row per job
with nodes, GPUs, estimated runtime, node-hours and GPU-hours, then totals per rule, per family
and overall. Finished runs are not in the dry-run, so they do not count. Real runs, and dry-runs
that fail, print nothing extra.

Where the numbers come from: a training job's row is its estimate in the node-hour plan
(scalestudy.study.plan). The workflow's training rule takes its Slurm `runtime` from
scalestudy.study.resources.TrainingPlan, which computes the plan (reading the measured runs)
in this process, while common.smk is parsed (`PLAN.refusal()`), and registers it
(`plan.registered()`); every job's JOB_INFO record carries its evaluated resources, so each
training job the dry-run lists has an estimate by then. Rules in
scalestudy.study.resources.LOCAL_RULES run on the submitting host: 0 node-hours. Any other job
counts its Slurm request (runtime x nodes, GPUs from gres).

Snakemake finds this module by its name (snakemake_logger_plugin_<name>) once the scalestudy
package is installed (`pip install -e .`, src layout); `snakemake --help` then lists `scalestudy`
under `--logger`.
"""

from __future__ import annotations

import logging
import sys
from logging import LogRecord

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent

FIX = (
    "reinstall the package in the environment snakemake runs from (`pip install -e .` in the "
    "repository, see README.md), or drop `logger: [scalestudy]` from the profile"
)

try:  # the line a run with every output up to date ends on (snakemake.common's constant)
    from snakemake.common import NOTHING_TO_BE_DONE_MSG as NOTHING_TO_BE_DONE
except ImportError:  # another snakemake layout: its text as of snakemake 9
    NOTHING_TO_BE_DONE = "Nothing to be done (all requested files are present and up to date)."


def _mapping(value) -> dict:
    """Snakemake's wildcards/resources containers as a plain dict (empty if unreadable)."""
    if value is None:
        return {}
    try:
        return {str(k): v for k, v in dict(value.items()).items()}
    except (AttributeError, TypeError, ValueError):
        return {}


class LogHandler(LogHandlerBase):
    def __post_init__(self) -> None:
        self._jobs: list[tuple[str, dict, dict]] = []
        self._printed = False
        self._failed = False
        self._nothing = False  # Snakemake said there is nothing to be done

    # The plan is text after Snakemake's own output, not a replacement of it.
    @property
    def writes_to_stream(self) -> bool:
        return False

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True  # emit() picks its records (JOB_INFO, errors), whatever --quiet says

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False

    def emit(self, record: LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self._failed = True  # the workflow did not get to a plan: its error says why
        if record.msg == NOTHING_TO_BE_DONE:  # no job hidden by --quiet: none at all
            self._nothing = True
        if not self.common_settings.dryrun or getattr(record, "event", None) != LogEvent.JOB_INFO:
            return
        self._jobs.append(
            (
                str(getattr(record, "rule_name", "?")),
                _mapping(getattr(record, "wildcards", None)),
                _mapping(getattr(record, "resources", None)),
            )
        )

    def close(self) -> None:
        try:
            if self.common_settings.dryrun and not self._printed and not self._failed:
                self._printed = True
                self._print_plan()
        finally:
            super().close()

    def _print_plan(self) -> None:
        stream = sys.stdout if getattr(self.common_settings, "stdout", False) else sys.stderr
        try:
            from scalestudy.study import plan, resources
        except Exception as exc:  # noqa: BLE001 - any import failure gets the same advice
            print(
                f"scalestudy plan: cannot import scalestudy.study.plan ({exc}): {FIX}", file=stream
            )
            return
        quiet = {getattr(q, "name", str(q)).lower() for q in self.common_settings.quiet or ()}
        if not self._jobs and quiet & {"rules", "all"} and not self._nothing:
            print(
                "scalestudy plan: --quiet hides the jobs from loggers; run the dry-run without "
                "--quiet (or with --quiet progress) to see the node-hour plan",
                file=stream,
            )
            return
        if not self._jobs and not self._nothing:
            # no scheduling pass: -n with --dag, --rulegraph, --list-rules or --summary, which
            # print their own output (a DOT graph on stdout: a plan of "0 jobs" followed it)
            return
        # the training estimates, registered when Snakemake evaluated the jobs' runtime
        reg = plan.registered() or plan.Registered({}, {}, resources.is_local_rule)
        unplanned = [w.get("run") for r, w, _ in self._jobs if r == "train"]
        if any(run not in reg.estimates for run in unplanned):
            print(
                "scalestudy plan: no estimate registered for some training jobs (not the "
                "scalestudy workflow, or its train rule takes no runtime from "
                "scalestudy.study.resources.TrainingPlan); their node-hours are counted from "
                "Slurm requests only",
                file=stream,
            )
        try:
            estimates = [plan.job_estimate(reg, *job) for job in self._jobs]
            estimates.sort(key=lambda e: (e.rule != "train", e.rule, _order(reg, e.run)))
            # a registered study says whether it is on GPUs; without one the jobs' GPUs do
            hardware = reg.config.get("hardware") or {}
            gpu = hardware["device"] == "cuda" if "device" in hardware else None
            stream.write(plan.format_table(estimates, gpu=gpu))
        except Exception as exc:  # noqa: BLE001 - the plan must never break a dry-run
            print(f"scalestudy plan: could not compute the plan ({exc!r}): {FIX}", file=stream)
        stream.flush()


def _order(reg, run: str) -> int:
    """Run-table order for training jobs (the dry-run lists jobs in no useful order)."""
    runs = list(reg.estimates)
    return runs.index(run) if run in runs else len(runs)
