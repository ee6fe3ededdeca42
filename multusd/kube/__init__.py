"""The only user of the ``kubernetes`` client: pods and NetworkAttachmentDefinitions, status, events."""
