"""Java ``String.hashCode`` semantics, which RocketMQ uses for tags codes and index key hashes.

Java hashes UTF-16 code units, so a character outside the BMP counts as two units (a surrogate
pair). Hashing Python code points instead would give different values for such keys.
"""

from __future__ import annotations

import sys
from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_UTF16 = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def java_string_hash(text: str) -> int:
    """Return ``text.hashCode()`` as Java computes it: a signed 32-bit int."""
    h = 0
    for unit in array("H", text.encode(_UTF16, "surrogatepass")):  # Java strings may hold lone surrogates
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def index_key_hash(key: str) -> int:
    """IndexFile key hash: ``abs(hashCode)``, with Integer.MIN_VALUE mapped to 0 as RocketMQ does."""
    h = java_string_hash(key)
    return 0 if h == -0x8000_0000 else abs(h)


# -- fast paths (exact; checked against java_string_hash by tests/test_index_file.py) -------------
#
# The Java loop costs ~70 ns per character in Python, and the indexer hashes three ~40-character keys
# per message. For ASCII text each unit u < 128 splits into base-31 digits u = 31*q + r (q, r <= 30),
# so sum(u_i * 31^(n-1-i)) = 31*Q + R, where Q and R are the q and r digits read as base-31 numbers:
# bytes.translate builds those digit strings and int(..., 31) runs Horner's rule in C. (Caching the
# hash of "topic#" and continuing Horner's rule over the key was measured too: the extra multiply and
# calls cost more than hashing the few prefix characters in C.)

MASK32 = 0xFFFF_FFFF
_BASE31_DIGITS = b"0123456789abcdefghijklmnopqrstu"
#: bytes.translate tables: an ASCII unit u to the base-31 digit of u // 31 (HIGH) and of u % 31 (LOW).
BASE31_HIGH_DIGIT = bytes(_BASE31_DIGITS[u // 31] for u in range(128)) + bytes(128)
BASE31_LOW_DIGIT = bytes(_BASE31_DIGITS[u % 31] for u in range(128)) + bytes(128)
#: int() may refuse longer digit strings in a non power-of-two base (sys.set_int_max_str_digits,
#: 4300 by default, never below 640); longer keys take the loop.
MAX_FAST_LENGTH = 640


def java_hash_u32(text: str) -> int:
    """``text.hashCode()`` as an unsigned 32-bit value; 3-6x faster than the loop on ASCII index keys."""
    if text.isascii() and 0 < len(text) <= MAX_FAST_LENGTH:  # isascii() is O(1) on str
        data = text.encode("ascii")
        return (31 * int(data.translate(BASE31_HIGH_DIGIT), 31) + int(data.translate(BASE31_LOW_DIGIT), 31)) \
            & MASK32
    return java_string_hash(text) & MASK32


def abs_java_int(u32: int) -> int:
    """``Math.abs`` of an unsigned 32-bit value read as a Java int, Integer.MIN_VALUE mapped to 0
    (RocketMQ's indexKeyHashMethod)."""
    if u32 & 0x8000_0000:
        return 0 if u32 == 0x8000_0000 else 0x1_0000_0000 - u32
    return u32


def index_key_hash_fast(key: str) -> int:
    """:func:`index_key_hash` with the fast path."""
    return abs_java_int(java_hash_u32(key))



# -- columnar form (many strings at once, numpy) ---------------------------------------------------
#
# Horner's rule is a recurrence, but 31 is odd and so has an inverse modulo 2**32: with
# G[p] = sum(u[q] * 31**-(q+1) for q < p), a plain prefix sum, the hash of the units [a, b) is
# 31**b * (G[b] - G[a]) (all mod 2**32). One multiply and one cumsum per UTF-16 unit of a whole batch,
# then a few operations per string, whatever the strings' lengths. numpy is imported by these functions
# alone: the scalar form above is all the gateway ever calls, and importing numpy would add a tenth of a
# second to each of its starts.

_INV31 = pow(31, -1, 1 << 32)
_powers: tuple[np.ndarray, np.ndarray] | None = None


def _power_tables(length: int) -> tuple[np.ndarray, np.ndarray]:
    """(31**k, 31**-k) mod 2**32 as uint32 for k in 0 .. at least ``length``, grown on demand."""
    import numpy as np

    global _powers
    if _powers is None or _powers[0].size <= length:
        size = max(1 << 16, 1 << length.bit_length())
        tables = []
        for base in (31, _INV31):
            t = np.full(size, base, dtype=np.uint32)
            t[0] = 1
            tables.append(np.cumprod(t, dtype=np.uint32))  # uint32 arithmetic wraps: mod 2**32
        _powers = (tables[0], tables[1])
    return _powers


def utf16_units(text: str) -> np.ndarray:
    """The UTF-16 code units Java's String holds for ``text`` (lone surrogates kept), as uint16."""
    import numpy as np

    return np.frombuffer(text.encode(_UTF16, "surrogatepass"), dtype=np.uint16)


def segment_hashes_u32(units: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``String.hashCode`` (unsigned 32-bit) of each ``units[starts[i]:ends[i]]``, computed for all
    segments at once (see above). ``units`` are UTF-16 code units."""
    import numpy as np

    power, inverse = _power_tables(units.size + 1)
    prefix = np.zeros(units.size + 1, dtype=np.uint32)
    np.cumsum(units.astype(np.uint32) * inverse[1:units.size + 1], dtype=np.uint32, out=prefix[1:])
    hashes: np.ndarray = power[ends] * (prefix[ends] - prefix[starts])
    return hashes


def combine_u32(prefix_hash: np.ndarray | int, suffix_hash: np.ndarray, suffix_length: np.ndarray) -> np.ndarray:
    """The hash of prefix + suffix from the two hashes: ``prefix * 31**len(suffix) + suffix`` mod 2**32."""
    import numpy as np

    power = _power_tables(int(suffix_length.max(initial=0)))[0]
    combined: np.ndarray = np.asarray(prefix_hash, dtype=np.uint32) * power[suffix_length] + suffix_hash
    return combined


def abs_java_ints(u32: np.ndarray) -> np.ndarray:
    """:func:`abs_java_int` of each value, as int64."""
    import numpy as np

    wide = u32.astype(np.int64)
    result: np.ndarray = np.where(wide < 0x8000_0000, wide, (0x1_0000_0000 - wide) & 0x7FFF_FFFF)
    return result
