"""Kernels that start together do not collide: many tiny papermill runs at once on more workers than cores
all finish, and a kernel that fails to start is started again, recorded as an attempt, not as the run's
failure."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, kernels, load_spec, run_sweep

ROOT = Path(__file__).resolve().parent.parent


def tiny_spec(tmp_path: Path, name: str, points: int) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: {name}
        notebook: {ROOT / "notebooks" / "01_train.ipynb"}
        timeout: 300
        base: {{dataset: synthetic, train_size: 64, model: mlp, width: 4, depth: 1, batch_size: 16,
               budget: steps, budget_amount: 2, eval_schedule: every, eval_every: 2, device: cpu,
               save_checkpoint: false}}
        grid: {{lr: {[round(0.01 * (i + 1), 3) for i in range(points)]}}}
    """))
    return spec


@pytest.mark.exhaustive   # covered: test_two_kernels_started_in_one_folder_each_answer_on_their_own_sockets
def test_6_papermill_kernels_starting_at_once_on_2_cores_all_finish(tmp_path):
    # one wave of 6 kernels starting at once (benchmarks/soak_faults.py starts hundreds, with faults)
    spec = tiny_spec(tmp_path, "crowd", 6)
    report = run_sweep(spec, tmp_path / "runs", executor="local", workers=6, fuse="off", progress=False)
    states = [o.state for o in report.outcomes]
    assert states == ["ok"] * 6, [(o.state, o.error) for o in report.outcomes if o.state != "ok"]
    for point in expand(load_spec(spec)):
        status = RunDir(tmp_path / "runs" / "crowd" / point.run_id).status()
        assert status["state"] == "ok"   # a failed kernel start, if any, is an attempt beside an ok run


def test_kernels_talk_over_unix_sockets_not_tcp_ports():
    manager = kernels.IPCKernelManager(kernel_name="python3")
    assert manager.transport == "ipc"


@pytest.mark.slow
def test_two_kernels_started_in_one_folder_each_answer_on_their_own_sockets(tmp_path):
    """The runs of a sweep start their kernels in one working directory: each kernel's sockets are in a folder
    of its own (absolute paths), both kernels answer, and neither the working directory nor /tmp keeps a socket
    file once they are shut down. (jupyter_client's default, a relative `kernel-ipc-N`, bound the same sockets
    for both: one kernel never answered, and the files stayed in the folder.)"""
    import asyncio

    async def start_two() -> list[str]:
        managers = [kernels.IPCKernelManager(kernel_name="python3") for _ in range(2)]
        await asyncio.gather(*(m.start_kernel(cwd=str(tmp_path), extra_arguments=list(kernels.KERNEL_ARGS))
                               for m in managers))
        folders = [m.socket_folder for m in managers]
        clients = [m.client() for m in managers]
        try:
            for c in clients:
                c.start_channels()
            await asyncio.gather(*(c.wait_for_ready(timeout=120) for c in clients))
            replies = [await c.execute_interactive("import os; print(os.getpid())", timeout=60) for c in clients]
            assert [r["content"]["status"] for r in replies] == ["ok", "ok"]
        finally:
            for c in clients:
                c.stop_channels()
            await asyncio.gather(*(m.shutdown_kernel(now=True) for m in managers))
        return folders

    folders = asyncio.run(start_two())
    assert len(set(folders)) == 2 and all(Path(f).is_absolute() for f in folders)
    assert not any(Path(f).exists() for f in folders)
    assert list(tmp_path.iterdir()) == []


def test_a_kernel_that_fails_to_start_is_started_again_and_recorded(tmp_path, monkeypatch):
    import papermill as pm
    calls = []
    real = pm.execute_notebook

    def flaky(notebook, output, **kwargs):
        calls.append(kwargs["kernel_manager_class"])
        if len(calls) < 3:
            Path(output).write_text('{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}}]}')
            raise RuntimeError("Kernel didn't respond in 60 seconds")
        return real(notebook, output, **kwargs)
    monkeypatch.setattr(pm, "execute_notebook", flaky)
    monkeypatch.setattr(kernels.time, "sleep", lambda s: None)
    from bsresearch.sweep.task import RunTask
    from bsresearch.sweep.worker import execute_task
    point = expand(load_spec(tiny_spec(tmp_path, "flaky", 1)))[0]
    run_dir = tmp_path / "runs" / "flaky" / point.run_id
    outcome = execute_task(RunTask(run_dir=str(run_dir), config=point.config.to_dict(), label=point.label,
                                   notebook=str(ROOT / "notebooks" / "01_train.ipynb"), timeout=300.0))
    assert outcome.state == "ok" and len(calls) == 3
    assert all(c is kernels.IPCKernelManager for c in calls)
    failed = RunDir(run_dir).status()["kernel_start_failures"]
    assert failed == ["RuntimeError: Kernel didn't respond in 60 seconds"] * 2


def test_a_kernel_that_never_starts_fails_the_run_after_the_attempts(tmp_path, monkeypatch):
    import papermill as pm

    def never(notebook, output, **kwargs):
        Path(output).write_text('{"cells": []}')
        raise RuntimeError("Kernel didn't respond in 60 seconds")
    monkeypatch.setattr(pm, "execute_notebook", never)
    monkeypatch.setattr(kernels.time, "sleep", lambda s: None)
    with pytest.raises(RuntimeError, match="respond"):
        kernels.execute_notebook(ROOT / "notebooks" / "01_train.ipynb", tmp_path / "out.ipynb", {}, tmp_path,
                                 "python3", 60)
