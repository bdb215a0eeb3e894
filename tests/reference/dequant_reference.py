#!/usr/bin/env python3
"""Expected values for tests/unit/model/dequantize_test.cpp, computed with gguf-py's numpy
dequantizer (gguf.quants.dequantize), an implementation independent of ours.

Writes into OUT_DIR/dequant/:
  <case>.bin     raw GGML bytes (whole blocks, little-endian, exactly as in a GGUF file)
  <case>.f32     expected float32 values, little-endian, num_elements of them
  index.json     {"cases": [{"name", "type", "type_id", "num_elements", "num_bytes",
                             "source", "bin", "f32"}], "model": path or null}

Synthetic cases (deterministic seed) cover every supported type: random payload bytes with the
f16 scale fields drawn from finite values of sensible magnitude plus edge values (+-0, negative,
subnormal, largest finite, inf, NaN). F16 and BF16 cover all 65536 bit patterns. Real cases copy
tensors from --model (a GGUF file) when it exists; they are left out, and index.json says so, when
it does not.
"""

import argparse
import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf.quants import dequantize

SEED = 20240607

# Byte offsets of the f16 scale fields inside one block, per type.
F16_FIELDS = {
    T.Q8_0: [0],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
NUM_BLOCKS = {T.Q8_0: 256, T.Q4_0: 256, T.Q4_1: 256, T.Q5_0: 256, T.Q5_1: 256,
              T.Q4_K: 64, T.Q5_K: 64, T.Q6_K: 64}

# Edge values for scale fields, as f16 bit patterns: +0, -0, smallest and largest subnormal,
# smallest normal, -1, largest finite, -largest finite, +inf, -inf, quiet NaN.
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0xBC00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00]

# Real tensors: (name, number of leading rows to copy; None = whole tensor).
REAL_TENSORS = [("blk.0.attn_q.weight", None), ("token_embd.weight", 64),
                ("blk.0.attn_norm.weight", None)]


def random_scales(rng, count):
    """f16 bit patterns: mostly random finite magnitudes in [2^-14, 2), random sign."""
    mag = np.exp2(rng.uniform(-14.0, 1.0, size=count)).astype(np.float16)
    sign = np.where(rng.random(count) < 0.5, -1.0, 1.0).astype(np.float16)
    return (mag * sign).view(np.uint16)


def synthetic_blocks(rng, qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n = NUM_BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        bits = random_scales(rng, n)
        # The first blocks sweep the edge values through this field, each paired with
        # ordinary random values in the other fields.
        bits[:len(EDGE_F16)] = EDGE_F16
        blocks[:, off:off + 2] = bits.view(np.uint8).reshape(n, 2)
    # Two blocks whose payload is all zeros and all ones (extreme quants).
    payload = np.ones(block_bytes, dtype=bool)
    for off in F16_FIELDS[qtype]:
        payload[off:off + 2] = False
    blocks[n - 2, payload] = 0x00
    blocks[n - 1, payload] = 0xFF
    return blocks.reshape(-1), n * block_elems


def float_patterns(rng):
    """F32 values: specials plus random bit patterns (which include NaNs and subnormals)."""
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45,
                        1.1754942e-38, 1.17549435e-38, 3.4028235e38, -3.4028235e38],
                       dtype=np.float32)
    rand_bits = rng.integers(0, 2**32, size=4096 - special.size, dtype=np.uint64).astype(np.uint32)
    subnormals = rng.integers(1, 2**23, size=64, dtype=np.uint32) | np.uint32(0x80000000)
    return np.concatenate([special.view(np.uint32), rand_bits, subnormals]).astype("<u4")


class Writer:
    def __init__(self, out_dir):
        self.dir = os.path.join(out_dir, "dequant")
        os.makedirs(self.dir, exist_ok=True)
        self.cases = []

    def add(self, name, qtype, raw, source):
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        with np.errstate(all="ignore"):
            expected = np.asarray(dequantize(raw.copy(), qtype), dtype=np.float32).reshape(-1)
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        assert raw.size % block_bytes == 0
        assert expected.size == raw.size // block_bytes * block_elems, (name, expected.size)
        file_stem = name.replace("/", "_")
        raw.tofile(os.path.join(self.dir, file_stem + ".bin"))
        expected.astype("<f4").tofile(os.path.join(self.dir, file_stem + ".f32"))
        self.cases.append({"name": name, "type": qtype.name, "type_id": int(qtype),
                           "num_elements": int(expected.size), "num_bytes": int(raw.size),
                           "source": source, "bin": file_stem + ".bin",
                           "f32": file_stem + ".f32"})

    def finish(self, model):
        index = {"cases": self.cases, "model": model}
        with open(os.path.join(self.dir, "index.json"), "w") as f:
            json.dump(index, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--model", default=None, help="GGUF file to take real tensors from")
    args = parser.parse_args()

    rng = np.random.default_rng(SEED)
    writer = Writer(args.out_dir)

    all_u16 = np.arange(65536, dtype="<u2")
    writer.add("synthetic_F32", T.F32, float_patterns(rng).view(np.uint8), "synthetic")
    writer.add("synthetic_F16", T.F16, all_u16.view(np.uint8), "synthetic")
    writer.add("synthetic_BF16", T.BF16, all_u16.view(np.uint8), "synthetic")
    for qtype in F16_FIELDS:
        raw, _ = synthetic_blocks(rng, qtype)
        writer.add("synthetic_" + qtype.name, qtype, raw, "synthetic")

    model = None
    if args.model and os.path.exists(args.model):
        model = os.path.abspath(args.model)
        reader = GGUFReader(model)
        tensors = {t.name: t for t in reader.tensors}
        for name, num_rows in REAL_TENSORS:
            t = tensors[name]
            data = t.data if num_rows is None else t.data[:num_rows]
            raw = np.ascontiguousarray(data).view(np.uint8)
            writer.add("real_" + name, T(t.tensor_type), raw, "model")
    else:
        print(f"dequant_reference: model {args.model!r} not found; real-tensor cases left out",
              file=sys.stderr)
    writer.finish(model)
    print(f"dequant_reference: wrote {len(writer.cases)} cases to {writer.dir}")


if __name__ == "__main__":
    main()
