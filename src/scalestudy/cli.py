"""`scalestudy <subcommand>`: the one entry point (`python -m scalestudy` is the same).

Each subcommand lives in its own module, which provides `add_arguments(parser)` and `run(args)`;
modules are imported only when their subcommand runs, so `scalestudy --help` stays fast.

One error path: an expected error (errors.ScalestudyError) that a subcommand does not handle
becomes one message on stderr, `scalestudy <command>: <message>` (what, where, the command that
fixes it), and exit status 2, with no traceback; so does an OSError that names a path (an output
path that is a directory, an unreadable input: `scalestudy <command>: <path>: <cause>`);
anything else is a bug and keeps its traceback.
In a training job the message comes from one rank when every rank would say the same (the
error's `scope`, log.expected_error); ranks that cannot start print `cannot start: ...` and exit
1. `Preempted` is the trainer's own (exit 75) and passes through.

Ctrl-C is one line too, `scalestudy <command>: interrupted` (in a training job from rank 0),
and status 130 (128 + SIGINT): main() returns it, and the program then kills itself with SIGINT
once it has cleaned up, as Python ends on an unhandled Ctrl-C (a shell's loop then stops).
`--debug` adds the traceback.
SIGTERM and SIGHUP (a batch system's time limit, `timeout`, Snakemake cancelling a job, a closed
terminal) end the program as Ctrl-C does: `scalestudy <command>: stopped by SIGTERM`, its
cleanup (the temp files of files.py's atomic writes removed; Python's default action was death
on the spot, and prepare-data left its part of the CIFAR-10 archive in raw/ for good), then
death by that signal (128 + N from main()). Not in the commands that handle them themselves
(OWN_STOP: train with --checkpoint-dir checkpoints on SIGTERM and SIGHUP; launch's handler
lasts until it execs srun or torchrun's agent, which pass them to the ranks), and a signal
ignored when the program starts (nohup's
SIGHUP) stays ignored. A command may take them over for a while and give them back: profile
capture and ncu while their ranks' launch runs (supervise.run_to_end passes them on to it;
then the command's own line, `... stopped by SIGTERM (passed on to the ranks' launch)`, and
exit 128 + N), this handler before and after it (`nsys stats`, `ncu --import`).

A reader that leaves early (`scalestudy plan --out-md /dev/stdout | head -1`, a closed named
pipe) ends the command quietly, as SIGPIPE ends a Unix tool: no message, exit 141 (128 + 13,
what the shell reports for such a tool; `set -o pipefail` then knows that the outputs after the
pipe's were not written). matrix's preview table and the logger's progress lines drop what
their reader left unread and go on (exit 0: the command did all its work).

Debugging: `scalestudy --debug <command> ...` (or SCALESTUDY_DEBUG=1 in the environment) prints
the traceback of the expected errors this module reports too, and every rank's copy (the
commands that report their own in one line, matrix, plan, prepare-data, container and
build-pdf among them, stay one line); --debug sets SCALESTUDY_DEBUG, so the ranks started by
`scalestudy --debug launch` inherit it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading

from scalestudy import files, log, vocab
from scalestudy.errors import Preempted, ScalestudyError

logger = log.get(__name__)

# a command whose output pipe's reader left (`scalestudy plan --out-md /dev/stdout | head -1`)
# before it was done: what a shell reports for a tool killed by SIGPIPE (128 + 13), so that
# `set -o pipefail` hears of the outputs it did not write
SIGPIPE_EXIT = 141

# Ctrl-C (SIGINT): what a shell reports for a command it interrupted (128 + 2)
INTERRUPTED_EXIT = 130

# the signals that stop a command as Ctrl-C does (the module docstring)
STOP_SIGNALS = vocab.STOP_SIGNALS

# the commands that handle the stop signals themselves: train (checkpoint, exit 75: with
# --checkpoint-dir, _owns_stop), gpu-check (kills its checks' process groups), and profile rank
# (execs the profiler around a rank). Not launch: it execs srun or torchrun's agent, which
# passes them to the ranks (exec gives the new program their default actions), and before it
# writes the node record (--inventory: seconds, an srun on the job's first node for up to
# 300 s), where a stop killed it on the spot, silently, its probes left running. Not profile
# capture and ncu: their ranks' launch owns the signals
# while it runs (supervise.run_to_end: passed on to it, then its Stopped, 128 + N from
# profile.run), and this handler is theirs again after it; in OWN_STOP, nothing handled them
# outside the launch, and a stop during `nsys stats` or `ncu --import` killed the job on the
# spot, silently, left the import's temp file and the tool running on, orphaned
OWN_STOP = {"train", "gpu-check", "profile rank"}


class Stopped(KeyboardInterrupt):
    """A stop signal (STOP_SIGNALS) came: raised where the command is, so that it ends as Ctrl-C
    ends it, its finally blocks run. A KeyboardInterrupt so that what handles Ctrl-C handles it
    too: subprocess.run gives its child a moment to exit before it kills it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# the first stop signal's number, once it came (Stopped raised): later ones are ignored (_stop)
