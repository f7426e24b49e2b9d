"""SyncBatchNorm for PyTorch on CPU (and CUDA), backed by libsyncbn.

    import syncbn.torch as sbn
    model = sbn.convert_sync_batchnorm(model)        # before DDP, like PyTorch's
    model = torch.nn.parallel.DistributedDataParallel(model)   # gloo, CPU

`SyncBatchNorm` is a drop-in for `torch.nn.SyncBatchNorm` (same constructor,
parameters, buffers and state-dict format) that runs on CPU tensors, where
PyTorch's refuses them. Its batch statistics (forward) and gradient sums
(backward) are reduced over the process group by libsyncbn through
torch.distributed's collectives: per forward, a 64-byte signature reduction
(a disagreement between ranks becomes an error on every rank) and one
all-reduce of P x (2C+1) float64 values (each rank's 2C+1 sums in its own
slot, merged exactly by the library, so results are bitwise independent of
gloo's reduction order and equal to the C backends'); per backward the same
with 2C values.

The layer's parameters and buffers are this module's torch tensors: each call
copies weight, bias, running statistics and num_batches_tracked (O(C)) into
the library's layer and the updated statistics back, so optimizer updates,
load_state_dict and DDP's buffer broadcasts are always seen.

CUDA tensors (a library built with CUDA: libsyncbn_cuda next to libsyncbn)
run the library's CUDA kernels on the tensor's GPU, on PyTorch's current
stream. The statistics go through host memory to torch.distributed (gloo
directly; NCCL through a small tensor on the current GPU), which waits for
the stream once per collective; a training forward with running statistics
also waits once to read num_batches_tracked, which the library keeps on the
GPU.
"""
import ctypes
import functools
import os
import weakref

import torch
import torch.fx
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from . import _lib
from ._group import torch_group, _host_tensor
from ._lib import SyncBNError

# torch.compile and torch.export (PyTorch 2.x) cannot follow the library's
# ctypes calls. A training forward is marked not to be traced: one clean
# graph break instead of many warnings. An eval forward under a tracer is
# plain BatchNorm (SyncBatchNorm._plain_eval), which they record.
_compiler = getattr(torch, "compiler", None)
_not_traced = getattr(_compiler, "disable", None) or (lambda fn: fn)
_is_compiling = getattr(_compiler, "is_compiling", None) or (lambda: False)

__all__ = ["SyncBatchNorm", "BatchNormXd", "convert_sync_batchnorm", "revert_sync_batchnorm",
           "SyncBNError"]

_DTYPES = {torch.float32: _lib.DTYPE_FLOAT32, torch.bfloat16: _lib.DTYPE_BFLOAT16,
           torch.float16: _lib.DTYPE_FLOAT16, torch.float64: _lib.DTYPE_FLOAT64}
_STATE_DTYPES = {_lib.DTYPE_FLOAT32: torch.float32, _lib.DTYPE_FLOAT64: torch.float64}
_threads_set = [None]
_THREADS_FROM_ENV = bool(os.environ.get("SYNCBN_NUM_THREADS"))  # the library reads it once too


def _sync_threads():
    """Kernel threads follow torch.get_num_threads() unless SYNCBN_NUM_THREADS is set."""
    if _THREADS_FROM_ENV:
        return
    t = torch.get_num_threads()
    if _threads_set[0] != t:
        _lib.check(_lib.lib.sbn_set_num_threads(t))
        _threads_set[0] = t


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _strides_like_channels_last(x):
    """c10's is_channels_last_strides_2d/3d, what PyTorch's suggest_memory_format
    asks of a 4-D or 5-D tensor that is not dense in either order: are its
    strides ordered C, W, H, (D,) N? A stride-0 channel dim (an input expanded
    along C) and ambiguous N1..1 shapes count as channels-first, as there."""
    sizes, strides = x.shape, x.stride()
    if strides[1] == 0:
        return False
    smallest = 0
    for d in (1,) + tuple(range(x.dim() - 1, 1, -1)) + (0,):
        if sizes[d] == 0 or strides[d] < smallest:
            return False
        if d == 0 and smallest == strides[1]:
            return False
        smallest = strides[d] * max(sizes[d], 1)
    return True


@functools.lru_cache(maxsize=None)
def _dense_order_kept(ndim):
    """Does the installed PyTorch's BatchNorm keep the order of an input that is
    dense in channels_last order (4-D) / channels_last_3d order (5-D) when its
    strides alone would not say so (size-1 dims)? Always for 4-D; for 5-D
    PyTorch 1.13 does not, later versions do. Asked once of a 4-value probe."""
    if ndim == 4:
        return True
    probe = torch.zeros(4).as_strided((1, 2, 1, 2, 1), (1, 1, 1, 2, 2))  # dense, not "like" CL3d
    with torch.no_grad():
        y = torch.nn.functional.batch_norm(probe, None, None, None, None, True, 0.0, 1e-5)
    return not y.is_contiguous()


def _dense_either(t, cl):
    """PyTorch's test for its BatchNorm kernels' fast path: t dense in
    channels-first order or in the channels-last order it keeps (above)."""
    return t.is_contiguous() or (t.is_contiguous(memory_format=cl) and _dense_order_kept(t.dim()))


def _memory_format(x):
    """The memory format of PyTorch's BatchNorm output for input x (its CPU
    kernel): contiguous when x is; channels_last(_3d) when x is dense in that
    order or its strides are ordered like it (sliced, expanded along N/H/W);
    otherwise contiguous (transposed, expanded along C, 2-D and 3-D inputs)."""
    if x.is_contiguous():
        return torch.contiguous_format
    cl = _CHANNELS_LAST.get(x.dim())
    if cl is not None and (_dense_either(x, cl) or _strides_like_channels_last(x)):
        return cl
    return torch.contiguous_format


