"""The tiny MiMo-V2 target (selftest/targets/mimo_v2.py) on the CPU, where transformers has
MiMoV2FlashForCausalLM (5.19+): its checks against transformers' float32 model on a few
prompts, its own float32 forward against transformers', its checkpoint against sglang's real
MiMo-V2 loaders, and its MTP layers' agreement with the target's token after next."""

from __future__ import annotations

import pytest

from sglang_swa_plugin.selftest.targets import mimo_v2, readout

from helpers import has_module


def _why_not():
    if not mimo_v2.has_reference_class():
        return "transformers has no MiMoV2FlashForCausalLM (mimo_v2_flash: transformers 5.19+)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")

N, LENGTH, NEW = 4, 48, 12  # a few short prompts: the whole file in seconds


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """One torch thread for this file's tests (conftest's one_torch_thread)."""


@pytest.fixture(scope="module")
def served():
    """The served weights rounded to bf16, as float32: (target, mtp)."""
    import torch

    sd, mtp = mimo_v2.weights(draft=True)
    return tuple({k: v.to(torch.bfloat16).float() for k, v in d.items()} for d in (sd, mtp))


@pytest.mark.targets  # transformers' model on the CPU: on noxfile.TARGET_VERSIONS only
def test_bf16_equals_float32_and_the_window_decides():
    row = readout.check(mimo_v2.hf_model, mimo_v2.WINDOW, "window", [1], n=N, length=LENGTH, max_new=NEW,
                        show=None)[1]
    assert row["bf16_equal"] == N, row
    assert row["min_margin"] >= readout.MARGIN_FLOOR, row
    assert row["changed_by_window_15"] >= N - 1 and row["changed_by_window_17"] >= N - 1, row
    assert 2 * row["slot_changed"] > N and 2 * row["full_changed"] > N, row


def test_own_forward_is_transformers_forward(served):
    """forward32 (the reference where transformers has no MiMo-V2, and the MTP check's hidden
    states) gives transformers' logits, at the window and one key off it."""
    import torch

    ids = torch.tensor(readout.prompts(2, LENGTH, seed=5))
    for window in (mimo_v2.WINDOW, mimo_v2.WINDOW + 1):
        with torch.no_grad():
            want = mimo_v2.hf_model(window)(input_ids=ids).logits
            got, _ = mimo_v2.forward32(served[0], ids, window)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (window, (got - want).abs().max())


def test_mtp_predicts_the_token_after_next(served):
    """sglang's MTP forward (mimo_v2.mtp_forward32) on the target's float32 sequences: each
    multi-layer step's argmax is the target's token at nearly every position."""
    out = mimo_v2.reference([3], n=N, length=LENGTH, max_new=NEW, emulate=True)
    agree = mimo_v2.mtp_agreement([3], n=N, length=LENGTH, max_new=NEW, outputs=out)
    assert all(v > 0.9 for v in agree.values()), agree


def test_checkpoint_loads_into_sglangs_models(tmp_path):
    """The saved checkpoint through sglang's own MiMoV2FlashForCausalLM.load_weights and
    MiMoV2MTP.load_weights (real classes, tensor parallelism of one CPU process; the rotary
    embedding is recorded, not built: sglang's CPU rope imports vLLM): every parameter
    is written, q/k/v land in qkv_proj, the MTP layer in ``mtp_block``; sglang's attention
    gets the sliding window, head dims and partial rotary factor of the target."""
    if not has_module("sglang.srt.models.mimo_v2_nextn"):
        pytest.skip("this sglang has no MiMo-V2 MTP model")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from sglang_swa_plugin.check.testbed import tensor_parallel_of_one
    from sglang_swa_plugin.probe import swapped

    tensor_parallel_of_one()
    import sglang.srt.models.mimo_v2 as sm
    import sglang.srt.models.mimo_v2_nextn as sn

    target, draft = mimo_v2.save(str(tmp_path))
    assert draft == target
    ck = load_file(f"{target}/model.safetensors")
    ropes = []

    def rope(*a, **k):
        ropes.append((a, k))
        return torch.nn.Identity()

    def build(cls, arch):
        cfg = AutoConfig.from_pretrained(target, trust_remote_code=True)
        cfg.encoder_only = False  # what sglang's ModelConfig sets
        if arch == "MiMoV2MTP":  # sglang's ModelConfig for the draft
            cfg.architectures, cfg.num_nextn_predict_layers = ["MiMoV2MTP"], 1
        with swapped(sm, "get_rope", rope):
            model = cls(cfg).to(torch.bfloat16)
        for p in model.parameters():
            p.data.fill_(float("nan"))
        model.load_weights(list(ck.items()))
        params = dict(model.named_parameters())
        unwritten = [n for n, p in params.items() if torch.isnan(p.float()).any()]
        assert not unwritten, (arch, unwritten)
        return model, params

    model, params = build(sm.MiMoV2FlashForCausalLM, "MiMoV2FlashForCausalLM")
    for i in range(mimo_v2.L):
        p = f"model.layers.{i}.self_attn."
        qkv = torch.cat([ck[p + f"{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(params[p + "qkv_proj.weight"], qkv), i
        attn = model.model.layers[i].self_attn
        swa = mimo_v2.LAYER_TYPES[i] == "sliding_attention"
        assert attn.attn.sliding_window_size == (mimo_v2.WINDOW if swa else -1)
        assert (attn.head_dim, attn.v_head_dim) == (mimo_v2.HEAD_DIM, mimo_v2.V_HEAD_DIM)
        assert attn.total_num_kv_heads == (mimo_v2.NKV_SWA if swa else mimo_v2.NKV)
        assert attn.v_scale == mimo_v2.V_SCALE and attn.attention_sink_bias is None
    assert not any("mtp" in n for n in params)

    draft_model, dparams = build(sn.MiMoV2MTP, "MiMoV2MTP")
    p = "model.mtp.layers.0."
    qkv = torch.cat([ck[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(dparams["model.mtp_block.self_attn.qkv_proj.weight"], qkv)
    assert torch.equal(dparams["model.eh_proj.weight"], ck[p + "eh_proj.weight"])
    assert draft_model.model.mtp_block.self_attn.attn.sliding_window_size == mimo_v2.WINDOW
    assert len(ropes) == mimo_v2.L + 1, ropes
    for a, k in ropes:  # every attention's rotary embedding: 64 rotary dims of 192, theta 10000
        head = k.get("head_size", a[0] if a else None)
        assert head == mimo_v2.HEAD_DIM and int(head * k["partial_rotary_factor"]) == readout.HD, (a, k)
        assert k.get("base", a[3] if len(a) > 3 else None) == readout.THETA, (a, k)
