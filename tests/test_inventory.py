"""`scalestudy inventory`: never fails a job, says what is absent or broken, records the image."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy import hardware
from scalestudy.jobs import inventory as inventory_module

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


def test_gpus_nvidia_smi_listed_before_a_non_zero_exit_are_kept(tmp_path):
    """nvidia-smi lists every GPU and exits 14 for a corrupted infoROM (a warning): the whole
    list was recorded as one error string, its first GPUs cut away at 500 characters."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rows = "".join(
        f"echo '{i}, NVIDIA H100 80GB HBM3, 580.159.04, 81559, 00000000:{i:02d}:00.0, 165{i}'\n"
        for i in range(8)
    )
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{rows}echo 'WARNING: infoROM is corrupted at gpu 0000:13:00.0'\n"
                   "exit 14\n")  # fmt: skip
    smi.chmod(0o755)
    info = inventory(tmp_path, path=str(bin_dir))
    assert [g["index"] for g in info["gpus"]] == [str(i) for i in range(8)], info["gpus"]
    assert info["gpus"][0]["driver_version"] == "580.159.04"
    assert info["gpus_warning"] == (
        "nvidia-smi exit 14: WARNING: infoROM is corrupted at gpu 0000:13:00.0"
    )


def test_infiniband_ports_say_their_link_layer_and_state(tmp_path, monkeypatch):
    """A RoCE NIC (link layer Ethernet) and a port that is down were both recorded as working
    InfiniBand: only the rate was read, and NCCL falls back to sockets over a port down."""
    ib = tmp_path / "infiniband"
    for dev, layer, state in (("mlx5_0", "Ethernet", "4: ACTIVE"), ("mlx5_1", "InfiniBand",
                                                                   "1: DOWN")):  # fmt: skip
        port = ib / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
        (port / "link_layer").write_text(layer + "\n")
        (port / "state").write_text(state + "\n")
    monkeypatch.setattr(inventory_module, "SYS_IB", ib)
    monkeypatch.setattr(inventory_module, "SYS_NET", tmp_path / "none")
    roce, down = inventory_module._network()
    assert roce["type"] == "roce" and roce["port1_state"] == "4: ACTIVE", roce
    assert down["type"] == "infiniband" and down["port1_state"] == "1: DOWN", down


def test_a_failing_tool_is_recorded_by_the_end_of_its_output_on_one_line(tmp_path):
    """A Python tool's error (srun's step on the job's node: inventory in a traceback) is its
    last line: the first 500 characters of its stderr were the top of the traceback, cut
    mid-line over ten lines of the log, the cause lost."""
    tool = tmp_path / "tool"
    tool.write_text(
        f"#!{PYTHON}\nimport sys\n"
        "sys.stderr.write('Traceback (most recent call last):\\n' + '  File \"x.py\"\\n' * 60)\n"
        "sys.stderr.write('RuntimeError: cuDNN version incompatibility\\n')\nsys.exit(1)\n"
    )
    tool.chmod(0o755)
    said = inventory_module._cmd([str(tool)])
    assert said.startswith("error: exit 1: ") and "\n" not in said, said
    assert said.endswith("RuntimeError: cuDNN version incompatibility"), said


def test_a_cudnn_that_torch_refuses_is_recorded_not_a_failed_job(monkeypatch):
    """torch raises RuntimeError from cudnn.version() where the cuDNN it loaded is not the one
    it was built for (a cluster's `module load cudnn` first on LD_LIBRARY_PATH): the probe
    outside every try failed the train rule before its launch, which would have run."""
    import torch

    def refused():
        raise RuntimeError("cuDNN version incompatibility: PyTorch was compiled against 9.24")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", refused)
    info = inventory_module._torch()
    assert info["cudnn"].startswith("error: cuDNN version incompatibility"), info


