"""Host-side per-step work of the fixes with work before each CUDA-graph replay, on the CPU (issue #48).

For each fix, the call that runs before every replay of the step it touches (sglang's
replay-time metadata refresh, or the CUDA-graph input fill), built on sglang's real backends,
pools and metadata objects as tests/benchmarks/bench_fix_cost_gpu.py builds them (its builders,
run on the CPU: no graph is captured, only the refresh is timed), at batch 1 and 32 (requests of
600-1000 tokens), fix on against fix off (stock: the same objects, refreshed without the fix's
hooks). Sides alternate block by block (ABAB), each call timed on its own (perf_counter_ns);
medians of ROUNDS >= 200 calls per side. ``ops``: torch operations per call (each one a kernel
launch on a GPU, op by op; the fixes' own ones replay there from one CUDA graph of their own,
``sglang_swa_plugin.graphed``); ``syncs``: host-device synchronizations per call (``.item()``
and the like). On the CPU the fixes' device work runs op by op on the host, so ``fixed`` is an
upper bound of their host work on a GPU and a measure of their device work; ``host µs as on
a GPU``: the fixed side with each ``graphed.run`` as it runs on a GPU once captured (the inputs'
signature checked, then one launch whose own time is taken out). Sglang's Triton
kernels run as torch stand-ins counted as the one launch each is on a GPU (their own time
taken out, one op each; stock's, on both sides), and so do the plugin's (``plugin_kernels``):
each path runs the form a GPU runs.

A fix not needed on the installed sglang is not timed fix on/off: its row says so and times
stock's own step there (upstream's fixed form, where that release has it). Run it on each
release to compare: ``nox -s "bench(0.5.11)"`` (with 0.5.12 / 0.5.23 for upstream's forms).

The table ends with one row per fix not timed here: its verdict, its hooks on calls made before
a replay (the ones a row here would time) and whether the GPU bench times it.

    python tests/benchmarks/bench_host_cost.py [--rows a,b] [--rounds 300] [--block 20] [--ops]

``--ops``: after the table, each row's torch operations per side, in order (``launch``: a kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import bench_fix_cost_gpu as gpu  # noqa: E402  (the GPU bench's builders, on the CPU here)

gpu.DEVICE = "cpu"
gpu.capture = lambda forward: None  # nothing is captured: only the refresh before a replay runs
BATCHES = gpu.BATCHES


# the kernel stand-ins' own time and calls; "seen": where ``ops_and_syncs`` lists each launch in order
LAUNCHES = {"ns": 0, "calls": 0, "inside": False, "seen": None}


def launch(run):
    """A kernel stand-in counted as what its kernel is on a GPU, one launch: its time is taken
    out of the step's (``timed``) and its torch ops count as one (``ops_and_syncs``)."""
    def launched(*args, **kwargs):
        if LAUNCHES["inside"]:  # a stand-in inside a launched graph: part of that launch
            return run(*args, **kwargs)
        t0 = time.perf_counter_ns()
        LAUNCHES["inside"] = True
        try:
            return run(*args, **kwargs)
        finally:
            LAUNCHES["inside"] = False
            LAUNCHES["ns"] += time.perf_counter_ns() - t0
            LAUNCHES["calls"] += 1
            if LAUNCHES["seen"] is not None:
                LAUNCHES["seen"].append("launch")
    return launched


class OneLaunchGather:
    """``create_flashinfer_kv_indices_triton[grid](...)`` (page size 1, no id remap) in torch ops
    for every request at once, counted as one launch (``launch``); the check scenarios' twin
    loops over requests with host reads."""

    def __getitem__(self, grid):
        def run(req_to_token, rows, lens, indptr, starts, out, stride, ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False,
                token_mapping=None):
            assert ENTRY_PAGE_SIZE == 1, "page size 1"
            bs = int(grid[0])
            packed(req_to_token, rows[:bs], lens[:bs], indptr[: bs + 1], starts[:bs] if starts is not None else None,
                   out, token_mapping)
        return launch(run)


