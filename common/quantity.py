"""Parsing of human resource quantities: "2", "500m", "1.5", "16Gi", "512M".

Arithmetic is exact (Decimal), so large byte counts keep every byte; results round half up.
"""

import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from gosched.common.errors import QuantityError

_NUMBER = re.compile(r"^\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)([A-Za-z]*)\s*$")

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_LIMIT = Decimal(2**63 - 1)  # what the node arrays (int64) can hold


def _split(text: str | int | float, what: str) -> tuple[Decimal, str]:
    if isinstance(text, bool):
        raise QuantityError(f"{what} must be a number or a quantity string, not a boolean")
    if isinstance(text, int):
        return Decimal(text), ""
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{what} {text!r} is not a finite number")
        return Decimal(repr(text)), ""
    if not isinstance(text, str):
        raise QuantityError(f"{what} must be a number or a quantity string, got {type(text).__name__}")
    match = _NUMBER.match(text)
    if match is None:
        raise QuantityError(f"{what} {text!r} is not a quantity (examples: 2, 500m, 16Gi)")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid numbers
        raise QuantityError(f"{what} {text!r} is not a quantity") from exc
    return value, suffix


def _whole(value: Decimal, text: object, what: str) -> int:
    if value < 0:
        raise QuantityError(f"{what} {text!r} is negative")
    if value > _LIMIT:
        raise QuantityError(f"{what} {text!r} is too large")
    return int(value.to_integral_value(rounding=ROUND_HALF_UP))


def parse_milli(text: str | int | float, what: str = "quantity") -> int:
    """CPU-style quantity to thousandths: "2" -> 2000, "500m" -> 500, "0.25" -> 250."""
    value, suffix = _split(text, what)
    if suffix == "m":
        milli = value
    elif suffix == "":
        milli = value * 1000
    else:
        raise QuantityError(f"{what} {text!r}: unit {suffix!r} is not allowed here (use a number or 'm')")
    return _whole(milli, text, what)


def parse_bytes(text: str | int | float, what: str = "memory") -> int:
    """Memory-style quantity to bytes: "16Gi", "512Mi", "1G", "1048576"."""
    value, suffix = _split(text, what)
    if suffix in _BINARY:
        scaled = value * _BINARY[suffix]
    elif suffix in _DECIMAL:
        scaled = value * _DECIMAL[suffix]
    elif suffix == "":
        scaled = value
    else:
        raise QuantityError(
            f"{what} {text!r}: unknown unit {suffix!r} (use Ki, Mi, Gi, Ti, Pi, k, M, G, T, P)"
        )
    return _whole(scaled, text, what)


def parse_count(text: str | int | float, what: str = "count") -> int:
    """A whole, non-negative count; "2" -> 2. Fractions are refused."""
    value, suffix = _split(text, what)
    if suffix:
        raise QuantityError(f"{what} {text!r}: a count takes no unit")
    if value < 0 or value != value.to_integral_value():
        raise QuantityError(f"{what} {text!r} must be a whole number >= 0")
    return _whole(value, text, what)


def format_bytes(n: int) -> str:
    """The largest binary unit that divides `n` exactly (so parse_bytes(format_bytes(n)) == n)."""
    for unit, size in (("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def format_milli(m: int) -> str:
    return f"{m // 1000}" if m % 1000 == 0 else f"{m}m"
