#!/usr/bin/env bash
# Set up this machine for the study and its tests (idempotent):
#   - Debian packages for the local Slurm test cluster (slurm-wlm, munge, iproute2, procps) and
#     for the https download test's certificate (openssl), as root, and python3.X-venv where
#     the Python lacks venv's ensurepip;
#   - a virtual environment .venv with the pinned packages of requirements.txt and this
#     package installed editable.
#   - as root, a lean TeX Live with latexmk for reports/paper.pdf.
# Usage: bash scripts/setup.sh   (SCALESTUDY_SKIP_APT=1 skips every Debian package;
#                                 SCALESTUDY_SKIP_SLURM_APT=1 only the Slurm ones: scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(slurm-wlm munge iproute2 procps openssl)
if [[ "${SCALESTUDY_SKIP_APT:-0}" != 1 && "${SCALESTUDY_SKIP_SLURM_APT:-0}" != 1 ]]; then
    missing=()
    for p in "${apt_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        if [[ $(id -u) -ne 0 ]]; then
            echo "setup: missing Debian packages ${missing[*]} (needed only for the tests);" \
                 "install them as root: apt-get update && apt-get install ${missing[*]}" >&2
        else
            echo "setup: installing ${missing[*]}"
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
        fi
    fi
fi

# TeX for reports/paper.pdf (latexmk + a lean TeX Live, no recommends: ~40 s, measured on Debian
# 12); without it the workflow builds everything but the PDF and says so.
# texlive-pictures: pgf, which beamer needs for reports/slides.pdf
tex_packages=(latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended lmodern
    texlive-pictures)
# what the documents load (results/build_pdf.py DOCUMENT_PACKAGES) and pgf: latexmk alone brings
# no booktabs, and every PDF job failed on it (kpsewhich exits 1 when one is missing)
tex_files=(pgfcore.sty geometry.sty booktabs.sty tabularx.sty longtable.sty amsmath.sty lmodern.sty)
if [[ "${SCALESTUDY_SKIP_APT:-0}" != 1 && $(id -u) -eq 0 ]] &&
    ! { command -v latexmk && kpsewhich "${tex_files[@]}"; } >/dev/null 2>&1; then
    echo "setup: installing ${tex_packages[*]}"
    # optional: offline (the demo's dataset=synthetic) or with a broken mirror the study still
    # runs, without its PDFs, which the workflow and demo.sh then say; CI needs them
    if ! { apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${tex_packages[@]}"; }; then
        if [[ "${CI:-}" == true ]]; then
            echo "setup: installing TeX failed" >&2
            exit 1
        fi
        echo "setup: could not install TeX (apt-get failed, see above): the study runs without" \
            "its PDFs" >&2
    fi
fi

python=${PYTHON:-python3}
# a venv whose pip never got installed (ensurepip failed or was interrupted) is made again
if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else
        f"setup: Python >= 3.11 is needed, {sys.executable} is {sys.version.split()[0]}: "
        "set PYTHON=/path/to/python3.11 and rerun bash scripts/setup.sh")'
    # Debian's and Ubuntu's system Python ship venv's pip bootstrap (ensurepip) separately, in
    # the package of that Python's version: python3-venv is the default python3's only (Ubuntu
    # 22.04: 3.10), and PYTHON=python3.11 needs python3.11-venv
    if ! "$python" -c 'import ensurepip' 2>/dev/null; then
        version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        venv_package="python$version-venv"
        if [[ "${SCALESTUDY_SKIP_APT:-0}" != 1 && $(id -u) -eq 0 ]]; then
            echo "setup: installing $venv_package ($python has no ensurepip)"
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$venv_package"
        else
            echo "setup: $python cannot make a venv (no ensurepip); as root:" \
                 "apt-get update && apt-get install $venv_package," \
                 "then rerun bash scripts/setup.sh" >&2
            exit 1
        fi
    fi
    "$python" -m venv --clear .venv
fi
stamp=.venv/.scalestudy-requirements
if ! cmp -s requirements.txt "$stamp"; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements.txt
    cp requirements.txt "$stamp"
fi
# no build isolation: the venv's pinned setuptools builds it, so a second run needs no index
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
torch_version=$(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')
echo "setup: ready (.venv: $torch_version)"
