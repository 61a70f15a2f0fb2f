"""The efficiency-loss waterfall: its arithmetic on hand-made runs (expected values worked out in
the comments), and real 2-rank gloo runs on CPU with an injected cause (a slow rank, a throttled
input) that must land in its own part."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import PYTHON, REPO, child_env, read_metrics, train

from scalestudy import files
from scalestudy.errors import TrainConfigError
from scalestudy.results import analyze
from scalestudy.results.collect import flatten
from scalestudy.trainer import dist as sdist
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.train import preflight

PARTS = analyze.WATERFALL_PARTS


def run(
    run_id, family, world_size, local_batch, throughput, data_ms, busy_ms, comm, precision="fp32"
):
    """A runs.csv row as collect writes it (per-rank lists joined with ';')."""
    return {
        "run": run_id,
        "families": family,
        "world_size": str(world_size),
        "nodes": "1",
        "local_batch": str(local_batch),
        "global_batch": str(world_size * local_batch),
        "precision": precision,
        "bucket_cap_mb": "25",
        "throughput_img_s": str(throughput),
        "comm_exposed_frac": str(comm),
        "data_time_ms_mean_by_rank": ";".join(map(str, data_ms)),
        "busy_time_ms_p50_by_rank": ";".join(map(str, busy_ms)),
    }


def rows_by_family(runs):
    return {(r["family"], r["world_size"]): r for r in analyze.waterfall(runs)}


def test_known_causes_split_exactly():
    runs = [
        # weak, local batch 100: T(1) = 100 / 1000 = 0.1 s, d(1) = 5 ms, one rank: s(1) = 0
        run("w1", "weak", 1, 100, 1000, [5], [50], 0.0),
        # N = 2: X_ideal = 2000, T_ideal = 0.1, k = 1; X = 1600 -> T = 0.125, dT = 25 ms
        # comm 0.08 x 125 = 10 ms; data the lower median (7, 9) = 7 - 5 = 2 ms (the slow rank's
        # extra 2 ms of data is in its busy time, so in the imbalance: the plain median, 8,
        # counted half of it twice); imbalance 56 - 50 = 6 ms; residual 25 - 18 = 7 ms;
        # img/s per s = 200 / (0.125 x 0.1) = 16000
        run("w2", "weak", 2, 100, 1600, [7, 9], [50, 56], 0.08),
        # strong, global batch 200: T(1) = 0.2 s, d(1) = 10 ms
        run("s1", "strong", 1, 200, 1000, [10], [100], 0.0),
        # N = 4: X_ideal = 4000, T_ideal = 0.05, k = 0.25; X = 2500 -> T = 0.08, dT = 30 ms
        # comm 0.25 x 80 = 20 ms; data the lower median (4, 4, 5, 6) = 4 - 10 x 0.25 = 1.5 ms;
        # imbalance 30 - 21 (the lower median) = 9 ms; residual 30 - 30.5 = -0.5 ms (shown)
        # img/s per s = 200 / (0.08 x 0.05) = 50000
        run("s4", "strong", 4, 50, 2500, [4, 4, 5, 6], [20, 21, 22, 30], 0.25),
    ]
    rows = rows_by_family(runs)
    assert set(rows) == {("weak", 2), ("strong", 4)}  # the baselines have no row
    weak, strong = rows[("weak", 2)], rows[("strong", 4)]
    assert weak["loss_img_s"] == pytest.approx(400)
    assert [weak[f"{p}_img_s"] for p in PARTS] == pytest.approx([160, 32, 96, 112])
    assert weak["loss_frac"] == pytest.approx(0.2)
    assert [weak[f"{p}_frac"] for p in PARTS] == pytest.approx([0.08, 0.016, 0.048, 0.056])
    assert strong["loss_img_s"] == pytest.approx(1500)
    assert [strong[f"{p}_img_s"] for p in PARTS] == pytest.approx([1000, 75, 450, -25])
    assert (strong["baseline_world_size"], strong["x_ideal"]) == (1, pytest.approx(4000))
    # the step times of the comments above: T = global batch / X, T_ideal = global batch / X_ideal
    assert (weak["step_time_s"], weak["step_time_ideal_s"]) == pytest.approx((0.125, 0.1))
    assert (strong["step_time_s"], strong["step_time_ideal_s"]) == pytest.approx((0.08, 0.05))
    for row in (weak, strong):
        assert abs(row["check"]) < 1e-9
        assert sum(row[f"{p}_img_s"] for p in PARTS) == pytest.approx(row["loss_img_s"], abs=1e-9)
        assert row["note"] is None


def test_a_slow_ranks_data_wait_is_counted_once():
    """One of 2 ranks spends 10 ms more per step in its data phase, and the step is 10 ms
    longer: that is imbalance (its busy time holds its data phase), and nothing else. The
    plain median of the data waits counted half of it again as data wait, and the residual
    went negative to pay for it."""
    runs = [
        run("w1", "weak", 1, 100, 1000, [5], [50], 0.0),
        run("w2", "weak", 2, 100, 100 * 2 / 0.11, [5, 15], [50, 60], 0.0),
    ]
    weak = rows_by_family(runs)[("weak", 2)]
    ms = {p: weak[f"{p}_img_s"] / (200 / (0.11 * 0.1)) * 1e3 for p in PARTS}
    assert ms == pytest.approx({"comm": 0, "data": 0, "imbalance": 10, "residual": 0}, abs=1e-9)


def test_parts_sum_to_the_loss_from_the_csv_cells(tmp_path):
    """What the documents read: the written cells, rounded by analyze.cell, still add up."""
    runs = [
        run("w1", "weak", 1, 128, 1234.5678, [3.3], [17.1], 0.0),
        run("w2", "weak", 2, 128, 2001.25, [3.9, 4.7], [17.5, 23.3], 0.1371),
        run("w4", "weak", 4, 128, 3333.3333, [4.1, 4.2, 5.0, 7.7], [18, 19, 20, 41.7], 0.291),
    ]
    path = tmp_path / "waterfall.csv"
    files.write_csv(path, analyze.WATERFALL_COLUMNS, analyze.waterfall(runs), analyze.cell)
    written = analyze.read_csv(path)
    assert len(written) == 2
    for row in written:
        parts = sum(float(row[f"{p}_img_s"]) for p in PARTS)
        assert abs(parts - float(row["loss_img_s"])) < 1e-9
        assert abs(float(row["check"])) < 1e-9


def test_repeats_are_averaged_and_precision_has_its_own_baseline():
    runs = [
        run("w1_fp32", "precision", 1, 100, 1000, [5], [50], 0.0),
        run("w1_bf16", "precision", 1, 100, 2000, [5], [50], 0.0, precision="bf16"),
        # two bf16 repeats at N = 2: mean X = 3000 against bf16's ideal 2 x 2000 = 4000
        run("w2_bf16_r0", "precision", 2, 100, 2800, [5, 5], [50, 50], 0.1, precision="bf16"),
        run("w2_bf16_r1", "precision", 2, 100, 3200, [5, 5], [50, 50], 0.1, precision="bf16"),
    ]
    [row] = analyze.waterfall(runs)
    assert (row["precision"], row["n"], row["x_ideal"]) == ("bf16", 2, pytest.approx(4000))
    assert row["x_measured"] == pytest.approx(3000)
    assert row["runs"] == "w2_bf16_r0;w2_bf16_r1"


def test_runs_without_per_rank_times_leave_imbalance_blank_not_zero():
    old = run("w2", "weak", 2, 100, 1600, [7, 9], [50, 56], 0.08)
    old["busy_time_ms_p50_by_rank"] = ""  # results of a trainer before the per-rank times
    del old["data_time_ms_mean_by_rank"]
    runs = [run("w1", "weak", 1, 100, 1000, [5], [50], 0.0), old]
    [row] = analyze.waterfall(runs)
    assert row["imbalance_img_s"] is None and row["data_img_s"] is None
    assert row["imbalance_frac"] is None
    # comm (160 img/s, as above) is measured; the rest of the 400 img/s stays in the residual
    assert row["comm_img_s"] == pytest.approx(160)
    assert row["residual_img_s"] == pytest.approx(240)
    assert abs(row["check"]) < 1e-9
    assert "imbalance" in row["note"] and "busy_time_ms_p50_by_rank" in row["note"]


H100_STEP_GRAPH = REPO / "docs/gpu-runs/2026-11-27-h100-gpu-check/speed-tf32-lb512.metrics.json"


def test_whole_step_cuda_graphs_leave_imbalance_blank_and_the_note_says_why():
    """cuda_graphs auto on a GPU captures the whole step as one CUDA graph (cuda_graphs_mode
    step): the trainer writes busy_time_ms_p50_by_rank null, the busy phases being inside the
    replay. The note named the column as if the runs came from an older trainer."""
    real = json.loads(H100_STEP_GRAPH.read_text())  # a real H100 run under cuda_graphs auto
    assert real["cuda_graphs_mode"] == "step" and real["busy_time_ms_p50_by_rank"] == [None]

    def as_run(world_size, throughput, **cells):
        metrics = real | {"world_size": world_size, "global_batch": 512 * world_size,
                          "throughput_img_s": throughput, "comm_exposed_frac": 0.05,
                          "busy_time_ms_p50_by_rank": [None] * world_size,  # the trainer's
                          "data_time_ms_mean_by_rank": [0.16] * world_size}  # fmt: skip
        return flatten(metrics) | {"run": f"w{world_size}", "families": "weak"} | cells

    runs = [as_run(1, 36000.0), as_run(2, 64000.0)]
    [row] = analyze.waterfall(runs)
    assert row["imbalance_img_s"] is None and row["data_img_s"] is not None
    # the probe times eager compiled passes, not the replay its share was multiplied by
    assert row["comm_img_s"] is None
    assert row["note"] == (
        "comm, imbalance not measured (whole-step CUDA graph: the communication probe times "
        "eager passes, not the replay; whole-step CUDA graph: the busy phases are inside the "
        "replay): included in the residual"
    )
    # a baseline of a trainer before the per-rank times: both causes are named
    older = as_run(1, 36000.0, busy_time_ms_p50_by_rank="", cuda_graphs_mode="")
    [row] = analyze.waterfall([older, runs[1]])
    assert row["note"] == (
        "comm, imbalance not measured (runs without busy_time_ms_p50_by_rank; whole-step CUDA "
        "graph: the communication probe times eager passes, not the replay; whole-step CUDA "
        "graph: the busy phases are inside the replay): included in the residual"
    )
    # without the graph (cuda_graphs_mode compiled) the busy times are there, and no note
    timed = [as_run(n, x, cuda_graphs_mode="compiled", busy_time_ms_p50_by_rank=busy)
             for n, x, busy in ((1, 36000.0, "5.0"), (2, 64000.0, "5.0;5.5"))]  # fmt: skip
    [row] = analyze.waterfall(timed)
    assert row["imbalance_img_s"] is not None and row["note"] is None


def test_a_per_rank_list_with_a_rank_missing_is_blank_not_a_summary_of_fewer_ranks():
    # rank 1 recorded no times: the median and the slowest of the other ranks would be a guess
    # about it (with both ranks, as above: data 3 ms, imbalance 6 ms of the 25 ms loss)
    gap = run("w2", "weak", 2, 100, 1600, [7, 9], [50, 56], 0.08)
    gap["data_time_ms_mean_by_rank"] = "7.0;None"
    gap["busy_time_ms_p50_by_rank"] = "None;56.0"
    runs = [run("w1", "weak", 1, 100, 1000, [5], [50], 0.0), gap]
    [row] = analyze.waterfall(runs)
    assert row["data_img_s"] is None and row["imbalance_img_s"] is None
    assert row["comm_img_s"] == pytest.approx(160)
    assert row["residual_img_s"] == pytest.approx(240)  # the 400 img/s loss less comm's 160
    assert "data_time_ms_mean_by_rank" in row["note"] and "busy_time_ms_p50_by_rank" in row["note"]


def test_accumulating_runs_leave_comm_blank_not_counted_once_per_micro_batch():
    # the probe's share is of one synchronised micro-batch pass: with 4 passes per step, only
    # the last synchronising, 0.08 x T would count the exposed all-reduce about 4 times
    runs = [run("w1", "weak", 1, 100, 1000, [5], [50], 0.0), run("w2", "weak", 2, 100, 1600,
            [7, 9], [50, 56], 0.08)]  # fmt: skip
    for r in runs:
        r["accum_steps"] = "4"
    [row] = analyze.waterfall(runs)
    assert row["comm_img_s"] is None
    # data (32) and imbalance (96) as without accumulation; the rest of the 400 img/s remains
    assert (row["data_img_s"], row["imbalance_img_s"]) == (pytest.approx(32), pytest.approx(96))
    assert row["residual_img_s"] == pytest.approx(272)
    assert row["note"] == (
        "comm not measured (gradient accumulation: comm_exposed_frac is of one micro-batch "
        "pass, not a step): included in the residual"
    )


def test_comm_with_the_probe_off_is_said_to_be_off_not_a_missing_column():
    """train.comm_probe_steps 0: the trainer writes comm_exposed_frac null, the 1-rank run's
    too (trainer/loop.py). The note said "runs without comm_exposed_frac", as for the results of
    a trainer before the probe, which only rerunning them would give; the runs have the column,
    the probe was off. A baseline of such an older trainer beside them is still named."""
    runs = [run("w1", "weak", 1, 100, 1000, [5], [50], ""), run("w2", "weak", 2, 100, 1600,
            [7, 9], [50, 56], "")]  # fmt: skip
    for r in runs:
        r["comm_probe_steps"] = "0"
    [row] = analyze.waterfall(runs)
    assert row["comm_img_s"] is None
    # data (32) and imbalance (96) measured, the rest of the 400 img/s in the residual
    assert row["residual_img_s"] == pytest.approx(272)
    assert row["note"] == (
        "comm not measured (the communication probe was off: train.comm_probe_steps 0): "
        "included in the residual"
    )
    older = {k: v for k, v in runs[0].items() if k != "comm_exposed_frac"} | {
        "comm_probe_steps": "3"
    }
    [row] = analyze.waterfall([older, runs[1]])
    assert row["note"] == (
        "comm not measured (runs without comm_exposed_frac; the communication probe was off: "
        "train.comm_probe_steps 0): included in the residual"
    )


def test_a_family_at_one_world_size_has_no_rows():
    runs = [run("b1", "bucket", 2, 100, 1000, [5, 5], [50, 50], 0.1)]
    assert analyze.waterfall(runs) == []


# --- the diagnostic flags ------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1", "a:40", "1:0", "-1:40", "1:x"])
def test_a_malformed_slow_rank_is_one_clear_error(value):
    with pytest.raises(TrainConfigError, match="--diag-slow-rank must be R:MS"):
        TrainConfig(diag_slow_rank=value)


def test_a_slow_rank_beyond_the_world_is_refused_before_the_rendezvous(data_dir):
    denv = sdist.DistEnv("torchrun", 0, 2, 0, 2, 0, 1, "localhost", 29500)
    cfg = TrainConfig(dataset="synthetic", data_dir=str(data_dir), diag_slow_rank="2:40")
    with pytest.raises(TrainConfigError, match="rank 2 does not exist at world size 2"):
        preflight(cfg, denv)
    with pytest.raises(TrainConfigError, match="--diag-data-delay-ms must be >= 0"):
        TrainConfig(diag_data_delay_ms=-5)


def test_the_cli_prints_one_line_for_a_bad_slow_rank(data_dir, tmp_path):
    cmd = [PYTHON, "-m", "scalestudy", "train", "--diag-slow-rank", "1:40"]
    cmd += ["--dataset", "synthetic", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "rank 1 does not exist at world size 1" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- real runs with an injected cause ------------------------------------------------------------
@pytest.fixture(scope="module")
def injected(data_dir, tmp_path_factory):
    """Weak scaling at local batch 32: 1 rank (the baseline) and 2 ranks with each cause."""
    outs = {}
    for name, flags, nproc in (
        ("w1", (), 1),
        # 80 and 60 ms: each cause 2x (and more) any other part here; at 40 and 30 ms a run
        # sharing the 2 cores with other work once had more residual (slower compute) than data
        ("slow", ("--diag-slow-rank", "1:80"), 2),
        ("throttled", ("--diag-data-delay-ms", "60"), 2),
    ):
        outs[name] = tmp_path_factory.mktemp(name)
        train(data_dir, outs[name], "--limit-test", "64", *flags, nproc=nproc)
    return {name: read_metrics(out) for name, out in outs.items()}


def as_run(name: str, metrics: dict) -> dict:
    """runs.csv's row of a real run: the run-table columns the analysis groups by, then every
    metrics.json key as collect flattens it."""
    return {"run": name, "families": "weak", "bucket_cap_mb": "25"} | flatten(metrics)


def largest_part(injected, name):
    [row] = analyze.waterfall([as_run("w1", injected["w1"]), as_run(name, injected[name])])
    assert abs(row["check"]) < 1e-9
    parts = {p: row[f"{p}_img_s"] for p in PARTS}
    assert None not in parts.values(), row
    return max(parts, key=parts.get), row


@pytest.mark.serial  # per-rank wall-clock parts
def test_real_runs_record_the_flags_and_per_rank_times(injected):
    slow, throttled = injected["slow"], injected["throttled"]
    assert (slow["diag_slow_rank"], slow["diag_data_delay_ms"]) == ("1:80", 0.0)
    assert (throttled["diag_slow_rank"], throttled["diag_data_delay_ms"]) == (None, 60.0)
    assert injected["w1"]["diag_slow_rank"] is None  # off by default
    for m in injected.values():
        for key in ("step_time_ms_p50", "busy_time_ms_p50", "data_time_ms_p50"):
            assert len(m[f"{key}_by_rank"]) == m["world_size"]
            assert all(v > 0 for v in m[f"{key}_by_rank"])
        assert m["busy_phases"] == "data+forward"  # DDP (measure.BUSY_PHASES)
        # one definition of a p50: rank 0's entry is step_time_ms_p50 itself
        assert m["step_time_ms_p50_by_rank"][0] == m["step_time_ms_p50"]
    # rank 1 sleeps 80 ms per step in its forward phase: its busy time shows it, its whole step
    # time does not (rank 0 waits for it inside backward)
    busy = slow["busy_time_ms_p50_by_rank"]
    assert busy[1] - busy[0] > 70
    steps = slow["step_time_ms_p50_by_rank"]
    assert abs(steps[1] - steps[0]) < 10
    # every rank sleeps 60 ms in its data phase: in every step, so in the median and the mean
    assert min(throttled["data_time_ms_p50_by_rank"]) >= 60
    assert min(throttled["data_time_ms_mean_by_rank"]) >= 60
    for m in injected.values():
        means = m["data_time_ms_mean_by_rank"]
        assert len(means) == m["world_size"] and all(v > 0 for v in means)


@pytest.mark.serial  # per-rank wall-clock parts
def test_a_slow_rank_lands_in_imbalance(injected):
    part, row = largest_part(injected, "slow")
    assert part == "imbalance", row


@pytest.mark.serial  # per-rank wall-clock parts
def test_a_throttled_input_lands_in_data_wait(injected):
    part, row = largest_part(injected, "throttled")
    assert part == "data", row
