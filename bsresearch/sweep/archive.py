"""Carry a sweep's finished runs to another machine: `bsresearch sweep SPEC --pack FOLDER`, then `--unpack FOLDER`.

A sweep that outlives its machine (a preemptible node, a session that ends, a laptop that goes home) keeps its
finished runs as a folder of archives, one per pack. Each archive, FOLDER/<sweep>-<UTC time>-<machine>.tar.xz,
holds the result files of the runs that had finished (ok or diverged) and were in no earlier archive of FOLDER:
config.json, status.json, history.csv, metrics.json and run.ipynb when there is one; never a checkpoint (a
finished run needs none). Unpacking writes into RUNS/<sweep>/ every archived run of the spec that has not
finished there, so that the sweep skips it and results.load reads it like any other run; each run's status.json
still names the machine and the commit that ran it, and the captions of its report name them all.

Only points of the spec are packed or restored (run ids are derived from the configs, so an archive of another
spec, or of an edited one, restores nothing), and a run finished on disk is never written over. An unpack that
is killed leaves each run it was writing without status.json: the next sweep redoes it.
"""
from __future__ import annotations

import io
import itertools
import json
import lzma
import re
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..rundir import FINISHED_STATES, atomic_write_bytes
from .runner import PlannedRun, plan, sweep_state, write_manifest
from .spec import SweepSpec, expand, runs_folder
from .task import BUSY

RESULT_FILES = ("config.json", "history.csv", "metrics.json", "run.ipynb", "status.json")  # status.json last
SUFFIX = ".tar.xz"


def archives(folder: Path, sweep: str) -> list[Path]:
    """FOLDER's archives of `sweep`, oldest first (their names start with the UTC time of the pack)."""
    pattern = re.compile(re.escape(sweep) + r"-\d{8}T\d{6}Z(-[a-z0-9-]+)?" + re.escape(SUFFIX))
    return sorted(p for p in Path(folder).glob(f"{sweep}-*{SUFFIX}") if pattern.fullmatch(p.name))


def _members(archive: Path) -> dict[str, dict[str, bytes]]:
    """run id -> {file name: contents} of one archive's finished runs; other names are ignored."""
    runs: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar:
                run_id, sep, name = member.name.partition("/")
                if not (member.isfile() and sep and name in RESULT_FILES and re.fullmatch(r"[0-9a-f]+", run_id)):
                    continue
                data = tar.extractfile(member)
                if data is not None:
                    runs.setdefault(run_id, {})[name] = data.read()
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:   # read whole before anything is written
        raise ConfigError(f"{archive}: not a readable archive ({' '.join(str(exc).split()) or type(exc).__name__}); "
                          f"move it out of {archive.parent} to use the others") from None
    return {run_id: files for run_id, files in runs.items() if _finished(files)}


def _finished(files: dict[str, bytes]) -> bool:
    try:
        return json.loads(files.get("status.json", b"{}")).get("state") in FINISHED_STATES
    except (ValueError, AttributeError):
        return False


def _finished_on_disk(planned: PlannedRun) -> bool:
    return planned.action == "skip" and planned.found in FINISHED_STATES


@dataclass(frozen=True)
class Packed:
    archive: Path | None   # None when there was nothing new to pack
    runs: int              # runs written into it
    earlier: int           # finished runs already in FOLDER's archives
    unfinished: int        # runs of the spec not finished on disk (not packed)
    busy: int = 0          # runs a live process holds (a sweep still running them, or their fused group): not packed

    def summary(self, sweep: str, folder: Path) -> str:
        rest = f"{self.earlier} already in {folder}'s archives, {self.unfinished} not finished here"
        rest += f", {self.busy} held by a running sweep (pack after it ends)" if self.busy else ""
        if self.archive is None:
            return f"sweep {sweep}: nothing new to pack ({rest})"
        return f"sweep {sweep}: {self.runs} finished run(s) packed into {self.archive} ({rest})"


def pack(spec: SweepSpec, folder: str | Path, runs_root: str | Path | None = None,
         machine: str = "") -> Packed:
    """Write the spec's finished runs that no archive in `folder` holds yet into a new archive there.
    machine: a filename-safe label of this machine for the archive's name (bench.device_label)."""
    folder = Path(folder)
    planned = sweep_state(spec, runs_root)
    earlier: set[str] = set()
    for archive in archives(folder, spec.name):
        earlier |= set(_members(archive))
    finished = [p for p in planned if _finished_on_disk(p)]
    new = [p for p in finished if p.point.run_id not in earlier]
    busy = sum(p.action == BUSY for p in planned)
    unfinished = len(planned) - len(finished) - busy
    if not new:
        return Packed(None, 0, len(finished), unfinished, busy)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    stem = f"{spec.name}-{stamp}{'-' + machine if machine else ''}"
    path = folder / f"{stem}{SUFFIX}"
    for k in itertools.count(2):   # two packs within a second: the second never replaces the first
        if not path.exists():
            break
        path = folder / f"{stem}-{k}{SUFFIX}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for p in new:
            for name in RESULT_FILES:
                source = p.run_dir / name
                if source.exists():
                    tar.add(source, arcname=f"{p.point.run_id}/{name}")
    atomic_write_bytes(path, buffer.getvalue())
    return Packed(path, len(new), len(finished) - len(new), unfinished, busy)


@dataclass(frozen=True)
class Unpacked:
    restored: int          # runs written into RUNS/<sweep>/
    kept: int              # archived runs already finished (or running) on disk, left as they are
    foreign: int           # archived runs that are not points of the spec

    def summary(self, sweep: str, folder: Path, sweep_dir: Path) -> str:
        return (f"sweep {sweep}: {self.restored} finished run(s) restored from {folder} into {sweep_dir} "
                f"({self.kept} already there, {self.foreign} not points of this spec)")


def unpack(spec: SweepSpec, folder: str | Path, runs_root: str | Path | None = None) -> Unpacked:
    """Restore the finished runs archived in `folder` into the spec's run directories (see the module's text)."""
    folder = Path(folder)
    found = archives(folder, spec.name) if folder.is_dir() else []
    if not found:
        raise ConfigError(f"--unpack {folder}: no archive of sweep {spec.name!r} there "
                          f"({spec.name}-<time>-<machine>{SUFFIX}, as --pack writes them)")
    points, sweep_dir = expand(spec), runs_folder(spec, runs_root) / spec.name
    planned = {p.point.run_id: p for p in plan(points, sweep_dir)}
    restored: set[str] = set()
    kept = foreign = 0
    for members in [_members(archive) for archive in found]:   # every archive read before any run is written
        for run_id, files in members.items():
            target = planned.get(run_id)
            if target is None:
                foreign += 1
                continue
            if run_id in restored or _finished_on_disk(target) or target.action == BUSY:
                kept += 1
                continue
            if target.run_dir.exists():
                shutil.rmtree(target.run_dir)    # a failed or interrupted attempt here: the finished run replaces it
            for name in RESULT_FILES:
                if name in files:
                    atomic_write_bytes(target.run_dir / name, files[name])
            restored.add(run_id)
    if restored:
        write_manifest(spec, sweep_dir, points)   # results.load reads the restored runs as the sweep's
    return Unpacked(len(restored), kept, foreign)