_stopping = 0


def _stop(signum: int, _frame) -> None:
    """The stop signals' handler: the first raises Stopped; a later one (a closing terminal's
    SIGHUP after a batch system's SIGTERM, a second sender) is ignored, so that it cannot cut
    the first one's cleanup short (a cleanup takes milliseconds; the program then dies of the
    first). main() raises it again where the command returned without it: C code swallowed
    it (torch's import of NumPy, inside a command's lazy `import torch`)."""
    global _stopping
    if not _stopping:
        _stopping = signum
        raise Stopped(signum)


def _stop_on_signals(handle: bool) -> None:
    """handle: each stop signal left at its default action (death on the spot) raises Stopped
    (_stop); an ignored one (nohup's SIGHUP) stays ignored. Else: their default again, once the
    command is done, whatever its end (a Stopped raised past main() was a traceback and death
    by SIGINT)."""
    for signum in STOP_SIGNALS:
        now = signal.getsignal(signum)
        if handle and now is signal.SIG_DFL:
            signal.signal(signum, _stop)
        elif not handle and now is _stop:
            signal.signal(signum, signal.SIG_DFL)


# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "prepare-data": ("scalestudy.trainer.prepare_data", "download or make a dataset, once"),
    "train": ("scalestudy.trainer.train", "train one configuration (1 process, torchrun, srun)"),
    "launch": ("scalestudy.jobs.launch", "start the ranks of one run (srun, local processes)"),
    "matrix": ("scalestudy.study.matrix", "write the run table of a study config"),
    "collect": ("scalestudy.results.collect", "gather all runs' metrics into results/csv"),
    "profile": ("scalestudy.jobs.profile", "profiling jobs: capture, parse, ncu, merge"),
    "container": ("scalestudy.jobs.container", "the Apptainer image: check, build, digest"),
    "inventory": ("scalestudy.jobs.inventory", "system inventory of this node/allocation -> JSON"),
    "gpu-check": ("scalestudy.jobs.gpu_check", "prove the GPU paths on this node (12-min budget)"),
    "analyze": ("scalestudy.results.analyze", "scaling, verdicts and resources from results/csv"),
    "model": ("scalestudy.results.model", "scaling model, held-out errors, bucket advice"),
    "plot": ("scalestudy.results.plot", "one figure of the study (PNG and PDF)"),
    "render-report": ("scalestudy.results.render_report", "reports/study.md, paper.tex from CSVs"),
    "build-pdf": ("scalestudy.results.build_pdf", "a report's .tex -> .pdf (latexmk), or why not"),
    "plan": ("scalestudy.study.plan", "node-hours of a study -> reports/plan.md, results/plan.csv"),
    "proposal": ("scalestudy.results.proposal", "allocation proposal and slides from the CSVs"),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser with a one-line error: what is wrong and where the usage is, without
    the usage block above it (10 lines for `analyze`). The subcommands' parsers, and theirs,
    are of this class too (add_subparsers makes them of its parser's class); `commands`: the
    top parser's subcommand parsers by name."""

    commands: dict[str, argparse.ArgumentParser]
    actions: argparse.Action | None = None  # add_subparsers' (profile's and container's)

    def add_subparsers(self, **kwargs):
        """argparse's, kept: its `choices` are the action parsers (`profile parse`), whose
        usage a misspelt flag of an action points to."""
        self.actions = super().add_subparsers(**kwargs)
        return self.actions

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; `{self.prog} --help` shows the usage\n")


def build_parser(argv: list[str]) -> Parser:
    parser = Parser(prog="scalestudy", description=__doc__.splitlines()[0])
    parser.commands = {}
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"tracebacks for expected errors too (sets {log.DEBUG_ENV}=1 for child processes)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = parser.commands[name] = sub.add_parser(name, help=help_text, description=help_text)
        # only the chosen subcommand's module is imported (torch is slow to import)
        if name in argv:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    program = argv is None  # the `scalestudy` program's own command line, not a Python caller
    argv = sys.argv[1:] if argv is None else argv
    args = None
    try:
        # the command's modules (torch: seconds) import whole, a Ctrl-C raised after them
        with _HeldInterrupt() if program else contextlib.nullcontext():
            parser = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:  # argparse's message, and for the commands that start the trainer its cause
            hint = ""
            if hasattr(args, "train_args"):
                hint = f" (the trainer's flags go after `--`: scalestudy {_command(args)} ... -- "
                hint += "--epochs 1)"
            # the subcommand's (or its action's) parser: its --help lists the flags
            # (`scalestudy --help` only the commands, `scalestudy profile --help` its actions)
            command = parser.commands[args.command]
            if getattr(args, "action", None) and isinstance(command, Parser) and command.actions:
                command = command.actions.choices[args.action]
            command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        if args.debug:
            os.environ[log.DEBUG_ENV] = "1"  # read by log.debug(), here and in every child
        try:  # every command has relative default paths
            os.getcwd()
        except FileNotFoundError:  # was a traceback (FileNotFoundError, no path) in any command
            log.setup()
            logger.error(
                f"scalestudy {_command(args)}: the working directory no longer exists (deleted "
                "or moved): cd to the study's directory and run the command again"
            )
            return 2
        # an output on stdout (`--out-csv /dev/stdout > plan.csv`): the progress lines go to
        # stderr, or they ended up in it, after the table
        to_stderr = any(map(files.is_own_stdout, _arguments(args)))
        log.setup(progress_to_stderr=to_stderr)
        # a Python caller's signal handlers are its own
        stops = program and not _owns_stop(args)
        if stops:
            _stop_on_signals(True)
        try:
            code = _run(importlib.import_module(SUBCOMMANDS[args.command][0]), args)
            if stops and _stopping:  # raised, and swallowed on its way: the command went on,
                raise Stopped(_stopping)  # exit 0, and ignored every later stop signal
            return code
        finally:  # the command's cleanup is done: a later signal may kill it on the spot
            if stops:
                _stop_on_signals(False)
            if to_stderr:  # a Python caller's next command starts as set up by default
                log.setup(progress_to_stderr=False)
    except KeyboardInterrupt as exc:
        # Ctrl-C reaches every rank of a run (torchrun passes it to each worker, srun to each
        # task): rank 0 says it; --debug: every rank, with its traceback
        command = _command(args) if args else next((a for a in argv if a in SUBCOMMANDS), "")
        name = " ".join(filter(None, ("scalestudy", command)))
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {exc}"
        log.expected_error(logger, f"{name}: {what}", "run")
        if program:  # it then ends killed by the signal (log.end_by_signal); a caller lives on
            log.end_by_signal(signum)
        return INTERRUPTED_EXIT if signum == signal.SIGINT else 128 + signum


class _HeldInterrupt:
    """Ctrl-C (SIGINT) held while the command's modules import, then raised as Python's own
    handler raises it: raised inside `import torch`, torch's NumPy set-up swallowed it and left
    numpy.linalg half-imported, and a rank Ctrl-C reached 0.3 s after its start failed later
    with "cannot start: maximum recursion depth exceeded" (the launch, expecting rank 0's
    "interrupted", said nothing more). A second Ctrl-C is raised at once (an import that
    hangs, on a stalled network mount). Only over Python's own handler: an ignored SIGINT (a
    background job) stays ignored, a caller's handler is its own."""

    def __enter__(self) -> _HeldInterrupt:
        self.received = False
        self.held = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if self.held:
            signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        if self.received:  # a second Ctrl-C: an import that hangs (a stalled network mount)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.held = False
            raise KeyboardInterrupt
        self.received = True

    def __exit__(self, kind, value, traceback) -> None:
        if self.held:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.received and kind is None:
            raise KeyboardInterrupt


def _run(module, args: argparse.Namespace) -> int:
    """The subcommand's run(args), its expected errors one line each (the module docstring)."""
    try:
        code = int(module.run(args) or 0)
        if sys.stdout is not None:  # None: stdout closed (`>&-`)
            sys.stdout.flush()  # here, not at exit: a reader gone (`| head`) is BrokenPipeError
        return code
    except BrokenPipeError as exc:
        # stdout's reader (or an output pipe's) left before the command was done: a Unix tool
        # dies of SIGPIPE there, quietly, and its shell says 128 + 13
        log.to_devnull(sys.stdout)
        if log.debug():
            logger.error(f"scalestudy {_command(args)}: {exc}", exc_info=True)
        return SIGPIPE_EXIT
    except Preempted:
        raise
    except ScalestudyError as exc:
        log.expected_error(logger, f"scalestudy {_command(args)}: {exc}", exc.scope)
        return 2
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave: a bug, with its traceback
            raise
        # a path that cannot be read or written (a directory where a file goes, a file where a
        # directory goes, no permission, a full disk): the path and the cause say what to fix
        # an atomic write's rename names its temporary file first: the target is the second
        where = exc.filename if exc.filename2 is None else exc.filename2
        log.expected_error(logger, f"scalestudy {_command(args)}: {where}: {exc.strerror}")
        return 2


def _arguments(args: argparse.Namespace) -> list[str]:
    """The command's own string arguments (paths among them), not the trainer's flags."""
    found: list[str] = []
    for name, value in vars(args).items():
        values = value if isinstance(value, list) and name != "train_args" else [value]
        found += [v for v in values if isinstance(v, str) and v]
    return found


def _owns_stop(args: argparse.Namespace) -> bool:
    """The command handles the stop signals itself (OWN_STOP): train only with a checkpoint
    directory, which it stops at (without one nothing handled them: SIGTERM killed the rank
    on the spot, silently)."""
    if args.command == "train":
        return bool(getattr(args, "checkpoint_dir", None))
    return _command(args) in OWN_STOP


def _command(args: argparse.Namespace) -> str:
    """`profile parse`, `container build`: the action of a command with actions is named too."""
    return " ".join(filter(None, (args.command, getattr(args, "action", None))))


if __name__ == "__main__":
    raise SystemExit(main())
