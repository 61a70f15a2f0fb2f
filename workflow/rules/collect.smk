# Every run's metrics.json and epochs.csv -> results/csv (one row per run; per run and epoch).
# Read by the rules analyze, model, proposal (runs.csv) and plot (epochs.csv); the plan
# calibrates from runs.csv where it exists (common.smk).
rule collect:
    input:
        table="results/matrix/runs.tsv",
        metrics=expand("results/runs/{run}/metrics.json", run=RUNS),
        epochs=expand("results/runs/{run}/epochs.csv", run=RUNS),
        code=code_of("results/collect.py"),
    output:
        runs="results/csv/runs.csv",
        epochs="results/csv/epochs.csv",
    log:
        "logs/collect/collect.log",
    shell:
        "scalestudy collect --runs {input.table:q} --runs-dir results/runs "
        "--out-runs {output.runs:q} --out-epochs {output.epochs:q} > {log:q} 2>&1"
