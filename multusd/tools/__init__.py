"""Operator tools: status, show, doctor and gc, from the node's on-disk state (beside the CLI)."""