def test_a_torch_that_fails_to_load_is_recorded_not_a_failed_job(monkeypatch):
    """`import torch` re-raises the OSError of a library it cannot load (a cluster's `module
    load` putting another libcudnn first on LD_LIBRARY_PATH): only ImportError was caught, and
    the inventory's traceback failed the train rule before a launch in the image, which has
    its own torch and would have run."""
    import builtins

    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "torch":
            raise OSError("libcudnn.so.9: cannot open shared object file: No such file")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing_import)
    info = inventory_module._torch()
    assert info == {"torch": "error: libcudnn.so.9: cannot open shared object file: No such file"}


def test_without_a_usable_gpu_no_cuda_runtime_or_cudnn_is_recorded_as_in_use(monkeypatch):
    """A CPU node's inventory said cuda_runtime 13.0 and cudnn 92400 (what the wheel was built
    for and bundles) beside nccl "absent" and the run's own cuda_version null: the build's
    CUDA is its own key."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = inventory_module._torch()
    assert info["cuda_runtime"] == info["cudnn"] == info["nccl"] == "absent", info
    assert info["torch_built_for_cuda"] == (torch.version.cuda or "absent"), info


def test_a_tool_that_prints_bytes_that_are_not_utf8_is_recorded_not_a_crash(tmp_path):
    """A probed tool printing a Latin-1 byte (lscpu's "Intel(R)" as 0xAE, scontrol's WorkDir in
    a Latin-1 named directory) was a UnicodeDecodeError traceback: no inventory, a failed job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lscpu = bin_dir / "lscpu"
    lscpu.write_bytes(b"#!/bin/sh\nprintf 'Model name: Intel\\256 Xeon\\n'\n")
    lscpu.chmod(0o755)
    assert (
        subprocess.run([str(lscpu)], capture_output=True).stdout == b"Model name: Intel\xae Xeon\n"
    )
    info = inventory(tmp_path, path=str(bin_dir))
    assert info["cpu"]["lscpu"] == "Model name: Intel\ufffd Xeon"


def test_kernel_files_that_are_not_utf8_are_recorded_not_a_crash(tmp_path, monkeypatch):
    """/proc/cpuinfo and /sys/class/net were read strictly: a Latin-1 byte in the CPU's model
    name or a device's field was a UnicodeDecodeError (not the OSError caught), a failed job."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_bytes(b"processor\t: 0\nmodel name\t: Intel\xae Xeon\n")
    net = tmp_path / "net"
    (net / "eth0").mkdir(parents=True)
    (net / "eth0" / "operstate").write_bytes(b"up\xff\n")
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
    monkeypatch.setattr(inventory_module, "SYS_NET", net)
    monkeypatch.setattr(inventory_module, "SYS_IB", tmp_path / "no-infiniband")
    assert inventory_module._cpu()["model"] == "Intel\ufffd Xeon"
    (eth0,) = inventory_module._network()
    assert eth0["operstate"] == "up\ufffd" and eth0["mtu"] == inventory_module.ABSENT


# /proc/cpuinfo of an aarch64 node (an NVIDIA Grace CPU, as on GH200 nodes): no "model name"
GRACE_CPUINFO = (
    "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n"
    "CPU revision\t: 0\n"
)


def test_a_cpuinfo_without_a_model_name_gives_lscpus_model_or_absent(tmp_path, monkeypatch):
    """An aarch64 /proc/cpuinfo has no "model name" line, and the inventory of an ARM node
    recorded no CPU model at all (no "model" key, not even "absent"). lscpu names it."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(GRACE_CPUINFO)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lscpu = bin_dir / "lscpu"  # what lscpu prints there
    lscpu.write_text(
        "#!/bin/sh\nprintf 'Architecture:             aarch64\\n"
        "  Model name:             Neoverse-V2\\n    Model:                  0\\n'\n"
    )
    lscpu.chmod(0o755)
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
    monkeypatch.setenv("PATH", str(bin_dir))  # the probes look tools up on this PATH
    assert inventory_module._cpu()["model"] == "Neoverse-V2"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no lscpu either
    assert inventory_module._cpu()["model"] == inventory_module.ABSENT
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "no-cpuinfo")
    assert inventory_module._cpu()["model"] == inventory_module.ABSENT


