"""triton: sliding-window decode reads the window the model (and triton's own extend) defines.
Bug
    The window rail (``update_sliding_window_buffer``, its CUDA-graph twin) keeps the last
    ``min(seq_len, sliding_window_size)`` keys. The decode kernel has no window mask and
    attends all of them: query ``q`` sees keys ``q - sliding_window_size + 1 .. q``. The model
    (transformers), fa3, flashinfer and triton's own extend kernel (``q - k <= window``) see
    one key more: triton's plain decode gives other tokens than the model (GPT-OSS, Gemma 4).
    Fix: the rail builders get ``sliding_window_size + 1`` (extend and verify mask the extra
    prefix key: output unchanged), so do the CUDA-graph buffer and 0.5.23's draft-step rail.
Upstream PRs
    #32087 (closed without merging); no upstream fix.
Affected versions
    0.5.10-0.5.23: every release's triton decode keeps ``sliding_window_size`` keys.
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

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around, with_argument
from sglang_swa_plugin.probe import function_text, function_tree, nodes, optional_module, own_function

NAME = "triton_swa_window"
MODULE = "sglang.srt.layers.attention.triton_backend"
BUILDERS = ("update_sliding_window_buffer", "update_sliding_window_buffer_cuda_graph")
GRAPH_STATE = MODULE + ".TritonAttnBackend.init_cuda_graph_state"
MULTI = "TritonMultiStepDraftBackend"
MULTI_INIT = f"{MODULE}.{MULTI}.__init__"  # 0.5.23+: it takes the window its steps' own rail keeps
PARAM = "sliding_window_size"
_KEEPS_WINDOW = re.compile(r"torch\.minimum\(\s*\w+\s*,\s*torch\.tensor\(\s*sliding_window_size\s*\)")
_KEEPS_WINDOW_PLUS_ONE = re.compile(r"sliding_window_size\s*\+\s*1")
_EXTEND_MASK = re.compile(r"<=\s*\(?\s*start_n\s*\+\s*offs_n\[None,\s*:\]\s*\+\s*SLIDING_WINDOW_SIZE")


def _wider_window(original, *args, **kwargs):
    """Around one rail builder: its ``sliding_window_size`` argument plus one."""
    window = argument(original, PARAM, args, kwargs, method=False)
    args, kwargs = with_argument(original, PARAM, window + 1, args, kwargs, method=False)
    return original(*args, **kwargs)


def _graph_window_buffer(original, self, *args, **kwargs):
    """After sglang sized ``cuda_graph_window_kv_indices`` for ``window`` keys per token: room
    for ``window + 1`` (a buffer that is larger already, sglang's full rail, is kept)."""
    result = original(self, *args, **kwargs)
    max_num_tokens = argument(original, "max_num_tokens", args, kwargs)
    window, buf = getattr(self, "sliding_window_size", None), getattr(self, "cuda_graph_window_kv_indices", None)
    if window is not None and window > 0 and buf is not None and buf.numel() < max_num_tokens * (window + 1):
        self.cuda_graph_window_kv_indices = buf.new_zeros(max_num_tokens * (window + 1))
    return result


def _draft_rail_window(original, self, *args, **kwargs):
    """Around sglang's multi-step draft backend's construction (0.5.23+): the window its draft
    steps' own rail keeps, one key more, as the target's decode rail (a draft step is a decode;
    MiMo-V2's MTP reads its window's oldest key). Its rail buffers are sized from it later, at
    the first metadata or CUDA-graph state; nothing runs per step."""
    result = original(self, *args, **kwargs)
    if self.window_rail:
        setattr(self, PARAM, getattr(self, PARAM) + 1)
    return result


def _draft_builds_rail(mod) -> bool:
    """The multi-step draft backend builds its steps' window rail from its own
    ``sliding_window_size`` (0.5.23+; before, triton_swa_draft builds it)."""
    multi = getattr(mod, MULTI, None)
    init = own_function(multi, "__init__") if isinstance(multi, type) else None
    template = own_function(multi, "common_template") if isinstance(multi, type) else None
    return (init is not None and template is not None and f"self.{PARAM} =" in function_text(init)
            and "window_kv_indices" in function_text(template) and "window_rail" in function_text(init))


def _extend_kernel_module(backend_cls) -> "str | None":
    """Where ``TritonAttnBackend.__init__`` imports ``extend_attention_fwd`` from (it moved)."""
    import ast

    init = own_function(backend_cls, "__init__")
    tree = function_tree(init)[0] if init is not None else None
    return next((n.module for n in nodes(tree) if isinstance(n, ast.ImportFrom)
                 and any(a.name == "extend_attention_fwd" for a in n.names)), None) if tree is not None else None


def classify() -> Detection:
    mod = optional_module(MODULE)
    if mod is None:
        return Detection.not_applicable("this sglang has no triton attention backend")
    builders = [getattr(mod, name, None) for name in BUILDERS]
    if builders[0] is None:  # the triton backend has always built its window rail with it
        raise TargetMissing(f"{MODULE}.{BUILDERS[0]}")
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
    plan = [around(f"{MODULE}.{name}", _wider_window) for name, fn in zip(BUILDERS, builders) if fn is not None]
    if _draft_builds_rail(mod):
        plan.append(around(MULTI_INIT, _draft_rail_window))
    return Detection.needed("triton decode keeps sliding_window_size keys, the model and triton's extend one more",
                            *plan, around(GRAPH_STATE, _graph_window_buffer))


class TritonSwaWindowFix(Fix):
    name = NAME
    summary = "triton sliding-window decode attends the window + 1 keys the model and triton's extend attend"
    upstream_prs = ("#32087",)
    # Every release has the first builder; its CUDA-graph twin (0.5.10-0.5.22) is hooked where it exists.
    targets = tuple(f"{MODULE}.{name}" for name in BUILDERS) + (GRAPH_STATE, MULTI_INIT)
    target_params = {GRAPH_STATE: ("self", "max_bs", "max_num_tokens"), MULTI_INIT: ("self", "model_runner")}
    wraps = ("triton_one_pool_window",)  # the multi-step backend's construction: the window it reads, then one more
    check_module = "sglang_swa_plugin.check.triton_swa_window"

    def detect(self) -> Detection:
        return classify()


FIX = TritonSwaWindowFix()
