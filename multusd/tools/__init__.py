"""Operator commands (status, show, doctor, gc, socket-check): what the node holds, for the CLI."""
