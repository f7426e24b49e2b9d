#!/usr/bin/python3
"""syncbn.torch on one process (no torch.distributed: plain BatchNorm):
numerics against a float64 reference (PyTorch's float32 nn.BatchNorm as a
peer), dtypes and layouts, eval, momentum None, float64 modules against
PyTorch's float64 BatchNorm and torch.autograd.gradcheck, state dicts with
nn.BatchNorm2d and nn.SyncBatchNorm, convert/revert on a ResNet, errors."""
import copy
import os

import torch
import torch.fx
import torch.nn as nn

import syncbn
import syncbn.torch as sbn
from sbn_testlib import Reference, check, expect, finish, rel_err, to_layout

torch.manual_seed(0)
# Tolerances. Our kernels accumulate in float64 and round y and dx once, so
# against the float64 reference the error is float32 rounding of unit-scale
# values (~6e-8); 1e-6 leaves room for the float32 parameters. PyTorch's own
# float32 BatchNorm is printed beside it as the peer. Reduced-precision
# storage: one rounding of y/dx, i.e. 2^-9 relative (bf16) and 2^-12
# (f16); the tolerance is twice that.
TOL = 1e-6
TOL_STORAGE = {torch.float32: TOL, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def numerics():
    print("plain BatchNorm (no group) vs float64 reference, 3 training steps + eval:")
    cases = [  # shape, channels_last, affine, track, momentum, dtype
        ((6, 5), False, True, True, 0.1, torch.float32),
        ((4, 3, 7), False, True, True, None, torch.float32),
        ((4, 3, 7), True, True, False, 0.1, torch.float32),
        ((3, 4, 5, 6), False, True, True, 0.3, torch.float32),
        ((3, 4, 5, 6), True, True, True, None, torch.float32),
        ((2, 3, 3, 4, 5), True, False, True, 0.1, torch.float32),
        ((2, 3, 3, 4, 5), False, True, False, None, torch.float32),
        ((3, 4, 5, 6), True, True, True, 0.1, torch.bfloat16),
        ((4, 3, 9), False, True, True, 0.1, torch.bfloat16),
        ((3, 4, 5, 6), False, True, True, 0.1, torch.float16),
    ]
    for shape, cl, affine, track, momentum, dtype in cases:
        C = shape[1]
        m = sbn.SyncBatchNorm(C, momentum=momentum, affine=affine, track_running_stats=track)
        peer = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[
            len(shape)](C, momentum=momentum, affine=affine, track_running_stats=track)
        if affine:
            with torch.no_grad():
                m.weight.copy_(torch.rand(C) + 0.5), m.bias.copy_(torch.randn(C))
                peer.weight.copy_(m.weight), peer.bias.copy_(m.bias)
        ref = Reference(C, momentum=momentum, affine=affine, track=track,
                        weight=m.weight.detach() if affine else None,
                        bias=m.bias.detach() if affine else None)
        errs = {"y": 0.0, "dx": 0.0, "gw": 0.0, "rs": 0.0, "peer_y": 0.0}
        layout_kept = True
        for step in range(4):
            training = step < 3
            m.train(training), peer.train(training)
            mean = 3 * torch.randn(C).view(1, C, *([1] * (len(shape) - 2)))
            x64 = mean + torch.randn(shape, dtype=torch.float64)
            x = to_layout(x64.to(dtype), cl).requires_grad_()
            dy = torch.randn(shape, dtype=torch.float64).to(dtype)
            y = m(x)
            ys, dxs, gw, gb = ref.step([x.detach()], [dy], training)
            if dtype == torch.float32:
                py = peer(x.detach())
                errs["peer_y"] = max(errs["peer_y"], rel_err(py, ys[0]))
            errs["y"] = max(errs["y"], rel_err(y, ys[0]))
            if affine:
                m.weight.grad = m.bias.grad = None
            y.backward(dy)
            errs["dx"] = max(errs["dx"], rel_err(x.grad, dxs[0]))
            if affine and gw is not None:
                errs["gw"] = max(errs["gw"], rel_err(m.weight.grad, gw), rel_err(m.bias.grad, gb))
            if track:
                errs["rs"] = max(errs["rs"], rel_err(m.running_mean, ref.rm),
                                 rel_err(m.running_var, ref.rv))
            if cl and len(shape) == 4:
                layout_kept &= y.is_contiguous(memory_format=torch.channels_last) and \
                    x.grad.is_contiguous(memory_format=torch.channels_last)
            layout_kept &= y.dtype == dtype and x.grad.dtype == dtype
        name = "%s %s %s affine=%d track=%d momentum=%s" % (
            tuple(shape), "CL" if cl else "CF", str(dtype)[6:], affine, track, momentum)
        tol = TOL_STORAGE[dtype]
        print(" ", name, "(PyTorch float32 peer y err %.1e)" % errs["peer_y"]
              if dtype == torch.float32 else "")
        check("    y", errs["y"], tol)
        check("    dx", errs["dx"], tol)
        # float32 results of float64 sums of the (exactly represented) inputs
        check("    grad_weight, grad_bias", errs["gw"], 1e-6)
        check("    running_mean, running_var", errs["rs"], 1e-6)
        expect("    dtype and channels_last kept for y and dx", layout_kept)
        if track:
            expect("    num_batches_tracked == 3", int(m.num_batches_tracked) == 3,
                   str(int(m.num_batches_tracked)))


def state_dicts():
    print("state dicts:")
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(6)
    x = torch.randn(8, 6, 4, 4) * 2 + 1
    for _ in range(3):
        bn(x + torch.randn_like(x))
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-1, 1)
    ours = sbn.SyncBatchNorm(6)
    ours.load_state_dict(bn.state_dict())  # strict
    expect("keys equal nn.BatchNorm2d's", list(ours.state_dict()) == list(bn.state_dict()),
           str(list(ours.state_dict())))
    bn.eval(), ours.eval()
    check("nn.BatchNorm2d -> ours: eval outputs", rel_err(ours(x), bn(x)), 1e-6)
    back = nn.BatchNorm2d(6)
    back.load_state_dict(ours.state_dict())
    expect("ours -> nn.BatchNorm2d: every tensor equal",
           all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), bn.state_dict().values())))
    tsync = nn.SyncBatchNorm(6)
    tsync.load_state_dict(ours.state_dict())
    ours2 = sbn.SyncBatchNorm(6)
    ours2.load_state_dict(tsync.state_dict())
    expect("ours -> nn.SyncBatchNorm -> ours: every tensor equal",
           all(torch.equal(a, b) for a, b in zip(ours2.state_dict().values(), bn.state_dict().values())))
    # The pre-version-2 format has no num_batches_tracked: PyTorch 1.x loads
    # it as 0, PyTorch 2.x keeps the module's count. Ours does what the
    # installed PyTorch's BatchNorm2d does.
    old = bn.state_dict()
    del old["num_batches_tracked"]
    old._metadata = {"": {"version": 1}}
    ours3, peer3 = sbn.SyncBatchNorm(6), nn.BatchNorm2d(6)
    ours3.num_batches_tracked.fill_(5)
    peer3.num_batches_tracked.fill_(5)
    ours3.load_state_dict(old)
    peer3.load_state_dict(old)
    expect("version-1 checkpoint without num_batches_tracked loads as BatchNorm2d's (%d)" %
           int(peer3.num_batches_tracked),
           int(ours3.num_batches_tracked) == int(peer3.num_batches_tracked) and
           torch.equal(ours3.running_var, bn.running_var))
    # A whole model saved with nn.BatchNorm2d loads into its converted twin.
    net = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU())
    conv = sbn.convert_sync_batchnorm(copy.deepcopy(net))
    conv.load_state_dict(net.state_dict())
    net.eval(), conv.eval()
    xi = torch.randn(2, 3, 6, 6)
    check("model checkpoint into converted model: outputs", rel_err(conv(xi), net(xi)), 1e-6)
    # deepcopy copies the module, not the library's layer handle
    c2 = copy.deepcopy(ours)
    c2.train()
    c2(x)
    expect("deepcopy gives an independent module", int(c2.num_batches_tracked) ==
           int(ours.num_batches_tracked) + 1 and not torch.equal(c2.running_mean, ours.running_mean))