def packed(req_to_token, rows, lens, indptr, starts, out, token_mapping=None) -> None:
    """``out[indptr[b]:][:lens[b]] = req_to_token[rows[b], starts[b]:][:lens[b]]`` for every
    request ``b`` at once (``token_mapping``: ids remapped through it, 0.5.22+); the rest of
    ``out`` kept."""
    slot = torch.arange(min(out.shape[0], rows.shape[0] * req_to_token.shape[1]), dtype=indptr.dtype)
    req = torch.searchsorted(indptr[1:].contiguous(), slot, right=True).clamp_(max=rows.shape[0] - 1)
    off = (slot - indptr[req]).to(torch.int64)
    valid = (off < lens[req]) & (off >= 0)
    col = off + (starts[req].to(torch.int64) if starts is not None else 0)
    data = req_to_token[rows[req].to(torch.int64), col.clamp_(0, req_to_token.shape[1] - 1)]
    if token_mapping is not None:
        data = torch.where(data >= 0, token_mapping[data.clamp(min=0).to(torch.int64)].to(data.dtype), -1)
    head = out[: slot.shape[0]]
    head.copy_(torch.where(valid, data.to(out.dtype), head))


class OneLaunchDraftDecode:
    """``generate_draft_decode_kv_indices[grid](...)`` (topk 1, page size 1) in torch ops for
    every request at once, counted as one launch (``launch``); ``check.triton_bench``'s
    ``DraftDecodeTwin`` loops over requests with host reads."""

    def __getitem__(self, grid):
        steps, bs, topk = (int(g) for g in grid)
        assert topk == 1, "topk 1"

        def run(req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, pool_len,
                kv_indices_stride, kv_indptr_stride, *rest, ENTRY_PAGE_SIZE=1, v2p=None, **_):
            assert ENTRY_PAGE_SIZE == 1 and v2p is None, "page size 1"
            seq, rank = seq_lens[:bs].to(torch.int64), torch.arange(1, bs + 1)
            for s in range(steps):
                lens = seq + s + 1
                indptr = torch.zeros(bs + 1, dtype=torch.int64)
                indptr[1:] = torch.cumsum(lens, 0)
                packed(req_to_token, req_pool_indices[:bs], lens, indptr, None, kv_indices[s])
                kv_indptr[s, 1 : bs + 1] = torch.cumsum(positions[:bs], 0) + rank * (s + 1)
        return launch(run)


class OneLaunchDraftWindow:
    """``generate_draft_decode_window_kv_indices[grid](...)`` (0.5.23's own window rail of the
    multi-step draft; topk 1, page size 1) in torch ops for every step and request at once,
    counted as one launch (``launch``): per step ``s`` the last ``min(L + s + 1, window)`` ids of
    each request's row."""

    def __getitem__(self, grid):
        steps, bs, topk = (int(g) for g in grid)
        assert topk == 1, "topk 1"

        def run(req_pool_indices, req_to_token, seq_lens, out, out_indptr, positions, row_stride, *rest, v2p=None,
                **_):
            assert v2p is None, "page size 1, no page table"
            window = rest[-2] if len(rest) >= 2 else rest[-1]
            seq = seq_lens[:bs].to(torch.int64)
            for s in range(steps):
                lens = seq + s + 1
                kept = torch.clamp(lens, max=window)
                indptr = torch.zeros(bs + 1, dtype=torch.int64)
                indptr[1:] = torch.cumsum(kept, 0)
                packed(req_to_token, req_pool_indices[:bs], kept, indptr, lens - kept, out[s])
                out_indptr[s, 1 : bs + 1] = indptr[1:]
        return launch(run)


