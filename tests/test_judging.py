"""The selftest's judging on crafted server logs and outputs: each rule fails the row where it
must (``sglang_swa_plugin.selftest.judging``), the server log is read as sglang writes it
(``server``: tracebacks, the plugin's status lines, the settings sglang ran), the rows of the
opt-in paths and the required rows (``rows``), and the final line (``command``). No server,
no model, no sglang import: a row is a result dict, a log is text."""

from __future__ import annotations

import argparse

import pytest

from sglang_swa_plugin.selftest import command, judging, rows, server

pytestmark = pytest.mark.release_independent

REF = [[1, 2, 3, 4, 5, 6]] * 4 + [[7, 8, 9, 10, 11, 12]] * 4  # two seeds of 4 requests
SITE = "/venv/lib/python3.11/site-packages"


def status(fix: str, state: str, rank: str = "") -> str:
    """A fix status line as sglang's log shows the plugin's (core.log_record behind sglang's prefix)."""
    return f"[2026-01-01 12:00:00{' ' + rank if rank else ''}] sglang-swa-plugin: fix {fix}: {state} (why) [upstream #1]"


LOADED = [status("x", "applied"), status("y", "not needed")]


def served(outputs=None, accept=None, plugin_log=LOADED, **more) -> dict:
    return {"state": "served", "outputs": [list(o) for o in (outputs or REF)], "accept_length": accept,
            "plugin_log": list(plugin_log), **more}


def verdict(row: dict, plugin: bool = True, **kw) -> judging.Verdict:
    return judging.verdict(judging.judge(row, REF, 4), plugin, row=row, **kw)


def log(*frames: str, exception: str = "RuntimeError: boom", head: str = "Traceback (most recent call last):") -> str:
    """A traceback as a server log holds it: ``frames`` as ``path:function``."""
    lines = [head]
    for f in frames:
        path, func = f.rsplit(":", 1)
        lines += [f'  File "{path}", line 10, in {func}', "    something(x)", "    ^^^^^^^^^^^^"]
    return "\n".join(lines + [exception]) + "\n"


SCHED = f"{SITE}/sglang/srt/managers/scheduler.py:run_scheduler_process"
RUNNER = f"{SITE}/sglang/srt/model_executor/model_runner.py:forward"
BACKEND = f"{SITE}/sglang/srt/layers/attention/flashinfer_backend.py:forward_decode"
HOOK = f"{SITE}/sglang_swa_plugin/hooks/flashinfer_swa_verify.py:_hook"
WRAPPER = f"{SITE}/sglang_swa_plugin/patching.py:wrapper"


# -- acceptance ----------------------------------------------------------------------------------


def test_a_speculative_row_below_its_expected_accept_length_fails():
    from sglang_swa_plugin.selftest import acceptance

    assert judging.ACCEPT_TOLERANCE == acceptance.TOLERANCE  # the figure the acceptance module's faults exceed
    floor = judging.accept_floor(3.0)
    assert floor == pytest.approx(3.0 - judging.ACCEPT_TOLERANCE)
    low = verdict(served(accept=floor - 0.01), speculative=True, expected=3.0, needed=["x"])
    assert low[1] and low.kind == judging.LOW_ACCEPT, low
    assert low[0] == f"LOW ACCEPT (server {floor - 0.01:.2f} < expected 3.00 - {judging.ACCEPT_TOLERANCE:.2f})"
    assert verdict(served(accept=floor), speculative=True, expected=3.0, needed=["x"]) == ("OK", False)
    # the tokens are right: only acceptance shows a draft that reads the wrong keys
    assert judging.exact(judging.judge(served(accept=1.1), REF, 4))
    # a plain row is not judged on acceptance; a stock row shows it and never fails for it
    assert verdict(served(accept=1.1), needed=["x"]) == ("OK", False)
    stock = verdict(served(accept=1.1, plugin_log=()), plugin=False, speculative=True, expected=3.0)
    assert not stock[1] and stock[0].startswith("exact; low accept"), stock


def test_a_speculative_row_without_verify_steps_or_expectation_fails():
    none = verdict(served(accept=None), speculative=True, expected=3.0)
    assert none == ("NO SPECULATION: the responses count no verify step", True) and none.kind == judging.NO_SPECULATION
    unknown = verdict(served(accept=3.9), speculative=True, expected=None)
    assert unknown[1] and unknown.kind == judging.NO_EXPECTED and unknown[0].startswith("NO EXPECTED ACCEPT")


