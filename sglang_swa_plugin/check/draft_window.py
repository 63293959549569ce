"""CPU scenario of an EAGLE-3 draft window (``--speculative-draft-window-size``, sglang #24664,
0.5.12+) over a hybrid SWA target, on triton: which keys the drafter's sliding layer gets.

sglang builds the draft runner with a pool of its own, a full-only ``MHATokenToKVPool`` (the
drafter, ``LlamaForCausalLMEagle3``, is no hybrid SWA model), and the target's
``SWATokenToKVPoolAllocator`` (shared token bookkeeping, holding the TARGET pool's full->SWA
mapping); ``llama_eagle3`` gives every draft layer the window and the runner takes it from the
model. Here: that runner (a real full-only pool, a real SWA allocator whose full and SWA index
spaces differ), a real ``TritonAttnBackend`` and ``TritonMultiStepDraftBackend`` on it, a
sliding draft layer, the paths of ``triton_swa_draft``'s scenario (eager DRAFT_EXTEND where the
release has its own branch, DRAFT_EXTEND_V2 at CUDA-graph capture and replay, the multi-step
draft decode eager, at capture and at replay; its Triton kernels recorded).
Right: per request the last ``min(L, window)`` keys of its full rail (``min(L, window + 1)`` where
``triton_swa_window`` widens an extend's rail: the extend kernel masks the extra key, offset one
less) as the DRAFT pool names them, full-pool ids untranslated (the draft layer reads the draft
pool), as sglang's own pool-keyed window helpers leave them (0.5.13+; 0.5.12's helper translates
through the allocator). Ids put through the target's mapping read other keys of the draft pool
(the drafter proposes worse tokens: fewer accepted; the target still verifies them).
``python -m sglang_swa_plugin.check.draft_window`` prints one JSON line."""

from __future__ import annotations

from types import SimpleNamespace

from . import Outcome, print_outcome
from .triton_bench import DRAFT_TOKENS, MODULE, NUM_STEPS, REQUEST_TOKENS, WINDOW, triton_backend

LLAMA_EAGLE3 = "sglang.srt.models.llama_eagle3"
FLAG = "speculative_draft_window_size"


def release_has_draft_window() -> bool:
    """The installed ``llama_eagle3`` reads the draft window from the server arguments (0.5.12+)."""
    import ast

    from sglang_swa_plugin.probe import module_tree

    tree = module_tree(LLAMA_EAGLE3)
    return tree is not None and any(getattr(n, "attr", None) == FLAG for n in ast.walk(tree))


def applied_fixes() -> list:
    """The built-in fixes the plugin applies on the installed sglang (opt-in ones off)."""
    from sglang_swa_plugin.core import load_fixes, safe_detect
    from sglang_swa_plugin.fix import Verdict

    return [fix for fix, src in load_fixes() if src == "builtin" and not fix.opt_in
            and safe_detect(fix).verdict is Verdict.NEEDED]


def draft_layer(runner):
    """The drafter's layer as ``llama_eagle3`` leaves it: a real ``RadixAttention`` of the draft's
    layer 0 whose ``sliding_window_size`` is the draft window."""
    from sglang.srt.layers.radix_attention import RadixAttention

    cfg = runner.model_config
    return RadixAttention(num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim, scaling=cfg.head_dim**-0.5,
                          num_kv_heads=cfg.get_num_kv_heads(1), layer_id=0, sliding_window_size=WINDOW)


def build():
    """The target's SWA pool and allocator (index spaces apart), the draft runner over a full-only
    pool of its own sharing that allocator (EAGLE3, window ``WINDOW``), its TritonAttnBackend
    (CUDA-graph state for 4 requests), three requests' tokens and the sliding draft layer, in
    the fields ``triton_swa_draft``'s scenario reads."""
    import torch

    from . import testbed as tb

    target_pool = tb.make_swa_pool(size=256, size_swa=128)
    alloc = tb.make_swa_allocator(target_pool)
    tb.diverge(alloc, 11)
    draft_pool = tb.make_full_pool(size=256, layer_num=1)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=draft_pool, allocator=alloc, req_to_token_pool=rtt, is_draft_worker=True,
                                  spec_algorithm="EAGLE3", topk=1, num_steps=NUM_STEPS,
                                  num_draft_tokens=DRAFT_TOKENS, sliding_window_size=WINDOW, model="llama",
                                  attention_backend="triton")
    be = triton_backend(runner, DRAFT_TOKENS)
    be.init_cuda_graph_state(4, 4 * DRAFT_TOKENS)
    tokens = [tb.alloc_tokens(alloc, REQUEST_TOKENS) for _ in range(3)]
    rows, _ = tb.fill_requests(rtt, tokens)
    return SimpleNamespace(tb=tb, target_pool=target_pool, allocator=alloc,
                           draft_pool=draft_pool, runner=runner, backend=be, rows=rows, tokens=tokens,
                           swa_layer=draft_layer(runner), torch=torch)