@contextlib.contextmanager
def plugin_kernels():
    """The plugin's own Triton kernels as a GPU runs them: ``triton_swa_draft``'s window rail
    (``rail_kernel.window_of_rail_layout``, one per draft step) and draft-extend translation
    (``translate_head``) as their torch forms, each counted as the one launch it is (``launch``)."""
    from unittest import mock

    from sglang_swa_plugin import rail_kernel, state
    from sglang_swa_plugin.hooks import triton_swa_draft as tsd

    def window_of_rail_layout(kv_indptr, kv_indices, mapping, bs, window, out_indptr, out_ids):
        be = SimpleNamespace(sliding_window_size=window)
        state.of(be)[tsd.RAIL] = {
            "translate": (lambda ids: mapping[ids]) if mapping is not None else None, "mapping": mapping,
            "limit": mapping.shape[0] if mapping is not None else None, "slots": {}, "kernel": False}
        cum, ids = tsd.window_rails(be, kv_indptr[None], kv_indices[None], bs)
        out_indptr[1 : bs + 1] = cum[0]
        out_ids[: ids.shape[1]] = ids[0]

    def translate_head(out, indptr, bs, n, mapping):
        keep, ids = torch.arange(n) < indptr[bs], out[:n]
        out[:n] = torch.where(keep, mapping[torch.where(keep, ids, 0)].to(out.dtype), ids)

    with mock.patch.object(tsd, "kernel_lays_out", lambda t: True), \
            mock.patch.object(rail_kernel, "window_of_rail_layout", launch(window_of_rail_layout)), \
            mock.patch.object(rail_kernel, "translate_head", launch(translate_head)):
        yield


@contextlib.contextmanager
def cpu_runtime():
    """What the builders call of the CUDA runtime, answered on the CPU (no device to wait for);
    sglang's Triton gathers as torch ops of a fixed count (as one launch), FA3's Triton helpers as their
    CPU stand-ins (``check.kernels``), its SWA spec page-table kernel left out (stock's, one
    launch on a GPU, on both sides)."""
    from unittest import mock

    from sglang_swa_plugin.check import triton_bench as ct
    from sglang_swa_plugin.check.flashinfer_swa_verify import _GATHER_MODULES
    from sglang_swa_plugin.check.kernels import cpu_kernels
    from sglang_swa_plugin.fa3_local import FA3_MODULE
    from sglang_swa_plugin.hooks.fa3_spec_translate import KERNEL as SWA_SPEC_KERNEL
    from sglang_swa_plugin.probe import optional_module, swapped
    from sglang_swa_plugin.triton_rail import GATHER_MODULES

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
        for mod in dict.fromkeys(optional_module(m) for m in (*GATHER_MODULES, *_GATHER_MODULES)):
            if hasattr(mod, "create_flashinfer_kv_indices_triton"):
                stack.enter_context(swapped(mod, "create_flashinfer_kv_indices_triton", OneLaunchGather()))
        tri = optional_module(ct.MODULE)
        if hasattr(tri, "generate_draft_decode_kv_indices"):
            stack.enter_context(swapped(tri, "generate_draft_decode_kv_indices", OneLaunchDraftDecode()))
        if hasattr(tri, "generate_draft_decode_window_kv_indices"):  # 0.5.23+: upstream's form
            stack.enter_context(swapped(tri, "generate_draft_decode_window_kv_indices", OneLaunchDraftWindow()))
        stack.enter_context(plugin_kernels())
        fa3 = optional_module(FA3_MODULE)
        stack.enter_context(cpu_kernels(FA3_MODULE))
        if hasattr(fa3, SWA_SPEC_KERNEL):  # one Triton kernel of stock's, either side: not run here
            stack.enter_context(swapped(fa3, SWA_SPEC_KERNEL, lambda *a, **k: None))
        yield


# ----------------------------------------------------------------------------- the rows


def _pair(refresh, fix) -> SimpleNamespace:
    return SimpleNamespace(refresh=refresh, fixes=[fix])


def fa3_row(topk: int, model: str, name: str):
    def build(bs):
        fix = gpu.hook(name).FIX
        _, refresh = gpu.fa3_verify(bs, topk, model, [fix])
        return _pair(refresh, fix)
    return build


