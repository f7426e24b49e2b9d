"""ctypes bindings of libsyncbn (only its exported public API).

The library is found, in order, at $SYNCBN_LIBRARY, next to this file (the
copy `make python-install` / `pip install ./python` bundles), in the build/
directory of the source tree this package sits in, and on the system's
library path (`make install`).
"""
import ctypes
import ctypes.util
import os

# ---- enums and structs of syncbn.h / syncbn_custom.h -------------------

DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_FLOAT64, DTYPE_INT64 = range(5)
LAYOUT_CHANNELS_FIRST, LAYOUT_CHANNELS_LAST = 0, 1
DEVICE_CPU, DEVICE_CUDA = 0, 1
STATUS_INVALID_ARGUMENT, STATUS_OUT_OF_MEMORY, STATUS_INTERNAL = 1, 10, 13
MOMENTUM_CUMULATIVE = -1.0
MAX_DIMS = 5
CUSTOM_OPS_VERSION = 1
(BN_TENSOR_WEIGHT, BN_TENSOR_BIAS, BN_TENSOR_GRAD_WEIGHT, BN_TENSOR_GRAD_BIAS,
 BN_TENSOR_RUNNING_MEAN, BN_TENSOR_RUNNING_VAR) = range(6)


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("dtype", ctypes.c_int),
                ("layout", ctypes.c_int), ("device", Device)]


class BnOptions(ctypes.Structure):
    _fields_ = [("num_features", ctypes.c_int64), ("eps", ctypes.c_double),
                ("momentum", ctypes.c_double), ("affine", ctypes.c_int),
                ("track_running_stats", ctypes.c_int), ("device", Device),
                ("param_dtype", ctypes.c_int)]


ALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int, Device, ctypes.c_void_p)
BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int, Device, ctypes.c_void_p)
BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
SPLIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                            ctypes.POINTER(ctypes.c_int))
DESTROY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CustomOps(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("name", ctypes.c_char_p),
                ("allreduce", ALLREDUCE_FN), ("broadcast", BROADCAST_FN),
                ("barrier", BARRIER_FN), ("split", SPLIT_FN), ("destroy", DESTROY_FN)]


# ---- finding and loading the library -----------------------------------

def _candidates():
    env = os.environ.get("SYNCBN_LIBRARY")
    if env:
        return [env]  # explicit: no fallback that could hide a wrong path
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "libsyncbn.so"),
             os.path.join(here, "..", "..", "build", "libsyncbn.so")]
    found = ctypes.util.find_library("syncbn")
    paths += [found] if found else []
    paths += ["libsyncbn.so.1"]
    return paths


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("syncbn: cannot load libsyncbn.so; tried: " + "; ".join(tried) +
                      ". Build it with `make` in the syncbn source tree, install the package "
                      "with `make python-install`, or set SYNCBN_LIBRARY=/path/to/libsyncbn.so")


lib, library_path = _load()
library_path = os.path.realpath(library_path) if os.sep in library_path else library_path

_P = ctypes.c_void_p
_S = ctypes.c_int  # sbn_status
_SIGNATURES = {
    "sbn_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "sbn_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "sbn_last_error": (ctypes.c_char_p, []),
    "sbn_version": (ctypes.c_int, []),
    "sbn_group_create_custom": (_S, [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(CustomOps), _P]),
    "sbn_custom_set_error": (None, [ctypes.c_char_p]),
    "sbn_group_destroy": (_S, [_P]),
    "sbn_group_rank": (ctypes.c_int, [_P]),
    "sbn_group_size": (ctypes.c_int, [_P]),
    "sbn_bn_options_default": (BnOptions, [ctypes.c_int64]),
    "sbn_bn_create": (_S, [ctypes.POINTER(_P), ctypes.POINTER(BnOptions), _P]),
    "sbn_bn_destroy": (_S, [_P]),
    "sbn_bn_set_training": (_S, [_P, ctypes.c_int]),
    "sbn_bn_forward": (_S, [_P, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor)]),
    "sbn_bn_backward": (_S, [_P, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
                             ctypes.POINTER(Tensor)]),
    "sbn_bn_zero_grad": (_S, [_P]),
    "sbn_bn_fail_call": (_S, [_P, ctypes.c_int, ctypes.c_int, ctypes.c_char_p]),
    "sbn_bn_record_create": (_S, [ctypes.POINTER(_P), _P]),
    "sbn_bn_record_destroy": (_S, [_P]),
    "sbn_bn_save_forward": (_S, [_P, _P]),
    "sbn_bn_restore_forward": (_S, [_P, _P]),
    "sbn_bn_tensor": (_S, [ctypes.POINTER(Tensor), _P, ctypes.c_int]),
    "sbn_bn_get_num_batches_tracked": (_S, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "sbn_bn_set_num_batches_tracked": (_S, [_P, ctypes.c_int64]),
    "sbn_bn_set_stream": (_S, [_P, _P]),
    "sbn_cuda_device_count": (_S, [ctypes.POINTER(ctypes.c_int)]),
    "sbn_set_num_threads": (_S, [ctypes.c_int]),
    "sbn_num_threads": (ctypes.c_int, [ctypes.c_int]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


class SyncBNError(RuntimeError):
    """An error reported by libsyncbn: `status` (e.g. 'SBN_STATUS_MISMATCH'),
    `code` (its number) and the library's message (sbn_last_error)."""

    def __init__(self, code, message):
        self.code = code
        self.status = lib.sbn_status_name(code).decode()
        self.detail = message
        super().__init__("%s: %s" % (self.status, message))


class SyncBNValueError(SyncBNError, ValueError):
    """SBN_STATUS_INVALID_ARGUMENT: also a ValueError, which is what PyTorch's
    batch norm raises for the inputs it refuses (fewer than 2 dimensions, one
    value per channel in training), so code written against PyTorch catches it."""


def error(status, message):
    """The exception for a failure status: SyncBNValueError for
    SBN_STATUS_INVALID_ARGUMENT, else SyncBNError."""
    cls = SyncBNValueError if status == STATUS_INVALID_ARGUMENT else SyncBNError
    return cls(status, message)


def check(status, cause=None):
    """Raise SyncBNError for a non-OK status (message from sbn_last_error)."""
    if status != 0:
        err = error(status, lib.sbn_last_error().decode(errors="replace"))
        if cause is not None:
            raise err from cause
        raise err


def version():
    """The library's version as a string, e.g. '1.0.0'."""
    v = lib.sbn_version()
    return "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100)


def set_num_threads(threads):
    """CPU threads per rank for the library's kernels (0: back to the default,
    cores / ranks sharing them; SYNCBN_NUM_THREADS also sets it)."""
    check(lib.sbn_set_num_threads(int(threads)))


def cuda_device_count():
    """GPUs the library can use: 0 when it was built without CUDA (or
    libsyncbn_cuda is missing), or when there is no GPU or driver."""
    n = ctypes.c_int(0)
    return n.value if lib.sbn_cuda_device_count(ctypes.byref(n)) == 0 else 0
