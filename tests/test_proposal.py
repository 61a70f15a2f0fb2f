"""The allocation proposal (results/proposal.py): proposal.csv, then proposal.md/.tex and
slides.tex from CSV cells only, on studies built here: the run table of a real study config, its
runs given measured numbers (a chosen efficiency per world size), then the real `scalestudy
analyze` and `scalestudy proposal` (no GPU, no training: the proposal reads CSVs only).

- demo-like: config/demo.yaml (strong 1, 2, 4; one repeat) -> the thin-evidence wording, and
  the runs that would fix it priced by the planner
- strong: 1, 2, 4, 8 ranks, 3 repeats, E_s 1, 0.9, 0.8, 0.6 -> chosen 4 (8 is below 0.7)
"""

from __future__ import annotations

import copy
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from workflow_helpers import REPO, child_env, fsync_fails_at_file, write_config

from scalestudy import cli, files
from scalestudy.errors import AnalysisError
from scalestudy.results import build_pdf as latex
from scalestudy.results import proposal
from scalestudy.results import render_report as report
from scalestudy.study import estimate, plan
from scalestudy.study.config import load_and_validate
from scalestudy.study.estimate import estimate_runs, load_measured
from scalestudy.study.runs import RUN_COLUMNS, build_run_table, placement

DEMO = REPO / "config" / "demo.yaml"
# strong-scaling efficiency of the made-up measurements, per world size
EFFICIENCY = {1: 1.0, 2: 0.9, 4: 0.8, 8: 0.6}
PER_RANK = 400.0  # images/s of one rank (the demo measured 475-595 on CPU)


def measured_runs(config: dict) -> list[dict]:
    """Every run of the study with measurements: X = 400 w E(w) (+-1% over repeats)."""
    out = []
    for row in build_run_table(config):
        w = row["world_size"]
        x = PER_RANK * w * EFFICIENCY.get(w, 0.5) * (1 + 0.01 * (row["repeat"] - 1))
        per_epoch = row["limit_train"] or 50_000  # 0: CIFAR-10's whole training set
        images = row["epochs"] * per_epoch
        out.append(
            {
                **row,
                "throughput_img_s": x,
                "throughput_img_s_per_rank": x / w,
                "epoch_time_s": per_epoch / x,
                "train_time_s": images / x,
                "final_val_acc": 0.9,
                "comm_exposed_frac": 0.1,
                "gpu_util_mean": "",
                "energy_j_per_img": "",
                "steps_per_epoch": per_epoch // row["global_batch"],
                "device_name": "cpu (made-up measurements)",
                "git_commit": "0123abc",
            }
        )
    return out


def build(
    tmp_path: Path, *overrides: str, missing=lambda row: False, digest: str = ""
) -> tuple[dict, Path]:
    """A study with measurements and its analysis CSVs; returns (config, study dir). `missing`:
    the runs of the run table that have no measurement (not run yet, or failed); `digest`: the
    container image digest every run recorded (blank: none, as outside the container)."""
    config = load_and_validate(DEMO, overrides=list(overrides))
    study = tmp_path / "study"
    runs = [{**r, "container_digest": digest} for r in measured_runs(config) if not missing(r)]
    files.write_csv(
        study / "results/csv/runs.csv", [*RUN_COLUMNS, *runs[0].keys() - set(RUN_COLUMNS)], runs
    )
    files.write_csv(study / "results/csv/epochs.csv", ["run", "epoch", "val_acc"], [])
    assert cli.main(
        [
            "analyze",
            "--runs", str(study / "results/csv/runs.csv"),
            "--out-dir", str(study / "results/csv"),
            "--html-dir", str(study / "results/tables"),
            "--gpus-per-node", str(config["hardware"]["gpus_per_node"]),
            "--study", config["study"],
        ]
    ) == 0  # fmt: skip
    return config, study


def write(config: dict, study: Path, model_csv: str = "absent.csv") -> dict[str, str]:
    proposal.write_proposal(
        config,
        study / "results/csv",
        study / "reports",
        REPO / "workflow/report",
        study / model_csv,
        study / "results/csv/runs.csv",
        study / "benchmarks/train",
    )
    return {name: (study / "reports" / name).read_text() for name in proposal.DOCUMENTS}


def read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def cells(study: Path) -> dict:
    out: dict = {}
    for r in read(study / "results/csv/proposal.csv"):
        out.setdefault((r["section"], r["item"]), {})[r["quantity"]] = r["value"]
    return out


STRONG = ("families.strong.gpus=[1,2,4,8]", "repeats=3")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    config, study = build(tmp_path_factory.mktemp("demo"))
    return config, study, write(config, study)


@pytest.fixture(scope="module")
def strong(tmp_path_factory):
    config, study = build(tmp_path_factory.mktemp("strong"), *STRONG)
    return config, study, write(config, study)


def test_thin_evidence_is_said_and_the_next_runs_are_priced(demo):
    _, study, docs = demo
    c = cells(study)
    assert c[("evidence", "thin")] == {
        "few_world_sizes": "yes",
        "no_repeats": "yes",
        "chosen_unmeasured": "no",
    }
    # the next world size is 2 x 4 = 8 ranks (2 nodes of 4), 3 repeats, and the missing repeats
    assert c[("next", "new world size 8")]["world_size"] == "8"
    (new,) = [r for r in read(study / "results/csv/proposal.csv") if r["section"] == "next"]
    assert new["source"] == f"4 x 2 ({proposal.DOUBLED})"
    nxt = c[("request", "next runs (new world sizes), 2 nodes")]
    assert (nxt["runs"], nxt["nodes"]) == ("3", "2")
    assert c[("request", "next runs (repeats), 1 node")]["runs"] == "6"  # 3 sizes x 2 repeats
    for name, text in docs.items():
        assert "thin" in text.lower(), name
        assert "The evidence meets the bar" not in text, name
    assert "only 3 world sizes were measured" in docs["proposal.md"]
    assert "some points ran 1 time(s) only" in docs["proposal.md"]
    assert "| next runs (new world sizes), 2 nodes | 3 |" in docs["proposal.md"]


def request_runs(study: Path, prefix: str) -> int:
    """The runs of the request rows whose label starts with `prefix`."""
    return sum(
        int(v["runs"])
        for (s, i), v in cells(study).items()
        if s == "request" and i.startswith(prefix)
    )


@pytest.mark.parametrize("missing", ["world size", "repeats"])
def test_a_run_of_the_study_not_measured_yet_is_priced_once(tmp_path, missing):
    """A run of the study's own table without a measurement (not run yet, or failed) is priced
    in its "scaling study" rows: the next runs priced it again (the configured 8 ranks as a
    "new" world size, 3 runs beside the study's 1; the failed repeats as "next runs
    (repeats)")."""
    if missing == "world size":  # strong 1, 2, 4, 8 configured, one repeat; 8 not run yet
        overrides, gone = ("families.strong.gpus=[1,2,4,8]",), lambda r: r["world_size"] == 8
    else:  # 3 repeats; 2 of the 2-rank strong run failed
        overrides = STRONG
        gone = lambda r: r["world_size"] == 2 and "strong" in r["families"] and r["repeat"] > 0  # noqa: E731
    config, study = build(tmp_path, *overrides, missing=gone)
    docs = write(config, study)
    c = cells(study)
    assert not [k for k in c if k[0] == "next"]  # 8 ranks is configured: no new world size
    assert request_runs(study, "next runs (new world sizes)") == 0
    assert request_runs(study, "scaling study") == len(build_run_table(config))
    if missing == "world size":  # the repeats still to add: r1, r2 of 1, 2, 4 and 8 ranks
        assert request_runs(study, "next runs (repeats)") == 8
    else:  # the failed repeats are the study's own runs: nothing to add
        assert request_runs(study, "next runs") == 0
    assert "new world sizes: 8" not in docs["proposal.md"]


def test_the_repeats_per_configuration_are_those_the_evidence_table_counts(tmp_path):
    """3 repeats configured, 2 of the 2-rank strong run failed: the documents said "3 repeat(s)
    per configuration" (the distinct repeat indices of all runs) beside an evidence table with
    n = 1 at 2 ranks. They say the fewest and most repeats a measured configuration has."""
    gone = lambda r: r["world_size"] == 2 and "strong" in r["families"] and r["repeat"] > 0  # noqa: E731
    config, study = build(tmp_path, *STRONG, missing=gone)
    n = [int(r["n"]) for r in read(study / "results/csv/scaling.csv")]
    assert (min(n), max(n)) == (1, 3)  # the case at hand
    docs = write(config, study)
    docs.update(report_documents(study))  # study.md and paper.tex say it alike
    for name, text in docs.items():
        text = " ".join(text.split())
        assert "1 to 3 repeats per configuration" in text, name
        assert "3 repeat(s) per configuration" not in text, name
    # every configuration repeated alike: one count, singular after 1
    config, study = build(tmp_path / "once")
    assert {r["n"] for r in read(study / "results/csv/scaling.csv")} == {"1"}
    for name, text in {**write(config, study), **report_documents(study)}.items():
        assert "1 repeat per configuration" in " ".join(text.split()), name


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "allreduce"])
def test_every_document_names_the_strategy_the_runs_recorded(tmp_path, strategy):
    """train.strategy fsdp or allreduce, which system.csv records: study.md, paper.tex,
    proposal.md/.tex, slides.tex and the proposal's default objectives all said "PyTorch DDP".
    Each names system.csv's strategy by vocab.STRATEGY_NAMES, and no other strategy."""
    from scalestudy import vocab

    # the bucket family sweeps DDP's buckets: a study of another strategy has none
    config, study = build(tmp_path, f"train.strategy={strategy}", "families.bucket.enabled=false")
    docs = {**write(config, study), **report_documents(study)}
    system = {(r["section"], r["key"]): r["value"] for r in read(study / "results/csv/system.csv")}
    recorded = system[("run settings", "strategy")]
    assert recorded == strategy  # the case at hand: what the runs recorded
    name = vocab.STRATEGY_NAMES[recorded]
    others = [n for s, n in vocab.STRATEGY_NAMES.items() if s != recorded]
    others += ["PyTorch DDP", "DistributedDataParallel"] if strategy != "ddp" else []
    for doc, text in docs.items():
        flat = " ".join(text.split())
        said = report.tex_escape(name) if doc.endswith(".tex") else name
        assert said in flat, (doc, said)
        for other in others:
            assert other not in flat and report.tex_escape(other) not in flat, (doc, other)
    assert name in cells(study)[("text", "objectives")]["text"]


def report_documents(study: Path) -> dict[str, str]:
    """study.md and paper.tex of the study's analysis CSVs (and its model.csv), as
    render-report fills them."""
    csv_dir = study / "results/csv"
    assert cli.main(["model", "--runs", str(csv_dir / "runs.csv"), "--out-dir", str(csv_dir)]) == 0
    return report.render(study / "results/csv", REPO / "workflow/report", [], "plots")


def test_each_new_world_size_is_its_own_cell(tmp_path):
    """One strong size measured: 8, 16 and 32 ranks are new, and proposal.csv had three rows
    keyed (next, new world size, world_size), so a lookup by key saw only the last."""
    config, study = build(tmp_path, "families.strong.gpus=[4]", "repeats=3")
    docs = write(config, study)
    rows = read(study / "results/csv/proposal.csv")
    keys = [(r["section"], r["item"], r["quantity"]) for r in rows]
    assert len(keys) == len(set(keys))
    c = cells(study)
    sizes = [c[("next", f"new world size {w}")]["world_size"] for w in (8, 16, 32)]
    assert sizes == ["8", "16", "32"]
    assert "new world sizes: 8, 16, 32)" in docs["proposal.md"]


def test_thin_evidence_with_no_run_to_add_does_not_say_the_next_runs_are_asked_for(tmp_path):
    """Strong 1, 2, 4 ranks at a global batch of 4, 3 repeats: no other world size fits, and
    every repeat ran, so no next run is priced; the documents said the next runs "are part of
    the request" and "are in the ask" all the same."""
    config, study = build(tmp_path, "families.strong.global_batch=4", "repeats=3")
    docs = write(config, study)
    c = cells(study)
    assert c[("evidence", "thin")]["few_world_sizes"] == "yes"
    assert not any(i.startswith("next runs") for s, i in c if s == "request")
    for name, text in docs.items():
        flat = " ".join(text.split())
        for claim in ("runs are part of the request", "next runs are in the ask", "First: the"):
            assert claim not in flat, (name, claim)
        assert "until the runs named" not in flat, name
    md = " ".join(docs["proposal.md"].split())
    assert "no other world size" in md and "No run to add is part of the request." in md
    assert "no run to add could be priced" in docs["slides.tex"]