# A torchvision-style ResNet (BasicBlock + Bottleneck), built here.
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + idt)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + self.downsample(x))


def resnet():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, 2)),
        nn.Sequential(Bottleneck(16, 4, 2)),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10), nn.BatchNorm1d(10))


# float64 modules against PyTorch's float64 BatchNorm. Both compute in
# float64 with different summation orders; for unit-scale data they agree to
# ~1e-14 relative, so 1e-12 is the tolerance. Ill-conditioned channels (mean
# 1e4 x std) lose u * 1e4 of x - mean in both (the mean itself rounds), which
# is ~2e-12; their tolerance is 1e-12 * 1e2.
TOL_F64 = 1e-12


def float64_modules():
    print("float64 modules (.double()) vs torch.nn.BatchNorm*d in float64, 3 training steps + eval:")
    f64 = torch.float64
    for shape, cl, affine, track, momentum, cond in (
            ((6, 5), False, True, True, 0.1, 1.0),
            ((4, 3, 7), False, True, True, None, 1.0),
            ((4, 3, 7), False, True, False, 0.1, 1.0),
            ((3, 4, 5, 6), False, True, True, 0.3, 1.0),
            ((3, 4, 5, 6), True, True, True, None, 1.0),
            ((3, 4, 5, 6), True, False, True, 0.1, 1.0),
            ((2, 3, 3, 4, 5), False, False, False, 0.1, 1.0),
            ((2, 3, 3, 4, 5), True, True, True, 0.1, 1.0),
            ((8, 3, 5, 5), False, True, True, 0.1, 1e4),
            ((8, 3, 5, 5), True, True, True, None, 1e4)):
        C = shape[1]
        m = sbn.SyncBatchNorm(C, momentum=momentum, affine=affine, track_running_stats=track).double()
        peer = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[
            len(shape)](C, momentum=momentum, affine=affine, track_running_stats=track).double()
        if affine:
            with torch.no_grad():
                m.weight.copy_(torch.rand(C, dtype=f64) + 0.5), m.bias.copy_(torch.randn(C, dtype=f64))
                peer.weight.copy_(m.weight), peer.bias.copy_(m.bias)
        err, kept = 0.0, True
        for step in range(4):
            training = step < 3
            m.train(training), peer.train(training)
            mean = cond * torch.randn(C, dtype=f64).view(1, C, *([1] * (len(shape) - 2)))
            x = to_layout(mean + torch.randn(shape, dtype=f64), cl)
            x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
            y1, y2 = m(x1), peer(x2)
            dy = torch.randn(shape, dtype=f64)
            y1.backward(dy), y2.backward(dy)
            kept = kept and y1.dtype == f64 and x1.grad.dtype == f64 and (
                not cl or len(shape) < 4 or not y1.is_contiguous())

            def rel(a, b):
                return ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item()
            err = max(err, rel(y1, y2), rel(x1.grad, x2.grad))
            if affine:
                err = max(err, rel(m.weight.grad, peer.weight.grad), rel(m.bias.grad, peer.bias.grad))
            if track:
                err = max(err, rel(m.running_mean, peer.running_mean), rel(m.running_var, peer.running_var))
                kept = kept and int(m.num_batches_tracked) == int(peer.num_batches_tracked)
        check("%s%s affine=%d track=%d momentum=%s%s: y, dx, grads, running stats (rel)" % (
            list(shape), " CL" if cl else "", affine, track, momentum, " mean 1e4 x std" if cond > 1 else ""),
            err, TOL_F64 * (1e2 if cond > 1 else 1))
        expect("  float64 outputs and gradients, layout kept, num_batches_tracked as PyTorch's", kept)

    # gradcheck: the analytical Jacobian (our backward) against finite
    # differences, for x, weight and bias, in training and eval; the
    # numerical Jacobian calls the module many times before the backward of
    # its first call, which the package recomputes (torch.py, _replay).
    try:
        from torch.func import functional_call  # PyTorch 2.x
    except ImportError:
        from torch.nn.utils.stateless import functional_call  # 1.13
    for cl, training in ((False, True), (True, True), (False, False)):
        m = sbn.SyncBatchNorm(3).double()
        m.train(training)
        if not training:
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(3, dtype=f64)), m.running_var.copy_(torch.rand(3, dtype=f64) + 0.5)
        x = to_layout(torch.randn(4, 3, 3, 2, dtype=f64), cl).requires_grad_()
        w = (torch.rand(3, dtype=f64) + 0.5).requires_grad_()
        b = torch.randn(3, dtype=f64, requires_grad=True)

        def fn(x_, w_, b_, m=m):
            return functional_call(m, {"weight": w_, "bias": b_}, (x_,))
        try:
            ok = torch.autograd.gradcheck(fn, (x, w, b))
        except Exception as e:  # noqa: BLE001
            ok = "%s: %s" % (type(e).__name__, e)
        expect("gradcheck %s, %s (x, weight, bias)" % ("train" if training else "eval",
                                                       "channels_last" if cl else "contiguous"),
               ok is True, "" if ok is True else str(ok))
    m = sbn.SyncBatchNorm(3, affine=False, track_running_stats=False)
    x = torch.randn(5, 3, 4, dtype=f64, requires_grad=True)
    expect("gradcheck without parameters or buffers (follows the float64 input)",
           torch.autograd.gradcheck(m, (x,)))

    # Changing dtype between calls: state carried as PyTorch carries it.
    m, peer = sbn.SyncBatchNorm(3), nn.BatchNorm2d(3)
    err = 0.0
    for conv in ("float", "double", "float", "double"):
        m, peer = getattr(m, conv)(), getattr(peer, conv)()
        dt = torch.float64 if conv == "double" else torch.float32
        x = torch.randn(4, 3, 5, 5, dtype=dt)
        y1, y2 = m(x), peer(x)
        err = max(err, rel_err(y1, y2), rel_err(m.running_var, peer.running_var))
        expect("after .%s(): output and state %s, num_batches_tracked %d" % (
            conv, dt, int(peer.num_batches_tracked)),
            y1.dtype == dt and m.running_mean.dtype == dt and
            int(m.num_batches_tracked) == int(peer.num_batches_tracked))
    check(".float()/.double() alternating: y and running_var vs PyTorch", err, 1e-6)


