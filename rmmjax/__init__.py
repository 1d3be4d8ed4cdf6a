"""rmmjax: learnable memory retrieval for long-term conversational agents."""

__version__ = "0.1.0"