def test_a_smaller_world_size_is_a_next_run_when_no_larger_one_fits(tmp_path):
    """Strong 8, 16, 32 ranks at a global batch of 32: 64 ranks would get half an image each,
    so 4 ranks (half the smallest) is the world size to add; none was priced."""
    config, study = build(
        tmp_path,
        "families.strong.gpus=[8,16,32]",
        "report.targets.strong_efficiency_gpus=16",
        "repeats=3",
    )
    docs = write(config, study)
    rows = [r for r in read(study / "results/csv/proposal.csv") if r["section"] == "next"]
    assert [(r["item"], r["value"], r["source"]) for r in rows] == [
        ("new world size 4", "4", f"8 / 2 ({proposal.HALVED})")
    ]
    assert request_runs(study, "next runs (new world sizes), 1 node") == 3
    assert "new world sizes: 4)" in docs["proposal.md"]
    assert "These runs are part of the request below." in docs["proposal.md"]


def test_each_new_world_size_names_its_factor(tmp_path):
    """A study that measured 1 rank only: the next runs double to 2, 4 and 8 ranks, and
    proposal.csv's source cell of each said "2 x the largest"; it names the factor. An odd
    smallest size halves with rounding down (3 -> 1), said so."""
    config, study = build(tmp_path / "one", "families.strong.gpus=[1]")
    write(config, study)
    rows = [r for r in read(study / "results/csv/proposal.csv") if r["section"] == "next"]
    assert [(r["value"], r["source"]) for r in rows] == [
        (str(w), f"1 x {w} ({proposal.DOUBLED})") for w in (2, 4, 8)
    ]
    config, study = build(
        tmp_path / "odd",
        "families.strong.gpus=[3,6,12]",
        "families.strong.global_batch=12",
        "report.targets.strong_efficiency_gpus=6",
        "hardware.gpus_per_node=12",
        "repeats=3",
    )
    write(config, study)
    rows = [r for r in read(study / "results/csv/proposal.csv") if r["section"] == "next"]
    assert ("1", f"3 / 2, rounded down ({proposal.HALVED})") in [
        (r["value"], r["source"]) for r in rows
    ], rows


@pytest.mark.parametrize("where", ["next runs", "the study's own runs"])
def test_a_larger_scale_in_the_request_is_not_said_to_be_unasked(demo, tmp_path, where):
    """E_s stays at or above the threshold up to the largest size measured (4 ranks): the documents
    said a larger scale "is not asked for" while the request priced 8 ranks, as next runs (the
    demo) or as the study's own runs not measured yet (8 configured, not run)."""
    if where == "next runs":
        _, study, docs = demo
    else:
        overrides = ("families.strong.gpus=[1,2,4,8]",)
        config, study = build(tmp_path, *overrides, missing=lambda r: r["world_size"] == 8)
        docs = write(config, study)
    assert ("scale", "first below") not in cells(study)
    for name in ("proposal.md", "proposal.tex"):
        flat = " ".join(docs[name].split())
        assert "not asked for" not in flat, name
        assert f"the request prices runs at 8 ranks ({where}" in flat, name
        # the bar is E_s >= threshold: "above" alone was wrong for an E_s exactly at it
        assert "stays at or above the threshold up to the largest" in flat, name


def test_every_gpu_shape_has_its_own_request_row(tmp_path):
    """On GPUs, 1, 2 and 4 GPUs all fit one node: each shape keeps its own row (a label shared
    by two shapes kept only the last one in the documents, whose rows then did not add up to
    the subtotal)."""
    config, study = build(tmp_path, *STRONG, "hardware.device=cuda")
    docs = write(config, study)
    rows = [r for r in read(study / "results/csv/proposal.csv") if r["section"] == "request"]
    keys = [(r["item"], r["quantity"]) for r in rows]
    assert len(keys) == len(set(keys))
    items = {r["item"] for r in rows}
    assert {"scaling study, 1 GPU on 1 node", "scaling study, 2 GPUs on 1 node"} <= items
    assert "scaling study, 8 GPUs on 2 nodes" in items
    c = cells(study)
    node_h = sum(float(c[("request", item)]["node_hours"]) for item in items)
    assert node_h == pytest.approx(float(c[("total", "subtotal")]["node_hours"]), rel=1e-6)
    for item in items:
        assert f"| {item} |" in docs["proposal.md"]


@pytest.mark.parametrize("repeats", [1, 2])
def test_the_repeats_bar_in_proposal_csv_is_the_one_the_evidence_is_judged_against(
    tmp_path, repeats
):
    """proposal.csv's ("evidence", "bar", "repeats") held the repeats of the next runs (3),
    while the evidence was judged against 2: a study with 2 repeats per point "met the bar"
    beside a cell stating a bar of 3. The cell is the bar applied; the next runs' repeats have
    their own cell, and the runs priced to fix thin evidence repeat that often."""
    config, study = build(tmp_path, "families.strong.gpus=[1,2,4,8]", f"repeats={repeats}")
    docs = write(config, study)
    c = cells(study)
    has = int(c[("evidence", "strong family")]["min_repeats"])
    bar = int(c[("evidence", "bar")]["repeats"])
    assert has == repeats
    assert (c[("evidence", "thin")]["no_repeats"] == "yes") == (has < bar), (has, bar)
    if has < bar:  # thin: the bar is said, and the next runs bring each point to their repeats
        nxt = int(c[("evidence", "runs to add")]["repeats"])
        assert nxt >= bar
        assert request_runs(study, "next runs (repeats)") == 4 * (nxt - has)
        for name in ("proposal.md", "proposal.tex"):
            text = " ".join(docs[name].split())
            assert f"(the bar: {bar} or more runs per point)" in text, name
            assert f"priced by the planner (each {nxt} repeats" in text, name
    else:
        md = " ".join(docs["proposal.md"].split())
        assert f"4 world sizes, each with at least {has} repeats" in md


def test_strong_evidence_chooses_the_knee(strong):
    _, study, docs = strong
    c = cells(study)
    assert set(c[("evidence", "thin")].values()) == {"no"}
    # E_s(4) = 0.8 >= 0.7, E_s(8) = 0.6 < 0.7: the production scale is 4 ranks on one node
    assert c[("scale", "chosen")]["world_size"] == "4"
    assert c[("scale", "first below")]["world_size"] == "8"
    assert not any(item.startswith("next runs") for _, item in c)
    for name in ("proposal.md", "proposal.tex"):
        text = docs[name]
        assert "The evidence meets the bar: 4 world sizes, each with at least 3 repeats" in text
        assert "thin" not in text.lower()
        assert re.search(r"falls to 60\.\d", text)
    assert "| production at 4 ranks | 3 |" in docs["proposal.md"]
    # E_s's spread is in percent as E_s: its header says so (a bare "std" beside images/s' std)
    assert "| efficiency E_s | std (%) |" in docs["proposal.md"]
    assert "$E_s$ (\\%) & std (\\%)" in docs["proposal.tex"]
    # a measured scale, not the baseline: the slides give its E_s with its n
    slides = " ".join(docs["slides.tex"].split())
    assert "Chosen: 4 ranks (1 node), $E_s$ = 80.0\\,\\% ($n$ = 3)" in slides
    assert "by definition" not in slides


def test_a_fall_between_efficient_scales_is_said_and_is_no_knee(tmp_path, monkeypatch):
    """E_s below the threshold at 2 ranks and above it again at 4: the rule takes the first
    fall (every smaller scale must hold the threshold), so production is the baseline, and
    the documents called the fall "the knee, past which more ranks buy less" without a word
    of the efficient scale measured past it."""
    monkeypatch.setitem(EFFICIENCY, 2, 0.65)
    config, study = build(tmp_path, *STRONG, "proposal.style=ncar")
    docs = write(config, study)
    c = cells(study)
    assert c[("scale", "chosen")]["world_size"] == "1"
    assert c[("scale", "first below")]["world_size"] == "2"
    assert c[("scale", "above again")]["world_size"] == "4"  # 0.8; 8's 0.6 is below again
    md, tex = (" ".join(docs[n].split()) for n in ("proposal.md", "proposal.tex"))
    assert "At 4 ranks E_s is at or above the threshold again (80.0%, n = 3)" in md
    assert "so the fall at 2 ranks decides; more repeats there tell whether it is noise" in md
    assert "At 4 ranks $E_s$ is at or above the threshold again (80.0\\,\\%, $n$ = 3)" in tex
    for text in (md, tex):
        assert "falls to 65.0" in text and "knee" not in text  # nor in ncar's heading
    # without a fall back above the threshold, the knee stays named (ncar)
    monkeypatch.setitem(EFFICIENCY, 2, 0.9)
    config, study = build(tmp_path / "knee", *STRONG, "proposal.style=ncar")
    docs = write(config, study)
    assert ("scale", "above again") not in cells(study)
    assert "this is the knee" in docs["proposal.md"]
    assert "## Justification of the production scale (the knee)" in docs["proposal.md"]
    # a blank E_s at the first fall (a hand-edited scaling.csv) is no fall to call noise
    points = [{"w": 1, "e": 1.0}, {"w": 2, "e": None}, {"w": 4, "e": 0.8}]
    chosen, below = proposal.choose_scale(points, 0.7)
    assert below["w"] == 2 and proposal.above_again(points, below, 0.7) is None
    points[1]["e"] = 0.6
    assert proposal.above_again(points, below, 0.7)["w"] == 4
    assert "above the threshold again" not in docs["proposal.md"]


def test_an_efficiency_near_the_threshold_is_printed_apart_from_it(tmp_path, monkeypatch):
    """E_s 0.6996 against 0.7 printed "falls to 70.0%, below the threshold" of "at least
    70.0%"; the chosen scale's 0.70004 the same 70.0%: each has the digits that tell it apart
    (render_report.fmt_pct_apart, as the paper's verdicts)."""
    monkeypatch.setitem(EFFICIENCY, 4, 0.70004)
    monkeypatch.setitem(EFFICIENCY, 8, 0.6996)
    config, study = build(tmp_path, *STRONG)
    docs = write(config, study)
    c = cells(study)
    assert c[("scale", "chosen")]["world_size"] == "4"
    assert c[("scale", "first below")]["world_size"] == "8"
    md, tex, slides = (" ".join(docs[n].split()) for n in proposal.DOCUMENTS)
    assert "E_s of at least 70.0%" in md and "falls to 69.96%, below the threshold" in md
    assert "measured E_s 70.004% (n = 3)" in md and "| 69.96% |" in md
    assert "falls to 69.96\\,\\%" in tex and "measured $E_s$ 70.004\\,\\%" in tex
    assert "$E_s$ = 70.004\\,\\%" in slides
    for text in (md, tex, slides):
        assert not re.search(r"(E_s\$?|falls to|=) 70\.0\b", text)


