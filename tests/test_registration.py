"""How the built-in fixes are found and in which order they go in: every module of
``sglang_swa_plugin.hooks`` is a fix (no list to keep), and where two fixes hook the same
target, the one that goes in later wraps the other; that nesting is declared (``Fix.wraps``),
never left to chance, and it is the one the fixes were built and measured with."""

from __future__ import annotations

import itertools

import pytest

from helpers import HERE, LOAD, child_env, child_json, copy_dist, needs_framework, run_child, run_cli

from sglang_swa_plugin.core import BUILTIN_MODULES, load_fixes

FA3 = "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend."
FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend.FlashInferIndicesUpdaterPrefill."
TRITON = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend."
TRTLLM = "sglang.srt.layers.attention.trtllm_mha_backend.TRTLLMHAAttnBackend."
TRITON_MULTI = "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend."

# Every target that more than one built-in fix hooks, and the order their hooks go in (the
# first is innermost: each later hook's ``original`` is the one before it).
NESTING = {
    FA3 + "forward_extend": ["fa3_local_attn_tree_verify", "swa_index_guard"],
    FA3 + "init_cuda_graph_state": ["fa3_local_attn_verify", "fa3_local_attn_tree_verify"],
    FA3 + "init_forward_metadata": ["fa3_local_attn_tree_verify", "swa_write_loc"],
    FA3 + "init_forward_metadata_capture_cuda_graph": ["fa3_local_attn_verify", "fa3_local_attn_tree_verify"],
    FA3 + "init_forward_metadata_out_graph": ["fa3_local_attn_verify", "fa3_local_attn_tree_verify", "swa_write_loc"],
    FA3 + "init_forward_metadata_replay_cuda_graph": ["fa3_local_attn_verify", "fa3_local_attn_tree_verify"],
    FLASHINFER + "update_sliding_window": ["flashinfer_swa_verify", "flashinfer_swa_prefill"],
    TRITON + "__init__": ["triton_one_pool_window", "triton_local_attn"],
    TRITON + "forward_decode": ["swa_write_loc", "triton_local_attn"],
    TRITON_MULTI + "__init__": ["triton_one_pool_window", "triton_swa_window"],
    TRITON + "forward_extend": ["triton_local_attn", "triton_swa_tree_verify"],
    TRTLLM + "__init__": ["trtllm_swa_pool", "trtllm_local_attn"],
    TRTLLM + "forward_decode": ["trtllm_xqa_dense_query", "trtllm_local_attn"],
    TRTLLM + "forward_extend": ["trtllm_extend_routing", "trtllm_xqa_spec_decode", "trtllm_local_attn"],
}


def _builtins():
    return [fix for fix, source in load_fixes() if source == "builtin"]


def _hook_order() -> dict:
    """{target: the fixes hooking it, in the order ``load_fixes`` (and so start-up) installs them}
    for every target of more than one built-in fix."""
    order: dict = {}
    for fix in _builtins():
        for target in dict.fromkeys(fix.targets):
            order.setdefault(target, []).append(fix.name)
    return {t: names for t, names in order.items() if len(names) > 1}


def test_shared_targets_are_hooked_in_the_order_the_fixes_were_built_with():
    assert _hook_order() == NESTING


def _wrapped_by(fixes) -> dict:
    """{fix name: every fix its hooks wrap, directly or through the fixes it wraps}."""
    wraps = {fix.name: set(fix.wraps) for fix in fixes}
    closed = {}
    for name in wraps:
        seen, todo = set(), list(wraps[name])
        while todo:
            other = todo.pop()
            if other not in seen:
                seen.add(other)
                todo += wraps.get(other, ())
        closed[name] = seen
    return closed


def test_every_shared_target_has_its_hook_order_declared():
    """Where fixes share a target, each pair is ordered by ``wraps`` (directly or through
    another): a new fix hooking a target another fix hooks fails here until it says which
    goes in first."""
    fixes = _builtins()
    inside = _wrapped_by(fixes)
    undeclared = [(target, a, b) for target, names in _hook_order().items()
                  for a, b in itertools.combinations(names, 2) if a not in inside[b] and b not in inside[a]]
    assert not undeclared, f"declare Fix.wraps for these (target, fix, fix): {undeclared}"


def test_wraps_names_built_in_fixes_and_no_cycle():
    fixes = _builtins()
    names = {fix.name for fix in fixes}
    assert {w for fix in fixes for w in fix.wraps} <= names
    assert not [name for name, inside in _wrapped_by(fixes).items() if name in inside]


def test_every_module_of_the_source_tree_is_an_installed_fix():
    """No list to keep: each ``hooks/*.py`` is a built-in fix once installed, found by name;
    one that is missing from the wheel or defines no ``FIX`` fails here (and is an ``error``
    in doctor)."""
    from sglang_swa_plugin.core import BROKEN, broken_records

    source = sorted(p.stem for p in (HERE.parent / "hooks").glob("*.py") if not p.stem.startswith("_"))
    assert [m.rsplit(".", 1)[1] for m in BUILTIN_MODULES] == source
    assert sorted(fix.name for fix in _builtins()) == source
    assert not BROKEN and not broken_records(), BROKEN


