# The allocation proposal and the 5-slide pitch (results/proposal.py): results/csv/proposal.csv
# first (every number computed here, with its formula), then reports/proposal.{md,tex} and
# reports/slides.tex from CSV cells only. Requested only when the strong family runs: the
# production scale comes from its efficiencies.
localrules:
    proposal,
    proposal_pdf,
    slides_pdf,


rule proposal:
    input:
        scaling="results/csv/scaling.csv",
        tables=expand("results/csv/{table}.csv", table=ANALYSIS_TABLES[1:]),
        runs="results/csv/runs.csv",
        # Snakemake's job wall times: the plan's start-up calibration (study/estimate.py),
        # which reads the ones that exist; asked for a finished run only where it exists, so a
        # deleted or never-copied timing retrains nothing (a run still to train is waited for)
        wall_times=get_wall_times,
        model="results/csv/model.csv",  # the held-out error of the scaling model
        figure="results/plots/efficiency.pdf",  # the slides show it
        md_template=repo_file("workflow/report/proposal.md.j2"),
        tex_templates=[
            repo_file(f"workflow/report/{name}.j2")
            for name in ("proposal.tex", "slides.tex")
        ],
        code=code_of("results/proposal.py"),
    output:
        csv="results/csv/proposal.csv",
        md=report(
            "reports/proposal.md",
            caption="../report/proposal.rst",
            category="Documents",
        ),
        tex="reports/proposal.tex",
        slides="reports/slides.tex",
    log:
        "logs/proposal/proposal.log",
    params:
        settings=get_proposal_settings,
        csv_dir=subpath(input.scaling, parent=True),
        out_dir=subpath(output.md, parent=True),
        templates=subpath(input.md_template, parent=True),
    run:
        with rule_log(log[0], output):
            allocation.write_proposal(
                config, params.csv_dir, params.out_dir, params.templates
            )


# reports/proposal.pdf and reports/slides.pdf with latexmk (slides: beamer, which needs pgf from
# texlive-pictures); requested only when TeX can build them.
rule proposal_pdf:
    input:
        tex="reports/proposal.tex",
        code=code_of("results/build_pdf.py"),
    output:
        pdf=report(
            "reports/proposal.pdf",
            caption="../report/proposal.rst",
            category="Documents",
        ),
    log:
        "logs/proposal_pdf/proposal_pdf.log",
    shell:
        "scalestudy build-pdf {input.tex:q} > {log:q} 2>&1"


rule slides_pdf:
    input:
        tex="reports/slides.tex",
        code=code_of("results/build_pdf.py"),
        figure="results/plots/efficiency.pdf",
    output:
        pdf=report(
            "reports/slides.pdf",
            caption="../report/slides.rst",
            category="Documents",
        ),
    log:
        "logs/slides_pdf/slides_pdf.log",
    shell:
        "scalestudy build-pdf {input.tex:q} > {log:q} 2>&1"
