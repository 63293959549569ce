"""CPU import shim: the 13 names ``mem_cache/memory_pool_host.py`` imports unguarded
(sglang <= 0.5.12; later versions guard that import with ``is_cuda() or is_hip()``)."""

from sgl_kernel import _cuda_only

__all__ = [
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]

globals().update({name: _cuda_only(f"kvcacheio.{name}") for name in __all__})
