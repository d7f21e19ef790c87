"""Try one request against a running stack: the spot check NeMo Gym's tutorials run right after `ng_run`.

    python responses_api_agents/simple_agent/client.py [+agent_name=<agent>] [+head_server.port=<port>]

It sends one weather question, with a `get_weather` tool, to the agent's `POST /v1/responses` (the model/tool loop
only: no `/seed_session`, no `/verify`; a collection does those) and prints the output items the episode produced
as JSON: the model's tool call, the tool's answer, the model's reply. The stack is found through its head server
(`head_server` of this process's config: `+head_server.host/port`, else 127.0.0.1:11000).

Which agent: `+agent_name=<agent>`, else `AGENT_NAME` below (edit it to point the script at your own agent, as the
tutorials say), else, when the stack runs exactly one agent, that one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Optional

from nemo_gym.config.global_config import find_server_instances, get_global_config_dict
from nemo_gym.config.types import AGENT_SERVER_TYPE
from nemo_gym.errors import NeMoGymConfigError, did_you_mean
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient

AGENT_NAME = "example_single_tool_call_simple_agent"

REQUEST = NeMoGymResponseCreateParamsNonStreaming(
    input=[
        {"role": "developer", "content": "You are a helpful personal assistant. Use your tools when they help."},
        {"role": "user", "content": "I'm going out in San Francisco tonight. What should I wear?"},
    ],
    tools=[
        {
            "type": "function",
            "name": "get_weather",
            "description": "The current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city, e.g. Paris."}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "strict": True,
        }
    ],
)


def choose_agent(stack_config: Any, requested: Optional[str]) -> str:
    """The agent to ask: the one requested, else AGENT_NAME, else the stack's only agent (a clear error otherwise)."""
    agents = [s.server_id for s in find_server_instances(stack_config) if s.server_type == AGENT_SERVER_TYPE]
    wanted = requested or AGENT_NAME
    if wanted in agents:
        return wanted
    if requested is None and len(agents) == 1:
        print(f"(the stack has no agent `{AGENT_NAME}`; asking its only agent, `{agents[0]}`)", file=sys.stderr)
        return agents[0]
    raise NeMoGymConfigError(
        f"the running stack has no agent `{wanted}`.{did_you_mean(wanted, agents)} Its agents: "
        f"{', '.join(agents) or '(none)'}. Pass +agent_name=<agent> (or edit AGENT_NAME in {__file__})."
    )


async def ask(server_client: ServerClient, agent: str) -> list:
    response = await server_client.post(server_name=agent, url_path="/v1/responses", json=REQUEST)
    response.raise_for_status()
    return (await response.json())["output"]


def main() -> int:
    try:
        # This process's config (+agent_name, +head_server...); the client starts no server, so it reserves no port.
        requested = get_global_config_dict(allocate_ports=False).get("agent_name")
        server_client = ServerClient.load_from_global_config()
        agent = choose_agent(server_client.global_config_dict, requested)
    except (ValueError, NeMoGymConfigError) as exc:  # no head server, or no such agent
        print(f"error: client.py: {exc}", file=sys.stderr)
        return 2
    output = asyncio.run(ask(server_client, agent))
    print(json.dumps(output, indent=4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