def test_a_speculative_row_whose_draft_accepts_next_to_nothing_fails():
    """A row judged against an expectation of about 1.0 passes whatever its draft reads: the row
    fails as the target's fault, even where the server matches the figure (the first GPU run of
    GPT-OSS at 1.0169 against 1.0169: its draft was another target's, saved in the same place)."""
    from sglang_swa_plugin.selftest import acceptance

    assert judging.DRAFT_ACCEPTS == acceptance.DRAFT_ACCEPTS and 1 + judging.ACCEPT_TOLERANCE < judging.DRAFT_ACCEPTS
    idle = verdict(served(accept=1.0169), speculative=True, expected=1.0169, needed=["x"])
    assert idle[1] and idle.kind == judging.IDLE_DRAFT, idle
    assert idle[0].startswith("IDLE DRAFT: the float32 target and draft expect 1.02 < 1.5 (server 1.02)"), idle
    assert verdict(served(accept=1.5), speculative=True, expected=judging.DRAFT_ACCEPTS, needed=["x"]) == ("OK", False)
    # a stock row shows it and does not fail for it
    stock = verdict(served(accept=1.0, plugin_log=()), plugin=False, speculative=True, expected=1.0)
    assert not stock[1] and "idle draft" in stock[0], stock


def test_wrong_tokens_and_low_accept_are_both_said():
    wrong = [list(o) for o in REF]
    wrong[5][3] = 0
    v = verdict(served(wrong, accept=1.0), speculative=True, expected=3.0)
    assert v.kind == judging.WRONG and v[1] and "WRONG TOKENS (first divergence at token 0-3: 1)" in v[0]
    assert "LOW ACCEPT" in v[0], v


# -- the plugin's status lines -------------------------------------------------------------------


def test_status_lines_are_read_per_fix_and_rank():
    lines = [status("x", "applied"), "[2026-01-01 12:00:00 DP0 TP1] sglang-swa-plugin: fix x: skipped (moved)",
             status("y", "not needed", "TP0"), "sglang-swa-plugin: fix z: applied (no prefix: a custom log format)"]
    assert judging.fix_statuses(lines) == {"": {"x": ["applied"], "z": ["applied"]}, "DP0 TP1": {"x": ["skipped"]},
                                           "TP0": {"y": ["not needed"]}}


def test_the_failure_path_and_the_harness_header_are_no_status_lines(tmp_path):
    """What names the plugin without being one of its fix status lines: its "nothing is
    installed" failures, its warnings, a handled exception's line, the harness's command
    header (a folder named after the plugin on the command line, its settings in the env)."""
    failures = ["[2026-01-01 12:00:00] sglang-swa-plugin: cannot load the plugin; nothing is installed",
                "[2026-01-01 12:00:00] sglang-swa-plugin: unexpected error while registering; nothing more is installed",
                "[2026-01-01 12:00:00] sglang-swa-plugin: fa3_local_attn_verify: eager verify: reads 1 key more; not corrected",
                "[2026-01-01 12:00:00] sglang-swa-plugin: could not load third-party fix f (m:f): fix x: applied"]
    state = judging.fix_state(failures)
    assert not state.loaded and state.applied == ()
    v = verdict(served(plugin_log=failures), needed=["x"])
    assert v == ("PLUGIN NOT LOADED: no fix status line of the plugin in the server log", True)
    path = tmp_path / "row.log"
    path.write_text("$ python -m sglang.launch_server --model-path /tmp/sglang-swa-plugin: fix x: applied (/target\n"
                    '# env: {"SGLANG_PLUGINS": "swa_plugin", "NOTE": "sglang-swa-plugin: fix x: applied (here)"}\n'
                    + "\n".join(failures) + "\n")
    lines = server.plugin_lines(str(path))
    assert lines == failures and not judging.fix_state(lines).loaded
    # the same log with the plugin's own status line: loaded
    path.write_text(path.read_text() + status("x", "applied") + "\n")
    assert judging.fix_state(server.plugin_lines(str(path))).applied == ("x",)