def triton_draft_decode(bs):
    """bench_fix_cost_gpu's multi-step draft decode (3 step backends, a sliding layer), its
    graph state and capture-time metadata built with the fix in, without its forward (nothing
    is captured here); its write locations as the GPU bench gives them; the replay-time refresh."""
    fix = gpu.hook("triton_swa_draft").FIX
    steps = 4  # TritonMultiStepDraftBackend runs steps - 1 backends
    tb, pool, rtt, runner, ct = gpu.triton_parts(bs, 2 * steps)
    with gpu.installed([fix]):
        with gpu.triton_construction(ct) as tri:
            multi = tri.TritonMultiStepDraftBackend(runner, 1, steps)
        multi.init_cuda_graph_state(bs, bs)
        batch = tb.make_forward_batch(runner, "draft_decode", req_pool_indices=list(range(bs)),
                                      seq_lens=gpu.LENGTHS[:bs], attn_backend=multi,
                                      out_cache_loc=gpu.draft_decode_locations(bs, steps))
        batch.positions = batch.seq_lens.clone()
        gpu.multi_step_metadata(multi, batch, bs, in_capture=True)
    return _pair(lambda: gpu.multi_step_metadata(multi, batch, bs, in_capture=False), fix)


def triton_draft_extend(bs):
    """bench_fix_cost_gpu's DRAFT_EXTEND_V2 step (4 tokens per request, a sliding layer), its
    graph state and capture-time metadata built with the fix in; the replay-time refresh."""
    from graph_steps import prepare_capture

    fix = gpu.hook("triton_swa_draft").FIX
    n = 4
    tb, pool, rtt, runner, ct = gpu.triton_parts(bs, n, steps=n - 1)
    lens = [p + n for p in gpu.LENGTHS[:bs]]
    with gpu.installed([fix]):
        with gpu.triton_construction(ct) as tri:
            backend = tri.TritonAttnBackend(runner)
        batch = tb.make_forward_batch(runner, "draft_extend_v2", req_pool_indices=list(range(bs)), seq_lens=lens,
                                      out_cache_loc=torch.zeros(bs * n, dtype=torch.int64), extend_seq_lens=[n] * bs,
                                      num_tokens_per_req=n, attn_backend=backend)
        batch.spec_info = SimpleNamespace(extend_seq_lens_tensor=batch.extend_seq_lens, custom_mask=None)
        prepare_capture(backend, batch, n)
        refresh = gpu.replay_refresh(backend, batch, lens)
    return _pair(refresh, fix)


def triton_window_decode(bs):
    """bench_fix_cost_gpu's plain Triton decode (window WINDOW over a hybrid pool), its graph
    state and capture-time metadata built with the fix in; the replay-time refresh, where the
    fix's wrapper of sglang's window-rail builder runs."""
    fix = gpu.hook("triton_swa_window").FIX
    lens = [n + 1 for n in gpu.LENGTHS[:bs]]  # the token being decoded included
    backend, batch = gpu.triton_decode(bs, lens, fixes=[fix])
    with gpu.installed([fix]):
        refresh = gpu.replay_refresh(backend, batch, lens)
    return _pair(refresh, fix)


def graph_padding(bs):
    pair = gpu._swa_graph_padding(bs)
    return _pair(pair.fixed.refresh, pair.fixed.fixes[0])


ROWS = {  # key: (fix, step, build(bs) -> SimpleNamespace(refresh, fixes))
    "triton_swa_draft_decode": ("triton_swa_draft", "draft decode, 3 steps", triton_draft_decode),
    "triton_swa_draft_extend": ("triton_swa_draft", "draft extend (V2, 4 tokens)", triton_draft_extend),
    "fa3_local_attn_tree_verify": ("fa3_local_attn_tree_verify", "target verify, topk 2, Llama 4",
                                   fa3_row(2, "llama4", "fa3_local_attn_tree_verify")),
    "fa3_local_attn_verify": ("fa3_local_attn_verify", "target verify, topk 1, Llama 4",
                              fa3_row(1, "llama4", "fa3_local_attn_verify")),
    "swa_graph_padding": ("swa_graph_padding", "CUDA-graph input fill, padded", graph_padding),
    "triton_swa_window": ("triton_swa_window", "plain decode, a sliding layer", triton_window_decode),
    "fa3_spec_translate": ("fa3_spec_translate", "target verify, topk 2, 4 layers",
                           fa3_row(2, "gpt_oss", "fa3_spec_translate")),
}


# ----------------------------------------------------------------------------- timing


