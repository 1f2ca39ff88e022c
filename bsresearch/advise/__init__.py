"""Batch-size advice for your own model, data and loss: `advise()` and `advise_config()` (the Python API),
`bsresearch advise` (the command line, advise/cli.py) and `advice_figure` (advise/plot.py). See advise/api.py."""
from .api import Advice, AdviseConfig, advise, advise_config, optimizer_factory, scale_lr

__all__ = ["Advice", "AdviseConfig", "advise", "advise_config", "optimizer_factory", "scale_lr"]
