"""scalestudy: a reproducible PyTorch DDP scaling study (trainer, workflow helpers, analysis)."""

__version__ = "0.1.0"
