"""Where the workflow finds things (study/paths.py), and the hand-run commands that find the
repository's files from any directory (the schema, the report templates)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from scalestudy.errors import AnalysisError, WorkdirError
from scalestudy.results import render_report
from scalestudy.study import config as studyconfig
from scalestudy.study import paths

REPO = Path(__file__).resolve().parents[1]


def test_a_repository_file_is_named_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    # from the repository root the text is what the rules always named: no changed input
    code = "src/scalestudy/results/plot.py"
    assert paths.repo_file(REPO, code) == code
    assert paths.repo_file(REPO, ".") == "."
    study = tmp_path / "a" / "study"
    study.mkdir(parents=True)
    monkeypatch.chdir(study)
    named = paths.repo_file(REPO, "workflow/report/study.md.j2")
    assert not os.path.isabs(named) and named.startswith("..")
    assert (study / named).resolve() == REPO / "workflow/report/study.md.j2"
    assert Path(named).is_file()  # the working directory reads the repository's file through it
    assert paths.repo_files(REPO, ["pyproject.toml"]) == [os.path.relpath(REPO / "pyproject.toml")]


def test_an_absolute_path_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "my.def"
    assert paths.repo_file(REPO, str(own)) == str(own)


def test_another_working_directory_must_name_its_study(tmp_path):
    with pytest.raises(WorkdirError) as info:
        paths.check_workdir(REPO, [], cwd=tmp_path)
    message = str(info.value)
    assert "\n" not in message  # one line
    assert str(tmp_path.resolve()) in message and "--configfile" in message
    assert str(REPO / "config/demo.yaml") in message  # the fix, as a path to type anywhere
    assert "not to --directory" in message


def test_a_named_study_or_the_repository_root_is_accepted(tmp_path):
    paths.check_workdir(REPO, [tmp_path / "study.yaml"], cwd=tmp_path)
    paths.check_workdir(REPO, [], cwd=REPO)
    paths.check_workdir(REPO, [], cwd=REPO / "workflow" / "..")  # the same directory


def test_reproduce_names_the_study_files_and_overrides_from_the_repository_root(tmp_path):
    """Every --configfile in order and the --config overrides: the report named only the last
    file, so the demo (config/demo.yaml + an overlay, dataset=synthetic) reproduced as the
    paper study with the overlay, on CIFAR-10."""
    assert paths.reproduce_configfile(REPO, []) == "config/config.yaml"
    assert paths.reproduce_configfile(REPO, [REPO / "config/demo.yaml"]) == "config/demo.yaml"
    outside = tmp_path / "my study.yaml"  # outside the repository: absolute, and quoted
    got = paths.reproduce_configfile(
        REPO, [REPO / "config/demo.yaml", outside], {"dataset": "synthetic", "repeats": 2}
    )
    assert got == f"config/demo.yaml '{outside}' --config dataset=synthetic repeats=2"


def test_messages_show_a_path_the_user_can_type(tmp_path):
    assert paths.shown(REPO, "config/demo.yaml", cwd=REPO) == "config/demo.yaml"
    assert paths.shown(REPO, "config/demo.yaml", cwd=tmp_path) == str(REPO / "config/demo.yaml")


def test_the_schema_is_the_checkouts_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no workflow/ here
    assert studyconfig.schema_path() == REPO / "workflow/schemas/config.schema.yaml"


def test_render_report_finds_its_templates_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    render_report.add_arguments(parser)
    templates = Path(parser.parse_args([]).templates)
    assert (templates / "study.md.j2").is_file() and (templates / "paper.tex.j2").is_file()


def test_render_report_names_a_templates_directory_without_templates(tmp_path):
    (tmp_path / "csv").mkdir()
    for name in render_report.TABLES:  # empty tables: the templates are what is missing
        (tmp_path / "csv" / f"{name}.csv").write_text("")
    args = argparse.Namespace(
        csv_dir=str(tmp_path / "csv"),
        templates=str(tmp_path),
        figures=[],
        figure_dir="../results/plots",
        out_dir=str(tmp_path / "reports"),
    )
    with pytest.raises(AnalysisError, match=r"--templates .*: no template study\.md\.j2 there"):
        render_report.run(args)
