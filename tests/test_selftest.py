"""``sglang-swa-plugin selftest`` on a CPU: what it does before and after the GPU.

- the targets: the float32 tokens the GPU harness computed (pinned, from the code before it
  moved into the package), bf16 equal to float32, a window or chunk changed by one changes the
  tokens, a window-blind target fails the check; the checkpoints the servers load hold the
  reference's weights;
- the rows for a GPU capability on the installed sglang, with its own argument parser reading
  every row's arguments, and sglang's own refusal of a row told apart from other failures (one
  child process that imports sglang's ServerArgs);
- the judging and the matrix on recorded outputs, and the exit status of the whole command
  with a runner of ours in place of the servers (sglang is not faked: a row is a result dict):
  a speculative row below its expected accept length, a needed fix not applied, a required row
  not run, a prefix row's second requests, each fails the command where it must (the judging's
  rules one by one on crafted logs: tests/test_judging.py).
"""

from __future__ import annotations

import argparse
import json
import os

import pytest

from helpers import child_json, has_module, run_child
from sglang_swa_plugin import cli
from sglang_swa_plugin.selftest import command, judging, rows, server, targets
from sglang_swa_plugin.selftest.targets import readout

# Short requests: 4 prompts of 60 tokens (longer than the window 16 and the chunk 32), 12 new tokens.
SHORT = command.Protocol(requests=4, prompt_len=60, new_tokens=12, check_requests=4)
# The command's tests: 2 requests of 60 tokens, 12 new tokens.
TINY = command.Protocol(requests=2, prompt_len=60, new_tokens=12, check_requests=2)
H100 = rows.Gpu("NVIDIA H100 80GB HBM3", (9, 0))


def _target(name: str):
    t = targets.load(name)
    why_not = targets.unavailable(t)
    if why_not:  # Gemma 4 on sglang 0.5.10 (neither sglang nor its transformers have it)
        pytest.skip(why_not)
    return t


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """One torch thread for this file's tests (conftest's one_torch_thread)."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every available target saved as the selftest saves it: {name: (target dir, draft dir)}."""
    root = str(tmp_path_factory.mktemp("targets"))
    return {name: targets.load(name).save(root) for name in targets.NAMES
            if not targets.unavailable(targets.load(name))}


# -- the targets -------------------------------------------------------------------------


@pytest.mark.targets  # transformers' models on the CPU: on noxfile.TARGET_VERSIONS only
@pytest.mark.parametrize("name", targets.NAMES)
def test_a_target_gives_the_pinned_tokens_in_bf16_too_and_sees_its_window(name):
    t = _target(name)
    assert command.reference(t, [1], SHORT._replace(requests=2)) == t.PINNED
    chk = command.target_check(t, SHORT, 1)
    assert chk["ok"] and chk["problems"] == [] and chk["bf16_equal"] == 4, chk
    assert chk["min_margin"] >= readout.MARGIN_FLOOR, chk
    assert 2 * chk["slot_changed"] > 4 and 2 * chk["full_changed"] > 4, chk
    assert chk["changed"] == {t.SIZE - 1: 4, t.SIZE + 1: 4}, chk


@pytest.mark.targets
def test_a_window_blind_target_fails_its_check():
    """A target whose reference ignores the chunk it is asked for (every size the same model)."""
    t = _target("llama4")
    blind = argparse.Namespace(hf_model=lambda size, dtype=None: t.hf_model(t.SIZE, dtype), SIZE=t.SIZE, LABEL=t.LABEL)
    chk = command.target_check(blind, TINY, 1)
    assert chk["changed"] == {t.SIZE - 1: 0, t.SIZE + 1: 0} and not chk["ok"], chk
    assert [p for p in chk["problems"] if "changes only 0/2" in p], chk


@pytest.mark.targets
def test_targets_saved_into_one_root_keep_their_own_directories(saved):
    """The selftest saves every target into one root: a draft another target overwrites there
    serves, and accepts next to nothing (GPT-OSS with Llama 4's EAGLE3 draft, on the GPU)."""
    owners = {}
    for name, pair in saved.items():
        for path in {p for p in pair if p is not None}:
            owners.setdefault(path, []).append(name)
    assert len(saved) >= 2 and all(len(names) == 1 for names in owners.values()), owners


@pytest.mark.targets
@pytest.mark.parametrize("name", targets.NAMES)
def test_a_saved_target_holds_the_weights_of_its_reference(name, saved):
    """What a server loads is what the float32 reference computes with (bf16-rounded), and the
    config carries the model class sglang serves, the size that decides the tokens and, where
    the target has one, the EAGLE3 draft."""
    from safetensors.torch import load_file

    t = _target(name)
    target, draft = saved[name]
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == [t.ARCHITECTURE]
    text = cfg.get("text_config", cfg)
    size = text.get("attention_chunk_size") if t.LABEL == "chunk" else text.get("sliding_window", text.get("sliding_window_size"))
    assert size == t.SIZE
    kind = targets.draft_kind(t)
    assert (draft is not None) == (kind is not None)
    if kind == "eagle3":
        with open(os.path.join(draft, "config.json")) as f:
            assert json.load(f)["architectures"] == ["LlamaForCausalLMEagle3"]
    elif kind == "mtp":  # the MTP layers: in the target's own checkpoint (MiMo-V2) or in one of their own (Step3.5)
        with open(os.path.join(draft, "config.json")) as f:
            assert json.load(f)["architectures"] == [t.ARCHITECTURE] and cfg["num_nextn_predict_layers"] >= 1
    served = {k.removeprefix("language_model."): v.float() for k, v in load_file(os.path.join(target, "model.safetensors")).items()
              if not k.startswith("model.mtp.")}
    ref = t.hf_model().state_dict()
    shared = set(served) & set(ref)
    assert len(shared) >= 0.9 * len(served), sorted(set(served) - shared)
    assert all(served[k].equal(ref[k]) for k in shared), [k for k in shared if not served[k].equal(ref[k])]


