"""runtime.retain_freed_memory: the memory a step frees stays in the process, so the next step does not fault
fresh pages in; runs and fused groups set it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bsresearch.runtime import GLIBC

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")

# After SETUP, allocate 32 tensors of 8 MiB and free them, 20 times (a large step's activations and
# gradients); print the minor page faults this takes. 256 MiB at once is more than glibc's own adaptive
# thresholds keep, whatever blocks SETUP freed before (they rise to at most 32 MiB and 64 MiB).
PATTERN = textwrap.dedent("""
    import resource, sys, torch
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    {setup}
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        blocks = [torch.ones(1 << 21) for _ in range(32)]
        del blocks
    before = faults()
    for _ in range(20):
        blocks = [torch.ones(1 << 21) for _ in range(32)]
        del blocks
    print(faults() - before)
""")


def faults_after(setup: str) -> int:
    code = PATTERN.format(root=str(ROOT), tests=str(ROOT / "tests"), setup=setup)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


def test_retained_memory_is_reused_without_page_faults():
    default = faults_after("pass")
    retained = faults_after("from bsresearch.runtime import retain_freed_memory; assert retain_freed_memory()")
    assert default > 1000          # glibc's defaults hand the blocks back to the kernel: every step faults
    assert retained < default / 100


@pytest.mark.parametrize("setup", [
    "from conftest import tiny_config; from bsresearch.train import run; run(tiny_config())",
    "from conftest import tiny_config; from bsresearch.fused import train_group; "
    "train_group([tiny_config(seed=0), tiny_config(seed=1)])",
], ids=["run", "fused group"])
def test_runs_and_fused_groups_retain_freed_memory(setup):
    assert faults_after(setup) < 100


def test_a_cpu_run_records_the_processors_model_name_not_its_architecture():
    import platform

    import torch

    from bsresearch.runtime import cpu_name, device_name, provenance
    try:
        with open("/proc/cpuinfo") as f:
            expected = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pytest.skip("no model name in /proc/cpuinfo here")
    assert cpu_name() == expected != platform.machine()
    assert device_name(torch.device("cpu")) == provenance(torch.device("cpu"))["device_name"] == expected