def ops_and_syncs(fn) -> "tuple[int, int, list]":
    """Torch operations (a kernel stand-in's: one), host-device syncs and the operations' names
    (a stand-in's: ``launch``) in one call of ``fn``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not LAUNCHES["inside"]:
                seen.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    LAUNCHES["seen"] = seen
    try:
        with Count():
            fn()
    finally:
        LAUNCHES["seen"] = None
    syncs = sum(1 for s in seen if s in ("aten::_local_scalar_dense", "aten::item"))
    return len(seen), syncs, [s.removeprefix("aten::") for s in seen]


def timed(fn, n: int) -> list:
    """µs of each of ``n`` calls of ``fn``, less its kernel stand-ins' own time."""
    out, clock = [], time.perf_counter_ns
    for _ in range(n):
        k0, t0 = LAUNCHES["ns"], clock()
        fn()
        t1 = clock()
        out.append((t1 - t0 - (LAUNCHES["ns"] - k0)) / 1e3)
    return out


@contextlib.contextmanager
def graphed_as_on_gpu():
    """``graphed.run`` as it runs on a GPU once its graph is captured: the inputs' signature
    checked against the one kept, then one launch (``launch``: the work's own time taken out)."""
    from unittest import mock

    from sglang_swa_plugin import graphed, state

    def run(owner, key, fn, inputs):
        cache = state.of(owner).setdefault(graphed.ATTR, {})
        sig, entry = graphed.signature(inputs), cache.get(key)
        if entry is None or entry.inputs != sig:
            cache[key] = graphed.Entry(sig)
        launch(fn)()

    with mock.patch.object(graphed, "run", run):
        yield


def side(pair, name: str):
    stack = contextlib.ExitStack()
    stack.enter_context(gpu.installed(pair.fixes if name != "stock" else []))
    if name == "graphed":
        stack.enter_context(graphed_as_on_gpu())
    return stack


def measure(pair, rounds: int, block: int, fixed_side: bool) -> dict:
    """Stock, fixed (the fix's device work op by op, on the host) and graphed (the fix's host
    work as on a GPU: its per-step device work one launch), interleaved block by block."""
    sides = {"stock": [], "fixed": [], "graphed": []} if fixed_side else {"stock": []}
    counts = {}
    for name in sides:
        with side(pair, name):
            pair.refresh()
            pair.refresh()  # warm: the fixes' per-buffer caches made
            counts[name] = ops_and_syncs(pair.refresh)
    done = 0
    while done < rounds:  # ABAB, blocks of ``block`` calls
        for name, times in sides.items():
            with side(pair, name):
                times.extend(timed(pair.refresh, min(block, rounds - done)))
        done += block
    out = {f"{k}_us": statistics.median(v) for k, v in sides.items()}
    out.update({f"{k}_ops": counts[k][0] for k in sides})
    out.update({f"{k}_syncs": counts[k][1] for k in sides})
    out.update({f"{k}_op_names": counts[k][2] for k in sides})
    return out


def run_row(key: str, bs: int, rounds: int, block: int) -> dict:
    from sglang_swa_plugin.fix import Verdict

    fix_name, step, build = ROWS[key]
    res = {"key": key, "fix": fix_name, "step": step, "bs": bs}
    det = gpu.hook(fix_name).FIX.detect()
    needed = det.verdict is Verdict.NEEDED
    if not needed:
        res["note"] = f"{det.verdict.value} here: stock is upstream's form" if det.verdict is Verdict.NOT_NEEDED \
            else f"{det.verdict.value} here"
        if det.verdict is not Verdict.NOT_NEEDED:
            return res
    try:
        with cpu_runtime():
            res.update(measure(build(bs), rounds, block, needed))
    except Exception as e:  # noqa: BLE001 - the row says why; the others go on
        res["error"] = f"{type(e).__name__}: {e}"[:200]
        if "active drivers" in str(e):  # Triton found no GPU
            res["error"] = "not timed: this sglang runs a Triton kernel here that has no CPU stand-in in this bench"
    return res


