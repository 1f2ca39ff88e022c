"""cnn1d's training step (forward, backward) with its 1-D convolutions written five ways, as ratios against
torch's conv1d, in one process, interleaved, warmed up.

The forms, each the same network (the MNIST-1D convnet: 3 convolutions of 25 channels, stride 2, kernel 5
then 3, ReLU, a linear head) on the same batch and weights:
- `conv1d`: torch's conv1d on (N, C, L), which on a CPU runs oneDNN (the baseline; nn.Conv1d);
- `no onednn`: the same call with oneDNN turned off (torch's own im2col convolution);
- `channels-last 2-D`: conv2d over (N, C, 1, L) in channels-last memory;
- `unfold + matmul`: (N, L, C) activations, the windows by Tensor.unfold, one matrix product per layer;
- `slices + matmul`: bsresearch.models.conv1d_as_matmul, what cnn1d's layers (models.MatmulConv1d) run on a
  CPU: the windows as k strided slices of the (N, L, C) view concatenated, one product per layer (its
  backward is slices and adds, no unfold_backward).
The loss is cross-entropy; the time is per step, the table gives each form's median over the rounds and
its speed as a ratio to `conv1d` in the same round. Every form's logits agree with conv1d's to float32
rounding (the largest difference is printed).

    python benchmarks/conv1d_forms.py [--batch-sizes 32,256,1000,4000] [--repeats 7] [--seconds 0.5]
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, interleaved, median_and_spread, start, time_steps, write_results  # noqa: E402
from cpu_step import cpu_name  # noqa: E402

from bsresearch.models import conv1d_as_matmul  # noqa: E402

WIDTH, LENGTH, CLASSES = 25, 40, 10
LAYERS = [(1, 5), (WIDTH, 3), (WIDTH, 3)]   # (input channels, kernel); stride 2, padding 1


def parameters(device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(WIDTH, c, k, generator=g) / (c * k) ** 0.5).to(device).requires_grad_()
               for c, k in LAYERS]
    biases = [torch.zeros(WIDTH, device=device, requires_grad=True) for _ in LAYERS]
    length = LENGTH
    for _, k in LAYERS:
        length = (length + 2 - k) // 2 + 1
    head = (torch.randn(CLASSES, WIDTH * length, generator=g) / (WIDTH * length) ** 0.5).to(device)
    return weights, biases, head.requires_grad_()


def forms(weights: list[torch.Tensor], biases: list[torch.Tensor],
          head: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    def conv1d(x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1)
        for w, b in zip(weights, biases):
            h = F.relu(F.conv1d(h, w, b, stride=2, padding=1))
        return h.flatten(1) @ head.T

    def no_onednn(x: torch.Tensor) -> torch.Tensor:
        with torch.backends.mkldnn.flags(enabled=False):
            return conv1d(x)

    def channels_last(x: torch.Tensor) -> torch.Tensor:
        h = x[:, None, None, :].contiguous(memory_format=torch.channels_last)
        for w, b in zip(weights, biases):
            h = F.relu(F.conv2d(h, w.unsqueeze(2), b, stride=(1, 2), padding=(0, 1)))
        return h.flatten(1) @ head.T

    def unfold_matmul(x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(2)                                       # (N, L, C)
        for w, b in zip(weights, biases):
            n, _, c = h.shape
            k = w.shape[2]
            windows = F.pad(h, (0, 0, 1, 1)).unfold(1, k, 2)     # (N, L_out, C, k)
            h = F.relu(torch.addmm(b, windows.reshape(-1, c * k), w.reshape(WIDTH, c * k).T).view(n, -1, WIDTH))
        return h.transpose(1, 2).flatten(1) @ head.T

    def slices_matmul(x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1)
        for w, b in zip(weights, biases):
            h = F.relu(conv1d_as_matmul(h, w, b, stride=2, padding=1))
        return h.flatten(1) @ head.T

    return {"conv1d": conv1d, "no onednn": no_onednn, "channels-last 2-D": channels_last,
            "unfold + matmul": unfold_matmul, "slices + matmul": slices_matmul}


def measure(batch_size: int, device: torch.device, seconds: float, repeats: int) -> list[dict]:
    weights, biases, head = parameters(device)
    candidates = forms(weights, biases, head)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch_size, LENGTH, generator=g).to(device)
    y = torch.randint(0, CLASSES, (batch_size,), generator=g).to(device)
    with torch.no_grad():
        reference = candidates["conv1d"](x)
        differences = {name: float((f(x) - reference).abs().max()) for name, f in candidates.items()}

    def stepper(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            with torch.backends.mkldnn.flags(enabled=forward is not candidates["no onednn"]):
                F.cross_entropy(forward(x), y).backward()
        return step

    steps = {name: stepper(f) for name, f in candidates.items()}
    for step in steps.values():
        time_steps(step, 2, device)
    n = max(2, int(time_steps(steps["conv1d"], 3, device) * seconds))
    rates = interleaved({name: (lambda s=step: time_steps(s, n, device)) for name, step in steps.items()}, repeats)
    rows = []
    for name, values in rates.items():
        ms, spread = median_and_spread([1e3 / v for v in values])
        ratio = median_and_spread([v / base for v, base in zip(values, rates["conv1d"])])[0]
        rows.append({"batch_size": batch_size, "form": name, "step_ms": ms, "spread_ms": spread,
                     "speed_vs_conv1d": ratio, "max_logit_difference": differences[name], "steps_timed": n,
                     "repeats": repeats, "threads": torch.get_num_threads(), "cpu": cpu_name()})
        print(f"batch {batch_size} {name}: {ms:.2f} ms per step, x{ratio:.2f} against conv1d", flush=True)
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--batch-sizes", default="32,256,1000,4000")
    parser.add_argument("--seconds", type=float, default=0.5, help="per timing")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    device = start(args)
    rows = [row for b in map(int, args.batch_sizes.split(",")) for row in measure(b, device, args.seconds,
                                                                                   args.repeats)]
    write_results(pd.DataFrame(rows), "conv1d_forms", device, args.out_dir)


if __name__ == "__main__":
    main()