def _grad_format(x, dy):
    """The memory format of PyTorch's BatchNorm input gradient: x's suggested
    format, except that when x and dy are both dense with the same suggested
    format the dense order of x wins (they differ only for degenerate shapes
    such as N x C x 1 x 1, which are dense in both orders)."""
    cl = _CHANNELS_LAST.get(x.dim())
    if cl is None:
        return torch.contiguous_format

    def suggested(t):
        return cl if _strides_like_channels_last(t) else torch.contiguous_format

    if _dense_either(x, cl) and _dense_either(dy, cl) and suggested(x) == suggested(dy):
        return _memory_format(x)
    return suggested(x)


def _layout(memory_format):
    """The library's layout for a tensor dense in `memory_format`."""
    if memory_format == torch.contiguous_format:
        return _lib.LAYOUT_CHANNELS_FIRST
    return _lib.LAYOUT_CHANNELS_LAST


def _dense(t, memory_format):
    """t itself if the library can read it in `memory_format`'s order (the
    strides of size-1 dims do not matter), else a dense copy."""
    if t.is_neg():  # a lazy negation (a view's bit the data do not carry)
        t = t.resolve_neg()
    if t.numel() == 0:  # no data: nothing to read
        return t
    return t.contiguous(memory_format=memory_format)


def _new_like(x, memory_format, fmt_wanted):
    """(buffer the library writes in `memory_format`'s order, tensor to return):
    the same tensor when `fmt_wanted` (PyTorch's format for it) has that order
    in memory, else the result is copied into PyTorch's format afterwards."""
    if fmt_wanted == memory_format:
        out = torch.empty_like(x, memory_format=memory_format)
        return out, out
    out = torch.empty_like(x, memory_format=fmt_wanted)
    if out.is_contiguous(memory_format=memory_format):  # degenerate shapes: same order
        return out, out
    return torch.empty_like(x, memory_format=memory_format), out


def _device_of(t):
    """(library device type, index) of a tensor's device."""
    if t.device.type == "cuda":
        index = t.device.index
        return _lib.DEVICE_CUDA, torch.cuda.current_device() if index is None else index
    return _lib.DEVICE_CPU, 0


_Shape = ctypes.c_int64 * _lib.MAX_DIMS
X, Y, DX = range(3)  # the roles of a call's tensors (each has its own description)


def _desc(layer, role, t, layout):
    """The library's description of tensor t, which plays `role` in a call of
    `layer`. Descriptions are kept per role and shape (a training loop repeats
    its shapes): only the data pointer changes from call to call."""
    key = (role, t.shape, t.dtype, layout)
    d = layer.descs.get(key)
    if d is None:
        if len(layer.descs) >= 64:  # shapes that keep changing: do not grow without bound
            layer.descs.clear()
        d = layer.descs[key] = _lib.Tensor(None, t.dim(), _Shape(*t.shape[:_lib.MAX_DIMS]),
                                           _DTYPES.get(t.dtype, -1), layout,
                                           _lib.Device(*layer.device))
    try:
        d.data = t.data_ptr() or None
    except RuntimeError as e:  # a tensor without storage: vmap's batched tensors
        raise RuntimeError("syncbn.torch.SyncBatchNorm: its work runs in libsyncbn on tensors with "
                           "storage; it cannot run under vmap / torch.func transforms or "
                           "torch.autograd.functional.jacobian(vectorize=True) (%s)" % e) from None
    return d


class _CudaArray:
    """Device memory described by the CUDA array interface, which
    torch.as_tensor wraps without a copy."""

    def __init__(self, address, count, dtype):
        typestr = {torch.float32: "<f4", torch.float64: "<f8"}[dtype]
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": typestr,
                                         "data": (address, False), "version": 2,
                                         "strides": None}


def _device_tensor(address, count, dtype, index):
    """A torch tensor aliasing `count` values at an address on GPU `index`."""
    return torch.as_tensor(_CudaArray(address, count, dtype), device="cuda:%d" % index)


