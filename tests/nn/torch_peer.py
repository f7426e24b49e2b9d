"""PyTorch peer of the module layer (run with Debian's /usr/bin/python3).

Reads what `nn_torch_peer export DIR` wrote: the network's checkpoint
(safetensors, PyTorch state-dict names), the input, and the C results of two
training steps (forward, cross-entropy, backward, SGD momentum 0.9, weight
decay 1e-4, Nesterov) and an eval forward. Builds the same network in
PyTorch, loads the checkpoint with load_state_dict(strict=True), repeats
the computation and compares. Then writes a checkpoint of a PyTorch-made
network and its outputs for `nn_torch_peer import DIR`.

safetensors is read and written with json + numpy (a few lines, no pip
package). Tolerances: both sides compute in float32 with different
summation orders; through 12 layers with batch statistics over 6 samples
the observed differences are ~1e-6 of each tensor's scale. We allow 1e-4 of
the scale (max |ref|), and 1e-5 for parameters after the SGD steps (they
move by lr * grad ~ 1e-2 from identical starting points).
"""
import copy
import json
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
TD = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64"}


def st_load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(data[b:e], dtype=DT[v["dtype"]]).reshape(v["shape"]).copy()
    return out


def st_save(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k, a in tensors.items():
        a = np.array(a, order="C")  # keeps 0-dim (num_batches_tracked) as shape []
        b = a.tobytes()
        header[k] = {"dtype": TD[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idt = x if self.downsample is None else self.downsample(x)
        return self.relu(out + idt)


def make_net():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 1, 1, bias=True), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        BasicBlock(8, 8), BasicBlock(8, 16, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 5))


failures = 0


def cmp(name, got, ref, rel, floor=1e-3):
    global failures
    got = got.detach().double().numpy() if torch.is_tensor(got) else np.asarray(got, dtype=np.float64)
    ref = ref.detach().double().numpy() if torch.is_tensor(ref) else np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        print(f"  FAIL {name}: shape {got.shape} vs {ref.shape}")
        failures += 1
        return
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, floor)
    err = float(np.abs(got - ref).max()) if ref.size else 0.0
    ok = err <= rel * scale
    failures += not ok
    print(f"  {name:<40} max err {err:.2e} (tol {rel * scale:.1e} = {rel:.0e} x scale {scale:.2e}) {'ok' if ok else 'FAIL'}")


def main(d):
    torch.set_num_threads(1)
    model = st_load(f"{d}/model.safetensors")
    inp = st_load(f"{d}/input.safetensors")
    res = st_load(f"{d}/results.safetensors")
    net = make_net()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in model.items()}, strict=True)
    print(f"C checkpoint loaded into PyTorch (strict): {len(model)} tensors")
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    x = torch.from_numpy(inp["x"]).requires_grad_(True)
    t = torch.from_numpy(inp["targets"])
    losses = []
    for s in range(2):
        opt.zero_grad()
        if x.grad is not None:
            x.grad = None
        out = net(x)
        loss = F.cross_entropy(out, t)
        loss.backward()
        losses.append(loss.item())
        if s == 0:
            cmp("step 1 logits", res["step1.logits"], out, 1e-4)
            cmp("step 1 input gradient", res["step1.dx"], x.grad, 1e-4)
            # A bias right before a BatchNorm has gradient 0 in exact arithmetic:
            # both sides hold rounding noise of the terms that cancel, whose
            # scale is that layer's weight gradient, so that is the floor.
            noise_floor = {f"{i}.bias": float(m.weight.grad.abs().max())
                           for i, m in enumerate(net)
                           if i + 1 < len(net) and isinstance(net[i + 1], nn.modules.batchnorm._BatchNorm)
                           and getattr(m, "bias", None) is not None}
            for name, p in net.named_parameters():
                cmp(f"step 1 grad {name}", res[f"grad.{name}"], p.grad, 1e-4, noise_floor.get(name, 1e-3))
        opt.step()
    cmp("losses of steps 1 and 2", res["loss"], np.array(losses), 1e-5)
    for name, v in net.state_dict().items():
        if name.endswith("num_batches_tracked"):
            ok = int(res[f"after.{name}"]) == int(v)
            failures_add = 0 if ok else 1
            globals()["failures"] += failures_add
            print(f"  after 2 steps {name:<28} C {int(res[f'after.{name}'])} torch {int(v)} {'ok' if ok else 'FAIL'}")
        else:
            cmp(f"after 2 steps {name}", res[f"after.{name}"], v, 1e-5)
    net.eval()
    with torch.no_grad():
        cmp("eval logits after training", res["eval.logits"], net(x.detach()), 1e-4)

    # PyTorch -> C: a network made and trained a little here.
    torch.manual_seed(3)
    net2 = make_net()
    with torch.no_grad():
        for m in net2.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)
        net2.train()
        for _ in range(3):
            net2(torch.randn(6, 3, 8, 8) * 2 + 0.5)
        net2.eval()
        ev = net2(x.detach())
        tr_net = copy.deepcopy(net2).train()
        tr = tr_net(x.detach())
    st_save(f"{d}/torch_model.safetensors", {k: v.numpy() for k, v in net2.state_dict().items()})
    st_save(f"{d}/torch_out.safetensors", {
        "eval.logits": ev.numpy(), "train.logits": tr.numpy(),
        "train.1.running_mean": tr_net[1].running_mean.numpy(),
        "train.1.num_batches_tracked": tr_net[1].num_batches_tracked.numpy()})
    print(f"wrote a PyTorch checkpoint ({len(net2.state_dict())} tensors) and its outputs for the C side")
    print("torch peer:", "FAILED" if failures else "all ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
