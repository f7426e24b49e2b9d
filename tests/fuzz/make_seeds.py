#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/*): valid
inputs that reach deep into each loader. The output is checked in, so this
is only needed when a format changes: `make fuzz-seeds` runs it as

    make_seeds.py [TEST_RESUME]

where TEST_RESUME (build/tests/train/test_resume) writes the valid resume
checkpoints of its fixture, which this script then damages one way each;
without it the resume seeds are left as they are."""
import json, os, shutil, struct, subprocess, sys, tempfile, zlib

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

# syncbn-train resume checkpoints (fuzz_resume, tests/train/test_resume):
# the fixture's valid files, then damaged copies. Value edits recompute the
# CRC, so only the trainer's own checks can refuse them.
def read_st(raw):
    """safetensors image -> (ordered [(name, dtype, shape, bytes)], metadata)"""
    hl = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + hl])
    data = raw[8 + hl:]
    meta = header.pop("__metadata__", {})
    ents = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [[k, v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in ents], meta


def edit(entries, **changes):
    """changes: name=(dtype, shape, raw) replacing that entry; None drops it"""
    out = []
    for name, dt, shape, raw in entries:
        key = name.replace(".", "__")
        if key in changes:
            if changes[key] is None:
                continue
            dt, shape, raw = changes[key]
        out.append((name, dt, shape, raw))
    return out


def i64(v):
    return ("I64", [], struct.pack("<q", v))


def f64(*v):
    return ("F64", [len(v)], struct.pack("<%dd" % len(v), *v))


if len(sys.argv) > 1:
    d = os.path.join(root, "resume")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.argv[1], "--write-good", tmp], check=True, stdout=subprocess.DEVNULL)
        for f in os.listdir(tmp):
            shutil.copy(os.path.join(tmp, f), d)
    good, _ = read_st(open(os.path.join(d, "good_partial"), "rb").read())  # epoch 1, step 2 of 3x3
    byname = {e[0]: e for e in good}
    w = byname["conv1.weight"]
    I64_MAX, I64_MIN = 2**63 - 1, -2**63
    bad = {
        "bad_epoch_past_end": edit(good, trainer__epoch=i64(4)),
        "bad_epoch_end_with_step": edit(good, trainer__epoch=i64(3), trainer__step=i64(1)),
        "bad_epoch_negative": edit(good, trainer__epoch=i64(-1)),
        "bad_epoch_int64_max": edit(good, trainer__epoch=i64(I64_MAX)),
        "bad_step_negative": edit(good, trainer__step=i64(-1)),
        "bad_step_past_epoch": edit(good, trainer__step=i64(3)),
        "bad_step_int64_max": edit(good, trainer__step=i64(I64_MAX)),
        "bad_step_int64_min": edit(good, trainer__step=i64(I64_MIN)),
        "bad_optimizer_step_int64_max": edit(good, optimizer__step=i64(I64_MAX)),
        "bad_optimizer_step_negative": edit(good, optimizer__step=i64(-1)),
        "bad_optimizer_step_ahead": edit(good, optimizer__step=i64(6)),
        "bad_sums_seen": edit(good, trainer__epoch_sums=f64(3.5, 5, 9)),
        "bad_sums_correct_nan": edit(good, trainer__epoch_sums=f64(3.5, float("nan"), 8)),
        "bad_sums_loss_negative": edit(good, trainer__epoch_sums=f64(-1, 5, 8)),
        "bad_sums_at_step_0": edit(good, trainer__step=i64(0), optimizer__step=i64(3)),
        "bad_config_ranks": edit(good, trainer__config__ranks=i64(3)),
        "bad_config_batch_int64_max": edit(good, trainer__config__batch=i64(I64_MAX)),
        "bad_config_width": edit(good, trainer__config__width=i64(4)),
        "bad_config_data": edit(good, trainer__config__data=i64(42)),
        "bad_config_images": edit(good, trainer__config__train_images=i64(11)),
        "bad_dtype_epoch_f64": edit(good, trainer__epoch=("F64", [], struct.pack("<d", 1.0))),
        "bad_dtype_weight_i64": edit(good, conv1__weight=("I64", [len(w[3]) // 8], w[3])),
        "bad_shape_sums": edit(good, trainer__epoch_sums=("F64", [1, 3], byname["trainer.epoch_sums"][3])),
        "bad_shape_weight": edit(good, conv1__weight=("F32", [len(w[3]) // 4], w[3])),
        "bad_missing_step": edit(good, trainer__step=None),
        "bad_model_file_only": [e for e in good if not e[0].startswith(("trainer.", "optimizer."))],
        "bad_missing_weight": edit(good, fc__weight=None),
        "bad_extra_key": good + [("extra.weight", "F32", [1], f32(1))],
        "bad_nbt_negative": edit(good, bn1__num_batches_tracked=i64(-1)),
    }
    for name, ents in bad.items():
        open(os.path.join(d, name), "wb").write(safetensors(ents))
    # without a CRC (as PyTorch writes): the fuzzer's value mutations then
    # reach the trainer's checks instead of all failing the checksum
    open(os.path.join(d, "good_partial_nocrc"), "wb").write(safetensors(good, crc=False))
    img = safetensors(good)
    hl = struct.unpack("<Q", img[:8])[0]
    raw = {
        "bad_truncated_data": img[:len(img) - 5],
        "bad_truncated_header": img[:8 + hl // 2],
        "bad_empty_header": struct.pack("<Q", 0),
        "bad_crc": img[:-1] + bytes([img[-1] ^ 1]),  # a flipped bit, the CRC not updated
    }
    for name, b in raw.items():
        open(os.path.join(d, name), "wb").write(b)
else:
    print("resume seeds not rewritten (pass build/tests/train/test_resume)")
print("seeds written under", root)
