"""Compact binary fields for signed bodies that every peer reads every round: unsigned LEB128
varints and fixed-width raw bytes, written in one fixed order, read back by a strict reader.

Strict means a body has exactly one encoding: a varint with a redundant trailing zero byte, a
read past the end, or bytes left over are refused, so two different byte strings never carry the
same fields (a signature binds one encoding, and a receiver that re-encodes gets the same bytes).
"""

from __future__ import annotations

MAX_VARINT_BYTES = 10  # 2**64 - 1


class BinaryFieldError(ValueError):
    """A body that is not a strict encoding of the fields expected; the message says where."""


def put_varint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"a varint is unsigned, got {value}")
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return


def put_bytes(out: bytearray, data: bytes) -> None:
    """A length-prefixed byte string."""
    put_varint(out, len(data))
    out += data


class Reader:
    """Reads a body front to back; every method raises BinaryFieldError on a malformed field."""

    def __init__(self, data: bytes, offset: int = 0) -> None:
        self.data = data
        self.pos = offset

    def varint(self, what: str, *, limit: int = (1 << 63) - 1) -> int:
        value, shift = 0, 0
        for i in range(MAX_VARINT_BYTES):
            if self.pos >= len(self.data):
                raise BinaryFieldError(f"{what}: the body ends inside a varint")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and i > 0:
                    raise BinaryFieldError(f"{what}: a varint with a redundant trailing byte")
                if value > limit:
                    raise BinaryFieldError(f"{what}: {value} exceeds {limit}")
                return value
            shift += 7
        raise BinaryFieldError(f"{what}: a varint longer than {MAX_VARINT_BYTES} bytes")

    def raw(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise BinaryFieldError(f"{what}: the body ends {self.pos + n - len(self.data)} byte(s) early")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(out)

    def sized(self, what: str, *, limit: int) -> bytes:
        return self.raw(self.varint(f"{what} length", limit=limit), what)

    def rest(self) -> bytes:
        out = bytes(self.data[self.pos :])
        self.pos = len(self.data)
        return out

    def done(self, what: str) -> None:
        if self.pos != len(self.data):
            raise BinaryFieldError(f"{what}: {len(self.data) - self.pos} byte(s) after the last field")
