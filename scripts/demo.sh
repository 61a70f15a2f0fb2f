#!/usr/bin/env bash
# The main job: the CPU demo study end to end (data -> 6 training runs -> results/csv ->
# analysis, figures, reports/study.md, paper.tex, paper.pdf, the proposal and slides ->
# report.html), on this machine.
# Extra arguments go to snakemake, e.g. `--config dataset=synthetic` (offline), a target, or
# `--configfile more.yaml` (layered after config/demo.yaml: its keys win; a relative path is
# where you run the script, see demo_args).
set -euo pipefail

# the packages the documents load, which the workflow needs to build a PDF (results/build_pdf.py
# DOCUMENT_PACKAGES; tests/test_report.py keeps the three lists in step)
tex_files=(geometry.sty booktabs.sty tabularx.sty longtable.sty amsmath.sty lmodern.sty)

# snakemake's arguments (DEMO_ARGS) from the demo's: the user's, with every --configfile /
# --configfiles file of theirs moved into one `--configfile config/demo.yaml THEIRS...` at the
# end. The option takes several values, so `--configfile config/demo.yaml "$@"` read a target
# given first as a config file; and a second --configfile replaces the first, so theirs made
# the demo the paper's GPU study. A value is taken as argparse takes it: `--configfile=F` is
# one, `--configfile F G` every argument up to the next option.
# Their relative paths are the caller's: each config file, and the --directory value (`--directory
# D`, `--directory=D`, `-d D`, `-dD`), is made absolute against $PWD, as snakemake run here would
# read it (main calls this before it changes to the repository root). Options must be spelled
# in full (`--configf`, which snakemake takes for --configfile, is passed on as it is); other
# paths (targets, --report, --profile) are snakemake's: relative to the repository root or D.
# Everything after a `--` is a target, as snakemake reads it (`--config dataset=synthetic --
# TARGET`: --config takes several values): the demo's --configfile goes before it (at the end
# it was read as targets: "No rule to produce --configfile").
# DEMO_DIR: where the study's outputs go, D made absolute (the last one, as argparse keeps it), or
# empty for the repository root.
demo_args() {
    local files=(config/demo.yaml) rest=() targets=() arg taking=0 directory=0 ended=0
    DEMO_DIR=
    for arg in "$@"; do
        if ((ended)); then
            targets+=("$arg")
            continue
        fi
        if ((directory)); then
            directory=0
            DEMO_DIR=$(from_caller "$arg")
            rest+=("$DEMO_DIR")
            continue
        fi
        if ((taking)) && [[ "$arg" != -* ]]; then
            files+=("$(from_caller "$arg")")
            continue
        fi
        taking=0
        case "$arg" in
            --) ended=1 ;;
            --configfile | --configfiles) taking=1 ;;
            --configfile=* | --configfiles=*) files+=("$(from_caller "${arg#*=}")") ;;
            --directory | -d)
                directory=1
                rest+=("$arg")
                ;;
            --directory=*)
                DEMO_DIR=$(from_caller "${arg#*=}")
                rest+=("--directory=$DEMO_DIR")
                ;;
            -d?*)
                DEMO_DIR=$(from_caller "${arg#-d}")
                rest+=("-d$DEMO_DIR")
                ;;
            *) rest+=("$arg") ;;
        esac
    done
    DEMO_ARGS=("${rest[@]}" --configfile "${files[@]}")
    if ((ended)); then
        DEMO_ARGS+=(-- "${targets[@]}")
    fi
}