def test_availability_is_read_from_the_installed_sglang():
    assert targets.sglang_serves("GptOssForCausalLM") and targets.sglang_serves("Llama4ForConditionalGeneration")
    assert not targets.sglang_serves("NoSuchModelForCausalLM")
    assert targets.sglang_serves("Gemma4ForCausalLM") == has_module("sglang.srt.models.gemma4_causal")
    if not has_module("sglang.srt.models.gemma4_causal"):
        assert "Gemma4ForCausalLM" in targets.unavailable(targets.load("gemma4"))


# -- rows and sglang's own argument handling (one child process) ----------------------------

SGLANG_CHILD = """
import argparse, json, sys, traceback
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang_swa_plugin.selftest import rows, server

opts = rows.sglang_options()
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
paths = {"gptoss": (TARGET, DRAFT), "gemma4": (TARGET, None), "mimo_v2": (TARGET, TARGET, "mtp", ("--trust-remote-code",))}
parsed = {}
for cap in ((9, 0), (10, 0)):
    for p in rows.plan(paths, rows.BACKENDS, cap, opts, stock=True, graphs_off=True, small_pool=True):
        if p.args is not None:
            a = parser.parse_args(p.args)  # exits on an option this sglang does not have
            parsed[f"{cap[0]}:{p.row.key}"] = [a.attention_backend, a.decode_attention_backend,
                                                a.prefill_attention_backend, a.speculative_eagle_topk,
                                                a.speculative_algorithm, a.max_total_tokens, a.trust_remote_code]

def raised(argv):
    try:
        args = prepare_server_args(argv)
        getattr(args, "resolve_once", lambda: None)()  # 0.5.23 resolves (and checks) in the server
    except BaseException:
        return traceback.format_exc()
    return None

refused = raised(["--model-path", TARGET, "--device", "cpu", "--attention-backend", "flashinfer"])
no_gpu = raised(["--model-path", TARGET, "--attention-backend", "triton"])
print("RESULT=" + json.dumps({
    "flags": sorted(opts.flags), "backends": list(opts.backends), "parsed": parsed,
    "refused": refused, "refusal": refused and server.refusal(refused),
    "no_gpu": no_gpu, "no_gpu_refusal": no_gpu and server.refusal(no_gpu),
}))
"""


@pytest.fixture(scope="module")
def sglang_side(saved):
    target, draft = saved["gptoss"]
    code = SGLANG_CHILD.replace("TARGET", repr(target)).replace("DRAFT", repr(draft))
    return child_json(run_child(code, prelude=False))


def _options(sglang_side) -> rows.SglangOptions:
    return rows.SglangOptions(frozenset(sglang_side["flags"]), tuple(sglang_side["backends"]))


@pytest.mark.cli  # a child process importing sglang's ServerArgs (11-17 s): on the CLI releases only
def test_sglang_options_come_from_its_parser(sglang_side):
    opts = _options(sglang_side)
    assert set(rows.BACKENDS) <= set(opts.backends)
    assert "--model-path" in opts.flags and "--nosuchflag" not in opts.flags
    base = rows.exact_base("/t", flags=opts.flags)
    renamed = "--disable-piecewise-cuda-graph" if "--disable-piecewise-cuda-graph" in opts.flags else "--disable-prefill-cuda-graph"
    assert renamed in base and all(a in opts.flags for a in base if a.startswith("--")), base


@pytest.mark.cli  # a child process importing sglang's ServerArgs (11-17 s): on the CLI releases only
def test_every_planned_row_is_read_by_sglangs_own_parser(sglang_side):
    parsed = sglang_side["parsed"]
    assert parsed["9:gptoss/fa3/k2/plugin"] == ["fa3", None, None, 2, "EAGLE3", 16384, False]
    assert parsed["9:gptoss/trtllm_mha/plain/eager/small/stock"] == [None, "trtllm_mha", "fa3", None, None, 4096, False]
    assert parsed["10:gptoss/trtllm_mha/k1/plugin"] == ["trtllm_mha", None, None, 1, "EAGLE3", 16384, False]
    assert parsed["9:mimo_v2/triton/mtp/eager/small/plugin"] == ["triton", None, None, 1, "EAGLE", 4096, True]
    assert parsed["9:mimo_v2/fa3/nextn/plugin"] == ["fa3", None, None, 1, "NEXTN", 16384, True]
    assert "10:gptoss/fa3/plain/plugin" not in parsed  # fa3: Hopper only
    assert not [k for k in parsed if k.split(":")[1].startswith("gemma4/") and "/plain/" not in k]  # no draft
    assert not [k for k in parsed if "gptoss/" in k and ("/mtp/" in k or "/nextn/" in k)]  # no MTP layers
    assert not [k for k in parsed if "mimo_v2/" in k and ("/k1/" in k or "/k2/" in k)]  # no EAGLE3 draft
    assert parsed["9:mimo_v2/fa3/nextn_k2/plugin"] == ["fa3", None, None, 2, "NEXTN", 16384, True]
    # (gptoss: 4 backends x 3 modes, gemma4: 4 backends, mimo_v2: 4 x 4) x plugin/stock x graphs on/off
    # x large/small pool; sm100 without fa3
    assert len(parsed) == (12 + 4 + 16) * 8 + (12 + 4 + 16 - 8) * 8


