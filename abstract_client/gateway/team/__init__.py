"""A team's gateway: who uses it and how much each may — named keys and their limits
(``keys.py``), the limits decided (``limits.py``) by steps on a key's state (``limit_steps.py``)
kept where every process serving the key sees it (``limit_stores.py``), a busy backend's slots
shared between keys (``fair.py``), and what each request cost (``accounting.py``, ``usage*.py``)."""

__all__: list[str] = []