class _Layer:
    """One libsyncbn layer, with torch views of its per-channel state."""

    def __init__(self, num_features, eps, momentum, affine, track, group, device,
                 param_dtype=_lib.DTYPE_FLOAT32):
        opt = _lib.lib.sbn_bn_options_default(num_features)
        opt.param_dtype = param_dtype
        opt.eps = eps
        opt.momentum = _lib.MOMENTUM_CUMULATIVE if momentum is None else momentum
        opt.affine = int(affine)
        opt.track_running_stats = int(track)
        opt.device = _lib.Device(*device)
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.sbn_bn_create(ctypes.byref(handle), ctypes.byref(opt),
                                          group.handle if group else None))
        self.handle, self.group, self.device, self.track = handle, group, device, bool(track)
        self.descs = {}  # (role, shape, dtype, layout) -> _lib.Tensor, see _desc
        self.training = None  # the mode last set in the library
        self.cuda = device[0] == _lib.DEVICE_CUDA
        self.nbt_seen = None  # CUDA: (tensor, version) of the num_batches_tracked last pushed
        self.nbt_count = None  # the layer's num_batches_tracked as last set or read
        self.current = None  # weak reference to the _Forward whose statistics the layer holds
        self.free_records = []  # _Records no forward holds any more, for reuse
        self.views = {}
        wanted = ([_lib.BN_TENSOR_WEIGHT, _lib.BN_TENSOR_BIAS, _lib.BN_TENSOR_GRAD_WEIGHT,
                   _lib.BN_TENSOR_GRAD_BIAS] if affine else []) + \
                 ([_lib.BN_TENSOR_RUNNING_MEAN, _lib.BN_TENSOR_RUNNING_VAR] if track else [])
        for tid in wanted:
            d = _lib.Tensor()
            _lib.check(_lib.lib.sbn_bn_tensor(ctypes.byref(d), handle, tid))
            dtype = _STATE_DTYPES[d.dtype]
            self.views[tid] = (_device_tensor(d.data, num_features, dtype, device[1]) if self.cuda
                               else _host_tensor(d.data, num_features, dtype))
            if self.views[tid].data_ptr() != d.data:  # a copy would never see the layer's updates
                raise SyncBNError(_lib.STATUS_INTERNAL, "syncbn.torch: the view of the layer's state "
                                  "at 0x%x is a copy at 0x%x" % (d.data, self.views[tid].data_ptr()))

    def set_stream(self):
        """CUDA: the library's work goes on PyTorch's current stream of the
        layer's GPU (so it is ordered with the copies in and out)."""
        if self.cuda:
            stream = torch.cuda.current_stream(self.device[1]).cuda_stream
            self.check(_lib.lib.sbn_bn_set_stream(self.handle, ctypes.c_void_p(stream)))

    def keep_current(self):
        """Before the layer's statistics are replaced (by a forward or a
        restore): if the forward they belong to may still be differentiated,
        they move into a record of it (O(C), on the layer's device)."""
        fwd = self.current() if self.current is not None else None
        self.current = None
        if fwd is not None and fwd.record is None and fwd.differentiable():
            record = self.free_records.pop() if self.free_records else _Record(self)
            self.set_stream()
            _lib.check(_lib.lib.sbn_bn_save_forward(self.handle, record.handle))
            fwd.record = record

    def check(self, status):
        if self.group is not None:
            self.group.check(status)
        else:
            _lib.check(status)

    def __del__(self):
        if getattr(self, "handle", None) is not None and _lib.lib is not None:
            self.views = {}
            _lib.lib.sbn_bn_destroy(self.handle)


def _load_state(layer, weight, bias, running_mean, running_var, training):
    """The module's parameters, running statistics and mode into the layer."""
    v = layer.views
    if weight is not None:
        v[_lib.BN_TENSOR_WEIGHT].copy_(weight)
        v[_lib.BN_TENSOR_BIAS].copy_(bias)
    if running_mean is not None:
        v[_lib.BN_TENSOR_RUNNING_MEAN].copy_(running_mean)
    if running_var is not None:  # (training may update just one of them, as PyTorch's does)
        v[_lib.BN_TENSOR_RUNNING_VAR].copy_(running_var)
    if layer.training != training:
        layer.check(_lib.lib.sbn_bn_set_training(layer.handle, int(training)))
        layer.training = training


class _Record:
    """A library record of a forward's statistics (sbn_bn_record); it may
    outlive its layer."""

    def __init__(self, layer):
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.sbn_bn_record_create(ctypes.byref(handle), layer.handle))
        self.handle = handle

    def __del__(self):
        if getattr(self, "handle", None) is not None and _lib.lib is not None:
            _lib.lib.sbn_bn_record_destroy(self.handle)


class _Forward:
    """One forward of a layer, as its backward sees it. The library keeps the
    statistics of a layer's latest forward only; when the same module runs
    again while this forward can still be differentiated (two inputs through
    one module, as in contrastive learning; gradcheck's extra calls; a graph
    kept with retain_graph=True), _Layer.keep_current moves them into a
    record, which backward restores. A training loop that runs backward
    after each forward never needs one: by the next forward autograd has
    freed the graph."""

    def __init__(self, layer, ctx):
        self.layer, self.record, self.ctx = layer, None, weakref.ref(ctx)

    def differentiable(self):
        """Can autograd still run this forward's backward (its graph alive,
        its saved tensors not freed by an earlier backward)? Asked of the
        raw saved tensors: unpacking them would run saved-tensor hooks
        (non-reentrant checkpointing recomputes the forward there)."""
        ctx = self.ctx()
        if ctx is None:
            return False
        try:
            getattr(ctx, "_raw_saved_tensors", None)
        except RuntimeError:  # freed by a backward without retain_graph
            return False
        return True

    def __del__(self):
        record = getattr(self, "record", None)
        if record is not None:
            self.layer.free_records.append(record)


def _make_current(ctx, layer, weight, bias):
    """Before a backward: the statistics of ctx's forward back in the layer,
    and the weight it normalized with (gradcheck perturbs weight in place
    between calls)."""
    fwd = ctx.forward
    if layer.current is not None and layer.current() is fwd:
        return
    if fwd.record is None:  # keep_current saves every forward autograd can still reach
        raise SyncBNError(_lib.STATUS_INTERNAL, "syncbn.torch: the statistics of this "
                          "backward's forward were not kept")
    layer.keep_current()
    layer.set_stream()
    _lib.check(_lib.lib.sbn_bn_restore_forward(layer.handle, fwd.record.handle))
    layer.current = weakref.ref(fwd)
    if ctx.affine:
        with torch.no_grad():
            layer.views[_lib.BN_TENSOR_WEIGHT].copy_(weight)
            layer.views[_lib.BN_TENSOR_BIAS].copy_(bias)


