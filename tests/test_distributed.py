"""One run on several devices (bsresearch/devices/), on the CPU with gloo: 2 processes of 1 thread.

Each group test starts its processes by fork (a moment each) and meets through a file in a fresh temporary
folder, so tests running side by side never share a port; the starting process ends its children however a
test ends.

On CUDA (the tests with "cuda" in their ids, which skip without a GPU): a group of one process on NCCL trains
the one-device run, and its CPU twin (gloo) runs everywhere, so the test's logic is checked on every machine.
A group of 2 processes on CUDA needs 2 GPUs: the group runs NCCL on CUDA (process_group), NCCL refuses two
ranks on one GPU, and each process takes its own GPU (group_device gives process r CUDA device r, and a
ConfigError when the node has fewer); on a machine with one GPU `devices: 2` is that one-line error, before any
process starts. torch's gloo takes CUDA tensors, but two processes sharing one GPU over gloo would take another
backend and other devices than the runs do, so they would not test the runs' path: the library does not offer it."""
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import KillAt, devices_spec, killed_at, requires_cuda, tiny_config

from bsresearch import config as C
from bsresearch import schedule
from bsresearch.cli import main as cli_main
from bsresearch.config import ConfigError
from bsresearch.data import load_dataset
from bsresearch.devices.batchnorm import AllReduceBatchNorm
from bsresearch.devices.place import GroupPlace, first_host, group_from_environment
from bsresearch.devices.rank import run_rank
from bsresearch.engine import train_next_batch
from bsresearch.loop import Callback, StepHooks
from bsresearch.losses import loss_for
from bsresearch.noise.estimators import squared_grad_norm, two_batch_estimate
from bsresearch.rundir import RunDir
from bsresearch.state import load_checkpoint, new_state
from bsresearch.train import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")
ROOT = Path(__file__).resolve().parents[1]


def weights(run_dir):
    return load_checkpoint(Path(run_dir) / "checkpoint.pt")["state"]["model"]


def assert_same_weights(a, b, rtol=1e-5, atol=1e-6):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k].float(), wb[k].float(), rtol=rtol, atol=atol), k


def assert_same_history(a, b, rel=1e-5):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("train_loss", "test_loss", "lr", "examples"):
            assert ra[key] == pytest.approx(rb[key], rel=rel, abs=1e-7), (ra["step"], key)


# ----------------------------------------------------------------------------- what the config says
def test_devices_must_divide_every_batch_and_leave_the_run_id_alone():
    assert C.run_id(tiny_config()) == C.run_id(tiny_config(devices=1))
    assert C.run_id(tiny_config(devices=2)) == C.run_id(tiny_config())          # the same numbers, the same run
    assert C.run_id(tiny_config(devices=4, micro_batch_size=16)) == C.run_id(tiny_config(micro_batch_size=16))
    with pytest.raises(ConfigError, match=r"per-device batch 32 / \(3 x 1\) is not a whole number"):
        tiny_config(devices=3)
    with pytest.raises(ConfigError, match=r"48 / \(3 x 3\)"):
        tiny_config(devices=3, micro_batch_size=16, batch_size=48)
    with pytest.raises(ConfigError, match="devices must be"):
        tiny_config(devices=0)
    with pytest.raises(ConfigError, match="noise_scale_every"):
        tiny_config(devices=2, micro_batch_size=16, noise_scale_every=1)


