"""Bundles libsyncbn.so into the package: $SYNCBN_LIBRARY if set, else the
source tree's build/libsyncbn.so (built with `make lib` when missing); and,
when it was built (nvcc found), libsyncbn_cuda.so.1 from the same folder,
which libsyncbn opens from its own folder on the first CUDA request."""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        src = os.environ.get("SYNCBN_LIBRARY")
        if not src:
            src = os.path.join(REPO, "build", "libsyncbn.so")
            if not os.path.exists(src) and os.path.exists(os.path.join(REPO, "Makefile")):
                subprocess.check_call(["make", "-C", REPO, "lib"])
        if not os.path.exists(src):
            raise SystemExit("syncbn: libsyncbn.so not found (set SYNCBN_LIBRARY, or run `make` "
                             "in the syncbn source tree)")
        dst = os.path.join(self.build_lib, "syncbn", "libsyncbn.so")
        shutil.copyfile(os.path.realpath(src), dst)
        os.chmod(dst, 0o755)
        cuda = os.path.join(os.path.dirname(src), "libsyncbn_cuda.so.1")
        if os.path.exists(cuda):
            dst = os.path.join(self.build_lib, "syncbn", "libsyncbn_cuda.so.1")
            shutil.copyfile(os.path.realpath(cuda), dst)
            os.chmod(dst, 0o755)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it carries a shared library
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
