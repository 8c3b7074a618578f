"""Wordle, the default reward environment: `feedback`, the environment and its entry point."""

from reward_envs.wordle.env import WordleEnvironment, load_environment
from reward_envs.wordle.rules import feedback

__all__ = ["WordleEnvironment", "feedback", "load_environment"]
