"""``resource.Quantity`` as the API server parses and prints it (pure).

A port of k8s.io/apimachinery/pkg/api/resource v0.35.4 (``quantity.go``: ``parseQuantityString``,
``ParseQuantity``, ``CanonicalizeBytes``; ``suffix.go``; ``amount.go``: ``AsCanonicalBytes``,
``AsCanonicalBase1024Bytes``), with exact arithmetic (``fractions.Fraction``) in place of int64/inf.Dec:

* the suffix family is kept: decimal SI (``m``, ``k``, ``M``...) and decimal exponents (``e3``) print in
  their family; binary SI (``Ki``, ``Mi``...) prints binary when the value is a whole number of at least
  1024 in magnitude, else decimal SI (``0.5Gi`` -> ``512Mi``, ``0.1Gi`` -> ``107374182400m``,
  ``1.5Ki`` -> ``1536``);
* canonical form: no fractional digits, the largest exponent (a multiple of 3 for decimal, of 10 for
  binary) that loses nothing (``0.5`` -> ``500m``, ``1000m`` -> ``1``, ``1024Mi`` -> ``1Gi``);
* a value finer than 1n is rounded up (away from zero) to the next 1n; a binary value above 2^63-1 is
  capped there;
* a string ``ParseQuantity`` finds already canonical is kept as it was written, sign and leading zeros
  included (``+1`` stays ``+1``, ``01`` stays ``01``): the fast path's "reuse the string" rule (decimal:
  the scale a multiple of 3, the digits neither ending in ``000`` nor starting with ``0``; binary: the
  number's low three bits not all zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

Format = Literal["DecimalExponent", "BinarySI", "DecimalSI"]

SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT = f"quantities must match the regular expression '{SPLIT_RE}'"
ERR_NUMERIC = "unable to parse numeric part of quantity"
ERR_SUFFIX = "unable to parse quantity's suffix"

_DIGITS = "0123456789"
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_OUT = {e: s for s, e in _DECIMAL.items()}
_BINARY_OUT = {e // 10: s for s, e in _BINARY.items()}
_MAX_INT64 = (1 << 63) - 1
_NANO = Fraction(1, 10**9)
_MAX_EXPONENT = 1000
"""Not Go's: an exponent beyond this (``1e99999999``) is refused rather than computed exactly."""


class QuantityError(ValueError):
    """Not a quantity; the message is the Go error's (``ErrFormatWrong``, ``ErrNumeric``, ``ErrSuffix``)."""


@dataclass(frozen=True)
class Quantity:
    value: Fraction
    format: Format
    text: str = ""
    """The string as written, when ``ParseQuantity`` keeps it (already canonical); else empty."""
    scale: int | None = None
    """The power of ten of Go's int64 form (``int64Amount.scale``); None: held as an ``inf.Dec``."""

    def __str__(self) -> str:
        return self.text or canonical_of(self.value, self.format)


def _split(s: str) -> tuple[bool, str, str, str, str]:
    """``parseQuantityString``: (positive, value, numerator, denominator, suffix)."""
    positive, pos, end = True, 0, len(s)
    if pos < end and s[0] in "+-":
        positive = s[0] == "+"
        pos += 1
    while True:  # leading zeros
        if pos >= end:
            return positive, "0", "0", "", ""
        if s[pos] != "0":
            break
        pos += 1
    i = pos
    while i < end and s[i] in _DIGITS:
        i += 1
    if i >= end:
        return positive, s, s[pos:], "", ""
    num, pos = s[pos:i] or "0", i
    denom = ""
    if s[pos] == ".":
        pos += 1
        i = pos
        while i < end and s[i] in _DIGITS:
            i += 1
        if i >= end:
            return positive, s, num, s[pos:], ""
        denom, pos = s[pos:i], i
    value, start = s[:pos], pos
    i = pos
    while i < end and s[i] in "eEinumkKMGTP":
        i += 1
    if i >= end:
        return positive, value, num, denom, s[start:]
    pos = i
    if s[pos] in "+-":
        pos += 1
    i = pos
    while i < end and s[i] in _DIGITS:
        i += 1
    if i >= end:
        return positive, value, num, denom, s[start:]
    raise QuantityError(ERR_FORMAT)