@pytest.mark.parametrize("epochs", [None, 300])
def test_the_printed_energy_rows_add_up_to_the_printed_total(tmp_path, monkeypatch, epochs):
    """GPU kWh per request row printed to 3 digits (0.000557, ...) summed to 0.002285, not the
    printed total 0.00229; they print as their cells now, and the total is their exact sum.
    Each row is its runs' kWh rounded up to 3 significant digits, like hours (printed to 12
    digits, 0.0005534507305 kWh, they claimed a precision no J/img measurement has)."""
    measured = measured_runs

    def with_energy(config):  # J/img measured, a little higher on more GPUs
        return [
            dict(
                r,
                energy_j_per_img=0.0537 * (1 + 0.013 * r["world_size"]) ** 0.5,
                device_name="H100",
            )
            for r in measured(config)
        ]

    monkeypatch.setattr(sys.modules[__name__], "measured_runs", with_energy)
    more = () if epochs is None else (f"proposal.production.epochs={epochs}",)
    config, study = build(tmp_path, *STRONG, "hardware.device=cuda", *more)
    docs = write(config, study)
    table = md_table(docs["proposal.md"], "| experiment | runs |")
    kwh = [Decimal(r[7]) for r in table[:-3] if r[7] != "not estimated"]
    [total] = [Decimal(r[7]) for r in table if r[0] == "request"]
    assert len(kwh) == 5 and sum(kwh) == total
    for x in kwh:
        assert len(x.normalize().as_tuple().digits) <= 3, x
    # the rounding is up, from the members' sum
    Est = type("Est", (), {"nodes": 1, "gpus": 2, "runtime_s": 600.0, "held_s": 600.0})
    members = [Est(), Est()]
    members[0].energy_kwh, members[1].energy_kwh = 0.000276725, 0.00027672536
    [energy] = [r for r in proposal.request_rows("x", members, "s") if r["unit"] == "kWh"]
    assert energy["value"] == "0.000554"
    for name in ("proposal.tex", "slides.tex"):
        assert f" {report.fmt_exact(total)}" in docs[name], name
    # beside the GPU-hours (with contingency and profiling) the slides said only "GPU energy:
    # ... kWh", read as of the same scope
    kwh_total = f"GPU energy: {report.fmt_exact(total)} kWh (training runs only: no contingency"
    assert kwh_total in docs["slides.tex"]
    tables = report.load_tables(study / "results/csv", report.ANALYSIS_TABLES)
    tables["proposal"] = read(study / "results/csv/proposal.csv")
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, tables) == [], name
    # each planner row says what its J/img is over; all over the training spans here, so the
    # documents name no row as including the evaluations
    c = cells(study)
    energy = {i: q["energy_basis"] for (s, i), q in c.items() if s == "request" and "basis" in q}
    assert energy and all(b == "run" for b in energy.values()), energy  # each run's own J/img
    assert "checkpoints between its epochs included" not in docs["proposal.md"]


def test_the_proposal_names_the_rows_whose_kwh_include_the_evaluations(tmp_path, monkeypatch):
    """Runs whose training spans were too short for the counter are priced from their wall
    span's J/img (the evaluations between the window's epochs in it): proposal.csv's
    energy_basis and the documents said only "from the measured J/img"."""
    measured = measured_runs

    def wall_at(walled):  # the runs walled(run) picks measured over the wall span only
        def runs(config):
            return [
                dict(r, device_name="H100")
                | (  # both columns in every row: runs.csv takes the first run's
                    {"energy_j_per_img": "", "energy_wall_j_per_img": 0.06}
                    if walled(r)
                    else {"energy_j_per_img": 0.05, "energy_wall_j_per_img": ""}
                )
                for r in measured(config)
            ]

        return runs

    wall = "evaluation included"  # estimate.WITH_EVALUATION, after the level (", ")
    cases = [
        (lambda r: True, "every"),
        (lambda r: r["world_size"] == 2, "some"),
        # 1 GPU's strong runs, not its weak ones: that row is over the wall span for some of its
        # runs only, and was named as over it for all (or, every row so, the whole total)
        (lambda r: r["world_size"] == 2 or r["run"].startswith("w1_lb32"), "mixed"),
    ]
    for walled_run, shown in cases:
        monkeypatch.setattr(sys.modules[__name__], "measured_runs", wall_at(walled_run))
        config, study = build(tmp_path / shown, *STRONG, "hardware.device=cuda")
        docs = write(config, study)
        c = cells(study)
        items = [i for (s, i), q in c.items() if s == "request" and "energy_basis" in q]
        bases = {i: c[("request", i)]["energy_basis"].split("; ") for i in items}
        walled = [i for i in items if all(wall in b for b in bases[i])]
        partly = [i for i in items if i not in walled and any(wall in b for b in bases[i])]
        said = "from the measured J/img, over the window's wall span, the evaluations and "
        said += "checkpoints between its epochs included"
        if shown == "every":
            assert walled == items and not partly, bases
            said += ")"
        elif shown == "some":
            assert walled and len(walled) < len(items) and not partly, bases
            said += f", for: {'; '.join(walled)}, and over the training spans for the rest)"
        else:
            assert walled and partly and len(walled) + len(partly) < len(items), bases
            said += f", for: {'; '.join(walled)}; and for some of the runs of: "
            said += f"{'; '.join(partly)}, and over the training spans for the rest)"
        assert said in docs["proposal.md"], shown
        assert said in docs["proposal.tex"], shown


@pytest.mark.parametrize("which", ["demo", "strong"])
@pytest.mark.parametrize("name", list(proposal.DOCUMENTS))
def test_every_number_is_a_csv_cell(request, which, name):
    _, study, docs = request.getfixturevalue(which)
    tables = report.load_tables(study / "results/csv", report.ANALYSIS_TABLES)
    tables["proposal"] = read(study / "results/csv/proposal.csv")
    text = docs[name]
    assert report.numbers_backed_by_csvs(text, tables) == []
    total = report.fmt_exact(cells(study)[("total", "request")]["node_hours"])
    assert total in text
    assert report.numbers_backed_by_csvs(text + " 93.37", tables) == ["93.37"]  # the check bites


