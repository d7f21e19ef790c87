"""`ng_run` / `ng run`: start the head server and every server block, supervise them until Ctrl-C or SIGTERM."""

from __future__ import annotations

from nemo_gym.cli.command import Command
from nemo_gym.cli.commands import collect, e2e_collect
from nemo_gym.config.known_keys import GlobalKeys
from nemo_gym.errors import NeMoGymConfigError

EXAMPLE = 'ng_run "+config_paths=[configs/quickstart.yaml]"'


class RunConfig(GlobalKeys):
    """Start the head server and each server block of the merged config as its own process, wait until every one
    answers /health ("servers ready!"), then supervise them; Ctrl-C or SIGTERM stops them all. A server that
    crashes while starting stops the rest and exits 1; one that exits or stops answering /health later is restarted
    on the same address (restart_policy), and marked failed (ng_status shows it, exit 1 at the end) once its
    restart budget is spent. Model configs also read policy_base_url, policy_api_key and policy_model_name
    (usually set in env.yaml)."""


def no_servers_message(config_paths: list[str], without_entrypoint: list[str] = ()) -> str:
    if config_paths:
        found = f"the config files ({', '.join(config_paths)}) define no server block"
    else:
        found = "no config files were given, so there is no server block"
    if without_entrypoint:
        from nemo_gym.config.global_config import no_entrypoint_hint

        return f"nothing to start: {found}: {no_entrypoint_hint(without_entrypoint[0])}."
    return (
        f"nothing to start: {found}. Pass the files that define the servers, e.g. {EXAMPLE} "
        "(or list them under config_paths in env.yaml)."
    )


def run(config: RunConfig) -> int:
    from nemo_gym.config.global_config import blocks_without_entrypoint, find_server_instances
    from nemo_gym.runtime.launcher import run_stack

    # Without this the head server would start and wait forever for servers that never come.
    if not find_server_instances(config.global_config):
        raise NeMoGymConfigError(
            no_servers_message(config.config_paths, blocks_without_entrypoint(config.global_config))
        )
    return run_stack(config.global_config)


COMMAND = Command(
    name="run",
    verb="run",
    summary="Start the head server and every configured server, wait until all are healthy, supervise them.",
    model=RunConfig,
    run=run,
    allocate_ports=True,
    # Job scripts (NeMo Skills' rollout job) hand ng_run the same `+key=value` list as ng_collect_rollouts.
    accepts_keys_of=(collect.COMMAND, e2e_collect.COMMAND),
    examples=(
        EXAMPLE,
        'ng_run "+config_paths=[resources_servers/mcqa/configs/mcqa.yaml,'
        'responses_api_models/openai_model/configs/openai_model.yaml]" +head_server.port=12000',
        'ng_run "+config_paths=[configs/quickstart.yaml]" +venv_mode=isolated +dry_run=true',
    ),
)
