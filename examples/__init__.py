"""Example models and data for `bsresearch advise`: each module has a model factory and a data factory."""
