"""The shim and its wire contract with the daemon: stdlib, :mod:`multusd` and its errors only."""


def errors():
    """:mod:`multusd.errors`, imported on a failure path only: its classes (and its
    ``from __future__``) cost ~0.5 ms of the shim's ~10, which a call that succeeds skips."""
    from multusd import errors as module

    return module
