"""The rollout workbench: view collected rollouts, turn them into training data, re-score them."""
