"""How a run on several devices (`devices` > 1) starts its device processes: the choice, read in one place.

    processes   torch.multiprocessing on this machine, one process per device (the default)
    srun        one Slurm job step of `devices` tasks per run, inside the current Slurm allocation
                (launch.run_on_devices runs `srun --ntasks N ...`; the tasks meet through a file in the
                run directory, which a cluster's nodes share)

The choice is how a run is executed, not what it is: it is no part of the config or the run id. The
environment variable BSRESEARCH_DEVICE_LAUNCHER holds it; `bsresearch train --launcher` and
`bsresearch sweep --launcher` set it for the run (a sweep's tasks carry it to their worker processes, Dask
workers included). No torch import: the command line checks the choice before any work starts.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping

from ..errors import ConfigError

VARIABLE = "BSRESEARCH_DEVICE_LAUNCHER"
LAUNCHERS = ("processes", "srun")
DEFAULT = "processes"
# variables of a Slurm allocation that has GPUs (any one set, not 0)
_SLURM_GPU_VARIABLES = ("SLURM_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS_PER_NODE",
                        "SLURM_GPUS_PER_TASK", "SLURM_STEP_GPUS")


def device_launcher(env: Mapping[str, str] | None = None) -> str:
    """The launcher BSRESEARCH_DEVICE_LAUNCHER names (unset or empty: processes); any other value is a
    ConfigError naming the accepted ones."""
    env = os.environ if env is None else env
    value = env.get(VARIABLE, "").strip() or DEFAULT
    if value not in LAUNCHERS:
        raise ConfigError(f"{VARIABLE}={value!r} is not a device launcher; accepted: {', '.join(LAUNCHERS)}")
    return value


def check_launcher(launcher: str, env: Mapping[str, str] | None = None, here: bool = True) -> str:
    """`launcher`, if it is one and (`here`: the runs start their device processes from this machine) this
    process can use it: srun needs a Slurm allocation (SLURM_JOB_ID: inside salloc or an sbatch script) and the
    srun command on the PATH. Otherwise a ConfigError of one line."""
    env = os.environ if env is None else env
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher must be one of {', '.join(LAUNCHERS)}; got {launcher!r}")
    if launcher == "srun" and here:
        if not env.get("SLURM_JOB_ID"):
            raise ConfigError("launcher srun starts each run on several devices as a job step of the current Slurm "
                              "allocation, but this process is in none (no SLURM_JOB_ID): start it inside `salloc` "
                              "or an sbatch script, or use launcher processes")
        if shutil.which("srun", path=env.get("PATH")) is None:
            raise ConfigError("launcher srun: no `srun` command on the PATH of this process (SLURM_JOB_ID "
                              f"{env.get('SLURM_JOB_ID')}); load Slurm's module or use launcher processes")
    return launcher


@contextlib.contextmanager
def launcher_environment(launcher: str | None) -> Iterator[None]:
    """BSRESEARCH_DEVICE_LAUNCHER set to `launcher` for the duration (None: left as it is), then restored."""
    if launcher is None:
        yield
        return
    before = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = launcher
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before


def allocation_has_gpus(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Slurm allocation this process is in lists GPUs (a step started from a node that has none of
    its own, e.g. `salloc` on a login node, still asks for them)."""
    env = os.environ if env is None else env
    return any(env.get(name, "").strip() not in ("", "0") for name in _SLURM_GPU_VARIABLES) or \
        "gpu" in env.get("SLURM_TRES_PER_NODE", "") or "gpu" in env.get("SLURM_JOB_GRES", "")


def allocation_tasks(env: Mapping[str, str] | None = None) -> int | None:
    """The tasks of the current Slurm allocation (SLURM_NTASKS), or None outside one or when it sets none."""
    env = os.environ if env is None else env
    try:
        return int(env["SLURM_NTASKS"]) if int(env["SLURM_NTASKS"]) > 0 else None
    except (KeyError, ValueError):
        return None
