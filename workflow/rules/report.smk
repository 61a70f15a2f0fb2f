# reports/study.md and reports/paper.tex, rendered with Jinja2 from the analysis CSVs only
# (render-report refuses a number that is in no CSV cell); the figures are inputs so the
# documents never point at a missing file.
rule render_report:
    input:
        scaling="results/csv/scaling.csv",
        tables=expand("results/csv/{table}.csv", table=ANALYSIS_TABLES[1:]),
        model="results/csv/model.csv",  # and bucket_advice.csv: rule model
        advice="results/csv/bucket_advice.csv",
        figures=expand(
            "results/plots/{figure}.{ext}", figure=FIGURES, ext=("png", "pdf")
        ),
        md_template=repo_file("workflow/report/study.md.j2"),
        tex_template=repo_file("workflow/report/paper.tex.j2"),
        code=code_of("results/render_report.py"),
    output:
        md=report(
            "reports/study.md", caption="../report/study.rst", category="Documents"
        ),
        tex="reports/paper.tex",
    log:
        "logs/render_report/render_report.log",
    params:
        figures=FIGURES,
        csv_dir=subpath(input.scaling, parent=True),
        templates=subpath(input.md_template, parent=True),
        out_dir=subpath(output.md, parent=True),
    shell:
        "scalestudy render-report --csv-dir {params.csv_dir:q} --templates {params.templates:q} "
        "--figures {params.figures:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# reports/paper.pdf with latexmk; requested only when TeX can build it, latexmk and the packages
# the paper loads (common.smk says what is missing, and only the PDF is skipped).
rule paper_pdf:
    input:
        tex="reports/paper.tex",
        code=code_of("results/build_pdf.py"),
        figures=expand("results/plots/{figure}.pdf", figure=FIGURES),
    output:
        pdf=report(
            "reports/paper.pdf", caption="../report/paper.rst", category="Documents"
        ),
    log:
        "logs/paper_pdf/paper_pdf.log",
    shell:
        "scalestudy build-pdf {input.tex:q} > {log:q} 2>&1"
