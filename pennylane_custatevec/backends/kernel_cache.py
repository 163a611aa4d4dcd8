"""Where numba keeps the CPU kernels' compilations: a directory inside the package.

numba's on-disk cache is keyed by the kernels' source (a SHA-256 of the file's content),
the signature, the CPU model and numba's version, but by default it lives in the source
directory's ``__pycache__`` or, with ``NUMBA_CACHE_DIR``, under a name derived from the
source directory's *path*. Neither travels with the package: a wheel leaves
``__pycache__`` out, and another path is another cache. :class:`PackagedKernelLocator`
puts the kernels' cache in :data:`CACHE_DIR`, next to the kernels, so that the
compilations that ``kernel_build`` makes when the package is installed (``pip install
.``, ``scripts/setup_env.sh``) are found by every later process, whatever
``NUMBA_CACHE_DIR`` says. Where that directory cannot be written (a read-only
site-packages), its files are copied once to a per-user directory and the cache lives
there (:func:`user_cache_dir`). A compilation the directory does not hold (another CPU
model, another numba, a signature not built) is compiled at its first call, as numba
always does, and saved.

Only the files in this package's ``backends`` directory are located here; every other
numba function keeps numba's own locators.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shutil
from collections.abc import Callable

from numba.core import caching

BACKENDS_DIR = pathlib.Path(__file__).resolve().parent
CACHE_DIR = BACKENDS_DIR / "compiled_kernels"
"""The kernels' compilations as the package ships them (filled by ``kernel_build``)."""


def user_cache_dir() -> pathlib.Path:
    """The per-user cache used where :data:`CACHE_DIR` is read-only: under
    ``$XDG_CACHE_HOME`` (default ``~/.cache``), one directory per package location."""
    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    location = hashlib.sha1(str(CACHE_DIR).encode()).hexdigest()
    return base / "pennylane-custatevec" / f"compiled_kernels_{location}"


def is_writable(directory: pathlib.Path) -> bool:
    """Whether ``directory`` exists or can be made, and a file can be written in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return False
    return True


def choose_cache_dir(
    package_cache: pathlib.Path,
    user_cache: pathlib.Path,
    writable: Callable[[pathlib.Path], bool] = is_writable,
) -> pathlib.Path | None:
    """``package_cache`` where it can be written; else ``user_cache``, given a copy of
    every file of ``package_cache`` it lacks (each copied whole, then renamed into place);
    else ``None``."""
    if writable(package_cache):
        return package_cache
    if not writable(user_cache):
        return None
    if package_cache.is_dir():
        for source in package_cache.iterdir():
            destination = user_cache / source.name
            if source.is_file() and not destination.exists():
                partial = destination.with_name(f".{source.name}.{os.getpid()}")
                shutil.copyfile(source, partial)
                os.replace(partial, destination)
    return user_cache


@functools.cache
def cache_dir() -> pathlib.Path | None:
    """The directory this process caches the kernels in (chosen once):
    :func:`choose_cache_dir` of :data:`CACHE_DIR` and :func:`user_cache_dir`; ``None``
    leaves the kernels to numba's own locators."""
    return choose_cache_dir(CACHE_DIR, user_cache_dir())


class PackagedKernelLocator(caching.InTreeCacheLocator):
    """numba's in-tree locator, pointed at :func:`cache_dir` for the files of this
    package's ``backends`` directory. The source stamp (numba's: a hash of the file's
    content) and the file names are numba's, so that a cache built at one path is valid
    at another."""

    def __init__(self, py_func, py_file, directory: pathlib.Path):
        super().__init__(py_func, py_file)
        self._cache_path = str(directory)

    @classmethod
    def from_function(cls, py_func, py_file):
        if pathlib.Path(py_file).resolve().parent != BACKENDS_DIR:
            return None
        directory = cache_dir()
        if directory is None:
            return None
        return cls(py_func, py_file, directory)


def register() -> bool:
    """Put :class:`PackagedKernelLocator` first among numba's locators (once); ``False``
    where this numba has no list of locators to extend (its caching then works as numba's
    default)."""
    locators = getattr(caching.CacheImpl, "_locator_classes", None)
    if not isinstance(locators, list):
        return False
    if PackagedKernelLocator not in locators:
        locators.insert(0, PackagedKernelLocator)
    return True
