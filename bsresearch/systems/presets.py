"""Named benchmark settings (no torch import, so the CLI can describe them cheaply)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A named benchmark: models x precisions, batch sizes as powers of two, search limit."""
    models: tuple[str, ...]
    precisions: tuple[str, ...]
    min_batch_size: int
    max_batch_size: int      # largest size swept for throughput and memory
    search_limit: int        # the largest-batch search never tries more than this
    optimizer: str = "sgd"


PRESETS = {
    # The GPU preset: the MNIST-1D CNN, the image convnet and the small ResNet at fp32 and bf16.
    # Sweeps stop at the first out-of-memory; the search goes on to 2^24 examples.
    "gpu": Preset(("cnn1d", "convnet", "resnet"), ("fp32", "bf16"), 16, 2 ** 20, 2 ** 24),
    # A CPU run of the MNIST-1D CNN (about a minute on one core).
    "cpu": Preset(("cnn1d",), ("fp32", "bf16"), 1, 2 ** 12, 2 ** 12),
}


def powers_of_two(low: int, high: int) -> list[int]:
    """low, 2 low, 4 low, ... up to high (low itself need not be a power of two)."""
    out, b = [], low
    while b <= high:
        out.append(b)
        b *= 2
    return out
