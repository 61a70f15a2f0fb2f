"""benchmarks/compare.py: the side-by-side order, the statistics, and one real tiny comparison
(the measurements themselves live in docs/benchmarks.md, never in a test)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, child_env
from workflow_helpers import process_state, sighup_as_in_a_terminal, sigint_as_in_a_terminal


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = load_benchmark("compare")


def test_runs_are_interleaved_abba():
    assert compare.order(3) == ["ours", "reference", "reference", "ours", "ours", "reference"]
    assert compare.order(1) == ["ours", "reference"]


def test_medians_spreads_and_ratios():
    got = compare.compare([110.0, 100.0, 130.0], [100.0, 90.0, 100.0])
    assert got["ours"]["median"] == 110.0 and got["reference"]["median"] == 100.0
    assert got["ours"]["spread"] == pytest.approx(30 / 110)
    assert got["ratio"] == pytest.approx(1.1)
    assert got["paired_ratio_min"] == pytest.approx(1.1)  # 110/100
    assert got["paired_ratio_max"] == pytest.approx(1.3)  # 130/100
    assert compare.summary([110.0, 100.0])["spread"] is None  # 2 runs: no spread


def test_both_trainers_get_the_same_workload():
    args = compare.parse_args(
        ["--data-dir", "d", "--width", "8", "--local-batch", "16", "--ours-flags", "--compile on"]
    )
    cmds = compare.commands(args, REPO / "o", REPO / "r.json")
    for flag, value in (("--width", "8"), ("--local-batch", "16"), ("--precision", "fp32")):
        for cmd in cmds.values():
            assert cmd[cmd.index(flag) + 1] == value
    assert cmds["ours"][-2:] == ["--compile", "on"] and "--compile" not in cmds["reference"]


@pytest.mark.parametrize(
    "flags, named, instead",
    [
        ("--precision bf16", "--precision", "use compare.py's --precision"),
        ("--compile on --local-b=128", "--local-batch", "use compare.py's --local-batch"),
        ("--global-batch 64", "--global-batch", "it overrides the local batch: use --local-batch"),
        ("--out elsewhere", "--out", "compare.py gives each run its own"),
        (
            "--accum-steps 4",
            "--accum-steps",
            "the reference steps the optimizer every batch: its global batch is --local-batch x "
            "--nproc",
        ),
        (
            "--device cpu",
            "--device",
            "the reference runs on CUDA where there is one; CUDA_VISIBLE_DEVICES= runs both on "
            "the CPU",
        ),
    ],
)
def test_ours_flags_may_not_change_what_both_trainers_run(capsys, flags, named, instead):
    """argparse keeps a flag's last value: --ours-flags naming a flag compare.py gives both
    trainers would have ours run another workload than the reference, while the result JSON
    reports compare.py's value. Refused in one line that names the flag (abbreviated too).
    --device too: the reference has none (CUDA where there is one), so on a GPU node
    `--ours-flags="--device cpu"` compared our CPU run with the reference's GPU run, the JSON
    saying device cpu."""
    with pytest.raises(SystemExit) as exit_:
        compare.parse_args(["--data-dir", "d", "--local-batch", "512", f"--ours-flags={flags}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines() == [err.strip()], err
    assert f"may not set {named} ({instead})" in err, err


@pytest.mark.parametrize(
    "script, flag, least",
    [
        *(("compare", f, 1) for f in ("--nproc", "--threads-per-rank")),
        ("compare", "--ref-workers", 0),
        *(("reference_train", f, 1) for f in ("--local-batch", "--epochs", "--width")),
        *(("reference_train", f, 0) for f in ("--num-workers", "--warmup-steps", "--limit-train")),
        *(("ddp_buffers", f, 1) for f in ("--nproc", "--width", "--batch", "--steps", "--repeats")),
        *(("winograd", f, 1) for f in ("--width", "--batch", "--threads", "--repeats")),
        *(("whole_step_graph", f, 1) for f in ("--local-batch", "--width", "--steps")),
        *(("whole_step_graph", f, 0) for f in ("--warmup", "--check")),
        ("checkpoint_stall", "--repeats", 1),
    ],
)
def test_benchmark_counts_out_of_range_are_refused_in_one_line(
    capsys, data_dir, script, flag, least
):
    """One below the least value is refused by the script's parser in one line; it was a
    traceback after some work (the reference's first run after all of ours, a StatisticsError
    in every rank, whole_step_graph.py --steps 0 a ZeroDivisionError in each variant's process)
    or, for winograd.py --repeats 0, inf and nan and exit 0. The least is accepted."""
    required = {"compare": ["--data-dir", "d"], "whole_step_graph": ["--variants", "eager"]}
    required["reference_train"] = ["--data-dir", str(data_dir), "--dataset", "synthetic"]
    required["reference_train"] += ["--out", "r.json"]
    required["checkpoint_stall"] = ["--device", "cpu"]
    module = load_benchmark(script)
    parse_args = getattr(module, "parse_args", None) or module.parse
    with pytest.raises(SystemExit) as exit_:
        parse_args([*required.get(script, []), flag, str(least - 1)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines() == [err.strip()], err
    assert err.startswith(f"{script}.py: error: {flag} must be >= {least}, got {least - 1};")
    args = parse_args([*required.get(script, []), flag, str(least)])
    assert getattr(args, flag[2:].replace("-", "_")) == least


def bad_arguments(tmp_path: Path) -> list[tuple[str, list[str], str]]:
    """(script, its arguments, what its one line says) for arguments the scripts refuse."""
    import torch

    (tmp_path / "file").write_text("")
    cases = [
        ("checkpoint_stall", ["--dir", str(tmp_path / "missing")], "does not exist: create it"),
        ("checkpoint_stall", ["--dir", str(tmp_path / "file")], "is not a directory"),
        ("reference_train", ["--data-dir", str(tmp_path), "--out", "r.json"], "prepare-data"),
        ("whole_step_graph", ["--timeout", "0"], "--timeout must be > 0, got 0.0"),
        ("reference_train", ["--data-dir", "d", "--out", "r.json", "--lr", "-1"], "--lr must"),
        (
            "reference_train",
            ["--data-dir", "d", "--out", "r.json", "--weight-decay", "nan"],
            "--weight-decay must be a number >= 0, got nan",
        ),
        ("whole_step_graph", ["--bucket-cap-mb", "nan"], "--bucket-cap-mb must be > 0"),
    ]
    gpus = torch.cuda.device_count()
    nproc = ["--device", "cuda", "--nproc", str(gpus + 1)]
    cases.append(("ddp_buffers", nproc, f"{gpus} CUDA devices here"))
    if not torch.cuda.is_available():
        cases.append(("checkpoint_stall", ["--device", "cuda"], "no CUDA device here"))
    return cases


@pytest.mark.parametrize("case", range(9))
def test_benchmark_bad_arguments_are_refused_in_one_line(tmp_path, capsys, monkeypatch, case):
    """A missing or non-directory --dir (checkpoint_stall.py: tempfile's traceback after the
    model was built), --device cuda without the GPUs (checkpoint_stall.py, ddp_buffers.py:
    torch's traceback, in every rank), a --data-dir without the prepared data (the reference:
    torch.load's traceback in every rank), a --timeout or --bucket-cap-mb of 0 or nan (each
    graph variant failed): one line from the script's parser, exit 2, before any work."""
    cases = bad_arguments(tmp_path)
    if case >= len(cases):
        pytest.skip("a CUDA device is here: --device cuda is accepted")
    script, argv, says = cases[case]
    module = load_benchmark(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])  # checkpoint_stall's main reads it
    with pytest.raises(SystemExit) as exit_:
        if script == "checkpoint_stall":  # the whole script (it is quick to refuse)
            module.main()
        else:
            (getattr(module, "parse_args", None) or module.parse)(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines() == [err.strip()], err
    assert err.startswith(f"{script}.py: error: ") and says in err, err


def test_the_graph_benchmark_without_cuda_says_so_in_one_line(capsys):
    """whole_step_graph.py measures CUDA graphs over NCCL: on a host without CUDA each variant's
    process failed with a traceback (twice for the whole-* variants). Now one line, exit 2."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    graphs = load_benchmark("whole_step_graph")
    assert graphs.main(["--variants", "eager,whole-eager", "--timeout", "60"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [captured.err.strip()]
    assert captured.err.startswith("whole_step_graph.py: needs a CUDA GPU"), captured.err


class FakeRuns:
    """compare.py's `subprocess` with a `Popen` that writes what each trainer writes (the keys
    compare.py reads; ours N img/s in its run N, the reference half of it), or exits `fail[i]`
    in the i-th run of the session instead: a real process that exits so."""

    TimeoutExpired = subprocess.TimeoutExpired

    def __init__(self, fail: dict[int, int] | None = None):
        self.fail, self.calls = fail or {}, []

    def Popen(self, cmd, **kwargs):  # noqa: N802 (subprocess's name)
        self.calls.append(cmd)
        rc = self.fail.get(len(self.calls) - 1, 0)
        out = Path(cmd[cmd.index("--out") + 1])
        n = len(self.calls)
        if rc == 0 and "reference_train.py" in " ".join(cmd):
            out.write_text(json.dumps({"throughput_img_s": n / 2, "final_train_loss": 2.3}))
        elif rc == 0:
            out.mkdir(parents=True)
            metrics = {"throughput_img_s": float(n), "device": {"name": "cpu", "type": "cpu"}}
            metrics |= {"compiled": False, "flops_per_img": 1, "mfu": None, "best_val_acc": 0.1}
            metrics |= {"mfu_unmeasured": "cpu: no peak", "model_flops_per_s": float(n)}
            (out / "metrics.json").write_text(json.dumps(metrics | {"torch_version": "t"}))
        return subprocess.Popen(["sh", "-c", f"exit {rc}"], **kwargs)


def test_compare_refuses_an_unwritable_json_before_the_first_run(
    data_dir, tmp_path, monkeypatch, capsys
):
    runs = FakeRuns()
    monkeypatch.setattr(compare, "subprocess", runs)
    (tmp_path / "file").write_text("")
    json_path = tmp_path / "file" / "compare.json"  # its directory is a file
    with pytest.raises(SystemExit) as exit_:
        compare.main(
            ["--data-dir", str(data_dir), "--dataset", "synthetic", "--json", str(json_path)]
        )
    assert exit_.value.code == 2 and runs.calls == []
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--json" in err and "is a file" in err, err


def test_step_anatomy_and_the_graph_benchmark_refuse_an_unwritable_json_first(
    tmp_path, monkeypatch, capsys
):
    """Their --json is checked before the training (the variants), not after it."""
    anatomy, graphs = load_benchmark("step_anatomy"), load_benchmark("whole_step_graph")
    started = []  # trainings and variants started
    monkeypatch.setattr(anatomy.trainer, "main", lambda cfg: started.append(cfg) or 1)
    variant = types.SimpleNamespace(
        run=lambda cmd, **kw: started.append(cmd) or subprocess.CompletedProcess(cmd, 1, "", ""),
        TimeoutExpired=subprocess.TimeoutExpired,
    )
    monkeypatch.setattr(graphs, "subprocess", variant)
    (tmp_path / "file").write_text("")
    json_path = str(tmp_path / "file" / "out.json")  # its directory is a file
    for main in (
        lambda: anatomy.main(["--json", json_path, "--", "--out", str(tmp_path / "run")]),
        lambda: graphs.main(["--json", json_path, "--variants", "eager"]),
    ):
        with pytest.raises(SystemExit) as exit_:
            main()
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "is a file" in err, err
    assert started == []


@pytest.mark.parametrize(
    "flags, unknown",
    [
        (["--variants", "eager,compiled-graph"], "'compiled-graph'"),  # compiled-graphs
        (["--variants", "whole_compiled"], "'whole_compiled'"),  # ran whole-eager
        (["--variants", "eager,"], "''"),
        (["--variant", "whole-compile"], "'whole-compile'"),  # main's, per process
    ],
)
def test_the_graph_benchmark_refuses_an_unknown_variant(capsys, flags, unknown):
    """A misspelt variant ran the eager step (the whole-eager one for whole*) under its own
    label: refused in one line naming it and the variants, before any variant runs."""
    graphs = load_benchmark("whole_step_graph")
    with pytest.raises(SystemExit) as exit_:
        graphs.parse(flags)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines() == [err.strip()], err
    assert f"unknown variant(s) {unknown}:" in err and ",".join(graphs.VARIANTS) in err, err
    for variant in graphs.VARIANTS:  # each known one is accepted, alone and as --variant
        assert graphs.parse(["--variants", variant, "--variant", variant]).variant == variant


WRITE_FAILS = """
import importlib.util, resource, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from test_benchmarks import FakeRuns, compare
compare.subprocess = FakeRuns()
table = compare.print_table
def table_then_a_full_disk(*a):  # the --json write that follows fails after 1 KiB
    table(*a)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))
