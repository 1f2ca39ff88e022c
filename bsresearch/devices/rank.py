"""One process of a device group (run_rank): the one driver (driver.drive) with DeviceEngine, at the place of
the process in its group, the lead (rank 0, which records the run) or a follower (which records nothing)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from .. import schedule
from ..config import ConfigError, RunConfig
from ..driver import Place, drive
from ..loop import Callback, Loop, Member, Order, RunResult
from ..runsetup import RunSetup
from .engine import DeviceEngine
from .place import DeviceLost, GroupPlace, group_device, process_group


class GroupLoss(Callback):
    """A run whose group lost a process (a collective failed: DeviceLost) ends `died`, not `failed`: it is
    decided before anything records the failure (Order.DECIDE)."""
    order = Order.DECIDE

    def on_error(self, loop: Loop, member: Member, exc: BaseException) -> None:
        if isinstance(exc, DeviceLost):
            member.outcome, member.error = "died", str(exc)


def run_rank(cfg: RunConfig, run_dir: str | Path | None, place: GroupPlace, progress: bool | None = None,
             overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Train `cfg` as process `place.rank` of its device group, through the one driver: the lead writes the
    run directory, every rank decides alike. `callbacks` run on every rank (a callback that stops a member
    must decide the same on all)."""
    if place.world != cfg.devices:
        raise ConfigError(f"devices {cfg.devices}, but the group this process was started in has {place.world} "
                          f"processes: start it with as many as the config's devices")
    device = group_device(cfg, place.local_rank)
    with process_group(place, device):
        devices = {"count": place.world, "backend": dist.get_backend(),
                   "batchnorm": schedule.device_values(cfg).get("batchnorm_statistics")}
        where = Place.lead(devices) if place.rank == 0 else Place.follower(place.rank, devices)
        made: list[DeviceEngine] = []

        def engine(setup: RunSetup, member: Member) -> DeviceEngine:
            made.append(_engine(setup, member, device, run_dir))
            return made[-1]
        try:
            result = drive(cfg, run_dir, where, engine, progress, overwrite, [GroupLoss(), *callbacks], device)
            for chosen in made:   # the all-reduces' threads let go of the hook's callbacks while Python is alive
                chosen.norms.settle()
            return result
        finally:   # DDP let go before the group ends, also when an exception escapes the loop (DeviceEngine.remove)
            for chosen in made:
                chosen.remove([])


def _engine(setup: RunSetup, member: Member, device: torch.device, run_dir: str | Path | None) -> DeviceEngine:
    """DeviceEngine for the member, once every process has its member at the same step (each resumed from the
    checkpoint it read; one written between two reads would start them apart)."""
    steps = [torch.zeros((), dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor(member.state.step, device=device))   # on the device: NCCL takes no CPU
    if len({int(s) for s in steps}) != 1:
        raise ConfigError(f"the processes of run {run_dir} start at different steps {[int(s) for s in steps]}: "
                          f"its checkpoint changed while they read it; start the run again")
    return DeviceEngine(setup.data, setup.loss, setup.task, member, device)
