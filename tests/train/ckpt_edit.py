#!/usr/bin/python3
"""Rewrite scalars of a syncbn safetensors checkpoint *properly*: new values,
the data CRC (__metadata__.syncbn_crc32, zlib's crc32 of the data section)
recomputed, so that only the trainer's own range checks can reject it.
Usage: ckpt_edit.py FILE NAME=VALUE...   (int64 scalars)"""
import json, struct, sys, zlib

path = sys.argv[1]
raw = open(path, "rb").read()
hl = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + hl])
data = bytearray(raw[8 + hl:])
for arg in sys.argv[2:]:
    name, value = arg.split("=")
    t = header[name]
    assert t["dtype"] == "I64" and t["shape"] == [], t
    a, b = t["data_offsets"]
    data[a:b] = struct.pack("<q", int(value))
header["__metadata__"]["syncbn_crc32"] = "%08x" % zlib.crc32(bytes(data))
js = json.dumps(header, separators=(",", ":")).encode()
js += b" " * (-len(js) % 8)
open(path, "wb").write(struct.pack("<Q", len(js)) + js + bytes(data))
print("ckpt_edit: %s rewritten with %s (crc %s)" % (path, " ".join(sys.argv[2:]), header["__metadata__"]["syncbn_crc32"]))