compare.print_table = table_then_a_full_disk
argv = ["--data-dir", sys.argv[2], "--dataset", "synthetic", "--repeats", "3"]
sys.exit(compare.main([*argv, "--json", sys.argv[3]]))
"""


@pytest.mark.parametrize("repeats", [1, 2])
def test_fewer_than_three_repeats_are_a_smoke_test_without_a_spread(
    data_dir, tmp_path, monkeypatch, capsys, repeats
):
    """--repeats 1 or 2 ran and reported a "median and spread": of 2 runs the spread is their
    difference, of 1 it is 0.0% (printed as if the runs agreed). Now refused in one line before
    any run unless --smoke; with --smoke the spread is null in --json and the table says "no
    spread" with the repeats, instead of a number."""
    runs = FakeRuns()
    monkeypatch.setattr(compare, "subprocess", runs)
    argv = ["--data-dir", str(data_dir), "--dataset", "synthetic", "--repeats", str(repeats)]
    with pytest.raises(SystemExit) as exit_:
        compare.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and runs.calls == [] and err.splitlines() == [err.strip()], err
    assert f"--repeats {repeats}: a median and spread need >= 3 runs" in err and "--smoke" in err
    out = tmp_path / "compare.json"
    assert compare.main([*argv, "--smoke", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["ours"]["spread"] is None and r["reference"]["spread"] is None and r["smoke"] is True
    assert len(r["ours"]["runs"]) == repeats and r["ratio"] is not None
    table = capsys.readouterr().out
    assert f"no spread: {repeats} repeats (--smoke); a spread needs >= 3 runs" in table, table
    assert "%" not in table.split("median img/s")[1].split("ratio")[0], table


def test_a_failed_json_write_keeps_the_previous_file(data_dir, tmp_path):
    """--json is written atomically: a write that fails part way (a file-size limit, as a full
    disk) leaves the previous result as it was, and says so in one line."""
    path = tmp_path / "compare.json"
    previous = json.dumps({"previous": "result", "pad": "x" * 900}) + "\n"
    path.write_text(previous)
    argv = [PYTHON, "-c", WRITE_FAILS, str(REPO), str(data_dir), str(path)]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert path.read_text() == previous
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and str(path) in proc.stderr
    assert "ratio" in proc.stdout  # the results are the printed table


@pytest.mark.parametrize("fail", [3, 0])
def test_a_failed_run_keeps_the_runs_that_finished(data_dir, tmp_path, monkeypatch, capsys, fail):
    """A run that fails (here the last of 2 x 2, or the first) ends the comparison in one line
    naming it and its exit code; the runs that finished are in --json, marked partial."""
    runs = FakeRuns(fail={fail: 3})
    monkeypatch.setattr(compare, "subprocess", runs)
    out = tmp_path / "compare.json"
    argv = ["--data-dir", str(data_dir), "--dataset", "synthetic", "--repeats", "2", "--smoke"]
    assert compare.main([*argv, "--json", str(out)]) == 1
    assert len(runs.calls) == fail + 1  # no run after the failed one
    err = capsys.readouterr().err
    failed = "ours run 2/2" if fail == 3 else "ours run 1/2"
    assert err.splitlines() == [err.strip()] and f"{failed} failed (exit code 3)" in err, err
    r = json.loads(out.read_text())
    assert r["partial"] is True and r["failed_run"] == failed and r["failed_exit_code"] == 3
    if fail == 3:  # ours 1 img/s in the 1st run, the reference 1 and 1.5 in the 2nd and 3rd
        assert r["ours"]["runs"] == [1.0] and r["reference"]["runs"] == [1.0, 1.5]
        assert r["ratio"] == pytest.approx(1 / 1.25) and r["paired_ratio_min"] == 1.0
    else:
        assert r["ours"] is None and r["reference"] is None and r["ratio"] is None


STOPPED = """
import subprocess, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from test_benchmarks import FakeRuns, compare
runs = FakeRuns()
finished = runs.Popen
def popen(cmd, **kwargs):  # the 4th run goes on until a signal stops it
    if len(runs.calls) < 3:
        return finished(cmd, **kwargs)
    runs.calls.append(cmd)
    print("RUNNING", flush=True)
    return subprocess.Popen(["sleep", "60"], **kwargs)
compare.subprocess = type("Runs", (FakeRuns,), {"Popen": staticmethod(popen)})
argv = ["--data-dir", sys.argv[2], "--dataset", "synthetic", "--repeats", "2", "--smoke"]
compare.exit_with(compare.main([*argv, "--json", sys.argv[3]]))
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stopped_comparison_keeps_the_runs_that_finished(data_dir, tmp_path, signal_name):
    """Ctrl-C (SIGINT) or a time limit (SIGTERM: `timeout`, Slurm) to the process group during
    a run: the runs that had finished were lost (a KeyboardInterrupt traceback, or no output at
    all under SIGTERM) and --json was not written. Now it is written with them, marked partial,
    and one line says which run was stopped; then compare.py dies of the signal, so that a
    shell running it (gpu_node.sh's steps) stops too instead of starting the next step."""
    import os
    import signal

    out = tmp_path / "compare.json"
    script = [PYTHON, "-c", STOPPED, str(REPO), str(data_dir), str(out)]
    proc = subprocess.Popen(
        ["bash", "-c", '"$@"; echo "NEXT $?"', "bash", *script], env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )  # fmt: skip
    try:
        for line in proc.stdout:  # the 4th run is under way
            if line.strip() == "RUNNING":
                break
        os.killpg(proc.pid, getattr(signal, signal_name))  # as a terminal's Ctrl-C, or timeout
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "NEXT" not in stdout, stdout  # the shell stopped with it
    assert stderr.splitlines() == [stderr.strip()], stderr
    assert f"ours run 2/2 stopped by {signal_name}; 3 runs had finished" in stderr
    r = json.loads(out.read_text())
    assert r["partial"] is True and r["failed_run"] == "ours run 2/2"
    assert r["failed_exit_code"] == 128 + getattr(signal, signal_name)
    assert r["ours"]["runs"] == [1.0] and r["reference"]["runs"] == [1.0, 1.5]


BETWEEN_RUNS = """
import os, signal, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from test_benchmarks import FakeRuns, compare
runs = compare.subprocess = FakeRuns()
class Stdout:  # the signal lands as compare.py announces the 4th run: the 3rd over, no run
    def __init__(self, out):
        self.out = out
    def write(self, text):
        written = self.out.write(text)
        if text.startswith("--- ours (2/2)"):
            os.kill(os.getpid(), getattr(signal, sys.argv[4]))  # handled on return, here
        return written
    def flush(self):
        self.out.flush()
sys.stdout = Stdout(sys.stdout)
argv = ["--data-dir", sys.argv[2], "--dataset", "synthetic", "--repeats", "2", "--smoke"]
code = compare.main([*argv, "--json", sys.argv[3]])
print("RUNS STARTED", len(runs.calls), flush=True)
compare.exit_with(code)
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_between_two_runs_keeps_the_runs_that_finished(
    data_dir, tmp_path, signal_name
):
    """Ctrl-C or SIGTERM while no run was going on (after one run, before the next started)
    was raised outside the runs' handling: a traceback (KeyboardInterrupt, compare.Stopped),
    exit 1 under SIGTERM, and no --json of the runs that had finished. Now it ends the
    comparison as a stop during a run does: the next run never starts, the finished ones are
    written (partial), one line says so, and compare.py dies of the signal."""
    import signal

    out = tmp_path / "compare.json"
    proc = _stopped_compare(BETWEEN_RUNS, data_dir, out, signal_name)
    assert f"ours run 2/2 stopped by {signal_name}; 3 runs had finished" in proc.stderr
    assert "RUNS STARTED 3" in proc.stdout, proc.stdout  # not the 4th
    r = json.loads(out.read_text())
    assert r["partial"] is True and r["failed_run"] == "ours run 2/2"
    assert r["failed_exit_code"] == 128 + getattr(signal, signal_name)
    assert r["ours"]["runs"] == [1.0] and r["reference"]["runs"] == [1.0, 1.5]


def _stopped_compare(script: str, data_dir, out, signal_name: str):
    """compare.py run by `script` (BETWEEN_RUNS, AFTER_RUNS), which sends itself `signal_name`:
    it died of that signal, its stderr one line (no traceback); the finished process."""
    import signal

    argv = [PYTHON, "-c", script, str(REPO), str(data_dir), str(out), signal_name]
    proc = subprocess.run(
        argv, env=child_env(), capture_output=True, text=True, timeout=120,
        preexec_fn=sigint_as_in_a_terminal,
    )  # fmt: skip
    assert proc.returncode == -getattr(signal, signal_name), proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr  # no traceback
    return proc


AFTER_RUNS = BETWEEN_RUNS.replace(
    'text.startswith("--- ours (2/2)")', '"median img/s" in text'
).replace("announces the 4th run: the 3rd over, no run", "prints its table: the runs over")


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_after_the_last_run_writes_the_comparison(data_dir, tmp_path, signal_name):
    """Ctrl-C or SIGTERM in the milliseconds after the last run, while the table was printed
    and --json written: the runs' stop signals were back to their defaults there, so Ctrl-C was
    a KeyboardInterrupt traceback and SIGTERM a silent death, both before --json was written:
    every run of the comparison lost. Now it is noted, the table and --json are finished (whole,
    not partial), one line says so, and compare.py dies of the signal."""

    out = tmp_path / "compare.json"
    proc = _stopped_compare(AFTER_RUNS, data_dir, out, signal_name)
    assert f"stopped by {signal_name} after the last run; 4 runs had finished" in proc.stderr
    assert "RUNS STARTED 4" in proc.stdout and "ratio" in proc.stdout, proc.stdout
    r = json.loads(out.read_text())
    assert r["partial"] is False and r["failed_run"] is None
    assert r["ours"]["runs"] == [1.0, 4.0] and r["reference"]["runs"] == [1.0, 1.5]


def test_a_stop_signal_while_a_run_starts_stops_it(data_dir, tmp_path, monkeypatch, capsys):
    """A SIGTERM that lands while torchrun is being started (inside Popen, between the fork and
    its return) raised there, and the started process, in a session of its own, was never told:
    it ran on after compare.py had exited. Now the signal waits for Popen, then is passed on."""
    import os
    import signal

    started = []

    def popen(cmd, **kwargs):  # the run starts, and the stop signal comes before Popen returns
        started.append(subprocess.Popen(["sleep", "60"], **kwargs))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # Python runs the handler here, inside the call
        return started[-1]

    runs = type("Runs", (FakeRuns,), {"Popen": staticmethod(popen)})
    monkeypatch.setattr(compare, "subprocess", runs)
    argv = ["--data-dir", str(data_dir), "--dataset", "synthetic", "--repeats", "1", "--smoke"]
    try:
        assert compare.main(argv) == 128 + signal.SIGTERM
        assert started[0].wait(timeout=30) == -signal.SIGTERM  # told, and stopped
    finally:
        if started and started[0].poll() is None:
            started[0].kill()
    assert "ours run 1/1 stopped by SIGTERM" in capsys.readouterr().err


def processes_naming(text: str) -> list[int]:
    """The pids of the processes whose command line holds `text`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
        except OSError:  # it ended meanwhile
            continue
        if text in cmdline.decode(errors="replace"):
            pids.append(int(proc.name))
    return pids


def test_a_stop_signal_to_compare_alone_stops_the_runs_ranks(data_dir, tmp_path):
    """SIGTERM to compare.py alone (`kill PID`, a parent that stops its child) during our
    trainer's run: subprocess.run killed torchrun with SIGKILL at once, before it could pass
    the signal on, and its ranks (each in a session of its own) trained on, orphaned, after
    compare.py had exited: the device held, the next benchmark's numbers skewed. Now torchrun
    gets the signal, stops its ranks, and compare.py exits after them."""
    import os
    import signal

    tmp = tmp_path / "tmp"  # compare.py's temporary run directories: in the ranks' --out
    tmp.mkdir()
    argv = [PYTHON, str(REPO / "benchmarks" / "compare.py"), "--data-dir", str(data_dir)]
    argv += ["--dataset", "synthetic", "--nproc", "2", "--width", "2", "--local-batch", "16"]
    argv += ["--epochs", "500", "--warmup-steps", "2", "--limit-train", "256", "--repeats", "1"]
    argv += ["--smoke", "--ref-workers", "0", "--ours-flags=--limit-test 64"]
    err = tmp_path / "stderr"  # a file: orphaned ranks would hold a pipe open
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            argv, env=child_env(TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=stderr,
            text=True,
        )  # fmt: skip
    try:
        for line in proc.stdout:  # our ranks are training
            if re.search(r"\] epoch +1/500", line):
                break
        assert len(processes_naming(str(tmp))) >= 3, "torchrun and 2 ranks"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        left = processes_naming(str(tmp))
        assert left == [], f"ranks left running after compare.py: {left}"
        said = err.read_text()
        assert proc.returncode == -signal.SIGTERM and "ours run 1/1 stopped by SIGTERM" in said
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in processes_naming(str(tmp)):  # only this test's runs
            os.kill(pid, signal.SIGKILL)


def test_a_closed_terminals_sighup_reaches_the_run_and_stops_compare(tmp_path):
    """torchrun runs in a session of its own (run_trainer), so a closed terminal's SIGHUP, sent
    to the terminal's foreground group, no longer reached it: compare.py died of the signal's
    default and the run trained on, orphaned. SIGHUP is now a stop signal like SIGTERM: passed
    on to the run, raised as Stopped naming it, its handler restored after."""
    import signal

    marker = tmp_path / "run-got"
    run = (  # the run: says it is ready, then waits for a signal and writes its name
        "import signal, sys, time\n"
        "def got(signum, frame):\n"
        "    open(sys.argv[1], 'w').write(signal.Signals(signum).name); sys.exit(0)\n"
        "signal.signal(signal.SIGHUP, got); signal.signal(signal.SIGTERM, got)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    script, cmd = str(REPO / "benchmarks" / "compare.py"), [PYTHON, "-c", run, str(marker)]
    parent = (  # compare.py's run_trainer under its stop handlers, as main() runs a run
        "import importlib.util, os, signal, sys\n"
        f"spec = importlib.util.spec_from_file_location('compare', {script!r})\n"
        "compare = importlib.util.module_from_spec(spec); spec.loader.exec_module(compare)\n"
        "with compare.stop_signals_raised():\n"
        "    try:\n"
        f"        compare.run_trainer({cmd!r}, dict(os.environ))\n"
        "    except compare.Stopped as exc:\n"
        "        print('stopped by', exc.signum.name, flush=True)\n"
        "print('after', signal.getsignal(signal.SIGHUP) is signal.SIG_DFL, flush=True)\n"
    )
    proc = subprocess.Popen(
        [PYTHON, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=sighup_as_in_a_terminal,  # not nohup's (CI's) ignored SIGHUP
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGHUP)  # to compare.py alone, as a hang-up reaches it
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.split("\n")[:2] == ["stopped by SIGHUP", "after True"], out
    assert marker.read_text() == "SIGHUP"  # the run got it, and stopped


HUNG_RANK = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a rank deaf to the stop (hung in a collective)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


def test_a_second_ctrl_c_kills_torchrun_and_its_ranks(tmp_path):
    """A second Ctrl-C while torchrun stopped a run's ranks (or a run not stopped in
    STOP_WAIT_S): compare.py killed torchrun (SIGKILL), whose own kill of the ranks, 30 s after
    its signal, then never came; the ranks run in sessions of their own, so a rank that had not
    heeded the signal (hung in a collective: when a user presses Ctrl-C twice) was orphaned,
    holding the device, after compare.py had returned. Now its ranks are killed with it."""
    import os
    import signal

    rank, pid_file = tmp_path / "rank.py", tmp_path / "rank.pid"
    rank.write_text(HUNG_RANK)
    script = str(REPO / "benchmarks" / "compare.py")
    parent = (  # compare.py's run_trainer of a real torchrun, as main() runs a run
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('compare', {script!r})\n"
        "compare = importlib.util.module_from_spec(spec); spec.loader.exec_module(compare)\n"
        f"cmd = [*compare.torchrun(1), {str(rank)!r}, {str(pid_file)!r}]\n"
        "with compare.stop_signals_raised():\n"
        "    try:\n"
        "        compare.run_trainer(cmd, dict(os.environ))\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', flush=True)\n"
    )
    with (tmp_path / "output").open("w") as output:  # a file: an orphan would hold a pipe open
        proc = subprocess.Popen(
            [PYTHON, "-c", parent], env=child_env(), stdout=output, stderr=output,
            preexec_fn=sigint_as_in_a_terminal,
        )  # fmt: skip
    pid = None
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        pid = int(pid_file.read_text())  # the rank is running
        proc.send_signal(signal.SIGINT)  # torchrun passes it on; the rank does not heed it
        time.sleep(1)
        proc.send_signal(signal.SIGINT)  # the second: stop now
        proc.wait(timeout=60)
        said = (tmp_path / "output").read_text()
        assert "compare.py: killing torchrun" in said and "interrupted" in said, said
        deadline = time.monotonic() + 10  # the SIGKILL's delivery: not at once on busy cores
        while (state := process_state(pid)) not in ("gone", "Z") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state in ("gone", "Z"), f"rank {pid} left running after compare.py ({state})"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "flags, says",
    [
        ('--cuda-graphs "off', "No closing quotation"),  # shlex
        ("--compile maybe", "argument --compile: invalid choice: 'maybe'"),  # our trainer's
        ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_ours_flags_are_refused_in_one_line_before_any_run(
    data_dir, monkeypatch, capsys, flags, says
):
    runs = FakeRuns()
    monkeypatch.setattr(compare, "subprocess", runs)
    with pytest.raises(SystemExit) as exit_:
        compare.main(
            ["--data-dir", str(data_dir), "--dataset", "synthetic", f"--ours-flags={flags}"]
        )
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and runs.calls == []
    assert err.splitlines() == [err.strip()] and says in err, err


def test_a_tiny_comparison_end_to_end(data_dir, tmp_path):
    """2 gloo ranks, width 2, one repeat (--smoke): both trainers run, the JSON holds both
    medians and no spread."""
    out = tmp_path / "compare.json"
    argv = [PYTHON, str(REPO / "benchmarks" / "compare.py"), "--data-dir", str(data_dir)]
    argv += ["--dataset", "synthetic", "--nproc", "2", "--width", "2", "--local-batch", "16"]
    argv += ["--epochs", "1", "--warmup-steps", "2", "--limit-train", "512", "--repeats", "1"]
    argv += ["--smoke", "--ref-workers", "0", "--json", str(out)]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["ours"]["median"] > 0 and r["reference"]["median"] > 0
    assert r["ratio"] == pytest.approx(r["ours"]["median"] / r["reference"]["median"])
    assert r["ours_mfu"] == [None] and r["ours_mfu_unmeasured"].startswith("cpu:")
    assert r["ours"]["spread"] is None and "no spread: 1 repeats (--smoke)" in proc.stdout
    assert "ratio" in proc.stdout


def run_reference(monkeypatch, data_dir, out, seconds_per_image, *flags, clock=None):
    """reference_train.train in this process (a 1-rank gloo group is open) on the synthetic data,
    each image's loading slowed by `seconds_per_image`: slept, or (with `clock`, a one-item list
    of seconds that the reference's timer then reads) added to that clock, so that the window
    measures nothing but the loading it holds. Returns its result JSON."""
    import torch

    ref = load_benchmark("reference_train")
    load = ref.PreparedImages.__getitem__

    def slow(self, i):
        if clock is None:
            time.sleep(seconds_per_image)
        else:
            clock[0] += seconds_per_image
        return load(self, i)

    monkeypatch.setattr(ref.PreparedImages, "__getitem__", slow)  # forked workers inherit it
    if clock is not None:
        monkeypatch.setattr(ref, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    argv = ["reference_train.py", "--data-dir", str(data_dir), "--dataset", "synthetic"]
    argv += ["--width", "2", "--limit-train", "64", "--out", str(out), *flags]
    monkeypatch.setattr(sys, "argv", argv)
    ref.train(ref.parse_args(), torch.device("cpu"), "gloo")
    return json.loads(out.read_text())


def test_the_reference_with_a_batch_above_each_ranks_share_says_so(
    tmp_path, monkeypatch, data_dir, one_rank_group
):
    """64 images and --local-batch 100: the DataLoader (drop_last) yields no step. The line said
    "lower --warmup-steps or train longer", which cannot help: it names the batch and the share."""
    with pytest.raises(SystemExit) as exit_:
        run_reference(monkeypatch, data_dir, tmp_path / "r.json", 0, "--local-batch", "100")
    message = str(exit_.value.code)
    assert message.splitlines() == [message], message
    assert "--local-batch 100" in message and "64 images" in message, message
    assert "--warmup-steps" not in message, message


def test_the_reference_crops_to_the_datas_own_size(tmp_path, monkeypatch, one_rank_group):
    """28 x 28 images (mnist's size) reach the reference's network as 28 x 28, as they reach
    ours (loaders.crop_flip keeps the data's size), not padded and cropped to 32 x 32."""
    import torch

    root = tmp_path / "data" / "mnist"
    root.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (64,), generator=g)
    torch.save({"train_x": images, "train_y": labels}, root / "data.pt")
    (root / "meta.json").write_text(json.dumps({"mean": [0.13], "std": [0.31]}))
    ref = load_benchmark("reference_train")
    shapes = set()
    build = ref.resnet18

    def recording(**kwargs):
        model = build(**kwargs)
        model.register_forward_pre_hook(lambda m, args: shapes.add(tuple(args[0].shape[1:])))
        return model

    monkeypatch.setattr(ref, "resnet18", recording)
    argv = ["reference_train.py", "--data-dir", str(tmp_path / "data"), "--dataset", "mnist"]
    argv += ["--width", "2", "--local-batch", "16", "--warmup-steps", "1", "--num-workers", "0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "ref.json")])
    ref.train(ref.parse_args(), torch.device("cpu"), "gloo")
    assert shapes == {(1, 28, 28)}


def test_the_reference_window_holds_its_timed_steps_loading(
    data_dir, tmp_path, monkeypatch, one_rank_group
):
    """As in our loop, each timed step's batch is loaded inside the window, the first timed step
    of each epoch too (the reference once fetched it before opening the window). Loading alone
    advances the clock: the window is exactly the timed batches' loading."""
    per_image, batch = 0.01, 8
    clock = [0.0]
    flags = ("--local-batch", str(batch), "--epochs", "2", "--warmup-steps", "2")
    flags += ("--num-workers", "0")
    r = run_reference(monkeypatch, data_dir, tmp_path / "ref.json", per_image, *flags, clock=clock)
    assert r["steps_timed"] == 2 * 64 // batch - 2  # a window in each epoch
    assert r["window_time_s"] == pytest.approx(r["steps_timed"] * batch * per_image)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_reference_never_reports_more_than_its_loader_delivers(
    data_dir, tmp_path, monkeypatch, one_rank_group
):
    """With DataLoader workers, whose loading is slowed to a known ceiling of img/s, the reported
    throughput stays under that ceiling: the window opened before the epoch's first batch (and
    the batches the other workers loaded meanwhile) arrived. Real sleeps: a busy machine only
    lowers the throughput, never the ceiling. The window is the second epoch, whole."""
    per_image, batch, workers = 0.025, 8, 4
    flags = ("--local-batch", str(batch), "--epochs", "2", "--warmup-steps", str(64 // batch))
    flags += ("--num-workers", str(workers))
    r = run_reference(monkeypatch, data_dir, tmp_path / "ref.json", per_image, *flags)
    assert r["steps_timed"] == 64 // batch
    ceiling = workers / per_image  # img/s: each worker loads one image per `per_image` seconds
    assert r["throughput_img_s"] <= 1.02 * ceiling, (r["throughput_img_s"], ceiling)


def test_the_step_anatomy_times_the_real_trainer_per_phase(data_dir, tmp_path):
    """benchmarks/step_anatomy.py on a CPU, tiny: the real trainer ran (its metrics.json), each
    kept window step's phases fit inside its host time, the CPU step timer's own clock sits
    inside the host interval, and the profiled steps are left out of the medians."""
    out, run = tmp_path / "anatomy.json", tmp_path / "run"
    argv = [PYTHON, str(REPO / "benchmarks" / "step_anatomy.py"), "--json", str(out)]
    argv += ["--cprofile-from", "10", "--cprofile-steps", "2", "--", "--dataset", "synthetic"]
    argv += ["--data-dir", str(data_dir), "--width", "2", "--local-batch", "16", "--epochs", "1"]
    argv += ["--limit-train", "512", "--warmup-steps", "4", "--comm-probe-steps", "0"]
    argv += ["--no-tensorboard", "--out", str(run)]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    assert r["throughput_img_s"] == metrics["throughput_img_s"] > 0
    host = r["host_ms"]
    assert host["steps"] == metrics["window_steps"] - 2  # 28 window steps, 2 under cProfile
    phases = ("data", "forward", "backward", "optimizer")
    assert all(host[p]["median"] > 0 for p in phases) and host["communication"]["median"] == 0
    assert host["other"]["p10"] >= 0  # the phases never exceed the step's host time
    assert 0 < host["device step"]["median"] <= host["host step"]["median"]
    assert "function calls" in r["cprofile"]  # pstats of the two profiled steps


@pytest.mark.parametrize(
    "ms", [[1.0, 5.0, 9.0], [4.0], [2.0, 8.0], [0.5, 7.0, 1.0, 3.0, 9.5, 2.0, 6.0, 4.0, 8.0, 5.0]]
)
def test_step_anatomy_percentiles_are_the_trainers(ms):
    """p10 and p90 of the kept window steps as metrics.json's step-time quantiles (numpy's
    default, linear between the nearest ranks): inside the values, never extrapolated past
    them (statistics.quantiles' default gave p10 = -1.4 ms for steps of 1, 5 and 9 ms)."""
    import numpy as np

    anatomy = load_benchmark("step_anatomy")
    host = []
    for s in (v / 1e3 for v in ms):
        step = dict.fromkeys(anatomy.PARTS, s) | {"_keep": True}
        host.append(step)
    got = anatomy.summary(types.SimpleNamespace(host_steps=host))
    assert got["steps"] == len(ms)
    for part in anatomy.PARTS:
        want_p10, want_p90 = np.percentile(ms, [10, 90])
        assert got[part]["p10"] == pytest.approx(want_p10)
        assert got[part]["p90"] == pytest.approx(want_p90)
        assert min(ms) <= got[part]["p10"] <= got[part]["median"] <= got[part]["p90"] <= max(ms)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--cprofile-steps", "3"], "--cprofile-steps 3 needs --cprofile-from"),  # default -1
        (["--cprofile-from", "-2", "--cprofile-steps", "3"], "(>= 0), got -2"),
        (["--cprofile-from", "4", "--cprofile-steps", "-1"], "--cprofile-steps must be >= 0"),
    ],
)
def test_step_anatomy_refuses_a_cprofile_window_without_a_first_step(capsys, flags, says):
    """A profile that would never be enabled is refused before the training, in one line (it
    trained in full, then pstats raised on the empty profile: no table, no --json)."""
    anatomy = load_benchmark("step_anatomy")
    with pytest.raises(SystemExit) as exit_:
        anatomy.parse_args([*flags, "--", "--out", "run"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines() == [err.strip()] and says in err, err


@pytest.mark.parametrize(
    "first, says",
    [(100, "no step profiled"), (5, "function calls"), (7, "runs past the run's last step")],
)
def test_step_anatomy_reports_a_cprofile_window_past_the_last_step(
    tmp_path, monkeypatch, capsys, first, says
):
    """--cprofile-from past the run's last step (8 steps here, by a stand-in trainer that drives
    the host step timer as the loop does): the table and --json as always, the profile a
    one-line note; a window inside the run: pstats of its steps. A window that starts in the
    run and ends past it (steps 7-8) was printed as the profiled steps, holding what came after
    training too (evaluation, writes): a one-line note."""
    import torch

    anatomy = load_benchmark("step_anatomy")
    monkeypatch.setattr(anatomy.measure, "StepTimer", anatomy.measure.StepTimer)  # main sets it

    def train(cfg):
        timer = anatomy.measure.StepTimer(torch.device("cpu"))  # anatomy's HostStepTimer
        for i in range(8):
            timer.start()
            with timer.phase("forward"):
                sum(range(1000))
            timer.stop(in_window=i >= 2)
        timer.collect()
        Path(cfg.out).mkdir(parents=True)
        (Path(cfg.out) / "metrics.json").write_text('{"throughput_img_s": 1.0, "local_batch": 2}')
        return 0

    monkeypatch.setattr(anatomy.trainer, "main", train)
    out = tmp_path / "anatomy.json"
    argv = ["--json", str(out), "--cprofile-from", str(first), "--cprofile-steps", "2"]
    assert anatomy.main([*argv, "--", "--out", str(tmp_path / "run")]) == 0
    r = json.loads(out.read_text())
    assert says in r["cprofile"] and "median ms" in capsys.readouterr().out
    if first == 100:
        assert r["cprofile"].splitlines() == [r["cprofile"]], r["cprofile"]
        assert "--cprofile-from 100 is past the run's last step (7;" in r["cprofile"]
        assert r["host_ms"]["steps"] == 6  # every window step kept: none was profiled
    elif first == 7:
        assert r["cprofile"] == (
            "cProfile: not printed: the window, steps 7-8, runs past the run's last step (7), "
            "so the profile holds what came after training too; give --cprofile-steps 1 or "
            "fewer"
        )
    else:
        assert r["host_ms"]["steps"] == 4  # steps 5 and 6 profiled, left out


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--local-batch", "-1"], "--local-batch must be >= 1, got -1"),  # TrainConfig's check
        (["--data-dir", "no-such-dir"], "synthetic is not prepared"),  # the trainer's preflight
    ],
)
def test_step_anatomy_says_an_expected_error_in_one_line(tmp_path, flags, says):
    argv = [PYTHON, str(REPO / "benchmarks" / "step_anatomy.py"), "--", "--dataset", "synthetic"]
    argv += ["--out", str(tmp_path / "run"), *flags]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()  # one line, no traceback
    assert line.startswith("step_anatomy.py: ") and says in line, line


def test_checkpoint_stall_measures_a_single_save_per_mode(tmp_path, monkeypatch, capsys):
    """--repeats 1: each mode's mean stall without a standard deviation (none of one run), not
    a StatisticsError after the saves; --repeats 0 is refused."""
    stall = load_benchmark("checkpoint_stall")
    build = stall.build_model
    monkeypatch.setattr(stall, "build_model", lambda name, **kw: build(name, **kw | {"width": 2}))
    monkeypatch.setattr(stall.time, "sleep", lambda s: None)  # "training would go on here"
    argv = ["checkpoint_stall.py", "--device", "cpu", "--dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--repeats", "1"])
    stall.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["plain", "sync", "async"], lines
    assert all("n=1 " in line and "mean=" in line and "sd=" not in line for line in lines[:3])
    # the ratios against the plain reference (a torch.save in the loop), from the means printed
    means = {line.split()[0]: float(line.split("mean=")[1].split()[0]) for line in lines[:3]}
    for mode, line in zip(("async", "sync"), lines[3:5], strict=True):
        assert line.startswith(f"{mode} / plain stall: "), lines
        ratio = float(line.split(": ")[1].split()[0])
        # the means as printed (4 decimals of a few ms): the ratio's way up, not its last digit
        assert ratio == pytest.approx(means[mode] / means["plain"], rel=0.1), lines
    monkeypatch.setattr(sys, "argv", [*argv, "--repeats", "0"])
    with pytest.raises(SystemExit) as exit_:
        stall.main()
    assert exit_.value.code == 2 and "--repeats must be >= 1" in capsys.readouterr().err


def test_the_ddp_buffer_benchmark_times_both_wrappers():
    """benchmarks/ddp_buffers.py on 2 gloo ranks, tiny: both step times and their ratio."""
    argv = [PYTHON, str(REPO / "benchmarks" / "ddp_buffers.py"), "--width", "2", "--batch", "4"]
    argv += ["--steps", "3", "--repeats", "1"]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    medians = re.findall(r"^  (broadcast|ours) +([\d.]+) ms", proc.stdout, re.MULTILINE)
    assert [name for name, _ in medians] == ["broadcast", "ours"], proc.stdout
    (ratio,) = re.findall(r"ours / per-step broadcast: ([\d.]+) of the step time", proc.stdout)
    broadcast, ours = (float(ms) for _, ms in medians)
    assert float(ratio) == pytest.approx(ours / broadcast, abs=0.002)


def test_overhead_leaves_out_runs_without_a_snakemake_benchmark(tmp_path, monkeypatch, capsys):
    """benchmarks/overhead.py on a study where a finished run has no benchmarks/train/<run>.tsv
    (the workflow allows it: resources.optional_benchmarks): the others' overhead and the count
    left out; with no timed run (or no run yet) one line and exit, no traceback."""
    overhead = load_benchmark("overhead")
    monkeypatch.setattr(sys, "argv", ["overhead.py", str(tmp_path)])
    (tmp_path / "results/csv").mkdir(parents=True)
    (tmp_path / "benchmarks/train").mkdir(parents=True)
    runs_csv = tmp_path / "results/csv/runs.csv"
    runs_csv.write_text("run,train_time_s\nw1_a,10.0\nw2_b,12.0\nw4_c,20.0\n")
    for run, job_s in (("w1_a", 15.5), ("w4_c", 21.5)):
        (tmp_path / "benchmarks/train" / f"{run}.tsv").write_text(f"s\th:m:s\n{job_s}\t0:00:15\n")
    assert overhead.main() == 0
    out = capsys.readouterr().out
    assert re.search(r"^w1_a +15\.5 +10\.0 +5\.5$", out, re.M) and "w2_b " not in out, out
    assert "median 3.5 s, min 1.5 s, max 5.5 s over 2 jobs" in out, out
    assert f"1 of 3 runs left out, no {tmp_path}/benchmarks/train/<run>.tsv: ['w2_b']" in out
    for run in ("w1_a", "w4_c"):
        (tmp_path / "benchmarks/train" / f"{run}.tsv").unlink()
    for rows, why in (("w1_a,10.0\n", "none of its 1 runs has"), ("", "no runs yet")):
        runs_csv.write_text("run,train_time_s\n" + rows)
        with pytest.raises(SystemExit) as exit_:
            overhead.main()
        message = str(exit_.value.code)  # sys.exit(message): stderr, exit 1
        assert message.splitlines() == [message] and f"{runs_csv}: {why}" in message, message


@pytest.mark.parametrize("text", ["", "s\th:m:s\n", "x\n1\n", "s\th:m:s\nabc\t0\n"])
def test_overhead_refuses_a_damaged_snakemake_benchmark_in_one_line(tmp_path, monkeypatch, text):
    """An empty, header-only or unreadable benchmarks/train/<run>.tsv was next()'s StopIteration
    (or a KeyError, a ValueError) traceback: one line naming the file, exit 1."""
    overhead = load_benchmark("overhead")
    monkeypatch.setattr(sys, "argv", ["overhead.py", str(tmp_path)])
    (tmp_path / "results/csv").mkdir(parents=True)
    (tmp_path / "benchmarks/train").mkdir(parents=True)
    (tmp_path / "results/csv/runs.csv").write_text("run,train_time_s\nw1_a,10.0\n")
    bench = tmp_path / "benchmarks/train/w1_a.tsv"
    bench.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        overhead.main()
    message = str(exit_.value.code)
    assert message.splitlines() == [message] and message.startswith(f"{bench}: "), message


def test_overhead_help_is_usage_not_a_workdir(monkeypatch, capsys):
    """`overhead.py --help` was read as the working directory ("missing --help/results/...")."""
    overhead = load_benchmark("overhead")
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--help"])
    with pytest.raises(SystemExit) as exit_:
        overhead.main()
    assert exit_.value.code == 0 and "WORKDIR" in capsys.readouterr().out


def test_overhead_leaves_out_resumed_runs(tmp_path, monkeypatch, capsys):
    """A run resumed from a checkpoint (restarts > 0 in runs.csv): its train_time_s sums every
    segment, but Snakemake's benchmarks/train/<run>.tsv holds only the last attempt's wall time
    (the epochs after the checkpoint). Their difference was reported as the job's overhead, here
    -25 s, and it lowered the median and the min. Now such a run is left out and counted, as
    the plan's calibration leaves it out (study/estimate.py, resumed)."""
    overhead = load_benchmark("overhead")
    monkeypatch.setattr(sys, "argv", ["overhead.py", str(tmp_path)])
    (tmp_path / "results/csv").mkdir(parents=True)
    (tmp_path / "benchmarks/train").mkdir(parents=True)
    rows = "w1_a,10.0,0\nw2_b,40.0,1\nw4_c,20.0,0\n"  # w2_b: 30 s, preempted, then 10 s more
    (tmp_path / "results/csv/runs.csv").write_text("run,train_time_s,restarts\n" + rows)
    for run, job_s in (("w1_a", 15.5), ("w2_b", 15.0), ("w4_c", 21.5)):
        (tmp_path / "benchmarks/train" / f"{run}.tsv").write_text(f"s\th:m:s\n{job_s}\t0:00:15\n")
    assert overhead.main() == 0
    out = capsys.readouterr().out
    assert "w2_b " not in out and "-25.0" not in out, out
    assert "median 3.5 s, min 1.5 s, max 5.5 s over 2 jobs" in out, out
    assert "1 of 3 runs left out, resumed from a checkpoint" in out and "['w2_b']" in out, out


def gpu_node(out: Path, timeout: int, **env: str) -> subprocess.CompletedProcess:
    """benchmarks/gpu_node.sh OUT with `env` over the test's environment (no GPU visible)."""
    return subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_node.sh"), str(out)],
        env=child_env(PYTHON=PYTHON, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_gpu_node_script_runs_small_on_a_cpu(tmp_path):
    """benchmarks/gpu_node.sh, the next GPU lease's one command, end to end with tiny sizes and
    the steps a CPU runs in seconds: a comparison writes its JSON with its step's flags, the
    bucket sweep writes one line per run with the mode that ran, and the buffer benchmark prints
    its ratio. The comparison's table is printed whole: a fixed `tail -n 4` of its log cut the
    header (the column names) off SMOKE=1's table, one line longer ("no spread")."""
    out = tmp_path / "out"
    sizes = {"WIDTH": "2", "LOCAL_BATCH": "16", "PRECISION": "fp32", "EPOCHS": "1"}
    sizes |= {"NUM_TRAIN": "512", "REPEATS": "1", "SMOKE": "1", "REF_WORKERS": "0"}
    sizes |= {"DEVICE": "cpu"}
    sizes |= {"BUCKETS": "1 25", "BUCKET_GRAPHS": "off"}
    # one comparison: compare.py itself is test_a_tiny_comparison_end_to_end's; here the script
    # passes a step's flags (`compare` is the same call without them)
    sizes["STEPS"] = "compare-nographs buckets ddp-buffers"
    proc = gpu_node(out, 600, CUDA_VISIBLE_DEVICES="", **sizes)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads((out / "compare-nographs.json").read_text())
    assert r["ours"]["median"] > 0 and r["reference"]["median"] > 0
    buckets = (out / "buckets.txt").read_text().splitlines()
    assert [line.split()[:2] for line in buckets] == [
        ["bucket-1mib-graphs-off", "mode=off"],
        ["bucket-25mib-graphs-off", "mode=off"],
    ], buckets
    assert (
        json.loads((out / "bucket-1mib-graphs-off" / "metrics.json").read_text())["bucket_cap_mb"]
        == 1.0
    )
    log = (out / "compare-nographs.log").read_text()
    assert "--cuda-graphs off" in log
    table = log[log.rindex("\n\n") + 2 :]  # print_table's: a blank line, then the header on
    assert table.splitlines()[0].split() == ["median", "img/s", "min", "max", "spread"], log
    assert f"== compare-nographs\n{table}== buckets\n" in proc.stdout, proc.stdout
    assert "ours / per-step broadcast:" in (out / "ddp-buffers.txt").read_text()


def test_a_failed_bucket_rerun_reports_no_line_of_the_run_before(tmp_path):
    """gpu_node.sh's bucket sweep rerun into the OUT of an earlier sweep: a run that fails now
    (here a precision the trainer refuses) gets no line in buckets.txt, neither from the earlier
    run's metrics.json nor from the earlier buckets.txt."""
    out, name = tmp_path / "out", "bucket-1mib-graphs-off"
    (out / name).mkdir(parents=True)  # what the earlier sweep left
    earlier = {"cuda_graphs_mode": "off", "throughput_img_s": 999.0, "step_time_ms_p50": 1.0}
    (out / name / "metrics.json").write_text(json.dumps(earlier))
    (out / "buckets.txt").write_text(f"{name} mode=off img/s=999 step_p50_ms=1.00 mfu=None\n")
    sizes = {"WIDTH": "2", "NUM_TRAIN": "64", "DEVICE": "cpu", "PRECISION": "fp8"}
    sizes |= {"STEPS": "buckets", "BUCKETS": "1", "BUCKET_GRAPHS": "off"}
    proc = gpu_node(out, 300, CUDA_VISIBLE_DEVICES="", **sizes)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == f"gpu_node.sh: 1 failed: {name} (logs in {out})"
    assert f"{name} failed: see {out / name}.log" in proc.stdout
    assert "fp8" in (out / f"{name}.log").read_text()  # the trainer's refusal
    assert (out / "buckets.txt").read_text() == ""
    assert not (out / name / "metrics.json").exists()


def test_a_failed_compare_or_anatomy_rerun_leaves_no_json_of_the_run_before(tmp_path):
    """gpu_node.sh rerun into the OUT of an earlier session: a comparison or anatomy-lb64 that
    fails now (here a precision both refuse) leaves the earlier session's OUT/<step>.json no
    more than the bucket sweep leaves its metrics.json: no result beside a log of a failure."""
    out = tmp_path / "out"
    out.mkdir()
    steps = ("compare", "compare-eager", "anatomy-lb64")
    for step in steps:  # what the earlier session wrote
        (out / f"{step}.json").write_text('{"ratio": 3.23, "throughput_img_s": 12967.0}\n')
    sizes = {"WIDTH": "2", "NUM_TRAIN": "64", "DEVICE": "cpu", "PRECISION": "fp8"}
    proc = gpu_node(out, 300, CUDA_VISIBLE_DEVICES="", STEPS=" ".join(steps), **sizes)
    # every step ran, then the exit status says they failed (it was 0: a caller that checks it,
    # a lease's wrapper or `&&`, took the run for a success)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    failed = f"gpu_node.sh: 3 failed: {' '.join(steps)} (logs in {out})"
    assert proc.stderr.splitlines()[-1] == failed, proc.stderr
    for step in steps:
        assert f"{step} failed: see {out / step}.log" in proc.stdout, proc.stdout
        assert "fp8" in (out / f"{step}.log").read_text()  # the refusal
        assert not (out / f"{step}.json").exists()


def test_gpu_node_refuses_an_unknown_step_before_any_work(tmp_path):
    """A misspelt STEPS name was skipped when the loop reached it, after the data preparation
    and every step before it (minutes of a short GPU lease), and the script exited 0. Now it is
    refused in one line naming the known steps, before anything runs."""
    out = tmp_path / "out"
    proc = gpu_node(out, 300, NUM_TRAIN="64", STEPS="ddp-buffers compare-nograph")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("gpu_node.sh: unknown step 'compare-nograph' in STEPS; ")
    assert "compare-nographs" in proc.stderr  # the known ones
    assert not (out / "prepare-data.log").exists() and not (out / "ddp-buffers.txt").exists()


def test_gpu_node_refuses_fewer_than_three_repeats_before_any_work(tmp_path):
    """REPEATS=2 (no SMOKE=1): each comparison would refuse it after the data preparation, the
    others running on; refused in one line before anything runs, naming REPEATS and SMOKE."""
    out = tmp_path / "out"
    proc = gpu_node(out, 300, NUM_TRAIN="64", REPEATS="2", STEPS="ddp-buffers compare")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("gpu_node.sh: REPEATS=2: ") and "SMOKE=1" in proc.stderr
    assert not (out / "prepare-data.log").exists() and not (out / "ddp-buffers.txt").exists()


def test_gpu_node_says_where_a_failed_data_preparation_is_logged(tmp_path):
    out = tmp_path / "out"
    proc = gpu_node(out, 300, NUM_TRAIN="16k", STEPS="compare")
    log = out / "prepare-data.log"
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("prepare-data failed (exit 2): ") and str(log) in proc.stderr
    assert log.read_text().splitlines()[-1] in proc.stderr  # its cause


def test_gpu_node_prints_the_ddp_buffers_result_with_its_configuration(tmp_path):
    """gpu_node.sh's ddp-buffers step printed `tail -n 3` of ddp_buffers.py's output: the two
    medians and the ratio without the line above them that says what they are of (backend,
    ranks, width, batch, steps, runs). Now the result is printed whole, from that line on."""
    out = tmp_path / "out"
    sizes = {"WIDTH": "2", "LOCAL_BATCH": "2", "NUM_TRAIN": "64", "REPEATS": "1"}
    proc = gpu_node(out, 300, CUDA_VISIBLE_DEVICES="", DEVICE="cpu", STEPS="ddp-buffers", **sizes)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = (out / "ddp-buffers.txt").read_text()
    result = text[text.rindex("1 gloo ranks, ResNet-18 width 2, batch 2 per rank") :]
    assert result.splitlines()[-1].startswith("ours / per-step broadcast: "), text
    assert proc.stdout == f"== ddp-buffers\n{result}", proc.stdout


@pytest.mark.parametrize("m, tolerance", [(2, 1e-5), (4, 1e-4)])
def test_winograd_computes_the_convolution_and_its_gradients(m, tolerance):
    """benchmarks/winograd.py times an algorithm only if it computes F.conv2d: odd sizes (a
    ragged last tile), both gradients; F(4x4, 3x3) rounds more (its transforms hold 1/24 to 8)."""
    import torch
    import torch.nn.functional as F

    winograd = load_benchmark("winograd")
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, 6, requires_grad=True)
    weight = torch.randn(4, 5, 3, 3, requires_grad=True)
    grad_out = torch.randn(3, 4, 7, 6)
    got = winograd.winograd_conv3x3(x, weight, m)
    (gx, gw) = torch.autograd.grad(got, (x, weight), grad_out)
    want = F.conv2d(x, weight, padding=1)
    (wx, ww) = torch.autograd.grad(want, (x, weight), grad_out)
    for a, b in ((got, want), (gx, wx), (gw, ww)):
        assert a.shape == b.shape
        scale = b.abs().max()
        assert (a - b).abs().max() <= tolerance * scale, (a - b).abs().max() / scale


def test_the_winograd_benchmark_times_every_stride1_3x3_shape_of_the_network():
    """benchmarks/winograd.py, tiny and eager: per shape of the real network's stride-1 3x3
    convolutions (the stem, 4 in stage 1, 3 in each later stage) the direct time and one line per
    algorithm, each checked against F.conv2d; the per-step totals add up."""
    argv = [PYTHON, str(REPO / "benchmarks" / "winograd.py"), "--width", "4", "--batch", "2"]
    argv += ["--repeats", "1", "--compile", "off"]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    shapes = re.findall(r"^ +(\d+)->(\d+) +(\d+)x(\d+) +x(\d+): direct ([\d.e+-]+) ms$", out, re.M)
    counts = {(int(c), int(k), int(h)): int(n) for c, k, h, _, n, _ in shapes}
    assert counts == {(3, 4, 32): 1, (4, 4, 32): 4, (8, 8, 16): 3, (16, 16, 8): 3, (32, 32, 4): 3}
    algos = re.findall(
        r"^    F\((\d)x\d,3x3\): eager ([\d.e+-]+) ms \(([\d.]+)x\)  products only ([\d.e+-]+) ms"
        r" \(([\d.]+)x\)  rel\. error ([\d.e+-]+)$",
        out,
        re.M,
    )
    assert [m for m, *_ in algos] == ["2", "4"] * len(shapes)
    for i, (m, eager, ratio, only, only_ratio, error) in enumerate(algos):
        direct = float(shapes[i // 2][5])
        assert float(error) < (1e-5 if m == "2" else 1e-4)
        # times printed to 3 significant digits, ratios to 2 decimals
        assert float(ratio) == pytest.approx(direct / float(eager), rel=0.015, abs=0.01)
        assert float(only_ratio) == pytest.approx(direct / float(only), rel=0.015, abs=0.01)
    (direct_total,) = re.findall(r"per step: direct (\d+) ms$", out, re.M)
    expected = sum(int(n) * float(d) for *_, n, d in shapes)
    assert int(direct_total) == pytest.approx(expected, abs=1)
    # each algorithm's per-shape choice is never slower than direct
    for m in ("2", "4"):
        (best,) = re.findall(
            rf"F\({m}x{m},3x3\): the faster of direct and it per shape (\d+) ms", out
        )
        assert int(best) <= int(direct_total)
    (either,) = re.findall(r"the fastest of direct and Winograd per shape (\d+) ms", out)
    assert int(either) <= int(direct_total)
    # torch's NNPACK, where this build has it (x86 builds do): one line per shape, correct
    nnpack = re.findall(r"^    NNPACK: .* rel\. error ([\d.e+-]+)$", out, re.M)
    import torch

    if torch.backends.nnpack.is_available():
        assert len(nnpack) == len(shapes) and all(float(e) < 1e-4 for e in nnpack), out
    else:
        assert not nnpack
