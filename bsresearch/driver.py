"""The one driver: everything between a config and a finished member, written once, for every place a run
can stand. A caller chooses an engine and a place; the driver does the rest:

    drive(cfg, run_dir, Place.single(), single_engine)                  train.run: one device
    drive(cfg, run_dir, Place.lead(devices) or Place.follower(...), ..)  devices.rank: one process of a group
    before_any_work(cfg, run_dir) for each member, then
    setup.loop(members, engine, callbacks_for(Place.member(group), cfgs))   fused.trainer: a fused group
    setup.loop([member], engine, callbacks_for(Place.probe(), [cfg], ...))  advise: a short run that measures

The path of one run (drive), the same on one device, on N devices and in a fused group:

    1. a finished run directory is returned as it is (unless overwrite); a run directory the place writes
       must be writable; a tracker whose package is missing is a ConfigError, all before any work;
    2. setup (runsetup.run_setup, on the place's device) and the member, resumed from its checkpoint or its
       trajectory; running out of memory here is the run's result "oom", written, not raised;
    3. the engine the caller chose for the setup and the member (one model, a device group's DDP model);
    4. the run's callbacks, one list chosen by the place (callbacks_for): every place decides alike
       (Evaluation, Divergence, the noise scale, checkpoints); the place that records (a single run, a
       group's lead, a fused member) also shows progress, measures, writes the run directory and logs to its
       trackers; a group's followers record nothing;
    5. the model's randomness (dropout) from the run's seed, continued across a resume; a follower draws
       its own stream;
    6. the loop (loop.Loop), which ends with the member's result.

A fused group (fused.trainer) takes the same steps for K members at once: 1 for each member
(before_any_work), 2 once for the group (an out-of-memory there is every unfinished member's "oom",
setup_out_of_memory), 3 a fused engine, 4 at each member's place (Place.member), no 5 (a fused model draws
no random numbers: fused.generic.probe refuses dropout), 6 for all members together.

Where the attempt ran goes into status.json (`Place.status`): `devices` says the devices of the attempt
that wrote it, and callbacks.Recording keeps `attempts`, one entry per start with its device count.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .callbacks import (
    Checkpointing,
    Divergence,
    Evaluation,
    Measurements,
    Progress,
    Recording,
    Snapshots,
    Stability,
    WeightAverage,
)
from .config import RunConfig
from .loop import Callback, Engine, Member, RunResult
from .noise.device import DeviceNoise
from .noise.microbatch import MicroBatchNoise
from .rundir import RunDir, check_writable
from .runsetup import RunSetup, finished_result, out_of_memory_result, run_setup
from .runtime import derive_seed, is_out_of_memory, model_randomness, oom_message, resolve_device
from .trackers import check_available, trackers_for
from .trajectory import Trajectory

SINGLE, LEAD, FOLLOWER, MEMBER, PROBE = "single", "lead", "follower", "member", "probe"


@dataclass(frozen=True)
class Place:
    """Where a run stands: alone on one device (single), a device group's rank 0 (lead) or another rank
    (follower), a member of a fused group (member), or advise's short run that only measures (probe).
    `status`: the fields every status.json of this attempt gets (the devices it ran on, a fused group's id)."""
    kind: str
    status: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0

    @classmethod
    def single(cls) -> Place:
        return cls(SINGLE, {"devices": {"count": 1}})

    @classmethod
    def lead(cls, devices: Mapping[str, Any]) -> Place:
        """Rank 0 of a device group; `devices`: the group's count, backend and BatchNorm statistics."""
        return cls(LEAD, {"devices": dict(devices)})

    @classmethod
    def follower(cls, rank: int, devices: Mapping[str, Any]) -> Place:
        return cls(FOLLOWER, {"devices": dict(devices)}, rank)

    @classmethod
    def member(cls, group: str | None) -> Place:
        return cls(MEMBER, {"devices": {"count": 1}, "group": group})

    @classmethod
    def probe(cls) -> Place:
        return cls(PROBE)

    @property
    def records(self) -> bool:
        """Whether this place writes the run's record: its run directory, progress, measurements, trackers."""
        return self.kind in (SINGLE, LEAD, MEMBER)

    @property
    def in_device_group(self) -> bool:
        return self.kind in (LEAD, FOLLOWER)


def callbacks_for(place: Place, cfgs: Sequence[RunConfig], progress: bool | None = None,
                  trajectory: Trajectory | None = None, callbacks: Sequence[Callback] = ()) -> list[Callback]:
    """The run's callbacks at `place`, with the caller's `callbacks` (each declares its phase, loop.Order,
    so the list's order does not matter). The callbacks that decide run at every place that trains a
    config (every rank of a group decides alike, on identical weights and the all-reduced loss); the ones
    that record run only where the place records (module docstring)."""
    if place.kind == PROBE:
        return [MicroBatchNoise(), *callbacks]
    noise: Callback = DeviceNoise() if place.in_device_group else MicroBatchNoise()
    own: list[Callback] = [Evaluation(), Divergence(), noise, Checkpointing()]
    if trajectory is not None:
        own.append(Snapshots(trajectory))
    if place.records:
        own += [Progress(progress), Measurements(), Stability(), WeightAverage(), Recording(place.status),
                *trackers_for(list(cfgs))]
    return [*own, *callbacks]


@contextlib.contextmanager
def randomness(place: Place, cfg: RunConfig, device: torch.device, member: Member) -> Iterator[None]:
    """The global RNG the model draws from (dropout): seeded by the run's seed, and a resumed member's state
    of it taken back, so that it repeats with the seed and across a resume; a follower draws its own stream
    (not a copy of the lead's)."""
    follower = place.kind == FOLLOWER
    with model_randomness(cfg.seed, device, None if follower else member.model_rng):
        if follower:
            torch.manual_seed(derive_seed(cfg.seed, f"model/device-{place.rank}/step-{member.state.step}"))
        yield


def result_of(member: Member) -> RunResult:
    """The member's result: Recording's, or where nothing records it (a follower) what the member holds."""
    return member.result or RunResult(member.outcome, {}, member.state.history, None, member.error,
                                      member.state.model)


def before_any_work(cfg: RunConfig, run_dir: str | Path | None, overwrite: bool = False,
                    writes: bool = True) -> RunResult | None:
    """The checks before any work: the result a finished run directory holds (unless overwrite: it is
    returned as it is, read-only storage is fine for it), else None once the run directory is writable (where
    this process `writes` it) and every tracker the config names has its package (ConfigError otherwise)."""
    finished = None if overwrite else finished_result(run_dir)
    if finished is not None:
        return finished
    if run_dir is not None and writes:
        check_writable(RunDir(run_dir).path, "--runs or --run-dir")
    check_available(list(cfg.trackers))
    return None


def setup_out_of_memory(cfg: RunConfig, run_dir: str | Path | None, place: Place, device: torch.device,
                        message: str) -> RunResult:
    """The result of a run whose data or model did not fit on `device` before its training started: state
    "oom", written to its run directory where the place records (runsetup.out_of_memory_result), with the
    device's cached memory given back first."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out_of_memory_result(cfg, run_dir if place.records else None, device, message, **place.status)


def drive(cfg: RunConfig, run_dir: str | Path | None, place: Place,
          engine: Callable[[RunSetup, Member], Engine], progress: bool | None = None, overwrite: bool = False,
          callbacks: Sequence[Callback] = (), device: torch.device | None = None) -> RunResult:
    """Train `cfg` at `place` with the engine `engine(setup, member)` makes: the path of one run, top to
    bottom (module docstring). `device`: the place's own device (a device group's rank), else cfg's.

    Bad configuration raises ConfigError before any work; failures during work end the run with state
    diverged/oom/failed, recorded, returned, not raised."""
    finished = before_any_work(cfg, run_dir, overwrite, place.records)
    if finished is not None:
        return finished
    rd = RunDir(run_dir) if run_dir is not None else None
    try:  # moving the data and the model to the device can run out of memory: a result ("oom"), not a bug
        setup = run_setup(cfg, device=device)
        trajectory = setup.trajectory(cfg, rd) if place.records else None
        member = setup.member(0, cfg, rd, resume=not overwrite, trajectory=trajectory)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        return setup_out_of_memory(cfg, run_dir, place, device if device is not None else resolve_device(cfg.device),
                                   oom_message(exc))
    if not place.records:
        member.rd = None   # it read the checkpoint the lead resumes from; it writes nothing
    chosen = engine(setup, member)
    with randomness(place, cfg, setup.device, member):
        setup.loop([member], chosen, callbacks_for(place, [cfg], progress, trajectory, callbacks)).run()
    return result_of(member)