def convert_revert():
    print("convert_sync_batchnorm / revert_sync_batchnorm on a ResNet:")
    torch.manual_seed(2)
    net = resnet()
    net[3][1].bn2.eval()                      # a training flag to keep
    net[3][0].bn1.weight.requires_grad_(False)  # a requires_grad to keep
    before = {n: type(m) for n, m in net.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    params = {n: p for n, p in net.named_parameters()}
    buffers = {n: b for n, b in net.named_buffers()}
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        ref_out = copy.deepcopy(net)(x)
    conv = sbn.convert_sync_batchnorm(net)
    after = {n: type(m) for n, m in conv.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    expect("every BatchNorm converted (%d)" % len(before),
           set(after) == set(before) and all(t is sbn.SyncBatchNorm for t in after.values()))
    expect("same object returned for a non-BatchNorm root", conv is net)
    expect("parameters shared, not copied",
           all(p is params[n] for n, p in conv.named_parameters()) and len(params) == len(list(conv.parameters())))
    expect("buffers shared", all(b is buffers[n] for n, b in conv.named_buffers()))
    expect("training flag kept", conv[3][1].bn2.training is False and conv[3][0].bn2.training is True)
    expect("requires_grad kept", conv[3][0].bn1.weight.requires_grad is False)
    with torch.no_grad():
        check("converted model (no group: plain BN) gives the same output", rel_err(conv(x), ref_out), 1e-5)
    root = nn.BatchNorm1d(5)
    root_conv = sbn.convert_sync_batchnorm(root)
    expect("a BatchNorm root returns a new SyncBatchNorm",
           root_conv is not root and isinstance(root_conv, sbn.SyncBatchNorm) and root_conv.weight is root.weight)
    rev = sbn.revert_sync_batchnorm(conv)
    back = {n: type(m) for n, m in rev.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    expect("revert restores the original classes", back == before,
           "%d BatchNorm2d, %d BatchNorm1d" % (sum(t is nn.BatchNorm2d for t in back.values()),
                                              sum(t is nn.BatchNorm1d for t in back.values())))
    expect("revert shares parameters and keeps flags",
           all(p is params[n] for n, p in rev.named_parameters()) and rev[3][1].bn2.training is False)
    tsync = nn.SyncBatchNorm.convert_sync_batchnorm(resnet())
    ours = sbn.convert_sync_batchnorm(tsync)
    expect("torch.nn.SyncBatchNorm modules convert too",
           all(type(m) is sbn.SyncBatchNorm for m in ours.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)))
    xr = sbn.revert_sync_batchnorm(sbn.SyncBatchNorm(3))
    expect("revert of a bare SyncBatchNorm gives BatchNormXd", type(xr) is sbn.BatchNormXd)
    import warnings
    with warnings.catch_warnings():  # "Lazy modules are a new feature ..."
        warnings.simplefilter("ignore")
        lazy = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d())
    try:
        sbn.convert_sync_batchnorm(lazy)
        expect("a lazy BatchNorm before its first forward: a clear error", False, "no exception")
    except ValueError as e:
        expect("a lazy BatchNorm before its first forward: a clear error", "first forward" in str(e), str(e))
    lazy(x)  # the dry run: LazyBatchNorm2d becomes BatchNorm2d(4)
    lazy_conv = sbn.convert_sync_batchnorm(lazy)
    expect("... and after it, converted", type(lazy_conv[1]) is sbn.SyncBatchNorm and lazy_conv[1].num_features == 4)
    # The whole converted model through torch.save / pickle (the library's layers
    # are not saved; the loaded model makes its own) trains on as the original.
    import io
    import pickle
    torch.manual_seed(4)
    orig = sbn.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                                    nn.Flatten(), nn.Linear(36, 3), nn.BatchNorm1d(3)))
    xs = [torch.randn(6, 3, 5, 5) for _ in range(3)]
    orig(xs[0]).square().sum().backward()
    buf = io.BytesIO()
    torch.save(orig, buf)
    buf.seek(0)
    copies = [torch.load(buf), pickle.loads(pickle.dumps(orig))]
    err = 0.0
    for x_step in xs[1:]:
        ys = [m(x_step) for m in [orig] + copies]
        err = max([err] + [rel_err(y, ys[0]) for y in ys[1:]])
    err = max([err] + [rel_err(m[5].running_var, orig[5].running_var) for m in copies])
    check("whole model torch.save/load and pickle, 2 more steps: y, running_var", err, 0.0)


def errors():
    print("errors raise syncbn.SyncBNError with the library's message:")

    def raises(name, fn, status, text):
        try:
            fn()
        except syncbn.SyncBNError as e:
            expect(name, e.status == status and text in str(e), str(e))
            return
        except Exception as e:  # noqa: BLE001
            expect(name, False, "raised %r" % e)
            return
        expect(name, False, "no exception")

    m = sbn.SyncBatchNorm(4)
    raises("1-D input", lambda: m(torch.randn(4)), "SBN_STATUS_INVALID_ARGUMENT",
           "expected at least 2D input (got 1D input)")  # PyTorch's words
    raises("0-D input", lambda: m(torch.tensor(1.0)), "SBN_STATUS_INVALID_ARGUMENT",
           "expected at least 2D input (got 0D input)")
    raises("6-D input, wrong C", lambda: m(torch.randn(2, 3, 1, 1, 1, 2)), "SBN_STATUS_INVALID_ARGUMENT",
           "num_features = 4")
    raises("wrong C", lambda: m(torch.randn(2, 3, 5)), "SBN_STATUS_INVALID_ARGUMENT", "num_features = 4")
    raises("float64 input to a float32 module (PyTorch raises too)",
           lambda: m(torch.randn(2, 4, 5, dtype=torch.float64)),
           "SBN_STATUS_INVALID_ARGUMENT", "the input is torch.float64 but the module's parameters and buffers are torch.float32")
    m64 = sbn.SyncBatchNorm(4).double()
    raises("float32 input to a float64 module", lambda: m64(torch.randn(2, 4, 5)),
           "SBN_STATUS_INVALID_ARGUMENT", "the input is torch.float32 but the module's parameters and buffers are torch.float64")
    expect("... which changes no state", int(m64.num_batches_tracked) == 0 and
           torch.equal(m64.running_var, torch.ones(4, dtype=torch.float64)))
    raises("one value per channel in training", lambda: m(torch.randn(1, 4)),
           "SBN_STATUS_INVALID_ARGUMENT", "expected more than 1 value per channel")
    for name, bad in (("1-D input", torch.randn(4)), ("one value per channel in training", torch.randn(1, 4))):
        try:
            m(bad)
            expect("%s: a ValueError, as PyTorch raises" % name, False, "no exception")
        except ValueError as e:
            expect("%s: a ValueError, as PyTorch raises (and a SyncBNError)" % name, isinstance(e, syncbn.SyncBNError),
                   type(e).__name__)
    expect("a failed forward changes no state", int(m.num_batches_tracked) == 0 and
           torch.equal(m.running_mean, torch.zeros(4)))
    # Without CUDA support the library answers NOT_BUILT; with it but without a
    # GPU, a clear error naming the missing device; with a GPU the layer exists.
    try:
        m._layer(None, (1, 0), syncbn._lib.DTYPE_FLOAT32, True)
        expect("CUDA layer: created (this machine has a GPU)", True, "")
    except syncbn.SyncBNError as e:
        expect("CUDA layer without CUDA support or without a GPU",
               (e.status == "SBN_STATUS_NOT_BUILT" and "CUDA" in str(e)) or
               (e.status == "SBN_STATUS_INVALID_ARGUMENT" and "is not a device" in str(e)), str(e))
    raises("meta tensors", lambda: m(torch.empty(2, 4, device="meta")), "SBN_STATUS_INVALID_ARGUMENT",
           "not supported")
    # PyTorch's rule: input, parameters and buffers on one device (here: a
    # module whose buffers moved to the meta device, the only other device a
    # CPU-only PyTorch has).
    mm = sbn.SyncBatchNorm(4)
    mm.running_mean = torch.zeros(4, device="meta")
    try:
        mm(torch.randn(3, 4))
        expect("buffers on another device than the input: an error", False, "no exception")
    except RuntimeError as e:
        expect("buffers on another device than the input: an error naming both",
               "same device" in str(e) and "meta" in str(e), str(e))
    # The backward of an earlier forward: the later forward moved the
    # earlier one's statistics into a record, which backward restores
    # (test_distributed.py: the same, synchronized): PyTorch's gradient.
    x = torch.randn(3, 4, requires_grad=True)
    x2 = torch.randn(3, 4) * 2 + 1
    peer = nn.BatchNorm1d(4)
    dy = torch.randn(3, 4)
    y1 = m(x)
    m(x2)
    y1.backward(dy)
    xp = x.detach().clone().requires_grad_()
    peer(xp).backward(dy)
    check("backward of an earlier forward (restored): dx vs PyTorch", rel_err(x.grad, xp.grad), TOL)
    # retain_graph: a second backward of the same forward adds the same
    # gradient again, also after the module ran again in between.
    x.grad = None
    y1 = m(x)
    y1.backward(dy, retain_graph=True)
    g1 = x.grad.clone()
    y1.backward(dy, retain_graph=True)
    check("retain_graph: a second backward adds the same dx", rel_err(x.grad, 2 * g1), TOL)
    m(x2)
    y1.backward(dy)
    check("retain_graph: a third after another forward, the same again", rel_err(x.grad, 3 * g1), TOL)
    # The first call in torch.inference_mode (a validation pass before
    # training), then training: the layer made in that first call works.
    mi, pi = sbn.SyncBatchNorm(4).eval(), nn.BatchNorm1d(4).eval()
    with torch.inference_mode():
        e = rel_err(mi(x2), pi(x2))
    mi.train(), pi.train()
    xi, xq = x2.clone().requires_grad_(), x2.clone().requires_grad_()
    mi(xi).backward(dy)
    pi(xq).backward(dy)
    check("first call under inference_mode, then training: y, dx vs PyTorch",
          max(e, rel_err(xi.grad, xq.grad), rel_err(mi.running_var, pi.running_var)), TOL)
    # Gradient checkpointing recomputes the forward in backward (the
    # non-reentrant kind from inside autograd's saved-tensor hooks), also of a
    # module applied twice in the checkpointed region: PyTorch's gradients.
    from torch.utils.checkpoint import checkpoint
    for reentrant in (True, False):
        torch.manual_seed(5)
        mc = nn.Sequential(nn.Conv2d(3, 4, 3), sbn.SyncBatchNorm(4), nn.ReLU())
        pc = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        pc.load_state_dict(mc.state_dict())
        xc = torch.randn(5, 3, 8, 8, requires_grad=True)
        xq = xc.detach().clone().requires_grad_()
        twice = (lambda mod: lambda t: mod(t) * mod(t * 2 + 1))
        checkpoint(twice(mc), xc, use_reentrant=reentrant).square().sum().backward()
        checkpoint(twice(pc), xq, use_reentrant=reentrant).square().sum().backward()
        e = max(rel_err(xc.grad, xq.grad), rel_err(mc[0].weight.grad, pc[0].weight.grad),
                rel_err(mc[1].weight.grad, pc[1].weight.grad), rel_err(mc[1].running_var, pc[1].running_var))
        check("checkpoint(use_reentrant=%s), module applied twice inside: vs PyTorch" % reentrant, e, 1e-5)
    # A loop with a backward after each forward keeps no record (the graph
    # before is freed), even while its output is still referenced.
    mr = sbn.SyncBatchNorm(4)
    y = None
    for step in range(3):
        y = mr(x2 + step)
        y.backward(dy)
    layers = [entry[-1] for entry in mr._layers.values()]
    expect("a backward after each forward: no record made",
           all(not la.free_records and la.current().record is None for la in layers), str(len(layers)))
    # Unsupported input dtype: the library's error, naming torch's dtype.
    m = sbn.SyncBatchNorm(3)
    xi = torch.randint(0, 5, (4, 3, 2))
    raises("int64 input: an error naming the dtype", lambda: m(xi), "SBN_STATUS_UNSUPPORTED", "torch.int64")
    # Double backward (create_graph=True) is refused by name, not silently wrong.
    xg = torch.randn(4, 3, 5, requires_grad=True)
    g, = torch.autograd.grad(m(xg).square().sum(), xg, create_graph=True)
    try:
        g.sum().backward()
        expect("double backward: a clear error", False, "no exception")
    except RuntimeError as e:
        expect("double backward: a clear error", "differentiated twice" in str(e), str(e).splitlines()[0])
    # A gradient penalty through torch.autograd.grad: the incoming gradient is
    # a constant, the second-order terms are this layer's own; refused too.
    lin = nn.Linear(3, 3).double()
    mp = sbn.SyncBatchNorm(3).double()
    xg = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(mp(lin(xg)).tanh().sum(), xg, create_graph=True)
    try:
        torch.autograd.grad(g.square().sum(), [lin.weight, mp.weight], allow_unused=True)
        expect("gradient penalty through the layer: a clear error", False, "no exception")
    except RuntimeError as e:
        expect("gradient penalty through the layer: a clear error", "differentiated twice" in str(e),
               str(e).splitlines()[0])
    # create_graph=True with no second backward: the first-order gradients as without it.
    grads = []
    for create_graph in (False, True):
        grads.append([t.detach() for t in torch.autograd.grad(
            mp(lin(xg)).tanh().sum(), [xg, mp.weight, lin.weight], create_graph=create_graph)])
    check("create_graph=True, first order: dx, dweight as without it",
          max(rel_err(a, b) for a, b in zip(*grads)), 0.0)


