"""The tiny Step3.5 target (selftest/targets/step3p5.py) on the CPU: its checks against the
float32 reference (transformers' Step3p7TextModel, the class transformers builds for a
``step3p5`` checkpoint, where transformers has it: 5.19+; the target's own forward elsewhere),
its own forward against transformers', its two checkpoints against sglang's real Step3.5
loaders (the 4-layer target; the MTP layers in a checkpoint of the 45 layers sglang's MTP takes
for granted), and its MTP layers' agreement with the target's token after next."""

from __future__ import annotations

import pytest

from sglang_swa_plugin.selftest.targets import readout, step3p5

from helpers import has_module, methods_alone

N, LENGTH, NEW = 4, 48, 12  # a few short prompts


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """One torch thread for this file's tests (conftest's one_torch_thread)."""


@pytest.mark.targets  # float32 computations of the target (noxfile.TARGET_VERSIONS)
def test_own_forward_bf16_equals_float32_and_every_layer_decides():
    """The target's own forward (the reference where transformers has no Step3p7TextModel;
    tests/test_targets.py checks transformers' where it has one): bf16 gives the float32 tokens
    on every request with margins above the floor (attention scores in float32, as sglang's
    kernels: rounded to bf16, two of these eight requests change), the window one key off
    changes every request, and a wrong slot or the full layers' wrong reads most of them."""
    import functools

    n, length, new = 8, 40, 24  # tests/test_targets.py's requests
    row = readout.check(functools.partial(step3p5.hf_model, emulate=True), step3p5.WINDOW, "window", [1], n=n,
                        length=length, max_new=new, show=None)[1]
    assert row["bf16_equal"] == n and row["min_margin"] >= readout.MARGIN_FLOOR, row
    assert row["changed_by_window_15"] == n and row["changed_by_window_17"] == n, row
    assert 2 * row["slot_changed"] > n and 2 * row["full_changed"] > n, row


@pytest.mark.targets  # float32 computations of the target (noxfile.TARGET_VERSIONS)
def test_own_forward_is_transformers_forward():
    """forward32 (the reference where transformers has no Step3p7TextModel, and the MTP check's
    hidden states) gives the logits of transformers' text model and the lm_head, at the
    window and one key off it."""
    if not step3p5.has_reference_class():
        pytest.skip("transformers has no Step3p7TextModel (step3p7: transformers 5.19+)")
    import torch

    ids = torch.tensor(readout.prompts(2, LENGTH, seed=5))
    for window in (step3p5.WINDOW, step3p5.WINDOW + 1):
        with torch.no_grad():
            want = step3p5.hf_model(window)(input_ids=ids).logits
            got = step3p5.hf_model(window, emulate=True)(input_ids=ids).logits
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (window, (got - want).abs().max())
    if not hasattr(readout, "kv_perturbed"):
        return
    kinds = readout.layer_kinds(step3p5.hf_model())
    for fault in (readout.wrong_index_space(kinds, 3), readout.wrong_slot(kinds, LENGTH, step3p5.WINDOW, 4, 2, 3)):
        models = step3p5.hf_model(), step3p5.hf_model(emulate=True)  # the same fault through each's own hook
        with torch.no_grad(), readout.kv_perturbed(models[0], fault), readout.kv_perturbed(models[1], fault):
            want, got = (m(input_ids=ids).logits for m in models)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


@pytest.mark.targets  # float32 computations of the target (noxfile.TARGET_VERSIONS)
def test_the_reference_is_transformers_step3p5_model_type():
    """transformers serves a ``step3p5`` checkpoint with the Step3p7 text classes (the model's
    definition the reference is taken from), and reads the checkpoint's keys as the target
    means them: 4 layers (the MTP layers split off), the window, the heads, dense MLPs,
    partial RoPE."""
    if not step3p5.has_reference_class():
        pytest.skip("transformers has no Step3p7TextModel (step3p7: transformers 5.19+)")
    from transformers import AutoConfig, Step3p7TextConfig

    assert AutoConfig.for_model("step3p5").__class__ is Step3p7TextConfig
    cfg = step3p5.config()
    assert (cfg.num_hidden_layers, cfg.sliding_window, cfg.num_key_value_heads) == (step3p5.L, step3p5.WINDOW,
                                                                                    step3p5.NKV)
    assert cfg.layer_types == step3p5.LAYER_TYPES and set(cfg.mlp_layer_types) == {"dense"}
    assert cfg.num_nextn_predict_layers == step3p5.MTP_LAYERS
    assert {p["partial_rotary_factor"] for p in cfg.rope_parameters.values()} == {step3p5.ROTARY}
    assert cfg.gating is True and cfg.query_pre_attn_scalar == step3p5.HEAD_DIM


@pytest.mark.targets  # float32 computations of the target (noxfile.TARGET_VERSIONS)
def test_mtp_predicts_the_token_after_next():
    """sglang's MTP forward (step3p5.mtp_forward32, steps chained as sglang chains them) on the
    target's float32 sequences: each multi-layer step's argmax is the target's token at nearly
    every position."""
    out = step3p5.reference([3], n=N, length=LENGTH, max_new=NEW, emulate=True)
    agree = step3p5.mtp_agreement([3], n=N, length=LENGTH, max_new=NEW, outputs=out)
    assert all(v > 0.9 for v in agree.values()), agree


