"""The skips each test declares, per release: a run whose skips go beyond these fails
(tests/conftest.py), so a release cannot quietly turn a test into a skip.

``EXPECTED`` maps a test (``file::function``, its parameters left out, or one parametrized
id ``file::function[id]``) to where it may skip: a comma list of releases ("0.5.10"),
ranges ("0.5.10-0.5.15", "0.5.16+"), the releases where a fix's record ("Status by release")
says or does not say a status ("swa_graph_padding!=applied", "frozen_kv_views==not applicable";
"{param}" stands for the test's parameter id, a fix's name),
main-window snapshots ("S1", "S1-S4": nox -s mainwindow), "release" (every release, no
snapshot) or "all". A test not listed may skip nowhere. A
session that sees an undeclared skip prints each one with the line that would declare it,
and pytest exits non-zero. Tests marked ``gpu`` are not held to this (they skip on every
CPU machine and nox deselects them).

To see a run's skips: ``SGLANG_SWA_SKIPS_OUT=skips.jsonl nox -s "tests(0.5.12)"`` (one JSON
line per skip: release, test, reason; and one with test null per run).
``python tests/expected_skips.py skips.jsonl`` prints the EXPECTED those skips make (a release
observed stands for the releases up to the next one observed: the releases outside
noxfile.CI_VERSIONS have the statuses of the one before them).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Optional

EXPECTED = {
    # sglang's plugin framework (0.5.11+) or the start-up hook (0.5.10)
    "test_autoload.py::test_spawned_process_gets_the_fixes_without_any_import_of_ours": "0.5.11+",
    "test_autoload.py::test_startup_hook_honours_the_off_switch": "0.5.11+",
    "test_autoload.py::test_a_plugin_that_cannot_load_never_breaks_the_model_runner_import": "0.5.11+",
    "test_foundation.py::test_doctor_says_no_plugin_framework": "0.5.11+",
    "test_autoload.py::test_startup_hook_is_inert_where_sglang_has_plugins_and_entry_point_loads_once": "0.5.10",
    "test_doctor.py::test_sglang_plugins_without_us_is_a_problem": "0.5.10",
    "test_foundation.py::test_load_plugins_runs_plugin_and_logs_one_line_per_fix": "0.5.10",
    "test_foundation.py::test_sglang_plugins_naming_something_else_keeps_plugin_out": "0.5.10",
    "test_foundation.py::test_sglang_plugins_naming_us_selects_us": "0.5.10",
    "test_foundation.py::test_disabled_installs_nothing": "0.5.10",
    "test_foundation.py::test_loading_twice_hooks_each_target_once": "0.5.10",
    "test_registration.py::test_a_shared_target_is_one_registration_on_sglangs_registry_running_every_fix_in_order": "0.5.10",
    "test_foundation.py::test_third_party_fix_is_found_applied_and_runs": "0.5.10",
    "test_foundation.py::test_moved_target_is_skipped_with_one_warning_naming_it": "0.5.10",
    "test_foundation.py::test_strict_mode_stops_startup_naming_the_fix": "0.5.10",
    "test_foundation.py::test_strict_mode_passes_through_when_all_is_well": "0.5.10",
    "test_runtime_split.py::test_load_plugins_imports_no_check_module": "0.5.10",
    "test_runtime_split.py::test_loaded_modules_carry_no_scenario_code": "0.5.10",
    "test_runtime_split.py::test_load_plugins_statuses_are_the_detections": "0.5.10",
    "test_verified_status.py::test_a_hook_sglang_fails_to_apply_is_logged_skipped_not_applied": "0.5.10",
    "test_verified_status.py::test_strict_mode_stops_startup_when_sglang_failed_to_apply_a_hook": "0.5.10",
    "test_verified_status.py::test_doctor_reports_the_same_verified_status": "0.5.10",
    # the main-window tests run on the snapshots (nox -s mainwindow)
    "test_main_window.py::test_the_session_runs_on_the_snapshot_it_installed": "release",
    "test_main_window.py::test_each_listed_bug_is_needed_shown_and_corrected": "release",
    "test_main_window.py::test_every_fix_is_decided_on_the_snapshot": "release",
    "test_frozen_kv_views.py::test_seed_003_root_cause_on_main_is_corrected": "release, S2, S3",
    "test_trtllm_swa_pool.py::test_form_from_main_is_detected_and_corrected": "release, S3",
    "test_trtllm_extend_routing.py::test_24566_is_detected_and_corrected": "release, S1, S2, S4",
    "test_trtllm_extend_routing.py::test_released_routing_is_left_alone": "S3",
    # where a fix's record says it is not needed or not applicable
    "test_fa3_spec_translate.py::test_graph_path_translates_into_kept_tables_as_the_eager_path_does":
        "fa3_spec_translate!=applied, S1, S2, S4",
    "test_flashinfer_swa_prefill.py::test_stock_sliding_layers_prefill_over_the_whole_prompt": "flashinfer_swa_prefill!=applied",
    "test_flashinfer_swa_prefill.py::test_stock_cached_prefix_reads_unwritten_keys_where_sglang_lacks_26513": "0.5.13+",
    "test_flashinfer_swa_prefill.py::test_detection_hooks_the_paged_plan_exactly_where_sglang_plans_it_without_the_window":
        "0.5.16+",
    "test_flashinfer_swa_prefill.py::test_a_subclass_with_its_own_prefill_gets_no_twin": "flashinfer_swa_prefill!=applied",
    "test_frozen_kv_views.py::test_not_needed_with_the_trtllm_swa_pool_fix_installed": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_check_shows_the_bug_where_the_code_has_it": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_inside_each_view_the_swa_state_follows_the_pool": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_state_is_restored_when_the_body_raises": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_nested_views_restore_each_level": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_worker_modules_call_the_wrapped_views": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_real_graph_runner_allocates_binds_and_replays_the_swa_page_table":
        "frozen_kv_views==not applicable, 0.5.14+, S3",
    "test_frozen_kv_views.py::test_installs_through_sglangs_hook_registry": "frozen_kv_views==not applicable, S3",
    "test_frozen_kv_views.py::test_per_step_cost_is_attribute_swaps_only": "frozen_kv_views==not applicable, S3",
    "test_gemma4_window.py::test_stock_sliding_layers_attend_one_key_more_than_the_model": "gemma4_window!=applied",
    "test_gemma4_window.py::test_every_layer_attends_the_models_keys_with_the_fix": "gemma4_window==not applicable",
    "test_mimo_v2_window.py::test_stock_sliding_layers_and_the_runner_attend_one_key_more_than_the_model":
        "mimo_v2_window!=applied",
    "test_mimo_v2_window.py::test_every_layer_and_the_runner_attend_the_models_keys_with_the_fix":
        "mimo_v2_window==not applicable",
    "test_mle_hidden_pool.py::test_the_scenario_shows_the_missing_row_on_stock_and_every_row_with_the_fix":
        "mle_hidden_pool!=applied",
    "test_one_pool_draft_extend.py::test_the_scenario_shows_the_crash_on_stock_and_the_answer_with_the_fix":
        "one_pool_draft_extend!=applied",
    "test_swa_graph_padding.py::test_stock_sglang_keeps_stale_swa_slots_in_padded_rows_where_detection_says_needed":
        "swa_graph_padding!=applied",
    "test_swa_graph_padding.py::test_padded_rows_hold_the_padding_slot_with_the_fix_or_upstream_fix":
        "swa_graph_padding==not applicable",
    "test_swa_graph_padding.py::test_unpadded_replays_are_left_alone": "swa_graph_padding==not applicable",
    "test_swa_graph_padding.py::test_repeated_padded_replays_clear_every_tail_and_a_replaced_buffer":
        "swa_graph_padding!=applied",
    "test_swa_one_chunked_prefill.py::test_the_fix_leaves_one_cut_request_and_it_is_tracked":
        "swa_one_chunked_prefill!=applied",
    "test_swa_one_chunked_prefill.py::test_the_waiting_request_keeps_its_state": "swa_one_chunked_prefill!=applied",
    # swa_write_loc: the batch form (ForwardBatch.out_cache_loc_swa: 0.5.10-0.5.12, S1, S3), else the metadata form
    "test_swa_write_loc.py::test_stock_draft_steps_write_through_all_steps_locations": "0.5.13+, S2, S4",
    "test_swa_write_loc.py::test_the_fix_writes_each_step_at_its_own_swa_slots": "0.5.13+, S2, S4",
    "test_swa_write_loc.py::test_stock_draft_steps_hold_the_whole_batchs_locations": "0.5.10-0.5.12, 0.5.23+, S1, S3",
    "test_swa_write_loc.py::test_the_fix_gives_each_draft_step_its_own_locations": "0.5.10-0.5.12, 0.5.23+, S1, S3",
    "test_triton_local_attn.py::test_stock_chunked_layer_attends_past_its_chunk_through_full_pool_ids":
        "triton_local_attn!=applied",
    "test_triton_local_attn.py::test_the_fix_gives_each_query_its_own_chunk": "triton_local_attn!=applied",
    "test_triton_local_attn.py::test_a_tree_verify_reads_its_chunk_and_a_chain_past_the_chunk_is_named_once":
        "triton_local_attn!=applied",
    "test_triton_local_attn.py::test_each_query_attends_its_chunk_through_sglangs_kernels": "triton_local_attn!=applied",
    "test_triton_local_attn.py::test_the_tree_rail_replays_from_the_batch_buffers_without_a_sync":
        "triton_local_attn!=applied",
    "test_triton_one_pool_window.py::test_stock_triton_on_one_pool_has_no_window": "triton_one_pool_window!=applied",
    "test_triton_one_pool_window.py::test_the_fix_gives_the_backend_the_models_window_and_buffers":
        "triton_one_pool_window==not applicable",
    "test_triton_one_pool_window.py::test_it_composes_with_triton_swa_window":
        "triton_one_pool_window!=applied, triton_swa_window!=applied",
    "test_triton_one_pool_window.py::test_check_runs_the_scenario_without_and_with_the_fix":
        "triton_one_pool_window!=applied",
    "test_triton_swa_draft.py::test_capture_after_a_larger_batch_stays_in_range": "triton_swa_draft!=applied",
    "test_triton_swa_tree_verify.py::test_the_recorded_kernel_call_windows_drafts_by_row_stock_and_by_position_fixed":
        "triton_swa_tree_verify!=applied",
    "test_triton_swa_tree_verify.py::test_a_deterministic_verify_is_the_models_attention_through_sglangs_kernel":
        "triton_swa_tree_verify!=applied",
    "test_triton_swa_tree_verify.py::test_a_tree_verify_is_the_models_attention_through_sglangs_kernel":
        "triton_swa_tree_verify!=applied",
    "test_triton_swa_tree_verify.py::test_the_window_rail_replays_from_the_batch_buffers_without_a_sync":
        "triton_swa_tree_verify!=applied",
    "test_triton_swa_window.py::test_stock_triton_decode_attends_one_key_less_than_the_window_rule":
        "triton_swa_window!=applied",
    "test_triton_swa_window.py::test_decode_attends_window_plus_one_keys_eager_and_in_graphs_with_the_fix":
        "triton_swa_window==not applicable",
    "test_triton_swa_window.py::test_decode_is_the_models_attention_through_sglangs_kernel": "triton_swa_window!=applied",
    "test_trtllm_swa_pool.py::test_resolver_probe_tells_the_final_rule": "0.5.10-0.5.12, S1, S3, S2, S4",
    "test_trtllm_swa_pool.py::test_stock_allocator_form_gives_the_eagle_draft_the_wrong_pool":
        "trtllm_swa_pool!=applied, S1, S2, S4",
    "test_trtllm_swa_pool.py::test_mtp_draft_with_its_own_swa_pool": "0.5.13+, S2, S1, S4",
    "test_trtllm_swa_pool.py::test_install_touches_only_the_constructor": "trtllm_swa_pool!=applied",
    "test_trtllm_swa_pool.py::test_real_loading_path": "0.5.10, trtllm_swa_pool!=applied",
    "test_trtllm_xqa_dense_query.py::test_without_the_fix_batched_requests_read_other_rows_as_their_query":
        "trtllm_xqa_dense_query!=applied",
    "test_trtllm_xqa_dense_query.py::test_with_the_fix_every_single_token_xqa_call_gets_the_models_query_dense":
        "trtllm_xqa_dense_query!=applied",
    "test_trtllm_xqa_dense_query.py::test_on_blackwell_the_fix_changes_nothing": "trtllm_xqa_dense_query!=applied",
    "test_trtllm_xqa_dense_query.py::test_under_a_cuda_graph_the_copy_is_part_of_the_captured_pass":
        "trtllm_xqa_dense_query!=applied",
    "test_trtllm_xqa_spec_decode.py::test_the_scenario_runs_the_releases_own_mask": "0.5.10-0.5.21, S1-S4",
    "test_trtllm_xqa_spec_decode.py::test_without_the_fix_xqa_gets_what_it_refuses": "trtllm_xqa_spec_decode!=applied",
    "test_trtllm_xqa_spec_decode.py::test_with_the_fix_every_multi_token_call_gets_bf16_and_the_causal_mask":
        "trtllm_xqa_spec_decode!=applied",
    "test_trtllm_xqa_spec_decode.py::test_on_blackwell_the_fix_changes_nothing": "trtllm_xqa_spec_decode!=applied",
    "test_xqa_graph_replay.py::test_every_replay_gets_the_current_requests_windowed_rows": "release",
    "test_xqa_graph_replay.py::test_the_emulated_graph_replays_sglangs_own_buffers": "trtllm_xqa_spec_decode!=applied",
    # each other fix's scenario under the guard: not where that fix's feature is absent
    "test_swa_index_guard.py::test_trtllm_swa_kv_write_location_checked_and_passes": "0.5.10",
    "test_swa_index_guard.py::test_trtllm_full_pool_kv_write_location_raises_named_error": "0.5.10",
    "test_step3p5_window.py::test_stock_sliding_layers_and_the_runner_attend_one_key_more_than_the_model":
        "step3p5_window!=applied",
    "test_step3p5_window.py::test_every_layer_and_the_runner_attend_the_models_keys_with_the_fix":
        "step3p5_window==not applicable",
    # the selftest's targets: a model this sglang does not have
    "test_selftest.py::test_a_target_gives_the_pinned_tokens_in_bf16_too_and_sees_its_window[gemma4]":
        "gemma4_window==not applicable",
    "test_selftest.py::test_a_saved_target_holds_the_weights_of_its_reference[gemma4]": "gemma4_window==not applicable",
    # what transformers the release pins: MiMo-V2-Flash and Step3.7 from transformers 5.19
    "test_mimo_v2_target.py::test_bf16_equals_float32_and_the_window_decides": "0.5.10-0.5.22",
    "test_mimo_v2_target.py::test_own_forward_is_transformers_forward": "0.5.10-0.5.22",
    "test_mimo_v2_target.py::test_mtp_predicts_the_token_after_next": "0.5.10-0.5.22",
    "test_mimo_v2_target.py::test_checkpoint_loads_into_sglangs_models": "0.5.10-0.5.22",
    "test_step3p5_target.py::test_own_forward_is_transformers_forward": "0.5.10-0.5.22",
    "test_step3p5_target.py::test_the_reference_is_transformers_step3p5_model_type": "0.5.10-0.5.22",
    # the selftest's Gemma 4 target: sglang's Gemma4ForCausalLM from 0.5.11
    "test_targets.py::test_a_target_passes_every_check_and_gives_its_pinned_tokens[gemma4]": "gemma4_window==not applicable",
    # observed skips of the release runs (python tests/expected_skips.py skips.jsonl)
    'test_fa3_local_attn_pages.py::test_graph_decode_chunks_read_their_own_tokens_from_the_swa_pool': '0.5.13+',
    'test_fa3_local_attn_pages.py::test_without_the_fix_the_chunked_layers_read_other_tokens': '0.5.13+',
    'test_fa3_local_attn_verify.py::test_check_scenario_reproduces_and_the_fix_corrects_it': '0.5.16+',
    'test_fa3_local_attn_verify.py::test_graph_verify_chunked_layers_read_their_own_chunk_from_the_swa_pool': '0.5.16+',
    'test_fa3_local_attn_verify.py::test_graph_verify_padded_batch_and_a_second_replay': '0.5.16+',
    'test_fa3_local_attn_verify.py::test_without_the_fix_graph_verify_reads_other_kv': '0.5.16+',
    'test_mle_hidden_pool.py::test_the_scenario_is_right_where_sglang_sizes_the_pool_itself': 'mle_hidden_pool==applied, 0.5.14+',
    'test_swa_index_guard.py::test_guard_passes_every_scenario_the_other_fixes_make_correct': '{param}==not applicable, 0.5.10-0.5.11, 0.5.13+',
    'test_swa_one_chunked_prefill.py::test_stock_cuts_two_requests_in_one_pass_and_tracks_only_the_last': 'swa_one_chunked_prefill!=applied, 0.5.10-0.5.21',
    'test_swa_write_loc.py::test_a_batch_with_the_locations_it_was_translated_from_keeps_init_news_tensor': '0.5.13+',
    'test_swa_write_loc.py::test_fa3_steps_of_a_topk_above_one_or_outside_a_draft_are_left_to_sglang': '0.5.10-0.5.12, 0.5.22+, S1, S3',
    'test_swa_write_loc.py::test_new_locations_of_the_same_length_are_translated_again': '0.5.13+',
    'test_testbed.py::test_trtllm_forward_metadata_translates_swa_layers': '0.5.14+',
    'test_triton_swa_draft.py::test_sliding_layer_gets_its_window_in_swa_space': 'triton_swa_draft!=applied, 0.5.14+',
    'test_triton_swa_draft.py::test_without_the_fix_the_sliding_layer_gets_no_window': 'triton_swa_draft!=applied, 0.5.14+',
    'test_triton_swa_window.py::test_extend_prefix_rail_keeps_its_offsets_consistent': 'triton_swa_window!=applied, 0.5.22+',
    'test_trtllm_swa_pool.py::test_swa_layers_get_indices_of_the_resolved_pool': '0.5.14+',
    # skips on the main-window snapshots (their runs)
    "test_trtllm_extend_routing.py::test_query_dtype_reaching_the_decode_kernel_on_xqa_with_fp8_kv": "S1, S2, S3, S4",
}


def _release(text: str) -> tuple:
    return tuple(int(p) for p in text.split("."))


def record_status(fix: str, release: str) -> str:
    """``fix``'s status on ``release`` by its record (a release past the records: the last)."""
    from test_records import LAST_RELEASE, record_statuses

    *series, micro = _release(release)
    if series != [0, 5] or micro < 10:
        return ""
    return record_statuses(f"sglang_swa_plugin.hooks.{fix}")[min(micro, LAST_RELEASE)]


