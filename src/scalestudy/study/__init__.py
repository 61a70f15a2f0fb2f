"""The study: pure functions of the study config (validation, the run table, which runs are
profiled, Slurm resources, the node-hour plan). No torch import."""