@pytest.mark.parametrize("which", ["demo", "strong"])
def test_the_request_recomputes_from_its_own_table(request, which):
    config, study, _ = request.getfixturevalue(which)
    c = cells(study)
    rows = [v for (section, _), v in c.items() if section == "request"]
    subtotal = 0.0
    for r in rows:
        # node-hours = runs x hours per run x nodes, from the printed cells
        node_h = float(r["runs"]) * float(r["hours_per_run"]) * float(r["nodes"])
        assert float(r["node_hours"]) == pytest.approx(node_h, rel=1e-9)
        assert float(r["hours_per_run"]) == float(report.fmt_num(r["hours_per_run"]))
        subtotal += node_h
    fraction = float(c[("total", "contingency")]["fraction"])
    assert fraction == config["plan"]["contingency"]  # proposal.contingency: null -> the plan's
    total = float(c[("total", "request")]["node_hours"])
    assert total == pytest.approx(subtotal * (1 + fraction), rel=1e-9)
    # the production row is the planner's estimate of `runs` runs at the chosen scale
    w = c[("scale", "chosen")]["world_size"]
    prod = next(
        v for (s, i), v in c.items() if s == "request" and i.startswith(f"production at {w} ")
    )
    assert prod["runs"] == str(config["proposal"]["production"]["runs"])
    # ... priced by the planner at that scale: the study config reduced, here by hand, to
    # `runs` strong-scaling repeats at w (no profiling, production epochs: train.epochs while
    # proposal.production.epochs is null), as test_scaling_study_rows_are_the_planners_estimates
    # holds the study rows to the planner's estimates
    from scalestudy.study.estimate import estimate_runs, load_measured

    runs = config["proposal"]["production"]["runs"]
    assert config["proposal"]["production"]["epochs"] is None
    alone = copy.deepcopy(config)
    for family in alone["families"].values():
        family["enabled"] = False
    alone["families"]["strong"].update(enabled=True, gpus=[int(w)])
    alone["profiling"]["enabled"], alone["repeats"] = False, runs
    # on the whole training and test sets: the demo measures on train.limit_train 2048 of
    # CIFAR-10's 50,000 images, and production was priced on those 2048, 20x too low
    assert config["train"]["limit_train"] and config["train"]["limit_test"]
    alone["train"] |= {"limit_train": 0, "limit_test": 0}
    estimates = estimate_runs(
        alone, build_run_table(alone), load_measured(study / "results/csv/runs.csv")
    )
    n_train = c[("production", "run")]["train_images_per_epoch"]
    assert int(n_train) == estimate.dataset_sizes(alone, build_run_table(alone)[0])[0]
    text = " ".join(request.getfixturevalue(which)[2]["proposal.md"].split())
    assert f"(the whole training set, in whole global batches: {n_train} images per epoch)" in text
    assert len(estimates) == runs and {e.world_size for e in estimates} == {int(w)}
    hours = sum(e.runtime_s for e in estimates) / runs / 3600  # rounded up to 3 digits
    assert hours <= float(prod["hours_per_run"]) <= hours * 1.01
    assert prod["nodes"] == str(estimates[0].nodes)
    assert estimates[0].nodes == -(-int(w) // config["hardware"]["gpus_per_node"])  # whole nodes


def test_scaling_study_rows_are_the_planners_estimates(strong):
    """Summed over the study's rows, hours x runs covers the planner's own total (rounded up)."""
    from scalestudy.study.estimate import estimate_runs, load_measured

    config, study, _ = strong
    estimates = estimate_runs(
        config, build_run_table(config), load_measured(study / "results/csv/runs.csv")
    )
    planned = sum(e.node_hours for e in estimates)
    c = cells(study)
    asked = sum(
        float(v["node_hours"])
        for (s, i), v in c.items()
        if s == "request" and i.startswith("scaling study")
    )
    assert planned <= asked <= planned * 1.01


def test_styles_periods_and_ercap_node_counts(tmp_path):
    config, study = build(tmp_path, *STRONG, "proposal.style=archer2", "proposal.total_months=12")
    docs = write(config, study)
    c = cells(study)
    # archer2: 6-month periods unless period_months is set, each half of the request
    assert [c[("period", f"period {i}")]["months"] for i in (1, 2)] == ["6", "6"]
    months = [r for r in read(study / "results/csv/proposal.csv") if r["quantity"] == "months"]
    # from ARCHER2's periods, not the null proposal.period_months the cells named
    assert {r["source"] for r in months if r["section"] == "period"} == {
        "ARCHER2's 6-month periods (proposal.period_months null)"
    }
    half = float(c[("total", "request")]["node_hours"]) / 2
    assert float(c[("period", "period 1")]["node_hours"]) == pytest.approx(half)
    assert (
        "Science case" in docs["proposal.md"]
        and "Speedup is against the smallest" in docs["proposal.md"]
    )
    config = load_and_validate(
        DEMO, overrides=[*STRONG, "proposal.style=ercap", "proposal.period_months=5"]
    )
    docs = write(config, study)
    c = cells(study)
    assert [c[("period", f"period {i}")]["months"] for i in (1, 2, 3)] == ["5", "5", "2"]
    rows = read(study / "results/csv/proposal.csv")
    sources = [r["source"] for r in rows if (r["section"], r["quantity"]) == ("period", "months")]
    assert sources == [
        *["proposal.period_months"] * 2,
        "proposal.total_months - the earlier periods",
    ]
    assert c[("ercap", "nodes")]["max"] == "2"  # the 8-rank scaling runs, 2 nodes of 4
    assert "Maximum node count: 2" in docs["proposal.md"]
    # the periods and the slides' total print the request's cells exactly, as its table does:
    # rounded, the periods need not add up to it and the slides' total was below it
    exact = report.fmt_exact(c[("period", "period 1")]["node_hours"])
    assert exact != report.fmt_num(c[("period", "period 1")]["node_hours"])
    for name in ("proposal.md", "proposal.tex", "slides.tex"):
        assert f"{exact} node-hours" in docs[name] or f" {exact} " in docs[name], name


def md_table(text: str, head: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header starts with `head`, cell by cell."""
    table = text[text.index(head) :]
    lines = table[: table.index("\n\n")].splitlines()[2:]
    return [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in lines]


@pytest.mark.parametrize(
    "overrides",
    [
        ("proposal.contingency=0.0833333333333",),  # 1/12: its product has more digits
        ("proposal.total_months=7", "proposal.period_months=2"),  # 2/7 of the request
    ],
)
def test_the_printed_contingency_and_periods_add_up_to_the_printed_request(tmp_path, overrides):
    """Summed as printed, to the last digit: subtotal + contingency was more than the request
    (each a float rounded to 12 digits: 0.45064 + 0.0375533333333 > 0.488193333333), and the
    periods, each rounded on its own, less than it."""
    config, study = build(tmp_path, *STRONG, *overrides)
    docs = write(config, study)
    c = cells(study)
    rows = {r[0]: Decimal(r[4]) for r in md_table(docs["proposal.md"], "| experiment | runs |")}
    [contingency] = [v for k, v in rows.items() if k.startswith("contingency")]
    assert rows["subtotal"] + contingency == rows["request"]
    fraction = Decimal(c[("total", "contingency")]["fraction"])
    assert contingency >= rows["subtotal"] * fraction  # rounded up, never below its share
    if "proposal.period_months=2" in overrides:
        periods = md_table(docs["proposal.md"], "| period | months |")
        assert [p[1] for p in periods] == ["2", "2", "2", "1"]
        assert sum(Decimal(p[2]) for p in periods) == rows["request"]
        timeline = re.findall(r"months?\): ([\d.]+) node-hours", docs["slides.tex"])
        assert sum(Decimal(x) for x in timeline) == rows["request"]


def test_a_production_run_past_runtime_max_is_priced_with_its_resumptions(tmp_path):
    """A production run past hardware.runtime_max (200 epochs in jobs of 10 min) stopped the
    proposal at its end with the study's refusal of 'run w4_..._r0' (the study's own 3-epoch
    run fits); and the request left out its resumptions' start-ups, which plan.md counts. It
    is priced as the planner splits it: its runs' held time (Estimate.held_s)."""
    over = ("hardware.runtime_max=10", "checkpointing.retries=60", "proposal.production.epochs=200")
    config, study = build(tmp_path, *STRONG, *over)
    write(config, study)
    c = cells(study)
    w = c[("scale", "chosen")]["world_size"]
    prod = next(
        v for (s, i), v in c.items() if s == "request" and i.startswith(f"production at {w} ")
    )
    from scalestudy.study.estimate import estimate_runs, load_measured

    alone = copy.deepcopy(config)
    for family in alone["families"].values():
        family["enabled"] = False
    alone["families"]["strong"].update(enabled=True, gpus=[int(w)])
    alone["profiling"]["enabled"] = False
    alone["repeats"] = config["proposal"]["production"]["runs"]
    alone["train"] |= {"limit_train": 0, "limit_test": 0, "epochs": 200}
    measured = load_measured(study / "results/csv/runs.csv")
    estimates = estimate_runs(alone, build_run_table(alone), measured, refuse=False)
    assert all(e.jobs > 1 for e in estimates)  # split: resumptions' start-ups held too
    held = sum(e.held_s for e in estimates) / len(estimates) / 3600
    assert (
        float(prod["hours_per_run"])
        == proposal.ceil3(held)
        > proposal.ceil3(sum(e.runtime_s for e in estimates) / len(estimates) / 3600)
    )
    assert not [v for (s, _), v in c.items() if s == "request" and "cannot_run" in v]
    # too few retries to split it (the default 2): still a proposal, the run priced as one job,
    # which the machine would not start: said beside the row (it was asked for silently)
    config, study = build(tmp_path / "few", *STRONG, *over[::2])
    docs = write(config, study)
    item, prod = next(
        (i, v)
        for (s, i), v in cells(study).items()
        if s == "request" and i.startswith(f"production at {w} ")
    )
    one_job = sum(e.runtime_s for e in estimates) / len(estimates) / 3600
    assert float(prod["hours_per_run"]) == proposal.ceil3(one_job)
    why = prod["cannot_run"]
    assert why.startswith("config key 'checkpointing.retries': value 2 is not allowed: run w"), why
    runs = int(prod["runs"])
    assert why.endswith(f" ({runs - 1} more of its runs alike)") if runs > 1 else True, why
    machine = config["proposal"]["machine"] or "the target system"
    said = f'**"{item}" cannot run as priced on {machine}** (one job per run, past hardware'
    assert said in docs["proposal.md"] and why in docs["proposal.md"]
    assert (
        "cannot run as priced on" in docs["proposal.tex"]
        and "Cannot run as priced" in docs["slides.tex"]
    )


def test_the_studys_measured_runs_are_priced_as_the_campaign_trains_them_again(tmp_path):
    """The "scaling study" rows ask for every run of the study, measured or not, and a measured
    run was priced as the one job it had been: its resumptions past hardware.runtime_max left
    out (a repeat cost less measured than not), and a run the machine cannot start (no
    checkpoints to go on from) asked for without a word."""
    over = ("hardware.runtime_max=15", "checkpointing.retries=20", "train.epochs=300")
    over += ("plan.startup_s=120", "profiling.enabled=false")
    config, study = build(tmp_path, *STRONG, *over)
    write(config, study)
    from scalestudy.study.estimate import estimate_runs, load_measured

    measured = load_measured(study / "results/csv/runs.csv")
    table = build_run_table(config)
    assert all(e.done for e in estimate_runs(config, table, measured))  # all measured
    again = estimate_runs(config, table, measured, refuse=False, new=True)
    assert any(e.jobs > 1 for e in again)  # split: the resumptions' start-ups held too
    asked = [(i, v) for (s, i), v in cells(study).items() if s == "request"]
    asked = [(i, v) for i, v in asked if i.startswith("scaling study")]
    held = sum(e.held_s * e.nodes for e in again) / 3600
    node_hours = sum(float(v["node_hours"]) for _, v in asked)
    assert held <= node_hours <= held * 1.01, (held, node_hours)
    assert not [v for _, v in asked if "cannot_run" in v]
    # without checkpoints no run goes on in another job: said beside the rows, not asked for
    # silently (nor refused: the study's runs all ran)
    config, study = build(tmp_path / "off", *STRONG, *over, "checkpointing.enabled=false")
    docs = write(config, study)
    study_rows = [v for (s, i), v in cells(study).items() if s == "request" and "study" in i]
    refused = [v["cannot_run"] for v in study_rows if "cannot_run" in v]
    assert refused and all("checkpointing.enabled" in why for why in refused), refused
    assert "cannot run as priced on" in docs["proposal.md"]


def test_a_study_measured_on_another_device_is_one_line(demo, tmp_path, capsys):
    """The CPU demo's CSVs with a GPU config (or a GPU study's with the demo's): the request
    priced GPU-hours the documents said do not apply, or 0 GPU-hours and energy "not measured"
    beside a measured J/img. Refused in one line, naming system.csv and both devices."""
    config, study, _ = demo
    gpu = copy.deepcopy(config)
    gpu["hardware"]["device"] = "cuda"
    with pytest.raises(AnalysisError) as e:
        write(gpu, study)
    assert str(e.value) == (
        f"{study / 'results/csv'}/system.csv: the study ran on cpu, and this config prices on "
        "hardware.device cuda: give the study's own config, or run the study again (`snakemake`)"
    )


def test_production_runs_are_priced_new_though_the_study_measured_their_ids(tmp_path):
    """Production run ids leave out the epochs: a study on the whole data set at the
    production epochs measured runs of the same ids, and those were priced as done, one job
    without the jobs past hardware.runtime_max, so 3 runs cost 3.75 node-hours where 5 cost
    7.55 and they need 5.73. Every production run is priced as one still to train."""
    over = ("hardware.runtime_max=30", "checkpointing.retries=10", "train.epochs=100")
    over += ("train.limit_train=0", "train.limit_test=0", "plan.startup_s=300")
    over += ("profiling.enabled=false",)  # a profiling job cannot go on in another job
    per_run = {}
    for runs in (3, 5):
        config, study = build(
            tmp_path / str(runs), *STRONG, *over, f"proposal.production.runs={runs}"
        )
        write(config, study)
        w = cells(study)[("scale", "chosen")]["world_size"]
        per_run[runs] = next(
            v["hours_per_run"]
            for (s, i), v in cells(study).items()
            if s == "request" and i.startswith(f"production at {w} ")
        )
    assert per_run[3] == per_run[5], per_run
    from scalestudy.study.estimate import estimate_runs, load_measured

    alone = copy.deepcopy(config)
    for family in alone["families"].values():
        family["enabled"] = False
    alone["families"]["strong"].update(enabled=True, gpus=[int(w)])
    alone["profiling"]["enabled"] = False
    alone["repeats"] = 3
    measured = load_measured(study / "results/csv/runs.csv")
    table = build_run_table(alone)
    assert any(estimate_runs(alone, table, measured, refuse=False)[i].done for i in range(3))
    estimates = estimate_runs(alone, table, measured, refuse=False, new=True)
    assert all(e.jobs > 1 and not e.done for e in estimates)
    held = sum(e.held_s for e in estimates) / len(estimates) / 3600
    assert float(per_run[3]) == proposal.ceil3(held)


def test_with_calibration_off_the_study_is_priced_as_plan_md_prices_it(tmp_path):
    """plan.calibrate false: the plan reads no measured run, so a run past hardware.runtime_max
    is split into jobs there; the proposal marked the same run done (it had a measurement)
    and priced it as one job under a time limit past runtime_max, below plan.md's hours. Its
    evidence still counts the measured runs."""
    from scalestudy.study import plan

    over = ("plan.calibrate=false", "hardware.runtime_max=10", "checkpointing.retries=20",
            "checkpointing.signal_lead_s=60", "train.epochs=60")  # fmt: skip
    config, study = build(tmp_path, *over)
    write(config, study)
    measured = plan.read_measured(config, study / "results/csv/runs.csv", study / "benchmarks")
    priced = plan.estimate_runs(config, build_run_table(config), measured)
    assert any(e.jobs > 1 for e in priced)  # split: the resumptions' start-ups held too
    c = cells(study)
    row = c[("request", "scaling study, 1 node")]
    held = sum(e.held_s for e in priced) / len(priced) / 3600
    assert (int(row["runs"]), float(row["hours_per_run"])) == (len(priced), proposal.ceil3(held))
    assert c[("evidence", "study")]["runs_not_measured"] == "0"


@pytest.mark.parametrize("which", ["thin", "strong"])
def test_no_production_is_promised_when_none_is_requested(tmp_path, which):
    """proposal.production.runs 0: the request has no production row, and no document says
    "production at N" or "then production"; the scale the evidence chose is still named, and
    every number is still a CSV cell."""
    overrides = ("proposal.production.runs=0",) + (STRONG if which == "strong" else ())
    config, study = build(tmp_path, *overrides)
    docs = write(config, study)
    assert ("production", "run") not in cells(study)
    for name, text in docs.items():
        flat = " ".join(text.split())
        for claim in ("production at", "then production", "Production run:", "Production:"):
            assert claim not in flat, (name, claim)
        assert "run the production training" not in flat, name
    assert (
        "no production run requested (proposal.production.runs); the chosen scale:"
        in (docs["proposal.md"])
    )
    assert "No production run is requested" in docs["proposal.tex"]
    tables = report.load_tables(study / "results/csv", report.ANALYSIS_TABLES)
    tables["proposal"] = read(study / "results/csv/proposal.csv")
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, tables) == [], name


def test_a_count_of_one_reads_singular_and_the_baselines_efficiency_is_no_measurement(tmp_path):
    """A threshold no larger scale meets chooses the smallest: the documents said "1 ranks",
    "1 node(s)" and "measured E_s 100.0%", which is 1 by definition at the baseline; the slides
    gave it as the scaling result with its n ("$E_s$ = 100.0 % ($n$ = 1)")."""
    config, study = build(tmp_path, "proposal.efficiency_threshold=0.999")
    docs = write(config, study)
    assert cells(study)[("scale", "chosen")]["world_size"] == "1"
    for name, text in docs.items():
        flat = " ".join(text.split())
        assert not re.search(r"\b1\W{0,9} ?(ranks|GPUs|nodes)\b|node\(s\)", flat), name
        assert "measured E_s 100" not in flat and "measured $E_s$ << " not in flat, name
    md = " ".join(docs["proposal.md"].split())
    assert "**1 rank** on 1 node" in md and "E_s 100.0% by definition" in md
    assert "production at 1 rank" in docs["proposal.md"]  # the request row's label
    slides = " ".join(docs["slides.tex"].split())
    assert "Chosen: 1 rank (1 node), $E_s$ = 100.0\\,\\% by definition (the baseline)" in slides
    assert not re.search(r"\$E_s\$ = [\d.]+\\,\\% \(\$n\$", slides)


def test_a_strong_family_of_one_world_size_claims_no_efficiency_held(tmp_path):
    """A strong family run at one world size has no E_s but the baseline's 100% by definition:
    the proposal went on "E_s stays at or above the threshold up to the largest world size
    measured", a scaling result nothing measured."""
    config, study = build(tmp_path, "families.strong.gpus=[4]")
    docs = write(config, study)
    for name in ("proposal.md", "proposal.tex"):
        flat = " ".join(docs[name].split())
        assert "stays at or above the threshold" not in flat, name
        assert "Only the baseline world size ran: no " in flat, name
        assert "the request prices runs at 8 ranks (next runs)" in flat, name