def test_batchnorm_on_devices_is_ghost_batchnorm_at_the_per_device_batch():
    bn = dict(batchnorm=True, batch_size=64)
    # each device normalises its share: the run is the one-device run with ghost batches of that share
    assert C.run_id(tiny_config(devices=2, **bn)) == C.run_id(tiny_config(ghost_batch_size=32, **bn))
    assert C.run_id(tiny_config(devices=2, micro_batch_size=32, **bn)) == \
        C.run_id(tiny_config(ghost_batch_size=16, micro_batch_size=32, **bn))
    # over the global batch: the one-device run
    assert C.run_id(tiny_config(devices=2, sync_batchnorm=True, **bn)) == C.run_id(tiny_config(**bn))
    derived = schedule.derived(tiny_config(devices=2, micro_batch_size=32, **bn), 256)
    assert (derived["devices"], derived["per_device_batch"], derived["micro_batch"]) == (2, 16, 32)
    assert (derived["bn_statistics_batch"], derived["batchnorm_statistics"]) == (16, "per_device")
    assert schedule.derived(tiny_config(devices=2, sync_batchnorm=True, **bn), 256)["bn_statistics_batch"] == 64
    assert "devices" not in schedule.derived(tiny_config(), 256)
    with pytest.raises(ConfigError, match="ghost_batch_size 24 must divide the per-device batch 32"):
        tiny_config(devices=2, ghost_batch_size=24, **bn)
    with pytest.raises(ConfigError, match="choose one"):
        tiny_config(devices=2, ghost_batch_size=16, sync_batchnorm=True, **bn)
    with pytest.raises(ConfigError, match="sync_batchnorm needs batchnorm"):
        tiny_config(sync_batchnorm=True)


