"""A libsyncbn process group whose collectives are torch.distributed's.

One custom group (syncbn_custom.h) per torch.distributed process group, made
on first use and kept while the process group lives (held weakly, so that
dist.destroy_process_group frees it). Its callbacks run on the
thread that called the library (the autograd thread in backward), with the
GIL taken by ctypes, and call torch.distributed.all_reduce / broadcast /
barrier on that process group over copies of the library's host buffers
(O(C) bytes; _host_copy says why not aliases). An exception inside a
callback becomes a non-zero return code (with its text as the library's
message), i.e. SBN_STATUS_BACKEND_ERROR, and is chained to the SyncBNError
raised to the caller. Timeouts are torch.distributed's: the `timeout` given to
init_process_group / new_group.

The library hands these callbacks host buffers (a CUDA layer stages its
O(C) statistics through host memory for a custom group). NCCL reduces only
CUDA tensors, so for an NCCL group each collective goes through a tensor on
the current GPU: a copy there, NCCL's collective, a copy back.
"""
import ctypes
import threading
import weakref

import torch
import torch.distributed as dist

from . import _lib

_TORCH_DTYPES = {_lib.DTYPE_FLOAT32: torch.float32, _lib.DTYPE_FLOAT64: torch.float64,
                 _lib.DTYPE_INT64: torch.int64}


def _host_tensor(address, count, dtype):
    """A torch tensor aliasing `count` values at a host address (the layer's
    state, seen by the module)."""
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    buf = (ctypes.c_byte * nbytes).from_address(address)
    return torch.frombuffer(buf, dtype=dtype, count=count)


def _host_copy(address, count, dtype):
    """A new torch tensor holding `count` values copied from a host address.

    Not an alias of the library's buffer (torch.frombuffer): such a tensor's
    storage holds a Python object, and a gloo worker thread drops its last
    collective's tensors when it gets to it, at interpreter exit too, after
    Python has finalized: std::terminate, a SIGABRT at exit in processes
    that did not call dist.destroy_process_group. A tensor torch allocated is
    freed without the interpreter. The copies are O(C) bytes a call."""
    t = torch.empty(count, dtype=dtype)
    ctypes.memmove(t.data_ptr(), address, count * t.element_size())
    return t


def _copy_back(address, t):
    ctypes.memmove(address, t.data_ptr(), t.numel() * t.element_size())


def _callback(ref, name):
    """A ctypes callback that calls method `name` of the TorchGroup behind
    weak reference `ref`. Bound methods would make the group a reference
    cycle, freed only by the cyclic garbage collector, on whatever thread
    happens to run it; without the cycle it goes by reference counting, when
    the last layer using it does."""
    def call(*args):
        group = ref()
        return 1 if group is None else getattr(group, name)(*args)
    return call


class TorchGroup:
    """libsyncbn's view of one torch.distributed process group."""

    def __init__(self, pg):
        # Held weakly: dist.destroy_process_group must be able to free the
        # process group (which joins its threads). Kept alive by us, a gloo
        # group outlived the interpreter's shutdown, and its worker thread,
        # dropping our last collective's tensor, needed the GIL after Python
        # had finalized: std::terminate, a SIGABRT at exit.
        self._pg = weakref.ref(pg)
        self.rank = dist.get_rank(pg)
        self.size = dist.get_world_size(pg)
        if pg is None or pg is dist.group.WORLD:
            self.global_ranks = list(range(self.size))
        else:
            self.global_ranks = list(dist.get_process_group_ranks(pg))
        self.backend = str(dist.get_backend(pg))
        self.staged = self.backend == "nccl"  # host buffers go through the current GPU
        self.calls = 0  # collectives issued through torch (tests use it: eval must not add any)
        self.pending = threading.local()  # the exception a callback caught, for chaining
        # ctypes callback objects must live as long as the C group.
        ref = weakref.ref(self)
        self._cb = (_lib.ALLREDUCE_FN(_callback(ref, "_allreduce")),
                    _lib.BROADCAST_FN(_callback(ref, "_broadcast")),
                    _lib.BARRIER_FN(_callback(ref, "_barrier")))
        self._name = ("torch.distributed:%s" % self.backend).encode()
        ops = _lib.CustomOps(_lib.CUSTOM_OPS_VERSION, self._name, self._cb[0], self._cb[1],
                             self._cb[2], _lib.SPLIT_FN(), _lib.DESTROY_FN())
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.sbn_group_create_custom(ctypes.byref(handle), self.rank, self.size,
                                                    ctypes.byref(ops), None))
        self.handle = handle

    @property
    def pg(self):
        pg = self._pg()
        if pg is None:
            raise RuntimeError("syncbn.torch: the torch.distributed process group of this "
                               "SyncBatchNorm was destroyed (dist.destroy_process_group)")
        return pg

    def _fail(self, exc):
        self.pending.exc = exc
        _lib.lib.sbn_custom_set_error(("%s: %s" % (type(exc).__name__, exc)).encode()[:480])
        return 1

    @staticmethod
    def _check_host(device, stream):
        if device.type != _lib.DEVICE_CPU or stream:
            raise RuntimeError("device buffers reached the torch.distributed callbacks, which "
                               "this syncbn package does not support yet")

    def _allreduce(self, ctx, buf, count, dtype, device, stream):
        try:
            self._check_host(device, stream)
            if dtype not in _TORCH_DTYPES:
                raise ValueError("all-reduce of dtype %d is not supported" % dtype)
            self.calls += 1
            if count:
                t = _host_copy(buf, count, _TORCH_DTYPES[dtype])
                if self.staged:
                    d = t.to(self._gpu())
                    dist.all_reduce(d, group=self.pg)
                    t.copy_(d)  # waits for the collective
                else:
                    dist.all_reduce(t, group=self.pg)
                _copy_back(buf, t)
            return 0
        except BaseException as e:  # never let an exception cross the C frames
            return self._fail(e)

    def _broadcast(self, ctx, buf, nbytes, root, device, stream):
        try:
            self._check_host(device, stream)
            self.calls += 1
            if nbytes:
                t = _host_copy(buf, nbytes, torch.uint8)
                d = t.to(self._gpu()) if self.staged else t
                dist.broadcast(d, src=self.global_ranks[root], group=self.pg)
                if self.staged:
                    t.copy_(d)
                _copy_back(buf, t)
            return 0
        except BaseException as e:
            return self._fail(e)

    @staticmethod
    def _gpu():
        return torch.device("cuda", torch.cuda.current_device())

    def _barrier(self, ctx):
        try:
            self.calls += 1
            dist.barrier(group=self.pg)
            return 0
        except BaseException as e:
            return self._fail(e)

    def check(self, status):
        """Raise for a failed library call, chained to a callback's exception."""
        exc = getattr(self.pending, "exc", None)
        self.pending.exc = None
        if status != 0 and isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc  # Ctrl-C inside a collective stays Ctrl-C
        _lib.check(status, exc)

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None and _lib is not None and _lib.lib is not None:
            _lib.lib.sbn_group_destroy(handle)


_groups = {}  # id(process group) -> (weak reference to it, TorchGroup)


def torch_group(pg):
    """The TorchGroup of a process group (None: the default group)."""
    if pg is None:
        pg = dist.group.WORLD
    entry = _groups.get(id(pg))
    if entry is None or entry[0]() is not pg:
        for key in [k for k, (ref, _) in _groups.items() if ref() is None]:
            del _groups[key]  # groups destroyed since (their layers keep what they need)
        entry = (weakref.ref(pg), TorchGroup(pg))
        _groups[id(pg)] = entry
    return entry[1]