def declared(spec: str, where: str) -> bool:
    """Whether ``spec`` (see the module docstring) includes ``where``: a release "0.5.12"
    or a main-window snapshot "S3"."""
    snapshot = re.fullmatch(r"S(\d+)", where)
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all" or (part == "release" and not snapshot):
            return True
        by_record = re.fullmatch(r"(\w+)\s*(==|!=)\s*(.+)", part)
        if by_record:
            if not snapshot and (record_status(by_record.group(1), where) == by_record.group(3)) == (
                    by_record.group(2) == "=="):
                return True
            continue
        if snapshot:
            m = re.fullmatch(r"S(\d+)(?:-S(\d+))?", part)
            if m and int(m.group(1)) <= int(snapshot.group(1)) <= int(m.group(2) or m.group(1)):
                return True
            continue
        m = re.fullmatch(r"(\d+\.\d+\.\d+)(\+|-(\d+\.\d+\.\d+))?", part)
        if not m:
            continue
        low, high = _release(m.group(1)), m.group(3)
        here = _release(where)
        if m.group(2) == "+":
            if here >= low:
                return True
        elif low <= here <= (_release(high) if high else low):
            return True
    return False


def base(nodeid: str) -> str:
    """``file::function`` of a node id: the tests/ prefix and the parameters left out."""
    nodeid = nodeid.split("[", 1)[0]
    return nodeid[len("tests/"):] if nodeid.startswith("tests/") else nodeid


