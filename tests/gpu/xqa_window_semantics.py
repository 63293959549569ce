#!/usr/bin/env python3
"""Which sliding-window rule does flashinfer's XQA kernel apply to a multi-token (spec-decode)
call? Runs the real kernel (bf16 query, 0.5.22's causal mask, window_left W) and compares it
with torch references that anchor the window differently:
  per_row   query row r at position p sees keys max(0, p-W)..p  (what single-token decode does)
  last_row  every row sees keys from max(0, L-1-W), causally up to its own position
  first_row every row sees keys from max(0, L-q_len-W), causally up to its own position
Also: a 4-token call whose query rows are strided (a view of a fused qkv tensor, as models
hand it over) against the same query made dense.
Prints the relative error of each; needs an sm90/sm120 GPU and flashinfer (no sglang)."""
import json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_xqa_probe as probe


def ref(q, k_pages, v_pages, bt, seq_lens, page_size, q_len, sm_scale, W, anchor):
    nq, nkv = q.shape[1], k_pages.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, L in enumerate(seq_lens.tolist()):
        pages = bt[b, : -(-L // page_size)].long()
        k = k_pages[pages].permute(0, 2, 1, 3).reshape(-1, nkv, k_pages.shape[-1])[:L].float().repeat_interleave(nq // nkv, 1)
        v = v_pages[pages].permute(0, 2, 1, 3).reshape(-1, nkv, v_pages.shape[-1])[:L].float().repeat_interleave(nq // nkv, 1)
        for r in range(q_len):
            pos = L - q_len + r
            start = {"per_row": pos - W, "last_row": L - 1 - W, "first_row": L - q_len - W}[anchor]
            lo = max(0, start)
            s = torch.einsum("hd,thd->ht", q[b * q_len + r].float(), k[lo:pos + 1]) * sm_scale
            out[b * q_len + r] = torch.einsum("ht,thd->hd", torch.softmax(s, -1), v[lo:pos + 1])
    return out


def main():
    import flashinfer
    import flashinfer.decode

    dev = torch.device("cuda")
    torch.manual_seed(0)
    bs, nq, nkv, d, ps, q_len, W = 2, 8, 2, 128, 64, 4, int(os.environ.get("W", "31"))
    lens = [100, 173]
    npages = bs * 3 + 3
    k_pool = torch.randn(npages * ps, nkv, d, device=dev).to(torch.bfloat16)
    v_pool = torch.randn(npages * ps, nkv, d, device=dev).to(torch.bfloat16)
    kc = k_pool.view(-1, ps, nkv, d).permute(0, 2, 1, 3)
    vc = v_pool.view(-1, ps, nkv, d).permute(0, 2, 1, 3)
    bt = torch.randperm(npages, device=dev)[: bs * 3].view(bs, 3).to(torch.int32).contiguous()
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(bs * q_len, nq, d, device=dev, dtype=torch.bfloat16)
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
    res = {}
    for n in (q_len, 1):
        qq = q if n == q_len else q.view(bs, q_len, nq, d)[:, -1].contiguous()
        kw = dict(q_len_per_req=n, mask=probe.spec_dec_mask(bs, n, dev)) if n > 1 else {}
        out = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
            query=qq, kv_cache=(kc, vc), workspace_buffer=ws, block_tables=bt, seq_lens=sl, max_seq_len=4096,
            bmm1_scale=d ** -0.5, bmm2_scale=1.0, window_left=W, sinks=None, out_dtype=torch.bfloat16, **kw).float()
        for anchor in ("per_row", "last_row", "first_row"):
            r = ref(qq, kc, vc, bt, sl, ps, n, d ** -0.5, W, anchor)
            res[f"q_len{n}_{anchor}"] = round(((out - r).abs().max() / r.abs().max()).item(), 4)
        if n > 1:  # per-row error pattern under the per_row rule
            r = ref(qq, kc, vc, bt, sl, ps, n, d ** -0.5, W, "per_row")
            res["per_row_err_by_row"] = [round(((out - r).view(bs, n, nq, d)[:, i].abs().max()).item(), 4) for i in range(n)]
    # The query as a model hands it over: a view of its fused qkv projection, rows strided by
    # q+k+v (GPT-OSS's qkv.split). Same values as q; full attention and the window.
    wide = torch.zeros(bs * q_len, nq + 2 * nkv, d, device=dev, dtype=torch.bfloat16)
    strided = wide[:, :nq]
    strided.copy_(q)
    for w in (-1, W):
        for name, qq in (("dense", q), ("strided", strided)):
            out = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
                query=qq, kv_cache=(kc, vc), workspace_buffer=ws, block_tables=bt, seq_lens=sl, max_seq_len=4096,
                bmm1_scale=d ** -0.5, bmm2_scale=1.0, window_left=w, sinks=None, out_dtype=torch.bfloat16,
                q_len_per_req=q_len, mask=probe.spec_dec_mask(bs, q_len, dev)).float()
            r = ref(q, kc, vc, bt, sl, ps, q_len, d ** -0.5, w if w >= 0 else 1 << 30, "per_row")
            res[f"q_len{q_len}_window{w}_{name}_query"] = round(((out - r).abs().max() / r.abs().max()).item(), 4)
    # Plain decode (one token per request, batch 2) with the strided query: the last row of
    # each request.
    last = q.view(bs, q_len, nq, d)[:, -1]
    wide1 = torch.zeros(bs, nq + 2 * nkv, d, device=dev, dtype=torch.bfloat16)
    strided1 = wide1[:, :nq]
    strided1.copy_(last)
    for name, qq in (("dense", last.contiguous()), ("strided", strided1)):
        out = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
            query=qq, kv_cache=(kc, vc), workspace_buffer=ws, block_tables=bt, seq_lens=sl, max_seq_len=4096,
            bmm1_scale=d ** -0.5, bmm2_scale=1.0, window_left=-1, sinks=None, out_dtype=torch.bfloat16).float()
        r = ref(last.contiguous(), kc, vc, bt, sl, ps, 1, d ** -0.5, 1 << 30, "per_row")
        res[f"q_len1_batch{bs}_{name}_query"] = round(((out - r).abs().max() / r.abs().max()).item(), 4)
    # The plugin's trtllm_xqa_spec_decode view, given the release's arguments (no mask).
    try:
        from sglang_swa_plugin.hooks.trtllm_xqa_spec_decode import _XqaState, _masking_flashinfer

        view = _masking_flashinfer(flashinfer, _XqaState())
        out = view.decode.trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=(kc, vc), workspace_buffer=ws, block_tables=bt, seq_lens=sl, max_seq_len=4096,
            bmm1_scale=d ** -0.5, bmm2_scale=1.0, window_left=W, sinks=None, out_dtype=torch.bfloat16,
            q_len_per_req=q_len).float()
        r = ref(q, kc, vc, bt, sl, ps, q_len, d ** -0.5, W, "per_row")
        res["plugin_view_per_row"] = round(((out - r).abs().max() / r.abs().max()).item(), 4)
    except ImportError as e:
        res["plugin_view_per_row"] = f"plugin not importable: {e}"
    print("XQA_WINDOW=" + json.dumps({"window_left": W, "rel_err": res}))


if __name__ == "__main__":
    main()
