"""Table-driven tests of the quantity parsers in common/quantity.py."""

import pytest

from gosched.common.errors import QuantityError
from gosched.common.quantity import format_bytes, format_milli, parse_bytes, parse_count, parse_milli

GI = 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2000),
        ("500m", 500),
        ("0.25", 250),
        ("1.5", 1500),
        (".5", 500),
        ("1.", 1000),
        ("0", 0),
        ("0m", 0),
        ("2500m", 2500),
        (" 2 ", 2000),
        ("1e3", 1_000_000),
        ("1E-3", 1),
        ("2.5e1m", 25),
        (2, 2000),
        (0.5, 500),
        (0, 0),
        (100_000, 100_000_000),
        ("0.0001", 0),  # below a thousandth: rounds to 0
    ],
)
def test_parse_milli(text: str | int | float, expected: int) -> None:
    assert parse_milli(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", 16 * GI),
        ("512Mi", 512 * 2**20),
        ("1Ki", 1024),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1.5Gi", 3 * GI // 2),
        ("1G", 10**9),
        ("1k", 1000),
        ("1K", 1000),
        ("512M", 512 * 10**6),
        ("2T", 2 * 10**12),
        ("1P", 10**15),
        ("1048576", 2**20),
        ("1e3Mi", 1000 * 2**20),
        (" 4Gi ", 4 * GI),
        (1024, 1024),
        (0, 0),
        (1.5e9, 1_500_000_000),
    ],
)
def test_parse_bytes(text: str | int | float, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("2", 2),
        ("16", 16),
        ("2.0", 2),
        ("1e3", 1000),
        (" 7 ", 7),
        (8, 8),
        (3.0, 3),
    ],
)
def test_parse_count(text: str | int | float, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "reason"),
    [
        (parse_milli, "", "not a quantity"),
        (parse_milli, "abc", "not a quantity"),
        (parse_milli, "2 cores", "is not a quantity"),  # no space before a unit
        (parse_milli, "1,5", "not a quantity"),
        (parse_milli, "-1", "is negative"),
        (parse_milli, -1, "negative"),
        (parse_milli, -0.5, "negative"),
        (parse_milli, "2Gi", "unit 'Gi' is not allowed"),
        (parse_milli, "2k", "unit 'k' is not allowed"),
        (parse_milli, True, "boolean"),
        (parse_milli, None, "got NoneType"),
        (parse_milli, [1], "got list"),
        (parse_bytes, "16GB", "unknown unit 'GB'"),
        (parse_bytes, "16gi", "unknown unit 'gi'"),
        (parse_bytes, "5m", "unknown unit 'm'"),
        (parse_bytes, "1Ei", "unknown unit 'Ei'"),
        (parse_bytes, "Gi", "not a quantity"),
        (parse_bytes, "1 2Gi", "not a quantity"),
        (parse_bytes, -1, "negative"),
        (parse_bytes, False, "boolean"),
        (parse_bytes, b"1Gi", "got bytes"),
        (parse_count, "1.5", "whole number"),
        (parse_count, 0.5, "whole number"),
        (parse_count, -2, "whole number"),
        (parse_count, "2m", "takes no unit"),
        (parse_count, "4Gi", "takes no unit"),
        (parse_count, "x", "not a quantity"),
        (parse_count, True, "boolean"),
    ],
)
def test_bad_quantities(parse: object, text: object, reason: str) -> None:
    with pytest.raises(QuantityError, match=reason):
        parse(text)  # type: ignore[operator]


def test_what_names_the_quantity_in_the_message() -> None:
    with pytest.raises(QuantityError, match=r"^cpu 'x' is not a quantity"):
        parse_milli("x", "cpu")


# -- exactness and non-finite input --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_milli, float("nan")),
        (parse_milli, float("inf")),
        (parse_milli, "1e400"),
        pytest.param(parse_milli, 10**400, id="parse_milli-10**400"),
        (parse_bytes, float("inf")),
        (parse_count, float("nan")),
    ],
)
def test_non_finite_quantities_raise_quantity_error(parse: object, text: object) -> None:
    with pytest.raises(QuantityError):
        parse(text)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("parse", "value"),
    [(parse_bytes, 2**53 + 1), (parse_count, 2**62 + 1), (parse_milli, 2**52 + 1)],
)
def test_large_ints_are_exact(parse: object, value: int) -> None:
    expected = value * 1000 if parse is parse_milli else value
    assert parse(value) == expected  # type: ignore[operator]


@pytest.mark.parametrize("milli", [0, 1, 500, 1000, 2500, 64000])
def test_format_milli_round_trips(milli: int) -> None:
    assert parse_milli(format_milli(milli)) == milli


@pytest.mark.parametrize("n", [0, 512, 1024, 16 * GI, 3 * GI // 2, 2**40])
def test_format_bytes_round_trips(n: int) -> None:
    assert parse_bytes(format_bytes(n)) == n


@pytest.mark.parametrize("n", [2**20 + 1024, 12345 * 2**20])
def test_format_bytes_is_exact(n: int) -> None:
    assert parse_bytes(format_bytes(n)) == n
