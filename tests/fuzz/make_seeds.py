#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/*): valid
inputs that reach deep into each loader. Run from the repository root; the
output is checked in, so this is only needed when a format changes."""
import json, os, struct, zlib

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def safetensors(entries, crc=True):
    """entries: list of (name, dtype, shape, bytes) -> a safetensors image"""
    header, data, off = {}, b"", 0
    for name, dt, shape, raw in entries:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    meta = {"format": "pt"}
    if crc:
        meta["syncbn_crc32"] = "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


# the fuzz target's model: Sequential(BatchNorm1d(2), Linear(2, 3))
model = [
    ("0.weight", "F32", [2], f32(1.5, 0.5)),
    ("0.bias", "F32", [2], f32(-0.25, 0.125)),
    ("0.running_mean", "F32", [2], f32(0.1, -0.2)),
    ("0.running_var", "F32", [2], f32(1.1, 0.9)),
    ("0.num_batches_tracked", "I64", [], struct.pack("<q", 12)),
    ("1.weight", "F32", [3, 2], f32(0.1, 0.2, 0.3, 0.4, 0.5, 0.6)),
    ("1.bias", "F32", [3], f32(0.01, 0.02, 0.03)),
]
os.makedirs(os.path.join(root, "safetensors"), exist_ok=True)
seeds = {
    "model_crc": safetensors(model),
    "model_pytorch": safetensors(model, crc=False),  # PyTorch writes no checksum
    "model_v1_no_nbt": safetensors([e for e in model if "num_batches" not in e[0]]),
    "model_extra_key": safetensors(model + [("2.weight", "F32", [1], f32(9))]),
}
for name, img in seeds.items():
    open(os.path.join(root, "safetensors", name), "wb").write(img)

# CIFAR-10: two records of <label><3072 pixel bytes>
os.makedirs(os.path.join(root, "cifar10"), exist_ok=True)
recs = b"".join(bytes([lab]) + bytes((i * 7 + lab) % 256 for i in range(3072)) for lab in (3, 7))
open(os.path.join(root, "cifar10", "two_records"), "wb").write(recs)

# MNIST: <u16 BE image-file length><IDX images><IDX labels>: 2 images of 3x2
os.makedirs(os.path.join(root, "mnist"), exist_ok=True)
img = struct.pack(">IIII", 0x803, 2, 3, 2) + bytes(range(0, 120, 10))
lab = struct.pack(">II", 0x801, 2) + bytes([4, 9])
open(os.path.join(root, "mnist", "two_images"), "wb").write(struct.pack(">H", len(img)) + img + lab)
print("seeds written under", root)