def compiled():
    print("torch.compile (PyTorch 2.x): the layer runs eagerly inside a compiled model,")
    print("  against the same model in float64 (PyTorch's float32 BatchNorm2d as the peer):")
    if not hasattr(torch, "compile"):
        print("  SKIP: torch %s has no torch.compile" % torch.__version__)
        return
    import warnings

    def model(bn):
        return nn.Sequential(nn.Conv2d(3, 8, 3), bn(8), nn.ReLU(), nn.Conv2d(8, 4, 3), bn(4, momentum=None))
    torch.manual_seed(3)
    ours, peer, ref = model(sbn.SyncBatchNorm), model(nn.BatchNorm2d), model(nn.BatchNorm2d).double()
    peer.load_state_dict(ours.state_dict())
    ref.load_state_dict(ours.state_dict())
    # float32 convolutions (compiled or not) round sums of 27-72 products:
    # ~1e-6 relative per step; 3 steps of gradients accumulate it.
    tol = 2e-5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = torch.compile(ours)
        for step in range(3):
            x = torch.randn(4, 3, 10, 10)
            y, yp, yr = fast(x), peer(x), ref(x.double())
            for out in (y, yp, yr):
                out.square().sum().backward()
            check("step %d: y (peer %.1e)" % (step, rel_err(yp, yr)), rel_err(y, yr), tol)
        pairs = list(zip(ours.parameters(), peer.parameters(), ref.parameters()))
        check("parameter gradients after 3 steps (peer %.1e)" % max(rel_err(b.grad, c.grad) for a, b, c in pairs),
              max(rel_err(a.grad, c.grad) for a, b, c in pairs), tol)
        fast.eval(), ref.eval()
        check("eval output", rel_err(fast(x), ref(x.double())), tol)
    check("running statistics", max(rel_err(a, b) for a, b in zip(ours.buffers(), ref.buffers())), tol)
    traced = [str(w.message).splitlines()[0] for w in caught if "ctypes" in str(w.message)]
    expect("the tracer does not try to follow the library's ctypes calls (%d warnings)" % len(traced),
           not traced)
    if hasattr(torch, "export"):  # eval exports as plain BatchNorm
        ours.eval()
        x2 = torch.randn(3, 3, 10, 10) * 2 + 1
        with torch.no_grad():
            exported = torch.export.export(ours, (x2,)).module()
            check("torch.export of the eval model vs the module", rel_err(exported(x2), ours(x2)), 1e-5)


def traced():
    print("torch.jit.trace: eval traces as plain BatchNorm, training refuses by name:")
    torch.manual_seed(4)
    net = nn.Sequential(nn.Conv2d(3, 6, 3), sbn.SyncBatchNorm(6), nn.ReLU(), nn.Flatten(),
                        nn.Linear(6 * 4 * 4, 5), sbn.SyncBatchNorm(5, track_running_stats=False))
    for _ in range(3):  # running statistics that are not the initial ones
        net(torch.randn(4, 3, 6, 6) * 2 + 1)
    net.eval()
    x = torch.randn(3, 3, 6, 6)
    with torch.no_grad():
        t = torch.jit.trace(net, x, check_trace=False)
        x2 = torch.randn(5, 3, 6, 6) * 3 - 1  # another batch: the trace must not have frozen values
        check("traced eval model vs the module, another input", rel_err(t(x2), net(x2)), 1e-5)
    expect("the trace holds batch_norm ops, no Python calls",
           "batch_norm" in str(t.inlined_graph) and "PythonOp" not in str(t.inlined_graph))
    # The buffers decide in eval, as in PyTorch: kept with track_running_stats
    # False, the running statistics; None, the batch's.
    ours, ref = sbn.SyncBatchNorm(6), nn.BatchNorm2d(6)
    ours(torch.randn(4, 6, 3, 3) * 2 + 1)
    ref.load_state_dict(ours.state_dict())
    for what, edit in (("track_running_stats False", lambda m: setattr(m, "track_running_stats", False)),
                       ("running buffers None", lambda m: (setattr(m, "running_mean", None),
                                                           setattr(m, "running_var", None)))):
        for m in (ours, ref):
            edit(m)
            m.eval()
        x6, x7 = torch.randn(3, 6, 4, 4), torch.randn(5, 6, 4, 4) * 2 + 1
        with torch.no_grad():
            t = torch.jit.trace(ours, x6, check_trace=False)
            check("traced eval, %s: vs nn.BatchNorm2d" % what, rel_err(t(x7), ref(x7)), 1e-5)
    net.train()
    try:
        torch.jit.trace(net, x, check_trace=False)
        expect("training forward under torch.jit.trace: a clear error", False, "no exception")
    except RuntimeError as e:
        expect("training forward under torch.jit.trace: a clear error", "cannot be traced" in str(e),
               str(e).splitlines()[0][:100])


