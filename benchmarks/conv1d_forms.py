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

With --evaluate, the forward pass alone under torch.no_grad, as an evaluation runs it (in chunks of
data.EVAL_CHUNK examples), for conv1d and for the library's matrix-product form with its two ways of
gathering the window rows: `slices rows` (models.window_rows_by_slices, what a training step uses) and
`unfold rows` (models.window_rows_by_unfold, what conv1d_as_matmul uses without gradients); those two give
the same logits bit for bit (their difference is printed too). Results in conv1d_forms_eval_<machine>.csv.

    python benchmarks/conv1d_forms.py [--batch-sizes 32,256,1000,4000] [--repeats 7] [--seconds 0.5]
    python benchmarks/conv1d_forms.py --evaluate [--batch-sizes 256,2048]
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, int_list, interleaved, median_and_spread, start, time_steps, write_results  # noqa: E402

from bsresearch.models import conv1d_as_matmul, window_rows_by_slices, window_rows_by_unfold  # noqa: E402
from bsresearch.runtime import cpu_name  # noqa: E402

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


def evaluation_forms(weights: list[torch.Tensor], biases: list[torch.Tensor],
                     head: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """conv1d, and conv1d_as_matmul's arithmetic with each of the library's two gathers of the window rows."""
    def matmul_form(gather: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            h = x.unsqueeze(2)                                   # (N, L, C)
            for w, b in zip(weights, biases):
                padded = F.pad(h, (0, 0, 1, 1))
                positions = (padded.shape[1] - w.shape[2]) // 2 + 1
                rows = gather(padded, w.shape[2], 2, positions)
                matrix = w.permute(0, 2, 1).reshape(WIDTH, -1).t()
                h = F.relu(torch.addmm(b, rows, matrix).view(len(x), positions, WIDTH))
            return h.transpose(1, 2).flatten(1) @ head.T
        return forward
    return {"conv1d": forms(weights, biases, head)["conv1d"], "slices rows": matmul_form(window_rows_by_slices),
            "unfold rows": matmul_form(window_rows_by_unfold)}


def measure(batch_size: int, device: torch.device, seconds: float, repeats: int,
            evaluate: bool = False) -> list[dict]:
    weights, biases, head = parameters(device)
    candidates = (evaluation_forms if evaluate else forms)(weights, biases, head)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch_size, LENGTH, generator=g).to(device)
    y = torch.randint(0, CLASSES, (batch_size,), generator=g).to(device)
    with torch.no_grad():
        reference = candidates["conv1d"](x)
        differences = {name: float((f(x) - reference).abs().max()) for name, f in candidates.items()}
        if evaluate:
            gathers = float((candidates["slices rows"](x) - candidates["unfold rows"](x)).abs().max())
            print(f"batch {batch_size}: slices rows against unfold rows, largest logit difference {gathers:g}")

    def stepper(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            if evaluate:
                with torch.no_grad():
                    forward(x)
                return
            with torch.backends.mkldnn.flags(enabled=forward is not candidates.get("no onednn")):
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
    parser = benchmark_parser(__doc__, seconds=0.5, repeats=7)
    parser.add_argument("--batch-sizes", type=int_list, help="[32,256,1000,4000; with --evaluate 256,2048]")
    parser.add_argument("--evaluate", action="store_true", help="time the forward pass under no_grad (evaluation)")
    args = parser.parse_args()
    device = start(args)
    sizes = args.batch_sizes or ([256, 2048] if args.evaluate else [32, 256, 1000, 4000])
    rows = [row for b in sizes for row in measure(b, device, args.seconds, args.repeats, args.evaluate)]
    write_results(pd.DataFrame(rows), "conv1d_forms_eval" if args.evaluate else "conv1d_forms", device,
                  args.out_dir)


if __name__ == "__main__":
    main()
