"""Embeddings: the providers that turn text into vectors, the current embedding space, and the vectors of
every kind of searchable item (memories, chat-history chunks, document passages)."""
