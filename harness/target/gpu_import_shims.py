"""Import-only stand-ins for GPU-only modules that sglang imports at module level.

sglang imports ``triton`` (``sglang.srt.utils.common`` and kernels) and
``torchvision.transforms`` (``sglang.srt.configs``) at module level, but the
disaggregation transfer code never runs a Triton kernel or a vision transform.
On a CPU machine the real packages are either ~1 GB (triton) or broken beside a
CPU torch (PyPI's torchvision is a CUDA build).  This module is the *one* place
where pdconform papers over that:

* :func:`install` appends a meta-path finder *after* the real finders, so a real
  ``triton`` / ``torchvision`` always wins when it can be imported;
* before doing so it primes the capability caches of torch
  (``torch.utils._triton.has_triton_package``) and transformers
  (``is_torchvision_available``) so that those libraries keep treating the
  modules as absent and never try to use the stand-ins; the one exception is a
  transformers older than 5.18, which cannot even register an image processor
  without torchvision (:func:`transformers_must_see_torchvision`);
* every attribute of a stand-in module is a :class:`GpuOnly` placeholder that
  works as a decorator or base class at import time and raises
  :class:`GpuOnlyError` if anything actually tries to *run* it; the few
  attributes in :data:`RAISE_ON_ACCESS` raise as soon as they are read, as the
  real module does on a machine without a GPU.

Nothing else in pdconform may fake an import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

SHIMMED_TOP_LEVEL = ("triton", "torchvision")

#: first transformers release whose file-name backend rule leaves AutoImageProcessor
#: alone when torchvision is absent (see :func:`transformers_must_see_torchvision`)
TRANSFORMERS_FILE_RULE_FIXED = (5, 18, 0)

# Attributes that raise on access, as the real module does on a machine without a
# GPU: triton's ``runtime.driver.active`` looks for an active GPU driver and raises
# RuntimeError when there is none.  sglang 0.5.17 probes it at import time inside a
# ``try`` (``sglang/kernels/ops/attention/fla/utils.py`` get_available_device) and
# falls back to "cpu"; a placeholder there would be taken for a device name.
RAISE_ON_ACCESS = {
    "triton.runtime.driver.active": "0 active drivers: triton finds no GPU driver on this machine",
}


class GpuOnlyError(RuntimeError):
    """Raised when code calls into a GPU-only module that is only shimmed here."""


class GpuOnly:
    """Placeholder for any attribute of a shimmed module.

    * ``@placeholder`` on a function returns the function unchanged (``triton.jit``);
    * ``placeholder(...)`` with other arguments returns another placeholder
      (``triton.autotune(configs=...)``, ``triton.Config(...)``);
    * attribute access and indexing return placeholders (``tl.constexpr``,
      ``kernel[grid]``);
    * it can appear as a base class and in ``isinstance`` (never matches).
    """

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __repr__(self) -> str:
        return f"<GPU-only placeholder {self._qualname}>"

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return GpuOnly(f"{self._qualname}(...)")

    def __getattr__(self, name: str) -> "GpuOnly":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self._qualname}.{name}")

    def __getitem__(self, item) -> "GpuOnly":
        return GpuOnly(f"{self._qualname}[...]")

    def __or__(self, other):  # used in type annotations: ``tl.tensor | None``
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases):
        return (object,)

    def __instancecheck__(self, obj) -> bool:
        return False

    def __bool__(self) -> bool:
        return False

    def run(self, *args, **kwargs):
        raise GpuOnlyError(f"{self._qualname} is a GPU-only stand-in on this machine")


def _placeholder(qualname: str) -> GpuOnly:
    """The placeholder for ``qualname``; GpuOnlyError for a name in RAISE_ON_ACCESS."""
    if qualname in RAISE_ON_ACCESS:
        raise GpuOnlyError(f"{qualname}: {RAISE_ON_ACCESS[qualname]} (GPU-only stand-in)")
    return GpuOnly(qualname)


class _ShimModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _ShimModule(spec.name)
        module.__path__ = []  # a package: any submodule resolves through the finder
        module.__version__ = "0.0.0+pdconform-shim"
        module.__pdconform_shim__ = True
        return module

    def exec_module(self, module) -> None:
        return None


class _ShimFinder(importlib.abc.MetaPathFinder):
    def __init__(self, names: list[str]) -> None:
        self.names = tuple(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, _ShimLoader(), is_package=True)


def _really_importable(name: str) -> bool:
    if importlib.util.find_spec(name) is None:
        return False
    try:
        __import__(name)
    except Exception:  # a broken CUDA build counts as absent
        sys.modules.pop(name, None)
        return False
    return True


def is_shimmed(name: str) -> bool:
    """True when ``name`` (a top-level module) is served by this module's stand-in."""
    module = sys.modules.get(name)
    return bool(module is not None and getattr(module, "__pdconform_shim__", False))


def transformers_must_see_torchvision() -> bool:
    """True when the installed transformers turns ``AutoImageProcessor`` into a
    torchvision-only dummy whenever torchvision is absent (releases before
    :data:`TRANSFORMERS_FILE_RULE_FIXED`).

    Those releases give every class of a file named ``image_processing_*`` that
    mentions ``TorchvisionBackend`` a torchvision requirement
    (``transformers/utils/import_utils.py`` ``BASE_FILE_REQUIREMENTS``), which
    catches ``image_processing_auto.py`` itself; 5.18 narrowed the rule to files
    that subclass it.  sglang 0.5.17 pins transformers 5.12.1 and calls
    ``AutoImageProcessor.register`` while importing (``sglang/srt/configs/utils.py``),
    so there transformers' probe must find the torchvision stand-in.  Registration
    only fills a mapping; any transform that would run still raises GpuOnlyError.
    False when transformers is not installed.
    """
    from importlib import metadata

    from harness.target.version import release_of

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return False
    return release_of(version) < TRANSFORMERS_FILE_RULE_FIXED


def install() -> list[str]:
    """Install the stand-ins for whichever of ``triton``/``torchvision`` cannot be imported.

    Returns the names that are shimmed (empty when a real GPU stack is present).
    Idempotent.  Must run before the first ``import sglang``.
    """
    if any(isinstance(f, _ShimFinder) for f in sys.meta_path):
        return [n for n in SHIMMED_TOP_LEVEL if is_shimmed(n)]
    missing = [n for n in SHIMMED_TOP_LEVEL if not _really_importable(n)]
    if not missing:
        return []
    # Prime torch's and transformers' cached capability probes while the modules
    # are still absent, so they never route work to the placeholders.
    from torch._inductor.runtime import triton_compat  # noqa: F401  (probes triton once)
    from torch.utils import _triton as torch_triton

    torch_triton.has_triton_package()
    if not transformers_must_see_torchvision():
        try:
            from transformers.utils import import_utils as tf_import_utils

            tf_import_utils.is_torchvision_available()
        except ImportError:
            pass
    sys.meta_path.append(_ShimFinder(missing))
    for name in missing:
        __import__(name)
    return missing
