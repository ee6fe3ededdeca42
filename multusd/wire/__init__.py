"""The shim and its wire contract with the daemon: standard library and ``multusd.errors`` only."""