def test_counts_of_one_month_run_epoch_and_world_size_read_singular(tmp_path):
    """A 1-run study (strong at 2 ranks only), a 1-month allocation, one production run of one
    epoch: the documents said "1 months", "1 epochs, 1 runs", "1 training runs", "1 measured
    runs" and "only 1 world sizes were measured"."""
    config, study = build(
        tmp_path, "proposal.total_months=1", "proposal.production.runs=1",
        "proposal.production.epochs=1", "families.weak.enabled=false",
        "families.precision.enabled=false", "families.bucket.enabled=false",
        "families.strong.gpus=[2]",
    )  # fmt: skip
    docs = write(config, study)
    plural = r"\b1 (training runs|measured runs|months|epochs|runs|world sizes|repeats)\b"
    for name, text in docs.items():
        flat = " ".join(text.split())
        assert not re.findall(plural, flat), (name, re.findall(plural, flat))
    md = " ".join(docs["proposal.md"].split())
    assert "for 1 month:" in md and "1 epoch, 1 run at the chosen scale" in md
    assert "1 training run," in md and "only 1 world size was measured" in md


def test_model_holdout_error_is_shown_when_the_model_csv_has_it(tmp_path):
    config, study = build(tmp_path, *STRONG)
    (study / "model.csv").write_text(
        "kind,name,world_size,measured,predicted,rel_error\n"
        "holdout,strong,8,1920,2016,0.05\nholdout,strong,4,1280,1216,-0.0734\nfit,strong,2,,,\n"
    )
    docs = write(config, study, "model.csv")
    assert "at most 7.3% over 2 held-out points" in docs["proposal.md"]  # was "point(s)"
    assert "at most 7.3\\% over 2 held-out points" in " ".join(docs["proposal.tex"].split())
    docs = write(config, study)  # absent: said so
    assert "no held-out validation" in docs["proposal.md"]
    # by hand, from another directory: --csv-dir's model.csv, not the working directory's
    csv_dir = tmp_path / "elsewhere"
    shutil.copytree(study / "results/csv", csv_dir)
    (csv_dir / "model.csv").write_bytes((study / "model.csv").read_bytes())
    out = tmp_path / "docs"
    argv = ["proposal", "--config", str(DEMO), *(a for s in STRONG for a in ("--set", s))]
    argv += ["--csv-dir", str(csv_dir), "--out-dir", str(out)]
    argv += ["--runs-csv", str(study / "results/csv/runs.csv")]
    assert cli.main(argv) == 0
    assert "at most 7.3% over 2 held-out points" in (out / "proposal.md").read_text()


def test_a_chosen_scale_this_config_cannot_run_is_one_line(tmp_path):
    """scaling.csv measured with one families.strong, the proposal written with another whose
    global batch does not fill the chosen scale's ranks: a ZeroDivisionError traceback (with
    production runs), or a plan naming a scale the config cannot run (without)."""
    config, study = build(tmp_path, *STRONG)
    points = proposal.strong_points(read(study / "results/csv/scaling.csv"))
    w = proposal.choose_scale(points, config["proposal"]["efficiency_threshold"])[0]["w"]
    assert w > 1  # a global batch of 1 then fits no rank count but 1
    other = ["repeats=3", "families.strong.gpus=[1]", "families.strong.global_batch=1"]
    other = load_and_validate(DEMO, overrides=other)
    with pytest.raises(AnalysisError, match=rf"the chosen scale, {w} ranks, is no strong-scaling"):
        write(other, study)


def test_a_chosen_scale_measured_on_other_nodes_is_one_line(tmp_path):
    """scaling.csv measured with one hardware.gpus_per_node, the proposal written with another
    that places the chosen scale on other nodes: the documents named scaling.csv's node count
    as the chosen scale's and priced production on the config's."""
    config, study = build(tmp_path, *STRONG)
    points = proposal.strong_points(read(study / "results/csv/scaling.csv"))
    chosen = proposal.choose_scale(points, config["proposal"]["efficiency_threshold"])[0]
    w, nodes = chosen["w"], int(chosen["nodes"])
    gpus = config["hardware"]["gpus_per_node"]
    assert w > 1 and nodes == placement(w, gpus)[0]
    other = 1 if nodes == 1 else w  # a whole node or w nodes of one, never the measured count
    assert placement(w, other)[0] != nodes
    config = load_and_validate(DEMO, overrides=[*STRONG, f"hardware.gpus_per_node={other}"])
    match = rf"the chosen scale, {w} ranks, ran on {nodes} nodes? in scaling.csv, and this config"
    with pytest.raises(AnalysisError, match=match) as e:
        write(config, study)
    assert f"places it on {placement(w, other)[0]} (hardware.gpus_per_node {other})" in str(e.value)


def test_a_strong_family_with_no_run_measured_yet_is_not_to_be_enabled(tmp_path):
    """The strong family enabled, none of its runs in runs.csv yet: the refusal said "enable
    families.strong"."""
    config, study = build(tmp_path, missing=lambda row: "strong" in row["families"])
    with pytest.raises(AnalysisError) as caught:
        write(config, study)
    assert "no strong-scaling run is measured yet" in str(caught.value)
    assert "enable families.strong" not in str(caught.value)


def test_a_model_csv_without_a_note_column_is_read(tmp_path):
    """A hand-written --model-csv of the documented columns but note: KeyError 'note'."""
    config, study = build(tmp_path, *STRONG)
    (study / "m.csv").write_text(
        "kind,name,world_size,measured,predicted,rel_error\nholdout,strong,8,1920,,\n"
    )
    assert "no held-out validation" in write(config, study, "m.csv")["proposal.md"]


def test_the_request_claims_a_measured_energy_total_only_where_there_is_one(demo):
    """A CPU study (energy n/a), or a GPU one without J/img: the request still said "The energy
    total is the training rows' (from the measured J/img)"."""
    _, _, docs = demo
    assert "from the measured J/img" not in docs["proposal.md"]
    assert "from the measured J/img" not in docs["proposal.tex"]
    assert "No energy total: a CPU study" in docs["proposal.md"]


def test_the_measured_runs_are_those_of_the_csv_dir_not_of_the_working_directory(
    tmp_path, monkeypatch
):
    """`scalestudy proposal --csv-dir B/results/csv` read runs.csv and the job benchmarks of
    the working directory (as --model-csv once did): run from study A's directory it priced B
    at A's throughput (7x its request), from an empty one it said "no measured runs were
    read" beside B's runs.csv. They default to --csv-dir's runs.csv and, for a study's
    results/csv, the study's benchmarks/train, as the workflow's rule reads them."""
    config, study = build(tmp_path / "b")
    (study / "benchmarks/train").mkdir(parents=True)
    for r in read(study / "results/csv/runs.csv"):  # B's job wall times: its start-up
        (study / f"benchmarks/train/{r['run']}.tsv").write_text("s\th:m:s\n75.0\t0:01:15\n")
    write(config, study)
    own = cells(study)
    monkeypatch.setattr(sys.modules[__name__], "PER_RANK", PER_RANK / 10)
    _, other = build(tmp_path / "a")  # study A: the same config, 10 times slower
    for cwd in (other, tmp_path / "empty"):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(study / "results/csv")]
        assert cli.main([*argv, "--out-dir", str(tmp_path / "out")]) == 0
        assert cells(study) == own, cwd
    source = {
        r["source"]
        for r in read(study / "results/csv/proposal.csv")
        if r["quantity"] == "hours_per_run"
    }
    assert any(str(study / "results/csv/runs.csv") in s for s in source), source


def test_rows_priced_by_an_unvalidated_model_are_named_and_the_cause_is_said(tmp_path, monkeypatch):
    """Strong at 1, 2 and 8 ranks (8 = 2 nodes of 4), 3 repeats: 16 ranks on 4 nodes is a new
    world size, priced by the scaling model's extrapolation, and no held-out row of model.csv
    validates it (leaving 8 out leaves no multi-node run). The documents said "no held-out
    validation (results/csv/model.csv absent or without held-out rows): no prediction beyond
    the measured points is claimed": model.csv was there, with held-out rows, and a request
    row rested on the model's prediction beyond the measured points."""
    measured = measured_runs

    def modelled(config):  # what the scaling model needs of a run
        return [dict(r, grad_sync_bytes=705608, phase_frac_backward=0.6) for r in measured(config)]

    monkeypatch.setattr(sys.modules[__name__], "measured_runs", modelled)
    config, study = build(
        tmp_path,
        "families.strong.gpus=[1,2,8]",
        "report.targets.strong_efficiency_gpus=8",
        "repeats=3",
    )
    csv_dir = study / "results/csv"
    assert cli.main(["model", "--runs", str(csv_dir / "runs.csv"), "--out-dir", str(csv_dir)]) == 0
    held = [r for r in read(csv_dir / "model.csv") if r["kind"] == "holdout"]
    assert held and not any(r["rel_error"] for r in held)  # none could be validated
    docs = write(config, study, "results/csv/model.csv")
    item = "next runs (new world sizes), 4 nodes"
    c = cells(study)
    assert c[("request", item)]["basis"] == "model, extrapolated"  # the planner's, carried
    assert c[("model", "validation")]["held_out_rows"] == str(len(held))
    md, tex = (" ".join(docs[n].split()) for n in ("proposal.md", "proposal.tex"))
    assert "absent or without held-out rows" not in md
    assert (
        f"none of the {len(held)} held-out rows of results/csv/model.csv could be validated" in md
    )
    assert f"none of the {len(held)} held-out rows of \\texttt{{results/csv/model.csv}}" in tex
    strong = next(r["note"] for r in held if r["name"] == "strong")
    assert f"strong family: {strong}" in md
    # the row resting on the unvalidated model is named, with its basis, where the model's
    # validation is said and beside the request
    named = f'"{item}" (model, extrapolated)'
    assert md.count(named) == 2, md
    assert "rest on the scaling model's unvalidated prediction" in md
    assert tex.count(f"``{item}'' (model, extrapolated)") == 2
    assert "no prediction beyond the measured points is claimed" not in md + tex
    assert item in docs["slides.tex"] and "not validated" in docs["slides.tex"]
    # model.csv absent: the cause is said so, and the row is still named
    md = " ".join(write(config, study)["proposal.md"].split())
    assert "no held-out validation (results/csv/model.csv is absent)" in md
    assert md.count(named) == 2


@pytest.mark.parametrize(
    "override, says",
    [
        ("proposal.style=nersc", "proposal.style"),
        ("proposal.efficiency_threshold=1.5", "proposal.efficiency_threshold"),
        ("proposal.period_months=24", "proposal.period_months"),
        ("proposal.contingency=-0.1", "proposal.contingency"),
    ],
)
def test_a_bad_proposal_value_is_one_clear_line(tmp_path, override, says):
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "proposal", "--config", str(DEMO), "--set", override],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=child_env(),
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def tex_here(beamer: bool = False) -> bool:
    """latexmk is installed (and pgf, beamer's graphics layer, when `beamer`). Under CI=true it
    must be (scripts/setup.sh installs both as root): missing, the test fails there, as in
    test_report.py, instead of skipping or leaving its PDF asserts out."""
    have = latex.have_beamer() if beamer else latex.have_latexmk()
    if not have and os.environ.get("CI") == "true":
        pytest.fail("CI must have TeX: scripts/setup.sh installs latexmk and pgf as root")
    return have


def test_the_pdfs_build(demo):
    """Both PDFs build; before the efficiency figure exists the slides say so where it goes
    (the slide included it anyway, and latexmk failed on the missing file)."""
    config, study, docs = demo
    if not tex_here(beamer=True):
        pytest.skip(latex.missing("reports/paper.tex", latex.tex_gaps()))
    assert "The figure ../results/plots/efficiency.pdf (relative to the slides) is not there" in (
        " ".join(docs["slides.tex"].split())
    )
    assert "includegraphics" not in docs["slides.tex"]
    assert cli.main(["build-pdf", str(study / "reports" / "slides.tex")]) == 0
    plots = study / "results/plots"
    csv_dir = study / "results/csv"
    assert cli.main(
        ["plot", "--figure", "efficiency", "--scaling", str(csv_dir / "scaling.csv"),
         "--targets", str(csv_dir / "targets.csv"), "--epochs", str(csv_dir / "epochs.csv"),
         "--device", "cpu", "--out", str(plots)]
    ) == 0  # fmt: skip
    assert "includegraphics" in write(config, study)["slides.tex"]  # the figure is there now
    for name in ("proposal", "slides"):
        assert cli.main(["build-pdf", str(study / "reports" / f"{name}.tex")]) == 0
        assert (study / "reports" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    # the readiness table's digest and commit wrap in their column (440 pt too wide before)
    log = (study / "reports/proposal.log").read_text(errors="replace")
    wide = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\) in \w+ at lines (\S+)", log)
    assert [w for w in wide if float(w[0]) > 1.0] == [], wide
    log = (study / "reports/slides.log").read_text(errors="replace")
    # the ask's labels wrap on the slide too (20.9 pt too wide in the demo)
    wide = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\) in \w+ at lines (\S+)", log)
    assert [w for w in wide if float(w[0]) > 1.0] == [], wide
    assert re.search(r"Output written on slides\.pdf \(5 pages", log)
    assert "results/plots/efficiency.pdf" in log


