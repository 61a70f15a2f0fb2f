"""The shell scripts' own logic: scripts/demo.sh's test for a call that runs no job, and
scripts/local-slurm.sh's edits of /etc/hosts, its subnet check and its argument check (the
functions, sourced: each script runs its main only when executed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_helpers import BIN, REPO, copy_repo, env, need, planned_jobs, write_config

DEMO = REPO / "scripts" / "demo.sh"
LOCAL_SLURM = REPO / "scripts" / "local-slurm.sh"


def bash(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script, "bash", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ["-n"],
        ["-np", "--config", "dataset=synthetic"],
        ["--dry-run"],
        ["--dag"],
        ["--rulegraph"],
        ["--summary"],
        ["-S"],
        ["-l"],
        ["--list-target-rules"],
        ["--lc", "code"],
        ["--version"],
        ["--lint"],
        ["--unlock"],
        # --cleanup-metadata's alias, and the calls that set up or clean conda envs, images
        # or a notebook draft and exit: the report was built after them, and failed
        ["--cm", "results/csv/runs.csv"],
        ["--conda-create-envs-only"],
        ["--conda-cleanup-envs"],
        ["--container-cleanup-images"],
        ["--draft-notebook", "plot"],
    ],
)
def test_the_demo_makes_no_report_after_a_call_that_runs_no_job(args):
    """After `--dag`, `--summary`, `-l`, `--version` the report failed on outputs never made
    (or "demo: done" was printed): only -n, --lint, --unlock and --list were known."""
    assert bash(f'source {DEMO}; runs_nothing "$@"', *args).returncode == 0, args


@pytest.mark.parametrize(
    "args",
    [[], ["--config", "dataset=synthetic"], ["-j2", "-p"], ["--cores", "2"], ["-F"], ["-k"]],
)
def test_the_demo_reports_after_a_call_that_runs_jobs(args):
    assert bash(f'source {DEMO}; runs_nothing "$@"', *args).returncode == 1, args


def snakemake_runs_nothing(arg: str) -> bool:
    """Whether snakemake's own parser reads `arg` as a call that runs no job."""
    from snakemake.cli import get_argument_parser

    try:
        ns = get_argument_parser().parse_args([arg])
    except SystemExit as exc:  # --help, --version
        assert exc.code == 0, arg
        return True
    return bool(ns.dryrun or ns.list_rules or ns.summary or ns.detailed_summary)


@pytest.mark.parametrize(
    "arg",
    # a short option that takes a value, its value attached (and holding n/l/S/D/h/v) ...
    ["-Rtrain", "-Ucollect", "-Rplot", "-eslurm", "-Panalyze", "-Olint", "-dlogs", "-pRplot"]
    # ... and no-value flags before a no-job one, whose value after it does not matter
    + ["-pn", "-Fl", "-kS", "-tD", "-fv", "-ah", "-nRtrain", "-pnUplot"],
)
def test_the_demo_reads_a_cluster_of_short_flags_as_snakemake_does(arg, capsys):
    """-Rtrain (--forcerun train), -eslurm, -Ucollect were taken for dry-runs (an n, l, S, D, h
    or v anywhere in the cluster): the demo trained, then skipped report.html and its line."""
    expected = snakemake_runs_nothing(arg)
    capsys.readouterr()  # the help or version text
    assert (bash(f'source {DEMO}; runs_nothing "$@"', arg).returncode == 0) == expected, arg


def test_the_demo_knows_snakemakes_short_options(capsys):
    """Every short option of snakemake's parser: one that takes a value, with a value of
    letters that are no-job flags of their own, runs jobs; a no-value flag followed by -n's
    letter is read as snakemake reads it (a flag the demo did not know would hide the -n)."""
    from snakemake.cli import get_argument_parser

    shorts = {
        opt: action.nargs != 0
        for action in get_argument_parser()._actions
        for opt in action.option_strings
        if len(opt) == 2
    }
    assert shorts["-R"] and shorts["-e"] and not shorts["-p"], shorts
    for opt, takes_value in shorts.items():
        arg = f"{opt}nlSDhv" if takes_value else f"{opt}n"
        expected = False if takes_value else snakemake_runs_nothing(arg)
        capsys.readouterr()
        assert (bash(f'source {DEMO}; runs_nothing "$@"', arg).returncode == 0) == expected, arg


