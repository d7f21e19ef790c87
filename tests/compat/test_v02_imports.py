"""The public names v0.2 environment code imports, at v0.2's module paths."""

import importlib

import pytest

PUBLIC_NAMES = {
    "nemo_gym.server_utils": [
        "ServerClient", "SimpleServer", "BaseServer", "BaseServerConfig", "BaseRunServerInstanceConfig",
        "raise_for_status", "get_response_json", "SESSION_ID_KEY",
    ],
    "nemo_gym.base_resources_server": [
        "SimpleResourcesServer", "BaseResourcesServerConfig", "BaseRunRequest", "BaseVerifyRequest",
        "BaseVerifyResponse", "BaseSeedSessionRequest", "BaseSeedSessionResponse",
    ],
    "nemo_gym.base_responses_api_agent": ["SimpleResponsesAPIAgent", "BaseResponsesAPIAgentConfig"],
    "nemo_gym.base_responses_api_model": ["SimpleResponsesAPIModel", "BaseResponsesAPIModelConfig"],
    "nemo_gym.config_types": ["ModelServerRef", "ResourcesServerRef", "AgentServerRef", "Domain"],
    "nemo_gym.global_config": ["get_global_config_dict", "get_first_server_config_dict"],
    "nemo_gym.openai_utils": [
        "NeMoGymAsyncOpenAI",
        "NeMoGymResponse", "NeMoGymResponseCreateParamsNonStreaming", "NeMoGymResponseUsage",
        "NeMoGymResponseInputItem", "NeMoGymResponseOutputItem",
        "NeMoGymEasyInputMessage", "NeMoGymMessage", "NeMoGymResponseOutputMessage", "NeMoGymResponseOutputText",
        "NeMoGymResponseFunctionToolCall", "NeMoGymFunctionCallOutput", "NeMoGymResponseReasoningItem",
        "NeMoGymSummary", "RESPONSES_TO_TRAIN", "TokenIDLogProbMixin",
        "NeMoGymEasyInputMessageForTraining", "NeMoGymMessageForTraining",
        "NeMoGymResponseOutputMessageForTraining", "NeMoGymResponseFunctionToolCallForTraining",
        "NeMoGymResponseReasoningItemForTraining",
        "NeMoGymChatCompletion", "NeMoGymChatCompletionCreateParamsNonStreaming", "NeMoGymChatCompletionMessage",
        "NeMoGymChatCompletionAssistantMessageForTrainingParam", "NeMoGymChoice",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC_NAMES))
def test_public_names_import_from_v02_paths(module):
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC_NAMES[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lacks {missing}"


def test_from_imports_as_v02_code_writes_them():
    from nemo_gym.base_resources_server import SimpleResourcesServer  # noqa: F401
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent  # noqa: F401
    from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel  # noqa: F401
    from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
    from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient, get_response_json, raise_for_status

    assert SESSION_ID_KEY == "session_id"
    assert ModelServerRef(type="responses_api_models", name="policy_model").name == "policy_model"
    assert ResourcesServerRef(type="resources_servers", name="env").type == "resources_servers"
    client = ServerClient(head_server_config=None, global_config_dict={})
    assert callable(client.post) and callable(client.get)
    import inspect

    assert inspect.iscoroutinefunction(raise_for_status) and inspect.iscoroutinefunction(get_response_json)
