"""Executing a notebook with papermill without the failures that are the machinery's, not the run's.

A kernel that talks over TCP gets its ports from jupyter_client, which binds free ports, closes them and
lets the kernel bind them again later: another kernel starting at the same moment can take one first
(papermill issues #511 and #239, jupyter_client #154), and the kernel then never answers ("Kernel didn't
respond in 60 seconds", after "ZMQError: Address already in use"). The more workers per core, the likelier.
Here every kernel talks over Unix-domain sockets in a folder of its own (`IPCKernelManager`), so no two
kernels can share one. (jupyter_client's own default for such sockets, `kernel-ipc-N`, is a relative path
that each kernel binds in its own working directory: two kernels started in one folder, as the runs of one
sweep are, bound the same sockets, one of them never answered, and the files stayed in the user's folder.)
A kernel has START_TIMEOUT seconds to answer, and one that still fails to start (a loaded machine) is started
again, at most START_ATTEMPTS times; each failed start is returned so the caller records it as an attempt,
never as the run's failure.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import default

START_ATTEMPTS = 3                # kernel starts tried before a run's notebook is given up
START_TIMEOUT = 120               # seconds a starting kernel has to answer (papermill's default: 60)
KERNEL_ARGS = ("--IPKernelApp.log_level=ERROR",)


class IPCKernelManager(AsyncKernelManager):
    """A Jupyter kernel on Unix-domain sockets (in a folder of its own) instead of TCP ports."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        """The sockets' path prefix: absolute, in a new folder for this kernel alone."""
        self.socket_folder = tempfile.mkdtemp(prefix="bsresearch-kernel-")
        return os.path.join(self.socket_folder, "ipc")

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        folder = getattr(self, "socket_folder", None)
        if folder and not restart:
            shutil.rmtree(folder, ignore_errors=True)


def never_started(notebook: Path) -> bool:
    """Whether no code cell of the notebook papermill was writing has begun executing."""
    try:
        cells = json.loads(Path(notebook).read_text()).get("cells", [])
    except (OSError, ValueError):
        return True
    return not any(c.get("cell_type") == "code" and (c.get("execution_count") is not None or
                                                     c.get("metadata", {}).get("papermill", {}).get("start_time"))
                   for c in cells)


def execute_notebook(notebook: str | Path, output: str | Path, parameters: dict[str, Any], cwd: str | Path,
                     kernel: str, timeout: float | None, **kwargs: Any) -> list[str]:
    """papermill.execute_notebook on an IPC kernel; a kernel that fails to start is started again (at most
    START_ATTEMPTS starts). Returns the failed starts (one line each); raises what the last attempt raised,
    and whatever happens once a cell has begun."""
    import papermill as pm
    failed: list[str] = []
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            pm.execute_notebook(str(notebook), str(output), parameters=parameters, kernel_name=kernel, cwd=str(cwd),
                                execution_timeout=timeout, start_timeout=START_TIMEOUT,
                                extra_arguments=list(KERNEL_ARGS),
                                kernel_manager_class=IPCKernelManager, **kwargs)
            return failed
        except Exception as exc:
            if attempt == START_ATTEMPTS or not never_started(Path(output)):
                raise
            failed.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            time.sleep(random.uniform(0.5, 2.0) * attempt)   # apart from the others that failed with it
    return failed
