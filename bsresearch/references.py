"""References to a user's own code: ``path/to/file.py:NAME`` or ``package.module:NAME``. No torch.

A RunConfig's model, dataset and loss are a built-in name or such a reference. This module tells the two
apart, finds the file a reference names, writes it the same way wherever it is used, and fingerprints
the file (sha256), so that a run's id changes when the file changes. Running the user's code (which
imports torch) is bsresearch.loading's job.

Where a relative file is looked for:
- written in a sweep spec: in the spec's folder; on the command line: in the working directory
  (`resolve_in`, which the spec and the options call before a RunConfig is made);
- given to a RunConfig directly (a notebook, the library): under the project root (paths.project_root), then
  in the working directory.
`normalize` then writes it so that every process finds the same file whatever its working directory (a
sweep's workers run in their run folders, on other hosts too): relative to the bsresearch checkout when the
file is in it (paths.checkout_root, the same folder in every process), else absolute.

`identity` is how the run id names a reference: its file's path in the checkout when it is there (the ids
runs have always had), else its file's name, with the object's name (`model.py:make_model`); with the
sha256 of the file's content (`digest`), never where the file lies, so that a project folder moved or cloned
elsewhere finds its finished runs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .paths import checkout_root, project_root

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = rf"{_NAME}(\.{_NAME})*"
EXAMPLE = "examples/lm.py:make_model or mypackage.models:make_model"


@dataclass(frozen=True)
class Reference:
    """A parsed reference: `source` is a file path (is_file) or a dotted module name; `name` the object."""
    text: str
    source: str
    name: str
    is_file: bool


def looks_like_reference(value: object) -> bool:
    """Whether `value` is meant as a reference (it has a ':' after something), as opposed to a built-in name."""
    return isinstance(value, str) and ":" in value.strip(":")


def parse(text: str) -> Reference:
    """Split 'SOURCE:NAME'; ConfigError naming the accepted forms when it is not one."""
    source, sep, name = str(text).rpartition(":")
    if not sep or not source or not re.fullmatch(_NAME, name):
        raise ConfigError(f"must be FILE.py:NAME or package.module:NAME (e.g. {EXAMPLE}); got {text!r}")
    is_file = source.endswith(".py") or "/" in source or "\\" in source
    if not is_file and not re.fullmatch(_MODULE, source):
        raise ConfigError(f"{source!r} is neither a .py file nor a module name (e.g. {EXAMPLE})")
    return Reference(text, source, name, is_file)


def short_name(value: str) -> str:
    """A built-in name as it is; a reference as its file's name and the object ('lm.py:make_model'), for labels."""
    if not looks_like_reference(value):
        return value
    source, _, name = value.rpartition(":")
    return f"{Path(source).name}:{name}" if source.endswith(".py") or "/" in source else value


def find_file(source: str) -> Path | None:
    """The file a reference's path names: absolute as given; relative under the project root, then in the
    working directory. None when it is in neither."""
    path = Path(source).expanduser()
    candidates = [path] if path.is_absolute() else [project_root() / path, Path.cwd() / path]
    return next((c.resolve() for c in candidates if c.is_file()), None)


def _file_reference(text: str) -> Reference | None:
    """`text` parsed when it is a well-formed reference to a file; None for a built-in name, a module reference
    or a malformed value (RunConfig's validation names what is wrong with one)."""
    if not looks_like_reference(text):
        return None
    try:
        ref = parse(text)
    except ConfigError:
        return None
    return ref if ref.is_file else None


def normalize(text: str) -> str:
    """The reference written so that every process finds its file, whatever its working directory: relative
    to the bsresearch checkout when the file is in it, else absolute. A reference to a module, or to a file
    not found, is returned as it is (loading reports what is missing)."""
    ref = _file_reference(text)
    if ref is None:
        return text
    found = find_file(ref.source)
    if found is None:
        return text
    return f"{_in_checkout(found) or found}:{ref.name}"


def _in_checkout(path: Path) -> str | None:
    """`path` (resolved) relative to the bsresearch checkout, as posix, when it lies in it; else None."""
    checkout = checkout_root()
    return path.relative_to(checkout).as_posix() if checkout is not None and path.is_relative_to(checkout) else None


def identity(text: str) -> str:
    """How the run id names a reference: a file in the bsresearch checkout by its path there
    ('examples/lm.py:make_model'), any other file by its name ('model.py:make_model'), a module reference as
    written. Never where a project lies: the file's content enters the id through its sha256 (`digest`).
    ConfigError when the file cannot be found."""
    ref = parse(text)
    if not ref.is_file:
        return text
    found = find_file(ref.source)
    if found is None:
        digest(text)  # raises, naming where it looked
        raise AssertionError("unreachable")
    return f"{_in_checkout(found) or found.name}:{ref.name}"


def resolve_in(text: str, folder: Path, where: str) -> str:
    """A reference as written in a sweep spec (`folder`: the spec's folder) or on the command line (the
    working directory): a relative file is looked for in `folder` only, then the reference is written as
    `normalize` writes it. ConfigError naming the file and the folder searched (`where` says what the folder
    is) when the file is not there. A built-in name, a module reference or a malformed value is returned as it
    is (RunConfig's validation names what is wrong with it)."""
    ref = _file_reference(text)
    if ref is None:
        return text
    path = Path(ref.source).expanduser()
    full = path if path.is_absolute() else Path(folder) / path
    if not full.is_file():
        if path.is_absolute():
            raise ConfigError(f"file {ref.source!r} " + ("is a folder" if full.exists() else "does not exist"))
        raise ConfigError(f"file {ref.source!r} does not exist in {where} {Path(folder).resolve()}"
                          f"{_did_you_mean_path(path, Path(folder))}")
    return normalize(f"{full.resolve()}:{ref.name}")


def _did_you_mean_path(path: Path, folder: Path) -> str:
    """' (did you mean '../examples/lm.py'? ...)' when `path` names a file under the project root or in the
    working directory (where a reference was looked for before specs resolved them against their folder)."""
    for base in (project_root(), Path.cwd()):
        candidate = (base / path).resolve()
        if candidate.is_file():
            shown = os.path.relpath(candidate, Path(folder).resolve())
            return f" (did you mean {shown!r}? a relative path is relative to that folder)"
    return ""


def source_file(ref: Reference) -> Path | None:
    """The .py file that defines a reference's module (for a module reference: where import finds it,
    which imports its parent packages). None when there is none."""
    if ref.is_file:
        return find_file(ref.source)
    try:
        spec = importlib.util.find_spec(ref.source)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec else None
    return Path(origin) if origin and Path(origin).is_file() else None


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes (cached while its size and modification time stay the same)."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


def digest(text: str) -> tuple[str, str]:
    """(the file, its sha256) behind a reference; ConfigError when the file cannot be found."""
    ref = parse(text)
    path = source_file(ref)
    if path is None:
        where = (f"neither under the project root {project_root()} nor in the working directory {Path.cwd()}"
                 if ref.is_file and not Path(ref.source).is_absolute() else "")
        what = f"file {ref.source!r} does not exist" if ref.is_file else f"module {ref.source!r} cannot be found"
        raise ConfigError(what + (f" ({where})" if where else ""))
    return str(path), file_digest(path)
