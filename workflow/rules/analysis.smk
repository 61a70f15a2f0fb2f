# Scaling math over the collected runs: mean/std over repeats, efficiencies, Karp-Flatt,
# precision and bucket effects, the efficiency-loss waterfall, verdicts against config `report.targets`, node-/GPU-hours.
# Every number of the plots and documents is a cell of these CSVs (HTML copies for --report).
rule analyze:
    input:
        runs="results/csv/runs.csv",
        profile=PROFILE_KERNELS,
        code=code_of("results/analyze.py"),
    output:
        scaling="results/csv/scaling.csv",
        csvs=expand("results/csv/{table}.csv", table=ANALYSIS_TABLES[1:]),
        tables=report(
            expand("results/tables/{table}.html", table=ANALYSIS_TABLES[1:]),
            caption="../report/table.rst",
            category="Tables",
        ),
        scaling_html=report(
            "results/tables/scaling.html",
            caption="../report/table.rst",
            category="Tables",
        ),
    log:
        "logs/analyze/analyze.log",
    resources:
        # a resource, not a param (a rerun trigger): how the study was named changes no number
        reproduce=REPRODUCE,
    params:
        # a function: they hold the study's name, whose {braces} Snakemake would expand
        flags=lambda wildcards: ANALYSIS_FLAGS,
        profile=PROFILE_FLAG,
        out_dir=subpath(output.scaling, parent=True),
        html_dir=subpath(output.scaling_html, parent=True),
    shell:
        "scalestudy analyze --runs {input.runs:q} {params.profile:q} {params.flags:q} "
        "--configfile={resources.reproduce:q} "
        "--out-dir {params.out_dir:q} --html-dir {params.html_dir:q} > {log:q} 2>&1"
