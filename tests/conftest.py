"""Fixtures shared by test modules (imports inside them: collecting any test must stay cheap)."""

from __future__ import annotations

import json

import pytest

LAB = "prefix-reuse-multi-turn"

# The slow tier: `make test` runs every test; `make check`, the edit-test loop, leaves these out (-m "not slow").
# Chosen from measured durations: `pytest -n 2 --durations=0` of the whole suite on 2026-12-06, on this project's
# 2-core machine while other work shared it, so the seconds run high. A test is slow when
# * its function is named in SLOW: its cases took 3 s or more together (the figure after each name), or
# * it needs a fixture named in SLOW_FIXTURES for its file: each took 10 s or more to build (a lab run, a training
#   run, a compiled kernel), and the fast tier should not build it for the one quick test that reads it.
# A file keeps its other tests in the fast tier, so that `make check` still reaches every package.
# tests/test_slow_tier.py checks that every name here still names a test or a fixture of its file.
SLOW = {
    "test_blas_matmul.py": (
        "test_a_few_train_steps_follow_the_reference_loss_curve",  # 24
        "test_train_step_gradients_match_the_reference_path",  # 11
    ),
    "test_blas_matvec.py": (
        "test_a_greedy_decode_selects_the_same_ids_and_logits_with_the_kernel_on_and_off",  # 23
        "test_one_row_through_an_output_major_matrix_matches_xla_and_float64_within_1e_5",  # 12
        "test_the_kernel_differentiates_and_vectorizes_as_xla_does",  # 4
        "test_without_a_compiler_one_row_keeps_xlas_dot_silently",  # 3
    ),
    "test_chat_template_sandbox.py": (
        "test_a_chat_template_computing_anything_renders_or_is_refused_naming_it_quickly",  # 17
        "test_the_templates_that_broke_it_are_refused_naming_the_reason",  # 6
    ),
    "test_cli_polish.py": (
        "test_a_closed_pipe_ends_quietly",  # 3
        "test_loading_and_running_a_model_imports_neither_flax_nor_orbax",  # 6
        "test_weights_are_read_without_orbax_as_orbax_restores_them",  # 5
    ),
    "test_command_start.py": (
        "test_a_signal_at_any_moment_of_start_up_ends_the_command_with_one_line",  # 31
    ),
    "test_demo.py": (
        "test_demo_explains_the_prompt_answers_runs_the_default_lab_and_writes_its_report",  # 38
    ),
    "test_engine.py": (
        "test_reuse_decisions_equal_kvsims",  # 8
        "test_serve_command_writes_the_measured_run",  # 30
    ),
    "test_experiments_run.py": (
        "test_cli_lists_shows_and_refuses_planned_labs",  # 5
    ),
    "test_experiments_sweep.py": (
        "test_engine_arms_are_measured_here_and_calibrated_kvsim_arms_simulated_in_workers",  # the engine serves
    ),
    "test_fused_decode.py": (
        "test_a_greedy_generation_selects_the_same_ids_with_the_fused_blocks_and_with_xlas",  # 40
        "test_its_rule_admits_one_float32_token_over_output_major_layers_only",  # 4
        "test_one_step_matches_xlas_blocks_within_1e_5",  # 111
        "test_without_a_compiler_decode_keeps_xlas_blocks_silently",  # 8
    ),
    "test_hf_export.py": (
        "test_jgpt_and_transformers_agree_within_1e5_in_float64",  # 49
        "test_transformers_loads_the_export_with_jgpts_logits",  # 31
    ),
    "test_hf_parity.py": (
        "test_cached_continuation_matches_transformers",  # 58
        "test_greedy_decode_matches_transformers_step_by_step",  # 174 with its fixtures (measured alone)
        "test_logits_match_transformers_up_to_the_full_context",  # 60
    ),
    "test_hf_tokenizers.py": (
        "test_any_hostile_foreign_tokenizer_or_config_loads_or_is_refused_naming_it",  # 22
        "test_generate_selects_the_ids_and_prints_the_text_of_transformers_generate",  # 42
        "test_prompt_logits_match_torch",  # 19
        "test_record_runs_a_workload_with_the_imported_tokenizer",  # 26
    ),
    "test_hostile_input.py": (
        "test_azure_trace_rows_of_any_shape_are_imported_or_refused_cleanly",  # 7
        "test_deep_or_non_finite_json_is_refused_naming_the_input",  # 48
        "test_every_record_kvsim_run_writes_can_be_viewed",  # 8
        "test_hostile_documents_are_accepted_or_refused_cleanly",  # 160
        "test_hostile_output_paths_are_refused_before_any_work",  # 67
        "test_import_trace_refuses_a_block_size_beyond_the_context",  # 4
        "test_lab_show_and_run_refuse_unknown_ids",  # 13
        "test_mooncake_traces_with_a_hostile_line_are_imported_or_refused_cleanly",  # 9
    ),
    "test_hostile_kvsim_report.py": (
        "test_calibrate_on_mutated_works_refuses_a_contradicting_wall_naming_the_work",  # 21
        "test_import_trace_writes_a_document_kvsim_accepts_or_refuses_writing_nothing",  # 7
    ),
    "test_hostile_model_io.py": (
        "test_a_signal_during_import_overwrite_leaves_one_whole_artifact_and_nothing_aside",  # 3
        "test_export_and_import_on_a_real_full_disk_end_in_one_line",  # 9
        "test_export_force_onto_a_directory_it_did_not_write_is_refused_and_nothing_is_deleted",  # 3
        "test_fuzz_export_hf_on_a_disk_that_fills_at_a_random_byte",  # 12
        "test_fuzz_export_hf_out_targets",  # 10
        "test_fuzz_import_hf_directories_with_links_fifos_and_directories_in_place_of_files",  # 7
        "test_fuzz_import_hf_on_a_real_disk_that_fills_at_a_random_byte",  # 526
        "test_training_on_a_disk_that_fills_leaves_no_temporary_checkpoint",  # 31
        "test_training_on_a_real_full_disk_ends_in_one_line_and_leaves_no_temporary_checkpoint",  # 20
    ),
    "test_hostile_surfaces.py": (
        "test_a_coordinator_outside_any_cluster_without_a_process_layout_is_refused_naming_it",  # 5
        "test_a_hostile_calibrated_service_with_a_spread_runs_and_replays_or_is_refused_cleanly",  # 12
        "test_a_launcher_environment_jax_cannot_start_in_is_one_line_naming_the_variable",  # 23
        "test_a_streamed_record_with_a_hostile_line_is_read_or_refused_cleanly",  # 32
    ),
    "test_hostile_system.py": (
        "test_a_workload_budget_past_int32_is_refused_naming_the_request",  # 3
        "test_train_never_writes_into_a_directory_holding_other_files",  # 7
    ),
    "test_hostile_templates.py": (
        "test_any_text_encodes_or_is_refused_naming_it",  # 9
        "test_each_bypass_of_the_old_checks_is_refused_at_load_within_the_bounds",  # 27
        "test_fuzz_a_tokenizer_regex_loads_and_encodes_or_is_refused",  # 58
        "test_fuzz_any_risky_template_renders_within_the_limit_or_is_refused",  # 69
        "test_import_hf_refuses_a_template_that_cannot_frame_a_conversation_writing_nothing",  # 10
        "test_the_sandbox_process_is_reused_and_replaced_after_it_was_ended",  # 9
    ),
    "test_incremental_decoder.py": (
        "test_the_text_given_out_is_the_whole_decode_after_every_group_of_ids",  # 5: 300 examples, four tokenizers
    ),
    "test_import_hardening.py": (
        "test_catalog_any_hostile_catalog_is_listed_or_refused_naming_a_catalog_field",  # 11
        "test_import_hf_any_hostile_config_is_refused_cleanly_or_imports",  # 22
        "test_import_hf_refuses_a_config_size_that_is_not_a_size_naming_it",  # 5
        "test_import_hf_refuses_weights_that_are_not_finite_naming_the_tensor",  # 4
        "test_manifest_any_hostile_resealed_manifest_is_refused_naming_a_manifest_field",  # 17
        "test_tokenizer_files_any_hostile_one_loads_or_is_refused_naming_tokenizer",  # 9
    ),
    "test_inference.py": (
        "test_a_snapshot_continued_twice_stays_valid_and_both_continuations_are_exact",  # 24
        "test_a_state_that_is_not_a_prefix_is_not_reused",  # 4
        "test_cached_decode_matches_full_prefix_recompute_at_every_step",  # 86
        "test_decode_refuses_unknown_ids_and_a_full_context",  # 5
        "test_loop_and_step_timing_select_the_same_ids",  # 11
        "test_observing_a_step_records_every_operation_of_that_step",  # 9
        "test_prefix_reuse_processes_only_new_positions_and_matches_a_fresh_run",  # 54
        "test_rows_stop_at_their_own_budget_and_at_context_capacity",  # 12
    ),
    "test_inference_record.py": (
        "test_generate_cli_json_and_plain",  # 31
        "test_generate_refuses_an_observe_step_the_generation_never_reached",  # 12
        "test_jaxpr_matmul_flops_of_a_decode_equal_the_recorded_count",  # 6
    ),
    "test_interruption.py": (
        "test_a_sigterm_whose_exception_is_swallowed_still_ends_the_command",  # 9
        "test_sigterm_cleanup_of_an_artifact_save_removes_its_staging",  # 10
        "test_sigterm_cleanup_of_kvsim_run_leaves_no_temporary_record",  # 13
    ),
    "test_kernel_cache.py": (
        "test_kernel_cache_fuzz_loads_only_a_verified_library_of_this_users_own",  # 10
    ),
    "test_kernel_plan.py": (
        "test_each_kernel_matches_the_xla_plan_here_and_the_reference_runs_where_it_is_unavailable",  # 131
        "test_the_reference_computation_loads_no_kernel_module_even_indirectly",  # 4
        "test_with_the_kernels_unavailable_auto_is_the_xla_plan_and_an_execution_computes_its_results",  # 8
    ),
    "test_kvsim_calibration.py": (
        "test_a_spread_draws_each_work_from_its_quantiles_and_replays_byte_for_byte",  # 3
        "test_calibrate_and_predict_commands",  # 6
        "test_calibration_recovers_a_known_spread",  # 3
        "test_calibration_recovers_the_finish_term",  # 11
        "test_calibration_recovers_the_service_that_produced_the_works",  # 4
        "test_calibration_recovers_the_work_after_another_and_the_finish_per_slot",  # 4
        "test_hostile_measured_runs_and_fragments_are_accepted_or_refused_cleanly",  # 30
        "test_predict_reports_the_median_over_seeds_and_writes_one_seeds_run",  # 6
    ),
    "test_kvsim_analytic.py": (
        "test_analytic_counts_equal_what_jgpt_record_counts",  # 140 (records with a compiled model, four times)
        "test_the_recorders_costs_are_the_analytic_models_at_every_position",  # 15
    ),
    "test_kvsim_model.py": (
        "test_continuous_batching_reads_weights_once_per_step",  # 3
    ),
    "test_kvsim_properties.py": (
        "test_invariants_hold_at_every_event",  # 13
        "test_lookups_durations_and_resources_follow_the_rules",  # 13
        "test_runs_are_deterministic_and_replay_byte_identical",  # 6
    ),
    "test_kvsim_streamed.py": (
        "test_a_cut_or_corrupted_streamed_record_is_refused_naming_a_line",  # 4
        "test_a_streamed_run_keeps_next_to_nothing_per_finished_request",  # 15
        "test_perfetto_has_counter_tracks_instants_and_the_compute_slices",  # 8
        "test_replay_of_a_streamed_document_reads_its_requests_without_holding_them",  # 54
        "test_the_collector_is_paused_in_a_run_and_left_as_it_was",  # 20
        "test_the_fast_encoder_writes_what_json_writes",  # 5
    ),
    "test_lab_answer.py": ("test_the_arms_figure_labels_do_not_overlap",),  # 8: 2, 6 and 17 arms drawn
    "test_layer_view_memory.py": (
        "test_an_execution_holds_its_weights_once_in_the_output_major_layout",  # 10
        "test_odd_widths_keep_one_copy_and_read_the_unaligned_layers_from_the_stacked_tensors",  # 13
        "test_tensor_parallel_weights_are_held_once",  # 10
    ),
    "test_mesh_sharding.py": (
        "test_a_model_axis_that_does_not_divide_the_devices_is_refused",  # 8
        "test_training_command_on_a_mesh_follows_one_device",  # 127
    ),
    "test_model.py": (
        "ForwardBoundaryTest::test_bfloat16_keeps_float32_logits_close_to_float32__with_jit",  # 20
        "ForwardBoundaryTest::test_bfloat16_keeps_float32_logits_close_to_float32__without_jit",  # 16
        "ForwardBoundaryTest::test_shapes_and_dtypes__with_jit",  # 6
        "ForwardBoundaryTest::test_shapes_and_dtypes__without_jit",  # 10
        "test_changing_token_t_never_changes_earlier_logits",  # 13
        "test_every_layer_strategy_gives_the_rolled_scans_logits_cache_and_observations",  # 73
        "test_initialization_is_seeded_and_fits_the_architecture",  # 6
        "test_logits_at_projects_only_each_rows_chosen_token",  # 11
        "test_observations_name_each_operation_with_layer_and_positions",  # 12
        "test_prefill_then_continuation_through_the_cache_equals_one_full_pass",  # 53
        "test_rows_at_different_positions_share_one_cached_call",  # 11
        "test_walkthrough_stages_are_owned_by_admitted_concepts_and_inspect_real_observations",  # 11
    ),
    "test_multiprocess.py": (
        "test_jgpt_train_over_two_processes_writes_one_run_reaches_one_process_weights_and_resumes",  # 230
        "test_two_processes_train_the_same_steps_to_the_same_weights_as_one",  # 104
    ),
    "test_output_major.py": (
        "test_an_output_major_product_is_x_at_w_within_1e_5",  # 19
        "test_output_major_weights_hold_every_projection_and_the_lm_head_transposed_in_place_of_the_stored",  # 10
    ),
    "test_precision.py": (
        "test_a_bf16_train_step_keeps_f32_master_weights_and_follows_the_f32_loss",  # 80
        "test_bf16_logits_are_within_the_stated_tolerance_of_f32_and_select_the_same_ids",  # 23
        "test_bf16_matmuls_as_rounded_f32_operands_match_native_bf16_on_logits_and_train_steps",  # 139
        "test_kv_bytes_in_evidence_and_in_the_recorded_document_follow_the_precision",  # 45
    ),
    "test_process_settings.py": (
        "test_the_jgpt_command_restarts_into_them_and_a_plain_interpreter_has_none",  # 10
    ),
    "test_resource_bounds.py": (
        "test_65536_active_requests_are_refused_naming_the_slot_count_and_bytes",  # 30
        "test_a_budget_past_the_context_is_clamped_to_it",  # 73
        "test_a_pool_that_retains_nothing_leaves_the_slot_state_alone",  # 31
        "test_as_fast_as_possible_does_not_wait_for_a_cancel_a_day_away",  # 36
        "test_fuzz_generate_numeric_flags",  # 43
        "test_fuzz_serve_extreme_times_and_system_numbers",  # 127
        "test_the_issue_commands_complete_with_the_budget_of_the_context",  # 75
    ),
    "test_sampling.py": (
        "test_a_request_draws_the_same_ids_alone_in_a_batch_and_step_by_step",  # 71
        "test_a_sampled_selection_records_its_candidates_and_key",  # 11
        "test_temperature_zero_is_greedy_and_near_zero_draws_greedy_ids",  # 8
        "test_ten_thousand_draws_follow_the_filtered_distribution",  # 9
        "test_the_engine_draws_what_generate_draws",  # 57
        "test_top_k_keeps_ties_at_its_boundary",  # 6
    ),
    "test_schemas.py": (
        "test_a_measured_run_and_its_recorded_computations_validate",  # 18
        "test_example_documents_validate",  # 3
    ),
    "test_speculative.py": (
        "test_generate_command_samples_speculatively_with_the_shipped_draft",  # 18
        "test_lookup_drafts_what_followed_the_latest_longest_match",  # 11
        "test_prompt_lookup_ids_equal_greedy_and_it_accepts_a_repeating_reply",  # 22
        "test_rollback_is_the_verified_state_with_a_shorter_length",  # 25
        "test_speculative_ids_equal_greedy_batched_rows_with_different_acceptance",  # 130
        "test_speculative_ids_equal_greedy_on_a_gpt_architecture_and_at_the_context_limit",  # 39
        "test_speculative_ids_equal_greedy_on_an_imported_hugging_face_model",  # 28
        "test_speculative_ids_equal_greedy_with_a_stop_inside_an_accepted_round",  # 32
        "test_speculative_on_the_shipped_chat_model_with_its_draft",  # 23
        "test_speculative_sampling_as_temperature_goes_to_zero_selects_greedys_ids",  # 32
        "test_speculative_sampling_draws_follow_the_targets_filtered_distribution",  # 24
        "test_speculative_sampling_with_the_targets_weights_draws_plain_samplings_ids",  # 57
    ),
    "test_tokenizer.py": (
        "test_bpe_and_pure_bytes_agree_on_round_trips",  # 10
        "test_decoding_a_turn_returns_its_nfc_text",  # 11
        "test_every_id_is_in_the_vocabulary_and_text_never_yields_controls",  # 11
        "test_hf_applies_merges_like_an_independent_reference_bpe",  # 3
        "test_spans_tile_the_normalized_input_and_the_ids",  # 11
        "test_standard_hf_loading_of_the_saved_files_gives_the_same_ids",  # 7
        "test_unfinished_generation_holds_back_a_valid_prefix_without_a_note",  # 9
    ),
    "test_training_checkpoint.py": (
        "test_the_default_model_carries_the_provenance_of_the_documented_command",  # 21
    ),
    "test_training_corpus.py": (
        "test_a_batch_is_a_function_of_the_step_and_stream_windows_are_contiguous",  # 3
    ),
    "test_training_finetune.py": (
        "test_an_imported_gpt2_fine_tunes_on_a_text_but_not_on_the_conversations",  # 60: imports, then trains
        "test_the_shipped_model_fine_tunes_on_a_text_from_its_own_loss",  # 40: a 1.1M-parameter train step
    ),
    "test_training_optimizer.py": (
        "test_decay_applies_to_matrices_only_not_biases_norms_or_embeddings",  # 5
        "test_one_run_of_updates_matches_the_reference",  # 7
    ),
    "test_training_recipe.py": (
        "test_the_first_steps_of_the_shipped_recipe_reproduce_bit_for_bit",  # 68
    ),
    "test_training_run.py": (
        "test_blas_kernels_on_several_devices_are_refused",  # 11
    ),
    "test_training_step_attention.py": (
        "test_attention_weights_are_zero_past_each_query",  # 12
        "test_loss_and_gradients_match_the_full_attention",  # 145
        "test_train_steps_follow_the_full_attention",  # 34
    ),
    "test_wheel.py": (
        "test_the_installed_wheel_works_outside_the_checkout",  # 33
        "test_the_wheel_holds_every_module_kernel_source_header_and_shipped_model",  # 6
    ),
}