def _push_nbt(layer, nbt):
    """The module's num_batches_tracked into the layer. A CUDA layer keeps it
    on the GPU, and setting it waits for the GPU: skipped when the module's
    tensor is the one this layer last wrote and nothing changed it since
    (its version counter; load_state_dict and fill_ change it)."""
    if layer.cuda and layer.nbt_seen is not None and layer.nbt_seen[0] is nbt and \
            layer.nbt_seen[1] == nbt._version:
        return
    layer.nbt_count = int(nbt)
    layer.check(_lib.lib.sbn_bn_set_num_batches_tracked(layer.handle, layer.nbt_count))
    layer.nbt_seen = (nbt, nbt._version)


def _tell_peers(layer, backward, exc):
    """This rank's call fails before it reaches the library (a check of ours,
    or torch, refused its input): the layer still joins the collective the
    call would have made, carrying the failure (sbn_bn_fail_call), so the
    other ranks' calls raise SBN_STATUS_PEER_FAILED naming this rank instead
    of waiting for it, or pairing with its next call. The caller then raises
    exc. Without a group (or in eval) nothing is sent."""
    if layer is None or layer.group is None:
        return
    if not backward and layer.training is not True:  # a layer made by this call
        if _lib.lib.sbn_bn_set_training(layer.handle, 1) != 0:
            return
        layer.training = True
    code = exc.code if isinstance(exc, SyncBNError) else \
        _lib.STATUS_OUT_OF_MEMORY if isinstance(exc, MemoryError) else _lib.STATUS_INVALID_ARGUMENT
    text = exc.detail if isinstance(exc, SyncBNError) else "%s: %s" % (type(exc).__name__, exc)
    _lib.lib.sbn_bn_fail_call(layer.handle, int(backward), code, text.encode(errors="replace")[:1000])


def _state(module, name):
    """The module's parameter or buffer `name` (None if it has none), looked up
    as PyTorch's BatchNorm.forward looks it up: as an attribute. Tools that
    substitute a module's tensors for one call (torch.func.functional_call,
    torch.nn.utils.stateless) may do it by overriding attribute access, which
    the _parameters/_buffers dicts do not see: the running statistics of such
    a call must be read from, and updated in, the tensors given, not the
    module's own."""
    return getattr(module, name, None)


def _momentum_in_library(momentum):
    """Does the library's running-statistics update take this momentum as it is?
    It takes None (cumulative average) and [0, 1]; PyTorch applies its formula
    to any number, so for others (and NaN) the layer runs with momentum 1 (its
    running statistics become the batch's) and the module mixes them in."""
    return momentum is None or 0.0 <= momentum <= 1.0


def _as_torch_would(x, rm, rv, training, eps):
    """Cases where PyTorch versions differ (one running buffer without the
    other, eps <= 0 in training): ask the installed PyTorch's batch_norm on
    two rows of zeros, and raise what it raises (no state changes: momentum
    0). Cheap, and run only for those cases."""
    buffer = rm if rm is not None else rv
    channels = buffer.numel() if buffer is not None else 1
    zeros = torch.zeros(2, channels, dtype=buffer.dtype if buffer is not None else torch.float32,
                        device=x.device)
    with torch.no_grad():
        torch.nn.functional.batch_norm(zeros, rm, rv, None, None, training, 0.0, eps)


def _grad_out(view, dtype):
    """A gradient autograd may keep: a copy of the library's, in the parameter's dtype."""
    return view.clone() if view.dtype == dtype else view.to(dtype)


_TWICE = ("syncbn.torch.SyncBatchNorm cannot be differentiated twice (its backward runs in "
          "libsyncbn): a second-order gradient through it (create_graph=True with a gradient "
          "penalty, gradgradcheck, ...) is not supported")


_FORWARD_AD = ("syncbn.torch.SyncBatchNorm does not support forward-mode AD "
               "(torch.autograd.forward_ad dual tensors, torch.func.jvp): its work runs in libsyncbn "
               "and has no forward derivative. Use reverse mode (backward, torch.autograd.grad), or "
               "call syncbn.torch.revert_sync_batchnorm(model) first")


def _check_no_tangents(*tensors):
    """Forward-mode AD: refused before the call changes anything (PyTorch's own
    error for a custom Function without jvp comes after the forward has run,
    and names no module). Cheap when no dual level is active."""
    fwad = torch.autograd.forward_ad
    if getattr(fwad, "_current_level", -1) < 0:
        return
    for t in tensors:
        if t is not None and fwad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(_FORWARD_AD)


class _SecondOrder(torch.autograd.Function):
    """Under create_graph=True: the layer's gradients, tied to what they
    depend on (x, weight, bias, the incoming gradient), so that a second
    backward that needs any of those reaches this node and raises."""

    @staticmethod
    def forward(ctx, grads, *depends_on):
        return tuple(grads)

    @staticmethod
    def backward(ctx, *unused):
        raise RuntimeError(_TWICE)


def _first_order_only(backward):
    """The library's backward is not itself differentiable: under
    create_graph=True its gradients raise when differentiated. (torch's
    once_differentiable ties them to the incoming gradient only: a gradient
    penalty taken with torch.autograd.grad, whose incoming gradient is a
    constant, would silently miss this layer's second-order terms.)"""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return outputs
        deps = [t for t in tuple(ctx.saved_tensors) + grads
                if isinstance(t, torch.Tensor) and t.requires_grad]
        present = [i for i, t in enumerate(outputs) if t is not None]
        if not deps or not present:
            return outputs
        tied = _SecondOrder.apply([outputs[i] for i in present], *deps)
        out = list(outputs)
        for i, t in zip(present, tied if isinstance(tied, tuple) else (tied,)):
            out[i] = t
        return tuple(out)
    return wrapper


