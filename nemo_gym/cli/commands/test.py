"""`ng_test` / `ng test` and `ng_test_all` / `ng test-all`: run servers' own tests in their environments."""

from __future__ import annotations

from nemo_gym.cli.command import Command
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS


def run_test(config) -> int:
    from nemo_gym.authoring.server_tests import run_one_server_tests

    return run_one_server_tests(config, config.global_config)


def run_test_all(config) -> int:
    from nemo_gym.authoring.server_tests import run_all_server_tests

    return run_all_server_tests(config, config.global_config)


TEST = Command(
    name="test",
    verb="test",
    summary="Run one server's tests in its environment.",
    model="nemo_gym.authoring.server_tests:TestConfig",
    run=run_test,
    initial_config=POLICY_PLACEHOLDERS,
)

TEST_ALL = Command(
    name="test_all",
    verb="test-all",
    summary="Run every server's tests and print a pass/fail table.",
    model="nemo_gym.authoring.server_tests:TestAllConfig",
    run=run_test_all,
    initial_config=POLICY_PLACEHOLDERS,
)
