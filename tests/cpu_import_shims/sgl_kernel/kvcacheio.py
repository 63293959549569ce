"""CPU import shim: the 13 names ``mem_cache/memory_pool_host.py`` imports unguarded
(sglang <= 0.5.12; later releases guard that import with ``is_cuda() or is_hip()``)."""

from sgl_kernel import _cuda_only

transfer_kv_all_layer = _cuda_only("kvcacheio.transfer_kv_all_layer")
transfer_kv_all_layer_direct_lf_pf = _cuda_only("kvcacheio.transfer_kv_all_layer_direct_lf_pf")
transfer_kv_all_layer_lf_pf = _cuda_only("kvcacheio.transfer_kv_all_layer_lf_pf")
transfer_kv_all_layer_lf_ph = _cuda_only("kvcacheio.transfer_kv_all_layer_lf_ph")
transfer_kv_all_layer_mla = _cuda_only("kvcacheio.transfer_kv_all_layer_mla")
transfer_kv_all_layer_mla_lf_pf = _cuda_only("kvcacheio.transfer_kv_all_layer_mla_lf_pf")
transfer_kv_direct = _cuda_only("kvcacheio.transfer_kv_direct")
transfer_kv_per_layer = _cuda_only("kvcacheio.transfer_kv_per_layer")
transfer_kv_per_layer_direct_pf_lf = _cuda_only("kvcacheio.transfer_kv_per_layer_direct_pf_lf")
transfer_kv_per_layer_mla = _cuda_only("kvcacheio.transfer_kv_per_layer_mla")
transfer_kv_per_layer_mla_pf_lf = _cuda_only("kvcacheio.transfer_kv_per_layer_mla_pf_lf")
transfer_kv_per_layer_pf_lf = _cuda_only("kvcacheio.transfer_kv_per_layer_pf_lf")
transfer_kv_per_layer_ph_lf = _cuda_only("kvcacheio.transfer_kv_per_layer_ph_lf")
