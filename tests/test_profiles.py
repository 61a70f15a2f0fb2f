"""Profiles: the workflow profile (profiles/default) is loaded with every --profile too, and its
keys win over the --profile's key by key (Snakemake's precedence), so it must hold nothing a
site profile sets; otherwise profiles/slurm's `latency-wait: 60` silently became 30."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SITE_PROFILES = ("slurm", "local-slurm")
# what a site tunes: the shared filesystem's delay, queue size, retries, requests
SITE_KEYS = {"latency-wait", "jobs", "retries", "default-resources", "set-resources", "executor"}


def keys(name: str) -> set[str]:
    data = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    # YTE's control keys (`?if ...:`, __use_yte__, __definitions__) are not settings
    flat = set()
    for key, value in data.items():
        if key.startswith("?"):
            flat |= set(value)
        elif not key.startswith("__"):
            flat.add(key)
    return flat


def test_the_default_profile_sets_no_site_setting():
    assert not keys("default") & SITE_KEYS


@pytest.mark.parametrize("site", SITE_PROFILES)
def test_a_site_profile_is_not_overridden_by_the_default_one(site):
    assert not keys("default") & keys(site), "these keys of profiles/default would win"
    assert "latency-wait" in keys(site)


@pytest.mark.parametrize("site", SITE_PROFILES)
def test_site_profiles_requeue_through_the_plugin(site):
    assert "slurm-requeue" in keys(site)


def test_every_slurm_submission_passes_the_command_as_a_script():
    """`--executor slurm -j 20` (README) loads no site profile: with the setting only there, the
    plugin put the job's command in sbatch --wrap="...", where the submitting shell ran a
    --config value's $(...). The workflow profile is loaded with every call."""
    assert "slurm-pass-command-as-script" in keys("default")


def test_the_slurm_placeholders_uncommented_stay_text_when_snakemake_evaluates_them():
    """Snakemake evaluates a resource's text as Python and keeps the text only where that
    fails (NameError, SyntaxError): `slurm_partition: "all"` became the built-in all() and the
    dry run died. The placeholders carry their own quotes, as slurm_extra does."""
    text = (REPO / "profiles/slurm/config.yaml").read_text()
    uncommented = "\n".join(
        line.replace("# slurm_", "slurm_", 1) if line.lstrip().startswith("# slurm_") else line
        for line in text.splitlines()
    )
    resources = yaml.safe_load(uncommented)["default-resources"]
    for key in ("slurm_partition", "slurm_account"):
        value = resources[key]
        assert eval(value, {}) == value.strip("'"), (key, value)  # noqa: S307 (as Snakemake does)
        for name in ("all", "max", "any"):  # a site's partition of that name stays a name
            assert eval(value.replace(value.strip("'"), name), {}) == name
