# The node-hour plan of the study, for an allocation proposal: reports/plan.md (formula, per
# family, with contingency) and results/plan.csv (one row per run). Not in `all`: it reads the
# measured runs when they exist (calibration) and must neither wait for nor start the study.
localrules:
    plan,


rule plan:
    input:
        code=code_of("study/plan.py"),
    output:
        md="reports/plan.md",
        csv="results/plan.csv",
    log:
        "logs/plan/plan.log",
    params:
        digest=get_plan_digest,
    run:
        with rule_log(log[0], output):
            plan.write_plan(config, output.md, output.csv)
