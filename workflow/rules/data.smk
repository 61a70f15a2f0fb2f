# Download (cifar10, mnist) or make (synthetic) the dataset and convert it once to uint8
# tensors; training never downloads. Local: login nodes have the internet access, compute nodes
# often do not.
rule prepare_data:
    input:
        code=code_of("trainer/prepare_data.py"),
    output:
        data=f"{DATA_DIR}/{{dataset}}/data.pt",
        meta=f"{DATA_DIR}/{{dataset}}/meta.json",
    log:
        "logs/prepare_data/{dataset}.log",
    params:
        data_dir=subpath(output.meta, ancestor=2),
        extra=get_prepare_flags,
    shell:
        "scalestudy prepare-data --dataset {wildcards.dataset:q} --data-dir {params.data_dir:q} "
        "{params.extra:q} > {log:q} 2>&1"


# The run table, for the analysis and the report. Training does not depend on it, so adding a
# run rewrites this file without touching the runs that already exist. Its code is what the run:
# block executes (study/runs.py, `matrix` in common.smk, and log.py), not the `scalestudy
# matrix` preview command of study/matrix.py; the table's content is the digest param.
rule matrix:
    input:
        code=code_of("study/runs.py", "log.py"),
    output:
        table="results/matrix/runs.tsv",
    log:
        "logs/matrix/matrix.log",
    params:
        digest=RUN_TABLE_DIGEST,
    run:
        with rule_log(log[0], output):
            matrix.write_runs_tsv(RUN_ROWS, output.table)
