"""Moved to :mod:`hasten.machine` (the library uses it, and the library does not import the
benchmark package); this name stays for the benchmark scripts and for users' imports."""

import sys

from hasten import machine as _moved

sys.modules[__name__] = _moved