def _empty_output(x, weight, bias):
    """The output for an input without values, with the strides PyTorch's
    BatchNorm gives it: a clone, times weight[0], plus bias[0]."""
    y = x.clone()
    if weight is not None and weight.numel():
        y = y * weight[0]
    if bias is not None and bias.numel():
        y = y + bias[0]
    return y


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module, layer, running):
        """running: the module's (running_mean, running_var) this call uses
        (SyncBatchNorm._running), or (None, None)."""
        x_in = x  # saved: under create_graph, x's own graph (_first_order_only)
        v = layer.views
        # (autograd runs a Function's forward with gradients off)
        track, training = layer.track, module.training
        rm, rv = running
        nbt = _state(module, "num_batches_tracked")
        try:
            fmt = _memory_format(x)  # PyTorch's for the output; the library works in its order
            layout, x = _layout(fmt), _dense(x, fmt)
            y = torch.empty_like(x, memory_format=fmt) if x.numel() else _empty_output(x, weight, bias)
            _load_state(layer, weight if module.affine else None, bias, rm, rv, training)
            if track and nbt is not None:
                _push_nbt(layer, nbt)
            tx, ty = _desc(layer, X, x, layout), _desc(layer, Y, y, layout)
            layer.keep_current()
            layer.set_stream()
        except Exception as e:
            _tell_peers(layer, False, e)
            raise
        layer.check(_lib.lib.sbn_bn_forward(layer.handle, ctypes.byref(ty), ctypes.byref(tx)))
        ctx.forward = _Forward(layer, ctx)
        layer.current = weakref.ref(ctx.forward)
        if track and training:
            # Without num_batches_tracked, momentum None averages with factor 0
            # in PyTorch: the running statistics stay.
            momentum = module.momentum
            if nbt is not None or momentum is not None:
                for buf, tid in ((rm, _lib.BN_TENSOR_RUNNING_MEAN), (rv, _lib.BN_TENSOR_RUNNING_VAR)):
                    if buf is None:
                        continue
                    if _momentum_in_library(momentum):
                        buf.copy_(v[tid])
                    else:  # the layer ran with momentum 1: its running state is this batch's
                        buf.copy_(v[tid].double() * momentum + buf.double() * (1.0 - momentum))
            if nbt is not None:
                before = layer.nbt_count
                count = ctypes.c_int64()
                layer.check(_lib.lib.sbn_bn_get_num_batches_tracked(layer.handle,
                                                                   ctypes.byref(count)))
                if count.value == before:
                    # Every rank's batch was empty: the library changes nothing, while
                    # PyTorch's module counts every training call before normalizing.
                    layer.check(_lib.lib.sbn_bn_set_num_batches_tracked(layer.handle, before + 1))
                    count.value = before + 1
                nbt.fill_(count.value)
                layer.nbt_seen, layer.nbt_count = (nbt, nbt._version), count.value
        elif training and module.track_running_stats and nbt is not None:
            nbt.add_(1)  # running buffers set to None: PyTorch still counts the batch
        ctx.save_for_backward(x_in, weight, bias)
        ctx.layer, ctx.format, ctx.affine = layer, fmt, module.affine
        ctx.param_dtype = weight.dtype if weight is not None else None
        return y

    @staticmethod
    def jvp(ctx, *tangents):  # a dual tensor the check before forward did not see
        raise NotImplementedError(_FORWARD_AD)

    @staticmethod
    @_first_order_only
    def backward(ctx, dy):
        layer = ctx.layer
        try:
            x, weight, bias = ctx.saved_tensors
            fmt, layout = ctx.format, _layout(ctx.format)
            dx_format = _grad_format(x, dy)  # PyTorch's for dx, from the caller's tensors
            dy = dy.to(x.dtype)
            x = _dense(x, fmt)  # x itself unless forward made a dense copy
            _make_current(ctx, layer, weight, bias)
            need_dx = ctx.needs_input_grad[0]
            if need_dx and x.numel() == 0:  # PyTorch: dy times a scalar, dy's strides
                dx, dx_out = (torch.empty_like(dy),) * 2
            elif need_dx:
                dx, dx_out = _new_like(x, fmt, dx_format)
            else:
                dx = dx_out = None
            dy = _dense(dy, fmt)
            tx, tdy = _desc(layer, X, x, layout), _desc(layer, Y, dy, layout)
            tdx = _desc(layer, DX, dx, layout) if need_dx else None
            layer.set_stream()
            if ctx.affine:
                layer.check(_lib.lib.sbn_bn_zero_grad(layer.handle))
        except Exception as e:
            _tell_peers(layer, True, e)
            raise
        layer.check(_lib.lib.sbn_bn_backward(layer.handle,
                                             ctypes.byref(tdx) if need_dx else None,
                                             ctypes.byref(tdy), ctypes.byref(tx)))
        gw = gb = None
        if ctx.affine:
            if ctx.needs_input_grad[1]:
                gw = _grad_out(layer.views[_lib.BN_TENSOR_GRAD_WEIGHT], ctx.param_dtype)
            if ctx.needs_input_grad[2]:
                gb = _grad_out(layer.views[_lib.BN_TENSOR_GRAD_BIAS], ctx.param_dtype)
        if dx_out is not dx:
            dx_out.copy_(dx)
        return dx_out, gw, gb, None, None, None


