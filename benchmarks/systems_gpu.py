"""The GPU systems table and figure: throughput, memory, the out-of-memory boundary and FLOP/s.

The MNIST-1D CNN (input 40), the image convnet and the small ResNet (CIFAR-10 shape 3x32x32, synthetic
inputs: no dataset needed) at fp32 and bf16, SGD with momentum, batch sizes 16, 32, ... until memory runs
out (at most 2^20), the largest batch that fits by search (at most 2^24), FLOPs per step counted by
torch's FlopCounterMode and achieved FLOP/s as a fraction of the GPU's dense peak (flops.GPU_PEAKS).
Writes benchmarks/results/systems_gpu_<gpu-model>.csv, systems_gpu_summary_<gpu-model>.csv and the
figure systems_gpu_<gpu-model>.png/.pdf/.txt.

    python benchmarks/systems_gpu.py                                   # on a CUDA machine (a few minutes)
    python benchmarks/systems_gpu.py --tiny --device cpu --out /tmp/sg  # seconds: proves the pipeline on a CPU

Further options go to `bsresearch bench` (e.g. --memory-budget 20GiB, --inference, --b-noise 900).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bsresearch.cli import main as bsresearch_main

RESULTS = Path(__file__).resolve().parent / "results"
# A few seconds on one CPU core: every model and precision, batch sizes 2..8, the search under a budget.
TINY = ["--min-batch-size", "2", "--max-batch-size", "8", "--search-limit", "64", "--memory-budget", "16MiB",
        "--repeats", "2", "--warmup", "1", "--min-seconds", "0"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu [cuda]")
    parser.add_argument("--out", default=str(RESULTS), help=f"output folder [{RESULTS}]")
    parser.add_argument("--tiny", action="store_true", help="tiny settings (seconds), to check the pipeline")
    args, rest = parser.parse_known_args(argv)
    command = ["bench", "--preset", "gpu", "--device", args.device, "--out", args.out, "--stem", "systems_gpu"]
    return bsresearch_main(command + (TINY if args.tiny else []) + rest)


if __name__ == "__main__":
    sys.exit(main())
