"""syncbn: synchronized batch normalization (exact, deterministic) for
data-parallel training, over libsyncbn.

    import syncbn.torch          # SyncBatchNorm, convert/revert_sync_batchnorm

The C library is found at $SYNCBN_LIBRARY, bundled next to this package,
in the source tree's build/, or on the system library path.
"""
from ._lib import SyncBNError, SyncBNValueError, library_path, set_num_threads, version

__version__ = version()
__all__ = ["SyncBNError", "SyncBNValueError", "library_path", "set_num_threads", "version", "__version__"]