@pytest.mark.release_independent  # sglang's own Step3.5 loaders (noxfile CLI_VERSIONS)
def test_checkpoint_loads_into_sglangs_models(tmp_path):
    """The saved checkpoints through sglang's own Step3p5ForCausalLM.load_weights (the target's)
    and Step3p5MTP.load_weights (the MTP layers', as its multi-layer EAGLE loads each with its
    ``draft_model_idx``) (real classes, sglang's Step3p5Config read from each checkpoint, tensor
    parallelism of one CPU process; the rotary embedding is recorded, not built: sglang's CPU
    rope imports vLLM): every parameter is written, q/k/v land in qkv_proj, each MTP layer in
    its draft's ``mtp_block``, whose attention is layer 0 of the draft's one-layer cache (sglang
    builds it as layer 45: from the target's own 4-layer config it does not build); a
    Step3p5MTP without ``draft_model_idx`` (NEXTN's one-layer draft) stops at its weights;
    sglang's attention (stock) gets the sliding window, head dim, partial rotary factor and
    theta of the target."""
    if not has_module("sglang.srt.models.step3p5_mtp"):
        pytest.skip("this sglang has no Step3.5 MTP model")
    import torch
    from safetensors.torch import load_file

    from sglang_swa_plugin.check.model_window import dp_attention_of_one
    from sglang_swa_plugin.check.testbed import tensor_parallel_of_one
    from sglang_swa_plugin.hooks import step3p5_window as sw
    from sglang_swa_plugin.probe import swapped

    tensor_parallel_of_one()
    import sglang.srt.models.step3p5 as sm
    import sglang.srt.models.step3p5_mtp as sn
    from sglang.srt.configs.step3p5 import Step3p5Config

    target, draft = step3p5.save(str(tmp_path))
    assert draft != target
    ck = {path: load_file(f"{path}/model.safetensors") for path in (target, draft)}
    assert not any(k.startswith(f"model.layers.{step3p5.L}.") for k in ck[target])
    ropes = []

    def rope(*a, **k):
        ropes.append((a, k))
        return torch.nn.Identity()

    def built(cls, path, **extra):
        cfg = Step3p5Config.from_pretrained(path)
        cfg.encoder_only = False  # what sglang's ModelConfig sets
        dp_attention_of_one(cfg)  # sglang's own set-up of one process without DP attention
        if cls is sn.Step3p5MTP:  # sglang's ModelConfig for the draft
            cfg.architectures = ["Step3p5MTP"]
        with methods_alone(sw.FIX, {sm.Step3p5Attention: ("__init__",), sm.Step3p5ForCausalLM: ("__init__",),
                                    sn.Step3p5MTP: ("__init__",)}), swapped(sm, "get_rope", rope):
            model = cls(cfg, **extra).to(torch.bfloat16)
        for p in model.parameters():
            p.data.fill_(float("nan"))
        return model

    def loaded(cls, path, **extra):
        model = built(cls, path, **extra)
        model.load_weights(list(ck[path].items()))
        params = dict(model.named_parameters())
        unwritten = [n for n, p in params.items() if torch.isnan(p.float()).any()]
        assert not unwritten, (cls.__name__, unwritten)
        return model, params

    model, params = loaded(sm.Step3p5ForCausalLM, target)
    for i in range(step3p5.L):
        p = f"model.layers.{i}.self_attn."
        qkv = torch.cat([ck[target][p + f"{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(params[p + "qkv_proj.weight"], qkv), i
        assert torch.equal(params[p + "q_norm.weight"], ck[target][p + "q_norm.weight"]), i
        attn = model.model.layers[i].self_attn
        swa = step3p5.LAYER_TYPES[i] == "sliding_attention"
        assert attn.attn.sliding_window_size == (step3p5.WINDOW if swa else -1)
        assert (attn.head_dim, attn.total_num_kv_heads, attn.use_head_wise_attn_gate) == (step3p5.HEAD_DIM,
                                                                                         step3p5.NKV, True)
    assert len(model.model.layers) == step3p5.L
    for k in range(step3p5.MTP_LAYERS):
        draft_model, dparams = loaded(sn.Step3p5MTP, draft, draft_model_idx=k)
        p = f"model.layers.{step3p5.DRAFT_DEPTH + k}."
        qkv = torch.cat([ck[draft][p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(dparams["model.mtp_block.self_attn.qkv_proj.weight"], qkv)
        assert torch.equal(dparams["model.eh_proj.weight"], ck[draft][p + "eh_proj.weight"])
        assert torch.equal(dparams["model.embed_tokens.weight"], ck[target]["model.embed_tokens.weight"])
        attn = draft_model.model.mtp_block.self_attn.attn
        assert (attn.sliding_window_size, attn.layer_id) == (step3p5.WINDOW, 0)
    with pytest.raises(IndexError):  # from the target's config: layer 45 reads entry 45 of its 7-entry lists
        built(sn.Step3p5MTP, target, draft_model_idx=0)
    with pytest.raises(TypeError):  # NEXTN: no draft_model_idx
        built(sn.Step3p5MTP, draft).load_weights(list(ck[draft].items()))
    assert len(ropes) == step3p5.L + step3p5.MTP_LAYERS + 1, len(ropes)
    for a, k in ropes:  # every attention's rotary embedding: 64 rotary dims of 128, theta 10000
        head = k.get("head_size", a[0] if a else None)
        assert head == step3p5.HEAD_DIM and int(head * k["partial_rotary_factor"]) == readout.HD, (a, k)
        assert k.get("base", a[3] if len(a) > 3 else None) == readout.THETA, (a, k)
