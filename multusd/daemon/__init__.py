"""The composition root: socket, HTTP server, life cycle, journald logging, metrics."""
