"""CPU import shim: the names FlashAttentionBackend(fa_impl_ver=3).__init__ imports."""

from sgl_kernel import _cuda_only

__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache", "get_scheduler_metadata"]

flash_attn_varlen_func = _cuda_only("flash_attn.flash_attn_varlen_func")
flash_attn_with_kvcache = _cuda_only("flash_attn.flash_attn_with_kvcache")
get_scheduler_metadata = _cuda_only("flash_attn.get_scheduler_metadata")
