"""The names v0.5 environment code imports from `nemo_gym.*` (spec sections 14 and 15, plus the ones sections 6,
7, 9, 11 and 13 name), each at its v0.5 module path. Names that are not in the tree yet are listed in
`NOT_YET_PRESENT` with the section that describes them: they are expected failures (xfail) until they land, so the
summary shows what is missing; everything else must import."""

import importlib

import pytest

SYMBOLS: dict[str, list[str]] = {
    "nemo_gym": ["component_search_roots"],
    "nemo_gym.judge": ["call_judge", "JudgeError", "reraise_judge_errors", "judge_failsafe"],
    "nemo_gym.reward_profile": [
        "compute_pass_majority_metrics", "add_avg_sample_std_dev", "compute_subset_metrics", "highest_k_metrics",
        "AggregateMetricsMixin", "compute_aggregate_metrics", "RewardProfiler",
    ],
    "nemo_gym.config_types": [
        "AggregateMetrics", "AggregateMetricsRequest", "ROLLOUT_PATH_PREFIX", "BenchmarkDatasetConfig",
        "GitlabDatasetSource", "HuggingFaceDatasetSource", "ConfigError", "ConfigPathNotFoundError",
        "MalformedConfigPathsError", "NoServerInstancesError", "ConfigInterpolationError", "ServerRefNotFoundError",
        "AlmostServerError", "ConfigMissingValuesError", "InheritPathNotFoundError",
    ],
    "nemo_gym.base_resources_server": [
        "ReverifyMode", "BaseResourcesServerConfig.REVERIFY_MODE", "BaseMultiRewardVerifyResponse",
        "MCPServerMetadata", "NEMO_GYM_MCP_METADATA_KEY", "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
        "AggregateMetrics", "AggregateMetricsRequest",
    ],
    "nemo_gym.rollout_reverification": ["RolloutReverificationConfig", "RolloutReverificationHelper"],
    "nemo_gym.prompt": [
        "PromptConfig", "load_prompt_config", "fill_prompt", "apply_prompt_to_row", "validate_prompt_compatibility",
        "materialize_prompts", "MaterializePromptsConfig",
    ],
    "nemo_gym.rollout_correlation": [
        "RolloutContextMiddleware", "rollout_context", "current_rollout_id", "maybe_rollout_id_from_run_body",
    ],
    "nemo_gym.base_responses_api_model": [
        "CaptureStore", "ModelCallRecord", "merge_model_call_capture_into_record", "ModelCallCaptureConfig",
    ],
    "nemo_gym.rollout_observability": ["AgentObservationBundle", "ModelCallRef", "ObservationGap", "AgentEpisode"],
    "nemo_gym.mcp_auto_exposure": ["maybe_auto_expose", "install_auto_exposure"],
    "nemo_gym.server_utils": [
        "request", "get_server_url", "setup_server_client", "rollout_path_prefix", "apply_rollout_prefix",
        "is_nemo_gym_fastapi_entrypoint", "is_global_aiohttp_client_request_debug_enabled",
        "get_global_aiohttp_client", "global_aiohttp_client_exit", "raise_for_status", "BaseServer.setup_liveness",
    ],
    "nemo_gym.openai_utils": [
        "RoutedExperts", "NeMoGymResponseMcpCall", "NeMoGymResponseMcpListTools", "NeMoGymResponseMcpApprovalRequest",
        "NeMoGymChatCompletionContentPartImageParam", "NeMoGymAsyncOpenAI.create_completion",
        "NeMoGymAsyncOpenAI.default_headers",
    ],
    "nemo_gym.rollout_collection": [
        "RolloutCollectionConfig", "E2ERolloutCollectionConfig", "RolloutCollectionHelper", "RolloutAggregationConfig",
        "NG_FAILURE_CLASS_KEY", "NG_NO_PERSIST_KEY", "NG_TERMINAL_KEY", "_get_max_rollout_attempts",
    ],
    "nemo_gym.global_config": ["ATTEMPT_INDEX_KEY_NAME", "SKILLS_REF_KEY_NAME"],
    "nemo_gym.path_utils": ["failures_path_for"],
    "nemo_gym.skills": ["load_skill_directory", "stage_skills", "SkillsRef", "SkillMetadata"],
    "nemo_gym.benchmarks": ["BenchmarkConfig", "discover_benchmarks"],
    "nemo_gym.cli.main": ["main"],
    "nemo_gym.cli.legacy": ["main"],
    "nemo_gym.base_responses_api_agent": [
        "Body", "FastAPI", "Request", "AggregateMetrics", "AggregateMetricsRequest",
        "SimpleResponsesAPIAgent.url_path_for_run", "SimpleResponsesAPIAgent.url_path_for_request",
        "SimpleResponsesAPIAgent.base_url_for_run", "SimpleResponsesAPIAgent.resolve_model_base_url",
        "SimpleResponsesAPIAgent.rollout_id_from_run",
    ],
}