@pytest.mark.cli  # a child process importing sglang's ServerArgs (11-17 s): on the CLI releases only
def test_a_refusal_of_sglangs_argument_handling_is_told_apart(sglang_side):
    """GPT-OSS on flashinfer: sglang's own assertion (ServerArgs, or its argument groups on
    0.5.23) is a refusal, with its line; a failure elsewhere in sglang (no GPU) is not."""
    assert sglang_side["refused"], "this sglang accepted GPT-OSS on flashinfer"
    assert sglang_side["refusal"].startswith("AssertionError: GptOssForCausalLM requires one of"), sglang_side["refusal"]
    if sglang_side["no_gpu"]:
        assert sglang_side["no_gpu_refusal"] is None, sglang_side["no_gpu"][-800:]


@pytest.mark.cli  # a child process importing sglang's ServerArgs (11-17 s): on the CLI releases only
def test_a_failure_outside_sglangs_argument_handling_is_not_a_refusal():
    log = ("[2026-01-01 TP0] sglang-swa-plugin: fix trtllm_swa_pool applied\n"
           "Traceback (most recent call last):\n"
           '  File "/x/sglang/srt/managers/scheduler.py", line 10, in run\n'
           '  File "/x/sglang/srt/model_executor/model_runner.py", line 20, in init\n'
           "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert server.refusal(log) is None
    refused = log.replace("/x/sglang/srt/model_executor/model_runner.py", "/x/sglang/srt/arg_groups/model_hook.py")
    assert server.refusal(refused) == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_rows_for_a_gpu_capability():
    opts = rows.SglangOptions(frozenset(["--disable-piecewise-cuda-graph", "--cuda-graph-max-bs", "--disable-cuda-graph",
                                         "--decode-attention-backend", "--prefill-attention-backend"]), rows.BACKENDS)
    paths = {"gptoss": ("/t", "/d"), "gemma4": ("/g", None), "llama4": "target not available: no Llama 4 here"}

    def why(cap, key, **kw):
        return {p.row.key: p.why_not for p in rows.plan(paths, rows.BACKENDS, cap, opts, **kw)}[key]

    assert why((9, 0), "gptoss/fa3/k1/plugin") is None and why((9, 0), "gptoss/trtllm_mha/plain/plugin") is None
    assert "Hopper" in why((8, 0), "gptoss/fa3/plain/plugin") and "sm90" in why((8, 0), "gptoss/trtllm_mha/plain/plugin")
    assert why((8, 0), "gptoss/flashinfer/k2/plugin") is None and why((12, 0), "gemma4/triton/plain/plugin") is None
    assert why(None, "gemma4/triton/plain/plugin") == "no CUDA GPU"
    assert "no flashinfer" in {p.row.key: p.why_not for p in rows.plan(
        paths, rows.BACKENDS, (9, 0), opts._replace(backends=("fa3", "triton")))}["gptoss/flashinfer/plain/plugin"]
    keys = [p.row.key for p in rows.plan(paths, ["fa3"], (9, 0), opts, stock=True, graphs_off=True)]
    assert keys[:4] == ["gptoss/fa3/plain/plugin", "gptoss/fa3/plain/stock", "gptoss/fa3/plain/eager/plugin",
                        "gptoss/fa3/plain/eager/stock"]
    assert len(keys) == 3 * 4 + 4 and "gemma4/fa3/k1/plugin" not in keys and not [k for k in keys if "llama4" in k]
    only = [p.row.key for p in rows.plan(paths, rows.BACKENDS, (9, 0), opts, patterns=["gptoss/*/k1/*", "gemma4/triton/*"])]
    assert only == ["gptoss/fa3/k1/plugin", "gptoss/flashinfer/k1/plugin", "gptoss/triton/k1/plugin",
                    "gptoss/trtllm_mha/k1/plugin", "gemma4/triton/plain/plugin"]
    # a pattern that names a stock, eager or small row plans it without the flag that plans them all
    named = [p.row.key for p in rows.plan(paths, rows.BACKENDS, (9, 0), opts, small_pool=False,
                                          patterns=["gptoss/fa3/k1/eager/stock", "gemma4/triton/plain/small/*", "gptoss/fa3/k1/*"])]
    assert named == ["gptoss/fa3/k1/plugin", "gptoss/fa3/k1/eager/stock", "gemma4/triton/plain/small/plugin"], named
    eager = {p.row.key: p.args for p in rows.plan(paths, ["triton"], (9, 0), opts, graphs_off=True)}
    assert eager["gemma4/triton/plain/eager/plugin"][-1] == "--disable-cuda-graph"
    assert "--disable-cuda-graph" not in eager["gemma4/triton/plain/plugin"]
    # MTP layers in the target's checkpoint: multi-layer EAGLE and NEXTN rows, no EAGLE3 rows; small pools
    mtp = {p.row.key: p.args for p in rows.plan({"mimo_v2": rows.Saved("/m", "/m", "mtp", ("--trust-remote-code",))},
                                                ["triton"], (9, 0), opts, small_pool=True)}
    assert list(mtp) == ["mimo_v2/triton/plain/plugin", "mimo_v2/triton/plain/small/plugin", "mimo_v2/triton/mtp/plugin",
                         "mimo_v2/triton/mtp/small/plugin", "mimo_v2/triton/nextn/plugin", "mimo_v2/triton/nextn/small/plugin",
                         "mimo_v2/triton/nextn_k2/plugin", "mimo_v2/triton/nextn_k2/small/plugin"]
    small = mtp["mimo_v2/triton/mtp/small/plugin"]
    assert small[small.index("--max-total-tokens") + 1] == "4096" and "--trust-remote-code" in small
    assert small[small.index("--speculative-algorithm") + 1] == "EAGLE"
    assert small[small.index("--speculative-draft-model-path") + 1] == "/m"
    nextn = mtp["mimo_v2/triton/nextn/plugin"]
    assert nextn[nextn.index("--speculative-algorithm") + 1] == "NEXTN" and nextn[nextn.index("--max-total-tokens") + 1] == "16384"
    tree = mtp["mimo_v2/triton/nextn_k2/plugin"]  # NEXTN's tree of drafts
    assert tree[tree.index("--speculative-algorithm") + 1] == "NEXTN" and tree[tree.index("--speculative-eagle-topk") + 1] == "2"
    # a target's server arguments for one backend (Llama 4's chunk of 32: trtllm_mha pages of 32)
    from sglang_swa_plugin.selftest.targets import llama4

    saved = rows.Saved("/l", "/d", "eagle3", (), tuple(llama4.BACKEND_SERVER_ARGS.items()))
    l4 = {p.row.key: p.args for p in rows.plan({"llama4": saved}, ["fa3", "trtllm_mha"], (9, 0), opts)}
    pages = {k: a[a.index("--page-size") + 1] if "--page-size" in a else None for k, a in l4.items()}
    assert pages == {"llama4/fa3/plain/plugin": None, "llama4/fa3/k1/plugin": None, "llama4/fa3/k2/plugin": None,
                     "llama4/trtllm_mha/plain/plugin": "32", "llama4/trtllm_mha/k1/plugin": "32",
                     "llama4/trtllm_mha/k2/plugin": "32"}, pages
    assert llama4.CHUNK % int(pages["llama4/trtllm_mha/plain/plugin"]) == 0


def test_a_target_runs_only_its_own_modes():
    """Step3.5's MTP layers: plain and multi-layer EAGLE rows, no NEXTN ones (sglang's NEXTN path
    cannot load Step3.5); MiMo-V2, with no mode list of its own, runs every MTP mode."""
    from sglang_swa_plugin.selftest.targets import mimo_v2, step3p5

    opts = rows.SglangOptions(frozenset(["--disable-piecewise-cuda-graph", "--cuda-graph-max-bs"]), rows.BACKENDS)
    saved = {"step3p5": rows.saved_target(step3p5, "/s", "/d"), "mimo_v2": rows.saved_target(mimo_v2, "/m", "/m")}
    keys = [p.row.key for p in rows.plan(saved, ["triton"], (9, 0), opts)]
    assert keys == ["step3p5/triton/plain/plugin", "step3p5/triton/mtp/plugin", "mimo_v2/triton/plain/plugin",
                    "mimo_v2/triton/mtp/plugin", "mimo_v2/triton/nextn/plugin", "mimo_v2/triton/nextn_k2/plugin"]
    assert saved["mimo_v2"].server_args == ("--trust-remote-code",) and saved["step3p5"].draft_kind == "mtp"


# -- judging, the matrix and the exit status -------------------------------------------------

REF = [[1, 2, 3, 4, 5, 6]] * 4 + [[7, 8, 9, 10, 11, 12]] * 4  # two seeds of 4 requests


# The plugin's status line of one fix as sglang's log shows it (core.log_record behind sglang's prefix).
APPLIED_X = "[2026-01-01 12:00:00] sglang-swa-plugin: fix x: applied (needed here)"


def _served(outputs, accept=None, plugin_log=(APPLIED_X,)):
    return {"state": "served", "outputs": outputs, "accept_length": accept, "plugin_log": list(plugin_log)}


def test_judging_recorded_outputs():
    wrong = [list(o) for o in REF]
    wrong[1][0], wrong[6][2] = 99, 99  # seed 1: one request at token 0; seed 2: one at token 2
    judged = judging.judge(_served(wrong, 2.4), REF, 4)
    assert [(c["identical"], c["of"]) for c in judged["per_seed"]] == [(3, 4), (3, 4)]
    assert judged["per_seed"][0]["bands"] == {"identical": 3, "0-3": 1, "4-15": 0, "16-31": 0, "32+": 0}
    assert judging.verdict(judged, plugin=True) == ("WRONG TOKENS (first divergence at token 0-3: 2)", True)
    assert judging.verdict(judged, plugin=False) == ("other tokens (first divergence at token 0-3: 2)", False)
    exact = judging.judge(_served([list(o) for o in REF]), REF, 4)
    assert judging.verdict(exact, True, plugin_loaded=True) == ("OK", False)
    assert judging.verdict(exact, True, plugin_loaded=False)[1]
    # a row without output is never judged as output, whatever it holds
    for state in ("did not start", "crashed while serving"):
        row = {"state": state, "error": "RuntimeError: boom", "outputs": [list(o) for o in REF]}
        assert judging.judge(row, REF, 4) == {"state": state, "error": "RuntimeError: boom"}
        assert judging.verdict(judging.judge(row, REF, 4), True) == (f"{state.upper()}: RuntimeError: boom", True)
    refused = {"state": judging.REFUSED, "error": "AssertionError: no"}
    assert judging.verdict(judging.judge(refused, REF, 4), True) == ("refused by sglang: AssertionError: no", False)


def _args(*argv: str) -> argparse.Namespace:
    return cli._parser().parse_args(["selftest", *argv])


def test_the_command_line():
    a = _args("--targets", "gptoss,mimo_v2", "--backends", "triton", "--seeds", "5,6", "--parallel", "3",
              "--mem-fraction", "0.6", "--stock", "--graphs-off", "--small-pool", "--rows", "gptoss/*,mimo_v2/*/plain/*",
              "--json")
    assert (a.cmd, a.targets, a.backends, a.seeds, a.parallel, a.mem_fraction, a.stock, a.graphs_off, a.small_pool,
            a.rows, a.json) == ("selftest", ["gptoss", "mimo_v2"], ["triton"], [5, 6], 3, 0.6, True, True, True,
                                ["gptoss/*", "mimo_v2/*/plain/*"], True)
    d = _args()
    assert (d.targets, d.backends, d.seeds, d.stock, d.graphs_off, d.small_pool, d.rows, d.out) == (
        list(targets.NAMES), list(rows.BACKENDS), [1, 2, 3], False, False, False, [], None)
    new = _args("--chunked-prefill", "--prefix", "--page-sizes", "--decode-verify", "--deterministic", "--tp", "2",
                "--dp-attention", "--require", "default,llama4/*/k1/*")
    assert (new.tp, new.dp_attention, new.require, command.variants(new)) == (
        2, True, ["default", "llama4/*/k1/*"], list(rows.VARIANTS))
    assert command.variants(_args("--every-path")) == list(rows.VARIANTS)
    assert (d.tp, d.dp_attention, d.require, command.variants(d)) == (1, False, None, [])
    for bad in (["--targets", "mixtral"], ["--backends", "fa3,nope"], ["--seeds", "a"], ["--parallel", "0"], ["--tp", "0"]):
        with pytest.raises(SystemExit):
            _args(*bad)


class Runner:
    """A runner of ours in place of real servers: each row's result by its name (plugin rows
    served with the reference's tokens unless ``results`` says otherwise)."""

    def __init__(self, reference: list, results: dict = None):
        self.reference, self.results, self.calls = reference, results or {}, []

    def __call__(self, name, out, args, env, reqs, new_tokens, start_timeout, repeats=1):
        self.calls.append((name, env))
        assert len(reqs) == len(self.reference) and new_tokens == len(self.reference[0])
        made = self.results.get(name)
        if made is not None:
            return made(self.reference) if callable(made) else made
        return _served([list(o) for o in self.reference] * repeats, 2.5,
                       plugin_log=() if name.endswith("_stock") else (APPLIED_X,))


# The command's tests below: its rows judged, with fake servers and the GPU, sglang's options and
# doctor's report given: the same on every release (noxfile.COMMAND_LINE_VERSIONS). What the installed
# release adds is whether sglang serves Llama 4 (test_availability_is_read_from_the_installed_sglang,
# every release) and the float32 reference's transformers (the targets' tests above: TARGET_VERSIONS).
JUDGING_ONLY = pytest.mark.release_independent


@pytest.fixture(scope="module")
def llama4_ref():
    """The float32 tokens of the target the command tests run (Llama 4: the cheapest on a CPU)."""
    return command.reference(targets.load("llama4"), [1], TINY)


def _selftest(tmp_path, runner, *argv, expect=2.4, needed=("x",), gpu=H100, flags=()):
    """The command on Llama 4 with ``runner`` for the servers; ``expect``: every speculative
    row's expected accept length (a number, or a function as acceptance.expected_accept);
    ``needed``: the fixes doctor finds needed (None: doctor gave no report)."""
    args = _args("--targets", "llama4", "--seeds", "1", "--out", str(tmp_path), *argv)
    opts = rows.SglangOptions(frozenset(["--disable-piecewise-cuda-graph", "--cuda-graph-max-bs", "--disable-cuda-graph",
                                         "--decode-attention-backend", "--prefill-attention-backend", *flags]),
                              rows.BACKENDS)
    doctor = {"needed": list(needed), "problems": []} if needed is not None else {"error": "no report"}
    return command.main(args, runner=runner, gpu=lambda: gpu, options=lambda: opts, protocol=TINY, threads=1,
                        expect=expect if callable(expect) else lambda *a, **k: expect, needed=lambda: doctor,
                        packages=("sglang_swa_plugin",))


@JUDGING_ONLY
def test_the_selftest_passes_when_every_plugin_row_is_exact(tmp_path, llama4_ref, capsys):
    refused = {"state": judging.REFUSED, "error": "AssertionError: Llama4 does not support flashinfer"}
    wrong_stock = lambda ref: _served([[0] + o[1:] for o in ref], 1.0, plugin_log=())
    runner = Runner(llama4_ref, {f"llama4_flashinfer_{m}_{s}": refused for m in ("plain", "k1", "k2") for s in ("plugin", "stock")}
                    | {"llama4_triton_plain_stock": wrong_stock})
    assert _selftest(tmp_path, runner, "--stock") == 0
    out = capsys.readouterr().out
    assert len(runner.calls) == 4 * 3 * 2
    assert {env["SGLANG_PLUGINS"] for name, env in runner.calls if name.endswith("_plugin")} == {"swa_plugin"}
    assert all(env == server.OFF for name, env in runner.calls if name.endswith("_stock"))
    lines = out.splitlines()
    checks = next(i for i, l in enumerate(lines) if l.startswith("  llama4 "))
    assert "bf16 = float32 2/2" in lines[checks] and "chunk 31 changes 2/2" in lines[checks]
    assert checks < min(i for i, l in enumerate(lines) if l.startswith("  [")), out  # checks before the servers' lines
    row = next(l for l in lines if l.startswith("llama4/fa3/k1/plugin"))
    assert row.split()[1:6] == ["2/2", "2.5", "2.4", "1/1", "OK"], row  # tokens, accept, expected, fixes applied/needed
    assert "other tokens (first divergence at token 0-3: 2)" in next(l for l in lines if l.startswith("llama4/triton/plain/stock"))
    assert "refused by sglang: AssertionError" in next(l for l in lines if l.startswith("llama4/flashinfer/k1/plugin"))
    assert lines[-1].startswith("OK: 9 plugin row(s)") and "6 refused by sglang" in lines[-1], lines[-1]


@JUDGING_ONLY
def test_the_selftest_fails_on_each_bad_plugin_row(tmp_path, llama4_ref, capsys):
    bad = {"llama4/fa3/k2/plugin": (lambda ref: _served([o[:-1] + [0] for o in ref], 2.0),
                                    "WRONG TOKENS (first divergence at token 4-15: 2)"),
           "llama4/triton/plain/plugin": ({"state": "did not start", "error": "ValueError: no"},
                                          "DID NOT START: ValueError: no"),
           "llama4/trtllm_mha/k1/plugin": ({"state": "crashed while serving", "error": "CUDA error"},
                                           "CRASHED WHILE SERVING: CUDA error"),
           "llama4/fa3/plain/plugin": (lambda ref: _served([list(o) for o in ref], plugin_log=()),
                                       "PLUGIN NOT LOADED")}
    runner = Runner(llama4_ref, {k.replace("/", "_"): result for k, (result, _) in bad.items()})
    assert _selftest(tmp_path, runner, "--json") == 1
    report = json.loads(capsys.readouterr().out)
    failed = {k: e["result"] for k, e in report["rows"].items() if e["failed"]}
    assert sorted(failed) == sorted(bad) and all(failed[k].startswith(why) for k, (_, why) in bad.items()), failed
    assert report["problems"] == ["4 row(s) failed (1 wrong tokens, 1 plugin not loaded, 1 did not start, "
                                  "1 crashed while serving)"]
    assert report["rows"]["llama4/fa3/k1/plugin"]["result"] == "OK"


@JUDGING_ONLY
def test_the_selftest_fails_when_nothing_was_served(tmp_path, llama4_ref, capsys):
    refused = {"state": judging.REFUSED, "error": "AssertionError: no"}
    everything_refused = Runner(llama4_ref, {f"llama4_{b}_{m}_plugin": refused for b in rows.BACKENDS for m in rows.MODES})
    assert _selftest(tmp_path, everything_refused) == 1
    assert "PROBLEM: no plugin row served" in capsys.readouterr().out
    args = _args("--targets", "llama4", "--out", str(tmp_path))
    assert command.main(args, runner=Runner(llama4_ref), gpu=lambda: None, protocol=TINY, threads=1) == 1
    assert "PROBLEM: no CUDA GPU" in capsys.readouterr().out


# A scheduler's failure as sglang logs it: the traceback after its own prefix, the frames, the exception.
SINKS_LOG = """[2026-01-01 12:00:00] Scheduler hit an exception: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3000, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)
  File "/venv/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", line 400, in forward
    return self.attn_backend.forward_decode(q, k, v, layer, forward_batch, sinks=sinks)
TypeError: FlashInferAttnBackend.forward_decode() got an unexpected keyword argument 'sinks'
"""


@JUDGING_ONLY
def test_a_plugin_row_that_stops_as_stock_does_is_sglangs_own_failure(tmp_path, llama4_ref, capsys):
    """A plugin row that did not start or crashed gets its stock twin run after the matrix;
    the same state and the same exception at the same sglang frame without the plugin, with no
    frame of the plugin in the traceback, is sglang's failure (no failure of the plugin),
    anything else stays the plugin row's failure."""
    boom = {"state": "did not start", "error": "TypeError: forward_decode() got an unexpected keyword argument 'sinks'",
            "tracebacks": server.tracebacks(SINKS_LOG)}
    ima = {"state": "crashed while serving", "error": "CUDA error: an illegal memory access was encountered",
           "tracebacks": server.tracebacks(SINKS_LOG.replace("TypeError: FlashInferAttnBackend.forward_decode() got an "
                                                             "unexpected keyword argument 'sinks'",
                                                             "torch.AcceleratorError: CUDA error: an illegal memory access"))}
    runner = Runner(llama4_ref, {"llama4_triton_plain_plugin": boom, "llama4_triton_plain_stock": {**boom, "plugin_log": []},
                                 "llama4_fa3_k1_plugin": ima})  # fa3 k1 stock: served (the runner's default)
    assert _selftest(tmp_path, runner, "--backends", "fa3,triton", "--json") == 1
    report = json.loads(capsys.readouterr().out)
    rows_ = report["rows"]
    assert sorted(n for n, _ in runner.calls if n.endswith("_stock")) == ["llama4_fa3_k1_stock", "llama4_triton_plain_stock"]
    assert rows_["llama4/triton/plain/plugin"]["result"].startswith("did not start without the plugin too")
    assert not rows_["llama4/triton/plain/plugin"]["failed"]
    assert rows_["llama4/fa3/k1/plugin"]["failed"] and rows_["llama4/fa3/k1/plugin"]["result"].startswith("CRASHED")
    assert rows_["llama4/fa3/k1/stock"]["result"] == "exact"
    assert report["problems"] == ["1 row(s) failed (1 crashed while serving)"]
    assert report["counts"]["excused (sglang's own failure)"] == 1


_CPU_SIDE: dict = {}  # (function, target, arguments) -> its result, for the tests below


@pytest.fixture
def cpu_side_once(monkeypatch):
    """The target's models and float32 reference computed once for the tests that follow (each
    runs the whole command; what they test is the judging of the rows), and its checks taken
    as passed: they are tests/test_targets.py's subject (the tests above run them through the
    command)."""
    for name in ("_models", "reference"):
        real = getattr(command, name)

        def once(t, *args, _real=real, _name=name):
            key = (_name, t.__name__, repr(args[:2]))
            if key not in _CPU_SIDE:
                _CPU_SIDE[key] = _real(t, *args)
            return _CPU_SIDE[key]

        monkeypatch.setattr(command, name, once)
    monkeypatch.setattr(command, "target_check", lambda t, protocol, seed, hf_model=None: {
        "of": protocol.check_requests, "bf16_equal": protocol.check_requests, "min_margin": 1.0, "changed": {},
        "problems": [], "ok": True})


@JUDGING_ONLY
def test_a_speculative_row_below_its_expected_acceptance_fails(tmp_path, llama4_ref, capsys, cpu_side_once):
    """The tokens are all right; the accept length is not: a draft that reads the wrong keys.
    The expectation is asked once per target and mode, with every seed's prompts and the
    float32 outputs."""
    asked = []

    def expect(t, spec, prompts, new_tokens, ref, **kw):
        asked.append((t.__name__.rsplit(".", 1)[1], spec, len(prompts), new_tokens, ref))
        return {1: 3.9, 2: None}[spec.topk]

    runner = Runner(llama4_ref, {"llama4_fa3_k1_plugin": lambda ref: _served([list(o) for o in ref], None)})
    assert _selftest(tmp_path, runner, "--json", "--backends", "fa3,triton", expect=expect) == 1
    report = json.loads(capsys.readouterr().out)
    assert sorted((a[0], a[1].topk, a[2], a[3]) for a in asked) == [("llama4", 1, 2, 12), ("llama4", 2, 2, 12)]
    assert all(a[4] == llama4_ref for a in asked)
    result = {k: (e["result"], e["failed"]) for k, e in report["rows"].items()}
    tolerance = judging.ACCEPT_TOLERANCE
    assert result["llama4/triton/k1/plugin"] == (f"LOW ACCEPT (server 2.50 < expected 3.90 - {tolerance:.2f})", True)
    assert result["llama4/fa3/k1/plugin"] == ("NO SPECULATION: the responses count no verify step", True)
    assert result["llama4/fa3/k2/plugin"][0].startswith("NO EXPECTED ACCEPT") and result["llama4/fa3/k2/plugin"][1]
    assert result["llama4/fa3/plain/plugin"] == ("OK", False)
    assert report["rows"]["llama4/triton/k1/plugin"]["expected_accept"] == 3.9
    assert report["problems"] == ["4 row(s) failed (1 low accept, 1 no speculation, 2 no expected accept)"]
    assert report["counts"] == {judging.OK: 2, judging.LOW_ACCEPT: 1, judging.NO_SPECULATION: 1, judging.NO_EXPECTED: 2}


@JUDGING_ONLY
def test_a_row_without_a_needed_fix_fails(tmp_path, llama4_ref, capsys, cpu_side_once):
    partly = Runner(llama4_ref, {"llama4_fa3_plain_plugin": lambda ref: _served(
        [list(o) for o in ref], plugin_log=(APPLIED_X, "[2026-01-01 12:00:00] sglang-swa-plugin: fix y: skipped (moved)"))})
    assert _selftest(tmp_path, partly, "--backends", "fa3", needed=("x", "y")) == 1
    out = capsys.readouterr().out
    assert "fixes doctor finds needed here (2): x, y" in out
    line = next(l for l in out.splitlines() if l.startswith("llama4/fa3/plain/plugin"))
    assert line.split()[4:] == ["1/2", "FIX", "NOT", "APPLIED:", "y", "(skipped)"], line
    assert "FIX NOT APPLIED: y (no line)" in next(l for l in out.splitlines() if l.startswith("llama4/fa3/k1/plugin"))
    # doctor gave no report: a problem of its own, the rows still judged
    assert _selftest(tmp_path, Runner(llama4_ref), "--backends", "fa3", needed=None) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: which fixes are needed here is not known: no report" in out and "row(s) failed" not in out


@JUDGING_ONLY
def test_a_required_row_that_did_not_run_fails(tmp_path, llama4_ref, capsys, cpu_side_once):
    """By default every row of each backend this GPU runs is required: on a sglang without
    Hopper's trtllm_mha decode flags, its rows are not run, and that fails; --require names
    rows (a pattern no row matches fails), 'none' turns it off."""
    no_decode = ("--decode-attention-backend",)
    runner = Runner(llama4_ref)
    args = ["--backends", "fa3,trtllm_mha", "--json"]
    opts = rows.SglangOptions(frozenset(["--disable-piecewise-cuda-graph", "--cuda-graph-max-bs", "--disable-cuda-graph",
                                         "--prefill-attention-backend"]), rows.BACKENDS)
    assert command.main(_args("--targets", "llama4", "--seeds", "1", "--out", str(tmp_path), *args), runner=runner,
                        gpu=lambda: H100, options=lambda: opts, protocol=TINY, threads=1, expect=lambda *a, **k: 2.4,
                        needed=lambda: {"needed": ["x"], "problems": []}, packages=()) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["required"]["patterns"] == ["llama4/fa3/*", "llama4/trtllm_mha/*"]
    assert report["required"]["not_run"] == [f"llama4/trtllm_mha/{m}/plugin" for m in ("plain", "k1", "k2")]
    assert report["problems"][0] == f"required row not run: llama4/trtllm_mha/plain/plugin (this sglang has no {no_decode[0]})"
    assert report["counts"]["missing required"] == 3 and report["counts"][judging.NOT_RUN] == 3
    assert _selftest(tmp_path, runner, "--backends", "fa3", "--require", "llama4/fa3/*/eager/*") == 1
    assert "PROBLEM: required, no such row: llama4/fa3/*/eager/*" in capsys.readouterr().out
    assert _selftest(tmp_path, runner, "--backends", "fa3", "--graphs-off", "--require", "llama4/fa3/*/eager/*") == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("OK: 6 plugin row(s) gave the model's tokens on every request, speculative ones at the expected "
                    "acceptance"), last


@JUDGING_ONLY
def test_the_prefix_rows_send_every_request_twice(tmp_path, llama4_ref, capsys, cpu_side_once):
    def second_time_wrong(ref):
        res = _served([list(o) for o in ref] + [[0] + o[1:] for o in ref], 2.5)
        return {**res, "cached_tokens": [0, 118]}

    runner = Runner(llama4_ref, {"llama4_fa3_plain_prefix_plugin": second_time_wrong})
    assert _selftest(tmp_path, runner, "--json", "--backends", "fa3", "--prefix", "--rows", "llama4/fa3/plain/*") == 1
    report = json.loads(capsys.readouterr().out)
    row = report["rows"]["llama4/fa3/plain/prefix/plugin"]
    assert row["per_seed"][0]["identical"] == 2 and row["per_seed"][0]["of"] == 4, row
    assert row["result"].startswith("WRONG TOKENS") and report["rows"]["llama4/fa3/plain/plugin"]["result"] == "OK"


@pytest.mark.cli  # doctor in a child process importing sglang (10-20 s): on the CLI releases only
def test_the_fixes_a_row_must_apply_are_those_doctor_finds_needed(monkeypatch):
    """doctor, as a server with the plugin allowed would load it, in a child process: the fixes
    whose detection says needed here (opt-in ones off)."""
    from helpers import child_env
    from sglang_swa_plugin.core import load_fixes, safe_detect
    from sglang_swa_plugin.fix import Verdict

    for key in [k for k in os.environ if k.startswith("SGLANG_SWA_PLUGIN") or k in ("SGLANG_PLUGINS", "PYTHONPATH")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    got = command.needed_fixes()
    want = sorted(f.name for f, _ in load_fixes() if not f.opt_in and safe_detect(f).verdict is Verdict.NEEDED)
    assert got == {"needed": want, "problems": []} and want, got
