"""Specification of human-readable size parsing."""

from __future__ import annotations

import pytest

from freeride.core.units import parse_size
from freeride.errors import InvalidSpecError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * 2**30),
        ("512M", 512 * 10**6),
        ("1.5GB", 1_500_000_000),
        ("1000", 1000),
        (" 2 kib ", 2048),
        ("7B", 7),
        ("3 MiB", 3 * 2**20),
        ("2tb", 2 * 10**12),
        ("1Ti", 2**40),
        ("0", 0),
    ],
)
def test_parse_size_accepts_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_units_are_case_insensitive() -> None:
    assert parse_size("1gib") == parse_size("1GIB") == parse_size("1GiB") == 2**30


@pytest.mark.parametrize("text", ["12XB", "", "GB", "-1G", "1.2.3G", "4 G B", "1e3"])
def test_parse_size_rejects_malformed_sizes_naming_the_accepted_units(text: str) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message
    for unit in ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"):
        assert unit in message


def test_fractional_sizes_are_exact_when_the_result_is_whole() -> None:
    assert parse_size("4.1GB") == 4_100_000_000
    assert parse_size("2.01KB") == 2010
