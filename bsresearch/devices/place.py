"""Where a process stands in a device group: its rank, the group's size, its device and how the group meets
(GroupPlace), read from torchrun's or a Slurm job step's environment; joining the group for the duration
(process_group: gloo on the CPU, NCCL on CUDA); and whether an error says the group lost a process (lost).
A collective waits at most COLLECTIVE_TIMEOUT seconds."""
from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import ConfigError, RunConfig
from ..runtime import resolve_device

# Seconds a process waits in one collective before it gives up (torch.distributed's timeout): the bound on a
# hang when a device's process is lost without its connections closing (NCCL). BSRESEARCH_COLLECTIVE_TIMEOUT
# sets it. On the CPU (gloo) a killed process closes its sockets and the others fail at once.
COLLECTIVE_TIMEOUT = float(os.environ.get("BSRESEARCH_COLLECTIVE_TIMEOUT", "300"))
LOST = "DeviceLost"          # the error's prefix of a run whose group lost a process ("died")


class DeviceLost(RuntimeError):
    """A collective failed: another process of the device group is gone (or timed out)."""


@dataclass(frozen=True)
class GroupPlace:
    """This process's place in a device group: its rank, the group's size, its device on this node, and how
    the group meets (torch.distributed's init_method)."""
    rank: int
    world: int
    local_rank: int
    init_method: str


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list ('gpu[03-05,07],cpu1' -> 'gpu03')."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=20, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not head:
        return nodelist
    prefix, ranges = head.group(1), head.group(2)
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def slurm_place(env: dict[str, str], init_method: str | None = None) -> GroupPlace | None:
    """This process's place in a Slurm job step of more than one task: SLURM_PROCID of SLURM_STEP_NUM_TASKS,
    device SLURM_LOCALID of its node; the group meets at `init_method`, by default tcp://MASTER_ADDR:MASTER_PORT
    (MASTER_ADDR default the step's first node, MASTER_PORT default 20000 + the job id mod 20000). None outside
    such a step: a batch script (sbatch --ntasks N) has SLURM_PROCID 0 and SLURM_NTASKS N but is no task of a
    step (srun sets SLURM_STEP_NUM_TASKS), and joining a group of N there would wait for tasks that never come."""
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if "SLURM_PROCID" not in env or tasks <= 1:
        return None
    if init_method is None:
        host = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or
                                                   env.get("SLURM_JOB_NODELIST", "localhost"))
        port = env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0") or 0) % 20000)
        init_method = f"tcp://{host}:{port}"
    return GroupPlace(int(env["SLURM_PROCID"]), tasks, int(env.get("SLURM_LOCALID", "0")), init_method)


def group_from_environment(env: dict[str, str] | None = None, slurm: bool = True) -> GroupPlace | None:
    """The device group this process was started in: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT, or (unless `slurm` is False) a Slurm job step's (slurm_place). None outside a group of more
    than one process."""
    env = dict(os.environ) if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return GroupPlace(int(env["RANK"]), world, int(env.get("LOCAL_RANK", "0")), "env://") if world > 1 else None
    return slurm_place(env) if slurm else None


def group_device(cfg: RunConfig, local_rank: int) -> torch.device:
    """This process's device: the CPU, or CUDA device `local_rank` (of those the process sees)."""
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        return device
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"devices {cfg.devices}: process {local_rank} of this node has no CUDA device (it sees "
                          f"{torch.cuda.device_count()}); give each run as many GPUs as it has devices")
    return torch.device("cuda", local_rank)


JOINED = False   # whether this process joined a device group (its entry point then ends it by leave_process)


def leave_process(code: int) -> None:
    """End a process that joined a device group, its results written: run its atexit handlers (a user's too),
    flush, and exit without the interpreter's teardown. DDP keeps gloo's worker threads running after the group
    is destroyed, and a teardown beside them can still abort a finished run ("terminate called without an active
    exception", SIGABRT; docs/testing.md#the-abort-at-exit). A process that joined no group returns."""
    if JOINED:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@contextlib.contextmanager
def process_group(place: GroupPlace, device: torch.device) -> Iterator[None]:
    """Join the group (gloo on the CPU, NCCL on CUDA) for the duration; collectives time out after
    COLLECTIVE_TIMEOUT seconds."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=place.init_method,
                            rank=place.rank, world_size=place.world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    global JOINED
    JOINED = True
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def lost(exc: BaseException) -> bool:
    """Whether `exc` says a collective failed: another process is gone, or the group timed out."""
    if isinstance(exc, (DeviceLost, dist.DistError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "timed out",
                                  "Broken pipe", "ProcessGroup"))

