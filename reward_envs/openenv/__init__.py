"""OpenEnv environments through OpenEnv's WebSocket session protocol (protocol.py, env.py)."""

from reward_envs.openenv.env import OpenEnvEnvironment, load_environment
from reward_envs.openenv.protocol import OpenEnvError, session_url

__all__ = ["OpenEnvEnvironment", "OpenEnvError", "load_environment", "session_url"]
