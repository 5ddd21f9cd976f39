"""Java ``String.hashCode`` semantics, which RocketMQ uses for tags codes and index key hashes.

Java hashes UTF-16 code units, so a character outside the BMP counts as two units (a surrogate
pair). Hashing Python code points instead would give different values for such keys.
"""

from __future__ import annotations

import sys
from array import array

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
