"""How the window writes a measured number (an attention value, a scale's ends, a similarity, a norm): one rule,
so a hover readout never says '3.979e-05' beside a title's '0.009855' (Python's 'g' format switches to an exponent
below 1e-4).

Numbers from 1e-6 to 1e6 in magnitude are written in plain decimals with `digits` significant digits (trailing
zeros dropped): 0.00003979, 0.009855, 12.35, 48210; beyond that, with an exponent (3.979e-07). A range's two ends
get the same number of decimals (that of the end with the larger magnitude), so they read alike: '0–0.00985',
'0.0012–0.0099'.
"""
from __future__ import annotations

import math

PLAIN_FROM, PLAIN_BELOW = 1e-6, 1e6     # magnitudes written without an exponent


def _decimals(value: float, digits: int) -> int:
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def _plain(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def plain_range(value: float) -> bool:
    """Whether `value` is written without an exponent."""
    return value == 0 or (math.isfinite(value) and PLAIN_FROM <= abs(value) < PLAIN_BELOW)


def number(value: float, digits: int = 4) -> str:
    """One measured number: '0.00003979', '0.009855', '12.35', '3.979e-07' (`digits` significant digits)."""
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if not plain_range(value):
        return f"{value:.{digits - 1}e}"
    return _plain(value, _decimals(value, digits))


def number_range(lo: float, hi: float, digits: int = 3) -> str:
    """'lo–hi' with both ends written alike: the decimals of the larger end's `digits` significant digits (both
    with an exponent when that end needs one)."""
    lo, hi = float(lo), float(hi)
    big = max(abs(lo), abs(hi))
    if not (math.isfinite(lo) and math.isfinite(hi)) or big == 0:
        return f"{number(lo, digits)}–{number(hi, digits)}"
    if not plain_range(big):
        return f"{lo:.{digits - 1}e}–{hi:.{digits - 1}e}"
    decimals = _decimals(big, digits)
    return f"{_plain(lo, decimals)}–{_plain(hi, decimals)}"