# Not in the tree when this test was written; each is an expected failure until it lands (an XPASS in the
# summary means it has landed: remove it from here).
NOT_YET_PRESENT: dict[str, str] = {
    "nemo_gym.rollout_reverification:RolloutReverificationConfig": "section 4 gym eval reverify",
    "nemo_gym.rollout_reverification:RolloutReverificationHelper": "section 4 gym eval reverify",
}


def _resolve(module_name: str, dotted: str):
    obj = importlib.import_module(module_name)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _params():
    for module_name, names in SYMBOLS.items():
        for name in names:
            key = f"{module_name}:{name}"
            marks = []
            if key in NOT_YET_PRESENT:
                marks.append(pytest.mark.xfail(reason=f"not yet in the tree ({NOT_YET_PRESENT[key]})", strict=True))  # a name that lands must leave this list
            yield pytest.param(module_name, name, id=key, marks=marks)


@pytest.mark.parametrize("module_name, name", list(_params()))
def test_symbol_imports_from_its_v05_path(module_name, name):
    _resolve(module_name, name)  # ImportError / AttributeError when missing


def test_not_yet_present_names_only_symbols_of_this_table():
    keys = {f"{module}:{name}" for module, names in SYMBOLS.items() for name in names}
    assert set(NOT_YET_PRESENT) <= keys


def test_constants_have_their_v05_values():
    from nemo_gym.config_types import ROLLOUT_PATH_PREFIX

    assert ROLLOUT_PATH_PREFIX == "ng-rollout"
    expected = {
        ("nemo_gym.rollout_collection", "NG_FAILURE_CLASS_KEY"): "_ng_failure_class",
        ("nemo_gym.rollout_collection", "NG_NO_PERSIST_KEY"): "_ng_no_persist",
        ("nemo_gym.rollout_collection", "NG_TERMINAL_KEY"): "_ng_failure_terminal",
        ("nemo_gym.global_config", "SKILLS_REF_KEY_NAME"): "skills_ref",
        ("nemo_gym.global_config", "ATTEMPT_INDEX_KEY_NAME"): "_ng_attempt_index",
    }
    missing = []
    for (module_name, name), value in expected.items():
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            missing.append(name)
            continue
        assert getattr(module, name) == value, name
    if missing:
        pytest.xfail(f"not yet in the tree: {missing}")


def test_v05_from_imports_as_agents_write_them():
    from nemo_gym.base_responses_api_agent import Body, FastAPI, Request  # noqa: F401
    from nemo_gym.prompt import PromptConfig, apply_prompt_to_row, fill_prompt, load_prompt_config  # noqa: F401
    from nemo_gym.server_utils import (  # noqa: F401
        apply_rollout_prefix,
        get_server_url,
        is_nemo_gym_fastapi_entrypoint,
        request,
        setup_server_client,
    )
    from nemo_gym.openai_utils import NeMoGymResponseMcpCall, RoutedExperts  # noqa: F401

    import inspect

    assert inspect.iscoroutinefunction(request)
    assert is_nemo_gym_fastapi_entrypoint(__file__) is False  # not inside a uvicorn worker


def test_vllm_converter_turns_a_responses_request_into_chat_params():
    from responses_api_models.vllm_model.app import VLLMConverter
    from nemo_gym.openai_utils import (
        NeMoGymChatCompletionCreateParamsNonStreaming,
        NeMoGymResponseCreateParamsNonStreaming,
    )

    converter = VLLMConverter(return_token_id_information=False)
    body = NeMoGymResponseCreateParamsNonStreaming(
        input=[{"role": "user", "content": "How many r in strawberry?"}],
        instructions="Answer with a number.",
        temperature=0.3,
        tools=[{"type": "function", "name": "count", "parameters": {"type": "object", "properties": {}}}],
    )
    params = converter.responses_to_chat_completion_create_params(body)
    assert isinstance(params, NeMoGymChatCompletionCreateParamsNonStreaming)
    dumped = params.model_dump(exclude_unset=True)
    assert dumped["messages"] == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "How many r in strawberry?"},
    ]
    assert dumped["temperature"] == 0.3
    assert dumped["tools"][0]["function"]["name"] == "count"
    # A dict body works too, and training mode keeps the token ids of an earlier assistant turn.
    training = VLLMConverter(return_token_id_information=True)
    prior = {"role": "assistant", "content": "3", "prompt_token_ids": [1, 2], "generation_token_ids": [3],
             "generation_log_probs": [-0.1]}
    params = training.responses_to_chat_completion_create_params({"input": [{"role": "user", "content": "q"}, prior]})
    assert params.model_dump(exclude_unset=True)["messages"][1]["generation_token_ids"] == [3]
