"""End to end on the tiny study (tests/conftest.py `tiny_study`, one repeat, no profiling, CPU):
the analysis CSVs, the figures, reports/study.md and paper.tex built from the CSVs only,
paper.pdf with its figures (latexmk; required under CI=true), and `snakemake --report`."""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import re
import shutil
from decimal import Decimal
from html import escape as html_escape
from pathlib import Path

import pytest
from workflow_helpers import REPO, fsync_fails_at_file, snakemake

from scalestudy import files, vocab
from scalestudy.errors import AnalysisError
from scalestudy.results import analyze, plot
from scalestudy.results import build_pdf as latex
from scalestudy.results import model as model_csv
from scalestudy.results import render_report as report

pytestmark = pytest.mark.workflow

# the demo's figures: all but the GPU's utilisation and energy (NVML's) and the kernel-share
# profile (a CPU study)
FIGURES = [f for f in plot.FIGURES if f not in ("gpu_util", "energy", "profile")]


def need_latexmk() -> None:
    """Skip a test that builds a PDF where TeX is absent; fail it under CI, which has TeX."""
    if not latex.have_latexmk():
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have TeX: scripts/setup.sh installs latexmk as root")
        pytest.skip(latex.missing("reports/paper.tex", latex.tex_gaps()))


@pytest.fixture(scope="module")
def done(tiny_study):
    return tiny_study


def read(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_scaling_csv_is_honest_about_one_repeat(done):
    rows = read(done / "results/csv/scaling.csv")
    assert {r["family"] for r in rows} == {"strong", "weak", "precision", "bucket"}
    assert all(r["n"] == "1" and r["throughput_img_s_std"] == "" for r in rows)
    strong = sorted((r for r in rows if r["family"] == "strong"), key=lambda r: r["world_size"])
    assert float(strong[0]["strong_efficiency"]) == pytest.approx(1.0)
    # E_s(2) = T(1) / (2 T(2)) from the two runs' own throughputs
    runs = {r["run"]: r for r in read(done / "results/csv/runs.csv")}
    t1 = 64 / float(runs["w1_lb64_fp32_ddp_bk25_r0"]["throughput_img_s"])
    t2 = 64 / float(runs["w2_lb32_fp32_ddp_bk25_r0"]["throughput_img_s"])
    assert float(strong[1]["strong_efficiency"]) == pytest.approx(t1 / (2 * t2), rel=1e-6)
    verdicts = {r["target"]: r for r in read(done / "results/csv/verdicts.csv")}
    # judged at the tiny study's 2 ranks (a target the strong family does not run is refused)
    judged = verdicts["strong_efficiency"]
    assert judged["verdict"] in ("pass", "fail") and judged["world_size"] == "2"
    assert float(judged["measured"]) == pytest.approx(float(strong[1]["strong_efficiency"]))
    assert verdicts["weak_deviation"]["verdict"] in ("pass", "fail")
    assert (done / "results/tables/scaling.html").read_text().count("<tr>") == len(rows) + 1


def test_waterfall_parts_sum_to_the_loss_and_the_documents_show_it(done):
    rows = read(done / "results/csv/waterfall.csv")
    # strong and weak ran at 1 and 2 ranks: one row each above N0 = 1
    assert sorted((r["family"], r["world_size"]) for r in rows) == [("strong", "2"), ("weak", "2")]
    for r in rows:
        parts = sum(float(r[f"{p}_img_s"]) for p in ("comm", "data", "imbalance", "residual"))
        # each cell holds 12 significant digits (analyze.cell)
        assert parts == pytest.approx(float(r["loss_img_s"]), rel=1e-9, abs=1e-9), r
        assert r["note"] == ""  # this trainer records every input of every part
    study = (done / "reports/study.md").read_text()
    assert "### Where the efficiency goes" in study and "add up to the loss" in study
    # with the decimals at which the row's printed parts add up (summing_decimals): at one
    # decimal, 0.255% was "0.3", not in a row printed "+0.26" (an intermittent failure)
    r = rows[0]
    parts = [r[f"{p}_frac"] for p in ("comm", "data", "imbalance", "residual")]
    k = report.summing_decimals(parts, r["loss_frac"])
    assert f"| {100 * float(r['imbalance_frac']):+.{k}f} |" in study
    assert "Where the efficiency goes" in (done / "reports/paper.tex").read_text()


def test_every_figure_as_png_and_pdf(done):
    for name in FIGURES:
        assert (done / f"results/plots/{name}.png").read_bytes()[:4] == b"\x89PNG", name
        assert (done / f"results/plots/{name}.pdf").read_bytes()[:4] == b"%PDF", name
    # CPU study, no profiling stage: no GPU-utilisation, energy or profile figure is claimed
    assert not (done / "results/plots/gpu_util.png").exists()
    assert not (done / "results/plots/energy.png").exists()
    assert not (done / "results/plots/profile.png").exists()


@pytest.mark.parametrize("name", ["study.md", "paper.tex"])
def test_every_number_in_the_documents_is_a_csv_cell(done, name):
    text = (done / "reports" / name).read_text()
    tables = report.load_tables(done / "results/csv")
    assert report.numbers_backed_by_csvs(text, tables) == []
    # the check bites: the measured throughput is there, a number typed in is caught
    x = report.fmt_num(read(done / "results/csv/scaling.csv")[0]["throughput_img_s_mean"])
    assert x in text
    assert report.numbers_backed_by_csvs(text + " 93.37", tables) == ["93.37"]
    # ... and so is a sign flipped on the way: -X is a different claim from X
    assert report.numbers_backed_by_csvs(text + f" -{x}", tables) == [f"-{x}"]


@pytest.mark.parametrize("name", ["study.md", "paper.tex"])
def test_documents_state_what_did_not_run_and_hold_no_placeholder(done, name):
    # the paper's commit may break at any of its `b` filter's break points
    text = (done / "reports" / name).read_text().replace(report.BREAK, "")
    assert "Not profiled: " in text  # the tiny study does not profile
    assert "GPU utilisation was not measured" in text
    assert re.search(r"configuration ran once", text)
    assert not re.search(r"placeholder|TODO|TBD|lorem|XXX|\?\?", text, re.I)
    assert "not measured" in text  # the optimisation target: the precision family is fp32 only
    sha = read(done / "results/csv/runs.csv")[0]["git_commit"]
    if sha.endswith("-dirty"):  # tests run from a working tree with uncommitted changes
        assert f"git commit \\texttt{{{sha[:-6]}}}" in text or f"commit `{sha[:-6]}`" in text
        assert "git checkout" not in text
    else:
        assert f"git checkout {sha}" in text
    assert "--configfile tiny.yaml" in text
    for figure in FIGURES:
        assert f"{figure}.{'png' if name.endswith('md') else 'pdf'}" in text


def test_paper_pdf_renders_with_its_figures(done):
    need_latexmk()
    assert (done / "reports/paper.pdf").read_bytes()[:4] == b"%PDF"
    log = (done / "reports/paper.log").read_text(errors="replace")
    assert re.search(r"Output written on paper\.pdf \(\d+ pages", log)
    for figure in FIGURES:  # pdfTeX logs every graphic it embedded
        assert f"results/plots/{figure}.pdf" in log, figure
    # nothing runs off the page: the system table's commit and image digest in \texttt never
    # broke (130 pt too wide here; 440 pt with 8 hosts), nor did the reproduce paragraph's
    # commit; their column wraps now (render_report.tex_breakable)
    wide = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\) in \w+ at lines (\S+)", log)
    assert [w for w in wide if float(w[0]) > 1.0] == [], wide
    # the PDF and its log beside the .tex, none of TeX's and latexmk's other files, which no
    # rule declares (`snakemake --delete-all-output` left them in reports/)
    left = {p.suffix for p in (done / "reports").glob("paper.*")}
    assert left == {".tex", ".pdf", ".log"}, left


