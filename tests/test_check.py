"""check: each row says which scenario it ran; a fix that is not needed shows no 'fixed';
an opt-in fix that is off shows as off; 'scenario unavailable' names what is missing."""

from __future__ import annotations

import json
import re

import pytest

from helpers import child_env, run_cli


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("check")
    rep = json.loads(run_cli("check", "--json", tmp_path=tmp).stdout)
    text = run_cli("check", tmp_path=tmp).stdout
    return rep, text


def test_every_row_names_its_scenario_in_one_plain_line(report):
    rep, text = report
    for row in rep["rows"]:
        desc = row["scenario"]
        assert desc and "\n" not in desc and "``" not in desc and len(desc) < 300, row
        assert f"scenario: {desc}" in text


def test_a_fix_that_is_not_needed_is_not_shown_as_fixed(report):
    rep, text = report
    quiet = [r for r in rep["rows"] if r["detection"] in ("not needed", "not applicable")]
    assert quiet  # trtllm_extend_routing is not needed on every release
    for row in quiet:
        assert row["fixed_with"] is None or (row["reproduced_without"] and row["fixed_with"] is False), row
        shown = next(line for line in text.splitlines() if line.startswith(row["fix"] + " "))
        assert re.search(rf"^{row['fix']}\s+{row['detection']}\s+\S+\s+-(\s|$)", shown), shown


def test_the_guard_row_is_off_when_the_guard_is_off(report):
    rep, text = report
    row = next(r for r in rep["rows"] if r["fix"] == "swa_index_guard")
    assert row["detection"] == "opt-in, off" and row["fixed_with"] is None, row
    if row["reproduced_without"] is not None:
        assert row["fixed_if_on"] is True and "off (yes if on)" in text, (row, text)


def test_scenario_unavailable_names_what_is_missing(report):
    rep, _ = report
    for row in rep["rows"]:
        if row["note"].startswith("scenario unavailable"):
            assert re.search(r"sglang\.srt\.[\w.]+|ForwardMode\.\w+|algorithm '\w+'|backend '\w+'|cannot import|"
                             r"Triton kernel", row["note"]), row
    frozen = next(r for r in rep["rows"] if r["fix"] == "frozen_kv_views")
    if frozen["detection"] == "not applicable":
        assert "sglang.srt.speculative.frozen_kv_mtp_utils" in frozen["note"], frozen


def test_the_guard_row_when_on(tmp_path):
    rep = json.loads(run_cli("check", "--json", tmp_path=tmp_path, env=child_env(SGLANG_SWA_PLUGIN_GUARD="1")).stdout)
    row = next(r for r in rep["rows"] if r["fix"] == "swa_index_guard")
    assert row["fixed_if_on"] is None and row["detection"] in ("needed", "not applicable"), row
    if row["reproduced_without"]:
        assert row["fixed_with"] is True, row
