"""One process of a device group (run_rank): the setup on this process's device, its member, DeviceEngine and the
loop; rank 0 writes the run directory (GroupRecording), every rank runs the callbacks that decide."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from .. import schedule
from ..callbacks import Checkpointing, Divergence, Evaluation, Progress, Recording
from ..config import ConfigError, RunConfig
from ..loop import Callback, Loop, Member, RunResult
from ..noise.device import DeviceNoise
from ..rundir import RunDir, check_writable
from ..runsetup import finished_result, out_of_memory_result, run_setup
from ..runtime import derive_seed, is_out_of_memory, model_randomness, oom_message
from .engine import DeviceEngine
from .place import LOST, GroupPlace, group_device, process_group


class GroupRecording(Recording):
    """Recording on the group's rank 0: a run whose group lost a process ends `died`, not `failed`."""

    def on_finish(self, loop: Loop, member: Member) -> None:
        if member.outcome == "failed" and (member.error or "").startswith(LOST):
            member.outcome, member.error = "died", (member.error or "").removeprefix(f"{LOST}: ")
        super().on_finish(loop, member)


# ----------------------------------------------------------------------------- one process of the group
def run_rank(cfg: RunConfig, run_dir: str | Path | None, place: GroupPlace, progress: bool | None = None,
             overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Train `cfg` as process `place.rank` of its device group: the one setup on this process's device, the
    member (every rank resumes the same checkpoint), DeviceEngine, and the loop; rank 0 writes the run
    directory. `callbacks` run on every rank (a callback that stops a member must decide the same on all)."""
    if place.world != cfg.devices:
        raise ConfigError(f"devices {cfg.devices}, but the group this process was started in has {place.world} "
                          f"processes: start it with as many as the config's devices")
    lead = place.rank == 0
    finished = None if overwrite else finished_result(run_dir)
    if finished is not None:
        return finished
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd and lead:
        check_writable(rd.path, "--runs or --run-dir")
    device = group_device(cfg, place.local_rank)
    with process_group(place, device):
        try:
            setup = run_setup(cfg, device=device)
            member = setup.member(0, cfg, rd, resume=not overwrite)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return out_of_memory_result(cfg, run_dir if lead else None, device, oom_message(exc))
        # on the group's device: NCCL (CUDA) takes no CPU tensors
        steps = [torch.zeros((), dtype=torch.long, device=device) for _ in range(place.world)]
        dist.all_gather(steps, torch.tensor(member.state.step, device=device))
        if len({int(s) for s in steps}) != 1:
            raise ConfigError(f"the processes of run {run_dir} start at different steps {[int(s) for s in steps]}: "
                              f"its checkpoint changed while they read it; start the run again")
        if not lead:
            member.rd = None
        engine = DeviceEngine(setup.data, setup.loss, setup.task, member, device)
        own: list[Callback] = [Evaluation(), Divergence(), DeviceNoise()]
        if lead:
            status = {"devices": {"count": place.world, "backend": dist.get_backend(),
                                  "batchnorm": schedule.device_values(cfg).get("batchnorm_statistics")}}
            own += [Progress(progress), GroupRecording(status)]
        with model_randomness(cfg.seed, device, member.model_rng if lead else None):
            if not lead:   # the other devices' dropout: their own stream, not a copy of rank 0's
                torch.manual_seed(derive_seed(cfg.seed, f"model/device-{place.rank}/step-{member.state.step}"))
            setup.loop([member], engine, [*own, *callbacks, Checkpointing()]).run()
    return member.result or RunResult(member.outcome, {}, member.state.history, None, member.error, member.state.model)

