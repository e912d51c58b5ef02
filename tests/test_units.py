"""Human units: both prefix systems accepted, anything else rejected with an example."""

import pytest

from optpipe.errors import OptPipeError
from optpipe.units import (format_bytes, format_seconds, parse_bandwidth, parse_bytes,
                           parse_seconds)


@pytest.mark.parametrize("text, expected", [
    ("80GB", 80 * 10**9), ("80GiB", 80 * 2**30), ("81920MiB", 80 * 2**30),
    ("1.5GiB", 3 * 2**29), ("512 MiB", 512 * 2**20), ("0", 0), (1234, 1234), ("10kb", 10_000),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("18.5ms", 0.0185), ("1.2s", 1.2), ("300us", 3e-4), ("2", 2.0), (0.5, 0.5), ("1e-3s", 1e-3),
])
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == pytest.approx(expected)


def test_parse_bandwidth():
    assert parse_bandwidth("25GB/s") == 25e9
    assert parse_bandwidth("1GiB/s") == 2**30


@pytest.mark.parametrize("bad", ["80 gigs", "GB", "-1GB", "80XB", "", "1.2.3GB", True])
def test_bad_bytes_show_an_accepted_form(bad):
    with pytest.raises(OptPipeError, match="80GiB"):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", ["5 parsecs", "ms", "-3ms"])
def test_bad_seconds_show_an_accepted_form(bad):
    with pytest.raises(OptPipeError, match="18.5ms"):
        parse_seconds(bad)


@pytest.mark.parametrize("bad", ["25GB", "fast", 0, "0GB/s"])
def test_bad_bandwidth(bad):
    with pytest.raises(OptPipeError, match="GB/s"):
        parse_bandwidth(bad)


def test_formatting():
    assert format_bytes(3 * 2**29) == "1.50 GiB"
    assert format_bytes(100) == "100 B"
    assert format_seconds(0.0185) == "18.50 ms"
    assert format_seconds(2.5) == "2.500 s"


def test_a_budget_flag_without_a_unit_must_be_bytes_for_real() -> None:
    """``--mem 80`` would be 80 bytes: refused with the units to write; a plain count
    of bytes (``80e9``) and any value with a unit are taken."""
    from optpipe.units import parse_budget_flag
    with pytest.raises(OptPipeError, match="no unit, so it means 80 bytes"):
        parse_budget_flag("80", "--mem")
    assert parse_budget_flag("80000000000", "--mem") == 80 * 10**9
    assert parse_budget_flag("80e9", "--mem") == 80 * 10**9
    assert parse_budget_flag("512KiB", "--mem") == 512 * 2**10
