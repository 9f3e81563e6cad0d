"""Embeddings: which weights a model name means (``models``), the one extraction path (``extraction``, with
``words`` for per-word pooling) and the one embedding cache (``cache``, with ``word_cache`` for word entries)."""
