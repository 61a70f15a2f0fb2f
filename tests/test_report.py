"""End to end on the tiny study (tests/conftest.py `tiny_study`, one repeat, no profiling, CPU):
the analysis CSVs, the figures, reports/study.md and paper.tex built from the CSVs only,
paper.pdf with its figures (latexmk; required under CI=true), and `snakemake --report`."""

from __future__ import annotations

import csv
import os
import re

import pytest
from workflow_helpers import snakemake

from scalestudy.results import build_pdf as latex
from scalestudy.results import render_report as report

pytestmark = pytest.mark.workflow

FIGURES = [
    "throughput",
    "efficiency",
    "epoch_time",
    "comm_fraction",
    "waterfall",
    "precision",
    "bucket",
    "accuracy",
]


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
    # the tiny study stops at 2 ranks; the paper's target is judged at 8: not measured, said so
    assert verdicts["strong_efficiency"]["verdict"] == "not measured"
    assert "largest world size is 2" in verdicts["strong_efficiency"]["note"]
    assert verdicts["weak_deviation"]["verdict"] in ("pass", "fail")
    assert (done / "results/tables/scaling.html").read_text().count("<tr>") == len(rows) + 1


def test_waterfall_parts_sum_to_the_loss_and_the_documents_show_it(done):
    rows = read(done / "results/csv/waterfall.csv")
    # strong and weak ran at 1 and 2 ranks: one row each above N0 = 1
    assert sorted((r["family"], r["world_size"]) for r in rows) == [("strong", "2"), ("weak", "2")]
    for r in rows:
        parts = sum(float(r[f"{p}_img_s"]) for p in ("comm", "data", "imbalance", "residual"))
        assert abs(parts - float(r["loss_img_s"])) < 1e-9, r
        assert r["note"] == ""  # this trainer records every input of every part
    study = (done / "reports/study.md").read_text()
    assert "### Where the efficiency goes" in study and "add up to the loss" in study
    assert report.fmt_pct(rows[0]["imbalance_frac"]).lstrip("-") in study
    assert "Where the efficiency goes" in (done / "reports/paper.tex").read_text()


def test_every_figure_as_png_and_pdf(done):
    for name in FIGURES:
        assert (done / f"results/plots/{name}.png").read_bytes()[:4] == b"\x89PNG", name
        assert (done / f"results/plots/{name}.pdf").read_bytes()[:4] == b"%PDF", name
    # CPU study, no profiling stage: no GPU-utilisation or profile figure is claimed
    assert not (done / "results/plots/gpu_util.png").exists()
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
    text = (done / "reports" / name).read_text()
    assert "Profiling was not captured" in text
    assert "GPU utilisation was not measured" in text
    assert re.search(r"configuration ran once", text)
    assert not re.search(r"placeholder|TODO|TBD|lorem|XXX|\?\?", text, re.I)
    assert "not measured" in text  # the strong target at 8 GPUs
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
    if not latex.have_latexmk():
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have TeX: scripts/setup.sh installs latexmk as root")
        pytest.skip(latex.MISSING)
    assert (done / "reports/paper.pdf").read_bytes()[:4] == b"%PDF"
    log = (done / "reports/paper.log").read_text(errors="replace")
    assert re.search(r"Output written on paper\.pdf \(\d+ pages", log)
    for figure in FIGURES:  # pdfTeX logs every graphic it embedded
        assert f"results/plots/{figure}.pdf" in log, figure


def test_snakemake_report_has_the_categories(done):
    snakemake(done, "--configfile", "tiny.yaml", "--report", "report.html", stand_ins=True)
    html = (done / "report.html").read_text(errors="replace")
    for item in ("Tables", "Figures", "Documents", "throughput.png", "scaling.html", "study.md"):
        assert item in html, item
    for item in ("waterfall.png", "waterfall.html", "The efficiency-loss waterfall"):
        assert item in html, item


def test_every_markdown_table_has_as_many_cells_as_its_header(done):
    """A separator or row with a cell too many or too few renders as a broken table."""
    lines = (done / "reports/study.md").read_text().splitlines()
    tables = 0
    for i, line in enumerate(lines):
        if not line.startswith("|---"):
            continue
        assert re.fullmatch(r"\|(---\|)+", line), line  # a separator alone on its line
        tables += 1
        width = lines[i - 1].count("|")
        assert line.count("|") == width, (lines[i - 1], line)
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                break
            # cells hold no literal '|' (run ids, numbers, words)
            assert row.count("|") == width, (lines[i - 1], row)
    assert tables >= 5


@pytest.mark.parametrize(
    ("commit", "says"),
    [
        ("0123abc", "git checkout 0123abc\n"),
        ("0123abc-dirty", "uncommitted changes on top of git commit"),
        ("0123abc; 4567def", "different git commits"),
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


def _csvs_with_energy(done, csv_dir, kwh):
    """The tiny study's CSVs with every resources row's energy_kwh set to `kwh` ("" = blank)."""
    csv_dir.mkdir()
    for name in report.TABLES:
        (csv_dir / f"{name}.csv").write_text((done / f"results/csv/{name}.csv").read_text())
    rows = read(csv_dir / "resources.csv")
    for r in rows:
        r["energy_kwh"] = kwh
    with (csv_dir / "resources.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("kwh", ["0.0421", ""])
def test_energy_is_shown_from_its_cell_or_said_to_be_unmeasured(done, tmp_path, kwh):
    """The CPU tiny study measures no energy: blank cells say so; a measured kWh (as a GPU study
    writes it) gets its column in both documents, the value formatted from the cell."""
    csv_dir = tmp_path / "csv"
    _csvs_with_energy(done, csv_dir, kwh)
    docs = report.render(csv_dir, done / "workflow/report", FIGURES, "../results/plots")
    for name, text in docs.items():
        assert ("GPU energy (kWh)" in text) == bool(kwh), name
        assert ("GPU energy was not measured" in text) == (not kwh), name
        assert ("0.0421" in text) == bool(kwh), name
        assert report.numbers_backed_by_csvs(text, report.load_tables(csv_dir)) == [], name