def test_the_trainer_names_an_arm_cpu_by_its_model_as_the_inventory_does(tmp_path, monkeypatch):
    """The inventory reads lscpu's "Model name" where /proc/cpuinfo has none (aarch64), the
    trainer did not: metrics.json's device name, and runs.csv's device_name after it, was
    platform.processor() or platform.machine(), the architecture ('aarch64'), on a Grace
    node. Both read the CPU's model one way (hardware.cpu_model)."""
    import torch

    from scalestudy.trainer import measure

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(GRACE_CPUINFO)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lscpu = bin_dir / "lscpu"
    lscpu.write_text("#!/bin/sh\nprintf 'Architecture: aarch64\\n  Model name: Neoverse-V2\\n'\n")
    lscpu.chmod(0o755)
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert measure.device_info(torch.device("cpu")) == {"type": "cpu", "name": "Neoverse-V2"}
    assert inventory_module._cpu()["model"] == "Neoverse-V2"
    cpuinfo.write_bytes(b"processor\t: 0\nmodel name\t: Intel\xae Xeon\n")  # read as text
    assert measure.device_info(torch.device("cpu"))["name"] == "Intel\ufffd Xeon"


def test_the_image_digest_is_the_sha256_of_the_image(tmp_path):
    image = tmp_path / "trainer.sif"
    image.write_bytes(b"not really an image, but bytes to hash" * 1000)
    info = inventory(tmp_path, "--image", str(image))
    assert info["container_digest"] == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    # its torch and python are the host's, not the image's: said, where they were unlabelled
    assert info["software_of"].startswith("this host's Python (")
    assert "not the image's the ranks run in" in info["software_of"]
    assert "not the image's" not in inventory(tmp_path)["software_of"]
    # an image it cannot read, given by hand: one line, exit 2, nothing written (it was an
    # "error: ..." digest in the record, exit 0); in a job launch refuses it before the record
    (tmp_path / "system.json").unlink()
    proc = subprocess.run(
        [PYTHON, "-m", "scalestudy", "inventory", "--out", str(tmp_path / "system.json"),
         "--image", str(tmp_path / "gone.sif")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "gone.sif" in proc.stderr and "scalestudy container build" in proc.stderr
    assert not (tmp_path / "system.json").exists()


# ------------------------------------------------------------------ the Slurm job's fields
FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def test_scontrol_text_gives_the_fields_the_jobstep_strips():
    """Real `scontrol -d show job` text of the local cluster (tests/fixtures/slurm/README.md)."""
    one = inventory_module.scontrol_job_fields(
        (FIXTURES / "scontrol_show_job_1node.txt").read_text()
    )
    assert one == {
        "SLURM_JOB_ID": "4",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_PARTITION": "debug",
        "SLURM_NNODES": "1",
    }  # no GPU fields: that cluster has none (JOB_GRES=(null), GRES= empty)
    two = inventory_module.scontrol_job_fields(
        (FIXTURES / "scontrol_show_job_2nodes.txt").read_text()
    )
    assert (two["SLURM_JOB_NODELIST"], two["SLURM_NNODES"]) == ("node[1-2]", "2")


def test_gpus_come_from_the_first_nodes_gres_detail():
    # written by hand in the form of `scontrol -d show job`'s per-node detail (no GPU cluster
    # here): the first node (the batch host) holds GPUs 0-3
    text = (
        "JobId=7 NodeList=gpu[01-02] NumNodes=2 JOB_GRES=gpu:a100:8\n"
        "     Nodes=gpu01 CPU_IDs=0-63 Mem=0 GRES=gpu:a100:4(IDX:0-3)\n"
        "     Nodes=gpu02 CPU_IDs=0-63 Mem=0 GRES=gpu:a100:4(IDX:0,2,4-5)\n"
    )
    fields = inventory_module.scontrol_job_fields(text)
    assert (fields["SLURM_GPUS_ON_NODE"], fields["SLURM_JOB_GPUS"]) == ("4", "0,1,2,3")
    assert inventory_module._indices("0,2,4-5") == [0, 2, 4, 5]


@pytest.mark.parametrize(
    "detail, count, ids",
    [
        ("GRES=gpu(IDX:5)", "1", "5"),  # older Slurm: no count
        ("GRES_IDX=gpu(IDX:1-4)", "4", "1,2,3,4"),  # older Slurm's key
        ("GRES=gpu:2(IDX:0-1)", "2", "0,1"),  # a count, no type
        ("GRES=gpu:a100(IDX:0,3)", "2", "0,3"),  # a type, no count
        ("GRES=gpu:a100:1(IDX:N/A)", "1", "N/A"),  # not a list: recorded as written
        # an all-digit type without a count was read as the count: 3090 GPUs
        ("GRES=gpu:3090(IDX:0,3)", "2", "0,3"),
        ("GRES=gpu:4(IDX:N/A)", "4", "N/A"),  # no list: a bare number is the count
        # two GPU types on the node: only the first entry was read (4, "0,1,2,3")
        ("GRES=gpu:a100:4(IDX:0-3),gpu:v100:2(IDX:4-5)", "6", "0,1,2,3,4,5"),
        ("GRES=gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:N/A)", "3", "0,1,N/A"),
        ("GRES=gpu:a100:2(IDX:0-1),gpu:v100(IDX:N/A)", None, "0,1,N/A"),  # how many: unknown
        ("GRES=nvme:1(IDX:0),gpu:a100:2(IDX:0-1)", "2", "0,1"),  # other kinds: not GPUs
    ],
)
def test_gpus_of_every_gres_form_or_none_is_a_traceback(detail, count, ids):
    """The count-less forms of older Slurm gave no GPU fields, and an index list that is no list
    of numbers was a ValueError traceback in the job's inventory (and so no training)."""
    text = f"JobId=7 NodeList=gpu01 NumNodes=1\n     Nodes=gpu01 CPU_IDs=0-63 Mem=0 {detail}\n"
    fields = inventory_module.scontrol_job_fields(text)
    assert (fields.get("SLURM_GPUS_ON_NODE"), fields.get("SLURM_JOB_GPUS")) == (count, ids)


def test_environment_values_are_kept_and_the_missing_ones_asked_from_scontrol(
    tmp_path, monkeypatch
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"  # stand-in: prints the captured text and its arguments
    scontrol.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\n'
        f"/bin/cat {FIXTURES / 'scontrol_show_job_2nodes.txt'}\n"
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # the probes look tools up on this PATH
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_PARTITION": "from-env"}
    job = inventory_module.slurm_job(env)
    assert (tmp_path / "argv").read_text().split() == ["-d", "show", "job", "1"]
    assert job["SLURM_JOB_PARTITION"] == "from-env"  # the environment wins
    assert (job["SLURM_JOB_NODELIST"], job["SLURM_NNODES"]) == ("node[1-2]", "2")
    assert job["SLURM_JOB_GPUS"] == job["SLURM_CLUSTER_NAME"] == "absent"
    # in a step (srun --overlap from salloc's shell, srun --pty bash) SLURM_NNODES is the
    # step's node count: the job's is SLURM_JOB_NUM_NODES (a 2-node run recorded 1)
    step = {**env, "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "2"}
    assert inventory_module.slurm_job(step)["SLURM_NNODES"] == "2"
    # without a job id nothing is asked; a failing scontrol is recorded, not raised
    assert inventory_module.slurm_job({})["SLURM_JOB_NODELIST"] == "absent"
    scontrol.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id' >&2\nexit 1\n")
    failed = inventory_module.slurm_job(env)
    assert failed["scontrol"].startswith("error: exit 1: slurm_load_jobs error")
    assert failed["SLURM_JOB_NODELIST"] == "absent"


# ------------------------------------------------------------------ where the inventory runs
# tests/stand-ins/salloc-shell: srun runs the "step" here as a child, with the variables of a
# task on a node (SLURMD_NODENAME, SLURM_STEP_ID); scontrol expands node lists
SALLOC_SHELL = Path(__file__).parent / "stand-ins" / "salloc-shell"


def salloc_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of `salloc`'s shell on the submit host (no step, no SLURMD_NODENAME), the
    stand-ins first on PATH, srun's calls logged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "SRUN_"))}
    env.update(
        PATH=f"{SALLOC_SHELL}{os.pathsep}{env['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu-node[01-02]",
        SRUN_STAND_IN_LOG=str(tmp_path / "srun.log"),
        **extra,
    )
    return env


def run_inventory(tmp_path: Path, env: dict[str, str]) -> tuple[dict, str]:
    out = tmp_path / "system.json"
    proc = subprocess.run(
        [PYTHON, "-m", "scalestudy", "inventory", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout + proc.stderr


def test_in_sallocs_shell_the_inventory_is_taken_on_the_jobs_node(tmp_path):
    """Snakemake's local executor in `salloc`'s shell runs the rule's `scalestudy inventory` on
    the submit host, while `scalestudy launch` srun's the ranks onto the allocation's nodes:
    results/system/<run>.json recorded the login node's GPUs, CPU and network as the run's. It
    is now taken by `srun` on the job's first node, and says so."""
    info, said = run_inventory(tmp_path, salloc_env(tmp_path))
    (call,) = (tmp_path / "srun.log").read_text().splitlines()
    options = call.split("\t")[:4]
    assert options == ["--nodes=1", "--ntasks=1", "--overlap", "--nodelist=gpu-node01"]
    assert info["slurm_node"] == "gpu-node01"  # a task of the step, on that node
    assert info["collected_through"].startswith("srun on gpu-node01: ")
    assert "is not a node of Slurm job 4242 (gpu-node[01-02])" in info["collected_through"]
    assert info["slurm"]["SLURM_JOB_ID"] == "4242"
    assert "inventory of " in said and "WARNING" not in said


def test_on_a_node_of_the_job_or_outside_slurm_the_inventory_is_taken_here(tmp_path):
    """The Slurm executor's batch step (on the job's first node: SLURMD_NODENAME) and a task
    of a step need no srun."""
    for extra in ({"SLURMD_NODENAME": "gpu-node02"}, {"SLURM_STEP_ID": "3"}):
        info, _ = run_inventory(tmp_path, salloc_env(tmp_path, **extra))
        assert "collected_through" not in info and "warning" not in info
    outside = salloc_env(tmp_path)
    del outside["SLURM_JOB_ID"]
    info, _ = run_inventory(tmp_path, outside)
    assert info["slurm_node"] == "absent" and "collected_through" not in info
    assert not (tmp_path / "srun.log").exists()


def test_a_failing_srun_leaves_this_hosts_inventory_saying_whose_it_is(tmp_path):
    """The inventory never fails a job: where srun cannot start the step (an old Slurm without
    --overlap, a node gone), this host's inventory is written with a warning naming it."""
    fail = "srun: error: Unable to create step for job 4242: Invalid generic resource"
    info, said = run_inventory(tmp_path, salloc_env(tmp_path, SRUN_STAND_IN_FAIL=fail))
    assert info["slurm_node"] == "absent"
    assert info["warning"].startswith(f"{info['hostname']} is not a node of Slurm job 4242")
    assert fail in info["warning"]
    assert f"WARNING inventory: {info['warning']}" in said


def test_an_inventory_onto_the_runs_image_is_refused_and_writes_nothing(tmp_path):
    """`inventory --out X.sif --image X.sif` replaced the run's container image with its JSON
    and exited 0."""
    from scalestudy import cli

    image = tmp_path / "trainer.sif"
    image.write_bytes(b"an image")
    assert cli.main(["inventory", "--out", str(image), "--image", str(image)]) == 2
    assert image.read_bytes() == b"an image"
