"""Which runs train together, and how many at once.

No torch import at module level: the sweep runner plans groups without it.

Two runs can share a fused group when `compat.fusion_blocker(a, b)` says nothing blocks it (they differ
only in seed and in fields that change neither tensor shapes nor the data pipeline). Runs are grouped
greedily in the sweep's order: a run joins the first open group whose first member it can fuse with,
otherwise it starts a group. A group is then cut into near-equal groups of at most `fuse_max` runs, and
into more of them while there are fewer groups than workers (an idle core is worth more than a bigger
group). A group of one is an ordinary run, and the plan says why it was left alone.

Data: a group indexes its members' batches out of tensors. Data a run alone would stream (a map-style Dataset
from the user's factory, data_loading auto) is held resident for a group when it takes at most
RESIDENT_MAX_BYTES as tensors (`residency`); the sweep's planner decides it before any run, the fused trainer
the same way when it meets such data unplanned, and larger data keeps its runs alone, streamed.

Group size:
- CPU: at most CPU_FUSE_MAX runs (see its comment);
- CUDA: the runner plans up to GPU_FUSE_MAX; the worker, which sees the GPU, trains them with
  fused.train_group, in chunks of the size the memory model predicts fits (fused/memory.py), and a chunk
  that still runs out of memory is split in two and retried, down to single runs, which record "oom"
  (fused/trainer.py).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import RunConfig
from ..sizes import format_bytes

Blocker = Callable[[RunConfig, RunConfig], "str | None"]

# Why 32 on one CPU thread: a small model's step is dominated by per-step overhead (Python, kernel
# launches, optimizer bookkeeping), which fusing pays once per group; past a few tens of members the
# fused step is compute-bound, so a bigger group no longer saves time but makes a killed group lose more.
CPU_FUSE_MAX = 32
# On a CPU fusing pays only up to a batch size, past which the arithmetic, not the per-step overhead, sets the
# time. The largest batch at which benchmarks/fused_runs.py measured a fused group of K = 8 at least 1.3x
# faster per member than the same runs one after another, in each of two runs (one thread, AMD EPYC;
# results/fused_runs_batch_*, and a second run of the same code), with the next size up:
#   cnn1d without BatchNorm: 512 (1.30x, 1.42x; at 1024: 1.20x, 1.12x),
#   cnn1d with ghost BatchNorm: 512 (1.31x, 1.45x; at 1024: 1.17x, 1.22x),
#   cnn1d with BatchNorm: 256 (1.39x, 1.43x; at 512: 1.07x, 1.06x),
#   mlp: 256 (1.56x, 1.48x; at 512: 1.14x, 1.00x).
CPU_FUSE_MAX_BATCH: dict[tuple[str, str], int] = {("cnn1d", "plain"): 512, ("cnn1d", "ghost batchnorm"): 512,
                                                  ("cnn1d", "batchnorm"): 256, ("mlp", "plain"): 256}
# Other models, a user's included, keep the bound measured first for every model (64). Up to 64 the stacked
# layers gain several times over (cnn1d 4.0x and the mlp 3.6x at batch 32, K = 32; 2.2-3.6x at 80 above);
# above it the gain is smaller and depends on the machine, so there the worker's calibration
# (fused/trainer.py) fuses a group only where it pays on the machine at hand, as it does for every group
# through vmap.
CPU_FUSE_MAX_BATCH_OTHER = 64
# On CUDA this is only the planning bound: the worker cuts a group to what the memory model says fits.
GPU_FUSE_MAX = 128
NO_FUSED_TRAINER = "the fused trainer (bsresearch.fused.compat) is not installed"
# A fused group indexes its members' batches out of tensors on its device: data a user's factory gives as a
# map-style Dataset (streamed when a run is alone, data_loading auto) is held resident for a group when its
# training and test splits as tensors take at most this many bytes, else its members run alone, streamed. One
# GiB: a group holds one copy for all its members, which is small next to the memory of a machine that runs
# several workers, or of a GPU; data larger than that is what streaming is for.
RESIDENT_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class Grouping:
    """Groups of indices into the configs given (each group in the given order), and for every run left
    alone, why (one line)."""
    groups: tuple[tuple[int, ...], ...]
    alone: dict[int, str]


def default_blocker() -> Blocker:
    """compat.fusion_blocker, or (without the fused trainer) a blocker that fuses nothing and says so."""
    try:
        from .compat import fusion_blocker
    except ImportError:
        return lambda a, b: NO_FUSED_TRAINER
    return fusion_blocker


def group_configs(cfgs: Sequence[RunConfig], fuse_max: int, workers: int = 1,
                  blocker: Blocker | None = None, excluded: dict[int, str] | None = None) -> Grouping:
    """Group `cfgs` for fused training: at most `fuse_max` per group, at least `workers` groups when
    there are enough runs. `excluded` (index -> reason) are runs that must run alone whatever they are."""
    blocker = blocker or default_blocker()
    alone: dict[int, str] = dict(excluded or {})
    classes: list[list[int]] = []  # runs that can all train together, in the sweep's order
    for i, cfg in enumerate(cfgs):
        if i in alone:
            continue
        own = blocker(cfg, cfg)  # a config the fused trainer cannot train at all
        if own is not None:
            alone[i] = own
            continue
        home = next((members for members in classes if blocker(cfgs[members[0]], cfg) is None), None)
        if home is None:
            classes.append([i])
        else:
            home.append(i)
    groups: list[tuple[int, ...]] = []
    for members, n_groups in zip(classes, _groups_per_class([len(c) for c in classes], fuse_max, workers)):
        for part in _split(members, n_groups):
            if len(part) > 1:
                groups.append(tuple(part))
            elif len(members) > 1:
                alone[part[0]] = "split off so that every worker has a run"
            else:  # why not with the others: what blocks fusing it with the first run of another class
                other = next((c[0] for c in classes if c is not members), None)
                alone[part[0]] = ("no other pending run of the sweep" if other is None
                                  else blocker(cfgs[other], cfgs[part[0]]) or "no other pending run of its shape")
    return Grouping(tuple(sorted(groups)), alone)


def _groups_per_class(sizes: list[int], fuse_max: int, workers: int) -> list[int]:
    """How many groups each class of fusable runs is cut into: enough for fuse_max, then more (splitting
    the class with the largest groups) until every worker has one."""
    counts = [math.ceil(n / fuse_max) for n in sizes]
    while sum(counts) < workers:
        largest = max(range(len(sizes)), key=lambda k: (sizes[k] / counts[k], -k), default=None)
        if largest is None or counts[largest] >= sizes[largest]:
            break
        counts[largest] += 1
    return counts


def _split(items: list[int], n: int) -> list[list[int]]:
    """`items` in order, cut into n parts whose sizes differ by at most one."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (k < extra)
        out.append(items[start:end])
        start = end
    return out