class SyncBatchNorm(_BatchNorm):
    r"""Batch normalization synchronized over a torch.distributed process group,
    on CPU tensors (float32, bfloat16 or float16; float64 for a module made
    float64 with ``.double()``, as PyTorch's; any strides, the output and
    input gradient in the memory format PyTorch's BatchNorm gives them;
    (N, C), (N, C, L), (N, C, H, W), (N, C, D, H, W) or more dims).

    Same arguments, parameters, buffers and state dict as
    ``torch.nn.SyncBatchNorm``. In training, mean and biased variance are
    those of the whole group's batch (ranks may hold different N, also 0),
    and the running variance is updated with the unbiased global variance;
    weight/bias gradients are this rank's (DDP averages them). Eval mode with
    running statistics does not communicate. Without torch.distributed
    initialized, or in a group of one process, it is plain BatchNorm.

    process_group: a torch.distributed group (default: the whole world).
    Errors from the library raise :class:`syncbn.SyncBNError` on every rank
    of the group (e.g. a rank whose input has a different C gets
    SBN_STATUS_MISMATCH everywhere instead of a hang).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group
        self._layers = {}

    def _check_input_dim(self, input):
        pass  # the library checks (2-D..5-D, C), on every rank of the group

    def __prepare_scriptable__(self):  # torch.jit.script asks each module first
        raise RuntimeError("syncbn.torch.SyncBatchNorm cannot be scripted (torch.jit.script): its "
                           "work runs in libsyncbn. For an evaluation model, trace it in eval mode "
                           "(torch.jit.trace) or call syncbn.torch.revert_sync_batchnorm(model) "
                           "first")

    def __getstate__(self):  # library handles are not copied (deepcopy, pickling)
        state = self.__dict__.copy()
        state["_layers"] = {}
        return state

    def _sync_group(self):
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return None
        pg = self.process_group or dist.group.WORLD
        if dist.get_world_size(pg) <= 1:
            return None
        return torch_group(pg)

    @staticmethod
    def _param_dtype(state_dtype):
        """The library layer's state dtype, from the module's (_state_dtype):
        float64 for a module made float64
        (module.double()), else float32 (which also serves 16-bit inputs and
        modules, as before). A module without parameters or buffers follows
        its input, as PyTorch's does. A float64 input to a float32 module (or
        the reverse) reaches the library, which refuses it on every rank."""
        return _lib.DTYPE_FLOAT64 if state_dtype == torch.float64 else _lib.DTYPE_FLOAT32

    def _state_dtype(self, input):
        """The dtype of the module's parameters (or running buffers; else the input's)."""
        for t in (_state(self, "weight") if self.affine else None,
                  _state(self, "running_mean"), _state(self, "running_var")):
            if t is not None:
                return t.dtype
        return input.dtype

    def _running(self):
        """What PyTorch's BatchNorm decides from the module's state at each
        call: (batch statistics?, running_mean, running_var), the buffers
        this call reads or updates (None: not used). Training updates them
        if track_running_stats; evaluation uses them if they are not None
        (whatever track_running_stats says), else the batch's statistics."""
        rm, rv = _state(self, "running_mean"), _state(self, "running_var")
        if self.training and not self.track_running_stats:
            rm = rv = None
        batch_stats = self.training or (rm is None and rv is None)
        return batch_stats, rm, rv

    def _layer(self, group, device, param_dtype, track):
        """The library layer for this call; track: it uses running statistics.
        One layer per kind of call; a new eps or momentum (a momentum schedule,
        swa_utils.update_bn) replaces that kind's layer instead of adding one
        (a backward still pending keeps the old one alive through its graph).
        Momentum only matters in training: evaluation layers ignore it."""
        momentum = self.momentum if self.training else 0.0
        if not _momentum_in_library(momentum):
            momentum = 1.0  # see _momentum_in_library
        key = (id(group), self.training, self.affine, track, device, param_dtype)
        entry = self._layers.get(key)
        layer = entry[2] if entry is not None and entry[:2] == (self.eps, momentum) else None
        if layer is None:
            # The library gives each layer made on a group an ordinal, checked in
            # every collective: layers are made on first use, in forward order,
            # which is the same on every rank. A module converted between float32
            # and float64 gets a layer of the other dtype (its state is the
            # module's tensors, loaded on every call).
            # Its views of the library's state are kept across calls: made under
            # torch.inference_mode (a first call in a validation pass) they would
            # be inference tensors, which later training calls may not write.
            with torch.inference_mode(False):
                layer = _Layer(self.num_features, self.eps, momentum, self.affine,
                               track, group, device, param_dtype)
            self._layers[key] = (self.eps, momentum, layer)
        return layer

    def _check_devices(self, input):
        """PyTorch's rule: parameters, buffers and input on one device."""
        device = input.device
        if not (input.is_cuda or device.type == "cpu"):
            raise SyncBNError(_lib.STATUS_INVALID_ARGUMENT,
                              "syncbn.torch.SyncBatchNorm: tensors on %s are not supported "
                              "(CPU and CUDA; meta inputs to a module on the meta device)" % input.device)
        for name in ("weight", "bias", "running_mean", "running_var"):
            t = _state(self, name)
            if t is not None and t.device != device:
                raise RuntimeError("syncbn.torch.SyncBatchNorm: expected all tensors to be on "
                                   "the same device, but the input is on %s and %s on %s"
                                   % (input.device, name, t.device))

    def _plain_eval(self, input):
        """Evaluation under a tracer (torch.jit.trace, torch.onnx.export,
        torch.compile, torch.export), which cannot record the library's ctypes
        calls: plain BatchNorm with the running statistics, or each rank's own
        batch without them, as F.batch_norm computes it (the library's values
        to float32 rounding). A training forward is synchronized: under
        torch.jit.trace it raises; torch.compile runs it eagerly. Also
        evaluation with running statistics and eps < 0, which the library
        refuses and PyTorch computes."""
        batch_stats, rm, rv = self._running()
        return torch.nn.functional.batch_norm(input, rm, rv, self.weight, self.bias, batch_stats,
                                              0.0, self.eps)

    def forward(self, input):
        if torch.jit.is_tracing() or _is_compiling():
            if not self.training:
                return self._plain_eval(input)
            if torch.jit.is_tracing():
                raise RuntimeError("syncbn.torch.SyncBatchNorm: a training forward cannot be traced "
                                   "(torch.jit.trace, torch.onnx.export): its work runs in libsyncbn. "
                                   "Trace the model in eval mode, or call "
                                   "syncbn.torch.revert_sync_batchnorm(model) first")
        if isinstance(input, torch.fx.Proxy) and input.tracer.root is self:
            raise RuntimeError("syncbn.torch.SyncBatchNorm cannot be the root of torch.fx.symbolic_trace "
                               "(nor can torch.nn.SyncBatchNorm): trace a model that contains it")
        return _sync_batch_norm(self, input)

    @_not_traced
    def _library_forward(self, input):
        if input.device.type == "meta" and all(
                t is None or t.device.type == "meta"
                for t in (_state(self, n) for n in ("weight", "bias", "running_mean", "running_var"))):
            # A module and input without data (shape inference, deferred
            # initialization): nothing to compute or synchronize; PyTorch's
            # BatchNorm gives the output's shape, dtype and strides. (A meta
            # input to a module with data is refused below, naming the device.)
            return _BatchNorm.forward(self, input)
        if input.dim() > _lib.MAX_DIMS:
            return self._folded_forward(input)
        device = _device_of(input)
        group = self._sync_group()
        batch_stats, rm, rv = self._running()
        state_dtype = self._state_dtype(input)
        track = rm is not None or rv is not None
        try:
            self._check_devices(input)
            if (rm is None) != (rv is None) or (batch_stats and self.eps <= 0):
                _as_torch_would(input, rm, rv, batch_stats, self.eps)  # raises what it raises
            if state_dtype in (torch.bfloat16, torch.float16) and input.dtype != state_dtype:
                raise _lib.error(_lib.STATUS_INVALID_ARGUMENT,
                                 "syncbn.torch.SyncBatchNorm: the input is %s but the module's "
                                 "parameters and buffers are %s; a 16-bit module takes inputs of its "
                                 "own dtype (convert the input, or the module with module.float())"
                                 % (input.dtype, state_dtype))
            _check_no_tangents(input, _state(self, "weight"), _state(self, "bias"))
            if batch_stats and not self.eps >= 0 and group is not None:
                raise _lib.error(_lib.STATUS_INVALID_ARGUMENT,
                                 "syncbn.torch.SyncBatchNorm: eps = %r; synchronized training takes "
                                 "eps >= 0 (PyTorch's BatchNorm, in one process, normalizes with "
                                 "var + eps)" % self.eps)
        except Exception as e:
            if group is not None:  # the peers' calls fail too, instead of waiting for this one
                try:
                    layer = self._layer(group, device, self._param_dtype(state_dtype), track)
                except SyncBNError:
                    layer = None  # (eps < 0: every rank's module refuses it alike)
                _tell_peers(layer, False, e)
            raise
        if device[0] == _lib.DEVICE_CPU:
            _sync_threads()
        if batch_stats and not self.eps >= 0 and group is None:
            # The library refuses eps < 0; PyTorch normalizes with var + eps.
            return _BatchNorm.forward(self, input)
        if (group is None and input.numel() == 0 and input.dim() >= 2 and
                input.shape[1] == self.num_features and batch_stats):
            # An empty batch normalized by its own statistics: PyTorch returns an
            # empty output (zero parameter gradients) and counts the batch; the
            # library refuses a count of 0, so this is answered here.
            nbt = _state(self, "num_batches_tracked")
            if self.training and self.track_running_stats and nbt is not None:
                nbt.add_(1)
            if not self.affine:
                return input.clone()
            view = (1, -1) + (1,) * (input.dim() - 2)
            return input * self.weight.view(view) + self.bias.view(view)
        if (group is None and input.numel() == 0 and input.dim() >= 2 and
                input.shape[1] != self.num_features):
            # Nothing to normalize, and a channel count that is not the layer's:
            # PyTorch 1.13 returns an empty output, others may raise. As its
            # BatchNorm does: count the batch, then the installed F.batch_norm
            # answers (momentum 0: no statistics change either way).
            nbt = _state(self, "num_batches_tracked")
            if self.training and self.track_running_stats and nbt is not None:
                nbt.add_(1)
            return torch.nn.functional.batch_norm(input, rm, rv, self.weight, self.bias, batch_stats,
                                                  0.0, self.eps)
        if not batch_stats and not self.eps >= 0:
            # Evaluation with running statistics does not communicate; the library
            # refuses eps < 0, PyTorch normalizes with rv + eps.
            return self._plain_eval(input)
        weight, bias = self.weight, self.bias
        if self.affine and (weight is None or bias is None):
            # Set to None after construction: F.batch_norm scales by 1, shifts by 0.
            like = dict(dtype=state_dtype, device=input.device)
            if weight is None:
                weight = torch.ones(self.num_features, **like)
            if bias is None:
                bias = torch.zeros(self.num_features, **like)
        layer = self._layer(group, device, self._param_dtype(state_dtype), track)
        try:
            return _Function.apply(input, weight, bias, self, layer, (rm, rv))
        except SyncBNError as e:
            if "param_dtype" in e.detail:  # the library's advice is for C callers
                raise type(e)(e.code, "syncbn.torch.SyncBatchNorm: the input is %s but the module's "
                              "parameters and buffers are %s; convert the input or the module "
                              "(module.double(), module.float()), as torch.nn.BatchNorm requires"
                              % (input.dtype, self._state_dtype(input))) from None
            if input.dim() < 2:  # the library's "2D to 5D" is about its own limit
                raise type(e)(e.code, "syncbn.torch.SyncBatchNorm: expected at least 2D input "
                              "(got %dD input)" % input.dim()) from None
            if input.dtype in _DTYPES:
                raise
            # The library refused it on every rank; say so in torch's terms.
            raise type(e)(e.code, "syncbn.torch.SyncBatchNorm: the input is %s; it takes float32, "
                          "bfloat16, float16 or float64 inputs" % input.dtype) from None

    def _folded_forward(self, input):
        """An input of more dims than the library takes (PyTorch's BatchNorm
        takes any from 2): its trailing dims fold into one, (N, C, L), which
        normalizes the same values per channel. PyTorch's output (and dx)
        for such inputs is contiguous, and so is this one's."""
        length = 1
        for size in input.shape[2:]:
            length *= size
        folded = input.reshape(input.shape[0], input.shape[1], length)
        try:
            out = self._library_forward(folded).view(input.shape)
        except SyncBNError as e:  # name the caller's shape, not the folded one
            shape = str(list(folded.shape))
            if shape not in e.detail:
                raise
            raise type(e)(e.code, e.detail.replace(shape, "%s, folded to %s" % (list(input.shape), shape))) \
                from None
        if input.numel() == 0:  # no values: the strides PyTorch's clone of the input has
            with torch.no_grad():
                strides = _empty_output(input, self.weight, self.bias).stride()
            out = out.as_strided(input.shape, strides)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return convert_sync_batchnorm(module, process_group)