# A path of the caller's as it is when absolute (or empty), else under $PWD.
from_caller() {
    if [[ -z "$1" || "$1" == /* ]]; then
        printf '%s\n' "$1"
    else
        printf '%s\n' "$PWD/$1"
    fi
}

# Whether snakemake's arguments make a call that runs no job: a dry-run (-n, also in a cluster of
# short flags such as -np), a listing, a graph, a summary, --lint, --unlock, --help, --version.
# The report after it would fail on outputs that were never made.
# A cluster counts only up to its first short option that takes a value: argparse reads the rest
# as that value (-Rtrain is --forcerun train, -eslurm --executor slurm). Before it stand the
# no-value flags, snakemake 9's -a -F -f -k -p -t and the no-job ones, -n -l -S -D -h -v.
runs_nothing() {
    local arg
    for arg in "$@"; do
        if [[ "$arg" =~ ^-[aFfkpt]*[nlSDhv] ||
            "$arg" =~ ^--(dry-?run|lint|unlock|list[a-z-]*|lt|lc|li|lp|lu|dag|rulegraph|filegraph|d3dag|summary|detailed-summary|help|version|cleanup-metadata|cm|cleanup-shadow|conda-create-envs-only|conda-cleanup-envs|container-cleanup-images|draft-notebook|delete-all-output|delete-temp-output|containerize|print-compilation|export-cwl|archive|generate-unit-tests)(=|$) ]]; then
            return 0
        fi
    done
    return 1
}

# Whether snakemake's arguments run part of the study past its targets' reach: --until (-U, also
# at the end of a cluster of no-value flags) or --batch. snakemake --report ignores both and
# reports the whole study, failing on the files this run did not make.
makes_part() {
    local arg
    for arg in "$@"; do
        if [[ "$arg" =~ ^-[aFfkptn]*U || "$arg" =~ ^--(until|batch)(=|$) ]]; then
            return 0
        fi
    done
    return 1
}

main() {
    demo_args "$@" # the caller's relative paths, before the cd
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    # the venv, and as root TeX for reports/paper.pdf (not the Slurm packages: the demo needs none)
    SCALESTUDY_SKIP_SLURM_APT=1 bash scripts/setup.sh
    export PATH="$PWD/.venv/bin:$PATH"
    snakemake "${DEMO_ARGS[@]}"
    if runs_nothing "$@"; then
        return 0
    fi
    # the self-contained HTML report of the run (figures, tables, documents), in the working
    # directory as the study's outputs: the repository root, or --directory's
    # --report first: after a `--` of the user's it would be read as a target
    local no_report= report=report.html
    if makes_part "$@"; then
        no_report=" (no report.html: --until or --batch ran part of the study, and"
        no_report+=" snakemake --report reports the whole)"
        report= # an earlier demo's is not this one's
    else
        snakemake --report report.html "${DEMO_ARGS[@]}"
    fi
    # the study's documents that are there (targets may ask for part of the study only)
    local out=${DEMO_DIR:+$DEMO_DIR/} made= path
    for path in reports/study.md reports/paper.pdf $report results/plots/; do
        if [[ -e ${out}$path ]]; then
            made+="${made:+, }${out}$path"
        fi
    done
    local done_line="demo: done: ${made:-no document of the study (these targets make none)}"
    done_line+=$no_report
    if [[ -f ${out}reports/paper.pdf ]]; then
        echo "$done_line"
    elif ! command -v latexmk > /dev/null ||
        ! kpsewhich "${tex_files[@]}" > /dev/null 2>&1; then
        # as the workflow judges it (results/build_pdf.py tex_gaps): latexmk alone brings no
        # booktabs; root has no sudo on a fresh image, whose apt lists are empty
        local sudo=sudo\  why=latexmk\ is\ not\ installed
        [[ $(id -u) -ne 0 ]] || sudo=
        command -v latexmk > /dev/null && why="TeX lacks a package the paper loads"
        echo "demo: done$no_report, without reports/paper.pdf ($why): run" \
            "\`${sudo}apt-get update && ${sudo}apt-get install --no-install-recommends latexmk" \
            "texlive-latex-base texlive-latex-recommended texlive-fonts-recommended lmodern" \
            "texlive-pictures\` (~40 s), then bash scripts/demo.sh again, with the same arguments" \
            "(only the PDF is built)"
    else
        echo "$done_line; reports/paper.pdf was not asked for by these targets"
    fi
}

# sourced (tests/test_scripts.py reads runs_nothing, demo_args): define, run nothing
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