def group_id(run_ids: Sequence[str]) -> str:
    """A stable id for the group of these runs: g-<8 hex digits of a hash of their sorted run ids>."""
    return "g-" + hashlib.sha1(",".join(sorted(run_ids)).encode()).hexdigest()[:8]


def cpu_fuse_max_batch(cfg: RunConfig) -> int:
    """The largest batch at which a run of this config joins a fused group on a CPU (CPU_FUSE_MAX_BATCH)."""
    norm = "plain" if not cfg.batchnorm else "ghost batchnorm" if cfg.ghost_batch_size else "batchnorm"
    return CPU_FUSE_MAX_BATCH.get((cfg.model, norm), CPU_FUSE_MAX_BATCH_OTHER)


def cpu_batch_too_large(cfg: RunConfig) -> str | None:
    """Why a run is left alone on a CPU because fusing would not pay at its batch size, or None."""
    bound = cpu_fuse_max_batch(cfg)
    if cfg.batch_size > bound:
        return (f"batch_size {cfg.batch_size} > {bound}: on a CPU fusing pays only for small batches "
                f"(grouping.CPU_FUSE_MAX_BATCH)")
    return None


def default_fuse_max(device: str) -> int:
    """The planning bound on a group's size for a config's device ('cpu', 'cuda', 'cuda:N')."""
    return CPU_FUSE_MAX if device == "cpu" else GPU_FUSE_MAX


def resident_bytes(data: Any) -> int:
    """The bytes a run's data takes as tensors (training and test split): exact for resident data, estimated
    from the first training example for a streamed Dataset (its items are tensors, named tensors or numbers of
    one shape)."""
    x, y = data.first(1)
    per_example = x.nbytes + y.nbytes
    return per_example * (data.n_train + data.n_test)


def residency(streamed_bytes: int, budget: int | None = None) -> tuple[bool, str]:
    """For data a run would stream (a map-style Dataset from the user's factory, data_loading auto) taking
    `streamed_bytes` as tensors: (whether a fused group holds it resident, the one-line reason). `budget`:
    RESIDENT_MAX_BYTES unless given."""
    budget = RESIDENT_MAX_BYTES if budget is None else budget
    size = f"a map-style Dataset, {format_bytes(streamed_bytes)} as tensors"
    if streamed_bytes <= budget:
        return True, (f"data_loading resident: its data is {size}, within the {format_bytes(budget)} a fused group "
                      f"holds resident (grouping.RESIDENT_MAX_BYTES)")
    return False, (f"its data is {size}, over the {format_bytes(budget)} a fused group holds resident "
                   f"(grouping.RESIDENT_MAX_BYTES): streamed, alone")