def test_a_needed_fix_not_applied_fails():
    lines = [status("x", "applied"), status("y", "skipped"), status("z", "applied")]
    v = verdict(served(plugin_log=lines), needed=["x", "y", "w"])
    assert v == ("FIX NOT APPLIED: w (no line), y (skipped)", True) and v.kind == judging.FIX_NOT_APPLIED
    assert verdict(served(plugin_log=lines), needed=["x", "z"]) == ("OK", False)
    # applied in the main process, not in the scheduler (a server of one rank: neither tagged)
    both = [status("x", "applied"), status("x", "error")]
    assert verdict(served(plugin_log=both), needed=["x"]) == ("FIX NOT APPLIED: x (error)", True)
    # doctor gave no report: which fixes are needed is not known, the rest is still judged
    assert verdict(served(plugin_log=lines), needed=None) == ("OK", False)


def test_tensor_parallel_ranks_that_disagree_fail():
    agree = [status(f, s, f"TP{r}") for r in (0, 1) for f, s in (("x", "applied"), ("y", "not needed"))]
    assert verdict(served(plugin_log=agree), needed=["x"], ranks=2) == ("OK", False)
    disagree = [status("x", "applied", "TP0"), status("x", "skipped", "TP1"), status("y", "not needed", "TP0")]
    v = verdict(served(plugin_log=disagree), needed=[], ranks=2)
    assert v.kind == judging.RANKS and v[1], v
    assert v[0] == "RANKS DISAGREE: x: applied on TP0, skipped on TP1; y: not needed on TP0, no line on TP1", v
    one_rank = [status("x", "applied", "TP0")]
    v = verdict(served(plugin_log=one_rank), needed=["x"], ranks=2)
    assert v == ("RANKS DISAGREE: status lines from 1 of 2 ranks (TP0)", True), v
    dp = [status("x", "applied", f"DP{r} TP{r}") for r in (0, 1)]
    assert verdict(served(plugin_log=dp), needed=["x"], ranks=2) == ("OK", False)


def test_a_stock_row_where_the_plugin_applied_fixes_fails():
    v = verdict(served(plugin_log=LOADED), plugin=False)
    assert v == ("PLUGIN IN A STOCK ROW: applied x; exact", True) and v.kind == judging.STOCK_WITH_PLUGIN
    assert verdict(served(plugin_log=()), plugin=False) == ("exact", False)


# -- tracebacks and failure attribution -----------------------------------------------------------


