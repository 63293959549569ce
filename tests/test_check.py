"""check: each row says which scenario it ran; a fix that is not needed shows no 'fixed';
an opt-in fix that is off shows as off; 'scenario unavailable' names what is missing."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from helpers import BUILTIN_NAMES, HAS_PLUGIN_FRAMEWORK, child_env, copy_dist, run_cli


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One ``check --json`` run (a child importing sglang: 15 s of CPU) and the text ``check``
    prints for that report, from its printer (test_bad_settings_read_as_the_runtime_and_doctor_read_them
    runs the text form end to end)."""
    from sglang_swa_plugin.check import print_check

    rep = json.loads(run_cli("check", "--json", tmp_path=tmp_path_factory.mktemp("check")).stdout)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_check(rep)
    return rep, text.getvalue()


@pytest.fixture(scope="module")
def report_tp2(tmp_path_factory):
    """``check --json --attention-tp 2``: the scenarios as rank 0 of two attention TP ranks."""
    return json.loads(run_cli("check", "--json", "--attention-tp", "2", tmp_path=tmp_path_factory.mktemp("tp2")).stdout)


def test_at_attention_tp_2_each_scenario_shows_and_is_corrected_as_at_tp_1(report, report_tp2):
    """Every fix's scenario with one attention TP rank's heads in its pools, layers and backends
    (rank 0 of 2): the bug shows where it shows at TP 1 and the plugin corrects it; the only
    scenarios that do not run are those built on sglang's model layers (process groups of one
    rank) and those that do not run at TP 1 either."""
    rep, _ = report
    assert (rep["attention_tp"], report_tp2["attention_tp"]) == (1, 2)
    one, ran = {r["fix"]: r for r in rep["rows"]}, []
    for row in report_tp2["rows"]:
        base = one[row["fix"]]
        if row["reproduced_without"] is None:
            assert base["reproduced_without"] is None or "not at attention TP 2" in row["note"], (row, base)
            continue
        ran.append(row["fix"])
        for key in ("detection", "reproduced_without", "fixed_with", "fixed_if_on"):
            assert row[key] == base[key], (key, row, base)
    print(f"\nat attention TP 2: {len(ran)} of {len(rep['rows'])} scenarios: {', '.join(ran)}")
    assert "triton_swa_window" in ran and "trtllm_swa_pool" in ran, ran  # the Triton and trtllm benches
    assert report_tp2["ok"] == rep["ok"], report_tp2["problems"]


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


@pytest.mark.cli
def test_the_guard_row_when_on(tmp_path):
    rep = json.loads(run_cli("check", "--json", tmp_path=tmp_path, env=child_env(SGLANG_SWA_PLUGIN_GUARD="1")).stdout)
    row = next(r for r in rep["rows"] if r["fix"] == "swa_index_guard")
    assert row["fixed_if_on"] is None and row["detection"] in ("needed", "not applicable"), row
    if row["reproduced_without"]:
        assert row["fixed_with"] is True, row


BAD = {"SGLANG_SWA_PLUGIN": "maybe", "SGLANG_SWA_PLUGIN_FIXES": "trtllm_swa_pool,bogus_fix",
       "SGLANG_SWA_PLUGIN_STRICT": "maybe", "SGLANG_SWA_PLUGIN_GUARD": "2"}


@pytest.mark.cli
def test_bad_settings_read_as_the_runtime_and_doctor_read_them(tmp_path):
    """Every variable bad at once: check prints the BAD SETTING lines doctor prints, falls
    back as the runtime does (plugin on, all fixes, guard off) and exits 1."""
    check = run_cli("check", tmp_path=tmp_path, env=child_env(**BAD))
    doctor = run_cli("doctor", tmp_path=tmp_path, env=child_env(**BAD))

    def bad_lines(proc):
        return [line for line in proc.stdout.splitlines() if line.startswith("BAD SETTING: ")]

    assert len(bad_lines(check)) == 4 and bad_lines(check) == bad_lines(doctor), (check.stdout, doctor.stdout)
    assert any("SGLANG_SWA_PLUGIN_FIXES='trtllm_swa_pool,bogus_fix'" in line and "using the default (all fixes)" in line
               for line in bad_lines(check)), check.stdout
    assert check.returncode == doctor.returncode == 1, (check.stdout, doctor.stdout)
    assert check.stdout.rstrip().splitlines()[-1].startswith("PROBLEM: bad setting: "), check.stdout
    assert "not selected" not in check.stdout and "plugin off" not in check.stdout, check.stdout


@pytest.mark.cli
def test_a_plugin_that_will_not_load_is_a_problem_and_every_row_says_so(tmp_path):
    """sglang with a plugin loader: SGLANG_PLUGINS without us; without one (0.5.10): the plugin
    switched off."""
    env = {"SGLANG_PLUGINS": "other"} if HAS_PLUGIN_FRAMEWORK else {"SGLANG_SWA_PLUGIN": "0"}
    proc = run_cli("check", "--json", tmp_path=tmp_path, env=child_env(**env))
    rep = json.loads(proc.stdout)
    assert proc.returncode == 1 and not rep["ok"], rep["problems"]
    want = "SGLANG_PLUGINS=other does not name swa_plugin" if HAS_PLUGIN_FRAMEWORK else "SGLANG_SWA_PLUGIN=0"
    assert rep["problems"][0].startswith(want), rep["problems"]
    said = "will not be applied" if HAS_PLUGIN_FRAMEWORK else "disabled: SGLANG_SWA_PLUGIN=0"
    assert sorted(r["fix"] for r in rep["rows"]) == BUILTIN_NAMES
    for row in rep["rows"]:
        assert said in row["note"] and row["fixed_with"] is None, row


def test_without_sglang_one_line(tmp_path):
    site = tmp_path / "site"
    for name in ("sglang-swa-plugin", "pluggy"):
        copy_dist(name, site)
    proc = run_cli("check", tmp_path=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)},
                   python_args=("-S",))
    assert proc.returncode == 1 and proc.stdout == "PROBLEM: sglang is not installed\n", proc.stdout + proc.stderr