def empty_inputs():
    """Empty batches and empty maps, with the layer's channel count and with
    another one, in training and eval: the output (or the exception),
    running statistics, num_batches_tracked and parameter gradients as
    nn.BatchNorm2d gives them (no process group)."""
    print("empty inputs (against nn.BatchNorm2d):")
    for training in (True, False):
        for shape in ((0, 3, 2, 2), (4, 3, 0, 2), (0, 5, 2, 2), (4, 5, 0, 2)):
            res = []
            for m in (nn.BatchNorm2d(3), sbn.SyncBatchNorm(3)):
                m.running_mean.fill_(0.25)
                m.train(training)
                x = torch.randn(*shape, requires_grad=True)
                try:
                    y = m(x)
                    y.sum().backward()
                    res.append((tuple(y.shape), m.running_mean.tolist(), m.running_var.tolist(),
                                int(m.num_batches_tracked), m.weight.grad.tolist(), tuple(x.grad.shape)))
                except Exception as e:  # pylint: disable=broad-except
                    res.append(("raises", type(e).__name__, int(m.num_batches_tracked)))
            expect("%s %s" % ("training" if training else "eval", shape), res[0] == res[1],
                   "nn.BatchNorm2d %s, ours %s" % (res[0], res[1]))


def nonfinite():
    """inf, -inf and NaN in the batch, also as a channel's first value (the
    kernels' shift): y, dx, grads and running statistics hold inf and NaN
    where nn.BatchNorm2d's do, and agree elsewhere (float32, both layouts)."""
    print("non-finite inputs (against nn.BatchNorm2d, float32):")

    def same(a, b):
        a, b = a.detach().double(), b.detach().double()
        if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isposinf(), b.isposinf())
                and torch.equal(a.isneginf(), b.isneginf())):
            return float("inf")
        fin = a.isfinite()
        return rel_err(a[fin], b[fin]) if fin.any() else 0.0

    cases = [("+inf first value", (0, 0, 0, 0), float("inf")),
             ("-inf first value", (0, 1, 0, 0), float("-inf")),
             ("NaN first value", (0, 2, 0, 0), float("nan")),
             ("+inf inside", (3, 1, 2, 1), float("inf")),
             ("NaN inside", (2, 0, 1, 2), float("nan"))]
    for name, at, v in cases:
        for cl in (False, True):
            x = torch.randn(4, 3, 3, 3) * 2 + 1
            x[at] = v
            g = torch.randn(4, 3, 3, 3)
            ref, ours = nn.BatchNorm2d(3), sbn.SyncBatchNorm(3)
            xr = to_layout(x, cl).requires_grad_()
            xo = to_layout(x, cl).requires_grad_()
            ref(xr).backward(g)
            yr, yo = ref(xr.detach()), None
            ours(xo).backward(g)
            yo = ours(xo.detach())
            err = max(same(yr, yo), same(xr.grad, xo.grad), same(ref.weight.grad, ours.weight.grad),
                      same(ref.bias.grad, ours.bias.grad), same(ref.running_mean, ours.running_mean),
                      same(ref.running_var, ours.running_var))
            check("%s, %s" % (name, "channels_last" if cl else "contiguous"), err, 1e-5)


def changed_buffers():
    """Running buffers set to None, track_running_stats switched after
    construction, num_batches_tracked removed (test-time adaptation does
    these): each call decides as PyTorch's BatchNorm does, from the module's
    state at that call. float64 modules against nn.BatchNorm2d, two training
    or eval steps each, y, dx, running statistics and num_batches_tracked."""
    print("changed buffers and flags (float64, against nn.BatchNorm2d):")

    def edits_none(m):
        m.running_mean = None
        m.running_var = None

    def edits_var_none(m):
        m.running_var = None

    def edits_untrack(m):
        m.track_running_stats = False

    def edits_nbt_none(m):
        m.num_batches_tracked = None

    def edits_nbt_none_cumulative(m):
        m.num_batches_tracked = None
        m.momentum = None

    def edits_tent(m):
        m.track_running_stats = False
        m.running_mean = None
        m.running_var = None

    cases = [("running buffers None", edits_none), ("running_var None", edits_var_none),
             ("track_running_stats set False", edits_untrack),
             ("num_batches_tracked None", edits_nbt_none),
             ("num_batches_tracked None, momentum None", edits_nbt_none_cumulative),
             ("track False and buffers None (TENT)", edits_tent)]
    warm = torch.randn(5, 4, 3, 3, dtype=torch.float64) * 3 - 2
    for name, edit in cases:
        for training in (True, False):
            if not training and edit is edits_var_none:
                continue  # an error in PyTorch, checked below
            ref, ours = nn.BatchNorm2d(4).double(), sbn.SyncBatchNorm(4).double()
            ref(warm)
            ours.load_state_dict(ref.state_dict())
            for m in (ref, ours):
                edit(m)
                m.train(training)
            err, refused = 0.0, False
            for step in range(2):
                x = (torch.randn(6, 4, 3, 3, dtype=torch.float64) * (step + 1) + 1).requires_grad_()
                xr = x.detach().clone().requires_grad_()
                g = torch.randn(6, 4, 3, 3, dtype=torch.float64)
                try:  # PyTorch 2.x refuses one running buffer without the other
                    yr = ref(xr)
                except ValueError as e:
                    try:
                        ours(x)
                        err = float("inf")
                    except ValueError as e2:
                        err = max(err, 0.0 if str(e2) == str(e) else float("inf"))
                    refused = True
                    break
                ours(x).backward(g)
                yr.backward(g)
                err = max(err, rel_err(ours(x.detach()), ref(xr.detach())) if not training else 0.0,
                          rel_err(x.grad, xr.grad))
                for a, b in zip(list(ours.buffers()), list(ref.buffers())):
                    err = max(err, rel_err(a.double(), b.double()))
                if len(list(ours.buffers())) != len(list(ref.buffers())):
                    err = float("inf")
            check("%s, %s: %s" % (name, "train" if training else "eval",
                                  "PyTorch's error" if refused else "dx, buffers"), err, 1e-12)
    # A lazily negated view (its data unnegated, a bit says so) is read negated.
    x = torch.randn(3, 4, 2, 2, dtype=torch.float64)
    # Forward-mode AD (dual tensors): refused by name before the call changes
    # anything (PyTorch's error for a Function without jvp names no module and
    # comes after the forward has updated the running statistics).
    import torch.autograd.forward_ad as fwAD
    mf = sbn.SyncBatchNorm(3).double()
    before = [t.clone() for t in mf.buffers()]
    try:
        with fwAD.dual_level():
            mf(fwAD.make_dual(torch.randn(4, 3, 5, dtype=torch.float64), torch.ones(4, 3, 5, dtype=torch.float64)))
        expect("forward-mode AD: a clear error", False, "no exception")
    except NotImplementedError as e:
        expect("forward-mode AD: a clear error, running statistics unchanged",
               "forward-mode AD" in str(e) and all(torch.equal(u, v) for u, v in zip(before, mf.buffers())),
               str(e)[:90])
    xf = torch.randn(4, 3, 5, dtype=torch.float64) * 2 + 1
    with fwAD.dual_level():  # a dual level without dual inputs: an ordinary call
        check("forward-AD level active, no dual tensors: y vs nn.BatchNorm1d",
              rel_err(mf(xf), nn.BatchNorm1d(3).double()(xf)), 1e-12)

    xn = x._neg_view() if hasattr(x, "_neg_view") else -x
    ref, ours = nn.BatchNorm2d(4).double(), sbn.SyncBatchNorm(4).double()
    check("a negated view: y and running_mean vs nn.BatchNorm2d",
          max(rel_err(ours(xn), ref(-x)), rel_err(ours.running_mean, ref.running_mean)), 1e-12)
    # A channels_last input that is not dense (sliced): a channels_last output, as PyTorch's.
    xs = torch.randn(5, 6, 4, 4).contiguous(memory_format=torch.channels_last)[:, 1:5]
    y = sbn.SyncBatchNorm(4)(xs)
    expect("a sliced channels_last input gives a channels_last output",
           y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous())
    # vmap's batched tensors have no storage: a clear error.
    try:
        torch.autograd.functional.jacobian(sbn.SyncBatchNorm(2).double(),
                                           torch.randn(3, 2, dtype=torch.float64), vectorize=True)
        expect("jacobian(vectorize=True): a clear error", False, "no exception")
    except RuntimeError as e:
        expect("jacobian(vectorize=True): a clear error", "vectorize" in str(e), str(e)[:90])
    # torch.jit.script: refused by name, with what to do instead.
    try:
        torch.jit.script(nn.Sequential(nn.Conv2d(3, 4, 1), sbn.SyncBatchNorm(4)))
        expect("torch.jit.script: a clear error", False, "no exception")
    except RuntimeError as e:
        expect("torch.jit.script: a clear error", "cannot be scripted" in str(e), str(e)[:80])
    # eps = 0: as the installed PyTorch (1.x computes with it, 2.x refuses it in training).
    for training in (True, False):
        ref, ours = nn.BatchNorm2d(4, eps=0.0).double(), sbn.SyncBatchNorm(4, eps=0.0).double()
        ref.train(training), ours.train(training)
        x = torch.randn(3, 4, 2, 2, dtype=torch.float64) * 2 + 1
        try:
            yr = ref(x)
        except ValueError as e:
            try:
                ours(x)
                expect("eps = 0, %s: PyTorch's error" % ("train" if training else "eval"), False, "no error")
            except ValueError as e2:
                expect("eps = 0, %s: PyTorch's error" % ("train" if training else "eval"), str(e) == str(e2),
                       str(e2))
            continue
        check("eps = 0, %s: y and running_var vs nn.BatchNorm2d" % ("train" if training else "eval"),
              max(rel_err(ours(x), yr), rel_err(ours.running_var, ref.running_var)), 1e-12)
    ref, ours = nn.BatchNorm2d(4), sbn.SyncBatchNorm(4)
    msgs = []
    for m in (ref, ours):
        m.running_var = None
        m.eval()
        try:
            m(torch.randn(2, 4, 3, 3))
            msgs.append("no error")
        except (RuntimeError, ValueError) as e:  # 1.x: RuntimeError; 2.x: ValueError
            msgs.append("%s: %s" % ("ValueError" if isinstance(e, ValueError) else "RuntimeError", e))
    expect("eval with running_var None: PyTorch's error", msgs[0] == msgs[1], " / ".join(msgs))


