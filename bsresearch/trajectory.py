"""Saved states along a training trajectory, from which other runs continue: branching without retraining.

Runs whose configs agree on everything except their budget and what they do after their batch first changes
(`config.trajectory_key`: a constant lr after warmup, or a wsd schedule whose decay begins after the run's
trajectory end, `schedule.trajectory_of`; evaluations every N steps; a budget in tokens) train
through the same states up to `schedule.trajectory_end`. A run that lists `snapshot_at_tokens` saves its whole
state at those points into its sweep's store, RUNS/<sweep>/.trajectories/<key>/step_<S>.pt, and a run of the
same trajectory starts from the latest saved state at or before its trajectory end instead of from step 0.
That is how a critical-batch-size sweep branches (Merrill et al. 2025): one run at a small batch, and from
its checkpoints, continuations at k times the batch, each a run of its own (`batch_schedule: tokens`).

A run continued from a saved state continues exactly as a resumed run does: bit for bit the run it would
have been had it trained its prefix itself (on the same machine), so whichever run of a trajectory saves a
state, and whichever order a sweep runs them in, the results are the same. While one run trains a
trajectory's prefix it holds the trajectory's lock, and the others wait for the state they need, or for the
lock (a run killed lets go of it: it is an flock), rather than train the same prefix twice.
"""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import schedule
from .config import RunConfig

STORE = ".trajectories"  # RUNS/<sweep>/.trajectories/<trajectory key>/step_<S>.pt
POLL_SECONDS = 0.5


@dataclass
class Trajectory:
    """One run's place on its trajectory: the store folder, the run's trajectory end and the steps it saves."""
    folder: Path
    end: int                                  # the last step the run shares with the trajectory
    saves: tuple[int, ...]                    # snapshot steps up to `end`
    lock: int | None = field(default=None, repr=False)  # the flock's file descriptor while held

    @classmethod
    def of(cls, cfg: RunConfig, run_dir: Path, n_train: int, tokens_per_example: int) -> Trajectory | None:
        """The trajectory of `cfg`, stored beside its run directory; None when it has none to share (no
        snapshot_at_tokens: then it neither saves nor looks for saved states)."""
        key = schedule.trajectory_of(cfg, n_train, tokens_per_example)
        if key is None or not cfg.snapshot_at_tokens:
            return None
        end = schedule.trajectory_end(cfg, n_train, tokens_per_example)
        saves = tuple(s for s in schedule.snapshot_steps(cfg, n_train, tokens_per_example) if s <= end)
        return cls(Path(run_dir).parent / STORE / key, end, saves)

    def path(self, step: int) -> Path:
        return self.folder / f"step_{step:09d}.pt"

    def saved(self) -> list[int]:
        """Steps with a saved state, ascending."""
        if not self.folder.is_dir():
            return []
        return sorted(int(p.stem[5:]) for p in self.folder.glob("step_*.pt") if p.stem[5:].isdigit())

    def start(self) -> Path | None:
        """The saved state to start from: the one at the trajectory end when it exists; else, once no other
        run trains this trajectory, the latest one before it (None: start at step 0). Until this run lets go
        of the trajectory (`release`), others wait for it."""
        if not self.saves:   # no state this run could start from is ever saved
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            if self.path(self.end).exists():
                return self.path(self.end)
            if self._try_lock():
                before = [s for s in self.saved() if s <= self.end]
                return self.path(before[-1]) if before else None
            time.sleep(POLL_SECONDS)

    def _try_lock(self) -> bool:
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.lock = fd
        return True

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)   # closing the descriptor drops the flock
            self.lock = None