def test_tracebacks_are_read_as_sglang_logs_them():
    text = ("[2026-01-01 12:00:00 TP0] Scheduler hit an exception: " + log(SCHED, RUNNER, BACKEND)
            + "\nThe above exception was the direct cause of the following exception:\n\n"
            + log(SCHED, exception="torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
            + "[2026-01-01 12:00:01] Received sigquit from a child process. It usually means the child failed.\n"
            + log(SCHED, exception="AssertionError"))
    tbs = server.tracebacks(text)
    assert [(t["type"], len(t["frames"])) for t in tbs] == [("RuntimeError", 3), ("torch.AcceleratorError", 1),
                                                            ("AssertionError", 1)]
    assert tbs[0]["frames"][-1] == [BACKEND.rsplit(":", 1)[0], "forward_decode"]
    assert judging.sglang_frame(tbs[0]["frames"]) == "sglang/srt/layers/attention/flashinfer_backend.py:forward_decode"
    assert judging.signatures(tbs[:1]) == {("RuntimeError", "sglang/srt/layers/attention/flashinfer_backend.py:forward_decode")}
    # a plugin frame is no sglang frame; the plugin's frames are found
    hooked = server.tracebacks(log(SCHED, RUNNER, WRAPPER, HOOK))
    assert judging.sglang_frame(hooked[0]["frames"]) == "sglang/srt/model_executor/model_runner.py:forward"
    assert judging.own_frames(hooked) == [WRAPPER, HOOK]
    # sglang's refusal is read from the last traceback, as before
    refusal = log(f"{SITE}/sglang/srt/server_args.py:__post_init__",
                  exception="AssertionError: GptOssForCausalLM requires one of [triton] attention backend")
    assert server.refusal("noise\n" + refusal).startswith("AssertionError: GptOssForCausalLM")
    assert server.refusal(log(SCHED, RUNNER)) is None and server.refusal("no traceback") is None


def _stopped(text: str, state: str = "did not start", error: str = "RuntimeError: boom", plugin_log=LOADED) -> dict:
    return {"state": state, "error": error, "tracebacks": server.tracebacks(text), "plugin_log": list(plugin_log)}


def _attributed(plugin_log_text: str, stock_log_text: str, state="did not start", stock_state=None, **kw):
    row = _stopped(plugin_log_text, state)
    stock = _stopped(stock_log_text, stock_state or state, plugin_log=kw.pop("stock_plugin_log", ()))
    return judging.verdict(judging.judge(row, REF, 4), True, stock=stock, row=row, **kw)


def test_a_failure_the_stock_row_shares_is_excused():
    v = _attributed(log(SCHED, RUNNER, BACKEND), log(SCHED, RUNNER, BACKEND))
    assert not v[1] and v.kind == judging.EXCUSED, v
    assert v[0] == ("did not start without the plugin too (sglang's own failure): RuntimeError: boom "
                    "[RuntimeError at sglang/srt/layers/attention/flashinfer_backend.py:forward_decode]"), v
    # each rank printing it, in another order: the same failure
    assert _attributed(log(SCHED, BACKEND) * 2 + log(SCHED, exception="KeyError: 1"),
                       log(SCHED, exception="KeyError: 1") + log(SCHED, BACKEND)).kind == judging.EXCUSED


def test_a_plugin_frame_in_the_traceback_is_never_excused():
    v = _attributed(log(SCHED, RUNNER, WRAPPER, HOOK, BACKEND), log(SCHED, RUNNER, BACKEND))
    assert v[1] and v.kind == judging.DID_NOT_START, v
    assert "not excused: a frame of the plugin in its traceback: sglang_swa_plugin/hooks/flashinfer_swa_verify.py:_hook" in v[0]
    # in any traceback of the log, not only the one the stock row shares
    v = _attributed(log(SCHED, BACKEND) + log(SCHED, f"{SITE}/sglang_swa_plugin/startup.py:register"),
                    log(SCHED, BACKEND))
    assert v[1] and "sglang_swa_plugin/startup.py:register" in v[0]
    # a registered third-party fix's package is the plugin's too
    third = f"{SITE}/acme_swa_fixes/fix.py:_hook"
    assert _attributed(log(SCHED, third, BACKEND), log(SCHED, BACKEND)).kind == judging.EXCUSED
    v = _attributed(log(SCHED, third, BACKEND), log(SCHED, BACKEND), packages=("sglang_swa_plugin", "acme_swa_fixes"))
    assert v[1] and "acme_swa_fixes/fix.py:_hook" in v[0]


def test_the_same_exception_type_at_another_frame_is_not_excused():
    other = f"{SITE}/sglang/srt/layers/attention/triton_backend.py:forward_extend"
    v = _attributed(log(SCHED, RUNNER, BACKEND), log(SCHED, RUNNER, other))
    assert v[1] and "not excused: without the plugin it stops otherwise (RuntimeError at " \
                     "sglang/srt/layers/attention/triton_backend.py:forward_extend)" in v[0], v
    # the same frame, another exception type
    v = _attributed(log(SCHED, BACKEND), log(SCHED, BACKEND, exception="TypeError: boom"))
    assert v[1] and "stops otherwise (TypeError at" in v[0]
    # the same error line and state, as the old rule matched them: not enough
    assert _attributed(log(SCHED, BACKEND), log(SCHED, RUNNER)).kind == judging.DID_NOT_START


def test_no_traceback_another_state_or_a_stock_row_with_the_plugin_is_not_excused():
    timeout = {"state": "did not start", "error": "server did not start in time", "tracebacks": []}
    v = judging.verdict(judging.judge(timeout, REF, 4), True, stock=dict(timeout), row=timeout)
    assert v == ("DID NOT START: server did not start in time (not excused: no traceback in its log to attribute)", True)
    v = _attributed(log(SCHED, BACKEND), log(SCHED, BACKEND), state="crashed while serving", stock_state="did not start")
    assert v[1] and "not excused: without the plugin: did not start" in v[0]
    v = _attributed(log(SCHED, BACKEND), log(SCHED, BACKEND), stock_plugin_log=LOADED)
    assert v[1] and "the row without the plugin applied fixes of the plugin" in v[0]
    v = judging.verdict(judging.judge(_stopped(log(SCHED, BACKEND)), REF, 4), True, row=_stopped(log(SCHED, BACKEND)))
    assert v == ("DID NOT START: RuntimeError: boom", True)


def test_a_refusal_with_a_plugin_frame_fails():
    refused = {"state": judging.REFUSED, "error": "AssertionError: no",
               "tracebacks": server.tracebacks(log(f"{SITE}/sglang_swa_plugin/hooks/x.py:_hook",
                                                   f"{SITE}/sglang/srt/server_args.py:__post_init__",
                                                   exception="AssertionError: no"))}
    v = verdict(refused)
    assert v[1] and "a frame of the plugin in the refusal's traceback: sglang_swa_plugin/hooks/x.py:_hook" in v[0]
    assert verdict({**refused, "tracebacks": server.tracebacks(log(f"{SITE}/sglang/srt/server_args.py:f"))}) == (
        "refused by sglang: AssertionError: no", False)


def test_third_party_fix_packages_come_from_the_entry_point_group(monkeypatch):
    import importlib.metadata as md

    eps = [md.EntryPoint("acme", "acme_swa_fixes.fixes:module", "sglang_swa_plugin.fixes")]
    monkeypatch.setattr(md, "entry_points", lambda group=None: eps if group == "sglang_swa_plugin.fixes" else [])
    assert judging.plugin_packages() == ("sglang_swa_plugin", "acme_swa_fixes")
    assert judging.in_package(f"{SITE}/acme_swa_fixes/fixes.py", ("acme_swa_fixes",))
    assert not judging.in_package(f"{SITE}/acme_swa_fixes_other/x.py", ("acme_swa_fixes",))


# -- the prefix rows, the settings sglang ran ---------------------------------------------------


def test_repeated_requests_are_judged_every_time_and_must_hit_the_cache():
    second_wrong = [list(o) for o in REF * 2]
    second_wrong[len(REF) + 1][4] = 0  # the first seed's second request, the second time
    judged = judging.judge(served(second_wrong), REF, 4)
    assert [(c["identical"], c["of"]) for c in judged["per_seed"]] == [(7, 8), (8, 8)]
    row = served([list(o) for o in REF] * 2, cached_tokens=[0, 0])
    assert verdict(row, repeated=True) == ("NO PREFIX HIT: the repeated requests reused no cached token", True)
    assert verdict({**row, "cached_tokens": [0, 944]}, repeated=True) == ("OK", False)
    assert verdict({**row, "cached_tokens": None}, repeated=True) == ("OK", False)  # not reported: not judged


def test_the_settings_sglang_ran_are_read_back():
    old = ("[2026-01-01 12:00:00] server_args=ServerArgs(model_path='/t', page_size=64, chunked_prefill_size=64, "
           "speculative_attention_mode='prefill', enable_deterministic_inference=False, tp_size=2)")
    new = "[2026-01-01 12:00:00] server_args={'model_path': '/t', 'page_size': 1, 'speculative_attention_mode': 'decode'}"
    assert server.server_settings(old) == {"page_size": "64", "chunked_prefill_size": "64",
                                           "speculative_attention_mode": "prefill",
                                           "enable_deterministic_inference": "False", "tp_size": "2"}
    assert server.server_settings(new) == {"page_size": "1", "speculative_attention_mode": "decode"}
    assert judging.settings_changed({"page_size": "1"}, server.server_settings(old)) == \
        "sglang changed the row's settings: it runs page_size=64, not 1"
    assert judging.settings_changed({"page_size": "1"}, server.server_settings(new)) is None
    assert judging.settings_changed({"tp_size": "4"}, {}) is None


def test_a_row_whose_settings_sglang_changed_is_shown_as_refused():
    p = rows.Planned(rows.Row("gptoss", "trtllm_mha", "plain", True, variant="page1"), ["--page-size", "1"], None,
                     settings=(("page_size", "1"),))
    res = served(server_args={"page_size": "64"})
    e = command._row_entry(p, res, REF, command.Protocol(requests=4), needed=["x"])
    assert (e["state"], e["failed"], e["kind"]) == (judging.REFUSED, False, judging.REFUSED), e
    assert e["result"] == "refused by sglang: sglang changed the row's settings: it runs page_size=64, not 1"
    assert command._row_entry(p, served(server_args={"page_size": "1"}), REF, command.Protocol(requests=4),
                              needed=["x"])["result"] == "OK"


# -- rows of the opt-in paths, required rows ----------------------------------------------------

FLAGS = frozenset(["--disable-piecewise-cuda-graph", "--cuda-graph-max-bs", "--disable-cuda-graph",
                   "--decode-attention-backend", "--prefill-attention-backend", "--chunked-prefill-size", "--page-size",
                   "--speculative-attention-mode", "--enable-deterministic-inference", "--tp-size",
                   "--enable-dp-attention", "--dp-size"])
OPTS = rows.SglangOptions(FLAGS, rows.BACKENDS)
PATHS = {"gptoss": ("/t", "/d"), "llama4": rows.Saved("/l", "/d", "eagle3", (), (("trtllm_mha", ("--page-size", "32")),))}


def _plan(**kw) -> dict:
    return {p.row.key: p for p in rows.plan(PATHS, rows.BACKENDS, (9, 0), kw.pop("options", OPTS), **kw)}


def test_the_rows_of_the_opt_in_paths():
    plain = _plan()
    assert not [k for k in plain if k.count("/") != 3]  # no variant unless asked for
    got = _plan(variants=rows.VARIANTS)
    chunk = got["gptoss/fa3/k1/chunk64/plugin"]
    assert chunk.args[-2:] == ["--chunked-prefill-size", "64"] and dict(chunk.settings) == {"chunked_prefill_size": "64"}
    prefix = got["gptoss/triton/plain/prefix/plugin"]
    assert prefix.repeats == 2 and prefix.args == plain["gptoss/triton/plain/plugin"].args
    assert got["gptoss/flashinfer/plain/page1/plugin"].args[-2:] == ["--page-size", "1"]
    assert got["gptoss/trtllm_mha/k1/page64/plugin"].args[-2:] == ["--page-size", "64"]
    assert "llama4/trtllm_mha/plain/page1/plugin" not in got and "llama4/fa3/plain/page1/plugin" in got  # its own size
    verify = [k for k in got if "/decodeverify/" in k]
    assert verify == ["gptoss/trtllm_mha/k1/decodeverify/plugin", "gptoss/trtllm_mha/k2/decodeverify/plugin",
                      "llama4/trtllm_mha/k1/decodeverify/plugin", "llama4/trtllm_mha/k2/decodeverify/plugin"]
    assert got[verify[0]].args[-2:] == ["--speculative-attention-mode", "decode"]
    assert [k for k in got if "/deterministic/" in k] == [f"{t}/triton/{m}/deterministic/plugin"
                                                          for t in ("gptoss", "llama4") for m in ("plain", "k1", "k2")]
    # a flag this sglang lacks: listed as not run, with the flag
    lacking = _plan(variants=["chunk64"], options=OPTS._replace(flags=FLAGS - {"--chunked-prefill-size"}))
    assert lacking["gptoss/fa3/plain/chunk64/plugin"].why_not == "this sglang has no --chunked-prefill-size"
    # variants of the default rows only (not of the eager or small-pool ones)
    assert not [k for k in _plan(variants=["prefix"], graphs_off=True, small_pool=True) if "/eager/" in k and "prefix" in k]


def test_tensor_parallel_rows_get_their_own_gpus():
    got = _plan(tp=2, dp_attention=True, stock=True, gpus=["0", "1", "2", "3"], patterns=["gptoss/fa3/*"])
    tp = got["gptoss/fa3/k1/tp2/plugin"]
    assert tp.ranks == 2 and tp.args[-2:] == ["--tp-size", "2"] and dict(tp.settings) == {"tp_size": "2"}
    dp = got["gptoss/fa3/k1/tp2dpattn/plugin"]
    assert dp.args[-5:] == ["--tp-size", "2", "--enable-dp-attention", "--dp-size", "2"]
    sets = {k: dict(p.env).get("CUDA_VISIBLE_DEVICES") for k, p in got.items() if p.ranks > 1}
    assert sets["gptoss/fa3/plain/tp2/plugin"] == "0,1" and sets["gptoss/fa3/plain/tp2dpattn/plugin"] == "2,3"
    assert all(sets[k] == sets[k.replace("/plugin", "/stock")] for k in sets if k.endswith("/plugin"))  # twins share
    assert all(p.env == () for p in got.values() if p.ranks == 1)
    few = _plan(tp=4, gpus=["0", "1"], patterns=["gptoss/fa3/plain/*"])
    assert few["gptoss/fa3/plain/tp4/plugin"].why_not == "needs 4 GPUs; 2 here"
    assert rows.devices(2, {}) == ["0", "1"] and rows.devices(8, {"CUDA_VISIBLE_DEVICES": "4, 5"}) == ["4", "5"]


def test_the_default_required_rows_per_architecture():
    assert rows.default_required(["gptoss"], rows.BACKENDS, (9, 0), OPTS) == [
        "gptoss/fa3/*", "gptoss/flashinfer/*", "gptoss/triton/*", "gptoss/trtllm_mha/*"]
    assert rows.default_required(["gptoss"], rows.BACKENDS, (10, 0), OPTS) == [
        "gptoss/flashinfer/*", "gptoss/triton/*", "gptoss/trtllm_mha/*"]
    assert rows.default_required(["gptoss"], rows.BACKENDS, (8, 0), OPTS) == ["gptoss/flashinfer/*", "gptoss/triton/*"]
    # what this sglang offers, what was asked for
    assert rows.default_required(["gptoss"], ["fa3", "triton"], (9, 0), OPTS._replace(backends=("triton",))) == [
        "gptoss/triton/*"]
    ns = argparse.Namespace(backends=["triton"], rows=[], require=None)
    assert command.required_patterns(ns, ["gptoss"], (9, 0), OPTS) == ["gptoss/triton/*"]
    assert command.required_patterns(argparse.Namespace(**{**vars(ns), "rows": ["x"]}), ["gptoss"], (9, 0), OPTS) == []
    assert command.required_patterns(argparse.Namespace(**{**vars(ns), "require": ["default", "a/*"]}),
                                     ["gptoss"], (9, 0), OPTS) == ["gptoss/triton/*", "a/*"]
    assert command.required_patterns(argparse.Namespace(**{**vars(ns), "require": ["none"]}), ["gptoss"], (9, 0), OPTS) == []


def test_a_required_row_missing_or_not_run_fails():
    entries = {"gptoss/fa3/plain/plugin": {"state": "served", "result": "OK"},
               "gptoss/trtllm_mha/plain/plugin": {"state": "not run", "result": "not run: this sglang has no --x"},
               "gptoss/flashinfer/plain/plugin": {"state": judging.REFUSED, "result": "refused by sglang: no"}}
    req = command._required(["gptoss/*/plain/*", "gemma4/*"], entries)
    assert req["missing"] == ["gemma4/*"] and req["not_run"] == ["gptoss/trtllm_mha/plain/plugin"]
    assert req["problems"] == ["required, no such row: gemma4/* (its target is not available, or not asked for)",
                               "required row not run: gptoss/trtllm_mha/plain/plugin (this sglang has no --x)"]
    assert command._required(["gptoss/f*/*"], entries)["problems"] == []  # refused: it ran


# -- the final line ------------------------------------------------------------------------------


def test_the_final_line_counts_every_state():
    kinds = [judging.OK] * 3 + [judging.WRONG, judging.LOW_ACCEPT, judging.NO_SPECULATION, judging.FIX_NOT_APPLIED,
                                judging.RANKS, judging.EXCUSED, judging.EXCUSED, judging.REFUSED, judging.NOT_RUN,
                                judging.STOCK, judging.DID_NOT_START]
    report = {"ok": False, "rows": {f"r{i}": {"kind": k} for i, k in enumerate(kinds)},
              "required": {"missing": ["gemma4/*"], "not_run": ["x"]},
              "targets": {"gemma4": {"available": False}, "gptoss": {"available": True}}}
    assert command.summary(report) == (
        "FAILED: 3 served OK; 1 wrong tokens; 1 low accept; 1 no speculation; 1 fix not applied; 1 ranks disagree; "
        "1 did not start; 2 excused (sglang's own failure); 1 refused by sglang; 1 not run; 1 stock; "
        "2 missing required; 1 target(s) not available")
    ok = {"ok": True, "rows": {"a": {"kind": judging.OK}, "b": {"kind": judging.EXCUSED}}, "targets": {}}
    assert command.summary(ok) == ("OK: 1 plugin row(s) gave the model's tokens on every request, speculative ones at "
                                   "the expected acceptance; 1 excused (sglang's own failure)")


def test_a_stopped_row_names_its_exceptions_in_the_report():
    p = rows.Planned(rows.Row("gptoss", "fa3", "k1", True), ["--x"], None)
    res = _stopped(log(SCHED, RUNNER, BACKEND) + log(SCHED, exception="KeyError: 1"))
    e = command._row_entry(p, res, REF, command.Protocol(requests=4), needed=["x"])
    assert e["exceptions"] == ["KeyError at sglang/srt/managers/scheduler.py:run_scheduler_process",
                               "RuntimeError at sglang/srt/layers/attention/flashinfer_backend.py:forward_decode"], e
    assert (e["kind"], e["failed"], e["result"]) == (judging.DID_NOT_START, True, "DID NOT START: RuntimeError: boom")
