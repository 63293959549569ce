#!/usr/bin/env python3
"""Does flashinfer's XQA decode kernel (Hopper sm90 / sm120) take an FP8 query?

Question (issue 6). In sglang 0.5.14-0.5.21, with an FP8 KV cache on XQA hardware,
``TRTLLMHAAttnBackend.forward_extend`` keeps the query in bf16 only for TARGET_VERIFY, so
DRAFT_EXTEND_V2 (routed to ``flashinfer.decode.trtllm_batch_decode_with_kv_cache`` since
0.5.14) hands the decode kernel an FP8 query. The backend's own comment says "XQA: q_type must
be bf16"; 0.5.22 keeps the query bf16 for every decode-kernel route. This script calls the real
kernel the way those releases do and compares with a torch reference.

Reading flashinfer 0.6.12 (the version sglang 0.5.14/0.5.15 pin), we expect:
  * bf16 query, q_len_per_req 1: matches the reference;
  * bf16 query, q_len_per_req > 1 with the spec-decode causal mask: matches;
  * bf16 query, q_len_per_req > 1 without a mask (what 0.5.14-0.5.20 pass, and 0.5.21 for
    DRAFT_EXTEND_V2): ``AssertionError: Mask is required for speculative decoding``;
  * FP8 query with bf16 output (sglang's call): ``AssertionError: Output and query must have
    the same dtype`` before any kernel runs;
  * FP8 query with FP8 output: ``ValueError`` from the XQA JIT generator (only fp16/bf16
    queries have a kernel).
Each case runs in its own subprocess, so a CUDA error (illegal address) in one cannot poison
the others; the XQA modules are JIT-compiled once (nvcc) and cached on disk.

Needs: an sm90 (or sm120) GPU, torch with CUDA, flashinfer-python importable (0.6.12 to match
sglang 0.5.14/0.5.15, with apache-tvm-ffi 0.1.9; 0.6.15.post1/0.6.18 for 0.5.17-0.5.21), and
nvcc for the XQA JIT (CUDA_HOME, nvcc on PATH, or the pip cuda-toolkit's nvcc, found below).
No sglang. On the H100 machine (offline, torch 2.11.0+cu130, nvcc 13.0, ninja) only the two
wheels are missing; fetched here and carried (about 15 MB):

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .gpu-fi flashinfer-python==0.6.12 apache-tvm-ffi==0.1.9
    # there:
    python3 -m pip install -q --no-index --no-deps --target /root/fi .gpu-fi/*.whl
    PYTHONPATH=/root/fi python3 tests/gpu/fp8_xqa_probe.py --json $OUT/fp8_xqa.json

Options: --page-size (64, as sglang forces for trtllm_mha), --q-len (draft tokens, 4),
--window-left (-1), --rtol (0.05), --inline (no subprocess per case).

Exit status: 0 when the probe ran and its supported-path sanity checks matched the reference
(whatever the verdict on FP8), 1 when the probe itself is invalid, 2 without a suitable GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

# Case name -> (query dtype, how the query is made FP8, q_len_per_req > 1?, pass the mask?,
#               output dtype, what it reproduces).
CASES = {
    "bf16_q1": ("bf16", None, False, False, "bf16",
                "sglang 0.5.22+ DRAFT_EXTEND_V2/TARGET_VERIFY, one token per request"),
    "bf16_qN_mask": ("bf16", None, True, True, "bf16",
                     "sglang 0.5.22+ DRAFT_EXTEND_V2 (bf16 query, spec-decode mask)"),
    "bf16_qN_nomask": ("bf16", None, True, False, "bf16",
                       "0.5.14-0.5.21 DRAFT_EXTEND_V2 had its query been bf16 (no mask passed)"),
    "fp8cast_q1": ("fp8", "cast", False, False, "bf16",
                   "0.5.15-0.5.21 DRAFT_EXTEND_V2 query (q.to(fp8)), one token per request"),
    "fp8scaled_qN_nomask": ("fp8", "scaled", True, False, "bf16",
                            "0.5.14 DRAFT_EXTEND_V2 exactly (scaled_fp8_quant query, q_scale in bmm1_scale, no mask)"),
    "fp8cast_qN_nomask": ("fp8", "cast", True, False, "bf16",
                          "0.5.15-0.5.21 DRAFT_EXTEND_V2 exactly (q.to(fp8), no mask)"),
    "fp8cast_qN_mask": ("fp8", "cast", True, True, "bf16",
                        "FP8 query with the mask: the query dtype alone"),
    "fp8cast_q1_fp8out": ("fp8", "cast", False, False, "fp8",
                          "FP8 query and FP8 output, the only pairing xqa() lets through"),
    # The calls the plugin's trtllm_xqa_spec_decode makes: the release's arguments (no mask;
    # on 0.5.10-0.5.13 an FP8-cast query) through the plugin's own flashinfer view.
    "plugin_bf16_qN": ("bf16", None, True, False, "bf16",
                       "plugin: 0.5.10-0.5.21 TARGET_VERIFY / 0.5.14-0.5.21 DRAFT_EXTEND_V2 shown as it (bf16, mask added)"),
    "plugin_fp8cast_qN": ("fp8", "cast", True, False, "bf16",
                          "plugin: 0.5.10-0.5.13 TARGET_VERIFY with an FP8 KV cache (query cast to FP8; upcast, mask added)"),
}
SANITY = ("bf16_q1", "bf16_qN_mask")
PLUGIN_CASES = ("plugin_bf16_qN", "plugin_fp8cast_qN")
FP8_CASES = tuple(n for n, c in CASES.items() if c[0] == "fp8" and n not in PLUGIN_CASES)


def ensure_nvcc() -> None:
    """Point CUDA_HOME at a usable nvcc when neither CUDA_HOME nor PATH provides one (the pip
    ``cuda-toolkit``/``nvidia-cuda-nvcc`` wheels put it under site-packages/nvidia/...)."""
    import glob
    import shutil
    import site

    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or shutil.which("nvcc"):
        return
    roots = ["/usr/local/cuda"] + [os.path.join(p, "nvidia") for p in site.getsitepackages()]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "bin", "nvcc")) + glob.glob(os.path.join(root, "*", "bin", "nvcc")))
        if hits:
            os.environ["CUDA_HOME"] = os.path.dirname(os.path.dirname(hits[0]))
            return


def spec_dec_mask(bs: int, q_len: int, device):
    """XQA's bit-packed causal mask for the draft window, as sglang 0.5.21+ builds it:
    uint16 [bs, q_len, ceil(q_len/32)*2]; row r sets its low r+1 bits."""
    import torch

    words = (q_len + 31) // 32 * 2
    row = torch.arange(q_len, dtype=torch.int32)[:, None]
    word = torch.arange(words, dtype=torch.int32)[None, :]
    bits = (row + 1 - 16 * word).clamp(0, 16)
    mask = ((1 << bits) - 1).to(torch.uint16)
    return mask.unsqueeze(0).expand(bs, -1, -1).contiguous().to(device)


def reference(q, k_pages, v_pages, block_tables, seq_lens, page_size, q_len, sm_scale, window_left):
    """float32 attention: request b's query row r sits at position L_b - q_len + r and sees the
    keys at positions <= its own (and within the window when window_left >= 0)."""
    import torch

    num_q_heads, num_kv_heads = q.shape[1], k_pages.shape[1]
    group = num_q_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, L in enumerate(seq_lens.tolist()):
        pages = block_tables[b, : -(-L // page_size)].long()
        # pages are HND: [page, kv_head, slot, dim] -> [tokens, kv_head, dim]
        k = k_pages[pages].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, k_pages.shape[-1])[:L].float()
        v = v_pages[pages].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, v_pages.shape[-1])[:L].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        for r in range(q_len):
            pos = L - q_len + r
            lo = 0 if window_left < 0 else max(0, pos - window_left)
            qi = q[b * q_len + r].float()  # [heads, dim]
            s = torch.einsum("hd,thd->ht", qi, k[lo: pos + 1]) * sm_scale
            out[b * q_len + r] = torch.einsum("ht,thd->hd", torch.softmax(s, dim=-1), v[lo: pos + 1])
    return out


def run_case(name: str, args) -> dict:
    import torch
    import flashinfer
    import flashinfer.decode

    q_dtype, fp8_mode, multi, with_mask, out_kind, _ = CASES[name]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bs, num_q_heads, num_kv_heads, head_dim, page_size = 2, 8, 2, 128, args.page_size
    q_len = args.q_len if multi else 1
    seq_lens_list = [100, 173]
    fp8 = torch.float8_e4m3fn
    pages_per_req = -(-max(seq_lens_list) // page_size)
    num_pages = bs * pages_per_req + 3

    # The KV pool as sglang stores it: [slots, kv_heads, dim] per layer, FP8 (k_scale = v_scale = 1),
    # viewed as [pages, page, heads, dim] and permuted to HND without copying.
    k_pool = (torch.randn(num_pages * page_size, num_kv_heads, head_dim, device=dev) * 0.5).to(fp8)
    v_pool = torch.randn(num_pages * page_size, num_kv_heads, head_dim, device=dev).to(fp8)
    k_cache = k_pool.view(-1, page_size, num_kv_heads, head_dim).permute(0, 2, 1, 3)
    v_cache = v_pool.view(-1, page_size, num_kv_heads, head_dim).permute(0, 2, 1, 3)
    perm = torch.randperm(num_pages, device=dev)[: bs * pages_per_req].view(bs, pages_per_req)
    block_tables = perm.to(torch.int32).contiguous()
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32, device=dev)

    q = torch.randn(bs * q_len, num_q_heads, head_dim, device=dev, dtype=torch.bfloat16)
    sm_scale = head_dim ** -0.5
    q_scale = 1.0
    q_in = q
    if q_dtype == "fp8" and fp8_mode == "cast":  # 0.5.15-0.5.21: q.to(torch.float8_e4m3fn)
        q_in = q.to(fp8)
    elif q_dtype == "fp8":  # 0.5.14: scaled_fp8_quant (per-tensor dynamic), q_scale folded into bmm1
        q_scale = (q.abs().amax().float() / torch.finfo(fp8).max).clamp(min=1e-12).reshape(1)
        q_in = (q.float() / q_scale).clamp(torch.finfo(fp8).min, torch.finfo(fp8).max).to(fp8)
    q_seen = q_in.float() * (q_scale if isinstance(q_scale, float) else q_scale.item())

    bmm1_scale = q_scale * 1.0 * sm_scale  # q_scale * k_scale * layer.scaling, as sglang
    bmm2_scale = 1.0  # v_scale
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
    call = dict(
        query=q_in, kv_cache=(k_cache, v_cache), workspace_buffer=workspace, block_tables=block_tables,
        seq_lens=seq_lens, max_seq_len=4096, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
        window_left=args.window_left, sinks=None,
        out_dtype=torch.bfloat16 if out_kind == "bf16" else fp8,
    )
    if multi:
        call["q_len_per_req"] = q_len
    if with_mask:
        call["mask"] = spec_dec_mask(bs, q_len, dev)
    result = {"case": name, "what": CASES[name][5], "query_dtype": str(q_in.dtype),
              "q_len_per_req": q_len, "mask": with_mask, "out_dtype": str(call["out_dtype"])}
    kernel = flashinfer.decode.trtllm_batch_decode_with_kv_cache
    if name in PLUGIN_CASES:
        from sglang_swa_plugin.hooks.trtllm_xqa_spec_decode import _XqaState, _masking_flashinfer

        kernel = _masking_flashinfer(flashinfer, _XqaState()).decode.trtllm_batch_decode_with_kv_cache
    t0 = time.time()
    try:
        out = kernel(**call)
        torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001 - the exception IS the result
        result.update(outcome="raised", error=f"{type(e).__name__}: {e}".strip()[:400],
                      where=traceback.extract_tb(e.__traceback__)[-1].filename.split("site-packages/")[-1]
                      + f":{traceback.extract_tb(e.__traceback__)[-1].lineno}",
                      seconds=round(time.time() - t0, 1))
        return result
    ref = reference(q_seen, k_cache, v_cache, block_tables, seq_lens, page_size, q_len, sm_scale,
                    args.window_left)
    got = out.float()
    err = (got - ref).abs().max().item()
    scale = max(ref.abs().max().item(), 1e-6)
    finite = bool(torch.isfinite(got).all())
    matches = finite and err <= args.rtol * scale
    result.update(outcome="matches" if matches else "WRONG", max_abs_err=err, ref_max=scale,
                  rel_err=err / scale, finite=finite, seconds=round(time.time() - t0, 1))
    return result


def verdict(results: dict) -> "tuple[list, bool]":
    lines, valid = [], True
    for n in SANITY:
        if results.get(n, {}).get("outcome") != "matches":
            valid = False
            lines.append(f"PROBE INVALID: the supported path {n} did not match the reference: {results.get(n)}")
    fp8 = {n: results.get(n, {}) for n in FP8_CASES}
    outcomes = {r.get("outcome") for r in fp8.values()}
    if "WRONG" in outcomes:
        lines.append("VERDICT: REAL, SILENT - an FP8 query runs and gives WRONG attention "
                     f"({', '.join(n for n, r in fp8.items() if r.get('outcome') == 'WRONG')}). "
                     "The plugin must keep the query bf16 for DRAFT_EXTEND_V2 on XQA (0.5.22's change).")
    elif "matches" in outcomes:
        accepted = [n for n, r in fp8.items() if r.get("outcome") == "matches"]
        lines.append(f"VERDICT: an FP8 query is ACCEPTED and correct in {', '.join(accepted)}; "
                     "where the others raised, see below.")
    elif outcomes == {"raised"}:
        lines.append("VERDICT: REAL, LOUD - every FP8-query call is refused before a kernel runs "
                     "(no wrong numbers; DRAFT_EXTEND_V2 with an FP8 KV cache fails on the first draft extend).")
    else:
        lines.append(f"VERDICT: incomplete, FP8 cases: {fp8}")
    for n in PLUGIN_CASES:
        r = results.get(n)
        if r:
            lines.append(f"PLUGIN {n}: {r.get('outcome')} (rel_err {r.get('rel_err')}, {r.get('error', '')})")
    nomask = results.get("bf16_qN_nomask", {})
    if nomask.get("outcome") == "raised":
        lines.append("Also: a bf16 query with q_len_per_req > 1 and no mask is refused too "
                     f"({nomask.get('error')}): on 0.5.14-0.5.21 DRAFT_EXTEND_V2 through XQA fails "
                     "whatever the query dtype; 0.5.22 passes the mask for it.")
    elif nomask:
        lines.append(f"Also: a bf16 query with q_len_per_req > 1 and no mask -> {nomask.get('outcome')}.")
    return lines, valid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    ap.add_argument("--json", help="also write the results and verdict to this file")
    ap.add_argument("--page-size", type=int, default=64, help="KV page size (sglang forces 64 for trtllm_mha)")
    ap.add_argument("--q-len", type=int, default=4, help="q_len_per_req of the multi-token cases (draft tokens)")
    ap.add_argument("--window-left", type=int, default=-1, help="sliding window (window_left), -1 = full")
    ap.add_argument("--rtol", type=float, default=0.05, help="max |out-ref| / max |ref| to count as a match")
    ap.add_argument("--inline", action="store_true", help="run the cases in this process")
    ap.add_argument("--cases", help="comma-separated subset of the cases (default: all)")
    args = ap.parse_args()

    if args.case:
        ensure_nvcc()
        print("CASE_RESULT=" + json.dumps(run_case(args.case, args)))
        return 0

    try:
        import torch
    except ImportError:
        print("torch is not importable"); return 2
    if not torch.cuda.is_available():
        print("no CUDA device: this probe needs an sm90/sm120 GPU"); return 2
    cap = torch.cuda.get_device_capability()
    ensure_nvcc()
    try:
        import flashinfer
        import flashinfer.decode
    except Exception as e:  # noqa: BLE001
        print(f"flashinfer is not importable: {type(e).__name__}: {e}"); return 2

    env = {
        "device": torch.cuda.get_device_name(), "capability": f"sm{cap[0]}{cap[1]}",
        "CUDA_HOME": os.environ.get("CUDA_HOME"),
        "torch": torch.__version__, "flashinfer": getattr(flashinfer, "__version__", "?"),
        "backend_auto_picks": "trtllm-gen" if cap[0] == 10 else "xqa",
    }
    print("environment: " + json.dumps(env))
    if cap[0] not in (9, 12):
        print("not an XQA GPU (sm90/sm120): the question does not arise here"); return 2

    results = {}
    for name in (args.cases.split(",") if args.cases else CASES):
        if args.inline:
            res = run_case(name, args)
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--case", name, "--page-size", str(args.page_size),
                   "--q-len", str(args.q_len), "--window-left", str(args.window_left), "--rtol", str(args.rtol)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            line = [l for l in proc.stdout.splitlines() if l.startswith("CASE_RESULT=")]
            res = (json.loads(line[-1][len("CASE_RESULT="):]) if line else
                   {"case": name, "what": CASES[name][5], "outcome": "crashed", "returncode": proc.returncode,
                    "error": (proc.stderr or proc.stdout)[-600:]})
        results[name] = res
        detail = res.get("error") or (f"rel_err={res.get('rel_err'):.4f}" if "rel_err" in res else "")
        print(f"{name:<22} {res.get('outcome'):<8} {detail}")
        print(f"{'':<22} ({res.get('what')})")
    lines, valid = verdict(results)
    print()
    for line in lines:
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": results, "verdict": lines}, f, indent=2)
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