def memory_formats():
    """Inputs of every stride pattern (expanded along C or N/H/W, transposed,
    sliced, permuted, channels_last 4-D and 5-D dense or sliced, N x C x 1 x 1,
    empty): y and dx have the strides nn.BatchNormXd gives them on the same
    input, for incoming gradients of several layouts, and the values of a
    float64 BatchNorm on a contiguous copy."""
    print("odd strides (strides against nn.BatchNormXd, values against float64):")
    g = torch.Generator().manual_seed(21)
    cl4, cl5 = torch.channels_last, torch.channels_last_3d

    def r(*shape):
        return torch.randn(*shape, generator=g)

    cases = [
        ("expanded along C", r(3, 1, 5, 6).expand(3, 4, 5, 6)),
        ("expanded along C, 3-D", r(3, 1, 7).expand(3, 4, 7)),
        ("expanded along C, 5-D", r(2, 1, 2, 3, 4).expand(2, 4, 2, 3, 4)),
        ("expanded along C, (N, C)", r(5, 1).expand(5, 4)),
        ("channels_last (N, 1, H, W) expanded along C",
         r(3, 1, 5, 6).contiguous(memory_format=cl4).expand(3, 4, 5, 6)),
        ("expanded along N", r(1, 4, 5, 6).expand(3, 4, 5, 6)),
        ("expanded along H and W", r(3, 4, 1, 1).expand(3, 4, 5, 6)),
        ("H and W transposed", r(3, 4, 6, 5).transpose(2, 3)),
        ("N and C transposed", r(4, 3, 5, 6).transpose(0, 1)),
        ("(N, L, C) permuted to (N, C, L)", r(3, 7, 4).permute(0, 2, 1)),
        ("(C, N) transposed", r(4, 5).t()),
        ("sliced along W", r(3, 4, 5, 12)[..., ::2]),
        ("sliced along C", r(3, 8, 5, 6)[:, ::2]),
        ("permuted (H, N, W, C)", r(5, 3, 6, 4).permute(1, 3, 0, 2)),
        ("channels_last", r(3, 4, 5, 6).contiguous(memory_format=cl4)),
        ("channels_last sliced along W", r(3, 4, 5, 12).contiguous(memory_format=cl4)[..., ::2]),
        ("channels_last sliced along C", r(3, 8, 5, 6).contiguous(memory_format=cl4)[:, ::2]),
        ("channels_last_3d", r(2, 4, 2, 3, 4).contiguous(memory_format=cl5)),
        ("channels_last_3d sliced along W", r(2, 4, 2, 3, 8).contiguous(memory_format=cl5)[..., ::2]),
        ("channels_last_3d with size-1 dims", r(2, 4, 1, 3, 1).contiguous(memory_format=cl5)),
        ("channels_last (N, C, 1, 1)", r(3, 4, 1, 1).as_strided((3, 4, 1, 1), (4, 1, 4, 4))),
        ("dense channels_last_3d, strides not ordered like it",
         r(8).as_strided((1, 4, 1, 2, 1), (1, 1, 1, 4, 1))),
        ("channels_last (1, C, H, W)", r(1, 4, 5, 6).contiguous(memory_format=cl4)),
        ("(1, C, H, 1) from a permuted tensor", r(4, 1, 5, 1).permute(1, 0, 2, 3)),
        ("empty, channels_last", r(0, 4, 5, 6).contiguous(memory_format=cl4)),
        ("empty, H and W transposed", r(0, 4, 6, 5).transpose(2, 3)),
        ("empty, expanded along C", r(0, 1, 5, 6).expand(0, 4, 5, 6)),
    ]
    kinds = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}

    def grads(y):  # incoming gradients: contiguous, channels_last, y's own, transposed C
        dy = torch.randn(y.shape, generator=g)
        out = [dy, torch.empty_like(y).copy_(dy)]
        if y.dim() in (4, 5):
            out.append(dy.contiguous(memory_format=cl4 if y.dim() == 4 else cl5))
        if y.dim() >= 3:
            out.append(dy.transpose(1, 2).contiguous().transpose(1, 2))
        return out

    for name, x in cases:
        bad, err = [], 0.0
        for training in (True, False):
            ref = kinds[x.dim()](4).train(training)
            with torch.no_grad():
                ref.weight.uniform_(0.5, 1.5, generator=g), ref.bias.uniform_(-1, 1, generator=g)
                ref.running_mean.uniform_(-1, 1, generator=g), ref.running_var.uniform_(1, 2, generator=g)
            ours = sbn.convert_sync_batchnorm(copy.deepcopy(ref))
            exact = copy.deepcopy(ref).double()
            xr, xo = x.detach().requires_grad_(), x.detach().requires_grad_()
            x64 = x.detach().double().contiguous().requires_grad_()
            yr, yo, y64 = ref(xr), ours(xo), exact(x64)
            if yr.stride() != yo.stride():
                bad.append("%s y %s, nn.BatchNorm %s" % ("training" if training else "eval",
                                                         yo.stride(), yr.stride()))
            err = max(err, rel_err(yo, y64))
            for dy in grads(yr):
                dxr, = torch.autograd.grad(yr, xr, dy, retain_graph=True)
                dxo, = torch.autograd.grad(yo, xo, dy, retain_graph=True)
                dx64, = torch.autograd.grad(y64, x64, dy.double().contiguous(), retain_graph=True)
                if dxr.stride() != dxo.stride():
                    bad.append("%s dx %s, nn.BatchNorm %s (dy %s)" % (
                        "training" if training else "eval", dxo.stride(), dxr.stride(), dy.stride()))
                err = max(err, rel_err(dxo, dx64))
        expect("%s %s: strides of y and dx as nn.BatchNorm's" % (name, tuple(x.stride())), not bad,
               "; ".join(bad[:3]) + ("; ..." if len(bad) > 3 else ""))
        check("    y, dx vs float64", err, 1e-5)


