"""The parsers and the ncu filter on real captures from H200s and H100s (tests/fixtures/gpu-h200*/,
gpu-h100*/, where each file's command and versions are written down): what ncu, torch.profiler
and our classifier see on a GPU, not what we imagined they would."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from scalestudy.errors import ProfileFormatError
from scalestudy.jobs import gpu_check_report as report
from scalestudy.jobs import ncu_kernels as profile
from scalestudy.jobs import profile_ncu
from scalestudy.nsight import classify, ncu, schema, torch_ops

H200 = Path(__file__).parent / "fixtures" / "gpu-h200"


def kernel_rows() -> list[dict]:
    """torch.profiler's kernels of the eager bf16 run (gpu-check's torch-profiler check)."""
    with (H200 / "torch_profiler_kernels.csv").open() as f:
        rows = list(csv.DictReader(f))
    return sorted(rows, key=lambda r: -float(r["total_ns"]))


def ncu_names() -> list[str]:
    """ncu's own demangled names of the same command's kernels ("Available Kernels")."""
    return (H200 / "ncu_kernel_names.txt").read_text().splitlines()


def matches(name: str, names: list[str]) -> list[str]:
    return [n for n in names if re.fullmatch(profile.ncu_kernel_regex(name), n)]


def test_the_ncu_filter_finds_torch_profiler_kernels_in_ncu_spelling():
    """The first gpu-check on a GPU profiled nothing: its filter was torch.profiler's spelling
    of the name, which ncu never prints ('4' for '(int)4', '(anonymous namespace)' for
    '<unnamed>', types for template parameters). Every kernel now matches at most one of ncu's
    names (one instantiation); the only ones matching none are copies, cuDNN engines that one
    of the two processes chose, and a name the profiler left mangled."""
    rows, names = kernel_rows(), ncu_names()
    assert len(rows) > 50 and len(names) > 50
    found = {r["kernel"]: matches(r["kernel"], names) for r in rows}
    assert all(len(hits) <= 1 for hits in found.values()), {
        k[:80]: h for k, h in found.items() if len(h) > 1
    }
    missing = [k for k, hits in found.items() if not hits]
    # the ones left: copies and memsets (no kernels: ncu never lists them), cuDNN's engines
    # that only one of the two processes chose (cudnn.benchmark), and a name the profiler could
    # not demangle (matched by ncu_name_base "mangled", not in this list)
    unexplained = [
        k
        for k in missing
        if not k.startswith(("Memcpy", "Memset", "_Z"))
        and not re.search(r"xmma|cutlass", k)
        and classify.classify(k) != "conv"
    ]
    assert unexplained == []
    assert len(rows) - len(missing) >= 0.8 * len(rows)
    # the two top kernels of that run, which ncu did not find then
    for kernel in schema.top_kernels(rows, 2):
        assert len(found[kernel]) == 1 and "batch_norm" in found[kernel][0]


def test_the_filter_tells_instantiations_apart():
    names = ncu_names()
    start = "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::"
    bf16_add = [r["kernel"] for r in kernel_rows() if r["kernel"].startswith(start + "BFloat16>")]
    assert bf16_add
    (hit,) = matches(bf16_add[0], names)
    assert "CUDAFunctor_add<c10::BFloat16>" in hit and "(int)8" in hit
    float_add = bf16_add[0].replace("c10::BFloat16", "float")
    assert all("BFloat16" not in h for h in matches(float_add, names))


def test_every_cudnn_kernel_of_the_h200_is_conv_and_no_fused_batch_norm_is():
    """cuDNN's kernels (its bundled CUTLASS/XMMA, `_5x_cudnn`) in both processes' spellings are
    conv, and every inductor kernel that fuses a batch norm is batchnorm, whatever else it fused
    (convolution_backward's pointwise tail was 9.4 % of the compiled step, counted as conv)."""
    names = {r["kernel"] for r in kernel_rows()} | set(ncu_names())
    cudnn = [n for n in names if "_5x_cudnn" in n and not n.startswith("_Z")]
    assert len(cudnn) > 20
    assert {n: classify.classify(n) for n in cudnn if classify.classify(n) != "conv"} == {}
    rows = torch_ops.parse_torch(H200 / "torch_ops_compiled_bf16.json", "h200")[0]
    fused = [r for r in rows if r["kernel"].startswith("triton_") and "batch_norm" in r["kernel"]]
    assert any("convolution_backward" in r["kernel"] for r in fused)
    assert {r["category"] for r in fused} == {"batchnorm"}


def test_a_name_the_profiler_left_mangled_is_filtered_mangled():
    mangled = next(r["kernel"] for r in kernel_rows() if r["kernel"].startswith("_Z"))
    assert profile.ncu_name_base(mangled) == "mangled"
    assert re.fullmatch(profile.ncu_kernel_regex(mangled), mangled)
    # the ncu job's command takes the base the kernels step chose for the name
    cmd = profile_ncu.ncu_command("d/k", profile.candidate(mangled, 3), 0, 1, ["python"])
    assert cmd[cmd.index("--kernel-name-base") + 1] == "mangled"
    demangled = kernel_rows()[0]["kernel"]
    cmd = profile_ncu.ncu_command("d/k", profile.candidate(demangled, 3), 0, 1, ["python"])
    assert cmd[cmd.index("--kernel-name-base") + 1] == "demangled"


def csv_metric(path: Path, metric: str) -> float:
    """One metric of a one-launch ncu details CSV, read with the csv module alone."""
    with path.open() as f:
        rows = [r for r in csv.reader(f) if len(r) > 14]
    header = rows[0]
    name, value = header.index("Metric Name"), header.index("Metric Value")
    (cell,) = [r[value] for r in rows[1:] if r[name] == metric]
    return float(cell.replace(",", ""))


def top_kernels(capture: str) -> list[str]:
    """The kernels gpu-check gave ncu, by torch.profiler's spelling: the top two of the eager
    bf16 run's kernels CSV (H200) or of its trimmed export (H100, parsed here)."""
    if capture == "gpu-h200":
        return schema.top_kernels(kernel_rows(), 2)
    export = H200.parent / capture / "torch_ops_rank0.json"
    return schema.top_kernels(torch_ops.parse_torch(export, "h100")[0], 2)


@pytest.mark.parametrize(
    "capture, index",
    [("gpu-h200", 0), ("gpu-h100-ncu", 0), ("gpu-h100-ncu", 1), ("gpu-h200-check", 0)],
)
def test_parse_ncu_reads_a_real_details_page(capture, index, tmp_path):
    """ncu 2025.3.1 on the H200 and the H100: `--csv --page details --print-units base
    --print-metric-name name` of one batch-norm launch (rule rows, estimated-speedup columns
    and all), joined to torch.profiler's name of the kernel gpu-check asked ncu for."""
    path = H200.parent / capture / f"ncu_k{index}.csv"
    kernel = top_kernels(capture)[index]
    (row,) = ncu.parse_ncu(path, capture, kernel=kernel)
    assert row["kernel"] == kernel  # the kernels CSV's spelling, for the join
    assert row["duration_ns"] == pytest.approx(csv_metric(path, "gpu__time_duration.sum"))
    occupancy = "sm__warps_active.avg.pct_of_peak_sustained_active"
    assert row["achieved_occupancy_pct"] == pytest.approx(csv_metric(path, occupancy))
    sm = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
    assert row["sm_throughput_pct"] == pytest.approx(csv_metric(path, sm))
    assert row["flop_per_s"] > 0  # fp32 FMAs of the statistics (SASS counters)
    assert row["tensor_flop_per_s"] == 0  # a batch norm uses no tensor core
    # gpu-check's trimmed fixture parses to the same numbers
    trimmed = tmp_path / "ncu-trimmed.csv"
    trimmed.write_text(report.trim_ncu_csv(path.read_text()))
    (cut,) = ncu.parse_ncu(trimmed, capture, kernel=kernel)
    assert cut["duration_ns"] == row["duration_ns"] and cut["flop_per_s"] == row["flop_per_s"]


def test_ncu_launches_are_told_apart_by_their_id_and_a_table_without_it_is_refused(tmp_path):
    """A details table without its ID column (re-saved by hand) folded every launch of a
    kernel into one, the last launch's values its "mean" with launches 1: a wrong number and
    no message. Two launches of the real H200 page (the second relabelled ID 1, its duration
    doubled) are two, with their mean; the same table without the ID column is one line."""
    rows = list(csv.reader((H200.parent / "gpu-h200" / "ncu_k0.csv").open()))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    header, launch = rows[head], rows[head + 1 :]
    j_id, j_name, j_value = (header.index(c) for c in ("ID", "Metric Name", "Metric Value"))
    second = [list(r) for r in launch]
    for r in second:
        r[j_id] = "1"
        if r[j_name] == "gpu__time_duration.sum":
            r[j_value] = str(2 * float(r[j_value].replace(",", "")))  # "64,448" ns
    path = tmp_path / "two.csv"
    with path.open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([*rows[:head], header, *launch, *second])
    (row,) = ncu.parse_ncu(path, "r")
    one = csv_metric(H200.parent / "gpu-h200" / "ncu_k0.csv", "gpu__time_duration.sum")
    assert row["launches"] == 2 and row["duration_ns"] == pytest.approx(1.5 * one)
    without = [[c for j, c in enumerate(r) if j != j_id] for r in [header, *launch, *second]]
    with path.open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([*rows[:head], *without])
    with pytest.raises(ProfileFormatError, match="no ID column: the launches of a kernel"):
        ncu.parse_ncu(path, "r")


def shares(kernels: list[dict]) -> dict[str, float]:
    total = sum(float(r["total_ns"]) for r in kernels)
    out: dict[str, float] = {}
    for r in kernels:
        out[r["category"]] = out.get(r["category"], 0.0) + float(r["total_ns"]) / total
    return out


@pytest.mark.parametrize(
    ("export", "triton_min"),
    [
        ("gpu-h200/torch_ops_eager_bf16.json", 0),
        ("gpu-h200/torch_ops_compiled_bf16.json", 20),  # untrimmed
        ("gpu-h100-check/torch_ops_eager_bf16.json", 0),
        # the study's profiling job, compiled; trimmed to its top 20 CUDA entries (6 inductor's)
        ("gpu-h100-check/study/torch_ops_rank0.json", 5),
        ("gpu-h200-check/torch_ops_rank0.json", 0),
        ("gpu-h200-check/study/torch_ops_rank0.json", 4),  # 4 of its top 20 are inductor's
    ],
)
def test_torch_profiler_exports_of_a_gpu_run_are_classified(export, triton_min, tmp_path):
    """Real exports: the eager run (cuDNN convolutions, ATen batch norms and elementwise
    kernels) and the compiled one (inductor's Triton kernels around cuDNN's convolutions), on
    an H200 and on an H100."""
    target = tmp_path / "torch_ops_rank0.json"
    target.write_text((H200.parent / export).read_text())
    kernels, ranges = torch_ops.parse_torch(target, "gpu")
    assert len(kernels) >= 15  # the eager export is trimmed to its top 20 CUDA entries
    by_category = shares(kernels)
    assert by_category.get("other", 0.0) < 0.02, by_category
    assert by_category["conv"] > 0.3 and by_category["batchnorm"] > 0.05
    assert {r["range"] for r in ranges} >= {"forward", "backward"}
    triton = [r for r in kernels if r["kernel"].startswith("triton_")]
    if not triton_min:
        assert triton == []  # eager: no inductor kernel
    else:
        assert len(triton) >= triton_min
        assert all(r["category"] != "other" for r in triton), [
            r["kernel"] for r in triton if r["category"] == "other"
        ]


H100 = Path(__file__).parent / "fixtures" / "gpu-h100"
# the same profiling job in the first full gpu-check on an H100 (commit 03d00a6), whose
# torch-profiler-study passed; its README says what ran
H100_CHECK = Path(__file__).parent / "fixtures" / "gpu-h100-check"
# and in the full gpu-check on an H200 of 2026-12-04 (its README says what ran)
H200_CHECK = Path(__file__).parent / "fixtures" / "gpu-h200-check"


@pytest.mark.parametrize(
    "capture",
    [H100, H100_CHECK / "study", H200_CHECK / "study"],
    ids=["sixth", "full-check", "h200-check"],
)
def test_the_phases_of_a_real_gpu_step_are_projected_from_its_trace(capture):
    """The study's profiling job of a compiled run on one H100 (gpu-check torch-profiler-study,
    which failed on the first capture: "no phase range optimizer"). kineto's device-side spans
    of the ranges, what the export's device entries sum, hold only the kernels whose innermost
    annotation was the range: they miss the optimizer (under Optimizer.step#SGD.step), DDP's
    forward (under DistributedDataParallel.forward) and the backward (launched from autograd's
    thread). The projection from the trace counts them."""
    kernels, ranges = torch_ops.parse_torch(capture, "h100")
    assert any(r["kernel"].startswith("triton_") for r in kernels)
    phases = {r["range"]: r for r in ranges}
    assert {"forward", "backward", "optimizer"} <= set(phases)
    assert {r["time_base"] for r in ranges} == {"gpu_projection"}
    events = json.loads((capture / "trace_rank0.json").read_text())["traceEvents"]
    spans = {}
    for e in events:
        if e["cat"] == "gpu_user_annotation":
            spans[e["name"]] = spans.get(e["name"], 0.0) + e["dur"] * 1e3  # us -> ns
    assert "optimizer" not in spans  # the defect: kineto gives the optimizer range nothing
    # every optimizer kernel runs under Optimizer.step#SGD.step: the two measures agree
    assert phases["optimizer"]["total_ns"] == pytest.approx(
        spans["Optimizer.step#SGD.step"], abs=10
    )
    # forward holds DDP's forward and the loss after it; kineto's "forward" only the loss
    assert phases["forward"]["total_ns"] >= spans["DistributedDataParallel.forward"]
    assert phases["forward"]["total_ns"] > 2 * spans["forward"]
    # a backward costs about twice its forward (two gradients per layer)
    assert phases["backward"]["total_ns"] > 1.5 * phases["forward"]["total_ns"]
    assert phases["backward"]["total_ns"] > 10 * spans["backward"]


def test_a_gpu_runs_export_without_device_activity_is_refused_not_read_as_a_cpu_run(tmp_path):
    """CUPTI recorded no GPU activity (another profiler holding it, nsys for one, or CUPTI
    unavailable: torch warns and keeps the host events): with no device time the export was
    read as a CPU run's, its host self times as kernels (cudaLaunchKernel and cudaGraphLaunch
    among the top ones) and its phases as host enqueue time, beside the other ranks' real
    kernels. The real H100 export with its CUDA entries and device times removed."""
    export = json.loads((H100 / "torch_ops_rank0.json").read_text())
    export["ops"] = [
        op | {"self_device_us": 0.0, "device_total_us": 0.0}
        for op in export["ops"]
        if op["device_type"] != "CUDA"
    ]
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps(export))
    with pytest.raises(ProfileFormatError, match="no GPU activity.*'cudaLaunchKernel'"):
        torch_ops.parse_torch(tmp_path, "h100")
    # the capture refuses it too (without the parser): it finished, so every rerun repeated
    # only the parse, which refused it every time
    from scalestudy.jobs import profile as capture

    exports = [tmp_path / "torch_ops_rank0.json"]
    said = capture.torch_exports_problem(tmp_path, exports)
    assert said.startswith(f"{exports[0]}: no GPU activity: the host called the CUDA runtime"), said
    # the real export, and a CPU run's (no CUDA call), pass
    shutil.copy(H100 / "torch_ops_rank0.json", exports[0])
    assert capture.torch_exports_problem(tmp_path, exports) == ""
    export["ops"] = [op for op in export["ops"] if not op["name"].startswith("cu")]
    exports[0].write_text(json.dumps(export))
    assert capture.torch_exports_problem(tmp_path, exports) == ""