def key(nodeid: str) -> str:
    """The node id as EXPECTED spells it: the tests/ prefix left out, the parameters kept."""
    return nodeid[len("tests/"):] if nodeid.startswith("tests/") else nodeid


def spec_for(nodeid: str) -> Optional[str]:
    """The declaration that holds for ``nodeid``: its own parametrized id's, else its function's."""
    return EXPECTED.get(key(nodeid), EXPECTED.get(base(nodeid)))


def undeclared(skips: list, where: str) -> list:
    """The (nodeid, reason) of ``skips`` that EXPECTED does not allow at ``where``; "{param}"
    in a declaration is the test's parameter id (a fix's name)."""
    return [(nodeid, reason) for nodeid, reason in skips
            if not declared((spec_for(nodeid) or "").replace("{param}", nodeid.partition("[")[2].rstrip("]")), where)]


def table(lines: list) -> dict:
    """EXPECTED from a run's skip lines ({"release", "test", "reason"}): each test's releases as
    ranges over the releases observed, its snapshots as a list."""
    seen, where = {}, {line["release"] for line in lines}  # a run without skips writes {"test": null}
    for line in lines:
        if line["test"]:
            seen.setdefault(base(line["test"]), set()).add(line["release"])
    observed = sorted((w for w in where if not w.startswith("S")), key=_release)
    out = {}
    for test, ws in sorted(seen.items()):
        parts, run = [], []
        for i, r in enumerate(observed):
            if r in ws:
                run.append(i)
            if run and (r not in ws or i == len(observed) - 1):
                first = observed[run[0]]
                if run[-1] == len(observed) - 1:
                    parts.append(f"{first}+")
                else:
                    upto = observed[run[-1] + 1].split(".")
                    end = ".".join(upto[:-1] + [str(int(upto[-1]) - 1)])
                    parts.append(first if end == first else f"{first}-{end}")
                run = []
        parts += sorted(w for w in ws if w.startswith("S"))
        out[test] = ", ".join(parts)
    return out


if __name__ == "__main__":
    rows = [json.loads(line) for path in sys.argv[1:] for line in open(path) if line.strip()]
    print("EXPECTED = {")
    for test, spec in table(rows).items():
        print(f"    {test!r}: {spec!r},")
    print("}")
