"""The applications built on the library: the ``abstract-client`` command (``cli``), the lane
benchmark (``bench``), the README's demo (``demo``) and engine preparation (``prepare``).

Nothing in the library imports this package; it is the only place that uses ``rich`` (the
``cli`` extra).
"""
