"""The operator's files: daemon-config.json, the generated 00-multus.conf, the systemd generator."""
