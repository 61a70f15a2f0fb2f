# One figure of the study (PNG for the report, PDF for the paper) from the analysis CSVs;
# editing plots.py redraws the figures and nothing upstream.
rule plot:
    input:
        scaling="results/csv/scaling.csv",
        epochs="results/csv/epochs.csv",
        targets="results/csv/targets.csv",
        shares="results/csv/profile_shares.csv",
        waterfall="results/csv/waterfall.csv",
        code=code_of("results/plot.py"),
    output:
        png=report(
            "results/plots/{figure}.png",
            caption="../report/figure.rst",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
        pdf="results/plots/{figure}.pdf",
    log:
        "logs/plot/{figure}.log",
    params:
        device=HARDWARE["device"],
        # a function: Snakemake would read {braces} in the study's name as wildcards
        title=lambda wildcards: config["study"],
        out=subpath(output.png, parent=True),
    shell:
        "scalestudy plot --figure {wildcards.figure:q} --scaling {input.scaling:q} "
        "--epochs {input.epochs:q} --targets {input.targets:q} "
        "--profile-shares {input.shares:q} --waterfall {input.waterfall:q} --device {params.device:q} "
        "--title={params.title:q} --out {params.out:q} > {log:q} 2>&1"
