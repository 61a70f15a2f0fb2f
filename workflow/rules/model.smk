# The scaling model of a DDP step (compute + exposed bucketed all-reduce, alpha-beta fit with
# scipy), its held-out error per family and the bucket advisor (study/model.py has the formulas).
# a few seconds of scipy on the head node, like analyze (study/resources.py LOCAL_RULES)
localrules:
    model,


rule model:
    input:
        runs="results/csv/runs.csv",
        code=code_of("results/model.py"),
    output:
        model="results/csv/model.csv",
        advice="results/csv/bucket_advice.csv",
    log:
        "logs/model/model.log",
    params:
        out_dir=subpath(output.model, parent=True),
    shell:
        "scalestudy model --runs {input.runs:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
