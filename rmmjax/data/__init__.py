"""Dataset loaders into one schema: conversations of dated sessions of turns, and questions."""
