"""Reference conversions for tests/nn/test_nn_load_dtypes (Debian's
/usr/bin/python3 and torch): what PyTorch's load_state_dict makes of a
checkpoint entry whose dtype differs from the model's, i.e. the bits of
torch.empty(n, dtype=model_dtype).copy_(entry).

Writes DIR/convert.safetensors: for each source dtype S, "src.S" (the
entry as a checkpoint holds it) and "want.S.D" (torch's conversion to the
model dtype D, for D in F32 F64 F16 BF16 I64); "counts" = [n] per source.
Float sources converted to I64 use "srci.S" / "want.S.I64" instead:
finite values in int64's range (torch's cast of NaN or infinity is
undefined; the library refuses those, see the C test).

Writes DIR/bn_{f64,f16,bf16,i32nbt}.safetensors: state dicts of a trained
BatchNorm2d(3) made .double(), .half(), .bfloat16(), and one with an int32
num_batches_tracked, and DIR/bn_{...}.want.safetensors: the float32 state
after torch's own model.load_state_dict(sd, strict=True) of each.

safetensors is written with json + struct (no pip package), as in
tests/nn/torch_peer.py; 16-bit tensors go out through an int16 view.
"""
import json
import math
import struct
import sys

import torch
import torch.nn as nn

NAMES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL"}
DESTS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]


def raw_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.numpy().tobytes()


def st_save(path, tensors):
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = raw_bytes(t)
        header[k] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def float_values():
    """Rounding edges of every target (ties, subnormals, overflow, NaN), values
    a float64 -> float32 -> 16-bit double rounding changes, and randoms."""
    v = [0.0, -0.0, 1.0, -1.0, 1.5, 0.1, 1 / 3, math.pi, -2.7, 65504.0, 65519.99, 65520.0, -65520.0,
         2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -14 - 2.0 ** -25, 1e-8, 1e-40, 1e-320, 3.4e38, 3.5e38,
         -1e300, math.inf, -math.inf, math.nan, -math.nan, 1 + 2.0 ** -24, 1 + 3 * 2.0 ** -24, 1 + 2.0 ** -8,
         1 + 3 * 2.0 ** -8, 1 + 2.0 ** -11 + 2.0 ** -40, 1 + 2.0 ** -8 + 2.0 ** -40, 1 - 2.0 ** -12 - 2.0 ** -40,
         2.0 ** 24 + 1, 3.3895313892515355e38, 1.0000001, 2.0 ** 62, -(2.0 ** 63), 7.9, -3.7]
    g = torch.Generator().manual_seed(7)
    for scale in (1e-6, 1e-3, 1.0, 1e3, 1e5, 1e30):
        v += (torch.randn(40, generator=g, dtype=torch.float64) * scale).tolist()
    # Exact float32 ties for the 16-bit types (low bits 0x8000 / 0x1000).
    v += [struct.unpack("<f", struct.pack("<I", u))[0] for u in (0x3f808000, 0x3f818000, 0x3f801000, 0x3f803000,
                                                                 0x387fc000, 0x33000000, 0x33800000)]
    return torch.tensor(v, dtype=torch.float64)


def int_values(dtype):
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    if info is None:
        return torch.tensor([0, 1, 1, 0], dtype=torch.bool)
    v = [0, 1, -1, 2, -7, 100, info.min, info.max, info.max - 1, info.min + 1]
    v += [2 ** 24 + 1, 2 ** 24 + 3, -(2 ** 24 + 1), 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 62 + 2 ** 38 + 1, 2049, 4097,
          65519, 65520, 300, 257]
    v = [x for x in v if info.min <= x <= info.max]
    return torch.tensor(v, dtype=dtype)


def convert_file(d):
    out, counts = {}, []
    for s in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        src = float_values().to(s)
        out[f"src.{NAMES[s]}"] = src
        for dst in DESTS[:4]:
            out[f"want.{NAMES[s]}.{NAMES[dst]}"] = torch.empty(src.shape, dtype=dst).copy_(src)
        fin = src[torch.isfinite(src) & (src.double().abs() < 2.0 ** 63)]
        fin = fin[fin.double() < 2.0 ** 63 - 1]
        out[f"srci.{NAMES[s]}"] = fin
        out[f"want.{NAMES[s]}.I64"] = torch.empty(fin.shape, dtype=torch.int64).copy_(fin)
        counts += [src.numel(), fin.numel()]
    for s in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        src = int_values(s)
        out[f"src.{NAMES[s]}"] = src
        for dst in DESTS:
            out[f"want.{NAMES[s]}.{NAMES[dst]}"] = torch.empty(src.shape, dtype=dst).copy_(src)
        counts.append(src.numel())
    out["counts"] = torch.tensor(counts, dtype=torch.int64)
    st_save(f"{d}/convert.safetensors", out)


def bn_files(d):
    torch.manual_seed(3)
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.normal_(), bn.bias.normal_()
    bn.double().train()
    for _ in range(3):
        bn(torch.randn(4, 3, 5, 5, dtype=torch.float64) * 3 + 1)
    variants = {"f64": bn.state_dict(),
                "f16": {k: (v.half() if v.is_floating_point() else v) for k, v in bn.state_dict().items()},
                "bf16": {k: (v.bfloat16() if v.is_floating_point() else v) for k, v in bn.state_dict().items()}}
    i32 = {k: v.float() for k, v in bn.state_dict().items()}
    i32["num_batches_tracked"] = i32["num_batches_tracked"].int()
    variants["i32nbt"] = i32
    for name, sd in variants.items():
        model = nn.BatchNorm2d(3)
        model.load_state_dict(sd, strict=True)
        st_save(f"{d}/bn_{name}.safetensors", sd)
        st_save(f"{d}/bn_{name}.want.safetensors", model.state_dict())
        print(f"torch: BatchNorm2d(3) float32 load_state_dict of a {name} state dict: "
              f"nbt {model.num_batches_tracked.item()}, running_var {model.running_var.tolist()}")


if __name__ == "__main__":
    convert_file(sys.argv[1])
    bn_files(sys.argv[1])