def test_install_order_puts_each_fix_after_the_ones_it_wraps_and_third_parties_last():
    from sglang_swa_plugin.core import BROKEN, install_order
    from sglang_swa_plugin.fix import Fix

    def fix(name, wraps=()):
        return type("F", (Fix,), {"name": name, "wraps": wraps})()

    fixes = [(fix("acme", ("alpha",)), "entry point acme"), (fix("aaa"), "entry point aaa"),
             (fix("alpha", ("beta",)), "builtin"), (fix("beta"), "builtin"), (fix("gamma", ("no_such_fix",)), "builtin")]
    try:
        order = install_order(fixes)
        assert [f.name for f, _ in order] == ["beta", "alpha", "gamma", "aaa", "acme"]
        assert "no_such_fix" in BROKEN["sglang_swa_plugin.hooks.no_such_fix"], BROKEN
    finally:
        BROKEN.pop("sglang_swa_plugin.hooks.no_such_fix", None)


def test_load_fixes_installs_in_the_declared_order():
    fixes = _builtins()
    position = {fix.name: i for i, fix in enumerate(fixes)}
    assert all(position[w] < position[fix.name] for fix in fixes for w in fix.wraps)
    assert [fix.name for fix in fixes] == [fix.name for fix in _builtins()]  # the same every time


@pytest.mark.cli
def test_doctor_names_a_missing_built_in_fix(tmp_path):
    """A build without ``trtllm_swa_pool`` (which ``trtllm_local_attn`` wraps): doctor says
    which fix is missing, as an error, and exits 1."""
    site = tmp_path / "site"
    copy_dist("sglang-swa-plugin", site)
    (site / "sglang_swa_plugin" / "hooks" / "trtllm_swa_pool.py").unlink()
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(PYTHONPATH=str(site)))
    row = next((line for line in proc.stdout.splitlines() if line.startswith("  trtllm_swa_pool ")), "")
    assert " error " in row and "trtllm_local_attn wraps it" in row, proc.stdout + proc.stderr
    assert proc.returncode == 1 and "fix trtllm_swa_pool: error" in proc.stdout.splitlines()[-1], proc.stdout


def test_no_two_fixes_share_a_hook_object():
    """The plugin marks each hook with its fix's name (how it finds its hooks on a target): a
    function two fixes share carries one name, and the other fix's hook reads as not in effect."""
    from sglang_swa_plugin.core import safe_detect

    plans = {fix.name: safe_detect(fix).plan for fix in _builtins()}  # kept alive: ids stay unique
    owners: dict = {}
    for name, plan in plans.items():
        for hook in plan:
            owners.setdefault(id(hook.fn), set()).add(name)
    assert not [names for names in owners.values() if len(names) > 1]


SHARED = LOAD + """
import types
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_swa_plugin.patching import RegistryHooks, hook_names, target_marks
applied = {}
for name, rec in sglang_swa_plugin.status()["fixes"].items():
    for t in rec["installed_targets"]:
        applied.setdefault(t, []).append(name)
shared = {t: {"ours": sum(1 for _, h, _ in HookRegistry._hooks[t] if hook_names(h)), "marks": target_marks(t)}
          for t, names in applied.items() if len(names) > 1}
# two fixes around one function of a module of our own, through sglang's registry
mod = sys.modules["acme_target"] = types.ModuleType("acme_target")
mod.f = lambda calls: calls + ["original"]
for name in ("inner", "outer"):
    RegistryHooks(name).around("acme_target.f", lambda original, calls, name=name: original(calls + [name]))
ours = sum(1 for _, h, _ in HookRegistry._hooks["acme_target.f"] if hook_names(h))
HookRegistry.apply_hooks()
print("SHARED=" + json.dumps({"shared": shared, "calls": mod.f([]), "registered": ours, "marks": target_marks("acme_target.f")}))
"""


@needs_framework
def test_a_shared_target_is_one_registration_on_sglangs_registry_running_every_fix_in_order():
    """sglang's HookRegistry warns at every start about a target with several AROUND hooks: the
    fixes that share a target register one hook, their chain, which runs each of them nested as
    the registry would (the first registered innermost)."""
    proc = run_child(SHARED)
    got = child_json(proc, "SHARED")
    assert got["calls"] == ["outer", "inner", "original"] and got["registered"] == 1, got
    assert got["marks"] == ["outer", "inner"], got
    assert got["shared"], "no target of this sglang carries two applied fixes: nothing was checked"
    for target, seen in got["shared"].items():
        applied = [n for n in NESTING[target] if n in seen["marks"]]
        assert seen["ours"] == 1 and seen["marks"] == applied[::-1], (target, seen)
    assert not [l for l in proc.stderr.splitlines() if "Multiple AROUND hooks" in l]
