"""NeMo Gym v0.5's config errors at `nemo_gym.config_types`: `ConfigError` is our config error class itself, so code
written for v0.5 (`except ConfigError`) catches the mistakes our parser reports, and the subclasses keep its
printing and exit status."""

from __future__ import annotations

import pytest

import nemo_gym.config_types as config_types
from nemo_gym.cli.command import Command
from nemo_gym.config.global_config import parse_global_config
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS

V05_SUBCLASSES = (
    "ConfigPathNotFoundError",
    "MalformedConfigPathsError",
    "NoServerInstancesError",
    "ConfigInterpolationError",
    "ServerRefNotFoundError",
    "AlmostServerError",
    "ConfigMissingValuesError",
    "InheritPathNotFoundError",
)


def test_config_error_is_our_config_error():
    from nemo_gym.config_types import ConfigError

    assert ConfigError is NeMoGymConfigError
    assert issubclass(ConfigError, ValueError)
    assert "ConfigError" in config_types.__all__


@pytest.mark.parametrize("name", V05_SUBCLASSES)
def test_each_subclass_is_importable_and_a_config_error(name):
    cls = getattr(config_types, name)
    assert name in config_types.__all__
    assert cls.__name__ == name
    assert issubclass(cls, config_types.ConfigError) and issubclass(cls, ValueError)
    assert cls is not config_types.ConfigError
    error = cls("`x.y` is wrong; set it to z.")
    assert str(error) == "`x.y` is wrong; set it to z."
    assert error.exit_code == 2


def test_a_missing_config_file_is_also_a_file_not_found_error():
    assert issubclass(config_types.ConfigPathNotFoundError, FileNotFoundError)


def _catch(callable_, *args, **kwargs):
    try:
        callable_(*args, **kwargs)
    except config_types.ConfigError as err:
        return err
    raise AssertionError("no ConfigError was raised")


def test_a_missing_config_path_is_caught_as_config_error(tmp_path):
    err = _catch(parse_global_config, ["+config_paths=[does_not_exist.yaml]"], cwd=tmp_path, allocate_ports=False)
    assert "does_not_exist.yaml" in str(err)


def test_an_unknown_server_ref_is_caught_as_config_error(tmp_path):
    agent = "example_single_tool_call_simple_agent.responses_api_agents.simple_agent"
    args = [
        "+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
        "responses_api_models/openai_model/configs/openai_model.yaml]",
        f"+{agent}.resources_server.name=example_single_tool_call_resource_server",
    ]
    err = _catch(
        parse_global_config, args, cwd=tmp_path, allocate_ports=False, initial_global_config_dict=POLICY_PLACEHOLDERS
    )
    assert "example_single_tool_call_resource_server" in str(err)
    assert "Did you mean `example_single_tool_call`?" in str(err)


class _NoParams(BaseNeMoGymCLIConfig):
    """Nothing."""


@pytest.mark.parametrize("name", V05_SUBCLASSES)
def test_a_subclass_raised_by_a_command_prints_like_any_config_error(name, capsys):
    cls = getattr(config_types, name)

    def run(config):
        raise cls(f"the {name} message names the key")

    command = Command(name="probe", verb="probe", summary="probe", model=_NoParams, run=run, reads_config_files=False)
    assert command.main([]) == 2
    err = capsys.readouterr().err
    assert err == f"error: ng_probe: the {name} message names the key\n"
