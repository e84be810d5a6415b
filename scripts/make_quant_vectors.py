#!/usr/bin/env python3
"""Writes the reference vectors of tests/unit/test_quant.c into tests/data/quant/.

For every GGUF block format: random valid blocks (random bytes, with the f16/f32
scale fields replaced by finite values of mixed sign and magnitude, one of them an
f16 subnormal) in NAME.blocks, and their dequantization by the PyPI `gguf` package
(gguf-py, the reference of llama.cpp's converters) as little-endian float32 in
NAME.ref. gguf-py has no Q8_1 or Q8_K class (and its size table still gives Q8_1 the
old 40-byte layout; GGUF's current block is 36 bytes: f16 d, f16 s, 32 int8), so
those two are dequantized here with numpy as float32(d) * float32(q).

Also cvt.in (float32 inputs, edge cases and random) with cvt_f16.ref and
cvt_bf16.ref (uint16): numpy's float16 cast and gguf-py's BF16 quantizer, both round
to nearest even.

Usage: python3 -m venv /work/dl/quantvenv && /work/dl/quantvenv/bin/pip install gguf numpy
       /work/dl/quantvenv/bin/python scripts/make_quant_vectors.py
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")

# name: (type, elements per block, bytes per block, blocks, f16 scale offsets)
FORMATS = {
    "q4_0": (T.Q4_0, 32, 18, 8, [0]),
    "q4_1": (T.Q4_1, 32, 20, 8, [0, 2]),
    "q5_0": (T.Q5_0, 32, 22, 8, [0]),
    "q5_1": (T.Q5_1, 32, 24, 8, [0, 2]),
    "q8_0": (T.Q8_0, 32, 34, 8, [0]),
    "q8_1": (T.Q8_1, 32, 36, 8, [0]),
    "q2_k": (T.Q2_K, 256, 84, 4, [80, 82]),
    "q3_k": (T.Q3_K, 256, 110, 4, [108]),
    "q4_k": (T.Q4_K, 256, 144, 4, [0, 2]),
    "q5_k": (T.Q5_K, 256, 176, 4, [0, 2]),
    "q6_k": (T.Q6_K, 256, 210, 4, [208]),
    "q8_k": (T.Q8_K, 256, 292, 4, []),
}


def random_scale(rng):
    """A finite f16 of either sign, magnitude 1e-4 .. 1."""
    return np.float16(rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-4.0, 0.0))


def make_blocks(rng, nblocks, nbytes, scale_offsets, name):
    blocks = rng.integers(0, 256, size=(nblocks, nbytes), dtype=np.uint8)
    for b in range(nblocks):
        for k, off in enumerate(scale_offsets):
            v = random_scale(rng)
            if b == 1 and k == 0:
                v = np.uint16(0x8123).view(np.float16)  # a negative f16 subnormal
            if b == 2 and k == 0:
                v = np.float16(0.0)  # a zero scale
            blocks[b, off:off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    if name == "q8_1":  # s = d * sum(q), as the format defines it
        for b in range(nblocks):
            d = blocks[b, 0:2].view(np.float16).astype(np.float32)[0]
            s = np.float16(d * np.float32(blocks[b, 4:].view(np.int8).astype(np.int32).sum()))
            blocks[b, 2:4] = np.frombuffer(s.tobytes(), dtype=np.uint8)
    if name == "q8_k":  # f32 d; bsums = sums of 16 codes
        for b in range(nblocks):
            d = np.float32(rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-6.0, 0.0))
            blocks[b, 0:4] = np.frombuffer(d.tobytes(), dtype=np.uint8)
            q = blocks[b, 4:260].view(np.int8).astype(np.int32).reshape(16, 16).sum(axis=1)
            blocks[b, 260:292] = np.frombuffer(q.astype("<i2").tobytes(), dtype=np.uint8)
    return blocks


def dequantize(name, qtype, blocks):
    if name == "q8_1":
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (d * blocks[:, 4:].copy().view(np.int8).astype(np.float32)).reshape(-1)
    if name == "q8_k":
        d = blocks[:, 0:4].copy().view("<f4").astype(np.float32)
        return (d * blocks[:, 4:260].copy().view(np.int8).astype(np.float32)).reshape(-1)
    return quants.dequantize(blocks.reshape(-1), qtype).astype("<f4").reshape(-1)


def conversion_inputs(rng):
    special = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, 65536.0, 1e30, -1e30,
               np.inf, -np.inf, 6.1035156e-05, 6.0975552e-05, 5.9604645e-08, 2.9802322e-08,
               2.9802326e-08, 8.940697e-08, 1e-10, 3.4028235e38, 1.17549435e-38, 1e-45,
               1.0009765625, 1.00048828125, 1.00146484375, 1.00390625, 1.001953125,
               1.005859375, 0.1, 3.14159265]
    bits = [0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0x7fffffff, 0x3f808000,
            0x3f818000, 0x3f80c000, 0x3f807fff, 0x7f7fffff]
    vals = np.array(special, dtype=np.float32)
    vals = np.concatenate([vals, np.array(bits, dtype=np.uint32).view(np.float32)])
    rand = (rng.standard_normal(200) * 10.0 ** rng.uniform(-9, 6, 200)).astype(np.float32)
    return np.concatenate([vals, rand]).astype("<f4")


def main():
    rng = np.random.default_rng(20240611)
    os.makedirs(OUT, exist_ok=True)
    for name, (qtype, bs, nbytes, nblocks, offs) in FORMATS.items():
        blocks = make_blocks(rng, nblocks, nbytes, offs, name)
        ref = dequantize(name, qtype, blocks)
        assert ref.size == nblocks * bs
        blocks.tofile(os.path.join(OUT, name + ".blocks"))
        ref.tofile(os.path.join(OUT, name + ".ref"))

    x = conversion_inputs(rng)
    with np.errstate(over="ignore", invalid="ignore"):
        f16 = x.astype(np.float16).view("<u2")
    bf16 = quants.quantize(x, T.BF16).view("<u2")
    x.tofile(os.path.join(OUT, "cvt.in"))
    f16.tofile(os.path.join(OUT, "cvt_f16.ref"))
    bf16.tofile(os.path.join(OUT, "cvt_bf16.ref"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
