"""triton on one KV pool: a hybrid SWA model's sliding layers get their window rail.
Bug
    With one pool (``--disable-hybrid-swa-memory``) ``ModelConfig.is_hybrid_swa`` is False, and
    the runner takes ``model_config.sliding_window_size`` only when it is True: a model with no
    ``get_attention_sliding_window_size`` (MiMo-V2, Step3.5) gets ``sliding_window_size = None``.
    ``TritonAttnBackend`` copies it and builds no window buffers while the sliding layers keep
    their window: the server stops at start-up (an AttributeError or a Triton CompilationError).
    Fix: while the backend (0.5.23+: also the multi-step draft backend) is built, the runner
    holds the window the hybrid pool gives it, restored after; one pool's ids need no translation.
Upstream PRs
    None known.
Affected versions
    0.5.10-0.5.23: the same window rule and ``is_hybrid_swa`` in every release.
    Status by release: applied 0.5.10+.
Detection
    Structural: ``TritonAttnBackend.__init__`` reads ``model_runner.sliding_window_size``, the
    runner's window rule gates its config branch on ``model_config.is_hybrid_swa``, set with
    ``disable_hybrid_swa_memory``: needed; a rule free of ``is_hybrid_swa``: not needed.
Delete when
    sglang gives a one-pool hybrid SWA model its window (or triton reads the layers' windows).
"""

from __future__ import annotations

import ast
import functools
import inspect

from sglang_swa_plugin.fix import Detection, Fix, argument, around
from sglang_swa_plugin.probe import (function_text, function_tree, is_attribute, nodes, optional_class, optional_module,
                                     own_function, swapped)

NAME = "triton_one_pool_window"
MODULE = "sglang.srt.layers.attention.triton_backend"
BACKEND = MODULE + ".TritonAttnBackend"
MULTI = MODULE + ".TritonMultiStepDraftBackend"
INIT, MULTI_INIT = BACKEND + ".__init__", MULTI + ".__init__"
CONFIG_MODULE = "sglang.srt.configs.model_config"
RESOLVER_MODULE = "sglang.srt.model_executor.model_runner_components.load_model_utils"  # 0.5.16+
RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
MODEL_METHOD = "get_attention_sliding_window_size"


@functools.lru_cache(maxsize=None)
def _takes_text_config() -> bool:
    """``is_hybrid_swa_model`` reads the text config too (newer releases: opt-in configs)."""
    from sglang.srt.configs.model_config import is_hybrid_swa_model

    return "hf_text_config" in inspect.signature(is_hybrid_swa_model).parameters


def one_pool_window(model_runner):
    """The window the hybrid pool would give ``model_runner``, where only one pool kept it from
    it; else None (nothing to do)."""
    cfg = getattr(model_runner, "model_config", None)
    if (getattr(model_runner, "sliding_window_size", 0) is not None or cfg is None
            or getattr(cfg, "is_hybrid_swa", True) or not getattr(cfg, "disable_hybrid_swa_memory", False)
            or getattr(cfg, "attention_chunk_size", None) is not None
            or getattr(cfg, "sliding_window_size", None) is None
            or hasattr(getattr(model_runner, "model", None), MODEL_METHOD)):
        return None
    from sglang.srt.configs.model_config import is_hybrid_swa_model

    archs = getattr(getattr(cfg, "hf_config", None), "architectures", None) or []
    text = (getattr(cfg, "hf_text_config", None),) if _takes_text_config() else ()
    return cfg.sliding_window_size if is_hybrid_swa_model(archs, *text) else None


def _one_pool_window(original, self, *args, **kwargs):
    """Around a triton backend's ``__init__``: the runner's window as the hybrid pool gives it
    for the build, restored after (nothing else of the runner changes)."""
    runner = argument(original, "model_runner", args, kwargs)
    window = one_pool_window(runner)
    if window is None:
        return original(self, *args, **kwargs)
    with swapped(runner, "sliding_window_size", window):
        return original(self, *args, **kwargs)


def _reads(fn, name: str, owner: str) -> bool:
    return fn is not None and any(is_attribute(n, name, owner) for n in nodes(function_tree(fn)[0]))