def _sync_batch_norm(module, input):
    """A training or eval forward of `module`. torch.fx records it as one call
    (torch.fx.wrap below), as it records torch.nn.SyncBatchNorm as a leaf
    module: symbolic_trace of a converted model (torchvision's feature
    extractors, FX passes) does not try to trace into the library's calls."""
    return module._library_forward(input)


torch.fx.wrap("_sync_batch_norm")


class BatchNormXd(_BatchNorm):
    """Plain BatchNorm for any input of 2 to 5 dims (what revert_sync_batchnorm
    gives for a SyncBatchNorm whose original kind is unknown)."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))


def _share_state(dst, src):
    """dst takes src's parameters and buffers (the same tensors), training flag
    and qconfig, as PyTorch's convert_sync_batchnorm does."""
    if src.affine:
        with torch.no_grad():
            dst.weight = src.weight
            dst.bias = src.bias
    dst.running_mean = src.running_mean
    dst.running_var = src.running_var
    dst.num_batches_tracked = src.num_batches_tracked
    dst.train(src.training)
    if hasattr(src, "qconfig"):
        dst.qconfig = src.qconfig


def _check_initialized(bn):
    """A lazy BatchNorm (nn.LazyBatchNorm2d, ...) learns num_features at its
    first forward; converted before that it would become a layer of 0
    channels that fails at its first call, far from the cause."""
    has_uninitialized = getattr(bn, "has_uninitialized_params", None)
    if has_uninitialized is not None and has_uninitialized():
        raise ValueError("syncbn.torch.convert_sync_batchnorm: %s has uninitialized parameters (a lazy "
                         "BatchNorm before its first forward): run one forward of the model, then "
                         "convert it" % type(bn).__name__)


