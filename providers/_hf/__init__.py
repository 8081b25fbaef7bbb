"""The transformers lane's engine pieces (``providers/transformers.py`` is the provider)."""
