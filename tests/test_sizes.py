"""bsresearch.sizes: sizes written as text, both ways. format_bytes is the one formatter of a number of bytes
for people (the fused planner's residency message, advise's memory budget, the memory figure's axis through
byte_unit); parse_bytes reads what it writes back."""
from __future__ import annotations

import pytest

from bsresearch.config import ConfigError
from bsresearch.sizes import BINARY_UNITS, byte_unit, format_bytes, parse_bytes, parse_count, parse_ints


@pytest.mark.parametrize("n, text", [
    (0, "0 bytes"), (1, "1 bytes"), (1023, "1023 bytes"),
    (1024, "1.0 KiB"), (1536, "1.5 KiB"), (3 * 1024, "3.0 KiB"),
    (2 ** 20 - 1, "1024.0 KiB"),                      # just under a MiB: still KiB, rounded up in the last digit
    (12.34 * 2 ** 20, "12.3 MiB"), (2 ** 30, "1.0 GiB"), (1.25 * 2 ** 40, "1.2 TiB"), (5000 * 2 ** 40, "5000.0 TiB"),
])
def test_format_bytes_writes_the_binary_unit_that_fits_with_one_decimal(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("largest, expected", [
    (0, (1, "bytes")), (1023.9, (1, "bytes")), (1024, (2 ** 10, "KiB")), (2 ** 20 - 1, (2 ** 10, "KiB")),
    (2 ** 20, (2 ** 20, "MiB")), (3 * 2 ** 30, (2 ** 30, "GiB")), (2 ** 40, (2 ** 40, "TiB")),
])
def test_byte_unit_is_the_largest_unit_not_above_the_size(largest, expected):
    size, name = byte_unit(largest)
    assert (size, name) == expected
    assert 1 <= largest / size < 1024 or size in (1, 2 ** 40)


def test_binary_units_are_largest_first_and_parse_bytes_knows_each():
    sizes = [size for _, size in BINARY_UNITS]
    assert sizes == sorted(sizes, reverse=True)
    for name, size in BINARY_UNITS:
        assert parse_bytes(f"1{name}") == size


@pytest.mark.parametrize("n", [1, 700, 1024, 5000, 123_456, 7 * 2 ** 20 + 12345, 3 * 2 ** 30 + 1, 2 ** 41 + 99])
def test_parse_bytes_reads_format_bytes_back_within_its_rounding(n):
    size, _ = byte_unit(n)
    back = parse_bytes(format_bytes(n))
    assert abs(back - n) <= 0.05 * size + 1   # one decimal of the unit (and int() of the product)


def test_parse_bytes_decimal_and_binary_suffixes_and_the_mistakes_it_names():
    assert parse_bytes("2GiB") == 2 * 2 ** 30 and parse_bytes("500MB") == 500 * 10 ** 6
    assert parse_bytes("1.5e3") == 1500 and parse_bytes("64 KiB") == 65536 and parse_bytes("512 bytes") == 512
    for bad in ("", "lots", "2 GiBs", "-1GiB"):
        with pytest.raises(ConfigError, match="--memory-budget must be a size such as 2GiB"):
            parse_bytes(bad, "--memory-budget")
    with pytest.raises(ConfigError, match="--memory-budget must be at least one byte; got '0.1'"):
        parse_bytes("0.1", "--memory-budget")


def test_parse_ints_and_parse_count_name_the_setting():
    assert parse_ints("16, 32,64", "--batch-sizes") == [16, 32, 64]
    with pytest.raises(ConfigError, match="--batch-sizes must be a comma-separated list of positive integers"):
        parse_ints("16,0", "--batch-sizes")
    assert parse_count("4", "--devices") == 4 and parse_count(None, "--devices") is None
    assert parse_count("0", "--threads", allow_zero=True) == 0
    for bad in ("0", "-1", "1.5", "x"):
        with pytest.raises(ConfigError, match=r"--devices must be a positive integer \(1, 2, ...\)"):
            parse_count(bad, "--devices")
