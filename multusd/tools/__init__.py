"""Operator tools: status, show, doctor and gc, reading the node's on-disk state (beside the CLI)."""
