#!/usr/bin/env python3
"""mkxz.py - wrap stdin in a valid .xz stream without compressing it, fast.

usage: openssl enc ... | head -c N | mkxz.py >asset.raw.xz

tender checks the container of an Image Factory asset (an `.xz` must decode and pass its CRC), so
the bench's incompressible test image must be real xz. `xz -0` needs ~9 CPU-minutes per GiB of
random data; this writes the same format directly: one block of LZMA2 *uncompressed* chunks
(64 KiB each, 3 bytes of overhead), CRC32 check, index and footer (xz file format 1.0.4 /
LZMA2 chunk headers as in liblzma). `xz -t` and `xz -l` accept the result.
"""
import struct
import sys
import zlib

CHUNK = 1 << 16
CHECK_CRC32 = 0x01
STREAM_FLAGS = bytes([0x00, CHECK_CRC32])


def crc32(b):
    return struct.pack("<I", zlib.crc32(b) & 0xFFFFFFFF)


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def main():
    src, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(b"\xfd7zXZ\x00" + STREAM_FLAGS + crc32(STREAM_FLAGS))
    # block header: size, flags (1 filter, no sizes), LZMA2 filter (id 0x21, 1 property byte:
    # dictionary 1 MiB), padding to a multiple of 4, CRC32
    hdr = bytes([0x00, 0x00, 0x21, 0x01, 0x10])
    hdr += b"\x00" * ((-len(hdr) - 4) % 4)
    hdr = bytes([(len(hdr) + 4) // 4 - 1]) + hdr[1:]
    hdr += crc32(hdr)
    out.write(hdr)
    compressed = 0
    total = 0
    crc = 0
    first = True
    while True:
        data = src.read(CHUNK)
        if not data:
            break
        # a short read from a pipe is fine: every chunk carries its own length
        out.write(bytes([0x01 if first else 0x02]) + struct.pack(">H", len(data) - 1))
        out.write(data)
        first = False
        compressed += 3 + len(data)
        total += len(data)
        crc = zlib.crc32(data, crc)
    out.write(b"\x00")                     # LZMA2 end marker
    compressed += 1
    out.write(b"\x00" * ((-(len(hdr) + compressed)) % 4))
    out.write(struct.pack("<I", crc & 0xFFFFFFFF))
    unpadded = len(hdr) + compressed + 4
    index = b"\x00" + varint(1) + varint(unpadded) + varint(total)
    index += b"\x00" * ((-len(index)) % 4)
    index += crc32(index)
    out.write(index)
    backward = struct.pack("<I", len(index) // 4 - 1)
    out.write(crc32(backward + STREAM_FLAGS) + backward + STREAM_FLAGS + b"YZ")
    out.flush()


if __name__ == "__main__":
    main()
