"""The support desk: a refund case worked with tools over a shop's database (env.py)."""

from reward_envs.support_desk.env import SupportDeskEnvironment, load_environment, record_for
from reward_envs.support_desk.notes import oracle_reply

__all__ = ["SupportDeskEnvironment", "load_environment", "oracle_reply", "record_for"]
