"""The online agents: the RMM loop (retrieve topic memories, rerank, answer with citations,
learn from them, reflect at a session's end) and IRIS over a user's LaceMem, both behind one
abstract chat agent; the RMM agent's workdir keeps what it learns."""

from __future__ import annotations

from rmmjax.agent.base import ChatAgent, Reply
from rmmjax.agent.iris import IrisAgent
from rmmjax.agent.rmm import Agent, AgentSettings

__all__ = ["Agent", "AgentSettings", "ChatAgent", "IrisAgent", "Reply"]
