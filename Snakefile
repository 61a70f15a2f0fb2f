# scalestudy: a distributed-training scaling study, from container build to tidy CSVs.
#   snakemake                              the study of config/config.yaml on this machine
#   snakemake --configfile config/demo.yaml   the CPU demo study (2-core laptop, <= 10 min)
#   snakemake --executor slurm -j 20       every run as its own Slurm job
#   snakemake --dry-run                    what would run
from snakemake.utils import min_version, validate

min_version("9.20")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# JSON schema first (types, choices, unknown keys, defaults), then the checks between keys
validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/container.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/plots.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/plan.smk"


rule all:
    input:
        "results/matrix/runs.tsv",
        "results/csv/runs.csv",
        "results/csv/epochs.csv",
        get_profile_targets,
        "results/csv/scaling.csv",
        "reports/study.md",
        "reports/paper.tex",
        get_paper_pdf(),
