"""Sizes written as text: a memory size ('2GiB' -> bytes, and bytes -> '2.0 GiB' for people), a list of sizes
('16,32,64' -> [16, 32, 64]) and a count ('4' -> 4: a number of devices, repeats, threads).

For the command line and for library settings alike (advise's AdviseConfig.memory_budget, a notebook's
parameter). A mistake is a ConfigError naming the setting. No import but errors.py; no torch.
"""
from __future__ import annotations

import re

from .errors import ConfigError

# Suffix (lower case) -> bytes: the decimal (k, kb, m, mb, ...) and the binary (kib, mib, ...) ones.
BYTE_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9,
              "gb": 10 ** 9, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "t": 10 ** 12, "tb": 10 ** 12,
              "tib": 2 ** 40, "bytes": 1}
# The binary units a size is shown in, largest first (what format_bytes writes and parse_bytes reads back).
BINARY_UNITS = (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))


def parse_bytes(text: str, name: str = "memory_budget") -> int:
    """'2GiB', '512MiB', '500MB', '1.5e9' -> bytes; ConfigError naming `name` otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in BYTE_UNITS:
        raise ConfigError(f"{name} must be a size such as 2GiB, 512MiB, 500MB or a number of bytes; got {text!r}")
    value = float(m.group(1)) * BYTE_UNITS[m.group(2).lower()]
    if value < 1:
        raise ConfigError(f"{name} must be at least one byte; got {text!r}")
    return int(value)


def byte_unit(largest: float) -> tuple[int, str]:
    """(bytes per unit, its name): the largest binary unit not above `largest` bytes, so that `largest` shows as
    a number from 1 to 1024 (a message's size, a memory axis); 'bytes' below 1 KiB."""
    for name, size in BINARY_UNITS:
        if largest >= size:
            return size, name
    return 1, "bytes"


def format_bytes(n: float) -> str:
    """A number of bytes for people, in the binary unit that fits: 512 -> '512 bytes', 1536 -> '1.5 KiB',
    2 ** 30 -> '1.0 GiB' (one decimal; parse_bytes reads it back to within that rounding)."""
    size, name = byte_unit(n)
    return f"{n:.0f} bytes" if size == 1 else f"{n / size:.1f} {name}"


def parse_ints(text: str, name: str) -> list[int]:
    """'16,32,64' -> [16, 32, 64]; every value a positive integer."""
    try:
        values = [int(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{name} must be a comma-separated list of positive integers; got {text!r}")
    return values


def parse_count(text: str | None, name: str, allow_zero: bool = False) -> int | None:
    """'4' -> 4; None stays None. A positive integer (with allow_zero, 0 too); ConfigError naming `name` and
    the accepted values otherwise ('0', '-1', '1.5', 'x')."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < (0 if allow_zero else 1):
        raise ConfigError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer "
                          f"({'0, ' if allow_zero else ''}1, 2, ...); got {text!r}")
    return value
