"""`scalestudy inventory`: never fails a job, says what is absent or broken, records the image."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

PYTHON = sys.executable


def inventory(tmp_path, *args, path=None):
    out = tmp_path / "system.json"
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run(
        [PYTHON, "-m", "scalestudy", "inventory", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_absent_tools_are_named_absent_and_the_rest_is_recorded(tmp_path):
    # an empty PATH: no nvidia-smi, nsys, ncu, sinfo, lscpu, apptainer
    info = inventory(tmp_path, path=str(tmp_path / "empty"))
    for key in ("gpus", "nsys", "ncu", "slurm_version", "apptainer", "container_digest"):
        assert info[key] == "absent", key
    assert info["torch"].split("+")[0] == __import__("torch").__version__.split("+")[0]
    assert info["cpu"]["logical_cpus"] == os.cpu_count()
    assert {n["name"] for n in info["network"]} >= {"lo"}


def test_a_failing_tool_is_recorded_as_an_error_not_a_crash(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    broken = bin_dir / "nvidia-smi"  # a driver/library mismatch looks like this
    broken.write_text(
        "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library mismatch' >&2\nexit 9\n"
    )
    broken.chmod(0o755)
    info = inventory(tmp_path, path=str(bin_dir))
    assert info["gpus"].startswith("error: exit 9")
    assert "Driver/library mismatch" in info["gpus"]


def test_the_image_digest_is_the_sha256_of_the_image(tmp_path):
    image = tmp_path / "trainer.sif"
    image.write_bytes(b"not really an image, but bytes to hash" * 1000)
    info = inventory(tmp_path, "--image", str(image))
    assert info["container_digest"] == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    missing = inventory(tmp_path, "--image", str(tmp_path / "gone.sif"))
    assert (
        missing["container_digest"].startswith("error:")
        and "gone.sif" in missing["container_digest"]
    )
