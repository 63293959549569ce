"""CPU import shim: main commits of May 2026 (mainwindow S3) import this in triton_backend.py
at module level, which eagle_worker_v2 imports."""

from sgl_kernel import _cuda_only

__all__ = ["is_arch_support_pdl"]

is_arch_support_pdl = _cuda_only("utils.is_arch_support_pdl")