def _interpret(suffix: str) -> tuple[int, int, Format]:
    """``suffixer.interpret``: (base, exponent, format)."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix], "DecimalSI"
    if suffix in _BINARY:
        return 2, _BINARY[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[0] in "+-" else digits
        if body and all(c in _DIGITS for c in body):
            parsed = int(digits)
            if abs(parsed) <= _MAX_EXPONENT:
                return 10, parsed, "DecimalExponent"
    raise QuantityError(ERR_SUFFIX)


def _inf_dec(value: str) -> Fraction:
    """``inf.Dec.SetString``: an optional sign, digits with at most one point, at least one digit."""
    body = value[1:] if value[:1] in ("+", "-") else value
    whole, _, frac = body.partition(".")
    if not (whole or frac) or not all(c in _DIGITS for c in whole + frac):
        raise QuantityError(ERR_NUMERIC)
    out = Fraction(int(whole + frac or "0"), 10 ** len(frac))
    return -out if value.startswith("-") else out


def parse(text: str) -> Quantity:
    """``ParseQuantity`` (after ``UnmarshalJSON``'s quote stripping and ``strings.TrimSpace``)."""
    s = text
    if not s:
        raise QuantityError(ERR_FORMAT)
    if s == "0":
        return Quantity(Fraction(0), "DecimalSI", s, 0)
    positive, value, num, denom, suffix = _split(s)
    base, exponent, fmt = _interpret(suffix)
    precision, scale, mantissa = 0, 0, 1
    if fmt in ("DecimalExponent", "DecimalSI"):
        scale = exponent
        precision = 18 - (len(num) + len(denom))  # maxInt64Factors
    elif exponent >= 0 and not denom:
        mantissa = 1 << exponent
        precision = 15 - len(num) - exponent * 3 // 10 - 1
    else:
        precision = -1
    if precision >= 0:
        scale -= len(denom)
        if scale >= -9:
            shifted = num + denom
            number = int(shifted)
            result = number * mantissa
            if -(1 << 63) <= result <= _MAX_INT64:  # int64Multiply
                if not positive:
                    result = -result
                amount = Fraction(result) * Fraction(10) ** scale
                if fmt == "BinarySI":
                    keep = exponent % 10 == 0 and number & 0x07 != 0
                else:
                    keep = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
                return Quantity(amount, fmt, s if keep else "", scale)
    amount = _inf_dec(value)
    amount *= Fraction(10) ** exponent if base == 10 else 1 << exponent
    negative = amount < 0
    amount = abs(amount)
    if amount:
        amount = math.ceil(amount / _NANO) * _NANO  # inf.RoundUp at Nano: "you should get some resources"
    if fmt == "BinarySI" and amount > _MAX_INT64:
        amount = Fraction(_MAX_INT64)
    if fmt == "BinarySI" and 0 < amount < 1:
        fmt = "DecimalSI"
    return Quantity(-amount if negative else amount, fmt)


def round_up(q: Quantity, scale: int = -3) -> Quantity:
    """``Quantity.RoundUp(scale)``: away from zero to a multiple of 10^scale. An int64 form already that
    coarse is left alone, its string kept; otherwise the string is dropped (printed canonical again).
    ``SetDefaults_ResourceList`` (kubernetes pkg/apis/core/v1/defaults.go) does this at -3 to every value
    of every ``ResourceList`` (a container's requests and limits, ...): ``1n`` is stored as ``1m``."""
    if q.scale is not None and q.scale >= scale:
        return q
    unit = Fraction(10) ** scale
    rounded = math.ceil(abs(q.value) / unit) * unit
    return Quantity(
        -rounded if q.value < 0 else rounded, q.format, "", scale if q.scale is not None else None
    )


def _decimal_parts(value: Fraction) -> tuple[int, int]:
    """``AsCanonicalBytes``: (mantissa, exponent) with the exponent a multiple of 3, no digit lost."""
    exponent = 0
    while value.denominator != 1:
        value *= 10
        exponent -= 1
    mantissa = int(value)
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3
    return mantissa * 10**shift, exponent - shift


def canonical_of(value: Fraction, fmt: Format) -> str:
    """``CanonicalizeBytes``: the number and its suffix."""
    if value == 0:
        return "0"
    if fmt == "BinarySI" and (-1024 < value < 1024 or value.denominator != 1):
        fmt = "DecimalSI"  # too small, or not a whole number: "don't lose precision"
    if fmt == "BinarySI":
        number, power = int(value), 0
        while number % 1024 == 0:
            number //= 1024
            power += 1
        return f"{number}{_BINARY_OUT.get(power, '')}"
    mantissa, exponent = _decimal_parts(value)
    if fmt == "DecimalExponent":
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DECIMAL_OUT.get(exponent, '')}"


def canonical(text: str) -> str:
    """What the API server stores and answers for ``text`` (raises ``QuantityError``)."""
    return str(parse(text.strip()))


def json_text(value: object) -> str:
    """A JSON value as ``Quantity.UnmarshalJSON`` sees it: a string's content, a number's literal (the
    emulator's JSON decoder already turned it into a Python number; ``repr`` gives the shortest literal
    back, which is what Python clients send)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(ERR_FORMAT)
    return value if isinstance(value, str) else repr(value)
