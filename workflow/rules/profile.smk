# Profiling: the runs chosen by `profiling:` run again for a short window (--profile-steps) in
# their own jobs, under nsys on GPUs (torch.profiler where there is no GPU or no nsys, stated in
# capture/tool.json and the log); with the container, nsys runs inside it around the trainer
# (the host's installation bound in). Outputs stay under results/profile/, never results/runs/,
# so profiling overhead never enters the throughput figures of runs.csv. A run that replays its
# whole step as one CUDA graph is profiled under torch.compile's graphs instead (same kernels):
# a replay records no phase ranges (study/profiling.py).
rule profile_capture:
    input:
        unpack(get_prepared_data),
        sources=get_trainer_sources,
        code=code_of("jobs/profile.py"),  # the capture command (not its parsers: parse's)
        image=IMAGE,
    output:
        capture=directory("results/profile/{run}/capture"),
        inventory="results/system/profile/{run}.json",
    log:
        "logs/profile_capture/{run}.log",
    benchmark:
        "benchmarks/profile_capture/{run}.tsv"
    threads: get_threads
    resources:
        **LAUNCH_RESOURCES,
        runtime=PLAN.capture_runtime,
    params:
        **LAUNCH_PARAMS,
        flags=get_profile_flags,
        data_dir=subpath(input.meta, ancestor=2),
        tool=profiling.tool_settings(config),
    shell:
        launch_shell(
            "scalestudy profile capture --run {wildcards.run:q} --tool {params.tool[tool]:q} "
            "--ranks {params.tool[ranks]:q} --nsys-trace={params.tool[trace]:q} "
            "--device {params.tool[device]:q} --out {output.capture:q} "
            "--inventory {output.inventory:q}",
            "> {log:q} 2>&1",
        )


# nsys stats CSVs and SQLite exports, or torch.profiler ops and traces, of one run -> its kernels
# (by category) and phase ranges (GPU time where the capture has it, else host time: the
# time_base column says which).
rule profile_parse:
    input:
        capture="results/profile/{run}/capture",
        code=code_of("jobs/profile_parse.py"),
    output:
        kernels="results/profile/{run}/kernels.csv",
        ranges="results/profile/{run}/ranges.csv",
    log:
        "logs/profile_parse/{run}.log",
    shell:
        "scalestudy profile parse --capture {input.capture:q} --run {wildcards.run:q} "
        "--out-kernels {output.kernels:q} --out-ranges {output.ranges:q} > {log:q} 2>&1"


# The kernels Nsight Compute may profile, from the parse's table: rank 0's by time, NCCL and
# memcpy left out, each with ncu's name filter (jobs/ncu_kernels.py). A step of its own, so
# that the ncu job imports no parser.
rule profile_ncu_kernels:
    input:
        kernels="results/profile/{run}/kernels.csv",
        code=code_of("jobs/ncu_kernels.py"),
    output:
        kernels="results/profile/{run}/ncu_kernels.json",
    log:
        "logs/profile_ncu_kernels/{run}.log",
    shell:
        "scalestudy profile ncu-kernels --kernels {input.kernels:q} --out {output.kernels:q} "
        "> {log:q} 2>&1"


# Nsight Compute (--set full, clocks not locked) on the run's top-K kernels by time, NCCL
# excluded: ncu serialises launches and a profiled NCCL kernel would wait forever for its peers.
# Rank 0 only; GPU only. Each kernel is a run of its own: the Slurm time limit counts ncu.top_k
# start-ups (study/profiling.py job_seconds). It writes ncu's reports and their details CSVs;
# profile_ncu_parse reads them.
rule profile_ncu:
    input:
        unpack(get_prepared_data),
        sources=get_trainer_sources,
        code=code_of("jobs/profile_ncu.py"),  # the ncu command: no parser
        image=IMAGE,
        # the kernels come from the parse's table, which a parser edit rewrites: ancient(), so
        # that only a new capture (its input below) reruns ncu, a whole run per kernel
        kernels=ancient("results/profile/{run}/ncu_kernels.json"),
        capture="results/profile/{run}/capture",
    output:
        reports=directory("results/profile/{run}/ncu"),
    log:
        "logs/profile_ncu/{run}.log",
    benchmark:
        "benchmarks/profile_ncu/{run}.tsv"
    threads: get_threads
    resources:
        **LAUNCH_RESOURCES,
        runtime=PLAN.ncu_runtime,
    params:
        **LAUNCH_PARAMS,
        flags=get_profile_flags,
        data_dir=subpath(input.meta, ancestor=2),
        ncu=profiling.ncu_settings(PROFILING),
        device=HARDWARE["device"],
    shell:
        launch_shell(
            "scalestudy profile ncu --run {wildcards.run:q} --kernels {input.kernels:q} "
            "--enabled {params.ncu[enabled]:q} --top-k {params.ncu[top_k]} "
            "--launch-skip {params.ncu[skip]} --launch-count {params.ncu[count]} "
            "--device {params.device:q} --out-dir {output.reports:q}",
            "> {log:q} 2>&1",
        )


# ncu's details CSVs of one run -> its profile_ncu rows, each kernel under the kernels table's
# name (empty where ncu was skipped: the directory's tool.json says why).
rule profile_ncu_parse:
    input:
        reports="results/profile/{run}/ncu",
        code=code_of("jobs/profile_parse.py"),
        # not read: Snakemake checks nothing below a job whose one file from a rerun job is
        # ancient (profile_ncu's kernels), so a parser edit, which reruns the kernels step,
        # reran this parse only on the next snakemake; an input of it, it reruns in the same one
        kernels="results/profile/{run}/ncu_kernels.json",
    output:
        csv="results/profile/{run}/ncu.csv",
    log:
        "logs/profile_ncu_parse/{run}.log",
    shell:
        "scalestudy profile parse --ncu {input.reports:q} --run {wildcards.run:q} "
        "--out-ncu {output.csv:q} > {log:q} 2>&1"


# Every profiled run's kernels and ranges -> results/csv (the report's category-share bars).
rule profile_collect:
    input:
        kernels=expand("results/profile/{run}/kernels.csv", run=PROFILED),
        ranges=expand("results/profile/{run}/ranges.csv", run=PROFILED),
        code=code_of("jobs/profile_parse.py"),
    output:
        kernels="results/csv/profile_kernels.csv",
        ranges="results/csv/profile_ranges.csv",
    log:
        "logs/profile_collect/collect.log",
    params:
        runs=profiling.merge_flags(PROFILED),  # the run of each input, in the same order
    shell:
        "(scalestudy profile merge --schema kernels --out {output.kernels:q} {params.runs:q} "
        "{input.kernels:q} && scalestudy profile merge --schema ranges --out {output.ranges:q} "
        "{params.runs:q} {input.ranges:q}) > {log:q} 2>&1"


# Every profiled run's Nsight Compute metrics -> results/csv/profile_ncu.csv.
rule profile_collect_ncu:
    input:
        ncu=expand("results/profile/{run}/ncu.csv", run=PROFILED),
        code=code_of("jobs/profile_parse.py"),
    output:
        ncu="results/csv/profile_ncu.csv",
    log:
        "logs/profile_collect_ncu/collect.log",
    params:
        runs=profiling.merge_flags(PROFILED),
    shell:
        "scalestudy profile merge --schema ncu --out {output:q} {params.runs:q} {input.ncu:q} "
        "> {log:q} 2>&1"
