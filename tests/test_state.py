"""The plugin's state on sglang's objects (``sglang_swa_plugin.state``): one attribute per object,
made on first use, read without making it, a shallow copy's writes kept off the original; and no
ad-hoc attribute of the plugin's left in its source."""

from __future__ import annotations

import copy
import importlib
import re
from types import SimpleNamespace

import pytest

from helpers import HERE

from sglang_swa_plugin import state

pytestmark = pytest.mark.release_independent  # the plugin's own code, no sglang object involved

REPO = HERE.parent
# An attribute name of the plugin's own (the form the per-object state replaced), and the names of
# that form that are no object state: the wrapper mark, the pluggy hook, the autoload .pth file.
AD_HOC = re.compile(r"_(sglang_)?swa_plugin_[a-z_0-9]+")
NOT_STATE = ("__sglang_swa_plugin__", "sglang_swa_plugin_fixes", "sglang_swa_plugin_autoload")
# Every key of the plugin's state: (module, its constants).
KEYS = {
    "sglang_swa_plugin.graphed": ("ATTR", "POOL"),
    "sglang_swa_plugin.chunked": ("CHUNK",),
    "sglang_swa_plugin.hooks.swa_graph_padding": ("TAILS",),
    "sglang_swa_plugin.hooks.trtllm_xqa_spec_decode": ("VIEW", "STATE"),
    "sglang_swa_plugin.hooks.trtllm_local_attn": ("STATE", "VIEW"),
    "sglang_swa_plugin.hooks.triton_local_attn": ("RAIL",),
    "sglang_swa_plugin.hooks.triton_swa_tree_verify": ("RAIL",),  # per window: f"{RAIL}_{window}"
    "sglang_swa_plugin.hooks.fa3_local_attn_verify": ("BUFFERS",),
    "sglang_swa_plugin.hooks.swa_write_loc": ("TRANSLATED_FROM", "OWN"),
    "sglang_swa_plugin.hooks.fa3_local_attn_tree_verify": ("EXPAND", "BUFFERS"),
    "sglang_swa_plugin.hooks.triton_swa_draft": ("RAIL", "STEPS"),
    "sglang_swa_plugin.hooks.fa3_spec_translate": ("TABLES", "STEPS"),
}


class Plain:
    """An object as sglang's are: attributes in its ``__dict__``."""


def test_of_makes_the_state_once_and_get_reads_without_making_it():
    obj = Plain()
    assert state.get(obj, "k") is None and state.get(obj, "k", 3) == 3 and not state.has(obj, "k")
    assert vars(obj) == {}  # reading made nothing
    st = state.of(obj)
    assert st == {} and isinstance(st, dict) and list(vars(obj)) == [state.ATTR]
    st["k"] = 1
    assert state.of(obj) is st and state.get(obj, "k") == 1 and state.has(obj, "k")
    assert state.of(obj).setdefault("d", {}) is state.of(obj).setdefault("d", {})
    state.of(obj)["none"] = None
    assert state.has(obj, "none") and state.get(obj, "none", 5) is None  # a value of None is a value
    assert list(vars(obj)) == [state.ATTR]  # one attribute, whatever the entries
    ns = SimpleNamespace(x=1)
    state.of(ns)["k"] = 2
    assert state.get(ns, "k") == 2 and ns.x == 1


def test_a_shallow_copy_reads_the_originals_entries_and_writes_its_own():
    """``copy.copy`` shares the original's state dict: a write on the copy must not change the
    original (as with attributes copied by value); nested values stay shared, as they were."""
    orig = Plain()
    nested = state.of(orig).setdefault("nested", {})
    state.of(orig)["k"] = "orig"
    dup = copy.copy(orig)
    assert vars(dup)[state.ATTR] is vars(orig)[state.ATTR]  # what copy.copy does
    assert state.get(dup, "k") == "orig" and state.has(dup, "nested")  # reads: the entries copied with it
    assert vars(dup)[state.ATTR] is vars(orig)[state.ATTR]  # ... without copying the state
    state.of(dup)["k"] = "dup"
    state.of(dup)["new"] = 1
    assert state.get(orig, "k") == "orig" and not state.has(orig, "new")
    assert state.get(dup, "k") == "dup" and state.get(dup, "new") == 1
    assert state.get(dup, "nested") is nested  # a shallow copy: the entries themselves are shared
    own = state.of(dup)
    assert state.of(dup) is own  # copied once: the copy owns it now
    state.of(orig)["k"] = "orig again"
    assert state.get(dup, "k") == "dup"
    # a copy of a copy, and a deep copy: each its own once it writes
    dup2 = copy.copy(dup)
    state.of(dup2)["k"] = "dup2"
    assert (state.get(orig, "k"), state.get(dup, "k"), state.get(dup2, "k")) == ("orig again", "dup", "dup2")
    deep = copy.deepcopy(orig)
    state.of(deep)["k"] = "deep"
    assert state.get(orig, "k") == "orig again" and state.get(deep, "k") == "deep"


def test_the_state_keys_are_unique_across_the_plugin():
    keys = {}
    for name, consts in KEYS.items():
        mod = importlib.import_module(name)
        for const in consts:
            key = getattr(mod, const)
            assert isinstance(key, str) and key and not AD_HOC.search(key), (name, const, key)
            assert key not in keys, f"{name}.{const} and {keys.get(key)} share the key {key!r}"
            keys[key] = f"{name}.{const}"
    # the per-window keys of triton_swa_tree_verify (f"{RAIL}_{window}") meet no other key
    tree = importlib.import_module("sglang_swa_plugin.hooks.triton_swa_tree_verify").RAIL + "_"
    assert not [k for k in keys if k.startswith(tree)], keys


def ad_hoc_names(text: str) -> list:
    """The plugin-private attribute names in ``text`` (the form ``state`` replaced)."""
    for name in NOT_STATE:
        text = text.replace(name, "")
    return [m.group(0) for m in AD_HOC.finditer(text)]


def test_the_scan_finds_an_ad_hoc_attribute():
    assert ad_hoc_names('X = "_swa_plugin_tails"\nsetattr(self, "_sglang_swa_plugin_rail", 1)') == [
        "_swa_plugin_tails", "_sglang_swa_plugin_rail"]
    assert ad_hoc_names("MARK = '__sglang_swa_plugin__'; hook = 'sglang_swa_plugin_fixes'\n"
                        "PTH = 'sglang_swa_plugin_autoload.pth'; import sglang_swa_plugin.hooks\n"
                        f"ATTR = {state.ATTR!r}") == []


def test_no_ad_hoc_attribute_of_the_plugin_is_left_in_its_source():
    """Every piece of the plugin's state on an object goes through ``state`` (one attribute per
    object); a name of the old form in hooks/ or sglang_swa_plugin/ fails this test."""
    files = sorted((REPO / "hooks").rglob("*.py")) + sorted((REPO / "sglang_swa_plugin").rglob("*.py"))
    assert len(files) > 20, files
    found = [f"{path.relative_to(REPO)}:{i}: {name}" for path in files
             for i, line in enumerate(path.read_text().splitlines(), 1) for name in ad_hoc_names(line)]
    assert found == []