def pytorch_edges():
    """What PyTorch's BatchNorm accepts and a user may try: weight or bias set
    to None, momentum outside [0, 1] (PyTorch applies its formula), a momentum
    schedule (one library layer, not one per value), eps < 0 in eval, a 16-bit
    module given float32 input (PyTorch refuses), inputs of more than 5 dims,
    torch.fx.symbolic_trace."""
    print("PyTorch's edges (float64 modules against nn.BatchNorm2d):")
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64) * 2 + 1 for _ in range(3)]

    def pair(**kw):
        ref = nn.BatchNorm2d(3, **kw).double()
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5, generator=g), ref.bias.uniform_(-1, 1, generator=g)
        ours = sbn.SyncBatchNorm(3, **kw).double()
        ours.load_state_dict(ref.state_dict())
        return ours, ref

    for what in ("weight", "bias"):
        ours, ref = pair()
        for m in (ours, ref):
            setattr(m, what, None)
        err = 0.0
        for x in xs:
            a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = ours(a), ref(b)
            (ya * torch.arange(ya.numel(), dtype=ya.dtype).view_as(ya).sin()).sum().backward()
            (yb * torch.arange(yb.numel(), dtype=yb.dtype).view_as(yb).sin()).sum().backward()
            err = max(err, rel_err(ya, yb), rel_err(a.grad, b.grad))
        check("%s set to None: y, dx vs nn.BatchNorm2d" % what, err, 1e-12)

    for momentum in (-1.0, 1.5, -0.25):
        ours, ref = pair(momentum=momentum)
        for x in xs:
            ours(x), ref(x)
        ours.eval(), ref.eval()
        err = max(rel_err(ours.running_mean, ref.running_mean), rel_err(ours.running_var, ref.running_var),
                  rel_err(ours(xs[0]), ref(xs[0])))
        check("momentum %g: running stats, eval y vs nn.BatchNorm2d" % momentum, err, 1e-12)

    ours, ref = pair()
    for x in xs[:2]:
        ours(x), ref(x)
    for m in (ours, ref):
        m.eps = -0.5
        m.eval()
    check("eps -0.5 in eval (PyTorch computes it): y vs nn.BatchNorm2d", rel_err(ours(xs[2]), ref(xs[2])), 1e-12)

    # eps < 0 in training, one process: PyTorch normalizes with var + eps
    # (finite here: every channel's variance is above 1), as plain BatchNorm.
    ours, ref = pair(eps=-0.5)
    err = 0.0
    for x in xs:
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(a), ref(b)
        (ya * ya).sum().backward(), (yb * yb).sum().backward()
        err = max(err, rel_err(ya, yb), rel_err(a.grad, b.grad), rel_err(ours.weight.grad, ref.weight.grad),
                  rel_err(ours.running_var, ref.running_var))
    check("eps -0.5 in training, one process: y, dx, grad_weight, running_var vs nn.BatchNorm2d", err, 1e-12)
    expect("eps -0.5 in training: num_batches_tracked as PyTorch's",
           int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == len(xs))

    ours, ref = pair()
    for step in range(40):  # a momentum schedule, as BN-momentum schedulers do
        for m in (ours, ref):
            m.momentum = 0.5 * 0.9 ** step
        ours(xs[step % 3]), ref(xs[step % 3])
    err = max(rel_err(ours.running_mean, ref.running_mean), rel_err(ours.running_var, ref.running_var))
    check("momentum schedule, 40 values: running stats", err, 1e-12)
    expect("momentum schedule: one library layer held, not one per value", len(ours._layers) == 1,
           "%d layers" % len(ours._layers))

    for dtype in (torch.bfloat16, torch.float16):
        msgs = []
        for m in (nn.BatchNorm2d(3).to(dtype), sbn.SyncBatchNorm(3).to(dtype)):
            try:
                m(torch.randn(2, 3, 2, 2))
                msgs.append("no error")
            except RuntimeError as e:
                msgs.append(str(e).splitlines()[0])
                is_value_error = isinstance(e, ValueError)
        expect("float32 input to a %s module: refused, as by PyTorch" % str(dtype)[6:],
               msgs[1] != "no error" and "float32" in msgs[1] and str(dtype)[6:] in msgs[1], msgs[1])
        expect("  ... with SyncBNValueError (a ValueError), as the README says", is_value_error)

    for shape in ((3, 3, 2, 1, 2, 3), (2, 3, 2, 1, 2, 2, 3), (0, 3, 2, 2, 2, 2)):
        # More than 5 dims: PyTorch's SyncBatchNorm (and F.batch_norm) take any from 2.
        ours, ref = pair()
        ref._check_input_dim = lambda x: None  # BatchNorm2d's own check aside: F.batch_norm decides
        err, strides_ok = 0.0, True
        for x in (torch.randn(shape, generator=g, dtype=torch.float64),
                  torch.randn(shape, generator=g, dtype=torch.float64).transpose(2, 4)):
            for training in (True, False):
                ours.train(training), ref.train(training)
                a, b = x.detach().requires_grad_(), x.detach().requires_grad_()
                ya, yb = ours(a), ref(b)
                dy = torch.randn(ya.shape, generator=g, dtype=torch.float64)
                da, = torch.autograd.grad(ya, a, dy)
                db, = torch.autograd.grad(yb, b, dy)
                err = max(err, rel_err(ya, yb), rel_err(da, db), rel_err(ours.running_var, ref.running_var))
                strides_ok &= ya.stride() == yb.stride() and da.stride() == db.stride()
        check("%d-D input %s: y, dx, running_var vs nn.BatchNorm" % (len(shape), shape), err, 1e-12)
        expect("    strides of y and dx as nn.BatchNorm's, num_batches_tracked %d" % int(ref.num_batches_tracked),
               strides_ok and int(ours.num_batches_tracked) == int(ref.num_batches_tracked))

    torch.manual_seed(5)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 9, 6),
                        nn.BatchNorm1d(6)).double()
    twin = copy.deepcopy(net)
    ours = sbn.convert_sync_batchnorm(net)
    gm = torch.fx.symbolic_trace(ours)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "sync_batch_norm" in str(n.target)]
    expect("torch.fx.symbolic_trace of a converted model: one call per SyncBatchNorm", len(calls) == 2,
           "%d calls" % len(calls))
    err = 0.0
    for x in xs:  # training through the GraphModule: the modules' running statistics move
        err = max(err, rel_err(gm(x), twin(x)))
    err = max(err, rel_err(ours[1].running_var, twin[1].running_var), rel_err(ours[5].running_mean,
                                                                              twin[5].running_mean))
    gm.eval(), twin.eval()
    err = max(err, rel_err(gm(xs[0]), twin(xs[0])))
    check("the traced model, 3 training steps + eval vs the BatchNorm model", err, 1e-12)
    try:  # PyTorch's SyncBatchNorm cannot be traced alone either (its forward branches on the input)
        torch.fx.symbolic_trace(sbn.SyncBatchNorm(3))
        expect("torch.fx.symbolic_trace of a SyncBatchNorm alone: a clear error", False, "no error")
    except RuntimeError as e:
        expect("torch.fx.symbolic_trace of a SyncBatchNorm alone: a clear error", "root" in str(e), str(e))


