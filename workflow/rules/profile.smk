# Profiling: the runs chosen by `profiling:` run again for a short window (--profile-steps) in
# their own jobs, under nsys on GPUs (torch.profiler where there is no GPU or no nsys, stated in
# capture/tool.json and the log). Outputs stay under results/profile/, never results/runs/, so
# profiling overhead never enters the throughput figures of runs.csv.
rule profile_capture:
    input:
        unpack(get_prepared_data),
        sources=TRAINER_SOURCES,
        image=get_container_image,
    output:
        capture=directory("results/profile/{run}/capture"),
        inventory="results/system/profile/{run}.json",
    log:
        "logs/profile_capture/{run}.log",
    benchmark:
        "benchmarks/profile_capture/{run}.tsv"
    threads: get_threads
    resources:
        nodes=get_nodes,
        tasks_per_node=get_tasks_per_node,
        tasks=get_tasks,
        tasks_per_gpu=0,
        gres=get_gres,
        cpus_per_task=config["hardware"]["cpus_per_rank"],
        mem_mb=get_mem_mb,
        runtime=config["hardware"]["runtime_min"],
        mpi=get_mpi,
    params:
        flags=get_profile_flags,
        layout=get_layout,
        container=get_container_flags,
        tool=get_profile_tool,
        data_dir=subpath(input.meta, ancestor=2),
    shell:
        "scalestudy profile capture --run {wildcards.run:q} --tool {params.tool[tool]:q} "
        "--ranks {params.tool[ranks]:q} --nsys-trace={params.tool[trace]:q} "
        "--device {params.tool[device]:q} --out {output.capture:q} "
        "--inventory {output.inventory:q} --mpi={resources.mpi:q} "
        "--nodes {params.layout[nodes]} --ranks-per-node {params.layout[ranks_per_node]} "
        "--cpus-per-rank {params.layout[cpus_per_rank]} {params.container:q} -- "
        "{params.flags:q} --data-dir {params.data_dir:q} > {log:q} 2>&1"


# nsys stats CSVs or torch.profiler ops of one run -> its kernels (by category) and phase ranges.
rule profile_parse:
    input:
        capture="results/profile/{run}/capture",
        code="src/scalestudy/nsight/profiling.py",
    output:
        kernels="results/profile/{run}/kernels.csv",
        ranges="results/profile/{run}/ranges.csv",
    log:
        "logs/profile_parse/{run}.log",
    shell:
        "scalestudy profile parse --capture {input.capture:q} --run {wildcards.run:q} "
        "--out-kernels {output.kernels:q} --out-ranges {output.ranges:q} > {log:q} 2>&1"


# Nsight Compute (--set full) on the run's top-K kernels by time, NCCL excluded: ncu serialises
# launches and a profiled NCCL kernel would wait forever for its peers. Rank 0 only; GPU only.
rule profile_ncu:
    input:
        unpack(get_prepared_data),
        sources=TRAINER_SOURCES,
        image=get_container_image,
        kernels="results/profile/{run}/kernels.csv",
    output:
        reports=directory("results/profile/{run}/ncu"),
        csv="results/profile/{run}/ncu.csv",
    log:
        "logs/profile_ncu/{run}.log",
    benchmark:
        "benchmarks/profile_ncu/{run}.tsv"
    threads: get_threads
    resources:
        nodes=get_nodes,
        tasks_per_node=get_tasks_per_node,
        tasks=get_tasks,
        tasks_per_gpu=0,
        gres=get_gres,
        cpus_per_task=config["hardware"]["cpus_per_rank"],
        mem_mb=get_mem_mb,
        runtime=config["hardware"]["runtime_min"],
        mpi=get_mpi,
    params:
        flags=get_profile_flags,
        layout=get_layout,
        container=get_container_flags,
        ncu=get_ncu_settings,
        device=config["hardware"]["device"],
        data_dir=subpath(input.meta, ancestor=2),
    shell:
        "scalestudy profile ncu --run {wildcards.run:q} --kernels {input.kernels:q} "
        "--enabled {params.ncu[enabled]:q} --top-k {params.ncu[top_k]} "
        "--launch-skip {params.ncu[skip]} --launch-count {params.ncu[count]} "
        "--device {params.device:q} --out-dir {output.reports:q} --out {output.csv:q} "
        "--mpi={resources.mpi:q} --nodes {params.layout[nodes]} "
        "--ranks-per-node {params.layout[ranks_per_node]} "
        "--cpus-per-rank {params.layout[cpus_per_rank]} {params.container:q} -- "
        "{params.flags:q} --data-dir {params.data_dir:q} > {log:q} 2>&1"


# Every profiled run's kernels and ranges -> results/csv (the report's category-share bars).
rule profile_collect:
    input:
        kernels=expand("results/profile/{run}/kernels.csv", run=PROFILED),
        ranges=expand("results/profile/{run}/ranges.csv", run=PROFILED),
    output:
        kernels="results/csv/profile_kernels.csv",
        ranges="results/csv/profile_ranges.csv",
    log:
        "logs/profile_collect/collect.log",
    shell:
        "(scalestudy profile merge --schema kernels --out {output.kernels:q} {input.kernels:q} "
        "&& scalestudy profile merge --schema ranges --out {output.ranges:q} {input.ranges:q}) "
        "> {log:q} 2>&1"


# Every profiled run's Nsight Compute metrics -> results/csv/profile_ncu.csv.
rule profile_collect_ncu:
    input:
        expand("results/profile/{run}/ncu.csv", run=PROFILED),
    output:
        "results/csv/profile_ncu.csv",
    log:
        "logs/profile_collect_ncu/collect.log",
    shell:
        "scalestudy profile merge --schema ncu --out {output:q} {input:q} > {log:q} 2>&1"