def convert_sync_batchnorm(module, process_group=None):
    """Replace every BatchNorm (any torch.nn.modules.batchnorm._BatchNorm:
    BatchNorm1d/2d/3d, torch.nn.SyncBatchNorm, ...) in `module` by a
    syncbn SyncBatchNorm on `process_group`, sharing its parameters and
    buffers (not copies), keeping its training flag and requires_grad. Returns
    the module; a new one if `module` itself is a BatchNorm. Call it before
    wrapping the model in DistributedDataParallel."""
    out = module
    if isinstance(module, _BatchNorm):
        _check_initialized(module)
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)
        _share_state(out, module)
        out._syncbn_source_class = getattr(module, "_syncbn_source_class", type(module))
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group))
    return out


def revert_sync_batchnorm(module):
    """The reverse: every syncbn SyncBatchNorm (and torch.nn.SyncBatchNorm)
    becomes the BatchNorm class it was converted from (BatchNormXd if
    unknown), sharing parameters and buffers, keeping the training flag.
    Returns the module; a new one if `module` itself is converted."""
    out = module
    if isinstance(module, (SyncBatchNorm, torch.nn.SyncBatchNorm)):
        cls = getattr(module, "_syncbn_source_class", None)
        if cls is None or cls in (SyncBatchNorm, torch.nn.SyncBatchNorm):
            cls = BatchNormXd
        out = cls(module.num_features, module.eps, module.momentum, module.affine,
                  module.track_running_stats)
        _share_state(out, module)
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out