def _large_study(csv_dir):
    """A study of 64 configurations (scaling.csv rows): strong and weak at 1 to 128 GPUs, four
    precisions at each, a 4 x 4 bucket grid at 8; analysed and modelled into csv_dir."""
    from test_model import DEMO

    with DEMO.open() as f:
        base = next(csv.DictReader(f))
    runs = {}

    def add(family, n, lb, precision="bf16", cap=25.0):
        run_id = f"w{n}_lb{lb}_{precision}_ddp_bk{cap:g}_r0"
        x = 3000.0 * n * 0.9 ** math.log2(n) * (1 + 0.001 * lb)
        row = runs.setdefault(run_id, {**base, "run": run_id, "families": "", "world_size": n,
            "gpus": n, "nodes": max(1, n // 4), "local_batch": lb, "global_batch": lb * n,
            "precision": precision, "bucket_cap_mb": cap, "throughput_img_s": x,
            "epoch_time_s": 50000 / x, "train_time_s": 30 * 50000 / x, "repeat": 0})  # fmt: skip
        row["families"] = ";".join(filter(None, (row["families"], family)))

    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        add("strong", n, 2048 // n)  # one global batch, as a strong family keeps
        add("weak", n, 256)
        for precision in ("fp32", "tf32", "fp16", "bf16"):
            add("precision", n, 256, precision)
    for cap in (1.0, 5.0, 25.0, 100.0):
        for lb in (32, 64, 128, 256):
            add("bucket", 8, lb, cap=cap)
    return _modelled(csv_dir, list(runs.values()))


def test_a_large_studys_tables_break_across_pages(tmp_path):
    """The paper set each table as one tabular, which never breaks: with 64 configurations the
    Configuration and MFU tables ran past the bottom of the page (pdfTeX's "Overfull \\vbox"),
    their last rows missing from the PDF, and build-pdf succeeded. The tables of the study's
    rows are longtables now, which continue on the next page."""
    from scalestudy import cli

    tables = _large_study(tmp_path / "csv")
    assert len(tables["scaling"]) == 64
    out = tmp_path / "reports"
    assert (
        cli.main(["render-report", "--csv-dir", str(tmp_path / "csv"), "--out-dir", str(out)]) == 0
    )
    paper = (out / "paper.tex").read_text()
    for section, ends in (
        ("Configuration", "\\section{Results}"),
        ("Hardware efficiency", "\\subsection"),
    ):
        body = paper[paper.index(section) :]
        body = body[: body.index(ends, 1)]
        # one longtable, with a row per configuration
        assert body.count("\\begin{longtable}") == 1 and "\\begin{tabular}" not in body, section
        rows = [line for line in body.splitlines() if line.startswith(("strong &", "weak &",
                "precision &", "bucket &"))]  # fmt: skip
        assert len(rows) == len(tables["scaling"]), section
    need_latexmk()
    assert cli.main(["build-pdf", str(out / "paper.tex")]) == 0
    log = (out / "paper.log").read_text(errors="replace")
    pages = int(re.search(r"Output written on paper\.pdf \((\d+) pages", log).group(1))
    assert pages > 1
    # a page whose body is taller than the text block: rows past its bottom margin, or its edge
    assert re.findall(r"Overfull \\vbox \(([\d.]+)pt too high\)", log) == []


def test_snakemake_report_has_the_categories(done):
    snakemake(done, "--configfile", "tiny.yaml", "--report", "report.html", stand_ins=True)
    html = (done / "report.html").read_text(errors="replace")
    for item in ("Tables", "Figures", "Documents", "throughput.png", "scaling.html", "study.md"):
        assert item in html, item
    for item in ("waterfall.png", "waterfall.html", "The efficiency-loss waterfall"):
        assert item in html, item


def _cells_per_row_agree(text: str) -> int:
    """Assert each Markdown table's separator and rows have its header's cells (a '|' escaped
    as '\\|' is text in its cell); return how many tables there are."""
    lines = text.splitlines()
    tables = 0
    for i, line in enumerate(lines):
        if not line.startswith("|---"):
            continue
        assert re.fullmatch(r"\|(---\|)+", line), line  # a separator alone on its line
        tables += 1
        # a table right under a paragraph's last line is that paragraph's text in Python-
        # Markdown (MkDocs): the header needs a blank line above it
        assert i < 2 or lines[i - 2] == "", (lines[i - 2], lines[i - 1])
        width = lines[i - 1].count("|")
        assert line.count("|") == width, (lines[i - 1], line)
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                break
            assert len(re.findall(r"(?<!\\)\|", row)) == width, (lines[i - 1], row)
    return tables


def test_every_markdown_table_has_as_many_cells_as_its_header(done):
    """A separator or row with a cell too many or too few renders as a broken table."""
    assert _cells_per_row_agree((done / "reports/study.md").read_text()) >= 5


def test_a_pipe_or_line_break_in_a_config_value_stays_in_its_cell(done, tmp_path):
    """A study named "a|b" split the system table's row into four cells; a line break in a
    value ended the row."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        text = (done / f"results/csv/{name}.csv").read_text()
        (csv_dir / f"{name}.csv").write_text(text)
    rows = read(csv_dir / "system.csv")
    for row in rows:
        if (row["section"], row["key"]) == ("study", "name"):
            row["value"] = "left|right\nnext line"
    files.write_csv(csv_dir / "system.csv", list(rows[0]), rows)
    text = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")["study.md"]
    assert "| study | name | left\\|right next line |" in text
    assert _cells_per_row_agree(text) >= 5


@pytest.mark.parametrize(
    ("commit", "says"),
    [
        ("0123abc", "git checkout 0123abc\n"),
        ("0123abc-dirty", "uncommitted changes on top of git commit"),
        ("0123abc; 4567def", "different git commits"),
        # the last of several commits dirty: still several commits, not one with changes
        ("0123abc; 4567def-dirty", "different git commits"),
        ("not recorded", "was not recorded"),
    ],
)
def test_reproduce_prints_git_checkout_only_for_one_clean_commit(done, tmp_path, commit, says):
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        text = (done / f"results/csv/{name}.csv").read_text()
        if name == "system":
            rows = read(done / "results/csv/system.csv")
            key = "git commit of the runs"
            recorded = next(r["value"] for r in rows if r["key"] == key)
            text = text.replace(recorded, commit)
        (csv_dir / f"{name}.csv").write_text(text)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    for name, text in docs.items():
        assert says in text, name
        assert ("git checkout" in text) == (commit == "0123abc"), name
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name


def test_a_model_without_a_fit_is_said_and_not_blamed_on_the_families(done, tmp_path):
    """model.csv with only its "no fit" row: the paper said the model was "fitted to the
    multi-rank runs" and both documents blamed the missing held-out check on the families,
    though the strong family ran three world sizes."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    why = "no fit: no multi-rank ddp configuration with a 1-rank run of its precision"
    row = {"kind": "parameter", "name": "fit", "note": why}
    files.write_csv(csv_dir / "model.csv", model_csv.MODEL_COLUMNS, [row])
    # the advice as `scalestudy model` writes it without a fit: one row, no world size
    from scalestudy.study import model as study_model

    advice = [model_csv._advice_row(vars(a)) for a in study_model.advise(None, [])]
    advice_text = files.csv_text(model_csv.ADVICE_COLUMNS, advice, model_csv.cell)
    (csv_dir / "bucket_advice.csv").write_text(advice_text)
    (advice,) = read(csv_dir / "bucket_advice.csv")
    assert advice["world_size"] == "" and advice["note"].startswith("not enough data: ")
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    flat = {name: " ".join(text.split()) for name, text in docs.items()}
    why = why.removeprefix("no fit: ")  # said once: "no fit (no fit: ..." said it twice
    assert f"This study's runs give the model no fit ({why})." in flat["paper.tex"]
    assert f"the model has no fit to hold a world size out of ({why})" in flat["study.md"]
    # no held-out table: its header without rows, under a paragraph describing the check
    assert "Held-out check: for each family" not in flat["study.md"]
    assert "| measured step (s) | predicted (s) |" not in docs["study.md"]
    assert "measured step (s) & predicted (s)" not in docs["paper.tex"]
    # nor an advice table of one empty row ("| | | | | n/a | n/a ..."), but the reason
    assert "Bucket advice:" not in flat["study.md"]
    said = f"No bucket advice: the scaling model has {advice['note']}."
    assert said in flat["study.md"]
    for name, text in flat.items():
        assert "no scaling family whose runs the model could hold out" not in text, name
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name
    # and with a held-out row none could validate (a strong family of one world size): it said
    # "Read the error as how far the plan's prices ... can be trusted", and not why there is none
    unvalidated = {"kind": "holdout", "name": "strong", "note": "not validated: world sizes 2"}
    files.write_csv(csv_dir / "model.csv", model_csv.MODEL_COLUMNS, [row, unvalidated])
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    study = " ".join(docs["study.md"].split())
    assert "Read the error" not in study
    assert f"the model has no fit to hold a world size out of ({why})" in study


def test_the_paper_points_to_the_profiling_figure_only_when_it_shows_it(done, tmp_path):
    """With kernel shares but without --figures profile, the paper said they "are shown in the
    profiling figure", which it did not include."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    row = {"run": "w1", "tool": "torch.profiler", "rank": "0", "category": "conv",
           "total_ns": "1000", "share": "0.5"}  # fmt: skip
    files.write_csv(csv_dir / "profile_shares.csv", analyze.TABLE_COLUMNS["profile_shares"], [row])
    for figures, shown in ((FIGURES, False), ([*FIGURES, "profile"], True)):
        paper = report.render(csv_dir, done / "workflow/report", figures, "../results/plots")
        text = " ".join(paper["paper.tex"].split())
        assert ("shown in the profiling figure" in text) == shown
        assert ("their figure is not included in this document" in text) == (not shown)


def test_the_papers_verdicts_say_which_way_the_threshold_points(done):
    """The paper's verdict table printed "10.0 & 5.2 & pass" with no sign that the weak
    deviation must stay below its threshold and the efficiencies above theirs."""
    csv_dir = done / "results/csv"
    verdicts = report.load_tables(csv_dir)["verdicts"]
    assert {v["target"] for v in verdicts} >= {"weak_deviation"}
    paper = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    for v in verdicts:
        sign = "$\\le$" if v["target"] == "weak_deviation" else "$\\ge$"
        threshold = report.fmt_pct_bar(v["threshold"], v["measured"])
        assert f"& {sign} {threshold} &" in paper["paper.tex"], v


def test_a_verdicts_value_is_printed_apart_from_its_threshold(done, tmp_path):
    """E_s = 0.6996 printed "70.0" next to ">= 70.0" and "fail"; the paper's verdict rows
    said "(1 ranks)" and repeated the strong target's world size its description names."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    rows = read(csv_dir / "verdicts.csv")
    given = {
        "strong_efficiency": ("0.7", "4", "0.6996", "fail"),
        "weak_deviation": ("0.1", "4", "0.1", "pass"),  # equal cells: one decimal
        "optimisation_speedup": ("0.2", "1", "0.25", "pass"),
    }
    for row in rows:
        row["threshold"], row["world_size"], row["measured"], row["verdict"] = given[row["target"]]
    files.write_csv(csv_dir / "verdicts.csv", list(rows[0]), rows)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    md = docs["study.md"]
    # the threshold with at least the measured value's decimals (fmt_pct_bar)
    assert "| >= 70.00% | 4 | 69.96% | **fail** |" in md
    assert "| <= 10.0% | 4 | 10.0% | **pass** |" in md
    assert "| >= 20.0% | 1 | 25.0% | **pass** |" in md
    paper = " ".join(docs["paper.tex"].split())
    # the strong row's description names its world size: no "(4 ranks)" after it
    assert re.search(r"E\\_s at [^&(]*& \$\\ge\$ 70\.00 & 69\.96 & \\textbf\{fail\}", paper)
    assert re.search(r"tolerance\) \(1 (rank|GPU)\) & \$\\ge\$ 20\.0 & 25\.0 &", paper)
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name


def test_a_waterfall_rows_printed_parts_add_up_to_its_printed_loss(done, tmp_path):
    """The documents say the four parts add up to the loss, and X_ideal - X is the loss in
    img/s; each cell rounded on its own printed 13.5 = +13.9 +0.1 +0.3 -0.7 (13.6) and
    2382 - 534 = 1849 (the demo's runs, below). Each row is printed with the fewest decimals
    at which its printed parts add up (summing_decimals), every number still a cell."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    rows = read(csv_dir / "waterfall.csv")
    demo = {  # the demo study's (2026-12-04): weak at 2 ranks, strong at 4
        "weak": ("954.024731941", "824.782160855", "129.242571086", "0.135470881161",
                 "0.138638743137", "0.00110691218802", "0.00296029781032", "-0.00723507197348"),
        "strong": ("2382.44432744", "533.80349738", "1848.64083006", "0.775942929187",
                   "0.185945415288", "0.0057874369739", "0.0253739822886", "0.558836094636"),
    }  # fmt: skip
    columns = ("x_ideal", "x_measured", "loss_img_s", "loss_frac", "comm_frac", "data_frac",
               "imbalance_frac", "residual_frac")  # fmt: skip
    for row in rows:
        row.update(zip(columns, demo[row["family"]], strict=True))
    files.write_csv(csv_dir / "waterfall.csv", list(rows[0]), rows)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    md_rows = [
        line.split(" | ")
        for line in docs["study.md"].splitlines()
        if line.startswith(("| weak | 2 |", "| strong | 2 |"))
        and line.count(" | ") > 12  # the waterfall's, not the scaling table's
    ]
    assert len(md_rows) == 2
    for cells in md_rows:
        x_ideal, x, loss, loss_pct, *parts = (Decimal(c) for c in cells[5:13])
        assert x_ideal - x == loss, cells
        assert sum(parts) == loss_pct, cells
    assert "| 954 | 825 | 129 | 13.55 | +13.86 | +0.11 | +0.30 | -0.72 |" in docs["study.md"]
    paper = " ".join(docs["paper.tex"].split())
    assert "& 13.55 & +13.86 & +0.11 & +0.30 & -0.72 \\\\" in paper
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name


def test_a_percentage_is_printed_with_the_decimals_that_tell_it_from_another():
    apart = report.fmt_pct_apart
    assert [apart(0.6996, 0.7), apart(0.69996, 0.7), apart(0.7, 0.7), apart(0.81, 0.7)] == [
        "69.96", "69.996", "70.0", "81.0"]  # fmt: skip
    # an accuracy difference against the (unsigned) tolerance, signed as spct prints it
    assert report.fmt_pct_apart(-0.0104, 0.01, signed=True) == "-1.04"
    assert report.fmt_pct_apart(-0.0096, 0.01, signed=True) == "-0.96"
    assert report.fmt_pct_apart("", 0.01) == "n/a"
    assert report.fmt_pct_apart(0.5, "") == "50.0"
    # a threshold or tolerance: every decimal it has, and at least those of the value beside it
    bar = report.fmt_pct_bar
    assert [bar(0.8425), bar("0.0125"), bar(0.7), bar(0.1, 0.1), bar("", 0.5)] == [
        "84.25", "1.25", "70.0", "10.0", "n/a"]  # fmt: skip
    assert [bar(0.8425, 0.842429690452), bar(0.7, 0.6996), bar(0.7, 0.81), bar(0.7, "")] == [
        "84.25", "70.00", "70.0", "70.0"]  # fmt: skip


def test_a_threshold_or_tolerance_is_printed_with_every_decimal_it_has(done, tmp_path):
    """A threshold of 0.8425 was printed ">= 84.2%" beside a measured 84.24% and "fail", and a
    tolerance of 0.0125 "1.2 percentage points" above a difference of -1.24 "within" it: fmt_pct
    rounded the bar to one decimal, while the value judged against it got as many as it needed."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    threshold, measured, tolerance = "0.8425", "0.842429690452", "0.0125"
    rows = read(csv_dir / "verdicts.csv")
    for row in rows:
        if row["target"] == "strong_efficiency":
            row.update(threshold=threshold, world_size="2", measured=measured, verdict="fail")
    files.write_csv(csv_dir / "verdicts.csv", list(rows[0]), rows)
    targets = read(csv_dir / "targets.csv")
    for row in targets:
        if row["target"] == "accuracy_tolerance":
            row["value"] = tolerance
    files.write_csv(csv_dir / "targets.csv", list(targets[0]), targets)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    rows = {
        "study.md": r"\| >= ([\d.]+)% \| 2 \| ([\d.]+)% \| \*\*fail\*\*",
        "paper.tex": r"E\\_s at [^&]*& \$\\ge\$ ([\d.]+) & ([\d.]+) & \\textbf\{fail\}",
    }
    for name, text in docs.items():
        flat = " ".join(text.split())
        bar, value = re.search(rows[name], flat).groups()
        # the bar as it is, not rounded onto the failed value's side of it
        assert float(bar) == pytest.approx(100 * float(threshold), abs=1e-9), (name, bar)
        assert float(value) < float(bar)
        assert len(bar.partition(".")[2]) >= len(value.partition(".")[2]), (name, bar, value)
        said = re.search(
            r"by more than ([\d.]+) percentage points|tolerance of ([\d.]+) perc", flat
        )
        assert float(said.group(1) or said.group(2)) == pytest.approx(100 * float(tolerance))
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name


def _csvs_with_energy(done, csv_dir, kwh, basis=""):
    """The tiny study's CSVs with every resources row's energy_kwh set to `kwh` ("" = blank)
    and its energy_basis to `basis`."""
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    rows = read(csv_dir / "resources.csv")
    for r in rows:
        r["energy_kwh"], r["energy_basis"] = kwh, basis
    with (csv_dir / "resources.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("kwh", ["0.0421", ""])
def test_energy_is_shown_from_its_cell_or_said_to_be_unmeasured(done, tmp_path, kwh):
    """The CPU tiny study measures no energy: blank cells say so; a measured kWh (as a GPU study
    writes it) gets its column in both documents, the value formatted from the cell, and a sum
    of both kinds of J/img says so (resources.csv energy_basis), not only the rule."""
    csv_dir = tmp_path / "csv"
    mixed = "mixed: 3 training, 1 evaluation included"
    _csvs_with_energy(done, csv_dir, kwh, mixed if kwh else "")
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    for name, text in docs.items():
        assert ("GPU energy (kWh)" in text) == bool(kwh), name
        assert ("GPU energy was not measured" in text) == (not kwh), name
        assert (mixed in " ".join(text.split())) == bool(kwh), name
        if kwh:  # (without it the text may hold 0.0421 as another measured number, by chance)
            assert "0.0421" in text, name
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name


@pytest.mark.parametrize("name", ["study.md", "paper.tex"])
def test_energy_on_cpu_says_not_measured_with_the_trainers_reason(done, name):
    """No kWh on CPU ranks, and the reason is the trainer's (system.csv), not a fixed "it needs
    a GPU and nvidia-ml-py" that was said of GPU runs too short for the counter as well."""
    text = (done / "reports" / name).read_text()
    system = {r["key"]: r["value"] for r in read(done / "results/csv/system.csv")}
    why = system["why GPU energy is not measured"]
    assert why == "no GPU", why
    kwh = ", so no kWh are given" if name.endswith(".md") else ""
    said = (
        f"no run has a usable reading of NVML's energy counter{kwh}. The trainer's reason: {why}."
    )
    assert f"GPU energy was not measured: {said}" in text
    assert "no run recorded NVML's energy counter" not in text  # the fixed reason's words


@pytest.mark.parametrize("name", ["study.md", "paper.tex"])
def test_mfu_section_on_cpu_says_not_measured_and_why(done, name):
    """The tiny study ran on CPU ranks: no peak FLOP/s, so the MFU section gives the trainer's
    reason (system.csv) in words and the model FLOP rate of every configuration, no MFU column."""
    text = (done / "reports" / name).read_text()
    system = {r["key"]: r["value"] for r in read(done / "results/csv/system.csv")}
    why = system["why MFU is not measured"]
    assert why.startswith("cpu: ")
    section = text[text.index("Hardware efficiency (MFU)") :]
    section = section[: section.index("Scaling model")]
    escape = report.tex_escape if name.endswith(".tex") else str
    said = f"no run has a published peak FLOP/s to divide by (the trainer's reason: {escape(why)})"
    assert f"MFU was not measured: {said}" in section
    assert "MFU (" not in section  # no column of n/a
    assert escape(system["FLOPs per training image"]) in section
    scaling = read(done / "results/csv/scaling.csv")
    assert all(r["mfu_mean"] == "" and float(r["model_tflops_mean"]) > 0 for r in scaling)
    rates = [report.fmt_num(r["model_tflops_mean"]) for r in scaling]
    assert all(rate in section for rate in rates)
    assert section.count("TFLOP/s") == 1


def _analyzed(csv_dir, runs):
    """`scalestudy analyze` on hand-written runs.csv rows, plus a scaling model without a fit
    (model.csv as `scalestudy model` writes it then: its "no fit" row)."""
    files.write_csv(csv_dir / "runs.csv", None, runs)
    parser = argparse.ArgumentParser()
    analyze.add_arguments(parser)
    argv = ["--runs", str(csv_dir / "runs.csv"), "--out-dir", str(csv_dir), "--html-dir",
            str(csv_dir / "html"), "--gpus-per-node", "4", "--study", "hand",
            "--configfile", "hand.yaml"]  # fmt: skip
    assert analyze.run(parser.parse_args(argv)) == 0
    _no_fit(csv_dir)
    return report.load_tables(csv_dir)


def _no_fit(csv_dir: Path) -> None:
    """model.csv and bucket_advice.csv of a scaling model without a fit (hand-written runs.csv
    rows lack the columns `scalestudy model` reads), as model_table writes them."""
    rows = model_csv.model_table([], [], "hand-written runs, not modelled", {})
    files.write_csv(csv_dir / "model.csv", model_csv.MODEL_COLUMNS, rows)
    files.write_csv(csv_dir / "bucket_advice.csv", model_csv.ADVICE_COLUMNS, [])


def _gpu_run(run_id, family, world_size, x, repeat, gpu="NVIDIA H100 80GB HBM3", peak=989.5e12):
    flops = 3328997376  # one training image of the width-64 network, forward + backward
    return {
        "run": f"{run_id}_r{repeat}",
        "families": family,
        "world_size": world_size,
        "nodes": 1,
        "local_batch": 256 // world_size,  # a strong family's runs keep one global batch
        "global_batch": 256,
        "precision": "bf16",
        "bucket_cap_mb": 25,
        "repeat": repeat,
        "throughput_img_s": x,
        "epoch_time_s": 50000 / x,
        "final_val_acc": 0.9,
        "comm_exposed_frac": 0.1,
        "gpu_util_mean": "",
        "train_time_s": 600.0,
        "device": "cuda",
        "device_type": "cuda",
        "device_name": gpu,
        "flops_per_img": flops,
        "model_flops_per_s": x * flops,
        "peak_flops": peak,
        "peak_flops_source": peak and "H100 SXM column: bf16 dense",
        "mfu": peak and x * flops / (peak * world_size),
        "mfu_unmeasured": None if peak else "V100 SXM2 has no bf16 units (hardware.py)",
        "compiled": True,
    }


def test_mfu_section_shows_measured_values_from_their_cells(tmp_path):
    """GPU runs with a published peak: MFU (%) mean and std per configuration, the FLOP rate in
    TFLOP/s, every number a cell; a configuration without a peak is n/a with the reason."""
    runs = [
        _gpu_run("w1", "strong", 1, 20000, 0),
        _gpu_run("w1", "strong", 1, 21000, 1),
        _gpu_run("w2", "strong", 2, 38000, 0),
        _gpu_run("w2", "strong", 2, 37000, 1),
    ]
    tables = _analyzed(tmp_path, runs)
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    scaling = tables["scaling"]
    # 20500 img/s x 3.329e9 FLOP / (989.5e12 FLOP/s x 1) = 6.9 %
    assert report.fmt_pct(scaling[0]["mfu_mean"]) == "6.9"
    for name, text in docs.items():
        section = text[text.index("Hardware efficiency (MFU)") :]
        section = section[: section.index("Scaling model")]
        assert "MFU was not measured" not in section, name
        assert "MFU (" in section and "H100 SXM column: bf16 dense" in section, name
        sep = " & " if name.endswith(".tex") else " | "
        for r in scaling:  # TFLOP/s mean, std, MFU (%) mean, std: one row of the table
            cells = [report.fmt_num(r["model_tflops_mean"]), report.fmt_num(r["model_tflops_std"])]
            cells += [report.fmt_pct(r["mfu_mean"]), report.fmt_pct(r["mfu_std"])]
            assert sep.join(cells) in section, (name, cells)
        assert "n/a: no MFU" not in section, name
        assert report.numbers_backed_by_csvs(text, tables) == [], name
        # the check bites on this section too: the FLOP rate divided in the template is no cell
        tflops = float(scaling[0]["model_flops_per_s_mean"]) / 1e12
        assert report.numbers_backed_by_csvs(f"{tflops:.3f}", tables) == [f"{tflops:.3f}"], name

    # one configuration on a GPU without bf16 units, so without a peak: n/a there, with why
    runs += [_gpu_run("v1", "precision", 1, 3000, 0, gpu="Tesla V100-SXM2-32GB", peak=None)]
    tables = _analyzed(tmp_path, runs)
    for name, text in report.render(tmp_path, report.TEMPLATES, [], "../results/plots").items():
        assert "n/a: no MFU for that configuration (V100 SXM2 has no bf16 units" in text, name
        assert "MFU (" in text and "MFU was not measured" not in text, name
        assert report.numbers_backed_by_csvs(text, tables) == [], name


def test_a_quantity_some_runs_measured_is_not_called_unmeasured(tmp_path):
    """A configuration's mean needs every repeat's value and a family's kWh every run's: with
    repeat 1 of each configuration unsampled (no NVML samples, a GPU without a published peak,
    no energy counter) the documents said "no run recorded it" of a study where half had."""
    runs = []
    for repeat in (0, 1):
        for run_id, world_size, x in (("w1", 1, 20000), ("w2", 2, 38000)):
            run = _gpu_run(run_id, "strong", world_size, x, repeat)
            if repeat == 0:
                run.update(gpu_util_mean=87.5, energy_j_per_img=0.5, train_images_per_epoch=50000)
                run["epochs"] = 3
            else:
                run.update(mfu=None, peak_flops=None, peak_flops_source=None)
                run["mfu_unmeasured"] = "NVIDIA H100 PCIe: not in the table of published peaks"
            runs.append(run)
    tables = _analyzed(tmp_path, runs)
    measured = {r["key"]: r["value"] for r in tables["system"] if r["section"] == "measured"}
    assert measured == {
        "runs with GPU utilisation": "2",
        "runs with GPU energy": "2",
        "runs with MFU": "2",
    }
    for name, text in report.render(tmp_path, report.TEMPLATES, [], "../results/plots").items():
        flat = " ".join(text.split())
        for what in ("GPU utilisation", "GPU energy", "MFU"):
            assert f"{what} was not measured" not in flat, (name, what)
        assert "GPU utilisation is in no configuration's every repeat: 2 of 4 runs" in flat, name
        assert "No family has a kWh: 2 of 4 runs recorded" in flat, name
        assert "MFU is in no configuration's every repeat: 2 of 4 runs have one" in flat, name
        assert "not in the table of published peaks" in flat, name
        assert report.numbers_backed_by_csvs(text, tables) == [], name
    # none measured: said as before
    for run in runs:
        run.update(gpu_util_mean=None, energy_j_per_img=None, mfu=None, peak_flops=None)
    tables = _analyzed(tmp_path, runs)
    for name, text in report.render(tmp_path, report.TEMPLATES, [], "../results/plots").items():
        flat = " ".join(text.split())
        for what in ("GPU utilisation", "GPU energy", "MFU"):
            assert f"{what} was not measured" in flat, (name, what)


def test_the_energy_paragraph_says_which_basis_leaves_evaluation_out(tmp_path):
    """kWh sums J/img x the images trained, so with the training spans' J/img it holds no
    evaluation whatever the test set (analyze.energy_kwh's docstring said evaluation was charged
    there); with the wall span's, each training image carries its share of it. study.md says
    both, beside the basis resources.csv gives."""
    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    for r in runs:
        r |= {"epochs": 3, "train_images_per_epoch": 50000, "energy_j_per_img": 0.5}

    def kwh(test_images):
        rows = [r | {"test_images_per_epoch": test_images} for r in runs]
        return analyze.energy_kwh(rows), analyze.energy_basis(rows)

    # no evaluation term: the same kWh for no test set and for 20 x the training set
    assert kwh(0) == kwh(10**6) == (pytest.approx(2 * 0.5 * 3 * 50000 / 3.6e6), "training")
    tables = _analyzed(tmp_path, runs)
    assert {r["energy_basis"] for r in tables["resources"] if r["kind"] == "measured"} == {
        "training"
    }
    text = " ".join(
        report.render(tmp_path, report.TEMPLATES, [], "../results/plots")["study.md"].split()
    )
    assert "training = every run's training spans (evaluation left out)" in text
    wall = "evaluation included = every run's wall span (a training image's energy with its share"
    assert f"{wall} of the evaluations and checkpoints between the window's epochs)" in text


def test_the_energy_per_image_table_shows_scaling_csvs_cells(tmp_path):
    """A GPU study's J/img per configuration (scaling.csv energy_j_per_img_mean / _std /
    energy_basis) gets its table in both documents, each number the cell's; n/a and the counted
    bases where a configuration's repeats measured different spans; no table where no run
    measured its energy (the resources section says why then)."""
    runs = [_gpu_run("w1", "strong", 1, 20000, r) for r in (0, 1)]
    runs += [_gpu_run("w2", "strong", 2, 38000, r) for r in (0, 1)]
    joules = iter((0.4125, 0.4375, 0.5125, 0.55))
    for r in runs:
        r["energy_j_per_img"] = next(joules)
    runs[3] |= {"energy_j_per_img": "", "energy_wall_j_per_img": 0.875}
    runs += [_gpu_run("w4", "strong", 4, 70000, 0)]  # measured no energy: n/a, not left out
    tables = _analyzed(tmp_path, runs)
    one, two, _ = [r for r in tables["scaling"] if r["family"] == "strong"]
    assert float(one["energy_j_per_img_mean"]) == pytest.approx(0.425)
    assert one["energy_basis"] == "training" and two["energy_j_per_img_mean"] == ""
    assert two["energy_basis"] == "mixed: 1 training, 1 evaluation included"
    docs = report.render(tmp_path, report.TEMPLATES, ["energy"], "../results/plots")
    # the caption says which line is which basis
    wall = "a line per basis (dashed: the wall span's, evaluations and checkpoints included)"
    assert wall in docs["study.md"]
    assert "a line per basis (dashed: evaluations and checkpoints included)" in docs["paper.tex"]
    for name in ("study.md", "paper.tex"):
        text = " ".join(docs[name].split())
        assert "GPU energy per image" in text, name
        assert "../results/plots/energy." in text, name  # the figure of the same cells
        row = " | ".join(["strong", "1", "bf16", "256", "25", "0.425", "0.0177", "training"])
        if name == "paper.tex":
            row = row.replace(" | ", " & ")
        assert row in text, (name, row)
        assert "n/a | n/a | mixed: 1 training, 1 evaluation included" in text.replace(" & ", " | ")
        assert "strong | 4 | bf16 | 64 | 25 | n/a | n/a | n/a" in text.replace(" & ", " | ")
        assert report.numbers_backed_by_csvs(docs[name], tables) == [], name
    for r in runs:
        r["energy_j_per_img"] = r["energy_wall_j_per_img"] = ""
    runs[0]["energy_wall_j_per_img"] = 0.75  # w1: repeats on two bases, so no mean: no point
    runs[1]["energy_j_per_img"] = 0.4375
    _analyzed(tmp_path, runs)
    docs = report.render(tmp_path, report.TEMPLATES, ["energy"], "../results/plots")
    for name in ("study.md", "paper.tex"):
        assert "mixed: 1 training, 1 evaluation included" in " ".join(docs[name].split())
        assert "plots/energy." not in docs[name], name  # a figure without a point: left out
    runs[0]["energy_wall_j_per_img"] = runs[1]["energy_j_per_img"] = ""
    _analyzed(tmp_path, runs)
    docs = report.render(tmp_path, report.TEMPLATES, ["energy"], "../results/plots")
    assert not any("GPU energy per image" in text for text in docs.values())
    assert not any("plots/energy." in text for text in docs.values())


def test_kwh_blank_though_every_run_has_a_joules_per_image_says_what_it_lacks(tmp_path):
    """Rows with a J/img but no count of the images they trained (an older trainer's runs.csv)
    give no kWh: the documents said "GPU energy is in no family's every run: 2 of 2 runs
    recorded NVML's energy counter", which contradicts itself. Now they name the counts; one
    run without a J/img keeps the count of those that have one."""
    runs = [_gpu_run("w1", "strong", 1, 20000, r) | {"energy_j_per_img": 0.4} for r in (0, 1)]
    _analyzed(tmp_path, runs)
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name in ("study.md", "paper.tex"):
        text = " ".join(docs[name].split())
        said = "Every run has a GPU energy per image, but a family's kWh also needs the images"
        assert f"{said} each of its runs trained" in text, name
        assert "No family has a kWh" not in text, name
    runs[1]["energy_j_per_img"] = ""
    _analyzed(tmp_path, runs)
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name in ("study.md", "paper.tex"):
        text = " ".join(docs[name].split())
        assert "No family has a kWh: 1 of 2 runs recorded" in text, name
        assert "Every run has a GPU energy per image" not in text, name
    # strong: a J/img in every run, no counts; weak: counts, one run without a J/img. "GPU energy
    # is in no family's every run: 3 of 4" was false of strong; the sentence names both needs
    counts = {"epochs": 3, "train_images_per_epoch": 50000}
    weak = [_gpu_run("u1", "weak", 1, 20000, r) | counts for r in (0, 1)]
    weak[0]["energy_j_per_img"], runs[1]["energy_j_per_img"] = 0.4, 0.4
    _analyzed(tmp_path, [*runs, *weak])
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name in ("study.md", "paper.tex"):
        text = " ".join(docs[name].split())
        said = "No family has a kWh: 3 of 4 runs recorded NVML's energy counter, and a family's"
        assert f"{said} kWh needs each of its runs' energy per image" in text, name
        assert "the images it trained" in text and "no family's every run" not in text, name


def test_a_spread_other_than_zero_is_never_printed_as_zero(tmp_path):
    """Two repeats 1 img/s apart: MFU's std is 2.4e-06 (0.00024 %), printed "0.0", no spread,
    beside the TFLOP/s std of the same runs; fmt_pct gives a share other than 0 that rounds to
    0 two significant digits instead, and the document's number is still the cell's."""
    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w1", "strong", 1, 20001, 1)]
    tables = _analyzed(tmp_path, runs)
    (row,) = [r for r in tables["scaling"] if r["family"] == "strong"]
    std = float(row["mfu_std"])
    assert 0 < 100 * std < 0.05  # 1 decimal of a percent rounds it to 0.0
    assert report.fmt_pct(row["mfu_std"]) == f"{100 * std:.2g}" != "0.0"
    assert report.fmt_pct("0") == "0.0" and report.fmt_signed_pct("-1e-5") == "-0.0010"
    assert report.fmt_signed_pct("1e-5") == "+0.0010" and report.fmt_pct("0.75625") == "75.6"
    # apart from a threshold too (E_s, D, the accuracy difference, the verdicts' measured)
    assert report.fmt_pct_apart("0.0002", "0.05", signed=True) == "+0.020"
    assert report.fmt_pct_apart("0.6996", "0.7") == "69.96"
    # a waterfall row's parts still add up to its loss as printed: 13.04, not 10.0 + 0.040 +
    # 1.0 + 2.0 beside a loss of 13.0 (the tiny part's digits count in its decimals)
    parts = [0.1, 0.0004, 0.01, 0.02]
    k = report.summing_decimals(parts, sum(parts))
    printed = [report.fmt_signed_pct(x, k) for x in parts]
    assert sum(map(Decimal, printed)) == Decimal(report.fmt_pct(sum(parts), k)), (k, printed)
    assert "+0.0" not in printed and k == 2
    # floating-point noise (a residual of parts that cancel) is 0, and costs a row no decimals
    noise = [0.1, 1.3e-17, 0.02]
    assert report.fmt_signed_pct(1.3e-17) == "+0.0" and report.fmt_pct("1e-9") == "0.00000010"
    assert report.summing_decimals(noise, 0.12) == 1
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name, text in docs.items():
        sep = " & " if name.endswith(".tex") else " | "
        mfu = sep.join([report.fmt_pct(row["mfu_mean"]), report.fmt_pct(row["mfu_std"])])
        assert mfu in text, name
        assert report.numbers_backed_by_csvs(text, tables) == [], name


def test_mfu_section_says_a_repeat_of_an_older_trainer_has_no_mfu(tmp_path):
    """A study measured by two trainers: one repeat from before MFU recorded neither mfu nor
    mfu_unmeasured, so its configuration's MFU is n/a; the reason the documents give for it is
    that run, not system.csv's former "n/a: every run has an MFU"."""
    runs = [_gpu_run("w1", "strong", 1, x, i) for i, x in enumerate((20000, 21000))]
    runs += [_gpu_run("w2", "strong", 2, x, i) for i, x in enumerate((38000, 37000))]
    for key in ("flops_per_img", "model_flops_per_s", "peak_flops", "peak_flops_source"):
        runs[1][key] = ""
    runs[1]["mfu"] = runs[1]["mfu_unmeasured"] = ""  # collect's blank cells of an older run
    tables = _analyzed(tmp_path, runs)
    assert [r["mfu_mean"] == "" for r in tables["scaling"]] == [True, False]
    for name, text in report.render(tmp_path, report.TEMPLATES, [], "../results/plots").items():
        said = " ".join(text.split())
        assert "every run has an MFU" not in said, name
        why = "n/a: no MFU for that configuration (not recorded by 1 run of an older trainer)"
        assert why in said, name
        assert report.numbers_backed_by_csvs(text, tables) == [], name


def test_exposed_communication_unmeasured_is_said_and_its_figure_left_out(tmp_path):
    """train.comm_probe_steps: 0 leaves comm_exposed_frac blank: the figure is still drawn
    (no crash on the blank means) and the documents say in words it was not measured, without
    the figure; with the probe on, the figure is in."""
    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    for r in runs:
        r["comm_exposed_frac"] = ""
    tables = _analyzed(tmp_path, runs)
    assert all(r["comm_exposed_frac_mean"] == "" for r in tables["scaling"])
    figures = ["throughput", "comm_fraction"]
    for name in figures:
        paths = plot.make_figure(name, tmp_path / "plots", scaling=tables["scaling"], device="cuda")
        assert paths[0].read_bytes()[:4] == b"\x89PNG"
    docs = report.render(tmp_path, report.TEMPLATES, figures, "../results/plots")
    # strong runs only (analyzed by hand: the config is not read): no guess at why
    assert "Not part of this study (runs.csv has no run of theirs, so" in docs["study.md"]
    for name in ("study.md", "paper.tex"):
        assert "Exposed communication was not measured" in docs[name], name
        assert "comm_fraction." not in docs[name] and "throughput." in docs[name], name
        # two sentences of words never glued ("...recorded it).Exposed ...": the template's
        # closing tags took the line break between them)
        assert not re.findall(r"\w[.)]+[A-Z][a-z]", docs[name]), name
    measured = tmp_path / "measured"
    _analyzed(
        measured, [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    )
    docs = report.render(measured, report.TEMPLATES, figures, "../results/plots")
    assert "comm_fraction.png" in docs["study.md"]
    assert "Exposed communication was not measured" not in docs["study.md"]


def _modelled(csv_dir, runs):
    """_analyzed, then `scalestudy model` on the same runs (not an empty model)."""
    _analyzed(csv_dir, runs)
    parser = argparse.ArgumentParser()
    model_csv.add_arguments(parser)
    argv = ["--runs", str(csv_dir / "runs.csv"), "--out-dir", str(csv_dir)]
    assert model_csv.run(parser.parse_args(argv)) == 0
    return report.load_tables(csv_dir)


def test_a_study_without_a_25_mib_run_still_renders_and_says_why_there_is_no_model(tmp_path):
    """DDP's default bucket size is a cell of bucket_advice.csv, not a 25 typed into the template
    (which the honesty check refused for any study that never ran 25 MiB); a study the model
    cannot fit shows the reason in the parameter table, not an empty table."""
    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    for r in runs:
        r.update(bucket_cap_mb=50, strategy="ddp")  # no grad_sync_bytes: no fit, said so
    tables = _modelled(tmp_path, runs)
    assert {r["default_bucket_cap_mb"] for r in tables["bucket_advice"]} == {"25.0"}
    assert not any(v == "25" for rows in tables.values() for r in rows for v in r.values())
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, tables) == [], name
    study = docs["study.md"]
    # the one advice row has no world size (no bucket family): its reason, not a row of blanks
    # under "its gain over DDP's default of 25 MiB"
    (advice,) = tables["bucket_advice"]
    assert advice["world_size"] == "" and "DDP's default" not in study
    assert f"No bucket advice: the scaling model has {advice['note']}." in study
    # no --figures (a hand-run render-report's default): said, not an empty Figures section
    assert "No figures: render-report was given none" in study
    assert "No figures: render-report was given none" in docs["paper.tex"]
    [fit] = [r for r in tables["model"] if r["name"] == "fit"]
    assert fit["note"].startswith("no fit: ") and fit["note"] in study


def test_render_report_writes_every_document_or_none(tmp_path, capsys, monkeypatch):
    """render-report wrote study.md, then paper.tex: a full disk at the second left a new
    study.md beside the old paper.tex. Both now go to temp files first (files.write_texts)."""
    from scalestudy import cli

    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    for r in runs:
        r.update(bucket_cap_mb=50, strategy="ddp")
    _modelled(tmp_path / "csv", runs)
    out = tmp_path / "reports"
    out.mkdir()
    old = {out / name: f"old {name}\n" for name in report.DOCUMENTS}
    for path, text in old.items():
        path.write_text(text)
    argv = ["render-report", "--csv-dir", str(tmp_path / "csv"), "--out-dir", str(out)]
    capsys.readouterr()
    synced = fsync_fails_at_file(monkeypatch, 2)
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    where, temp = os.path.split(synced[-1])  # .{name}.{random}.tmp beside its document
    failed = Path(where) / temp[1:].rsplit(".", 2)[0]
    assert failed in old and len(synced) == 2
    assert err == f"scalestudy render-report: {failed}: No space left on device"
    assert {p: p.read_text() for p in out.iterdir()} == old  # every document old, no temp file
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert (out / "study.md").read_text().startswith("#")
    assert "\\documentclass" in (out / "paper.tex").read_text()


def _holdout_table(name: str, text: str) -> list[list[str]]:
    """The cells of each row of a document's held-out table."""
    lines = text.splitlines()
    md = name == "study.md"
    header = "| family |" if md else "family &"
    start = next(i for i, s in enumerate(lines) if s.startswith(header) and "predicted" in s)
    body = lines[start + 1 :]
    if md:  # after the separator
        rows = itertools.takewhile(lambda s: s.startswith("|"), body[1:])
        return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]
    # up to the end of the table, without its rules (\midrule, \endhead, ...)
    rows = itertools.takewhile(lambda s: not s.startswith("\\end{"), body)
    rows = [row for row in rows if not row.startswith("\\")]
    return [[c.strip() for c in row.removesuffix("\\\\").split(" & ")] for row in rows]


def test_the_held_out_rows_of_one_family_are_told_apart(tmp_path):
    """A precision family at three world sizes has one held-out row per precision (and local
    batch) at its largest; a bucket family one per bucket size. The held-out tables showed
    family, world size and (study.md only) the local batch: fp32, bf16 and fp16 were three rows
    alike but for their numbers."""
    from test_model import DEMO, synthetic_rows  # runs whose step times are the model's

    with DEMO.open() as f:
        base = next(csv.DictReader(f))
    runs = []
    for precision, speed in (("fp32", 1.0), ("bf16", 2.0), ("fp16", 2.1)):
        for r in synthetic_rows(0.01, len(runs), sizes=(1, 2, 4), caps=(25,), batches=(32, 64)):
            x = float(r["throughput_img_s"]) * speed
            run_id = f"{r['run']}_{precision}_r0"
            given = {"run": run_id, "families": "precision", "precision": precision}
            runs.append({**base, **r, **given, "repeat": "0", "throughput_img_s": str(x)})
    for r in synthetic_rows(0.01, 9, sizes=(1, 2, 4), caps=(1, 5, 25), batches=(64,)):
        runs.append({**base, **r, "run": f"{r['run']}_bk_r0", "families": "bucket", "repeat": "0"})
    tables = _modelled(tmp_path, runs)
    held = [r for r in tables["model"] if r["kind"] == "holdout"]
    assert {r["name"] for r in held} == {"precision", "bucket"}
    assert len(held) == 3 * 2 + 3  # at 4 ranks: 3 precisions x 2 local batches; 3 bucket sizes
    shown = {
        (r["name"], r["world_size"], r["precision"], r["local_batch"],
         report.fmt_num(r["bucket_cap_mb"]))
        for r in held
    }  # fmt: skip
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name, text in docs.items():
        rows = _holdout_table(name, text)
        # each row names its configuration, and no two rows name the same one
        assert len(rows) == len(held) and {tuple(r[:5]) for r in rows} == shown, (name, rows)
        assert report.numbers_backed_by_csvs(text, tables) == [], name


def test_a_hand_run_profile_figure_reads_the_studys_kernel_shares(tmp_path, monkeypatch, capsys):
    """`scalestudy plot --figure profile` in a study whose results/csv/profile_shares.csv has
    rows said "profiling was not captured": --profile-shares defaulted to "", read as no rows,
    while every other input defaults to its results/csv path. Now it does too, and a study
    without the file is told which path is missing."""
    from scalestudy import cli

    fixtures = Path(__file__).parent / "fixtures"
    monkeypatch.chdir(tmp_path)
    argv = ["analyze", "--runs", str(fixtures / "demo_runs.csv"), "--gpus-per-node", "1"]
    assert cli.main([*argv, "--profile", str(fixtures / "profile_kernels.csv")]) == 0
    shares = read(tmp_path / "results/csv/profile_shares.csv")
    assert shares and all(0 <= float(r["share"]) <= 1 for r in shares)
    capsys.readouterr()
    plot = ["plot", "--figure", "profile", "--device", "cpu"]
    assert cli.main(plot) == 0, capsys.readouterr().err
    assert (tmp_path / "results/plots/profile.png").read_bytes()[:4] == b"\x89PNG"
    # nor does it need scaling.csv, a file it never draws (it was read for every figure)
    scaling = tmp_path / "results/csv/scaling.csv"
    scaling.rename(tmp_path / "aside.csv")
    assert cli.main(plot) == 0, capsys.readouterr().err
    (tmp_path / "aside.csv").rename(scaling)
    (tmp_path / "results/csv/profile_shares.csv").unlink()
    assert cli.main(plot) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "missing results/csv/profile_shares.csv" in err, err
    assert "snakemake results/csv/profile_shares.csv" in err, err
    # a figure that does not draw the shares still needs no file of them
    assert cli.main(["plot", "--figure", "throughput", "--device", "cpu"]) == 0


def test_a_hand_run_analyze_names_a_config_file_in_the_reproduce_commands(tmp_path, monkeypatch):
    """`scalestudy analyze` without --configfile wrote a blank configfile into system.csv, and
    both documents printed `snakemake --cores all --configfile ` with no file: a reproduce
    command that fails. Without the flag it is config/config.yaml, what snakemake reads without
    one (and what the workflow records for such a study: paths.reproduce_configfile)."""
    from scalestudy import cli

    monkeypatch.chdir(tmp_path)
    argv = ["analyze", "--runs", str(Path(__file__).parent / "fixtures/demo_runs.csv")]
    assert cli.main([*argv, "--gpus-per-node", "1"]) == 0
    csv_dir = tmp_path / "results/csv"
    _no_fit(csv_dir)
    for name, text in report.render(csv_dir, report.TEMPLATES, [], "../results/plots").items():
        assert "snakemake --cores all --configfile config/config.yaml\n" in text, name
        assert "snakemake --configfile config/config.yaml --report report.html" in text, name


def test_a_refused_document_leaves_none_written_and_stale_csvs_are_named(done, tmp_path, capsys):
    """The honesty check runs on every document before any is written: a number typed into
    paper.tex leaves no study.md behind either. A CSV older than the templates (without a
    column they read) is one line naming the CSV directory and the commands that rewrite it."""
    import shutil

    from scalestudy import cli

    templates = tmp_path / "templates"
    shutil.copytree(report.TEMPLATES, templates)
    with (templates / "paper.tex.j2").open("a") as f:
        f.write("A typed claim: 123.456 img/s.\n")
    csv_dir = done / "results/csv"
    out = tmp_path / "reports"
    argv = ["render-report", "--csv-dir", str(csv_dir), "--out-dir", str(out)]
    assert cli.main([*argv, "--templates", str(templates)]) == 2
    assert "paper.tex shows numbers that are in no CSV cell: ['123.456']" in capsys.readouterr().err
    assert not out.exists()

    old = tmp_path / "old-csv"
    shutil.copytree(csv_dir, old)
    new = "default_bucket_cap_mb"  # a column an older `scalestudy model` did not write
    advice = [{k: v for k, v in r.items() if k != new} for r in read(old / "bucket_advice.csv")]
    files.write_csv(old / "bucket_advice.csv", None, advice)
    assert cli.main(["render-report", "--csv-dir", str(old), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    said = f"{old / 'bucket_advice.csv'} has no column default_bucket_cap_mb: it is older than"
    assert said in err and "Traceback" not in err, err
    assert not out.exists()
    # system.csv without a column: it was "a CSV lacks the column 'section'", no file named
    system = read(old / "system.csv")
    rows = [{k: v for k, v in r.items() if k != "section"} for r in system]
    files.write_csv(old / "system.csv", None, rows)
    shutil.copy(csv_dir / "bucket_advice.csv", old / "bucket_advice.csv")
    assert cli.main(["render-report", "--csv-dir", str(old), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{old / 'system.csv'} has no column section: it is older than" in err, err
    assert not out.exists()


def test_build_pdf_builds_again_once_the_cause_of_a_failed_build_is_gone(tmp_path, capsys):
    """latexmk's .fdb_latexmk remembered a failed build (a figure missing a moment, a full
    quota), and with the inputs as they were before it answered "Nothing to do" (exit 12)
    to every later build-pdf, which printed the old log's error again: the PDF never came back
    until someone deleted the .fdb_latexmk. A failed build leaves no PDF either."""
    need_latexmk()
    from scalestudy import cli

    plt = __import__("matplotlib.pyplot").pyplot
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    fig.savefig(tmp_path / "fig.pdf")
    plt.close(fig)
    doc = tmp_path / "doc.tex"
    doc.write_text(
        "\\documentclass{article}\\usepackage{graphicx}\\begin{document}\n"
        "\\includegraphics{fig.pdf}\n\\end{document}\n"
    )
    import resource
    import signal
    import subprocess
    import sys

    from workflow_helpers import child_env

    def full_quota() -> None:  # a file grows past 8 KiB no more (SIGXFSZ ignored: EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    argv = [sys.executable, "-m", "scalestudy", "build-pdf", str(doc)]
    failed = subprocess.run(argv, capture_output=True, text=True, preexec_fn=full_quota,
                            env=child_env(), timeout=300)  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    assert not (tmp_path / "doc.pdf").exists()  # not the part it wrote
    capsys.readouterr()
    assert cli.main(["build-pdf", str(doc)]) == 0, capsys.readouterr().err
    assert (tmp_path / "doc.pdf").read_bytes().rstrip().endswith(b"%%EOF")


def test_build_pdf_of_a_missing_or_foreign_file_says_so_and_runs_no_latexmk(tmp_path, capsys):
    """latexmk on a path that does not exist blamed a .log it never wrote; on a .csv it left
    .aux/.fls/.log files beside it."""
    from scalestudy import cli

    data = tmp_path / "runs.csv"
    data.write_text("run\n")
    folder = tmp_path / "old.tex"  # a directory: it was said not to exist
    folder.mkdir()
    for path, why in (
        (tmp_path / "paper.tex", "does not exist"),
        (data, "is not a .tex file"),
        (folder, "is a directory, not a file"),
    ):
        assert cli.main(["build-pdf", str(path)]) == 2
        assert f"scalestudy build-pdf: {path} {why}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.tex", "runs.csv"]
    assert not any(folder.iterdir())


def test_build_pdf_without_latexmk_names_the_document_it_was_given(tmp_path, monkeypatch, capsys):
    """Without latexmk, build-pdf of slides.tex (or proposal.tex) said "reports/paper.pdf is not
    built (reports/paper.tex is)": the one line pointed at another document."""
    from scalestudy import cli

    monkeypatch.setenv("PATH", str(tmp_path / "no-tex"))  # no latexmk on it
    for name in ("slides", "proposal"):
        tex = tmp_path / f"{name}.tex"
        tex.write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
        assert cli.main(["build-pdf", str(tex)]) == 1
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"latexmk is not installed, so {tmp_path / name}.pdf is not built ({tex} is)" in err
        assert "paper.pdf" not in err and "paper.tex" not in err, err


def tex_stand_ins(bin_dir: Path, scripts: dict[str, str]) -> Path:
    """STAND-INS for TeX's programs in `bin_dir` (made where missing): each name's sh script,
    executable. Returns bin_dir."""
    bin_dir.mkdir(exist_ok=True)
    for tool, script in scripts.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def test_a_tex_without_a_package_the_documents_load_builds_no_pdf_and_names_it(
    tmp_path, monkeypatch, capsys
):
    """`apt-get install latexmk` alone brings no booktabs (texlive-latex-recommended): the
    workflow asked for the PDFs because latexmk was there, their jobs failed on "booktabs.sty
    not found" and the demo ended without its report."""
    from scalestudy import cli

    bin_dir = tex_stand_ins(
        tmp_path / "bin",
        {
            "latexmk": "exit 0",
            "pdflatex": "exit 1",
            # kpsewhich prints the path of each file it finds: all but booktabs.sty
            "kpsewhich": 'for f; do [ "$f" = booktabs.sty ] || echo "/tex/$f"; done',
        },
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    assert not latex.have_latexmk()
    tex = tmp_path / "paper.tex"
    tex.write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    assert cli.main(["build-pdf", str(tex)]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"TeX lacks booktabs.sty, so {tmp_path / 'paper.pdf'} is not built" in err, err
    assert "texlive-latex-recommended" in err, err
    # a kpsewhich that hangs (a TeX tree on a stalled network mount): the PDFs skipped, named,
    # after KPSEWHICH_TIMEOUT_S, not a traceback after 60 s
    (bin_dir / "kpsewhich").write_text("#!/bin/sh\nsleep 30\n")
    monkeypatch.setattr(latex, "KPSEWHICH_TIMEOUT_S", 0.5)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin{os.pathsep}")  # new key
    assert latex.tex_gaps()[0].startswith("a working kpsewhich (")
    # setup.sh installs TeX as root where one of them is missing, demo.sh's last line says so
    for script in ("setup.sh", "demo.sh"):
        text = (REPO / "scripts" / script).read_text()
        listed = re.search(r"^tex_files=\((.*)\)$", text, re.M).group(1).split()
        assert set(latex.DOCUMENT_PACKAGES) <= set(listed), (script, listed)


def test_a_tex_without_pdflatex_builds_no_pdf_and_names_it(tmp_path, monkeypatch, capsys):
    """latexmk and every package there, but no pdflatex on PATH: latexmk wrote no log, and
    build-pdf's line was the tail of latexmk's advice ("to try to force complete
    processing."), its cause nowhere. Now the gap is named before latexmk runs. (A missing
    format is no gap: pdflatex builds it on first use, kpathsea's mktexfmt.)"""
    from scalestudy import cli

    tex = tmp_path / "paper.tex"
    tex.write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    bin_dir = tex_stand_ins(
        tmp_path / "bin",
        {
            "latexmk": "exit 0",
            "kpsewhich": 'for f; do case "$f" in -*) ;; *) echo "/tex/$f" ;; esac; done',
        },
    )
    # bin_dir alone (and sh's): /usr/bin may hold a real pdflatex
    sh = tmp_path / "sh"
    sh.mkdir()
    (sh / "sh").symlink_to(shutil.which("sh"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{sh}")
    assert latex.tex_gaps() == ["pdflatex"]
    assert cli.main(["build-pdf", str(tex)]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"TeX lacks pdflatex, so {tmp_path / 'paper.pdf'} is not built" in err, err
    assert "texlive-latex-base" in err, err
    tex_stand_ins(bin_dir, {"pdflatex": "exit 1"})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{sh}{os.pathsep}")  # a new cache key
    assert latex.tex_gaps() == []  # no format asked for


def test_the_command_a_failed_build_says_to_run_quotes_the_path(tmp_path, monkeypatch, capsys):
    """latexmk stopped before TeX wrote a log: the error says to run latexmk by hand, and the
    path was pasted in bare: one with a space was two arguments, one with `$(...)` a command."""
    import shlex

    from scalestudy import cli

    tex = tmp_path / "my paper" / "a$(touch PWNED).tex"
    tex.parent.mkdir()
    tex.write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    bin_dir = tex_stand_ins(
        tmp_path / "bin",
        {
            "latexmk": "echo 'Latexmk: Stopping because of bad filename(s).' >&2; exit 12",
            "pdflatex": "exit 1",
            "kpsewhich": 'for f; do case "$f" in -*) ;; *) echo "/tex/$f" ;; esac; done',
        },
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert cli.main(["build-pdf", str(tex)]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    by_hand = re.search(r"run `([^`]*)` for latexmk's whole output", err)
    assert by_hand, err
    assert shlex.split(by_hand.group(1)) == [
        "latexmk", "-norc", "-g", "-pdf", "-cd", str(tex)
    ]  # fmt: skip


def test_slides_by_hand_without_pgf_name_the_package_to_install(tmp_path, monkeypatch, capsys):
    """build-pdf of slides.tex where TeX lacks pgf (texlive-pictures): the workflow skips the
    slides (have_beamer), but a build by hand ran latexmk and printed TeX's error inside
    beamer ("File `pgfmath.sty' not found. (line 355)", of a 7-line file), not the install
    line. STAND-INS: latexmk, pdflatex, a kpsewhich finding all but pgfcore.sty."""
    from scalestudy import cli

    bin_dir = tex_stand_ins(
        tmp_path / "bin",
        {
            "latexmk": "exit 0",
            "pdflatex": "exit 1",
            "kpsewhich": 'for f; do case "$f" in -*|pgfcore.sty) ;; *) echo "/tex/$f" ;; esac; '
            "done",
        },
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin{os.pathsep}{os.pathsep}")
    assert latex.have_latexmk() and not latex.have_beamer()
    tex = tmp_path / "slides.tex"
    tex.write_text("\\documentclass[aspectratio=169]{beamer}\n\\begin{document}\\end{document}\n")
    assert cli.main(["build-pdf", str(tex)]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"TeX lacks pgfcore.sty, so {tmp_path / 'slides.pdf'} is not built" in err, err
    assert "texlive-pictures" in err, err


def test_a_pdflatex_that_stops_before_its_log_is_named_by_its_own_line(
    tmp_path, monkeypatch, capsys
):
    """A pdflatex that stops before it writes a log (a format file it cannot read, given by a
    site's wrapper or a damaged one): build-pdf's line was the tail of latexmk's advice ("to
    try to force complete processing."), TeX's own "I can't find the format file" nowhere.
    STAND-IN: pdflatex, ahead of the real latexmk and kpsewhich on PATH."""
    from scalestudy import cli

    need_latexmk()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    tex = tmp_path / "paper.tex"
    tex.write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    for said in (
        "I can't find the format file `/site/tex/pdflatex.fmt'!",  # none where it looks
        # a damaged one, and one of another TeX's version (the real pdfTeX's lines)
        "pdflatex: fatal: Could not undump 21950 4-byte item(s) from /x/pdflatex.fmt.",
        "(Fatal format file error; I'm stymied)",
    ):
        tex_stand_ins(bin_dir, {"pdflatex": f"cat <<'END'\nThis is pdfTeX\n{said}\nEND\nexit 1"})
        assert cli.main(["build-pdf", str(tex)]) == 1
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert err.startswith(f"scalestudy build-pdf: latexmk failed on {tex}: {said}; TeX "), err
        assert not tex.with_suffix(".pdf").exists()


@pytest.mark.parametrize(
    "damage, says",
    [
        ("empty-scaling", "scaling.csv has no rows"),  # once: "not part of this study: strong..."
        # a 0-byte verdicts.csv (a truncated copy): the report was written without its verdicts;
        # resources.csv and targets.csv gave "No last item, sequence was empty", no file named
        ("empty-verdicts", "verdicts.csv has no rows"),
        ("empty-resources", "resources.csv has no rows"),
        ("empty-targets", "targets.csv has no rows"),
        # the paper then said the model was "fitted to the multi-rank runs" and had no family
        # to hold out: `scalestudy model` writes a row for every study, its fit or why none
        ("empty-model", "model.csv has no rows: `scalestudy model` writes rows"),
        # once a KeyError traceback, then "a CSV lacks the column": now the file and the fix
        ("no-family", "scaling.csv has no column family: it is older than this version"),
        # a cell of the model's tables or targets.csv that is no number was printed "n/a", the
        # documents' word for "not measured", exit 0
        ("model-value", "model.csv, line 2: value = '0.05x' is not a finite number or blank"),
        ("model-std", "model.csv, line 2: std = 'inf' is not a finite number or blank"),
        ("advice-gain", "bucket_advice.csv, line 2: default_bucket_cap_mb = 'x' is not"),
        ("targets-word", "targets.csv, row 1: target 'strong_efficiency' with value 'one per"),
        # bucket_advice.csv may hold no row, but not be 0 bytes or another table's header
        ("empty-bucket_advice", "bucket_advice.csv has no rows (not even a header)"),
        ("foreign-bucket_advice", "bucket_advice.csv has no column world_size, nodes, precision"),
        # a "nan" (read as blank) where analyze always writes a count: printed "nan" in a row
        # of the resource tables, and in the paper's sentence on runs without a redone count
        ("resources-runs", "resources.csv, line 2: runs is blank, and `scalestudy analyze`"),
        ("resources-lost", "line 2: runs_lost_unmeasured is blank in a measured row"),
        ("resources-scale", "scale_factor is blank in a projected row, and `scalestudy analyze`"),
        # a 0 on the throughput figure's log axis: the point and its family's ideal line gone
        ("scaling-zero", "scaling.csv, line 2: throughput_img_s_mean = '0' is not a number > 0"),
    ],
)
def test_damaged_tables_are_one_line_and_write_nothing(done, tmp_path, capsys, damage, says):
    import shutil

    from scalestudy import cli

    csv_dir = tmp_path / "csv"
    shutil.copytree(done / "results/csv", csv_dir)
    scaling = read(csv_dir / "scaling.csv")
    figures = ["throughput"]
    if damage == "empty-scaling":
        (csv_dir / "scaling.csv").write_text(",".join(scaling[0]) + "\n")
    elif damage.startswith("empty-"):
        (csv_dir / f"{damage.removeprefix('empty-')}.csv").write_text("")
    elif damage == "foreign-bucket_advice":
        (csv_dir / "bucket_advice.csv").write_text("run,throughput\n")
    elif damage == "no-family":
        rows = [{k: v for k, v in r.items() if k != "family"} for r in scaling]
        files.write_csv(csv_dir / "scaling.csv", None, rows)
    else:  # one cell of the first row
        name, column, value = {
            "model-value": ("model", "value", "0.05x"),
            "model-std": ("model", "std", "inf"),
            "advice-gain": ("bucket_advice", "default_bucket_cap_mb", "x"),
            "targets-word": ("targets", "value", "one percent"),
            "resources-runs": ("resources", "runs", "nan"),
            "resources-lost": ("resources", "runs_lost_unmeasured", "None"),
            "resources-scale": ("resources", "scale_factor", "null"),
            "scaling-zero": ("scaling", "throughput_img_s_mean", "0"),
        }[damage]
        rows = read(csv_dir / f"{name}.csv")
        kind = "projected" if column == "scale_factor" else None  # a row of that kind's
        row = next(r for r in rows if kind in (None, r.get("kind")))
        row[column] = value
        files.write_csv(csv_dir / f"{name}.csv", None, rows)
    out = tmp_path / "reports"
    argv = ["render-report", "--csv-dir", str(csv_dir), "--out-dir", str(out), "--figures"]
    assert cli.main([*argv, *figures]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_a_bucket_advice_csv_of_no_row_but_its_header_is_read_as_no_advice(done, tmp_path):
    """bucket_advice.csv may hold no row (no bucket family); its header is still checked."""
    import shutil

    from scalestudy.results.model import ADVICE_COLUMNS

    csv_dir = tmp_path / "csv"
    shutil.copytree(done / "results/csv", csv_dir)
    files.write_csv(csv_dir / "bucket_advice.csv", ADVICE_COLUMNS, [])
    assert report.load_tables(csv_dir)["bucket_advice"] == []


def test_an_unknown_figure_is_refused_by_name_before_the_tables_are_read(tmp_path, capsys):
    """--figures throughputt reached the templates' caption table and was blamed on the CSVs
    ("a CSV ... lacks what the templates read")."""
    from scalestudy import cli

    out = tmp_path / "reports"
    argv = ["render-report", "--csv-dir", str(tmp_path / "none"), "--out-dir", str(out)]
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--figures", "throughput", "throughputt"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'throughputt'" in err and "efficiency" in err
    assert "lacks what the templates read" not in err and not out.exists()


def test_figures_that_are_not_there_are_refused_before_a_document_is_written(
    done, tmp_path, capsys
):
    """With an --out-dir other than reports/ the documents linked to ../results/plots/*.png that
    did not exist, and paper.tex then failed in latexmk's 90 lines."""
    from scalestudy import cli

    out = tmp_path / "elsewhere"
    argv = ["render-report", "--csv-dir", str(done / "results/csv"), "--out-dir", str(out)]
    assert cli.main([*argv, "--figures", "throughput"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    missing = tmp_path / "elsewhere/../results/plots/throughput.png"
    assert err.startswith(f"scalestudy render-report: --figures: {missing}, "), err
    assert "make them with `scalestudy plot --figure NAME`" in err and not out.exists()
    # the same figures given where they are: the documents are written
    plots = done / "results/plots"
    code = cli.main([*argv, "--figures", "throughput", "--figure-dir", str(plots)])
    assert code == 0, capsys.readouterr().err
    assert f"{plots}/throughput.png" in (out / "study.md").read_text()


def test_the_figure_dir_is_left_out_of_the_honesty_check_and_nothing_else(done, tmp_path):
    """The figure references' digits are no claims, but only they are skipped: a --figure-dir
    of "." took every decimal point out of the documents (5.31 became 531) and failed honest
    ones; a number typed into the text still fails."""
    from scalestudy import cli

    out = tmp_path / "out"
    (out).mkdir()
    for ext in ("png", "pdf"):
        (out / f"throughput.{ext}").write_bytes(
            (done / f"results/plots/throughput.{ext}").read_bytes()
        )
    argv = ["render-report", "--csv-dir", str(done / "results/csv"), "--out-dir", str(out)]
    assert cli.main([*argv, "--figures", "throughput", "--figure-dir", "."]) == 0
    study = (out / "study.md").read_text()
    assert "](./throughput.png)" in study and re.search(r"\d\.\d", study)
    tables = report.load_tables(done / "results/csv")
    docs = {"study.md": study + " 1234.5"}
    with pytest.raises(AnalysisError, match=r"\['1234.5'\]"):
        report.check_numbers(docs, tables, (".",))
    report.check_numbers({"study.md": study}, tables, (".",))


@pytest.mark.parametrize(
    "figure_dir",
    ["../plots 2026", "../100%", "../#1", "C:\\plots", '../fig"s', "../a(b", "../a)b(", "<x"],
)
def test_a_figure_dir_the_documents_cannot_link_to_is_refused(done, tmp_path, capsys, figure_dir):
    """--figure-dir '../100%' was written into paper.tex's \\includegraphics as typed: LaTeX read
    the rest of the line as a comment and latexmk failed (with a '"' graphicx's parser of file
    names did); with a space, an unbalanced parenthesis or a leading < (CommonMark's
    destination rules) study.md's image link was plain text or broken."""
    from scalestudy import cli

    out = tmp_path / "reports"
    argv = ["render-report", "--csv-dir", str(done / "results/csv"), "--out-dir", str(out)]
    assert cli.main([*argv, "--figures", "throughput", "--figure-dir", figure_dir]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"scalestudy render-report: --figure-dir {figure_dir!r} has "), err
    assert "give a path without them" in err and not out.exists()


def test_balanced_parentheses_in_a_figure_dir_are_allowed():
    from scalestudy.results.render_report import figure_dir_problem

    assert figure_dir_problem("../plots (2026)") is not None  # the spaces
    assert figure_dir_problem("../plots(2026)/x") is None  # CommonMark: a balanced pair


@pytest.mark.parametrize("name", ["a%b", "a#b", "a{b", "a\\b", 'a"b', "ü_&~$^"])
def test_the_figure_dirs_refused_are_those_pdflatex_cannot_include_from(done, tmp_path, name):
    """figure_dir_problem against pdfLaTeX itself: a directory it refuses fails to build with
    the paper's \\includegraphics, one it allows builds (spaces: refused for study.md)."""
    from scalestudy import cli
    from scalestudy.results.render_report import figure_dir_problem

    need_latexmk()
    figures = tmp_path / name
    figures.mkdir()
    shutil.copy(done / "results/plots/throughput.pdf", figures)
    doc = tmp_path / "docs" / "paper.tex"
    doc.parent.mkdir()
    doc.write_text(
        "\\documentclass{article}\n\\usepackage{graphicx}\n\\begin{document}\n"
        f"\\includegraphics[width=\\linewidth]{{../{name}/throughput.pdf}}\n\\end{{document}}\n"
    )
    built = cli.main(["build-pdf", str(doc)]) == 0 and (doc.parent / "paper.pdf").is_file()
    assert built == (figure_dir_problem(f"../{name}") is None)


def test_a_tex_error_is_one_line_with_its_line_and_log(tmp_path, capsys):
    """A study name with a character pdfLaTeX cannot set failed in latexmk's ~90 lines."""
    from scalestudy import cli

    log_text = "This is pdfTeX\n! LaTeX Error: Unicode character ≥ (U+2265)\n\nl.12 ResNet ≥\n"
    assert latex.first_tex_error(log_text) == "LaTeX Error: Unicode character ≥ (U+2265) (line 12)"
    assert latex.first_tex_error("no error here\n") is None
    need_latexmk()
    tex = tmp_path / "paper.tex"
    tex.write_text(
        "\\documentclass{article}\n\\begin{document}\n\\undefinedmacro\n\\end{document}\n"
    )
    assert cli.main(["build-pdf", str(tex)]) == 1
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert line == (
        f"scalestudy build-pdf: latexmk failed on {tex}: Undefined control sequence. (line 3); "
        f"the whole log: {tmp_path / 'paper.log'}"
    )
    assert out.out == ""


# excerpts of pdfTeX's logs (TeX Live 2022, max_print_line 79), from `! ` to the `l.NN` line
HELP = (
    "\nSee the LaTeX manual or LaTeX Companion for explanation.\n"
    "Type  H <return>  for immediate help.\n ...  \n  \n"
)
TEX_LOGS = {
    # \MessageBreak in a LaTeX error: the rest is indented
    "unicode": (
        "! LaTeX Error: Unicode character ≥ (U+2265)\n"
        "               not set up for use with LaTeX.\n"
        + HELP
        + "l.5 ResNet ≥\n               8 \n",
        "LaTeX Error: Unicode character ≥ (U+2265) not set up for use with LaTeX. (line 5)",
    ),
    # a message longer than 79 columns: TeX breaks it mid-word
    "long-path": (
        "! Package pdftex.def Error: File `/scratch/project_1234567/alice/scaling-studie\n"
        "s/resnet18-cifar10-h200/results/plots/efficiency.pdf' not found: using draft se\n"
        "tting.\n" + HELP + "l.4 ...-cifar10-h200/results/plots/efficiency.pdf}\n",
        "Package pdftex.def Error: File `/scratch/project_1234567/alice/scaling-studies/"
        "resnet18-cifar10-h200/results/plots/efficiency.pdf' not found: using draft setting."
        " (line 4)",
    ),
    # \MessageBreak in a package's error: the rest starts with (package)
    "package": (
        "! Package mypkg Error: The bucket size is not a number\n"
        "(mypkg)                give it in MiB.\n" + HELP + "l.4 ...a number\\MessageBreak give "
        "it in MiB}{help}\n",
        "Package mypkg Error: The bucket size is not a number give it in MiB. (line 4)",
    ),
    # TeX's own errors: the lines after the message are where it happened, not the message
    "context": (
        "! Undefined control sequence.\n<argument> A \\foo \n                  title\n"
        "l.3 \\section{A \\foo title}\n",
        "Undefined control sequence. (line 3)",
    ),
    "inserted": (
        "! Missing $ inserted.\n<inserted text> \n                $\nl.3 x^\n      2 \n",
        "Missing $ inserted. (line 3)",
    ),
}


@pytest.mark.parametrize("case", TEX_LOGS)
def test_a_tex_error_is_the_whole_message_over_its_lines(case):
    """first_tex_error kept the first physical line only: "LaTeX Error: Unicode character ≥
    (U+2265)" without "not set up for use with LaTeX", a path cut at "scaling-studie"."""
    log_text, message = TEX_LOGS[case]
    assert latex.first_tex_error("This is pdfTeX, Version 3.141592653\n" + log_text) == message


def test_a_character_the_79_column_break_splits_is_joined_again(tmp_path, capsys):
    """TeX breaks the log at 79 bytes, so a UTF-8 character can end one line and begin the next
    (the bytes of this log are pdfTeX's); build-pdf reads the log so that it is joined again."""
    from scalestudy import cli

    head = b"! Package pdftex.def Error: File `/scratch/" + b"a" * 35
    assert len(head) == 78
    raw = head + b"\xc3\n\xbcber/plots/efficiency.pdf' not found: using draft setting.\n\nl.4 x\n"
    message = (
        f"Package pdftex.def Error: File `/scratch/{'a' * 35}über/plots/efficiency.pdf' "
        "not found: using draft setting. (line 4)"
    )
    assert latex.first_tex_error(raw.decode("utf-8", "surrogateescape")) == message
    need_latexmk()
    tex = tmp_path / "paper.tex"
    # the same error from pdfTeX: a path whose ü straddles the log's 79th byte
    tex.write_text(
        "\\documentclass{article}\n\\usepackage{graphicx}\n\\begin{document}\n"
        f"\\includegraphics{{/scratch/{'a' * 35}über/plots/efficiency.pdf}}\n\\end{{document}}\n"
    )
    assert cli.main(["build-pdf", str(tex)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"scalestudy build-pdf: latexmk failed on {tex}: {message}; "
        f"the whole log: {tmp_path / 'paper.log'}"
    )


SLOW_TEX = r"""\documentclass{article}
\begin{document}
First page.\newpage Second page.\newpage
\newcount\n \loop\advance\n by 1 \ifnum\n<400000000 \repeat
Last page.
\end{document}
"""


def test_a_stopped_build_leaves_no_pdf_and_no_tex_running(tmp_path):
    """SIGTERM to build-pdf (a time limit, `timeout`, scancel) while TeX wrote the PDF: it said
    "stopped by SIGTERM" but left the part-written paper.pdf (no %%EOF), and pdflatex, killed
    with nothing but latexmk, wrote on. Now TeX's whole process group is stopped, and neither
    the PDF nor the files TeX reads back (a truncated one failed every later build) is left."""
    import signal
    import subprocess
    import time

    from conftest import PYTHON
    from workflow_helpers import child_env

    need_latexmk()
    tex, pdf, aux = tmp_path / "paper.tex", tmp_path / "paper.pdf", tmp_path / "paper.aux"
    tex.write_text(SLOW_TEX)
    proc = subprocess.Popen(
        [PYTHON, "-m", "scalestudy", "build-pdf", str(tex)],
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not pdf.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert pdf.exists() and proc.poll() is None, "TeX shipped out no page in time"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "scalestudy build-pdf: stopped by SIGTERM", err
    time.sleep(1)  # a pdflatex left running would write the PDF again
    assert not pdf.exists() and not aux.exists()
    # TeX's other files of a document, cut short (the slides' beamer writes .nav, .snm, .out
    # and .toc): each failed the next build as a cut .aux did; each build starts without them
    from scalestudy import cli

    tex.write_text(
        "\\documentclass{beamer}\n\\begin{document}\n\\section{A}\\begin{frame}{A}Text."
        "\\end{frame}\n\\end{document}\n"
    )
    for suffix, cut in ((".out", "\\BOOKMARK [2][]{Outline0.1"), (".nav", "\\headcommand {")):
        tex.with_suffix(suffix).write_text(cut)
    assert cli.main(["build-pdf", str(tex)]) == 0
    ps = subprocess.run(["pgrep", "-f", str(tex.with_suffix(""))], capture_output=True, text=True)
    assert ps.stdout == "", ps.stdout


def test_a_failed_build_leaves_no_pdf_of_an_earlier_one(tmp_path, capsys):
    """TeX stopping before its first page (a package this TeX lacks) failed build-pdf but left
    the previous paper.pdf beside the new paper.tex: the old document, looking built."""
    from scalestudy import cli

    need_latexmk()
    tex, pdf = tmp_path / "paper.tex", tmp_path / "paper.pdf"
    body = "\\begin{document}\nFirst version.\n\\end{document}\n"
    tex.write_text("\\documentclass{article}\n" + body)
    assert cli.main(["build-pdf", str(tex)]) == 0
    assert pdf.read_bytes()[:4] == b"%PDF"
    tex.write_text("\\documentclass{article}\n\\usepackage{notinstalledpkg}\n" + body)
    assert cli.main(["build-pdf", str(tex)]) == 1
    assert "notinstalledpkg.sty' not found" in capsys.readouterr().err
    assert not pdf.exists()


def test_the_users_latexmkrc_cannot_move_the_pdf(tmp_path, monkeypatch, capsys):
    """latexmk read ~/.latexmkrc: with `$out_dir = 'build';` (a common personal setting) the PDF
    went to reports/build/, build-pdf still said "wrote reports/paper.pdf" and exited 0, and on a
    TeX error it named a reports/paper.log that did not exist and latexmk's last line."""
    from scalestudy import cli

    need_latexmk()
    home = tmp_path / "home"
    (home / ".config/latexmk").mkdir(parents=True)
    for rc in (home / ".latexmkrc", home / ".config/latexmk/latexmkrc"):
        rc.write_text("$out_dir = 'build';\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    docs = tmp_path / "reports"
    docs.mkdir()
    tex, pdf = docs / "paper.tex", docs / "paper.pdf"
    tex.write_text("\\documentclass{article}\n\\begin{document}\nHello.\n\\end{document}\n")
    assert cli.main(["build-pdf", str(tex)]) == 0, capsys.readouterr().err
    assert pdf.read_bytes()[:4] == b"%PDF" and not (docs / "build").exists()
    capsys.readouterr()
    tex.write_text(
        "\\documentclass{article}\n\\begin{document}\n\\undefinedmacro\n\\end{document}\n"
    )
    assert cli.main(["build-pdf", str(tex)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"scalestudy build-pdf: latexmk failed on {tex}: Undefined control sequence. (line 3); "
        f"the whole log: {docs / 'paper.log'}"
    )


def _fake_latexmk(tmp_path, monkeypatch, exit_code: int, says: str) -> None:
    """A `latexmk` first on PATH that writes nothing, prints `says` and exits with `exit_code`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "latexmk"
    fake.write_text(f"#!/bin/sh\necho '{says}' >&2\nexit {exit_code}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_latexmk_that_exits_0_without_the_pdf_fails_in_one_line(tmp_path, monkeypatch, capsys):
    """build-pdf trusted latexmk's exit status and logged "wrote reports/paper.pdf" for a PDF
    that was not there (the workflow's paper_pdf then failed on a missing output)."""
    from scalestudy import cli

    _fake_latexmk(tmp_path, monkeypatch, 0, "Latexmk: All targets are up-to-date")
    tex = tmp_path / "paper.tex"
    tex.write_text("\\documentclass{article}\n\\begin{document}\nHello.\n\\end{document}\n")
    assert cli.main(["build-pdf", str(tex)]) == 1
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    pdf = tmp_path / "paper.pdf"
    assert line.startswith(
        f"scalestudy build-pdf: latexmk exited 0 on {tex} but {pdf} is not there"
    ), line
    assert "latexmk -norc -g -pdf -cd" in line and f"wrote {pdf}" not in out.out + out.err


def test_a_failure_without_a_log_names_no_log(tmp_path, monkeypatch, capsys):
    """A latexmk that failed before TeX ran was reported with "the whole log: paper.log", a file
    that was never written."""
    from scalestudy import cli

    _fake_latexmk(tmp_path, monkeypatch, 1, "Latexmk: Could not find file")
    tex = tmp_path / "paper.tex"
    tex.write_text("\\documentclass{article}\n\\begin{document}\nHello.\n\\end{document}\n")
    assert cli.main(["build-pdf", str(tex)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"scalestudy build-pdf: latexmk failed on {tex}: Latexmk: Could not find file; "
    ), line
    assert "paper.log" not in line and not (tmp_path / "paper.log").exists()
    assert "latexmk -norc -g -pdf -cd" in line


def _build_with_the_papers_fonts(tmp_path, text: str) -> None:
    """`text` in a document with the paper's font set-up (workflow/report/paper.tex.j2), built
    by `scalestudy build-pdf` (latexmk, pdfLaTeX)."""
    from scalestudy import cli

    need_latexmk()
    doc = tmp_path / "paper.tex"
    doc.write_text(
        "\\documentclass{article}\n\\usepackage{amsmath}\n\\usepackage{lmodern}\n"
        f"\\usepackage[T1]{{fontenc}}\n\\begin{{document}}\n{text}\n\\end{{document}}\n"
    )
    assert cli.main(["build-pdf", str(doc)]) == 0
    assert (tmp_path / "paper.pdf").read_bytes()[:4] == b"%PDF"


def test_characters_pdflatex_cannot_set_become_a_question_mark_and_a_warning(tmp_path, caplog):
    """A study named in Cyrillic (or with CJK, an emoji) made a paper.tex that pdfLaTeX refused
    ("Unicode character М (U+041C) not set up for use with LaTeX"): the study's last step
    failed. Now each such character is "?" in the LaTeX documents, one warning names them, and
    the Markdown keeps them; every character the fonts do set is kept."""
    name = "Масштаб 🚀 扩展: Zürich, Łódź, Ærøskøbing, “quoted” – € ≥ 2"
    md, tex = report.environment(report.TEMPLATES)
    text = tex.from_string("<< name|e >>").render(name=name)
    assert text == ("??????? ? ??: Zürich, Łódź, Ærøskøbing, “quoted” – € \\ensuremath{\\geq} 2")
    assert md.from_string("{{ name }}").render(name=name) == name
    # inside verbatim (the paper's reproduce commands) TeX's specials are literal: only `?`
    command = f"snakemake --config 'study={name}' 50% & _"
    verbatim = tex.from_string("<< command|v >>").render(command=command)
    assert verbatim == (
        "snakemake --config 'study=??????? ? ??: Zürich, Łódź, Ærøskøbing, “quoted” – € ? 2' "
        "50% & _"
    )
    with caplog.at_level("WARNING"):
        report.warn_unsettable(tex, ["paper.tex"])
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("paper.tex: pdfLaTeX cannot set 10 distinct characters (")
    assert all(c in warning for c in "Масштб🚀扩展≥"), warning
    assert not any(c in warning for c in "üŁæ“–€"), warning
    _build_with_the_papers_fonts(
        tmp_path, f"{text}\n\\begin{{verbatim}}\n{verbatim}\n\\end{{verbatim}}"
    )


@pytest.mark.parametrize("name", ["эксперимент7", "実験7", "run 5μs"])
def test_a_digit_a_replaced_character_leaves_alone_is_still_a_cells(done, tmp_path, name):
    """A study named "эксперимент7" is "???????????7" in paper.tex (pdfLaTeX cannot set the
    letters): the 7, part of a word in the cell, stood alone there, and the honesty check refused
    the study's documents as showing a number in no CSV cell. The check reads the cells as the
    LaTeX filters print them; a number typed into the text is still caught."""
    from scalestudy import cli

    csv_dir = tmp_path / "csv"
    shutil.copytree(done / "results/csv", csv_dir)
    rows = read(csv_dir / "system.csv")
    for row in rows:
        if (row["section"], row["key"]) == ("study", "name"):
            row["value"] = name
    files.write_csv(csv_dir / "system.csv", list(rows[0]), rows)
    out = tmp_path / "reports"
    argv = ["render-report", "--csv-dir", str(csv_dir), "--out-dir", str(out)]
    assert cli.main(argv) == 0
    paper = (out / "paper.tex").read_text()
    assert report.tex_escape(name) in paper and name not in paper
    tables = report.load_tables(csv_dir)
    assert report.numbers_backed_by_csvs(paper, tables) == []
    assert report.numbers_backed_by_csvs(paper + " 93.37", tables) == ["93.37"]


def test_a_long_value_may_break_and_its_digits_are_still_checked():
    """tex_breakable lets a \\texttt value break after separators and every 8 characters of a
    run; the honesty check reads past the breaks, so a number split by one is still one token."""
    text = report.tex_breakable("gpu001;gpu002 sha256:0123456789abcdef 12345678901 a_b")
    assert text.count(report.BREAK) >= 5 and "a\\_" in text
    assert text.replace(report.BREAK, "") == report.tex_escape(
        "gpu001;gpu002 sha256:0123456789abcdef 12345678901 a_b"
    )
    tables = {"t": [{"v": "12345678901"}]}
    assert report.numbers_backed_by_csvs(text, tables) == []
    assert report.numbers_backed_by_csvs(text, {"t": []}) == ["12345678901"]


def test_symbols_pdflatex_cannot_read_are_set_as_math(tmp_path):
    """A study named "ResNet ≥ 8 GPUs" made a paper.tex that pdfLaTeX refused ("Unicode
    character ≥ (U+2265) not set up for use with LaTeX")."""
    text = report.tex_escape("ResNet ≥ 8 GPUs, ≤ 2 μs − 1 ≈ 3 → ok, 50% & Zürich")
    assert text == (
        "ResNet \\ensuremath{\\geq} 8 GPUs, \\ensuremath{\\leq} 2 \\ensuremath{\\mu}s "
        "\\ensuremath{-} 1 \\ensuremath{\\approx} 3 \\ensuremath{\\rightarrow} ok, 50\\% \\& Zürich"
    )
    _build_with_the_papers_fonts(tmp_path, text)


def test_a_cell_reading_as_infinity_is_no_number_of_a_document():
    """A text cell "inf" (a run or tool so named) or an infinite number read as float('inf'):
    fmt_num's int(x) raised OverflowError in the honesty check of every render."""
    tables = {"profile_shares": [{"run": "inf", "tool": "-Infinity", "share": "0.25"}]}
    allowed = report.allowed_numbers(tables)
    assert "25.0" in allowed and "0.25" in allowed  # the share, raw and as a percentage
    assert [f("inf") for f in report.FORMATS.values()] == ["n/a"] * len(report.FORMATS)


FIXTURES = Path(__file__).parent / "fixtures"


def _demo_study(csv_dir, runs=None, shares=()):
    """The CPU demo's real runs (tests/fixtures/demo_runs.csv: gloo, one repeat, 1-rank runs in
    strong and weak) through `scalestudy analyze` into csv_dir, or those `runs` picks of them;
    `shares`: its profile_shares.csv rows."""
    with (FIXTURES / "demo_runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    _analyzed(csv_dir, [r for r in rows if runs is None or runs(r)])
    if shares:
        columns = analyze.TABLE_COLUMNS["profile_shares"]
        files.write_csv(csv_dir / "profile_shares.csv", columns, list(shares))
    return report.load_tables(csv_dir)


def test_a_cell_reading_as_blank_prints_as_not_measured_and_a_pipe_keeps_the_row(tmp_path):
    """A "nan", "None" or "null" number cell reads as blank (files.number) and passed the checks,
    but the documents printed it as it was: "| nan |" in the verdicts' world size column and
    "(nan ranks)" in the paper. And a run or tool of the kernel table holding a '|' split its
    Markdown row into more cells than the header's."""
    share = {"run": "w2|x", "tool": "ns|ys", "rank": "0", "category": "conv",
             "total_ns": "1000", "share": "0.6"}  # fmt: skip
    _demo_study(tmp_path, shares=[share])
    verdicts = read(tmp_path / "verdicts.csv")
    assert any(v["world_size"] for v in verdicts)
    files.write_csv(tmp_path / "verdicts.csv", None, [dict(v, world_size="nan") for v in verdicts])
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name, text in docs.items():
        assert not re.search(r"\bnan\b", text), name
    assert "| **pass** |" in docs["study.md"] or "| **fail** |" in docs["study.md"]
    row = next(line for line in docs["study.md"].splitlines() if "conv" in line and "60" in line)
    assert row.startswith(r"| w2\|x | ns\|ys | conv | 60"), row
    assert len(re.split(r"(?<!\\)\|", row)) == 6, row  # 4 cells between the pipes


def test_a_flop_rate_no_run_recorded_is_said_not_shown(tmp_path):
    """The demo's runs, of a trainer older than flops_per_img: every model FLOP rate is blank,
    and the documents said "The model FLOP rate is shown without it" above a column of n/a."""
    tables = _demo_study(tmp_path)
    assert all(r["model_tflops_mean"] == "" for r in tables["scaling"])
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name, text in docs.items():
        flat = " ".join(text.split())
        assert "shown without it" not in flat, name
        assert "Nor is the model FLOP rate: no run recorded its FLOPs per image" in flat, name
    # with a rate recorded (a run of this trainer), it is shown
    runs = [_gpu_run("w1", "strong", 1, 20000, 0, peak=None)]
    _analyzed(tmp_path / "rated", runs)
    docs = report.render(tmp_path / "rated", report.TEMPLATES, [], "../results/plots")
    assert all("The model FLOP rate is shown without it." in d for d in docs.values())


def _md_table(text: str, header: str) -> list[list[str]]:
    """The cells of each body row of the study.md table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith(header))
    rows = itertools.takewhile(lambda s: s.startswith("|"), lines[start + 2 :])
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def _shares(tool: str) -> list[dict]:
    """A profile's shares of rank 0: half convolution, 14.2% collectives (category nccl)."""
    return [
        {"run": "w2_lb16_fp32_ddp_bk25_r0", "tool": tool, "rank": "0", "category": category,
         "total_ns": ns, "share": share}
        for category, ns, share in (("conv", "30000000", "0.5"), ("nccl", "9230000", "0.142"))
    ]  # fmt: skip


def test_a_cpu_profile_says_op_time_and_gloo_collectives_a_gpu_profile_kernel_time(tmp_path):
    """A CPU study's profile is torch.profiler's op times, its collectives gloo's: study.md said
    "Share of kernel time" and listed them as `nccl`, the paper "kernel-time shares". A GPU
    study's profile stays kernel time, and NCCL's kernels nccl."""
    figures = ["profile"]
    tables = _demo_study(tmp_path / "cpu", shares=_shares("torch.profiler"))
    docs = report.render(tmp_path / "cpu", report.TEMPLATES, figures, "../results/plots")
    study, paper = docs["study.md"], " ".join(docs["paper.tex"].split())
    assert "Share of op time per category (rank 0)" in study
    assert ["w2_lb16_fp32_ddp_bk25_r0", "torch.profiler", "collectives (gloo)", "14.2"] in (
        _md_table(study, "| run | tool | category |")
    )
    assert "*Share of op time per category, rank 0.*" in study
    assert "The op-time shares per category are shown" in paper
    assert "\\caption{Share of op time per category.}" in paper
    for name, text in docs.items():
        assert "kernel time" not in text and "kernel-time" not in text, name
        assert "| nccl |" not in text, name
        assert report.numbers_backed_by_csvs(text, tables) == [], name

    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    _analyzed(tmp_path / "gpu", runs)
    files.write_csv(
        tmp_path / "gpu/profile_shares.csv",
        analyze.TABLE_COLUMNS["profile_shares"],
        _shares("nsys"),
    )
    docs = report.render(tmp_path / "gpu", report.TEMPLATES, figures, "../results/plots")
    study = docs["study.md"]
    assert "Share of kernel time per category (rank 0)" in study
    assert ["w2_lb16_fp32_ddp_bk25_r0", "nsys", "nccl", "14.2"] in (
        _md_table(study, "| run | tool | category |")
    )
    assert "The kernel-time shares per category" in docs["paper.tex"]
    assert "gloo" not in study and "op time" not in study


def test_each_document_names_the_command_that_wrote_its_model_table(tmp_path):
    """The paper's last line said every number was written by `scalestudy analyze`, but its
    scaling-model table is model.csv of `scalestudy model`; both documents name both now."""
    _demo_study(tmp_path)
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    for name, text in docs.items():
        flat = " ".join(text.split())
        closing = flat[flat.index("Every number in this ") :]
        for command in ("scalestudy analyze", "scalestudy model"):
            assert command in closing.replace("\\texttt{", "`").replace("}", "`"), (name, command)
        assert "model.csv" in closing or "{model,bucket_advice}.csv" in closing, name


def test_exposed_communication_is_a_share_of_the_same_thing_in_the_method_and_the_figure(
    tmp_path,
):
    """The probe times forward-backward passes with and without gradient sync (measure.py
    comm_probe), no optimizer step: study.md's Method called the result "the share of a step",
    while the figure's caption and axis say "of a forward-backward pass"."""
    tables = _demo_study(tmp_path)
    docs = report.render(tmp_path, report.TEMPLATES, ["comm_fraction"], "../results/plots")
    study = docs["study.md"]
    method = next(ln for ln in study.splitlines() if ln.startswith("- Exposed communication:"))
    caption = next(ln for ln in study.splitlines() if ln.startswith("*Share of a forward-back"))
    assert "share of a forward-backward pass" in method, method
    assert "Share of a forward-backward pass" in caption
    fig, ax = plot._pyplot().subplots()
    plot.plot_comm_fraction(ax, tables["scaling"], "cpu")
    assert "% of a forward-backward pass" in ax.get_ylabel()
    plot._pyplot().close(fig)
    steps = {r["value"] for r in tables["system"] if r["key"] == "comm_probe_steps"}
    assert f"times {steps.pop()} forward-backward passes" in method, method
    for name, text in docs.items():
        assert "share of a step" not in " ".join(text.split()), name


def test_exposed_communication_with_the_probe_off_is_said_to_be_unmeasured_in_the_method(
    tmp_path,
):
    """train.comm_probe_steps: 0 (off): study.md's Method still said a probe "times 0
    forward-backward passes" and that the 1-rank runs' value "is zero by definition, marked in
    the tables", while every cell of the column, the 1-rank runs' too, prints n/a."""
    with (FIXTURES / "demo_runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:  # what the trainer writes with the probe off (loop.py): no value
        r.update(comm_probe_steps="0", comm_exposed_frac="")
    tables = _analyzed(tmp_path, rows)
    study = report.render(tmp_path, report.TEMPLATES, ["comm_fraction"], "../plots")["study.md"]
    method = next(ln for ln in study.splitlines() if ln.startswith("- Exposed communication:"))
    assert "not measured, the probe was off (train.comm_probe_steps: 0)" in method, method
    assert "times 0" not in method and "zero by definition" not in method, method
    strong = _md_table(study, "| ranks (CPU processes) | throughput")
    assert [r[0] for r in strong][0] == "1" and {r[-2] for r in strong} == {"n/a"}, strong
    assert report.numbers_backed_by_csvs(study, tables) == []


def test_the_run_wall_time_and_the_cumulative_training_time_have_different_names(tmp_path):
    """ "training wall time" meant train_time_s, evaluation included, in the resources section
    and the epochs' summed training time, evaluation excluded, on the accuracy figure. Each has
    its own name now, in the documents and on the figure's axis."""
    _demo_study(tmp_path)
    docs = report.render(tmp_path, report.TEMPLATES, ["accuracy"], "../results/plots")
    study = docs["study.md"]
    spent = next(ln for ln in study.splitlines() if ln.startswith("Spent, from"))
    assert "run wall time t" in spent and "train_time_s" in spent
    assert "evaluation included" in spent
    caption = next(ln for ln in study.splitlines() if ln.startswith("*Validation accuracy"))
    assert "cumulative training time" in caption and "without evaluation" in caption
    paper = " ".join(docs["paper.tex"].split())
    assert "the measured run wall time in hours (the whole training loop, evaluation included)" in (
        paper
    )
    assert "cumulative training time (the epochs' training steps, evaluation excluded)" in paper
    for name, text in docs.items():
        assert "training wall time" not in " ".join(text.split()), name
    epochs = [
        {"run": "w1_r0", "families": "strong", "world_size": "1", "local_batch": "32",
         "precision": "fp32", "bucket_cap_mb": "25", "repeat": "0", "epoch": str(e),
         "epoch_time_s": "2.5", "val_acc": "0.5"}
        for e in (1, 2)
    ]  # fmt: skip
    fig, axes = plot._pyplot().subplots(1, 2)
    plot.plot_accuracy(axes, epochs)
    assert axes[1].get_xlabel().startswith("cumulative training time (s")
    assert "evaluation excluded" in axes[1].get_xlabel()
    plot._pyplot().close(fig)


def test_the_words_about_a_missing_spread_name_what_the_tables_print(tmp_path):
    """One repeat: study.md said "std is blank" while its tables print n/a in every std column."""
    _demo_study(tmp_path)
    study = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")["study.md"]
    strong = _md_table(study, "| ranks (CPU processes) | throughput (img/s) | std |")
    shown = {row[2] for row in strong}  # the throughput's std, one repeat each
    assert shown == {report.fmt_num("")}, shown
    lines = study.splitlines()
    once = next(ln for ln in lines if ln.startswith("Each configuration ran once"))
    assert f"(std is {shown.pop()})" in once, once
    repeats = next(ln for ln in lines if ln.startswith("- Repeats:"))
    assert "n/a when n = 1" in repeats, repeats
    assert "blank" not in once and "blank" not in repeats


def test_a_one_rank_runs_exposed_communication_is_no_measurement_in_tables_or_figure(tmp_path):
    """One rank synchronises nothing: the trainer writes 0.0 without probing (loop.py), and
    study.md printed it as "0.0" in the exposed-communication column and the figure drew a point
    at 0 like the measured ones. The tables say what it is, the figure leaves it out and its
    captions say so; the multi-rank runs' values are printed and drawn as before."""
    tables = _demo_study(tmp_path)
    scaling = tables["scaling"]
    one = [r for r in scaling if r["family"] in ("strong", "weak") and r["world_size"] == "1"]
    assert one and {r["comm_exposed_frac_mean"] for r in one} == {"0.0"}  # the trainer's 0.0
    docs = report.render(tmp_path, report.TEMPLATES, ["comm_fraction"], "../results/plots")
    study = docs["study.md"]
    for family in ("strong", "weak"):
        section = study[study.index(f"### {family.capitalize()} scaling") :]
        rows = {r[0]: r for r in _md_table(section, "| ranks (CPU processes) | throughput")}
        # a percentage, as the column's other rows (as a fraction, 0.1 read as 0.1%)
        said = f"{report.fmt_pct('0.0')} (1 rank: nothing to synchronise, not measured)"
        assert rows["1"][-2] == said, rows["1"]
        for r in scaling:
            if r["family"] == family and r["world_size"] != "1":
                assert rows[r["world_size"]][-2] == report.fmt_pct(r["comm_exposed_frac_mean"])
    assert "comm_fraction.png" in study
    assert (
        "*Share of a forward-backward pass spent in exposed (not overlapped) gradient "
        "communication; 1-rank runs left out: one rank synchronises nothing.*" in study
    )
    assert "1-rank runs left out" in docs["paper.tex"]
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, tables) == [], name

    fig, ax = plot._pyplot().subplots()
    plot.plot_comm_fraction(ax, scaling, "cpu")
    drawn = {int(x) for line in ax.get_lines() for x in line.get_xdata()}
    assert 1 not in drawn and {2, 4} <= drawn, drawn
    assert ax.get_title() == "1-rank runs left out: one rank synchronises nothing"
    plot._pyplot().close(fig)

    # strong and weak at one rank only: nothing to draw, said in words, no figure
    _demo_study(tmp_path / "one", runs=lambda r: r["world_size"] == "1")
    docs = report.render(tmp_path / "one", report.TEMPLATES, ["comm_fraction"], "../plots")
    for name, text in docs.items():
        assert "comm_fraction." not in text, name
        assert (
            "Exposed communication has no figure: the strong and weak runs have one rank "
            "each" in " ".join(text.split())
        ), name


@pytest.mark.parametrize(
    ("recorded", "says"),
    [
        (None, "at least 3"),  # the demo's runs, of a trainer that recorded the flag alone
        ("10", "10"),  # PowerSGD's uncompressed steps: the window waited for them, not for 3
    ],
)
def test_the_method_names_the_warm_up_the_window_left_out(tmp_path, recorded, says):
    """The documents printed --warmup-steps as the steps before the window, which under
    --comm-hook powersgd (10) or the whole-step CUDA graph (12) opens later: they print
    metrics.json's window_warmup_steps (a runs.csv cell), and for runs without it what is
    known, "at least" the flag; both pass the honesty check."""

    def runs(row):
        if recorded is not None:
            row["window_warmup_steps"] = recorded
        return True

    tables = _demo_study(tmp_path, runs)
    docs = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")
    report.check_numbers(docs, tables)
    study = next(ln for ln in docs["study.md"].splitlines() if "Throughput X(N)" in ln)
    assert f"window that starts after {says} warm-up optimizer steps (excluded:" in study
    paper = " ".join(docs["paper.tex"].split())
    assert f"window that starts after {says} warm-up optimizer steps (the configured" in paper


def _paper_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the first longtable in `section` of paper.tex."""
    body = section[section.index("\\endfoot") : section.index("\\end{longtable}")]
    return [line.removesuffix(" \\\\").split(" & ") for line in body.splitlines()[1:] if line]


def test_the_papers_waterfall_says_what_n_a_means_and_why_a_part_is_not_measured(tmp_path):
    """paper.tex printed n/a for a waterfall part the runs did not measure without saying what
    n/a means or why, where study.md has both (its note column). Strong ran with gradient
    accumulation (comm blank by design) and per-rank times, weak as the demo recorded it (no
    per-rank times: data and imbalance blank): each row with a blank part carries the letter of
    its waterfall.csv note, printed once under the table; a row without a note has no letter."""

    def runs(row):
        if "strong" in row["families"].split(";"):
            row["accum_steps"] = "2"
            for column in ("data_time_ms_mean_by_rank", "busy_time_ms_p50_by_rank"):
                row[column] = ";".join(["1.0"] * int(row["world_size"]))
        return True

    tables = _demo_study(tmp_path, runs)
    waterfall = tables["waterfall"]
    notes = list(dict.fromkeys(r["note"] for r in waterfall if r["note"]))
    assert len(notes) == 2 and "gradient accumulation" in notes[0], notes
    paper = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")["paper.tex"]
    section = paper[paper.index("\\subsection{Where the efficiency goes}") :]
    section = section[: section.index("\\subsection{Scaling model}")]
    assert "n/a: not measured by the runs, so inside the residual" in " ".join(section.split())
    rows = _paper_rows(section)
    assert len(rows) == len(waterfall)
    footnotes = dict(re.findall(r"\\noindent \$\^\{\\mathrm\{(\w)\}\}\$ (.*)\.\\par", section))
    assert list(footnotes.values()) == [report.tex_prose(n) for n in notes], footnotes
    for row, cells in zip(waterfall, rows, strict=True):
        letter = re.fullmatch(r"(\w+)(?:\$\^\{\\mathrm\{(\w)\}\}\$)?", cells[0]).groups()
        assert letter[0] == row["family"]
        assert ("n/a" in cells) == bool(row["note"]), (row, cells)
        if row["note"]:
            assert footnotes[letter[1]] == report.tex_prose(row["note"]), (row, cells)
        else:
            assert letter[1] is None, cells
    assert report.numbers_backed_by_csvs(paper, tables) == []

    # every part measured: no n/a, no letters, no sentence about them
    def measured(row):
        for column in ("data_time_ms_mean_by_rank", "busy_time_ms_p50_by_rank"):
            row[column] = ";".join(["1.0"] * int(row["world_size"]))
        return True

    tables = _demo_study(tmp_path / "all", measured)
    assert tables["waterfall"] and not any(r["note"] for r in tables["waterfall"])
    paper = report.render(tmp_path / "all", report.TEMPLATES, [], "../plots")["paper.tex"]
    section = paper[paper.index("\\subsection{Where the efficiency goes}") :]
    section = section[: section.index("\\subsection{Scaling model}")]
    assert "n/a" not in section and "\\mathrm" not in section and "\\noindent" not in section


def test_the_papers_energy_column_says_what_n_a_means(tmp_path):
    """A family without measured energy printed n/a in paper.tex's energy column, unexplained
    (study.md: "n/a: some run of the family has no measured energy"); said only where a cell
    is blank."""
    tables = _demo_study(tmp_path)
    rows = tables["resources"]
    for blank in (True, False):  # the other families' energy blank, or every family's measured
        for r in rows:
            if r["kind"] == "measured":
                r["energy_kwh"] = "0.0421" if r["family"] == "strong" or not blank else ""
        files.write_csv(tmp_path / "resources.csv", list(rows[0]), rows)
        paper = report.render(tmp_path, report.TEMPLATES, [], "../plots")["paper.tex"]
        section = paper[paper.index("\\section{Resource justification}") :]
        section = section[: section.index("\\medskip")]
        shown = [cells[-1] for cells in _paper_rows(section)]
        said = "n/a: some run of the family has no measured energy per image, or no " in section
        assert ("n/a" in shown) == said == blank, (blank, shown)
        assert report.numbers_backed_by_csvs(paper, report.load_tables(tmp_path)) == []


def _analyze_with(csv_dir: Path, runs: list[dict], *profile: str) -> dict[str, list[dict]]:
    """`scalestudy analyze` (the CLI) on runs.csv rows, with `profile` its --profile flag or
    none, and a scaling model without a fit (_no_fit): the tables render-report reads."""
    from scalestudy import cli

    files.write_csv(csv_dir / "runs.csv", None, runs)
    argv = ["analyze", "--runs", str(csv_dir / "runs.csv"), "--out-dir", str(csv_dir),
            "--html-dir", str(csv_dir / "html"), "--gpus-per-node", "4", *profile]  # fmt: skip
    assert cli.main(argv) == 0
    _no_fit(csv_dir)
    return report.load_tables(csv_dir)


def test_the_documents_tell_not_profiled_from_a_kernel_table_without_kernels(tmp_path):
    """analyze without --profile and analyze given a kernel table with no rows both wrote a
    profile_shares.csv of a header alone, and the documents said of either "Profiling was not
    captured in this study (no ... kernel table was produced)": a claim no cell held, false
    where the study profiled and analyze was run by hand without --profile. Now system.csv's
    ("profiling", "kernel table") says which (the table given, or not profiled), the documents
    and the HTML table say it from that cell."""
    runs = [_gpu_run("w1", "strong", 1, 20000, 0), _gpu_run("w2", "strong", 2, 38000, 0)]
    kernels = tmp_path / "profile_kernels.csv"
    kernels.write_text((Path(__file__).parent / "fixtures/profile_kernels.csv").read_text())
    empty = tmp_path / "empty_kernels.csv"
    empty.write_text(kernels.read_text().splitlines()[0] + "\n")
    says = {  # case: (its --profile, its system.csv cell, what study.md and paper.tex say)
        "not profiled": ((), "not profiled: scalestudy analyze ran without --profile", (
            "Not profiled: `scalestudy analyze` was given no kernel table",
            "Not profiled: \\texttt{scalestudy analyze} was given no kernel table",
        )),
        "no kernels": ((f"--profile={empty}",), str(empty), (
            f"The kernel table `scalestudy analyze` was given ({empty}) has no kernels",
            "has no kernels, so no breakdown of kernel time is given",
        )),
        "shares": ((f"--profile={kernels}",), str(kernels), (
            "| run | tool | category | share (%) |",
            "shares per category are in results/csv/profile\\_shares.csv",
        )),
    }  # fmt: skip
    for case, (flag, cell, sentences) in says.items():
        csv_dir = tmp_path / case.replace(" ", "_")
        csv_dir.mkdir()
        tables = _analyze_with(csv_dir, runs, *flag)
        docs = report.render(csv_dir, report.TEMPLATES, [], "../results/plots")
        for (name, text), sentence in zip(docs.items(), sentences, strict=True):
            text = " ".join(text.split())
            assert "Profiling was not captured" not in text, (case, name)
            assert sentence in text, (case, name)
            assert report.numbers_backed_by_csvs(text, tables) == [], (case, name)
        system = {(r["section"], r["key"]): r["value"] for r in tables["system"]}
        assert system[("profiling", "kernel table")] == cell, case
        assert bool(tables["profile_shares"]) == (case == "shares"), case
        html = (csv_dir / "html/profile_shares.html").read_text()
        assert ("(not profiled: " in html) == (case == "not profiled"), case
        assert (f"(none in {empty})" in html) == (case == "no kernels"), case


@pytest.mark.parametrize("strategy", vocab.STRATEGIES)
def test_the_html_reports_front_page_names_the_studys_strategy(strategy):
    """workflow/report/workflow.rst, the front page of `snakemake --report`, said "PyTorch DDP"
    of an FSDP or all-reduce study (the documents name the strategy: render_report's
    strategy_name); rendered here as Snakemake renders it, Jinja with snakemake.config."""
    import jinja2

    from scalestudy.study.config import load_and_validate

    repo = Path(__file__).resolve().parents[1]
    config = load_and_validate(
        repo / "config/demo.yaml",
        overrides=[f"train.strategy={strategy}", "families.bucket.enabled=false"],
    )
    page = jinja2.Environment().from_string((repo / "workflow/report/workflow.rst").read_text())
    text = " ".join(page.render(snakemake=argparse.Namespace(config=config)).split())
    assert f"data-parallel training with {vocab.STRATEGY_NAMES[strategy]} of " in text, text[:300]


@pytest.mark.parametrize(
    "study", ["CPU scaling\n", "Scaling 2024 ", "C:\\runs\\", "a*b", "x **y** z", "`q`"]
)
def test_the_html_reports_front_page_shows_any_study_name_in_bold(study):
    """The front page wrote `**{study}**`: a name the config accepts ending in a line break
    (`study: >`), a space or a backslash left reStructuredText's strong markup open (the
    asterisks printed, and two "Inline strong start-string without end-string" warnings on the
    page), as did a * or ` inside it. Rendered as Snakemake renders it: Jinja, then docutils."""
    import jinja2
    from docutils.core import publish_parts

    from scalestudy.study.config import load_and_validate

    repo = Path(__file__).resolve().parents[1]
    config = load_and_validate(repo / "config/demo.yaml", overrides={"study": study})
    env = jinja2.Environment(trim_blocks=True)
    page = env.from_string((repo / "workflow/report/workflow.rst").read_text())
    rst = page.render(snakemake=argparse.Namespace(config=config))
    html = publish_parts(rst, writer_name="html", settings_overrides={"warning_stream": False})
    assert f"Scaling study <strong>{html_escape(study.strip())}</strong>:" in html["body"], rst
    assert "System Message" not in html["body"]


def test_figures_are_found_before_the_documents_directory_exists(tmp_path, monkeypatch):
    """render-report --out-dir reports, by hand, before reports/ existed: reports/../results/
    plots/x.png names nothing while reports is missing (the kernel walks through it), so every
    figure was "not found" (render-report refused; the proposal's slides lost their figure)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "plots").mkdir(parents=True)
    for ext in ("png", "pdf"):
        (tmp_path / "results" / "plots" / f"efficiency.{ext}").write_text("x")
    assert report.missing_figures(Path("reports"), "../results/plots", ["efficiency"]) == []
    assert report.missing_figures(Path("reports"), "../results/plots", ["throughput"]) == [
        "reports/../results/plots/throughput.png",
        "reports/../results/plots/throughput.pdf",
    ]


def test_render_report_removes_the_pdf_of_the_paper_it_rewrites(done, tmp_path):
    """Without latexmk the workflow asks for no paper.pdf, and the one built from the old
    paper.tex stayed beside the new one looking current (test_proposal.py: the proposal's)."""
    from scalestudy import cli

    out = tmp_path / "reports"
    out.mkdir()
    (out / "paper.pdf").write_text("an old build\n")
    (out / "notes.pdf").write_text("the user's\n")
    argv = ["render-report", "--csv-dir", str(done / "results/csv"), "--out-dir", str(out)]
    argv += ["--figure-dir", str(done / "results/plots")]
    assert cli.main(argv) == 0
    assert (out / "paper.tex").is_file() and not (out / "paper.pdf").exists()
    assert (out / "notes.pdf").exists()


def test_what_a_name_says_is_what_the_pdf_sets():
    """pdfLaTeX's T1 fonts join -- << >> ,, '' `` ?` !` into other characters: a study named
    "ResNet--fp16" was titled "ResNet–fp16" (an en dash) in the paper, a `--local-batch` in a
    note "–local-batch". And ™ ℠ ‱ Ĳ ĳ ẞ, set in roman, are missing from the typewriter font the
    names are in (\\texttt): pdfLaTeX dropped them with a log line only. Both are escaped now,
    the six as unsettable (UNSETTABLE, and the one warning)."""
    text = report.tex_escape("ResNet--fp16 --local-batch <<a>> ,,b'' ``c ?`d !`e")
    assert text == ("ResNet-{}-fp16 -{}-local-batch {<}{<}a>{}> ,{},b'{}' `{}`c ?{}`d !{}`e"), text
    # the `b` filter (a \\texttt cell that may break) escapes a character at a time
    assert "{<}{<}" in report.tex_breakable("a<<b") and "?{}`" in report.tex_breakable("x?`y")
    unset: set[str] = set()
    assert report.tex_escape("ACME™ Ĳssel ẞ ‱ ℠ ĳ", unset) == "ACME? ?ssel ? ? ? ?"
    assert unset == set("™Ĳẞ‱℠ĳ")


def test_a_profile_share_near_0_or_1_is_printed_apart_from_them(tmp_path):
    """The table lists the categories with a share above 0, then printed 0.0004 as "0.0" and
    0.9996 as "100.0"."""
    shares = [
        {"run": "w2_lb16_fp32_ddp_bk25_r0", "tool": "torch.profiler", "rank": "0",
         "category": category, "total_ns": ns, "share": share}
        for category, ns, share in (
            ("conv", "999600000", "0.9996"), ("memcpy", "400000", "0.0004"), ("gemm", "0", "0.0")
        )
    ]  # fmt: skip
    tables = _demo_study(tmp_path, shares=shares)
    study = report.render(tmp_path, report.TEMPLATES, [], "../results/plots")["study.md"]
    cells = {row[2]: row[3] for row in _md_table(study, "| run | tool | category |")}
    assert cells == {"conv": "99.96", "memcpy": "0.04"}, cells
    assert report.numbers_backed_by_csvs(study, tables) == []


def test_the_paper_mfu_table_fits_the_text_width(tmp_path):
    """Nine columns under long headers: the MFU table ran 11 to 21 pt past the right margin in
    every GPU study that measured MFU."""
    from scalestudy import cli

    runs = [
        {**_gpu_run(f"w{w}", "strong", w, 18000 * w, r), "local_batch": 256 // w,
         "global_batch": 256}
        for w in (1, 2, 4, 8) for r in (0, 1)
    ]  # fmt: skip
    tables = _analyzed(tmp_path / "csv", runs)
    assert any(r.get("mfu_mean") for r in tables["scaling"])  # the case at hand
    out = tmp_path / "reports"
    argv = ["render-report", "--csv-dir", str(tmp_path / "csv"), "--out-dir", str(out)]
    assert cli.main(argv) == 0
    need_latexmk()
    assert cli.main(["build-pdf", str(out / "paper.tex")]) == 0
    log = (out / "paper.log").read_text(errors="replace")
    wide = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\) in \w+ at lines (\S+)", log)
    assert [w for w in wide if float(w[0]) > 1.0] == [], wide


def test_the_results_tables_print_a_value_apart_from_its_target(done, tmp_path):
    """The verdict rows print a value apart from its threshold, but the results tables printed
    the same cells at one decimal or 3 digits: E_s 0.69996 as "70.0" against a target of 70%
    (the verdict: fail), a weak deviation of 0.10004 as "+10.0", a precision speedup of
    1.19996 as "1.20" against a 20% target. Each is printed apart from its target there too."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    targets = {r["target"]: float(r["value"]) for r in read(csv_dir / "targets.csv")}
    assert (targets["strong_efficiency"], targets["weak_deviation"]) == (0.7, 0.1)
    assert targets["optimisation_speedup"] == 0.2
    rows = read(csv_dir / "scaling.csv")
    strong = max((r for r in rows if r["family"] == "strong"), key=lambda r: int(r["world_size"]))
    weak = max((r for r in rows if r["family"] == "weak"), key=lambda r: int(r["world_size"]))
    prec = next(r for r in rows if r["family"] == "precision")
    strong["strong_efficiency"] = "0.69996"
    weak["weak_deviation"] = "0.100039821442"
    prec["precision_speedup"] = "1.19996"
    files.write_csv(csv_dir / "scaling.csv", list(rows[0]), rows)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    md, paper = docs["study.md"], " ".join(docs["paper.tex"].split())
    w_s, w_w = strong["world_size"], weak["world_size"]
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {w_s} |") and "69.99" in ln)
    assert "| 69.996 |" in row and "| 70.0 |" not in row, row
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {w_w} |") and "+10.0" in ln)
    assert "| +10.004 |" in row, row
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {prec['world_size']} | fp32 |"))
    assert "| 1.19996 |" in row and "| 1.20 |" not in row, row
    assert "& 69.996 &" in paper and "& +10.004 " in paper and "& 1.19996 &" in paper
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name
    # a speedup equal to its target prints as the cell: 1 + 0.14 is 1.1400000000000001 in
    # binary, apart from the cell 1.14 at every digit, and it printed "1.14000000000"
    assert report.fmt_num_apart("1.14", 1 + 0.14) == "1.14"
    assert report.fmt_num_apart("1.13996", 1 + 0.14) == "1.13996"
    # a whole-number target (optimisation_speedup 1.0 or 0: 2x, 1x) prints as "2" at every
    # digit count, never as "2.00": 1.9996 printed "2.00" beside the 2x target it fails
    assert report.fmt_num_apart("1.9996", 1 + 1.0) == "1.9996"
    assert report.fmt_num_apart("0.9996", 1 + 0) == "0.9996"
    assert report.fmt_num_apart("2.0004", 2) == "2.0004"
    assert report.fmt_num_apart("2.0", 2.0) == "2" and report.fmt_num_apart("1.5", 2) == "1.50"
    # ... and on the value's side of the target: 1.124 printed "1.12" beside 1.123, below it
    assert report.fmt_num_apart("1.124", 1.123) == "1.124"
    assert report.fmt_num_apart("1.1232", 1.1235) == "1.1232"
    assert report.fmt_num_apart("1.3334", 1 + 0.333) == "1.3334"
    assert report.fmt_num_apart("1.3326", 1 + 0.333) == "1.3326"


def test_an_empty_waterfall_and_a_probe_off_for_some_runs_are_said(done, tmp_path):
    """A study without a multi-rank configuration above its baseline (waterfall.csv header-only)
    lost its "Where the efficiency goes" section without a word, where every other absent
    measurement is said; and runs with the probe off beside probed ones (system.csv's
    comm_probe_steps "3; 0") read "a probe after training times 3; 0 forward-backward passes"."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    header = (csv_dir / "waterfall.csv").read_text().splitlines()[0]
    (csv_dir / "waterfall.csv").write_text(header + "\n")
    rows = read(csv_dir / "system.csv")
    probe = next(
        r for r in rows if (r["section"], r["key"]) == ("run settings", "comm_probe_steps")
    )
    probe["value"] = "3; 0"
    files.write_csv(csv_dir / "system.csv", list(rows[0]), rows)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    md, paper = docs["study.md"], " ".join(docs["paper.tex"].split())
    for text in (md, paper):
        assert "Where the efficiency goes" in text
        assert "No breakdown of the efficiency loss: waterfall.csv has no rows" in text
    assert "times 3 forward-backward passes" in md and "times 3; 0" not in md
    assert "Some runs had the probe off (train.comm_probe_steps 0)" in md
    for name, text in docs.items():
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "ddp; fsdp"])
def test_an_fsdp_studys_exposed_communication_is_said_to_be_the_reduce_scatters(
    done, tmp_path, strategy
):
    """The probe's arm without gradient sync still all-gathers FSDP's parameters (forward and
    the backward's re-gather): only the reduce-scatter is left out, so FSDP's exposed
    communication is the reduce-scatter's alone, which the documents called "gradient
    communication" as of DDP's all-reduce. Said where a run of the study is FSDP's."""
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    rows = read(csv_dir / "system.csv")
    setting = next(r for r in rows if (r["section"], r["key"]) == ("run settings", "strategy"))
    setting["value"] = strategy
    files.write_csv(csv_dir / "system.csv", list(rows[0]), rows)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    said = "Under FSDP the probe's passes without gradient sync still all-gather the parameters"
    for name, text in docs.items():
        assert (said in " ".join(text.split())) == ("fsdp" in strategy), name
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name
