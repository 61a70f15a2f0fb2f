# The config files, read before `configfile:` merges them: malformed YAML or a key given twice
# is one line naming the file and line (Snakemake says "Config file is not valid JSON or YAML"
# of config/config.yaml, and keeps the last of two equal keys of any file silently). A
# --configfile file that is not YAML at all fails in Snakemake before this runs. What the files
# say is checked in common.smk; what they hold (CONFIG_LAYERS, in order) tells common.smk which
# values of `config` came from --config.
import sys
from pathlib import Path

from snakemake.logging import logger

try:
    from scalestudy.errors import StudyConfigError
    from scalestudy.study.config import check_files
except ImportError:  # common.smk says how to install the package
    check_files = None
CONFIG_LAYERS = []
if check_files is not None:
    try:
        CONFIG_LAYERS = check_files(
            [
                Path(workflow.basedir).parent / "config" / "config.yaml",
                *(workflow.overwrite_configfiles or []),
            ]
        )
    except StudyConfigError as exc:
        logger.error(str(exc))
        sys.exit(1)