def judge(env, call: dict, rail_lens: list, offsets: bool = True, window: int = WINDOW) -> dict:
    """Per request of ``L`` keys (``rail_lens``): the ``k`` window keys the kernel got are the last
    ``k`` of its ``req_to_token`` row as they are (the draft pool's ids), ``k`` is ``min(L, window)``
    or ``min(L, WINDOW + 1)`` (``window``: the keys ``triton_swa_draft``'s scenario wants of a draft
    step, ``WINDOW`` or one more), and (extend) the window offset is ``L - k``. ``spaces``: per request,
    "draft" (right), "target" (the ids through the target's full->SWA mapping) or "other"."""
    if "error" in call:
        return {"right": False, "why": call["error"]}
    indptr, indices, starts = call["kv_indptr"], call["kv_indices"], call["window_kv_offsets"]
    if indices is None or indptr is None:
        return {"right": False, "why": "window_kv_indices=None"}
    spaces, keys = [], []
    for b, (row, n) in enumerate(zip(env.rows, rail_lens)):
        got = indices[int(indptr[b]):int(indptr[b + 1])].long()
        k = got.shape[0]
        own = env.runner.req_to_token_pool.req_to_token[row, n - k:n].long()
        fits = k in (min(n, window), min(n, WINDOW + 1)) and (not offsets or int(starts[b]) == n - k)
        space = ("draft" if got.tolist() == own.tolist() else
                 "target" if got.tolist() == env.tb.translate(env.allocator, own).tolist() else "other")
        spaces.append(space if fits else f"{space}, {k} keys")
        keys.append(k)
    return {"right": all(s == "draft" for s in spaces), "spaces": spaces, "keys": keys}


def sglang_decode_rails(env, paths) -> dict:
    """The multi-step draft decode (topk 1, eager) where sglang builds each step's window rail
    itself (0.5.23+: its own Triton kernels, run on a GPU or under Triton's interpreter): the
    rail each step backend's metadata holds, judged as the kernel's."""
    multi = paths._multi(env)
    fb = paths._decode_batch(env, multi, paths.PREFIXES)
    multi.init_forward_metadata(fb)
    steps = [{"kv_indptr": be.forward_metadata.window_kv_indptr, "kv_indices": be.forward_metadata.window_kv_indices,
              "window_kv_offsets": None} for be in multi.attn_backends]
    return paths._judge_steps(env, steps, paths.PREFIXES)


def scenario() -> Outcome:
    """The window keys the draft's sliding layer gets on triton, per path, against the last
    ``min(L, window)`` keys in the draft pool's own space. ``seen``: per path, right or not
    (None: the release has no such path). Where sglang builds the multi-step decode rail with
    its own Triton kernels (0.5.23+), ``decode_eager`` only where they can run (a GPU, or
    ``TRITON_INTERPRET=1`` before sglang is imported)."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module, swapped
    from sglang_swa_plugin.triton_rail import kernel_lays_out

    from . import triton_swa_draft as paths

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    if not release_has_draft_window():
        raise ScenarioUnavailable("this sglang has no EAGLE-3 draft window (llama_eagle3 reads no "
                                  f"{FLAG})")
    env = build()
    with swapped(paths, "judge", judge):  # its paths, judged in the draft pool's space
        seen = {"eager": paths.eager(env), **paths.graph(env), **paths.multi_step(env)}
        if "decode_eager" not in seen and kernel_lays_out(env.rows):
            seen["decode_eager"] = sglang_decode_rails(env, paths)
    return Outcome(any(v is not None and not v["right"] for v in seen.values()), seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
