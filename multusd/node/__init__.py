"""The node's own state: pod network namespaces (pyroute2) and the kubelet's device files and socket."""
