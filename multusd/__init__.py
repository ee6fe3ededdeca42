"""multusd: Multus CNI's thick plugin as a host service.

Nothing is imported here on purpose: the shim is imported through this package once per
pod sandbox and must start fast.
"""

__version__ = "0.1.0"
