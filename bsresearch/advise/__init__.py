"""Batch-size advice for your own model, data and loss: `advise()` (the Python API), `bsresearch advise`
(the command line, advise/cli.py) and `advice_figure` (advise/plot.py). See advise/api.py."""
from .api import Advice, advise, optimizer_factory, scale_lr
from .loading import LOSSES, data_tensors, load_factory, load_object, resolve_loss

__all__ = ["LOSSES", "Advice", "advise", "data_tensors", "load_factory", "load_object", "optimizer_factory",
           "resolve_loss", "scale_lr"]
