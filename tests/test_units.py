from __future__ import annotations

import pytest

from marconi.core.units import format_size, parse_size


@pytest.mark.parametrize("text,expected", [
    ("2GB", 2_000_000_000), ("2GiB", 2 * 2**30), ("1500", 1500), (" 1.5 MB ", 1_500_000),
    ("0", 0), (4096, 4096), ("3e3", 3000)])
def test_parse(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["-1", "2 parsecs", "", "GB", -5, True])
def test_bad_sizes_name_the_value(text: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)  # type: ignore[arg-type]


def test_format() -> None:
    assert format_size(2_000_000_000) == "2.00 GB"
    assert format_size(12) == "12 B"