# --- in the DAG (the tiny study of tests/conftest.py, run once per session) -----------------------
@pytest.mark.workflow
def test_the_workflow_writes_the_proposal_and_a_proposal_change_reruns_only_it(tiny_study):
    from workflow_helpers import planned_jobs, snakemake

    done = tiny_study
    for name in ("results/csv/proposal.csv", *(f"reports/{d}" for d in proposal.DOCUMENTS)):
        assert (done / name).stat().st_size > 0, name
    tex, beamer = tex_here(), tex_here(beamer=True)  # under CI=true both, or the test fails
    if tex:
        assert (done / "reports/proposal.pdf").read_bytes()[:4] == b"%PDF"
    if beamer:
        assert (done / "reports/slides.pdf").read_bytes()[:4] == b"%PDF"
    text = (done / "reports/proposal.md").read_text()
    assert "The scaling evidence is thin" in text  # 2 world sizes, one repeat
    # the same study file (its name is in the analysis' reproduce command), proposal: changed
    study = done / "tiny.yaml"
    original = study.read_text()
    changed = yaml.safe_load(original)
    changed["proposal"] = {"style": "ncar", "efficiency_threshold": 0.5}
    try:
        write_config(study, changed)
        proc = snakemake(done, "--configfile", "tiny.yaml", "-n", stand_ins=True)
    finally:
        study.write_text(original)
    pdfs = {"proposal_pdf": 1} if tex else {}
    pdfs.update({"slides_pdf": 1} if beamer else {})
    assert planned_jobs(proc) == {"all": 1, "proposal": 1, **pdfs}


def test_a_next_world_size_must_pass_the_study_checks():
    """The runs proposed next are runs the study could run: whole nodes, a whole local batch."""
    config = load_and_validate(DEMO)  # 4 per node, strong global batch 32
    assert proposal._fits(config, 8)
    assert not proposal._fits(config, 6)  # 1.5 nodes
    assert not proposal._fits(config, 64)  # 32 images over 64 ranks


@pytest.mark.parametrize("which", ["demo", "strong"])
def test_the_printed_request_table_recomputes(request, which):
    """The table as a reader sees it in proposal.md: every row's runs x hours per run x nodes
    is its printed node-hours, and the printed rows' sum plus contingency is the printed
    request (3-digit rounding of the products could not do this, and could round the ask
    down)."""
    _, study, docs = request.getfixturevalue(which)
    text = docs["proposal.md"]
    table = text[text.index("| experiment | runs | hours per run |") :]
    table = table[: table.index("\n\n")].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    totals = ("subtotal", "**request**")
    body = [r for r in rows if r[0] not in totals and "contingency" not in r[0]]
    assert body
    subtotal = 0.0
    for r in body:
        runs, hours, nodes, node_h = (float(x) for x in r[1:5])
        assert runs * hours * nodes == pytest.approx(node_h, rel=1e-9), r
        subtotal += node_h
    [printed_subtotal] = [float(r[4]) for r in rows if r[0] == "subtotal"]
    [contingency] = [float(r[4]) for r in rows if "contingency" in r[0]]
    [ask] = [float(r[4].strip("*")) for r in rows if r[0] == "**request**"]
    assert printed_subtotal == pytest.approx(subtotal, rel=1e-9)
    assert ask == pytest.approx(printed_subtotal + contingency, rel=1e-9)
    assert f"**{report.fmt_exact(ask)} node-hours**" in text  # the headline asks the same
    # the thin-evidence section's table of the runs to add prints the same rows, as exactly
    if "| runs to add |" in text:
        added = text[text.index("| runs to add |") :]
        added = added[: added.index("\n\n")].splitlines()[2:]
        request_rows = {r[0]: r[1:5] for r in body}
        for line in added:
            item, *numbers = (c.strip() for c in line.strip("|").split("|"))
            assert numbers == request_rows[item], (item, numbers, request_rows[item])


def test_a_cpu_study_asks_for_node_hours_only(demo):
    """The demo ran on CPUs: 0 GPUs per run is no "0 GPU-hours" claim; the documents say GPU
    hours do not apply, and put n/a where a GPU study has its GPU columns."""
    _, study, docs = demo
    assert {v["gpus_per_run"] for (s, _), v in cells(study).items() if s == "request"} == {"0"}
    for name, text in docs.items():
        assert "0 GPU-hours" not in text, name
        assert "do not apply" in text, name
    headline = next(ln for ln in docs["proposal.md"].splitlines() if ln.startswith("Requested on"))
    assert "node-hours**" in headline and "GPU-hours" not in headline
    ask = next(ln for ln in docs["proposal.md"].splitlines() if ln.startswith("| **request**"))
    assert ask.split("|")[7].strip() == "**n/a**"
    # GPU energy too: n/a, as the text below the table says, not "not measured" beside it
    table = md_table(docs["proposal.md"], "| experiment | runs |")
    energy = {r[0]: r[7] for r in table if r[0] not in ("subtotal",) and "contingency" not in r[0]}
    assert set(energy.values()) == {"n/a"}, energy
    tex = [ln for ln in docs["proposal.tex"].splitlines() if ln.startswith("\\textbf{request}")]
    assert tex and tex[0].rstrip(" \\").endswith("& n/a"), tex


def test_no_container_digest_is_claimed_when_the_runs_recorded_none(demo, tmp_path):
    """The demo runs without the container (container.enabled: false; runs.csv container_digest
    blank): the documents said it was "archived with the git commit and container digest every
    run records" and the slides "from container to this slide". They say the runs ran without
    one; a study whose runs recorded a digest names it."""
    _, study, docs = demo
    assert read(study / "results/csv/runs.csv")[0]["container_digest"] == ""
    for name, text in docs.items():
        flat = " ".join(text.split())
        assert "container digest" not in flat, name
        assert "from container to" not in flat, name
        assert "ran without" in flat and "container.enabled: false" in flat, name
    digest = "sha256:" + "ab12" * 16
    config, study = build(tmp_path, "container.enabled=true", digest=digest)
    docs = write(config, study)
    for name, text in docs.items():
        flat = " ".join(text.replace(report.BREAK, "").split())
        assert "ran without" not in flat, name
        if name != "slides.tex":
            assert digest in flat, name
    assert "from the container image the runs recorded" in docs["slides.tex"]
    # enabled, yet no run recorded a digest: said so, not a digest
    config, study = build(tmp_path / "none", "container.enabled=true")
    docs = write(config, study)
    for name, text in docs.items():
        flat = " ".join(text.split())
        assert "no run recorded" in flat.lower() and "ran without" not in flat, name


@pytest.mark.parametrize("figure_dir", ["../runs/2024/plots", "../runs&2024/plots"])
def test_a_figure_dir_holding_a_number_is_no_claim_of_the_slides(tmp_path, figure_dir):
    """--figure-dir ../runs/2024/plots before the efficiency figure is drawn: the slide said
    "not in ../runs/2024/plots", a form of the directory the honesty check did not exempt, and
    the whole proposal was refused for its 2024. The slide names the figure's path, exempt as
    typed and as TeX prints it (& is \\& there); the directory's digits anywhere else are still
    a claim the check refuses."""
    from scalestudy.errors import AnalysisError

    config, study = build(tmp_path)
    csv_dir, out = study / "results/csv", study / "reports"
    templates, model, benchmarks = REPO / "workflow/report", study / "absent.csv", study / "bench"
    proposal.write_proposal(
        config, csv_dir, out, templates, model, csv_dir / "runs.csv", benchmarks, figure_dir
    )
    slides = " ".join((out / "slides.tex").read_text().split())
    path = report.tex_escape(f"{figure_dir}/efficiency.pdf")
    assert f"The figure {path} (relative to the slides) is not there" in slides
    report.check_numbers({"slides.tex": f"The figure {path} is not there."}, {}, (figure_dir,))
    for where in (figure_dir, report.tex_escape(figure_dir), f"{figure_dir}/notes.txt"):
        text = f"The figure {path} is not there; see {where}."
        with pytest.raises(AnalysisError, match=r"\['2024'\]"):
            report.check_numbers({"slides.tex": text}, {}, (figure_dir,))


def test_a_refused_proposal_leaves_no_new_csv_behind(tmp_path):
    """proposal.csv is written with the documents, after the honesty check of all of them: a
    refused document leaves neither (the old proposal.csv would otherwise sit beside old
    documents that do not match it)."""
    import shutil

    config, study = build(tmp_path)
    templates = tmp_path / "templates"
    shutil.copytree(REPO / "workflow/report", templates)
    with (templates / "slides.tex.j2").open("a") as f:
        f.write("% a typed number: 77.7\n")
    from scalestudy.errors import AnalysisError

    with pytest.raises(AnalysisError, match=r"slides.tex shows numbers .*'77.7'"):
        proposal.write_proposal(config, study / "results/csv", study / "reports", templates,
                                study / "absent.csv", study / "results/csv/runs.csv",
                                study / "benchmarks/train")  # fmt: skip
    assert not (study / "results/csv/proposal.csv").exists()
    assert not (study / "reports").exists()


@pytest.mark.parametrize("flag", ["--runs-csv", "--model-csv", "--benchmarks"])
def test_a_measured_input_given_but_missing_is_refused_not_ignored(demo, tmp_path, capsys, flag):
    # a typo here once gave an uncalibrated proposal, or one without the model's validation
    _, study, _ = demo
    out = tmp_path / "reports"
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(study / "results/csv")]
    argv += ["--out-dir", str(out), "--runs-csv", str(study / "results/csv/runs.csv")]
    typo = str(tmp_path / "result/csv/typo")
    assert cli.main([*argv, flag, typo]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {typo}: no such" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    assert cli.main(argv) == 0 and (out / "proposal.md").is_file()


def test_the_pdfs_of_rewritten_documents_are_removed_not_left_looking_current(demo, tmp_path):
    """Without latexmk (a cluster session without `module load texlive`) the workflow asks for
    no PDF, and render-report and proposal rewrote paper.tex, proposal.tex and slides.tex
    beside the PDFs of the old numbers, which stayed there looking current. A PDF goes with
    the .tex it was built from (the PDF rules build it again where TeX is)."""
    _, study, _ = demo
    out = tmp_path / "reports"
    out.mkdir()
    for name in ("paper.pdf", "proposal.pdf", "slides.pdf", "other.pdf"):
        (out / name).write_text("an old build\n")
    csv_dir = tmp_path / "csv"
    shutil.copytree(study / "results/csv", csv_dir)
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(csv_dir), "--out-dir", str(out)]
    argv += ["--runs-csv", str(csv_dir / "runs.csv")]
    assert cli.main(argv) == 0
    assert not (out / "proposal.pdf").exists() and not (out / "slides.pdf").exists()
    assert (out / "paper.pdf").exists() and (out / "other.pdf").exists()  # not its documents
    # the same .tex written again keeps the PDF built from it (one the user built elsewhere and
    # copied in was removed on every rerun)
    (out / "proposal.pdf").write_text("built from this proposal.tex\n")
    assert cli.main(argv) == 0 and (out / "proposal.pdf").exists()