def test_the_group_comes_from_torchrun_or_slurm():
    assert group_from_environment({}) is None
    assert group_from_environment({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert group_from_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == \
        GroupPlace(1, 2, 1, "env://")
    slurm = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
             "SLURM_STEP_NODELIST": "gpu[07-08]"}
    assert group_from_environment({**slurm, "MASTER_ADDR": "gpu07"}) == GroupPlace(3, 4, 1, "tcp://gpu07:23456")
    assert group_from_environment({**slurm, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}) is None
    # a batch script of `sbatch --ntasks 4`: SLURM_PROCID 0 and SLURM_NTASKS 4, but no job step's tasks
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu07"}
    assert group_from_environment(batch) is None
    assert first_host("gpu[07-08,11],cpu1") in ("gpu07",)  # scontrol absent here: the list is read
    assert first_host("node5") == "node5"


# ----------------------------------------------------------------------------- the same run on 1 or 2 devices
def test_two_devices_train_the_run_of_one_device(tmp_path, capsys):
    """Oracle: the one-device run at the same global batch. The global order does not depend on the number
    of devices, so weights, losses and lr agree to float32 rounding; `bsresearch train --devices 2` starts
    the processes itself."""
    cfg = tiny_config(budget_amount=15, batch_size=64, save_checkpoint=True)
    one = run(cfg, tmp_path / "one")
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    assert cli_main(["train", str(tmp_path / "cfg.json"), "--devices", "2", "--run-dir", str(tmp_path / "two"),
                     "--quiet"]) == 0
    two = RunDir(tmp_path / "two")
    assert two.state() == "ok"
    assert_same_weights(tmp_path / "one", tmp_path / "two")
    assert_same_history(one.history, two.history_rows())
    config = two.config()
    assert config["devices"] == 2 and config["derived"]["per_device_batch"] == 32
    assert config["derived"]["micro_batch"] == 64 and config["derived"]["run_id"] == C.run_id(cfg)
    assert two.status()["devices"]["count"] == 2 and two.status()["devices"]["backend"] == "gloo"
    assert "state: ok" in capsys.readouterr().out


def test_accumulation_on_two_devices_trains_the_run_of_one_device(tmp_path):
    cfg = tiny_config(budget_amount=10, batch_size=64, micro_batch_size=16, save_checkpoint=True)
    one = run(cfg.replace(micro_batch_size=None), tmp_path / "one")
    two = run(cfg.replace(devices=2), tmp_path / "two")
    assert two.state == "ok"
    assert_same_weights(tmp_path / "one", tmp_path / "two")
    assert_same_history(one.history, two.history)


def torchrun_train(cfg, tmp_path: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 -m bsresearch train` of `cfg` into `run_dir`."""
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    return subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "bsresearch", "train",
                           str(tmp_path / "cfg.json"), "--run-dir", str(run_dir), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)


def test_torchrun_starts_the_same_command_and_it_joins_the_group(tmp_path):
    cfg = tiny_config(budget_amount=6, batch_size=64, save_checkpoint=True, devices=2)
    done = torchrun_train(cfg, tmp_path, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    one = run(cfg.replace(devices=1), tmp_path / "one")
    assert_same_weights(tmp_path / "one", tmp_path / "run")
    assert_same_history(one.history, RunDir(tmp_path / "run").history_rows())
    assert json.loads((tmp_path / "run" / "status.json").read_text())["devices"]["count"] == 2


@pytest.mark.parametrize("joined", [True, False])
def test_a_process_that_joined_a_group_leaves_after_its_atexit_handlers_and_flushed_output(tmp_path, joined):
    """leave_process (the end of python -m bsresearch in a device process): the user's atexit handlers run, what
    was printed is flushed, the exit code is the command's, and nothing after it runs (no teardown); a process
    that joined no group returns from it."""
    script = f"""
import atexit, sys
from bsresearch.devices import place
place.JOINED = {joined}
atexit.register(lambda: open({str(tmp_path / "atexit")!r}, "w").write("ran"))
sys.stdout.write("printed, not flushed")
place.leave_process(3)
print(" and after")
"""
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    expected = (3, "printed, not flushed") if joined else (0, "printed, not flushed and after\n")
    assert (done.returncode, done.stdout) == expected
    assert (tmp_path / "atexit").read_text() == "ran"


def test_settle_waits_until_the_thread_that_ran_the_hooks_callback_lets_go_of_it():
    """The cause of the abort at exit (noise/device.py): the thread that completes an all-reduce lets go of the
    hook's Python callback, taking the GIL, after DDP has its result. Oracle: a thread holding a callback until
    told to drop it; settle() returns only once it has (and says False while it holds it)."""
    import threading
    import weakref

    from bsresearch.noise.device import GradientNorms, _AfterAllReduce
    norms = GradientNorms(1)
    holder: list = [_AfterAllReduce(norms, torch.zeros(3), False, torch.futures.Future())]
    alive = weakref.ref(holder[0])
    drop = threading.Event()

    def gloo_like() -> None:
        callback = holder.pop()
        drop.wait()
        del callback                       # the last reference, let go on this thread

    thread = threading.Thread(target=gloo_like)
    thread.start()
    assert norms.held == 1 and not norms.settle(timeout=0) and alive() is not None
    drop.set()
    assert norms.settle() and norms.held == 0 and alive() is None
    thread.join()


def test_a_ddp_run_settles_every_callback_of_the_noise_hook_before_it_returns():
    cfg = tiny_config(budget_amount=4, batch_size=64)
    seen = []
    from bsresearch.devices import engine as device_engine
    made = device_engine.DeviceEngine.__init__

    def keep(self, *args, **kwargs):
        made(self, *args, **kwargs)
        seen.append(self.norms)
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        patch.setattr(device_engine.DeviceEngine, "__init__", keep)
        result = run_rank(cfg, None, GroupPlace(0, 1, 0, f"file://{folder}/rendezvous"), progress=False)
    assert result.state == "ok" and len(seen) == 1
    assert seen[0].allreduces >= 4 and seen[0].held == 0


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in Linux's /proc")
def test_a_process_leaves_its_group_with_no_thread_of_the_group_left():
    """A member that leaves lets DDP go (DeviceEngine.remove), so the group's worker threads end with the group
    instead of living on into the interpreter's shutdown. Oracle: the process's threads (/proc/self/task) when
    run_rank returns are the ones it had before; a first group starts torch's own pools, which stay. (The abort
    at exit that was first blamed on these threads came from the noise hook's callback: docs/testing.md.)"""
    def threads() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    cfg = tiny_config(budget_amount=4, batch_size=64)
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        assert run_rank(cfg, None, GroupPlace(0, 1, 0, f"file://{first}/rendezvous"), progress=False).state == "ok"
        before = threads()
        assert run_rank(cfg, None, GroupPlace(0, 1, 0, f"file://{second}/rendezvous"), progress=False).state == "ok"
        assert threads() - before == set()


@pytest.mark.exhaustive   # covered: test_torchrun_starts_the_same_command_and_it_joins_the_group (the path),
# test_settle_waits_until_the_thread_that_ran_the_hooks_callback_lets_go_of_it (the cause of the abort at exit)
def test_torchrun_ranks_exit_cleanly_beside_busy_processes(tmp_path):
    """The torchrun case, three times, with two processes spinning beside it on this machine's cores (started
    and ended here): every rank exits 0 (torchrun fails the run otherwise) and none aborts at exit."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        cfg = tiny_config(budget_amount=6, batch_size=64, devices=2)
        for attempt in range(3):
            done = torchrun_train(cfg, tmp_path, tmp_path / f"run{attempt}")
            assert done.returncode == 0 and "terminate called" not in done.stderr, (attempt, done.stderr[-3000:])
            assert RunDir(tmp_path / f"run{attempt}").state() == "ok"
    finally:
        for process in spin:
            process.kill()
            process.wait()


# ----------------------------------------------------------------------------- a group on CUDA
NOISE_COLUMNS = ("device_noise_b_simple_ema", "device_noise_grad_sq_norm_ema", "device_noise_trace_cov_ema")


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), pytest.param("cuda", "nccl", marks=requires_cuda)],
                         ids=["cpu-gloo", "cuda-nccl"])
def test_a_group_of_one_process_trains_the_one_device_run(tmp_path, device, backend):
    """run_rank in a group of world size 1 (NCCL on CUDA, gloo on the CPU): DeviceEngine, DDP and the noise
    scale's communication hook on that backend. Oracle: train.run of the same config on the same device (the
    one-device path): the same losses, lr and weights (to CUDA's rounding on CUDA). The hook's noise-scale
    columns are there; with one device its two batches are the same batch, so they hold no estimate (NaN)."""
    cfg = tiny_config(budget_amount=12, batch_size=64, eval_every=4, save_checkpoint=True, device=device)
    one = run(cfg, tmp_path / "one", progress=False)
    group = run_rank(cfg, tmp_path / "group", GroupPlace(0, 1, 0, f"file://{tmp_path}/rendezvous"), progress=False)
    assert one.state == group.state == "ok", group.error
    assert not torch.distributed.is_initialized()   # the group is left
    rd = RunDir(tmp_path / "group")
    assert rd.status()["devices"]["count"] == 1 and rd.status()["devices"]["backend"] == backend
    rel = 1e-5 if device == "cpu" else 1e-4
    assert_same_history(one.history, rd.history_rows(), rel=rel)
    assert_same_weights(tmp_path / "one", tmp_path / "group", rtol=rel, atol=1e-5)
    for row in rd.history_rows():
        assert all(key in row and math.isnan(row[key]) for key in NOISE_COLUMNS), row


@pytest.mark.parametrize("simulated", [
    True, pytest.param(False, marks=[requires_cuda, pytest.mark.skipif(torch.cuda.device_count() > 1,
                                                                        reason="checks a machine with one GPU")])],
    ids=["one-gpu-simulated", "cuda-one-gpu"])
def test_two_devices_on_one_gpu_is_a_config_error(tmp_path, monkeypatch, simulated):
    """NCCL refuses two ranks on one GPU, so each process of a group on CUDA has a GPU of its own: on a machine
    with one, `devices: 2` says so in one line before any process starts. Simulated (any machine): torch is
    made to see one CUDA device."""
    import bsresearch.devices.place as place
    if simulated:
        monkeypatch.setattr(place, "resolve_device", lambda name: torch.device("cuda"))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = tiny_config(device="cuda", devices=2, batch_size=64)
    with pytest.raises(ConfigError, match=r"devices 2: process 1 of this node has no CUDA device \(it sees 1\)") \
            as error:
        run(cfg, tmp_path / "run", progress=False)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run" / "status.json").exists()


# ----------------------------------------------------------------------------- accumulation: one all-reduce
class AllReduceCounter(Callback):
    """Rank 0 writes the bucket all-reduces of every optimizer update (the communication hook counts them)."""

    def __init__(self, path):
        self.path, self.counts, self.seen = Path(path), [], 0

    def after_step(self, loop, losses):
        total = loop.engine.norms.allreduces
        self.counts.append(total - self.seen)
        self.seen = total
        if torch.distributed.get_rank() == 0:
            self.path.write_text(json.dumps(self.counts))


@pytest.mark.parametrize("micro", [None, 16])
def test_micro_batches_skip_the_all_reduce_until_the_last(tmp_path, micro):
    """DDP's no_sync: an update of 4 micro-batches all-reduces each gradient bucket once, as an update of one."""
    cfg = tiny_config(budget_amount=5, batch_size=64, micro_batch_size=micro, devices=2)
    assert run(cfg, tmp_path / "run", callbacks=[AllReduceCounter(tmp_path / "counts.json")]).state == "ok"
    assert json.loads((tmp_path / "counts.json").read_text()) == [1] * 5   # the tiny MLP is one bucket


# ----------------------------------------------------------------------------- BatchNorm
def parameters_only(run_dir):
    return {k: v for k, v in weights(run_dir).items() if "running" not in k and "num_batches" not in k}


@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
def test_each_device_normalising_its_share_is_ghost_batchnorm_at_the_per_device_batch(tmp_path, model):
    """Oracle: one process with ghost batches of the per-device batch (32 of a batch of 64 on 2 devices; 16 with
    micro-batches of 32). The parameters agree; the running statistics are the first device's (DDP's buffer
    broadcast), not every ghost batch's in turn, so evaluations differ slightly."""
    shape = dict(model=model, width=8, depth=2) if model == "cnn1d" else {}
    for micro, ghost in ((None, 32), (32, 16)):
        cfg = tiny_config(budget_amount=6, batch_size=64, micro_batch_size=micro, batchnorm=True,
                          save_checkpoint=True, **shape)
        one = tmp_path / f"one{micro}"
        run(cfg.replace(ghost_batch_size=ghost), one)
        two = run(cfg.replace(devices=2), tmp_path / f"two{micro}")
        assert two.state == "ok"
        a, b = parameters_only(one), parameters_only(tmp_path / f"two{micro}")
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), (micro, k)
        assert RunDir(tmp_path / f"two{micro}").config()["derived"]["bn_statistics_batch"] == ghost
        assert RunDir(tmp_path / f"two{micro}").status()["devices"]["batchnorm"] == "per_device"


@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
def test_sync_batchnorm_is_batchnorm_over_the_global_batch(tmp_path, model):
    """Oracle: one process at the global batch, running statistics and evaluations included."""
    shape = dict(model=model, width=8, depth=2) if model == "cnn1d" else {}
    cfg = tiny_config(budget_amount=6, batch_size=64, batchnorm=True, save_checkpoint=True, **shape)
    one = run(cfg, tmp_path / "one")
    two = run(cfg.replace(devices=2, sync_batchnorm=True), tmp_path / "two")
    assert two.state == "ok"
    assert_same_weights(tmp_path / "one", tmp_path / "two", rtol=1e-4, atol=1e-5)
    assert_same_history(one.history, two.history, rel=1e-4)
    assert RunDir(tmp_path / "two").status()["devices"]["batchnorm"] == "global"


def test_all_reduce_batchnorm_outside_a_group_is_batchnorm():
    x = torch.randn(16, 3, 5)
    plain, ours = torch.nn.BatchNorm1d(3), AllReduceBatchNorm(3)
    assert torch.allclose(plain(x), ours(x)) and torch.allclose(plain.running_var, ours.running_var)


@pytest.fixture
def torch_warns_every_time():
    """torch warns once per process (TORCH_WARN_ONCE): made to warn every time for the test, so that an earlier
    test's warning does not hide this one's."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def test_cnn1d_gradients_come_in_their_parameters_strides_so_ddp_copies_none(tmp_path, torch_warns_every_time):
    """DDP compares each gradient's strides with its bucket view's, size-1 dimensions included, and where they
    differ it warns ("Grad strides do not match bucket view strides") and copies at every backward. cnn1d's
    first convolution (one input channel, a weight of shape (C', 1, k)) used to make its weight's gradient in
    other strides. Oracles: after a backward every gradient has its parameter's strides; and a cnn1d run in a
    group (world size 1: the same reducer as on N devices) raises no such warning."""
    from bsresearch.models import cnn1d
    model = cnn1d((40,), 10, width=8, depth=2)
    torch.nn.functional.cross_entropy(model(torch.randn(4, 40)), torch.arange(4)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.stride() == p.stride(), (name, p.stride(), p.grad.stride())
    cfg = tiny_config(model="cnn1d", width=8, depth=2, budget_amount=4, batch_size=64, micro_batch_size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_rank(cfg, tmp_path / "run", GroupPlace(0, 1, 0, f"file://{tmp_path}/rendezvous"), progress=False)
    assert result.state == "ok", result.error
    strides = [str(w.message) for w in caught if "strides" in str(w.message)]
    assert not strides, strides[0]


# ----------------------------------------------------------------------------- the noise scale from the hook
def test_the_hook_noise_scale_is_the_two_batch_estimator_on_the_devices_partition(tmp_path):
    """Oracle: in one process, on the same global batch at the same weights, the mean-loss gradient of each
    device's share (the first and second halves) and of the whole batch; two_batch_estimate with B_small =
    32, B_big = 64. EMA decay 0: each step's row holds that step's estimate."""
    cfg = tiny_config(budget_amount=3, batch_size=64, eval_every=1, noise_scale_ema=0.0)
    two = run(cfg.replace(devices=2), tmp_path / "two")
    data = load_dataset("synthetic", train_size=256)
    state = new_state(cfg, data, torch.device("cpu"))
    loss = loss_for("cross_entropy")
    expected = []
    for step in range(3):
        saved = state.sampler.state_dict()
        idx = state.sampler.next()
        state.sampler.load_state_dict(saved)          # train_next_batch draws the same batch again
        norms = []
        for part in (idx[:32], idx[32:], idx):
            state.model.zero_grad()
            loss(state.model(data.x_train[part]), data.y_train[part]).backward()
            norms.append(float(squared_grad_norm(state.model)))
        expected.append(two_batch_estimate((norms[0] + norms[1]) / 2, norms[2], 32, 64))
        train_next_batch(state, cfg, data, schedule.lr_at(cfg, step, data.n_train), loss)
    rows = two.history[1:]   # step 0's row precedes any update
    assert len(rows) == len(expected) == 3, [r["step"] for r in two.history]
    for row, (grad_sq, trace) in zip(rows, expected):
        assert row["device_noise_grad_sq_norm_ema"] == pytest.approx(grad_sq, rel=1e-4)
        assert row["device_noise_trace_cov_ema"] == pytest.approx(trace, rel=1e-4)
        assert row["device_noise_b_simple_ema"] == pytest.approx(trace / grad_sq, rel=1e-3)
    assert math.isnan(two.history[0]["device_noise_b_simple_ema"])


# ----------------------------------------------------------------------------- faults
class OutOfMemoryAt(KillAt):
    """Device `rank` runs out of memory inside its update at `step`."""

    def after_step(self, loop, losses):
        pass

    def step_hooks(self, loop, member):
        if member.state.step == self.step and torch.distributed.get_rank() == self.rank:
            def fail(i, n_micro, n_batch):
                raise MemoryError("simulated: out of memory on one device")
            return StepHooks(after_backward=fail)
        return None


def test_a_killed_device_process_ends_the_run_died_and_it_resumes_on_one_device(tmp_path):
    """kill -9 of one device process: the run ends `died` in bounded time, the other process is stopped, the
    checkpoint stays; the run resumes from it on 1 device at the same sample position, lr and schedule, and
    ends as the uninterrupted one-device run does (to float32 rounding)."""
    cfg = tiny_config(budget_amount=16, batch_size=64, checkpoint_every=4, save_checkpoint=True, devices=2,
                      schedule="cosine")
    started = time.monotonic()
    result = run(cfg, tmp_path / "run", callbacks=[KillAt(10, rank=1)])
    assert time.monotonic() - started < 90
    assert result.state == "died" and "device process 1" in result.error and "SIGKILL" in result.error
    assert RunDir(tmp_path / "run").state() == "died" and not multiprocessing.active_children()
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["state"]["step"] == 8
    resumed = run(cfg.replace(devices=1), tmp_path / "run")
    assert resumed.state == "ok" and RunDir(tmp_path / "run").status()["resumed_from"] == 8
    whole = run(cfg.replace(devices=1), tmp_path / "whole")
    assert_same_weights(tmp_path / "whole", tmp_path / "run")
    assert_same_history(whole.history, resumed.history)


def test_a_one_device_run_resumes_on_two_devices(tmp_path):
    cfg = tiny_config(budget_amount=16, batch_size=64, checkpoint_every=4, save_checkpoint=True, schedule="cosine")
    with killed_at(10):
        run(cfg, tmp_path / "run")
    resumed = run(cfg.replace(devices=2), tmp_path / "run")
    assert resumed.state == "ok" and RunDir(tmp_path / "run").status()["resumed_from"] == 8
    whole = run(cfg, tmp_path / "whole")
    assert_same_weights(tmp_path / "whole", tmp_path / "run")
    assert_same_history(whole.history, resumed.history)


def test_out_of_memory_on_one_device_is_out_of_memory_of_the_run(tmp_path):
    cfg = tiny_config(budget_amount=16, batch_size=64, devices=2)
    result = run(cfg, tmp_path / "run", callbacks=[OutOfMemoryAt(5, rank=1)])
    assert result.state == "oom" and result.error.startswith("device 1: out of memory at step 5")
    assert RunDir(tmp_path / "run").state() == "oom"


def test_a_finished_run_is_not_trained_again_on_other_devices(tmp_path):
    cfg = tiny_config(budget_amount=4, batch_size=64, save_checkpoint=True)
    run(cfg, tmp_path / "run")
    before = (tmp_path / "run" / "status.json").read_text()
    assert run(cfg.replace(devices=2), tmp_path / "run").state == "ok"
    assert (tmp_path / "run" / "status.json").read_text() == before


# ----------------------------------------------------------------------------- sweeps
SPEC = devices_spec("devices")


def test_a_sweep_gives_each_run_its_devices(tmp_path, monkeypatch):
    from bsresearch.sweep import supervise
    from bsresearch.sweep.executors import default_workers
    from bsresearch.sweep.runner import run_sweep
    from bsresearch.sweep.task import RunTask
    assert default_workers(10, ("0", "1", "2", "3"), devices=2) == 2 and default_workers(10, (), devices=64) == 1
    assert supervise.slot_gpus(("0", "1", "2", "3"), 1, 2) == ["2", "3"]
    task = RunTask(run_dir=str(tmp_path), config={"devices": 2, "device": "auto"}, label="x", engine="library",
                   gpus=("0", "1", "2", "3"))
    assert supervise.worker_env(task, 1)["CUDA_VISIBLE_DEVICES"] == "2,3"
    (tmp_path / "devices.yaml").write_text(SPEC)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    dry = run_sweep(tmp_path / "devices.yaml", runs_root=tmp_path / "runs", dry_run=True, workers=2, engine="library")
    assert "2 devices per run (worker 0: GPUs 0,1; worker 1: GPUs 2,3)" in dry.summary()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report = run_sweep(tmp_path / "devices.yaml", runs_root=tmp_path / "runs", workers=1, engine="library",
                       progress=False)
    assert set(report.final_states().values()) == {"ok"}, report.summary()
    assert "2 devices per run (one process each, started by the run)" in report.summary()


def test_accumulation_plans_reason_per_device():
    from bsresearch.systems.plan import accumulation_plan, largest_batch_on_devices
    one = accumulation_plan(1000, 300)
    assert (one.micro_batch_size, one.accumulation_steps, one.devices) == (250, 4, 1)
    two = accumulation_plan(1000, 300, devices=2)     # each device holds 300: its 500 as 2 x 250
    assert (two.micro_batch_size, two.per_device_batch, two.accumulation_steps) == (500, 250, 2)
    four = accumulation_plan(4096, 300, devices=4)    # shares of 1024 in 4 x 256
    assert (four.micro_batch_size, four.per_device_batch, four.accumulation_steps) == (1024, 256, 4)
    cfg = four.apply(tiny_config(batch_size=32))
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.devices) == (4096, 1024, 4)
    assert C.accumulation_steps(cfg) == 4 and schedule.device_values(cfg)["per_device_batch"] == 256
    assert largest_batch_on_devices(700, 4) == 2800
    with pytest.raises(ConfigError, match="equal per-device shares"):
        accumulation_plan(1001, 300, devices=2)
