"""Integer arithmetic that the launch shapes of every chapter share."""
from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up (a >= 0, b > 0): how many groups of b cover a things, as blocks cover
    packs or rounds cover repetitions. Exact for ints of any size, which math.ceil(a / b),
    through a float, is not past 2^53."""
    return -(-a // b)