def demo_snakemake_args(*args: str, cwd=None):
    """What snakemake's own parser makes of the command line demo.sh builds from `args` (its
    caller in `cwd`)."""
    from snakemake.cli import get_argument_parser

    proc = subprocess.run(
        ["bash", "-c", f'source {DEMO}; demo_args "$@"; printf "%s\\0" "${{DEMO_ARGS[@]}}"',
         "bash", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return get_argument_parser().parse_args(proc.stdout.split("\0")[:-1])


@pytest.mark.parametrize(
    ("args", "files", "targets"),
    [
        ([], [], set()),
        (["results/csv/runs.csv", "-n"], [], {"results/csv/runs.csv"}),
        (["-n", "--configfile", "more.yaml"], ["more.yaml"], set()),
        (["--configfile", "a.yaml", "b.yaml", "-n", "all"], ["a.yaml", "b.yaml"], {"all"}),
        (
            ["--configfiles=a.yaml", "plot", "--configfile=b.yaml", "--config", "repeats=1"],
            ["a.yaml", "b.yaml"],
            {"plot"},
        ),
    ],
)
def test_the_demo_layers_the_users_config_files_after_its_own(args, files, targets, tmp_path):
    """demo.sh ran `snakemake --configfile config/demo.yaml "$@"`: --configfile takes several
    values, so a target given first was read as a config file (FileNotFoundError), and a
    --configfile of the user's replaced config/demo.yaml (the demo became the paper's GPU
    study). Now the demo's file comes first, then the user's (where the caller is: demo.sh runs
    snakemake from the repository root), and targets stay targets."""
    parsed = demo_snakemake_args(*args, cwd=tmp_path)
    assert [str(f) for f in parsed.configfile] == [
        "config/demo.yaml",
        *(str(tmp_path / f) for f in files),
    ]
    assert set(parsed.targets) == targets
    assert parsed.dryrun == ("-n" in args)
    if "--config" in args:
        assert parsed.config == ["repeats=1"]


@pytest.mark.parametrize(
    "args",
    [
        ["-n", "--directory", "out"],
        ["--directory=out", "-n"],
        ["-d", "out", "--configfile", "a.yaml"],
        ["-dout"],
    ],
)
def test_the_demo_finds_the_callers_relative_paths_where_the_caller_is(args, tmp_path):
    """demo.sh changes to the repository root before snakemake runs: a relative --configfile
    (or --directory) of a caller elsewhere was looked up in the repository root. Now they are
    made absolute where the caller is, as snakemake run there reads them; absolute ones stay."""
    parsed = demo_snakemake_args(*args, cwd=tmp_path)
    assert parsed.directory == tmp_path / "out"
    theirs = [str(tmp_path / "a.yaml")] if "a.yaml" in args else []
    assert [str(f) for f in parsed.configfile] == ["config/demo.yaml", *theirs]
    parsed = demo_snakemake_args(
        "--directory", "/abs/out", "--configfile=/abs/a.yaml", cwd=tmp_path
    )
    assert str(parsed.directory) == "/abs/out"
    assert [str(f) for f in parsed.configfile] == ["config/demo.yaml", "/abs/a.yaml"]


def test_the_demo_with_a_target_and_a_config_file_plans_the_demo(tmp_path):
    """The real demo.sh (its set-up a no-op, this venv as .venv), dry-runs only: a target given
    first, and a --configfile of the user's layered over the demo's 6 runs."""
    work = copy_repo(tmp_path / "repo")
    shutil.copytree(REPO / "scripts", work / "scripts")
    (work / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    (work / ".venv").symlink_to(BIN.parent)
    write_config(work / "more-epochs.yaml", {"train": {"epochs": 4}})

    def demo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "scripts/demo.sh", *args], cwd=work, env=env(), capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip

    proc = demo("results/csv/runs.csv", "-n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = planned_jobs(proc)  # the target's jobs only: nothing after collect
    assert jobs["train"] == 6 and jobs["collect"] == 1 and "analyze" not in jobs, jobs
    proc = demo("-n", "--configfile", "more-epochs.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert planned_jobs(proc)["train"] == 6  # the demo's runs, not the paper study's 75
    assert "--epochs 4" in proc.stdout and "--epochs 3" not in proc.stdout
    # the same file where the user is, the script called by its path (a FileNotFoundError
    # traceback: the path was read in the repository root), in both forms of the option
    user = tmp_path / "user"
    user.mkdir()
    (work / "more-epochs.yaml").rename(user / "more-epochs.yaml")
    write_config(user / "more-width.yaml", {"train": {"width": 4}})
    for args in (
        ["-n", "--configfile", "more-epochs.yaml", "more-width.yaml"],
        ["-n", "--configfile=more-epochs.yaml", "--configfile=more-width.yaml"],
    ):
        proc = subprocess.run(
            ["bash", str(work / "scripts" / "demo.sh"), *args], cwd=user, env=env(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert planned_jobs(proc)["train"] == 6
        assert "--epochs 4" in proc.stdout and "--epochs 3" not in proc.stdout
        assert "--width 4" in proc.stdout and "--width 8" not in proc.stdout


# snakemake's stand-in for a demo that trains nothing: as snakemake, it changes to --directory
# (relative to where it starts, made if missing); a run writes reports/paper.pdf there, a
# --report call the report
SNAKEMAKE_STAND_IN = """#!/usr/bin/env bash
d=. report=
while (($#)); do
    case $1 in
        --directory | -d) d=$2; shift ;;
        --directory=*) d=${1#*=} ;;
        -d?*) d=${1#-d} ;;
        --report) report=$2; shift ;;
    esac
    shift
done
mkdir -p "$d" && cd "$d"
if [[ -n $report ]]; then
    echo html > "$report"
elif [[ -z ${STAND_IN_TARGETS_ONLY:-} ]]; then
    mkdir -p reports results/plots && echo pdf > reports/paper.pdf && echo md > reports/study.md
fi
"""


def demo_with_stand_ins(work: Path, **bins: str) -> Path:
    """demo.sh in `work` with its set-up a no-op and the given stand-ins (name -> script) as
    the venv's programs; returns `work`."""
    shutil.copytree(REPO / "scripts", work / "scripts")
    (work / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in bins.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return work


@pytest.mark.parametrize("where", ["root", "elsewhere"])
@pytest.mark.parametrize("form", [["--directory", "{D}"], ["--directory={D}"], ["-d{D}"], []])
def test_the_demo_ends_with_the_files_where_snakemake_wrote_them(tmp_path, where, form):
    """With --directory D (the Snakefile's "the demo with its outputs in D") the last line
    looked for reports/paper.pdf in the repository root: it said latexmk was missing, or that
    no target asked for the PDF, of a study whose PDF was in D. Now it checks and names D's
    files; without --directory, the repository root's, as before."""
    work = demo_with_stand_ins(tmp_path / "repo", snakemake=SNAKEMAKE_STAND_IN)
    caller = work if where == "root" else tmp_path / "user"
    caller.mkdir(exist_ok=True)
    # an absolute D from the root, a relative one (the caller's) from elsewhere
    d = str(tmp_path / "study") if where == "root" else "study"
    out = (caller / d) if form else work
    proc = subprocess.run(
        ["bash", str(work / "scripts" / "demo.sh"), *(a.format(D=d) for a in form)],
        cwd=caller, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out / "reports" / "paper.pdf").is_file() and (out / "report.html").is_file()
    shown = f"{out}/" if form else ""
    assert proc.stdout.splitlines()[-1] == (
        f"demo: done: {shown}reports/study.md, {shown}reports/paper.pdf, {shown}report.html, "
        f"{shown}results/plots/"
    )


def test_the_demos_last_line_names_only_what_is_there(tmp_path):
    """Targets that make part of the study: the last line listed reports/study.md and
    results/plots/ that no call had written."""
    work = demo_with_stand_ins(
        tmp_path / "repo", snakemake=SNAKEMAKE_STAND_IN, latexmk="#!/bin/sh\n"
    )
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "results/matrix/runs.tsv"], cwd=work,
        env=env(STAND_IN_TARGETS_ONLY="1"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == (
        "demo: done: report.html; reports/paper.pdf was not asked for by these targets"
    )


def test_the_demos_last_line_names_a_tex_without_the_papers_packages(tmp_path):
    """latexmk installed alone (no booktabs): the workflow builds no PDF, and the last line said
    "reports/paper.pdf was not asked for by these targets"; its install line said sudo to root
    (no sudo on a fresh image) and did no apt-get update (empty lists there)."""
    work = demo_with_stand_ins(
        tmp_path / "repo", snakemake=SNAKEMAKE_STAND_IN, latexmk="#!/bin/sh\n",
        kpsewhich="#!/bin/sh\nexit 1\n",
    )  # fmt: skip
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "results/matrix/runs.tsv"], cwd=work,
        env=env(STAND_IN_TARGETS_ONLY="1"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert "without reports/paper.pdf (TeX lacks a package the paper loads)" in last, last
    sudo = "" if os.getuid() == 0 else "sudo "
    assert f"`{sudo}apt-get update && {sudo}apt-get install --no-install-recommends" in last


def test_the_report_call_after_targets_behind_a_double_dash_makes_the_report(tmp_path):
    """`--config dataset=synthetic -- TARGET`: the report call appended --report report.html
    after the user's `--`, where snakemake reads it as two more targets (MissingRuleException:
    No rule to produce --report)."""
    from snakemake.cli import get_argument_parser

    calls = tmp_path / "calls"  # each call's arguments, NUL-separated, one line per call
    recorder = f'#!/bin/sh\nprintf "%s\\0" "$@" >> {calls}\necho >> {calls}\n'
    work = demo_with_stand_ins(tmp_path / "repo", snakemake=recorder)
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "--config", "dataset=synthetic", "--", "reports/study.md"],
        cwd=work, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run, report = (line.split("\0")[:-1] for line in calls.read_text().splitlines())
    for argv in (run, report):
        parsed = get_argument_parser().parse_args(argv)
        assert parsed.targets == ["reports/study.md"] and parsed.config == ["dataset=synthetic"]
    assert str(get_argument_parser().parse_args(report).report) == "report.html"


@pytest.mark.parametrize(
    "partial",
    [["--until", "prepare_data"], ["-U", "train"], ["-npU", "train"], ["--batch=all=1/2"]],
)
def test_a_demo_of_part_of_the_study_makes_no_report_of_the_whole(tmp_path, partial):
    """`bash scripts/demo.sh --until prepare_data` (README: extra arguments go to snakemake):
    snakemake --report ignores --until and reports the whole study, and failed on files the
    run never made ("results/tables/verdicts.html marked for report but does not exist"), so
    a demo that did what it was asked ended with exit 1."""
    calls = tmp_path / "calls"
    recorder = f'#!/bin/sh\nprintf "%s\\0" "$@" >> {calls}\necho >> {calls}\n'
    work = demo_with_stand_ins(tmp_path / "repo", snakemake=recorder)
    (work / "report.html").write_text("an earlier demo's\n")  # not this one's to name
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "--config", "dataset=synthetic", *partial],
        cwd=work, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    argvs = [line.split("\0")[:-1] for line in calls.read_text().splitlines()]
    assert not any("--report" in argv for argv in argvs), argvs
    if "n" not in partial[0]:  # a dry-run says nothing at the end, as before
        last = proc.stdout.splitlines()[-1]
        assert last.startswith("demo: done") and "no report.html" in last, last
        assert "report.html," not in last and not last.startswith("demo: done: report"), last


@pytest.mark.parametrize("targets", [["results/matrix/runs.tsv"], ["plot", "analyze"]])
def test_targets_after_a_double_dash_stay_targets_with_the_demos_config(targets, tmp_path):
    """`--config dataset=synthetic -- TARGET` (--config takes several values): the demo's
    --configfile went after the `--` and was read as targets ("No rule to produce
    --configfile")."""
    parsed = demo_snakemake_args(
        "--config", "dataset=synthetic", "--configfile", "more.yaml", "--", *targets, cwd=tmp_path
    )
    assert [str(f) for f in parsed.configfile] == ["config/demo.yaml", str(tmp_path / "more.yaml")]
    assert parsed.config == ["dataset=synthetic"]
    assert parsed.targets == targets


def test_local_slurm_adds_its_hosts_lines_after_a_last_line_without_newline(tmp_path):
    """`start` glued its line to a last line without a newline (node1 then resolved to the other
    host's address), and `stop` removed that host's entry with it. /etc/hosts here is a copy,
    bind-mounted in a private mount namespace."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        need("root and unshare (a private /etc/hosts)", "run the tests as root (CI does)")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.5 fileserver")
    script = f"""
        mount --bind {hosts} /etc/hosts
        source {LOCAL_SLURM}
        hosts_add "10.77.77.2 node1"
        cp /etc/hosts {tmp_path}/after-start
        hosts_remove
        cp /etc/hosts {tmp_path}/after-stop
    """
    done = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    started = (tmp_path / "after-start").read_text().splitlines()
    assert started[:2] == ["127.0.0.1 localhost", "10.0.0.5 fileserver"]
    assert started[2].startswith("10.77.77.2 node1 ")
    assert (tmp_path / "after-stop").read_text().splitlines() == started[:2]


def test_local_slurm_sees_its_subnet_in_use_among_many_addresses():
    """`ip ... | grep -v | grep -q` under pipefail: with ~40 addresses grep -q ended the
    pipeline early, grep -v died of SIGPIPE, and the subnet in use counted as free about half
    the time. `ip` is a shell function here that lists 400 addresses, one in 10.77.77.0/24."""
    script = f"""
        source {LOCAL_SLURM}
        ip() {{
            if [[ "$*" == "-o -4 addr show" ]]; then
                for i in $(seq 1 400); do
                    echo "$i: eth$i    inet 192.168.$((i % 250)).$((i % 200 + 1))/24 scope global"
                done
                echo "401: eth1    inet 10.77.77.5/24 brd 10.77.77.255 scope global eth1"
            else
                echo "ip $*" >&2
            fi
        }}
        net_up 2
    """
    for _ in range(20):
        done = bash(script)
        assert done.returncode != 0 and "already used on this machine" in done.stderr
        assert "ip link add" not in done.stderr


def test_local_slurm_restart_refuses_a_bad_node_count_before_stopping():
    """`restart --nodes 3` stopped the running cluster, then refused the node count."""
    script = f"""
        source {LOCAL_SLURM}
        cmd_stop() {{ echo STOPPED; }}
        cmd_start() {{ echo STARTED; }}
        main restart --nodes 3
    """
    done = bash(script)
    assert done.returncode != 0 and "--nodes must be 1 or 2 (got 3)" in done.stderr
    assert "STOPPED" not in done.stdout


def test_setup_installs_the_venv_package_of_the_python_it_was_given(tmp_path):
    """PYTHON=python3.11 (setup's own advice for an old system Python) without ensurepip:
    setup installed python3-venv, the system python3's, then `venv` failed all the same
    (Ubuntu 22.04: python3 is 3.10, python3.11 needs python3.11-venv). It installs the
    package of the Python it was given. STAND-INS: id (root), apt-get (logs its call), a
    latexmk and a kpsewhich that find TeX, a python3.11 without ensurepip and a python3 (the
    default), each answering setup's version query with a version of its own."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", work / "scripts" / "setup.sh")
    shutil.copy(REPO / "requirements.txt", work / "requirements.txt")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    stand_ins = {
        "id": "#!/bin/sh\necho 0\n",
        "apt-get": f'#!/bin/sh\necho "apt-get $*" >> {log}\n',
        "latexmk": "#!/bin/sh\n",
        "kpsewhich": "#!/bin/sh\necho pgfcore.sty\n",
        # a Python (its version checks pass) whose ensurepip is a separate package, not
        # installed; its minor version, as setup asks it, is one no other python3 has (3.99),
        # and the default python3's is 3.10: the package names which one setup asked
        "python3.11": (
            "#!/bin/sh\n"
            'case "$*" in\n'
            '  "-c import ensurepip") exit 1 ;;\n'
            "  *'version_info[:2]'*) echo 3.99 ;;\n"
            '  "-m venv --clear .venv") echo "ensurepip is not available" >&2; exit 1 ;;\n'
            f'  *) exec {sys.executable} "$@" ;;\n'
            "esac\n"
        ),
        "python3": (
            "#!/bin/sh\n"
            'case "$*" in\n'
            "  *'version_info[:2]'*) echo 3.10 ;;\n"
            f'  *) exec {sys.executable} "$@" ;;\n'
            "esac\n"
        ),
    }
    for name, text in stand_ins.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    proc = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=work, capture_output=True, text=True, timeout=60,
        env={**env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": "python3.11",
             "SCALESTUDY_SKIP_SLURM_APT": "1"},
    )  # fmt: skip
    assert proc.returncode != 0  # the stand-in's venv fails: only the package asked is judged
    assert log.read_text().splitlines()[-1].endswith("install -y -q python3.99-venv"), (
        log.read_text()
    )


def test_lint_without_its_tools_says_to_run_setup(tmp_path):
    """scripts/lint.sh in a fresh clone before setup (no .venv): bash's `ruff: command not
    found` (exit 127), where test.sh and demo.sh set up first. One line names the fix."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "lint.sh", work / "scripts" / "lint.sh")
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare["PATH"] = "/usr/bin:/bin"  # no venv: Debian's python3, no ruff
    assert shutil.which("ruff", path=bare["PATH"]) is None
    done = subprocess.run(
        ["bash", "scripts/lint.sh"], cwd=work, env=bare, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert done.stderr.strip().splitlines() == [
        "lint: ruff is not installed here (no .venv): run `bash scripts/setup.sh` first"
    ]


def test_the_test_scripts_paths_are_the_callers(tmp_path):
    """`bash ../scripts/test.sh test_plan.py -k runtime` in tests/: test.sh changes to the
    repository root, and pytest found no test_plan.py there (exit 4). A path of the caller's
    (a node id too) is read from their directory; options and their values are left alone."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    (work / "tests").mkdir()
    (work / "tests" / "test_plan.py").write_text("")
    shutil.copy(REPO / "scripts" / "test.sh", work / "scripts" / "test.sh")
    (work / "scripts" / "setup.sh").write_text("exit 0\n")  # set up already
    seen = tmp_path / "argv"
    python = work / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$PWD" "$@" >> {seen}\nexit 5\n')
    python.chmod(0o755)
    (work / "tests" / "slurm").mkdir()  # a directory named as a marker is
    proc = subprocess.run(
        ["bash", "../scripts/test.sh", "test_plan.py::test_x", "-k", "slurm", "slurm"],
        cwd=work / "tests", env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr  # both passes selected nothing (the stand-in)
    lines = seen.read_text().splitlines()
    assert lines[0] == str(work)  # pytest runs in the repository root
    assert f"{work}/tests/test_plan.py::test_x" in lines, lines
    assert "test_plan.py::test_x" not in lines, lines
    # -k's value stays a word; the directory after it is the caller's
    assert lines[lines.index("-k") + 1] == "slurm" and f"{work}/tests/slurm" in lines, lines
    # a marker named as a directory of the root stays a marker: -m becomes each pass's own
    seen.unlink()
    (work / "workflow").mkdir()
    proc = subprocess.run(["bash", "scripts/test.sh", "-m", "workflow"], cwd=work, env=env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    marks = [ln for ln in seen.read_text().splitlines() if "workflow" in ln]
    assert marks == ["(workflow) and not serial", "(workflow) and serial"], marks
