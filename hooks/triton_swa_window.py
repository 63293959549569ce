"""triton: sliding-window decode reads the window the model (and triton's own extend) defines.
Bug
    The window rail (``update_sliding_window_buffer``, its CUDA-graph twin) keeps the last
    ``min(seq_len, sliding_window_size)`` keys. The decode kernel has no window mask and
    attends all of them: query ``q`` sees keys ``q - sliding_window_size + 1 .. q``. The model
    (transformers), fa3, flashinfer and triton's own extend kernel (``q - k <= window``) see
    one key more. Plain decode on triton: GPT-OSS 0/32 requests equal to the float32 model.
    The fix hands the rail builders ``sliding_window_size + 1`` (extend and verify mask the one
    extra prefix key, so their output is unchanged) and sizes the CUDA-graph window buffer
    for it. Upstream #32087 (closed unmerged) kept flashinfer's rule the same way.
Upstream PRs
    #32087 (closed without merging); no upstream fix.
Affected versions
    Status by release: applied 0.5.10+.
Detection
    Structural: the rail helper keeps ``torch.minimum(seq_lens, sliding_window_size)`` keys and
    triton's extend kernel masks ``q <= k + SLIDING_WINDOW_SIZE``: needed. A helper that keeps
    ``sliding_window_size + 1``: not needed. Anything else: unknown.
Delete when
    sglang's triton decode keeps ``sliding_window_size + 1`` keys in every supported release.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from sglang_swa_plugin.fix import Detection, Fix, hookimpl
from sglang_swa_plugin.probe import function_text, function_tree, nodes, optional_module, own_function

NAME = "triton_swa_window"
MODULE = "sglang.srt.layers.attention.triton_backend"
BUILDERS = ("update_sliding_window_buffer", "update_sliding_window_buffer_cuda_graph")
GRAPH_STATE = MODULE + ".TritonAttnBackend.init_cuda_graph_state"
PARAM = "sliding_window_size"
_KEEPS_WINDOW = re.compile(r"torch\.minimum\(\s*\w+\s*,\s*torch\.tensor\(\s*sliding_window_size\s*\)")
_KEEPS_WINDOW_PLUS_ONE = re.compile(r"sliding_window_size\s*\+\s*1")
_EXTEND_MASK = re.compile(r"<=\s*\(?\s*start_n\s*\+\s*offs_n\[None,\s*:\]\s*\+\s*SLIDING_WINDOW_SIZE")


@dataclass(frozen=True)
class WiderWindow:
    """Around one rail builder: its ``sliding_window_size`` argument (keyword, or positional
    at ``position``) plus one."""

    position: int

    def __call__(self, original, *args, **kwargs):
        if PARAM in kwargs:
            kwargs[PARAM] += 1
        elif len(args) > self.position:
            args = (*args[: self.position], args[self.position] + 1, *args[self.position + 1:])
        return original(*args, **kwargs)


def _graph_window_buffer(original, self, max_bs, max_num_tokens, *args, **kwargs):
    """After sglang sized ``cuda_graph_window_kv_indices`` for ``window`` keys per token: room
    for ``window + 1`` (a buffer that is larger already, sglang's full rail, is kept)."""
    result = original(self, max_bs, max_num_tokens, *args, **kwargs)
    window, buf = getattr(self, "sliding_window_size", None), getattr(self, "cuda_graph_window_kv_indices", None)
    if window is not None and window > 0 and buf is not None and buf.numel() < max_num_tokens * (window + 1):
        self.cuda_graph_window_kv_indices = buf.new_zeros(max_num_tokens * (window + 1))
    return result


def _extend_kernel_module(backend_cls) -> "str | None":
    """Where ``TritonAttnBackend.__init__`` imports ``extend_attention_fwd`` from (it moved)."""
    import ast

    init = own_function(backend_cls, "__init__")
    tree = function_tree(init)[0] if init is not None else None
    return next((n.module for n in nodes(tree) if isinstance(n, ast.ImportFrom)
                 and any(a.name == "extend_attention_fwd" for a in n.names)), None) if tree is not None else None


def classify() -> Detection:
    mod = optional_module(MODULE)
    builders = [getattr(mod, name, None) for name in BUILDERS] if mod is not None else []
    if not builders or builders[0] is None:
        return Detection.not_applicable("this sglang's triton backend builds no sliding-window rail")
    texts = [function_text(fn) for fn in builders if fn is not None]
    if all(_KEEPS_WINDOW_PLUS_ONE.search(t) for t in texts):
        return Detection.not_needed("the window rail keeps sliding_window_size + 1 keys")
    if not all(_KEEPS_WINDOW.search(t) for t in texts):
        return Detection.unknown("the window rail's length is not min(seq_len, sliding_window_size)")
    kernel_module = _extend_kernel_module(mod.TritonAttnBackend)
    kernel = optional_module(kernel_module) if kernel_module else None
    if kernel is None or not _EXTEND_MASK.search(inspect.getsource(kernel)):
        return Detection.unknown("triton's extend kernel no longer masks q <= k + SLIDING_WINDOW_SIZE")
    if own_function(mod.TritonAttnBackend, "init_cuda_graph_state") is None:
        return Detection.unknown("TritonAttnBackend has no init_cuda_graph_state")
    return Detection.needed("triton decode keeps sliding_window_size keys, the model and triton's extend one more")


def _position(fn) -> int:
    return list(inspect.signature(fn).parameters).index(PARAM)


class TritonSwaWindowFix(Fix):
    name = NAME
    summary = "triton sliding-window decode attends the window + 1 keys the model and triton's extend attend"
    upstream_prs = ("#32087",)
    # Every release has the first builder; its CUDA-graph twin (0.5.10-0.5.22) is hooked where it exists.
    targets = (f"{MODULE}.{BUILDERS[0]}", GRAPH_STATE)
    target_params = {GRAPH_STATE: ("self", "max_bs", "max_num_tokens")}
    check_module = "sglang_swa_plugin.check.triton_swa_window"

    def detect(self) -> Detection:
        return classify()

    def install(self, hooks) -> None:
        mod = optional_module(MODULE)
        for name in BUILDERS:
            fn = getattr(mod, name, None)
            if fn is not None:
                hooks.around(f"{MODULE}.{name}", WiderWindow(_position(fn)))
        hooks.around(GRAPH_STATE, _graph_window_buffer)


FIX = TritonSwaWindowFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