def window_rule():
    """The function that sets the runner's window: ``resolve_sliding_window_size`` (0.5.16+), else
    the ModelRunner method that calls the model's ``get_attention_sliding_window_size``."""
    resolver = getattr(optional_module(RESOLVER_MODULE), "resolve_sliding_window_size", None)
    if resolver is not None:
        return resolver
    runner = getattr(optional_module(RUNNER_MODULE), "ModelRunner", None)
    if runner is None:
        return None
    load = own_function(runner, "load_model")
    if load is not None and MODEL_METHOD in function_tree(load)[1]:
        return load
    return next((fn for name in dir(runner) if inspect.isfunction(fn := own_function(runner, name))
                 and MODEL_METHOD in function_text(fn)), None)


def _hybrid_assignments() -> list:
    """The values ModelConfig assigns to ``self.is_hybrid_swa``."""
    cfg = getattr(optional_module(CONFIG_MODULE), "ModelConfig", None)
    out = []
    for name in ("_derive_hybrid_model", "__init__"):
        fn = own_function(cfg, name) if cfg is not None else None
        if fn is not None:
            out += [n.value for n in nodes(function_tree(fn)[0]) if isinstance(n, ast.Assign)
                    and any(is_attribute(t, "is_hybrid_swa", "self") for t in n.targets)]
    return out


def _gated_config_branches(rule) -> "tuple[list, list]":
    """``if`` statements of the rule whose body takes ``model_config.sliding_window_size``, and
    those of them whose test reads ``model_config.is_hybrid_swa``."""
    branches = [n for n in nodes(function_tree(rule)[0]) if isinstance(n, ast.If)
                and any(is_attribute(x, "sliding_window_size", "model_config") for s in n.body for x in ast.walk(s))]
    return branches, [b for b in branches if any(is_attribute(x, "is_hybrid_swa", "model_config") for x in ast.walk(b.test))]


def classify() -> Detection:
    backend = optional_class(f"{MODULE}.TritonAttnBackend")
    if backend is None:
        return Detection.not_applicable("this sglang has no triton attention backend")
    if not _reads(own_function(backend, "__init__"), "sliding_window_size", "model_runner"):
        return Detection.unknown("TritonAttnBackend.__init__ no longer reads model_runner.sliding_window_size")
    values = _hybrid_assignments()
    if not values:
        return Detection.unknown("ModelConfig sets is_hybrid_swa somewhere unrecognised")
    if not any("disable_hybrid_swa_memory" in ast.unparse(v) for v in values):
        return Detection.not_needed("ModelConfig.is_hybrid_swa does not depend on disable_hybrid_swa_memory")
    rule = window_rule()
    if rule is None:
        return Detection.unknown("no runner window rule found (resolve_sliding_window_size or ModelRunner)")
    branches, gated = _gated_config_branches(rule)
    if gated:
        return Detection.needed("one KV pool: the runner's window rule skips model_config.sliding_window_size, "
                                "triton builds no window buffers")
    if branches:
        return Detection.not_needed("the runner takes model_config.sliding_window_size without is_hybrid_swa")
    if not _reads(rule, "is_hybrid_swa", "model_config"):
        return Detection.not_needed("the runner's window rule does not depend on model_config.is_hybrid_swa")
    return Detection.unknown("the runner's window rule reads is_hybrid_swa but takes no config window")


def plan() -> list:
    """``TritonAttnBackend.__init__``; also the multi-step draft backend's where it reads the
    runner's window itself (0.5.23+)."""
    hooks = [around(INIT, _one_pool_window)]
    multi = getattr(optional_module(MODULE), "TritonMultiStepDraftBackend", None)
    if multi is not None and _reads(own_function(multi, "__init__"), "sliding_window_size", "model_runner"):
        hooks.append(around(MULTI_INIT, _one_pool_window))
    return hooks


class TritonOnePoolWindowFix(Fix):
    name = NAME
    summary = "triton on one KV pool: a hybrid SWA model without its own window method gets its sliding window"
    upstream_prs = ()
    targets = (INIT, MULTI_INIT)
    target_params = {INIT: ("self", "model_runner"), MULTI_INIT: ("self", "model_runner")}
    check_module = "sglang_swa_plugin.check.triton_one_pool_window"

    def detect(self) -> Detection:
        return classify().with_plan(*plan())


FIX = TritonOnePoolWindowFix()