def test_the_proposal_csv_goes_where_out_csv_says(demo, tmp_path):
    """`proposal --csv-dir B/results/csv --out-dir mine` with other settings rewrote B's
    proposal.csv (its documents then disagreed with it). --out-csv puts it elsewhere."""
    _, study, _ = demo
    theirs = study / "results/csv/proposal.csv"
    before = theirs.read_text()
    out, mine = tmp_path / "mine", tmp_path / "mine" / "proposal.csv"
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(study / "results/csv")]
    argv += ["--out-dir", str(out), "--out-csv", str(mine), "--set", "proposal.contingency=0.5"]
    assert cli.main(argv) == 0 and (out / "proposal.md").is_file()
    assert theirs.read_text() == before and mine.read_text() != before
    # an output written in place (--out-csv /dev/stdout, a FIFO) is never read first: reading
    # /dev/stdout (a pipe's read end this process holds open) waited forever
    fifos = [tmp_path / "out.csv", tmp_path / "paper.tex"]
    for fifo in fifos:
        os.mkfifo(fifo)

    class Hung(Exception):  # no OSError, which texts_before takes as "nothing readable"
        pass

    def hung(*_):
        raise Hung("texts_before waited on a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        assert report.texts_before(fifos) == {}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_request_says_whether_the_planner_was_calibrated(demo, tmp_path):
    """Without the measured runs (a runs.csv not found is read as none) every source cell said
    "calibrated from results/csv/runs.csv", and the text "calibrated from the measured runs",
    over hours that were the planner's defaults."""
    config, study, docs = demo
    runs_csv = study / "results/csv/runs.csv"
    c = cells(study)
    calibration = c[("planner", "calibration")]
    assert int(calibration["runs_calibrated"]) > 0 and int(calibration["runs_priced"]) > 0
    sources = {r["source"] for r in read(study / "results/csv/proposal.csv")}
    assert f"study/estimate.py planner, calibrated from {runs_csv}" in sources
    assert "not calibrated" not in docs["proposal.md"]

    other = tmp_path / "study"
    shutil.copytree(study / "results/csv", other / "results/csv")
    proposal.write_proposal(
        config,
        other / "results/csv",
        other / "reports",
        REPO / "workflow/report",
        other / "absent.csv",
        other / "no-runs.csv",  # not there: no measured runs
        other / "benchmarks/train",
    )
    rows = read(other / "results/csv/proposal.csv")
    planned = [r for r in rows if r["section"] == "request" and "planner" in r["source"]]
    assert planned and {r["source"] for r in planned} == {
        "study/estimate.py planner, not calibrated: no measured runs were read (its defaults)"
    }
    assert cells(other)[("planner", "calibration")]["runs_calibrated"] == "0"
    md = (other / "reports/proposal.md").read_text()
    assert "**not calibrated**: no measured run matches these runs" in md
    assert "calibrated from the measured runs" not in md
    assert "\\textbf{not calibrated}" in (other / "reports/proposal.tex").read_text()


def test_a_run_calibrated_in_start_up_only_is_counted_apart_as_plan_md_counts_it(tmp_path):
    """bf16 never measured: its throughput is the planner's default, only its start-up came from
    the measured job wall times. The proposal counted it "calibrated from the measured runs"
    (18 of 18 runs) while plan.md said "5 of 6 in throughput, 1 more in start-up only"."""
    config, study = build(tmp_path, missing=lambda r: r["precision"] == "bf16")
    bench = study / "benchmarks/train"  # Snakemake's job wall times of the measured runs
    bench.mkdir(parents=True)
    for r in read(study / "results/csv/runs.csv"):
        (bench / f"{r['run']}.tsv").write_text("s\th:m:s\n30.0\t0:00:30\n")
    docs = write(config, study)
    measured = load_measured(study / "results/csv/runs.csv", bench)
    own = estimate_runs(config, build_run_table(config), measured)
    said = re.search(
        r"Calibrated estimates: (\d+) of (\d+) in throughput .*?, (\d+) more in start-up only",
        plan.plan_markdown(config, own, []),
    )
    throughput, runs, startup = map(int, said.groups())
    assert startup == 1 and throughput == runs - 1  # the case at hand: bf16
    # the study's own rows say what plan.md says of the same runs
    rows = read(study / "results/csv/proposal.csv")
    own_rows = [
        r for r in rows if r["item"].startswith("scaling study") and r["quantity"] == "runs"
    ]
    assert sum(int(r["value"]) for r in own_rows) == runs
    sources = " ".join(r["source"] for r in own_rows)
    assert f"in throughput for {throughput} of {runs} runs, 1 more in start-up only" in sources
    # the totals: the start-up-only run counted apart, never as calibrated
    calibration = cells(study)[("planner", "calibration")]
    priced = int(calibration["runs_priced"])
    assert calibration["runs_startup_only"] == "1"
    assert calibration["runs_calibrated"] == str(priced - 1)
    for name in ("proposal.md", "proposal.tex"):
        text = " ".join(docs[name].split())
        assert f"in throughput for {priced - 1} of the {priced} runs, 1 more in start-up only" in (
            text
        ), name
        assert "calibrated from the measured runs)" not in text, name


def test_plan_calibrate_false_is_named_as_the_reason(tmp_path, monkeypatch):
    """plan.calibrate false: the planner reads no measured run, yet the source cells said "no
    run of runs.csv matches" and the text "no measured run matches these runs"; the energy of
    runs with a measured J/img read "not measured"."""
    measured = measured_runs

    def with_energy(config):
        return [dict(r, energy_j_per_img=0.05, device_name="H100") for r in measured(config)]

    monkeypatch.setattr(sys.modules[__name__], "measured_runs", with_energy)
    config, study = build(tmp_path, *STRONG, "hardware.device=cuda", "plan.calibrate=false")
    docs = write(config, study)
    rows = read(study / "results/csv/proposal.csv")
    planned = {r["source"] for r in rows if "planner" in r["source"]}
    assert planned == {
        "study/estimate.py planner, not calibrated: plan.calibrate is false (its defaults)"
    }
    c = cells(study)
    assert c[("total", "request")]["energy_kwh"] == "not used (plan.calibrate false)"
    md = " ".join(docs["proposal.md"].split())
    assert "**not calibrated**: plan.calibrate is false, so they are" in md
    assert "no measured run matches" not in md
    energy = {r[7] for r in md_table(docs["proposal.md"], "| experiment | runs |") if r[7]}
    assert energy == {"not used (plan.calibrate false)", "not estimated"}  # profiling's
    assert "\\textbf{not calibrated}: plan.calibrate is false" in docs["proposal.tex"]
    assert "GPU energy: not used (plan.calibrate false)." in docs["slides.tex"]


@pytest.mark.parametrize("given", [False, True])
def test_a_source_cell_names_the_key_its_value_is_from(tmp_path, given):
    """proposal.contingency and proposal.production.epochs null take plan.contingency and
    train.epochs: the source cells named the proposal's keys all the same."""
    overrides = ("proposal.contingency=0.1", "proposal.production.epochs=7") if given else ()
    config, study = build(tmp_path, *STRONG, "plan.contingency=0.35", *overrides)
    write(config, study)
    rows = read(study / "results/csv/proposal.csv")
    source = {(r["section"], r["item"], r["quantity"]): (r["value"], r["source"]) for r in rows}
    if given:
        assert source[("total", "contingency", "fraction")] == ("0.1", "proposal.contingency")
        assert source[("production", "run", "epochs")] == ("7", "proposal.production.epochs")
    else:
        assert source[("total", "contingency", "fraction")] == ("0.35", "plan.contingency")
        epochs = str(config["train"]["epochs"])
        assert source[("production", "run", "epochs")] == (epochs, "train.epochs")


def test_an_output_that_cannot_be_written_leaves_every_old_file_as_it_was(demo, tmp_path, capsys):
    """--out-dir naming a file: proposal.csv was rewritten, then the documents failed ("File
    exists"), so a new proposal.csv stood beside the old documents."""
    _, study, _ = demo
    csv_dir = tmp_path / "csv"
    shutil.copytree(study / "results/csv", csv_dir)
    before = (csv_dir / "proposal.csv").read_bytes()
    (csv_dir / "proposal.csv").write_text("old\n")
    a_file = tmp_path / "reports"
    a_file.write_text("not a directory\n")
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(csv_dir), "--out-dir", str(a_file)]
    argv += ["--runs-csv", str(study / "results/csv/runs.csv")]
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == f"scalestudy proposal: nothing written: {a_file}: is a file, not a directory"
    assert (csv_dir / "proposal.csv").read_text() == "old\n" and before != b"old\n"


def test_a_write_that_fails_part_way_leaves_every_old_file_as_it_was(tmp_path, monkeypatch):
    """proposal.csv and the documents were written one after another: a full disk at a later
    one left a new proposal.csv (and documents) beside old ones. All now go to temp files
    first, renamed once all are written (files.write_texts)."""
    config, study = build(tmp_path)
    write(config, study)
    outputs = [study / "results/csv/proposal.csv",
               *(study / "reports" / name for name in proposal.DOCUMENTS)]  # fmt: skip
    before = {p: p.read_text() for p in outputs}
    for p in outputs:
        p.write_text("old\n")
    for n in (2, len(outputs)):  # the first document, the last
        synced = fsync_fails_at_file(monkeypatch, n)
        with pytest.raises(OSError) as info:
            write(config, study)
        where, temp = os.path.split(synced[-1])  # .{name}.{random}.tmp beside its file
        assert info.value.filename == os.path.join(where, temp[1:].rsplit(".", 2)[0]), n
        assert {p: p.read_text() for p in outputs} == dict.fromkeys(outputs, "old\n"), n
        assert not [p for p in study.rglob(".*.tmp")], n  # no temp file left
        monkeypatch.undo()
    write(config, study)
    assert {p: p.read_text() for p in outputs} == before


