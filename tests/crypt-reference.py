#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""An independent dm-crypt aes-xts reference for the crypt tests.

    crypt-reference.py encrypt|decrypt CIPHER HEXKEY IV_OFFSET SECTOR_SIZE \\
                       IV_LARGE(0|1) IN OUT

IN is a whole target's worth of data (plaintext for encrypt, the bytes on
the backing device for decrypt) starting at the target's first sector; OUT
gets the other one.  CIPHER is aes-xts-plain64, aes-xts-plain or
aes-xts-plain64be (or capi:xts(aes)-IVMODE).

Independent of the code under test and of OpenSSL's XTS: OpenSSL 3's
`openssl enc` refuses XTS ciphers, so XTS (IEEE P1619) is built here from
the AES block primitive, `openssl enc -aes-*-ecb -nopad`, and the tweak
doubling in GF(2^128) in Python.  dm-crypt's rules, from
drivers/md/dm-crypt.c: the key is K1 || K2 (data key, tweak key); each
sector_size bytes are one data unit; its IV is the sector number in
512-byte units from the target's start plus iv_offset (with
iv_large_sectors: that number divided by sector_size / 512), written as a
little-endian 32-bit (plain) or 64-bit (plain64) integer, or big-endian
64-bit at the end (plain64be), zero-padded to 16 bytes.  Two openssl runs
per call, whatever the size.
"""
import subprocess
import sys

MASK128 = (1 << 128) - 1


def ecb(key, data, decrypt=False):
    bits = len(key) * 8
    cmd = ["openssl", "enc", "-aes-%d-ecb" % bits, "-K", key.hex(), "-nopad"]
    if decrypt:
        cmd.append("-d")
    out = subprocess.run(cmd, input=data, stdout=subprocess.PIPE,
                         check=True).stdout
    assert len(out) == len(data), "openssl enc returned %d bytes" % len(out)
    return out


def iv_bytes(mode, sector):
    if mode == "plain":
        return (sector & 0xffffffff).to_bytes(16, "little")
    if mode == "plain64":
        return (sector & ((1 << 64) - 1)).to_bytes(16, "little")
    if mode == "plain64be":
        return (sector & ((1 << 64) - 1)).to_bytes(16, "big")
    raise SystemExit("unknown IV mode " + mode)


def xor(a, b):
    n = len(a)
    return (int.from_bytes(a, "little") ^
            int.from_bytes(b, "little")).to_bytes(n, "little")


def xts(cipher, key, iv_offset, sector_size, iv_large, data, decrypt):
    mode = cipher.rsplit("-", 1)[1]
    assert len(data) % sector_size == 0
    half = len(key) // 2
    k1, k2 = key[:half], key[half:]
    nsect = len(data) // sector_size
    shift = (sector_size // 512).bit_length() - 1
    ivs = b"".join(
        iv_bytes(mode, ((i * sector_size) // 512 + iv_offset) >> (shift if iv_large else 0))
        for i in range(nsect))
    t0 = ecb(k2, ivs)                    # the tweak is always encrypted
    tweaks = bytearray()
    for i in range(nsect):
        t = int.from_bytes(t0[16 * i:16 * i + 16], "little")
        for j in range(sector_size // 16):
            tweaks += t.to_bytes(16, "little")
            t <<= 1
            if t >> 128:
                t = (t & MASK128) ^ 0x87
    return xor(ecb(k1, xor(data, tweaks), decrypt), tweaks)


def main():
    op, cipher, hexkey, iv_offset, ss, iv_large, src, dst = sys.argv[1:]
    data = open(src, "rb").read()
    out = xts(cipher, bytes.fromhex(hexkey), int(iv_offset), int(ss),
              iv_large == "1", data, op == "decrypt")
    open(dst, "wb").write(out)


if __name__ == "__main__":
    main()