def functional_calls():
    """torch.nn.utils.stateless.functional_call (torch.func.functional_call in
    PyTorch 2.x) runs the module with the tensors it is given: the running
    statistics of a training call are read from and updated in the buffers
    given, the module's own stay, and eval normalizes with the given ones."""
    print("functional_call with given parameters and buffers (float64, against nn.BatchNorm2d):")
    try:
        from torch.func import functional_call
    except ImportError:
        from torch.nn.utils.stateless import functional_call
    g = torch.Generator().manual_seed(12)
    ref = nn.BatchNorm2d(3).double()
    ours = sbn.SyncBatchNorm(3).double()
    ours.load_state_dict(ref.state_dict())
    given = []
    for m in (ours, ref):
        tensors = {k: v.detach().clone() for k, v in m.state_dict().items()}
        with torch.no_grad():
            tensors["weight"].copy_(torch.tensor([0.5, 1.0, 1.5])), tensors["bias"].copy_(torch.tensor([0.1, -0.2, 0.3]))
            tensors["running_mean"].fill_(0.7), tensors["running_var"].fill_(2.0)
        for k in ("weight", "bias"):
            tensors[k].requires_grad_()
        given.append(tensors)
    err = 0.0
    for step in range(3):
        x = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64) * 2 + 1
        dy = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64)
        for m in (ours, ref):
            m.train(step < 2)
        ya, yb = (functional_call(m, t, (x,)) for m, t in zip((ours, ref), given))
        ya.backward(dy), yb.backward(dy)
        err = max(err, rel_err(ya, yb))
    a, b = given
    err = max(err, max(rel_err(a[k].grad, b[k].grad) for k in ("weight", "bias")),
              max(rel_err(a[k], b[k]) for k in ("running_mean", "running_var")))
    check("2 training calls + eval: y, grads, the given running stats", err, 1e-12)
    expect("    the given num_batches_tracked counts (%d, nn.BatchNorm2d %d), the module's own stay"
           % (int(a["num_batches_tracked"]), int(b["num_batches_tracked"])),
           int(a["num_batches_tracked"]) == int(b["num_batches_tracked"]) == 2 and
           all(torch.equal(u, v) for u, v in zip(ours.state_dict().values(), ref.state_dict().values())) and
           int(ours.num_batches_tracked) == 0 and float(ours.running_var[0]) == 1.0)


def meta_tensors():
    """Modules and inputs on the meta device (shape inference, deferred
    initialization): what nn.BatchNorm gives, with no library call."""
    print("meta tensors (against nn.BatchNorm):")
    for training in (True, False):
        for shape, cl in (((2, 3, 4, 4), False), ((2, 3, 4, 4), True), ((2, 3, 5), False), ((2, 3, 1, 2, 2, 2), False)):
            res = []
            for make in (lambda: nn.BatchNorm2d(3, device="meta"), lambda: sbn.SyncBatchNorm(3, device="meta")):
                m = make().train(training)
                m._check_input_dim = lambda x: None  # BatchNorm2d's own check aside: F.batch_norm decides
                x = torch.empty(shape, device="meta")
                if cl:
                    x = x.contiguous(memory_format=torch.channels_last)
                x.requires_grad_()
                try:
                    y = m(x)
                    y.sum().backward()
                    res.append((tuple(y.shape), y.stride(), y.dtype, str(y.device), x.grad.stride(),
                                tuple(m.weight.grad.shape), str(m.num_batches_tracked.device)))
                except Exception as e:  # pylint: disable=broad-except
                    res.append(("raises", type(e).__name__))
            expect("%s %s%s: y and dx shape, strides, device" % ("training" if training else "eval", shape,
                                                               " channels_last" if cl else ""),
                   res[0] == res[1] and res[1][0] != "raises", "nn.BatchNorm %s, ours %s" % (res[0], res[1]))


def user_paths():
    """What a training script does around the layer, against the same model
    with nn.BatchNorm2d: CPU autocast to bfloat16, forwards under no_grad and
    inference_mode, activation checkpointing, deepcopy of a converted model,
    full backward hooks, an output used by two branches and through a view."""
    print("around the layer (a Conv-BN-ReLU-Conv-BN model against the same with nn.BatchNorm2d,")
    print("  float64 but for autocast):")
    import torch.utils.checkpoint as cp

    def models(dtype):
        torch.manual_seed(6)  # convolutions without bias: BatchNorm makes its gradient zero (noise)
        net = nn.Sequential(nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                            nn.Conv2d(6, 4, 3, bias=False), nn.BatchNorm2d(4, momentum=None))
        net = net.to(dtype)
        twin = copy.deepcopy(net)
        return sbn.convert_sync_batchnorm(net), twin

    def state(m, *extra):
        return [p.grad for p in m.parameters()] + [b for b in m.buffers() if b.is_floating_point()] + list(extra)

    def compare(what, run, tol, dtype=torch.float64):
        outs = []
        for m in models(dtype):
            torch.manual_seed(7)
            outs.append(run(m))
        check(what, max(rel_err(a, b) for a, b in zip(*outs)), tol)

    def autocast(m):
        x = torch.randn(4, 3, 8, 8, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        assert y.dtype == torch.bfloat16, y.dtype  # as nn.BatchNorm2d's under autocast
        y.float().square().sum().backward()
        return [y] + state(m, x.grad)
    # bfloat16 activations: the layers see the same bfloat16 conv outputs and
    # round y once (2^-9); the gradients add one more rounding.
    compare("autocast(cpu, bfloat16): y, grads, running stats", autocast, 2.0 ** -8, torch.float32)

    def no_grad_modes(m):
        outs = []
        for mode in (torch.no_grad, torch.inference_mode):
            for training in (True, False):
                m.train(training)
                with mode():
                    outs.append(m(torch.randn(4, 3, 8, 8, dtype=torch.float64) * 2 + 1))
        m.train()
        x = torch.randn(4, 3, 8, 8, dtype=torch.float64, requires_grad=True)  # then training as usual
        m(x).square().sum().backward()
        return outs + state(m, x.grad, *[b for b in m.buffers() if not b.is_floating_point()])
    compare("no_grad / inference_mode forwards (train and eval), then a step", no_grad_modes, 1e-12)

    for reentrant in (True, False):
        def checkpointed(m, reentrant=reentrant):
            x = torch.randn(4, 3, 8, 8, dtype=torch.float64, requires_grad=True)
            kw = {"use_reentrant": reentrant} if "use_reentrant" in cp.checkpoint.__code__.co_varnames else {}
            if not reentrant and not kw:
                return [x]  # this PyTorch has only the reentrant kind
            y = cp.checkpoint(m, x, **kw)
            (y * torch.randn(y.shape, dtype=y.dtype)).sum().backward()
            return [y] + state(m, x.grad)
        compare("checkpoint(use_reentrant=%s): y, grads, running stats" % reentrant, checkpointed, 1e-12)

    def deepcopied(m):
        m(torch.randn(2, 3, 8, 8, dtype=torch.float64)).sum().backward()  # a used model: library layers, gradients
        c = copy.deepcopy(m)
        outs = []
        for model in (m, c):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                y = model(torch.randn(3, 3, 8, 8, dtype=torch.float64))
                (y * torch.randn(y.shape, dtype=y.dtype)).sum().backward()
                opt.step()
            outs += list(model.state_dict().values())
        return [t.double() for t in outs]
    compare("deepcopy of a used model: both train apart, as nn's copies", deepcopied, 1e-12)

    def hooked(m):
        log = []
        m[1].register_forward_hook(lambda mod, i, o: log.append(o.detach().clone()))
        m[1].register_full_backward_hook(lambda mod, gi, go: log.extend([gi[0], go[0]]))
        x = torch.randn(4, 3, 8, 8, dtype=torch.float64, requires_grad=True)
        y = m(x)
        z = y[:, :2].mul(3).sum() + y.transpose(1, 3)[..., 1:].square().sum()  # two branches, views
        z.backward(retain_graph=True)
        z.backward()  # the same graph twice: gradients accumulate
        return log + state(m, x.grad)
    compare("hooks, y in two branches via views, retain_graph twice", hooked, 1e-12)


if __name__ == "__main__":
    if not os.environ.get("SYNCBN_NUM_THREADS"):
        torch.set_num_threads(2)
    print("syncbn %s from %s" % (syncbn.__version__, syncbn.library_path))
    numerics()
    float64_modules()
    state_dicts()
    convert_revert()
    errors()
    changed_buffers()
    nonfinite()
    empty_inputs()
    memory_formats()
    compiled()
    traced()
    pytorch_edges()
    functional_calls()
    meta_tensors()
    user_paths()
    finish("syncbn.torch single-process")
