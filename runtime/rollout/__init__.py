"""Rollout: the built-in torch generation engine and the generate-rollout function (prompts -> samples)."""
