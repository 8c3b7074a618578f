"""OpenEnv environments through OpenEnv's WebSocket session protocol (env.py)."""

from reward_envs.openenv.env import (
    OpenEnvEnvironment,
    OpenEnvError,
    load_environment,
    session_url,
)

__all__ = ["OpenEnvEnvironment", "OpenEnvError", "load_environment", "session_url"]
