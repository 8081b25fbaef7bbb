"""The applications built on the library: the ``abstract-client`` command (``cli``), the lane
benchmark (``bench``), the README's demo (``demo``), engine preparation (``prepare``, with the
build scripts it ships in ``engines/``), the real test model (``assets``, ``gguf_mlx``) and one
progress bar (``progress``).

Nothing in the library imports this package; it is the only place that uses ``rich`` (the
``cli`` extra), and works without it (plain lines on stderr).
"""
