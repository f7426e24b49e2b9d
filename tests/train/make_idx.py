#!/usr/bin/python3
"""Write a small MNIST-format dataset (IDX files, plain and gzipped) whose class is
learnable after global pooling: the image of class k is noise around brightness 24k.
Usage: make_idx.py DIR_PLAIN DIR_GZ N_TRAIN N_TEST"""
import gzip, os, random, struct, sys

plain, gz, ntrain, ntest = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(5)

def images_labels(n):
    labels = bytes(rng.randrange(10) for _ in range(n))
    px = bytearray()
    for k in labels:
        img = [24 * k + rng.randrange(40) for _ in range(28 * 28)]
        px += bytes(img)
    return (struct.pack(">IIII", 0x803, n, 28, 28) + bytes(px), struct.pack(">II", 0x801, n) + labels)

for d in (plain, gz):
    os.makedirs(d, exist_ok=True)
for prefix, n in (("train", ntrain), ("t10k", ntest)):
    img, lab = images_labels(n)
    for name, data in (("%s-images-idx3-ubyte" % prefix, img), ("%s-labels-idx1-ubyte" % prefix, lab)):
        open(os.path.join(plain, name), "wb").write(data)
        open(os.path.join(gz, name + ".gz"), "wb").write(gzip.compress(data))
print("make_idx: %d + %d images in %s (plain) and %s (gzipped)" % (ntrain, ntest, plain, gz))
