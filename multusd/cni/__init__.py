"""The CNI execution engine: our equivalent of libcni (plugin exec, conflists, results, cache)."""
