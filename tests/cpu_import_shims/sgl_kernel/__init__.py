"""CPU import shim for ``sgl_kernel`` (the real wheel links libcuda and cannot load on CPU).

It provides ONLY the names sglang imports without a guard on the import paths of the
attention backends, SWA pools and model runner; each raises NotImplementedError when called.
Every other name is absent, so ``from sgl_kernel import other`` raises ImportError and
sglang's own ``try/except ImportError`` fallbacks keep working.
Used only by putting ``tests/cpu_import_shims`` on PYTHONPATH; never by the installed plugin.
"""

__all__ = ["merge_state_v2"]


def _cuda_only(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is a CUDA kernel (CPU import shim)")

    fn.__name__ = fn.__qualname__ = name.rsplit(".", 1)[-1]
    return fn


# flashattention_backend.py: module-level `from sgl_kernel import merge_state_v2`
merge_state_v2 = _cuda_only("merge_state_v2")
