"""Opt-in SWA index guard: an index outside the KV pool a sliding-window layer reads stops
the step with a named error, instead of a CUDA illegal memory access far from its cause.

Bug
    SWA index-space bugs hand a sliding-window layer's kernel indices of another pool; the
    kernel reads past the smaller SWA pool, layers after the cause. With
    ``SGLANG_SWA_PLUGIN_GUARD=1`` every page-table entry and KV-write location of an SWA
    layer (trtllm_mha, fa3) is checked on the device (``torch._assert_async``: no sync).
Upstream PRs
    None; bugs it names: #24617 (issue #24402), #25103, fork PR pyc96/sglang#6.
Affected versions
    Every release (0.5.10 to 0.5.23): a diagnostic, installed where asked for.
    Status by release: off by default 0.5.10+.
Detection
    Needed ("guard requested") where the guarded methods exist; the plan follows the fa3
    kernel's binding and the trtllm_mha pool attribute. Neither backend: not applicable.
Delete when
    Never needed for correctness; drop a guarded place when its backend leaves sglang.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around, split_target
from sglang_swa_plugin.probe import compact, normalized_source, optional_module
from sglang_swa_plugin.trtllm_mha import CLASS as TRT_CLASS, MODULE as TRT_MODULE

TRT_PAGE_TABLE = TRT_CLASS + "._get_layer_page_table"
TRT_CACHE_LOC = TRT_CLASS + "._get_layer_cache_loc"
FA3_MODULE = "sglang.srt.layers.attention.flashattention_backend"
FA3_CLASS = FA3_MODULE + ".FlashAttentionBackend"
FA3_EXTEND = FA3_CLASS + ".forward_extend"
FA3_DECODE = FA3_CLASS + ".forward_decode"
FA3_KERNEL_NAME = "flash_attn_with_kvcache"
FA3_KERNEL = FA3_MODULE + "." + FA3_KERNEL_NAME

PREFIX = "sglang-swa-plugin swa_index_guard"


# ---------------------------------------------------------------------------- the check


@functools.lru_cache(maxsize=None)
def message(backend: str, mode: str, layer_id: int, what: str, limit: int, unit: str) -> str:
    """The failure text (kept under the 255 characters a CUDA assert message may hold)."""
    text = (
        f"{PREFIX}: {backend} {mode} SWA layer {layer_id}: {what} index outside the KV pool "
        f"this layer reads ({limit} {unit}); full-pool and SWA-pool indices mixed up"
    )
    return text[:250]


def check_indices(indices, limit: int, msg: str, lengths=None, page_size: int = 1) -> None:
    """Assert on the device, without a host sync, that every live entry of ``indices`` is
    in ``[0, limit)``. For a page table ``[rows, cols]``, ``lengths`` (tokens per row)
    bounds the live columns at ``ceil(lengths / page_size)``; the rest is padding."""
    import torch

    if lengths is not None and indices.dim() == 2:
        rows = min(indices.shape[0], lengths.shape[0])
        indices, used = indices[:rows], lengths[:rows, None]
        if page_size > 1:
            used = (used + (page_size - 1)) // page_size
        live = torch.arange(indices.shape[1], device=indices.device) < used
        indices = indices.where(live, 0)
    # clamp leaves an in-range entry unchanged: one comparison covers both bounds.
    torch._assert_async(indices.clamp(0, limit - 1).eq(indices).all(), msg)


def is_swa_layer(layer: Any, *pools: Any) -> bool:
    """A sliding-window layer: by its window, or by the SWA pool mapping of a pool it reads."""
    window = getattr(layer, "sliding_window_size", None)
    if window is not None and window > -1:
        return True
    for pool in pools:
        entry = getattr(pool, "layers_mapping", {}).get(layer.layer_id)
        if entry is not None and entry[1]:
            return True
    return False


def mode_name(forward_batch: Any) -> str:
    mode = getattr(forward_batch, "forward_mode", None)
    return getattr(mode, "name", None) or "UNKNOWN_MODE"


def buffer_pages(pool: Any, layer_id: int, page_size: int) -> int:
    """Pages of the K buffer ``pool`` holds for ``layer_id`` (rows / page_size for the
    usual [slots, heads, dim] layout, the first dimension for a paged 4-D one)."""
    buf = pool.get_key_buffer(layer_id)
    return buf.shape[0] if buf.dim() >= 4 else buf.shape[0] // page_size


# ---------------------------------------------------------------------------- trtllm_mha


def trtllm_pool_attr(cls: type) -> str:
    """Which pool the trtllm_mha kernels read: "forward_batch" (<= 0.5.12) or "self"."""
    src = compact(normalized_source(cls.forward_decode))
    if "forward_batch.token_to_kv_pool.get_kv_buffer(" in src:
        return "forward_batch"
    if "self.token_to_kv_pool.get_kv_buffer(" in src or "pool=self.token_to_kv_pool" in src:
        return "self"
    raise TargetMissing(TRT_CLASS + ".forward_decode", "cannot tell which KV pool its kernel reads")


def trtllm_hooks(pool_attr: str) -> "tuple[Callable, Callable]":
    """Around hooks for ``_get_layer_page_table`` and ``_get_layer_cache_loc``, checking
    against the pool the kernels read (``pool_attr``: see :func:`trtllm_pool_attr`)."""

    def kernel_pool(self, forward_batch):
        return forward_batch.token_to_kv_pool if pool_attr == "forward_batch" else self.token_to_kv_pool

    def guard_page_table(original, self, layer, forward_batch, *args, **kwargs):
        table = original(self, layer, forward_batch, *args, **kwargs)
        pool = kernel_pool(self, forward_batch)
        if table is not None and is_swa_layer(layer, pool):
            ps = self.page_size or 1
            limit = buffer_pages(pool, layer.layer_id, ps)
            msg = message("trtllm_mha", mode_name(forward_batch), layer.layer_id, "page-table", limit, "pages")
            check_indices(table, limit, msg, self.forward_metadata.cache_seqlens_int32, ps)
        return table

    def guard_cache_loc(original, self, layer, forward_batch, *args, **kwargs):
        loc = original(self, layer, forward_batch, *args, **kwargs)
        # 0.5.10 passes out_cache_loc instead of the batch: no pool to check against.
        if loc is None or not hasattr(forward_batch, "forward_mode"):
            return loc
        pool = kernel_pool(self, forward_batch)
        if is_swa_layer(layer, pool):
            ps = self.page_size or 1
            slots = buffer_pages(pool, layer.layer_id, ps) * ps
            msg = message("trtllm_mha", mode_name(forward_batch), layer.layer_id, "KV-write", slots, "slots")
            check_indices(loc, slots, msg)
        return loc

    return guard_page_table, guard_cache_loc


# ---------------------------------------------------------------------------- fa3

_CALL = threading.local()  # the SWA layer an fa3 forward call is running, for the kernel hook


def fa3_kernel_form(cls: type) -> str:
    """"instance": ``forward_*`` call ``self.flash_attn_with_kvcache`` (0.5.10);
    "module": they call the module global (0.5.11+)."""
    src = compact(normalized_source(cls.forward_extend))
    if f"{FA3_KERNEL_NAME}=self.{FA3_KERNEL_NAME}" in src:
        return "instance"
    mod = optional_module(FA3_MODULE)
    if mod is not None and callable(getattr(mod, FA3_KERNEL_NAME, None)) and f"{FA3_KERNEL_NAME}(" in src:
        return "module"
    raise TargetMissing(FA3_KERNEL, "fa3 forward_extend calls its kernel in an unrecognised way")


def guard_fa3_kernel(original, *args, **kwargs):
    call = getattr(_CALL, "swa", None)
    table, k_cache = kwargs.get("page_table"), kwargs.get("k_cache")
    if call is not None and table is not None and k_cache is not None:
        backend, layer, forward_batch = call
        limit = k_cache.shape[0]
        msg = message("fa3", mode_name(forward_batch), layer.layer_id, "page-table", limit, "pages")
        check_indices(table, limit, msg, kwargs.get("cache_seqlens"), backend.page_size or 1)
    return original(*args, **kwargs)


def fa3_forward_hook(form: str) -> Callable:
    """Around hook for ``forward_extend``/``forward_decode``: while an SWA layer runs, the
    kernel hook knows backend, layer and batch (form "instance": the instance's kernel is
    wrapped for the duration of the call)."""

    def guard_forward(original, self, *args, **kwargs):
        layer = argument(original, "layer", args, kwargs)
        forward_batch = argument(original, "forward_batch", args, kwargs)
        pools = (getattr(forward_batch, "token_to_kv_pool", None), getattr(self, "token_to_kv_pool", None))
        if layer is None or not is_swa_layer(layer, *pools):
            return original(self, *args, **kwargs)
        previous, _CALL.swa = getattr(_CALL, "swa", None), (self, layer, forward_batch)
        own = self.__dict__.get(FA3_KERNEL_NAME) if form == "instance" else None
        if own is not None:
            self.__dict__[FA3_KERNEL_NAME] = functools.partial(guard_fa3_kernel, own)
        try:
            return original(self, *args, **kwargs)
        finally:
            _CALL.swa = previous
            if own is not None:
                self.__dict__[FA3_KERNEL_NAME] = own

    return guard_forward


# ---------------------------------------------------------------------------- the fix


def present_backends() -> dict:
    """{"trtllm_mha": pool attr, "fa3": kernel form} for the backends this sglang has;
    raises TargetMissing naming what moved."""
    out = {}
    if optional_module(TRT_MODULE) is not None:
        for t in (TRT_PAGE_TABLE, TRT_CACHE_LOC):
            split_target(t)
        out["trtllm_mha"] = trtllm_pool_attr(split_target(TRT_PAGE_TABLE)[0])
    if optional_module(FA3_MODULE) is not None:
        for t in (FA3_EXTEND, FA3_DECODE):
            split_target(t)
        out["fa3"] = fa3_kernel_form(split_target(FA3_EXTEND)[0])
    return out


def classify() -> Detection:
    found = present_backends()
    if not found:
        return Detection.not_applicable("this sglang has neither a trtllm_mha nor an fa3 backend")
    plan = []
    if "trtllm_mha" in found:
        page_table, cache_loc = trtllm_hooks(found["trtllm_mha"])
        plan += [around(TRT_PAGE_TABLE, page_table), around(TRT_CACHE_LOC, cache_loc)]
    if "fa3" in found:
        forward = fa3_forward_hook(found["fa3"])
        plan += [around(FA3_EXTEND, forward), around(FA3_DECODE, forward)]
        if found["fa3"] == "module":
            plan.append(around(FA3_KERNEL, guard_fa3_kernel))
    return Detection.needed("guard requested: checks SWA-layer indices of " + ", ".join(sorted(found)), *plan)


class SwaIndexGuard(Fix):
    name = "swa_index_guard"
    summary = "opt-in: device-side check that SWA-layer page tables and KV-write locations stay inside the KV pool they index"
    upstream_prs = ()
    wraps = ("fa3_local_attn_tree_verify",)
    targets = (TRT_PAGE_TABLE, TRT_CACHE_LOC, FA3_EXTEND, FA3_DECODE, FA3_KERNEL)
    target_params = {
        TRT_PAGE_TABLE: ("self", "layer", "forward_batch"),
        TRT_CACHE_LOC: ("self", "layer"),
        FA3_EXTEND: ("self", "q", "k", "v", "layer", "forward_batch"),
        FA3_DECODE: ("self", "q", "k", "v", "layer", "forward_batch"),
    }
    opt_in = "guard"
    check_module = "sglang_swa_plugin.check.swa_index_guard"

    def detect(self) -> Detection:
        return classify()


FIX = SwaIndexGuard()
