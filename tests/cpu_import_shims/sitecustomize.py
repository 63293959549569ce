"""CPU import shims for CUDA-only packages (used only by putting this folder on PYTHONPATH).

1. torchvision.  PyPI's torchvision links libcudart, so on a CPU machine its ``_C``
   extension fails to load and ``torchvision._meta_registrations`` then dies on
   ``register_fake("torchvision::nms")`` ("operator torchvision::nms does not exist").
   Defining the two op schemas that module registers fake kernels for (the text of
   torchvision's ``csrc/ops/nms.cpp`` and ``csrc/ops/quantized/cpu/qnms_kernel.cpp``) with a
   ``torch.library`` FRAGMENT lets the real package import; its C++ ops stay unavailable.
   If torchvision's own extension loads (CUDA machine, CPU build), nothing is defined.

2. flashinfer.  Without a CUDA device, importing ``flashinfer`` raises ModuleNotFoundError,
   as if it were not installed.  Flashinfer releases pinned by sglang query the GPU at
   import time (0.6.11: ``torch.cuda.get_device_properties`` in ``gdn_kernels``; 0.6.12
   ``flashinfer.comm``: "libcudart is not loaded") and raise AssertionError, which sglang's
   ``try/except ImportError`` guards do not catch.  On CPU sglang never binds flashinfer
   (``is_flashinfer_available()`` is ``find_spec(...) and is_cuda()``), so this reproduces
   the "flashinfer not installed" CPU setup on every version.  ``find_spec`` still finds it.

Both are lazy: ``sys.meta_path`` finders act only when those packages are first imported,
so a process that imports neither pays nothing (torch is not imported here).
"""

import importlib.machinery
import sys

_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBS = []  # keeps the Library fragment alive (dropping it unregisters the schemas)


def _torchvision_extension_loads(spec):
    """True if torchvision's own ``_C`` extension loads (then its schemas are real)."""
    import torch

    loader = (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES)
    for folder in spec.submodule_search_locations or ():
        ext = importlib.machinery.FileFinder(folder, loader).find_spec("_C")
        if ext is not None and ext.origin:
            try:
                torch.ops.load_library(ext.origin)
                return True
            except (ImportError, OSError):
                return False
    return False


class _TorchvisionSchemaFinder:
    """Runs once, just before the first ``import torchvision``; never finds a module itself."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(cls)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and not _torchvision_extension_loads(spec):
            import torch

            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in _TORCHVISION_SCHEMAS:
                lib.define(schema)
            _LIBS.append(lib)
        return None  # the regular finders import the real package


class _FlashinferWithoutCuda:
    """Finds ``flashinfer`` and, when torch sees no CUDA device, fails to load it."""

    _hide = None  # decided on first use

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "flashinfer":
            return None
        if cls._hide is None:
            import torch

            cls._hide = not torch.cuda.is_available()
        if not cls._hide:
            sys.meta_path.remove(cls)
            return None
        return importlib.machinery.ModuleSpec(fullname, cls())

    def create_module(self, spec):
        raise ModuleNotFoundError(
            "No module named 'flashinfer' (hidden without CUDA by tests/cpu_import_shims)",
            name="flashinfer",
        )

    def exec_module(self, module):  # never reached
        raise ModuleNotFoundError("flashinfer", name="flashinfer")


if "torchvision" not in sys.modules:
    sys.meta_path.insert(0, _TorchvisionSchemaFinder)
if "flashinfer" not in sys.modules:
    sys.meta_path.insert(0, _FlashinferWithoutCuda)