def table(rows: list) -> str:
    lines = ["| fix | step | batch | stock µs | fixed µs | ratio | added µs | ops stock/fixed | syncs stock/fixed "
             "| host µs as on a GPU (ratio) | note |", "|" + "---|" * 11]
    for r in rows:
        if "error" in r or "stock_us" not in r:
            lines.append(f"| {r['fix']} | {r['step']} | {r['bs']} | | | | | | | | {r.get('error') or r.get('note')} |")
            continue
        if "fixed_us" not in r:
            lines.append(f"| {r['fix']} | {r['step']} | {r['bs']} | {r['stock_us']:.1f} | - | - | - "
                         f"| {r['stock_ops']}/- | {r['stock_syncs']}/- | - | {r['note']} |")
            continue
        lines.append(f"| {r['fix']} | {r['step']} | {r['bs']} | {r['stock_us']:.1f} | {r['fixed_us']:.1f} "
                     f"| {r['fixed_us'] / r['stock_us']:.3f} | {r['fixed_us'] - r['stock_us']:.1f} "
                     f"| {r['stock_ops']}/{r['fixed_ops']} | {r['stock_syncs']}/{r['fixed_syncs']} "
                     f"| {r['graphed_us']:.1f} ({r['graphed_us'] / r['stock_us']:.3f}) | |")
    return "\n".join(lines)


# a hooked callable that runs before a replay: the refresh methods, and the rail builders they call
REPLAY_TIME = ("replay", "out_graph", "populate_from_forward_batch", "update_sliding_window")


def untimed_rows() -> list:
    """One row per fix this bench does not time: its verdict here and the hooks its plan here has
    on a call sglang makes before every CUDA-graph replay (none: its per-step work, if any, runs
    inside the forward, captured in sglang's graphs, or where graphs are off), and whether
    tests/benchmarks/bench_fix_cost_gpu.py times it."""
    from sglang_swa_plugin.core import BUILTIN_MODULES

    timed_fixes = {fix for fix, _, _ in ROWS.values()}
    out = []
    for module in BUILTIN_MODULES:
        name = module.rsplit(".", 1)[1]
        if name in timed_fixes:
            continue
        try:
            det = gpu.hook(name).FIX.detect()
            verdict, targets = det.verdict.value, det.targets if det.verdict.value == "needed" else ()
        except Exception as e:  # noqa: BLE001
            verdict, targets = f"detection failed: {type(e).__name__}", ()
        before = [".".join(t.rsplit(".", 2)[-2:]) for t in targets
                  if any(k in t.rsplit(".", 1)[1] for k in REPLAY_TIME)]
        gpu_rows = [k for k, r in gpu.ROWS.items() if r.fix == name]
        note = ("hooks before a replay: " + ", ".join(before) + " (not timed on the CPU)" if before
                else "no hook on a call made before a replay")
        out.append({"fix": name, "step": "-", "bs": "-", "note": f"{verdict} here; {note}; GPU bench: "
                    + (", ".join(gpu_rows) if gpu_rows else "no row")})
    return out


def main() -> None:
    import importlib.metadata
    import logging

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help="comma list of row keys (default: all)")
    ap.add_argument("--rounds", type=int, default=300, help="timed calls per side (>= 200)")
    ap.add_argument("--block", type=int, default=20, help="calls per side before the other side's turn")
    ap.add_argument("--ops", action="store_true", help="after the table, each row's operations per side, in order")
    a = ap.parse_args()
    if a.rounds < 200:
        ap.error("at least 200 rounds per side")
    keys = [k for k in a.rows.split(",") if k]
    unknown = [k for k in keys if k not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {sorted(ROWS)}")
    logging.disable(logging.WARNING)  # the testbed's construction logs
    torch.set_num_threads(1)
    t0 = time.time()
    rows = [run_row(k, bs, a.rounds, a.block) for k in keys for bs in BATCHES]
    print(f"sglang {importlib.metadata.version('sglang')}: host-side work before each CUDA-graph replay, CPU, "
          f"median of {a.rounds} calls per side, interleaved in blocks of {a.block} ({time.time() - t0:.0f} s)")
    print(table(rows + untimed_rows()))
    if a.ops:
        for r in rows:
            for name in ("stock", "fixed", "graphed"):
                if f"{name}_op_names" in r:
                    print(f"ops {r['key']} batch {r['bs']} {name}: {' '.join(r[f'{name}_op_names'])}")


if __name__ == "__main__":
    main()
