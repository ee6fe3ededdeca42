"""multusd: Multus CNI's thick plugin as a host service.

Nothing is imported here on purpose: the shim is imported through this package once per
pod sandbox and must start fast.
"""

__version__ = "0.1.0"

#: The CNI spec versions multusd speaks, oldest first (0.1.0/0.2.0 results are not supported).
#: Defined here, the one module every other imports anyway, so that the shim's happy path
#: needs neither :mod:`multusd.errors` (which re-exports it) nor anything else.
SUPPORTED_VERSIONS: tuple = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
