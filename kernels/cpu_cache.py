"""Where the C++ CPU kernels' builds live, and whether one is there: told without importing torch.

`cpu_build.Extension` compiles into torch's extension cache, under a name that carries the
extension, the CPU's vector capability and torch's version; a run's driver, which imports no
torch on a CPU, asks `is_built` here to tell the user that the first trials will compile.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re


def build_name(extension: str, isa: str, torch_version: str) -> str:
    """The module name an extension compiles under for this ISA and torch version."""
    return f"archsearch_{extension}_{isa.lower()}_torch{re.sub(r'[^0-9A-Za-z]', '_', torch_version)}"


def extensions_root() -> str:
    """torch's extension cache: ``TORCH_EXTENSIONS_DIR``, else the user cache's torch_extensions."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return os.path.realpath(root)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.realpath(os.path.join(cache, "torch_extensions"))


def is_built(extension: str, isa: str = "*", torch_version: str | None = None) -> bool:
    """Whether a build of `extension` (for `isa`, any by default; this torch by default) is in the
    cache: torch keeps it at {root}/py311_cpu/{name}/{name}.so by default, right under a
    TORCH_EXTENSIONS_DIR, and a rebuild after a source change as {name}_v1.so and on."""
    if torch_version is None:
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return False
    name = build_name(extension, isa, torch_version)
    root = extensions_root()
    return any(glob.glob(os.path.join(root, *middle, name, f"{name}*.so")) for middle in ((), ("*",)))


__all__ = ["build_name", "extensions_root", "is_built"]
