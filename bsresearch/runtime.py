"""Device choice, threads, seeded generators, autocast, synchronized timing and provenance.

The entry point (train.run, the CLI, a notebook) chooses the device here; library functions never do,
they follow the device of the tensors they are given.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError, device_message
from .source import git_commit

PACKAGE_ROOT = Path(__file__).resolve().parent


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> the first CUDA device if there is one, else the CPU. Asking for CUDA without one is an error."""
    if not isinstance(name, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", name):
        raise ConfigError(device_message(name))
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} was asked for but torch sees no CUDA device "
                              f"(torch {torch.__version__}); use device 'cpu' or 'auto'")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device(name)


# Out of memory has a type on CUDA (torch.OutOfMemoryError) and in Python (MemoryError), but not in
# torch's CPU allocator: c10's DefaultCPUAllocator raises a plain RuntimeError, "[enforce fail at
# alloc_cpu.cpp:...] . DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error
# code 12 (Cannot allocate memory)" ("not enough memory" on Windows). That message is matched here, and
# nowhere else. Other RuntimeErrors that mention memory (e.g. "CUDA error: out of memory", which can
# leave the CUDA context unusable) are not treated as a recoverable OOM.
_CPU_ALLOCATOR_OOM = re.compile(r"DefaultCPUAllocator: (can't allocate memory|not enough memory)")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` means "out of memory", wherever it was raised (model build, .to(device), a step).

    The one classification used by train.run, the sweep worker and the systems search: by type where
    one exists; by message only for the CPU allocator's RuntimeError, which has no type of its own.
    """
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return type(exc) is RuntimeError and _CPU_ALLOCATOR_OOM.search(str(exc)) is not None


def oom_message(exc: BaseException) -> str:
    """The first line of an out-of-memory error (the allocator's advice that follows is long)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def prepare_process(threads: int) -> None:
    """What every training process sets before it builds anything: torch's threads (set_threads) and an
    allocator that keeps the memory each step frees (retain_freed_memory)."""
    set_threads(threads)
    retain_freed_memory()


def set_threads(threads: int) -> None:
    """Torch intra-op threads for this process (0 keeps torch's default).

    One thread per process is fastest for the small models here on a 2-core machine; use worker
    processes, not threads, to fill the cores.
    """
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"   # where retain_freed_memory applies
# glibc's mallopt parameters (malloc.h) and the values retain_freed_memory sets
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
RETAIN_SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20))


def retain_freed_memory() -> bool:
    """Keep the memory a training step frees in this process for the next step; True where set (glibc).

    By default glibc serves each block from 128 KiB up through mmap (the threshold then rises with what
    is freed) and hands the heap's free top back to the kernel, so the activations and gradients a step
    frees return to the kernel and the next step faults fresh, zeroed pages in: hundreds of thousands of
    page faults a minute for cnn1d at batch 4000. This sets blocks up to 32 MiB (the most glibc accepts)
    to come from the heap, trims the heap only above 1 GiB free, and grows it 64 MiB at a time. The
    numbers a run computes do not change; its resident memory stays near its peak. Elsewhere (musl,
    macOS, Windows) it does nothing. benchmarks/allocator.py measures what it gains.
    """
    if not GLIBC:
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return all(mallopt(parameter, value) == 1 for parameter, value in RETAIN_SETTINGS)


def derive_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for one purpose ('init', 'data', 'probe', ...), stable across Python runs."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def make_generator(seed: int, purpose: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator for one purpose, so e.g. data order does not shift the initial weights."""
    return torch.Generator(device=device).manual_seed(derive_seed(seed, purpose))


@contextlib.contextmanager
def model_randomness(seed: int, device: torch.device, state: dict[str, torch.Tensor] | None = None) -> Iterator[None]:
    """The global RNG a model draws from while it trains (dropout in a user's model: the library itself
    never draws from it), seeded from the run's seed for the 'model' purpose, or set to a saved `state`
    (global_rng_state, at a resume); the caller's global RNG state is restored afterwards."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(derive_seed(seed, "model"))
        if state:
            torch.set_rng_state(state["cpu"])
            if device.type == "cuda" and "cuda" in state:
                torch.cuda.set_rng_state(state["cuda"], device)
        yield


def global_rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The global RNG's state on the CPU (and on `device` when it is CUDA), for a checkpoint."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


@dataclass
class Generators:
    """Separate random streams of a run. `init` lives on the CPU so weights match across devices."""
    init: torch.Generator
    data: torch.Generator
    probe: torch.Generator

    @classmethod
    def from_seed(cls, seed: int, device: torch.device) -> Generators:
        return cls(init=make_generator(seed, "init"),
                   data=make_generator(seed, "data", device),
                   probe=make_generator(seed, "probe", device))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name).get_state() for name in ("init", "data", "probe")}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, value in state.items():
            getattr(self, name).set_state(value)


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"precision 'fp16' needs a CUDA device (it uses a GradScaler); got device "
                          f"{device.type!r}. Use 'bf16' or 'fp32' on the CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("precision 'bf16' is not supported by this GPU; use 'fp16' or 'fp32'")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass: a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_name() -> str:
    """The processor's model name, as lscpu prints it ("AMD EPYC", "Intel Xeon Processor"): /proc/cpuinfo's
    'model name', else what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        name = ""
    return name or platform.processor() or platform.machine() or "cpu"


def device_name(device: torch.device) -> str:
    """The GPU's model, or the CPU's: what every result names beside its numbers (runs record it in status.json)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def provenance(device: torch.device) -> dict[str, object]:
    """Where and with what a result was computed; stored in every run's status.json."""
    from . import __version__
    return {
        "bsresearch": __version__,
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
