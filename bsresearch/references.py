"""References to a user's own code: ``path/to/file.py:NAME`` or ``package.module:NAME``. No torch.

A RunConfig's model, dataset and loss are a built-in name or such a reference. This module tells the two
apart, finds the file a reference names, writes it the same way wherever it is used, and fingerprints
the file (sha256), so that a run's id changes when the file changes. Running the user's code (which
imports torch) is bsresearch.loading's job.

Where a relative file is looked for: under the project root (paths.project_root), then in the working
directory. `normalize` writes a reference found there so that it is found from any working directory (a
sweep's workers run in their run folders): relative to the project root when the file is under it, else
absolute.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .paths import project_root

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


def normalize(text: str) -> str:
    """The reference written so that any working directory finds its file: relative to the project root
    when the file is under it, else absolute. A reference to a module, or to a file not found, is
    returned as it is (loading reports what is missing)."""
    if not looks_like_reference(text):
        return text
    try:
        ref = parse(text)
    except ConfigError:
        return text
    if not ref.is_file:
        return text
    found = find_file(ref.source)
    if found is None:
        return text
    root = project_root().resolve()
    shown = found.relative_to(root).as_posix() if found.is_relative_to(root) else str(found)
    return f"{shown}:{ref.name}"


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
