"""Raw deflate pieces that join into one gzip member (RFC 1951 and 1952).

Each cached piece ends in a full flush (byte-aligned, no reference to earlier data), so a body
is a gzip header, the pieces as they are, the tail as stored blocks (the last one final), the
CRC-32 and the size. Nothing is compressed twice.
"""

from __future__ import annotations

import struct
import zlib

GZIP_LEVEL = 6
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def deflate_piece(data: bytes, final: bool) -> bytes:
    """Raw deflate data for ``data`` that can be followed by another piece (or ends the stream)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_FINISH if final else zlib.Z_FULL_FLUSH)


def stored_blocks(data: bytes) -> bytes:
    """``data`` as uncompressed ("stored") deflate blocks, the last one final (RFC 1951, 3.2.4).

    The tail is a few KiB that change on every scrape; storing it costs nothing, where
    setting up a compressor costs more than the rest of the scrape.
    """
    pieces = []
    chunks = [data[i : i + 0xFFFF] for i in range(0, len(data), 0xFFFF)] or [b""]
    for i, chunk in enumerate(chunks):
        size = len(chunk)
        pieces.append(struct.pack("<BHH", 1 if i == len(chunks) - 1 else 0, size, size ^ 0xFFFF) + chunk)
    return b"".join(pieces)


def gzip_trailer(crc: int, size: int) -> bytes:
    """The CRC-32 and the size modulo 2^32 that end a gzip member."""
    return struct.pack("<II", crc, size & 0xFFFFFFFF)