def test_an_older_scaling_csv_is_one_line_not_a_traceback(demo, tmp_path, capsys):
    """A scaling.csv without a column (an older version's, or edited by hand): the proposal
    ended in a KeyError traceback (render-report's own: tests/test_report.py)."""
    import shutil

    _, study, _ = demo
    csv_dir = tmp_path / "csv"
    shutil.copytree(study / "results/csv", csv_dir)
    rows = read(csv_dir / "scaling.csv")
    files.write_csv(csv_dir / "scaling.csv", [c for c in rows[0] if c != "nodes"], rows)
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(csv_dir)]
    argv += ["--out-dir", str(tmp_path / "reports"), "--runs-csv", str(csv_dir / "runs.csv")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{csv_dir / 'scaling.csv'} has no column nodes:" in err[0], err
    # a --csv-dir of the user's own: to fix, not to delete (snakemake cannot make it again)
    assert err[0].endswith(
        "fix it, or give --csv-dir the study's results/csv "
        "(`snakemake results/csv/scaling.csv` writes it)"
    ), err
    assert "delete" not in err[0]
    assert not (tmp_path / "reports").exists()


def test_an_output_over_an_input_or_another_output_is_refused_before_any_work(
    demo, tmp_path, capsys
):
    """--out-csv over the study config (replaced by a CSV: every later command refused it) or
    over an analysis CSV, and --out-csv inside --out-dir as proposal.md (the document written,
    proposal.csv never, both said written): exit 0 each. Now one line, nothing written."""
    _, study, _ = demo
    work = tmp_path / "work"
    shutil.copytree(study / "results/csv", work)
    config = tmp_path / "study.yaml"
    config.write_bytes(DEMO.read_bytes())
    kept = {p: p.read_bytes() for p in [config, *work.iterdir()]}
    base = ["proposal", "--config", str(config), "--csv-dir", str(work)]
    base += ["--out-dir", str(tmp_path / "docs")]
    for out_csv, says in (
        (config, f"--out-csv is the input --config ({config})"),
        (work / "scaling.csv", f"--out-csv is the input scaling.csv of --csv-dir ({work}"),
        (tmp_path / "docs/proposal.md", "--out-csv and proposal.md of --out-dir are one file"),
    ):
        assert cli.main([*base, "--out-csv", str(out_csv)]) == 2, out_csv
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert err.startswith("scalestudy proposal: nothing written: ") and says in err, err
        assert {p: p.read_bytes() for p in kept} == kept
        assert not (tmp_path / "docs").exists()


def test_a_foreign_model_csv_is_refused_naming_it(demo, tmp_path, capsys):
    """A --model-csv without the columns its rows are selected by: "a CSV lacks the column
    'kind'", no file named. A hand-written one of the documented columns is still read."""
    _, study, _ = demo
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("run,throughput\nw1,10\n")
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(study / "results/csv")]
    argv += ["--out-dir", str(tmp_path / "docs"), "--out-csv", str(tmp_path / "p.csv")]
    assert cli.main([*argv, "--model-csv", str(foreign)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"{foreign} has no column kind, name: not a model.csv of `scalestudy model`" in err
    assert not (tmp_path / "docs").exists()


def test_model_refuses_to_write_over_its_runs(tmp_path, capsys):
    """`scalestudy model --runs D/model.csv --out-dir D` replaced the runs by their model."""
    runs = tmp_path / "model.csv"
    runs.write_bytes((REPO / "tests/fixtures/demo_runs.csv").read_bytes())
    before = runs.read_bytes()
    assert cli.main(["model", "--runs", str(runs), "--out-dir", str(tmp_path)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "nothing written: model.csv of --out-dir is the input --runs" in err, err
    assert runs.read_bytes() == before and not (tmp_path / "bucket_advice.csv").exists()


def test_a_damaged_model_csv_given_by_hand_is_not_to_be_deleted(demo, tmp_path, capsys):
    """`scalestudy proposal --model-csv mine.csv` with a row cut short said "delete it and run
    `snakemake`": advice to delete the user's own file, and a command that makes none of it."""
    _, study, _ = demo
    mine = tmp_path / "mine.csv"
    mine.write_text("kind,name,value\nparameter,fit_points\n")  # 2 cells under 3 columns
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(study / "results/csv")]
    argv += ["--out-dir", str(tmp_path / "reports"), "--model-csv", str(mine)]
    assert cli.main([*argv, "--runs-csv", str(study / "results/csv/runs.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{mine}, line 2: 3 columns in the header but 2 cells" in err[0], err
    assert err[0].endswith(
        "fix it, or give --model-csv the study's results/csv/model.csv "
        "(`snakemake results/csv/model.csv` writes it)"
    ), err
    assert not (tmp_path / "reports").exists()


def test_the_threshold_and_contingency_print_every_decimal_they_have(tmp_path):
    """E_s of at least 84.2% (threshold 0.8425) beside a measured E_s judged against 84.25, and a
    contingency of 8.3% (0.0833) beside node-hours computed with 8.33%: a reader recomputing
    the request from the printed fraction missed it."""
    overrides = ("proposal.efficiency_threshold=0.8425", "proposal.contingency=0.0833")
    config, study = build(tmp_path, *STRONG, *overrides)
    docs = write(config, study)
    assert "E_s of at least 84.25% (proposal.efficiency_threshold)" in docs["proposal.md"]
    assert "| contingency (8.33%) |" in docs["proposal.md"]
    assert "$E_s$ of at least 84.25\\,\\%" in docs["proposal.tex"]
    assert "contingency (8.33\\,\\%)" in docs["proposal.tex"]
    assert "efficiency of at least 84.25\\,\\%" in docs["slides.tex"]
    assert "contingency (8.33\\,\\%)" in docs["slides.tex"]


def test_rows_rescaled_by_the_planners_efficiency_guesses_are_named(tmp_path):
    """Next runs at 8 GPUs on 2 nodes, no multi-node run measured: the planner priced them from
    the 4-GPU runs x efficiency_inter_node / efficiency_intra_node (basis precision), a guess of
    the config, and the documents said only "calibrated from the measured runs"."""
    config, study = build(tmp_path, "hardware.device=cuda", "plan.efficiency_intra_node=0.9")
    docs = write(config, study)
    rescaled = [
        i for (s, i), v in cells(study).items() if s == "request" and v.get("basis") == "precision"
    ]
    assert rescaled  # the case at hand
    md = " ".join(docs["proposal.md"].split())
    for item in rescaled:
        assert f'"{item}"' in md.split("planner's efficiency guesses")[1], md
    assert "plan.efficiency_inter_node" in md
    tex = " ".join(docs["proposal.tex"].split())
    assert "efficiency guesses" in tex and "efficiency\\_inter\\_node" in tex
    slides = " ".join(docs["slides.tex"].split())
    assert all(item in slides.split("efficiency guesses")[1] for item in rescaled)


def test_the_profiling_request_is_each_jobs_time_limit_as_plan_md_prices_it(tmp_path):
    """The proposal asked hardware.runtime_min per profiling job, while a profile_ncu job starts
    its run ncu.top_k times: with a 20-minute start-up each profiling job asked for 15 minutes
    (the default floor) and Slurm would stop it. Its rows are the jobs' Slurm limits, from the
    runs' estimates, as plan.md's profiling line sums them."""
    config, study = build(tmp_path, "hardware.device=cuda", "plan.startup_s=1200")
    write(config, study)
    rows = read(study / "results/csv/proposal.csv")
    prof = [r for r in rows if r["section"] == "request" and r["item"].startswith("profiling")]
    node_h = sum(float(r["value"]) for r in prof if r["quantity"] == "node_hours")
    jobs = sum(int(r["value"]) for r in prof if r["quantity"] == "runs")
    measured = load_measured(study / "results/csv/runs.csv", study / "benchmarks/train")
    own = estimate_runs(config, build_run_table(config), measured)
    total = plan.profiling_total(config, own)
    assert jobs == total.jobs and jobs > 0
    # hours_per_run: the shape's mean rounded up to 3 significant digits (ceil3)
    assert total.node_hours <= node_h <= total.node_hours * 1.01
    floor = config["hardware"]["runtime_min"] / 60
    assert node_h > 1.5 * jobs * floor  # a 20-minute start-up x 1.5: no job at the floor
    assert {r["source"] for r in prof} == {proposal.PROFILING_SOURCE}
    # a row per rule and shape, its hours its jobs' limit (the mean, rounded up: one row held
    # a capture and an ncu job, and printed hours that were neither's)
    from scalestudy.study import profiling

    jobs = profiling.profiling_jobs(config, build_run_table(config), {e.run: e for e in own})
    for rule in ("profile_capture", "profile_ncu"):
        mine = [r for r in prof if r["item"].startswith(f"profiling ({rule}), ")]
        hours = [float(r["value"]) for r in mine if r["quantity"] == "hours_per_run"]
        limits = [j.runtime_s / 3600 for j in jobs if j.rule == rule]
        assert hours and max(limits) <= max(hours) <= max(limits) * 1.01, (rule, hours, limits)


@pytest.mark.parametrize("text", ["[WIP: measure scaling", "<5 hours per run is the goal"])
def test_free_text_opening_with_a_bracket_is_set_as_written(tmp_path, text):
    """proposal.objectives is free text, set after beamer's \\item: one opening with `[` or
    `<` was read as the item's label or overlay (latexmk: "File ended while scanning use of
    \\beamer@itemcheckopta"; "[draft] ..." built, its "draft" a label without the brackets)."""
    config, study = build(tmp_path, f"proposal.objectives={text}")
    docs = write(config, study)
    if not tex_here(beamer=True):
        pytest.skip(latex.missing("reports/slides.tex", latex.tex_gaps()))
    for name in ("proposal", "slides"):
        assert cli.main(["build-pdf", str(study / "reports" / f"{name}.tex")]) == 0, name
    # set as written: the objectives item holds the text's escape, brackets and all
    assert f"\\item {report.tex_escape(text)}\n" in docs["slides.tex"]
    assert report.tex_escape("[draft] x <y>") == "{[}draft{]} x {<}y>"


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ("holdout,strong,8,1920,2016,x,,\n", "line 2: rel_error = 'x' is not a finite number"),
        (
            "holdout,strong,8,1920,2016,0.05,,\nparameter,fit_below_compute,,,,,inf,\n",
            "line 3: value = 'inf' is not a whole number >= 0",
        ),
        (
            "holdout,strong,8,1920,2016,0.05,,\nparameter,fit_residual_rel_sd,,,,,big,\n",
            "line 3: value = 'big' is not a finite number",
        ),
        ("", "has no rows: `scalestudy model` writes"),
    ],
)
def test_a_model_csv_cell_the_proposal_reads_must_be_a_number(tmp_path, capsys, rows, says):
    """A hand-given --model-csv whose held-out error or fit counts are no number: a ValueError
    ("could not convert string to float") or OverflowError traceback. And a 0-byte one (a full
    disk) passed as "no held-out rows", though `scalestudy model` writes a row for every study.
    Each is one line naming the file now."""
    config, study = build(tmp_path, *STRONG)
    model = study / "m.csv"
    header = "kind,name,world_size,measured,predicted,rel_error,value,note\n"
    model.write_text(header + rows if rows else "")
    argv = ["proposal", "--config", str(DEMO), *(a for s in STRONG for a in ("--set", s))]
    argv += ["--csv-dir", str(study / "results/csv"), "--out-dir", str(tmp_path / "docs")]
    argv += ["--model-csv", str(model)]
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert str(model) in err and says in err, err
    assert not (tmp_path / "docs/proposal.md").exists()


def test_the_proposal_reruns_for_the_checkpointing_keys_its_numbers_read():
    """get_proposal_settings (its rerun trigger) left out all of checkpointing, "no number": yet
    a run past hardware.runtime_max goes on in further jobs, as many as signal_lead_s leaves
    room for, each with its start-up, and proposal.csv's node-hours (Estimate.held_s) are
    theirs. enabled, signal_lead_s and retries rerun it (too few retries: a production run is
    priced as one job); the checkpoints' place, cadence and count, and train.pg_timeout_s, do
    not."""
    base = ["hardware.runtime_max=10", "train.epochs=200", "checkpointing.retries=100"]
    config = load_and_validate(DEMO, overrides=base)
    settings = proposal.settings_json(config)
    longer = load_and_validate(DEMO, overrides=[*base, "checkpointing.signal_lead_s=300"])
    table = build_run_table(config)
    jobs = [sum(e.jobs for e in estimate_runs(c, table, [])) for c in (config, longer)]
    assert jobs[0] != jobs[1], jobs  # the number the proposal prices moved
    assert proposal.settings_json(longer) != settings
    for same in (
        "checkpointing.dir=elsewhere",
        "checkpointing.keep=5",
        "checkpointing.every_epochs=2",
        "train.pg_timeout_s=3600",
        "hardware.mem_mb_per_rank=2000",  # the Slurm request's, not the proposal's
        "container.image=containers/other.sif",  # read only with container.enabled
    ):
        other = load_and_validate(DEMO, overrides=[*base, same])
        assert proposal.settings_json(other) == settings, same
    on = ["container.enabled=true"]
    with_image = load_and_validate(DEMO, overrides=[*base, *on])
    other_image = load_and_validate(DEMO, overrides=[*base, *on, "container.image=other.sif"])
    assert proposal.settings_json(with_image) != proposal.settings_json(other_image)
    fewer = load_and_validate(DEMO, overrides=[*base, "checkpointing.retries=90"])
    assert proposal.settings_json(fewer) != settings
    # without runtime_max a run is one job: the lead and the switch set its limit only, which
    # the request does not price (turning checkpoints off reran the proposal: test_workflow)
    one_job = load_and_validate(DEMO)
    for other in (
        "checkpointing.signal_lead_s=300",
        "checkpointing.enabled=false",
        "checkpointing.retries=5",
    ):
        changed = load_and_validate(DEMO, overrides=[other])
        assert proposal.settings_json(changed) == proposal.settings_json(one_job), other


@pytest.mark.parametrize(
    ("broken", "says"),
    [("{% if %}\n", "proposal.md.j2, line "), (b"\xff", "proposal.md.j2 is no UTF-8 text")],
    ids=["syntax", "bytes"],
)
def test_a_broken_template_is_one_line(demo, tmp_path, capsys, broken, says):
    """A template of --templates with a syntax error (or a byte that is no UTF-8) was jinja's
    traceback in proposal, and a line without the file in render-report."""
    _, study, _ = demo
    templates = tmp_path / "templates"
    shutil.copytree(report.TEMPLATES, templates)
    md = templates / "proposal.md.j2"
    md.write_bytes(md.read_bytes() + (broken if isinstance(broken, bytes) else broken.encode()))
    argv = ["proposal", "--config", str(DEMO), "--csv-dir", str(study / "results/csv")]
    argv += ["--templates", str(templates), "--out-dir", str(tmp_path / "out")]
    argv += ["--out-csv", str(tmp_path / "out" / "proposal.csv")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "--templates" in err[0], err
    assert not (tmp_path / "out").exists()
