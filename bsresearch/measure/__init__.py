"""Pure measurements of a trained model: curvature, sharpness, landscapes, the critical batch size (the gradient
noise scale is bsresearch.noise; the registry of what a run measures after training is bsresearch.measurements).

Each measurement takes a model and data, returns a frozen dataclass, prints nothing and leaves the
model exactly as it found it (parameters, buffers, train/eval mode; the global RNGs are never used).

Modules: critical (B_crit fits, no torch), curvature (HVPs, Lanczos/power eigenvalues, Hutchinson trace,
spectral density, per layer), lanczos (the linear algebra), sharpness (Keskar, worst/average-case, adaptive,
m-sharpness), landscape (interpolation, filter-normalised slices), functional (shared plumbing, also the
noise scale's).

This file imports nothing, so `bsresearch.measure.critical` stays torch-free for analysis code.
"""
