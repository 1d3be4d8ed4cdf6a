"""Candidate retrieval: memory units of a conversation, and retrievers that rank them."""