SLOW_FIXTURES = {  # the seconds its first user waited for it
    "test_cli_polish.py": ("lab_run",),  # 54: a lab run by a tiny model (tests/conftest.py), one per process
    "test_engine.py": ("mixed",),  # 34: the engine serving a mixed workload
    "test_experiments_engine.py": ("fidelity", "lab_run"),  # 30: the kvsim-fidelity lab run
    "test_experiments_run.py": ("runs",),  # 33: every runnable lab run
    "test_experiments_sweep.py": ("serial",),  # a 12-arm lab recorded by a tiny model and run serially
    "test_hostile_kvsim_report.py": ("lab_run",),
    "test_hostile_surfaces.py": ("long_input",),  # 14: a 12000-request kvsim input
    "test_hostile_system.py": ("lab_run",),
    "test_http_endpoint.py": ("launched",),  # 48: a `jgpt serve --http` process and the references it is held to
    "test_inference_record.py": ("document",),  # 30: a recorded workload
    "test_interruption.py": ("training",),  # 42: a training run
    "test_kernel_cache.py": ("real_cache",),  # 17: the real one-row kernel compiled into a cache
    "test_lab_kernels.py": ("runs",),  # 72: a lab run under two kernel plans
    "test_mesh_sharding.py": ("measured",),  # 117: a subprocess measuring meshes of 8 devices
    "test_prompt_format.py": ("plain_model", "imported"),  # 60: a model trained with --data; 20: an import-hf
    "test_record_integrity.py": ("lab_run",),
    "test_report_injection.py": ("lab_run",),
    "test_reuse_rule.py": ("workload",),  # 17: a workload recorded by the shipped model
    "test_speculative_lab.py": ("sweep",),  # 79: the speculative lab's sweep
    "test_training_finetune.py": ("fine_tuned", "finished"),  # 60, 25: fine-tuning runs, a run to extend
    "test_training_run.py": ("uninterrupted",),  # 35: a training run
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        function = item.nodeid.split("::", 1)[1].split("[")[0]
        needs = set(item.fixturenames) & set(SLOW_FIXTURES.get(item.path.name, ()))
        if function in SLOW.get(item.path.name, ()) or needs:
            item.add_marker(pytest.mark.slow)


def tiny_model(directory, seed: int):
    """A random-weight 2-layer model saved as an artifact under `directory`, with the bytes-only tokenizer."""
    from jgpt.artifacts.artifact import save_artifact
    from jgpt.model.architecture import ModelArchitecture
    from jgpt.model.weights import initialize
    from jgpt.tokenizers.tokenizer import Tokenizer

    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=128, layers=2, heads=2)
    weights, provenance = initialize(architecture, seed=seed)
    return save_artifact(directory / "tiny", architecture, weights, provenance, Tokenizer.bytes_only())


def lab_defaults(model, max_new_tokens: int):
    """The labs' generation defaults with `model` as the model and a short output budget."""
    from experiments.generation_defaults import DEFAULTS, GenerationDefaults

    document = json.loads(DEFAULTS.read_text())
    for setting in document["execution"]:
        if setting["control"] == "model.model_id":
            setting["value"] = str(model.path)
        if setting["control"] == "generation.max_new_tokens":
            setting["value"] = max_new_tokens
    return GenerationDefaults.from_json(document)


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory):
    """One lab run by a tiny random-weight model, without report or plots (tests copy it before changing it)."""
    from experiments.experiment_design import default_catalog
    from experiments.experiment_execution import run_lab

    defaults = lab_defaults(tiny_model(tmp_path_factory.mktemp("model"), seed=1), max_new_tokens=4)
    return run_lab(
        default_catalog().lab(LAB), tmp_path_factory.mktemp("lab") / LAB, report=False, plots=False, defaults=defaults
    )
