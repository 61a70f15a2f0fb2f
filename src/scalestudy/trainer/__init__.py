"""The trainer: everything that can change a measured number (config, loop, parallel wrappers,
recipe, measurement, run state and checkpoints, data, models, process groups)."""
