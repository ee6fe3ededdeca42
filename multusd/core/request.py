"""One CNI request as the daemon sees it: the shim's env and config, parsed and checked (F08).

The daemon-config overlay (F09) is applied here, so everything downstream works on the
merged Multus config of this request alone.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from multusd.cni.args import parse_cni_args
from multusd.cni.names import NAME_RULE, is_valid_name
from multusd.config.daemonconf import DaemonConfig, overlay
from multusd.errors import DecodeFailure, InvalidEnvironment, InvalidNetworkConfig

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
SANDBOX_FREE_COMMANDS = ("STATUS", "GC")


@dataclass(frozen=True)
class CmdArgs:
    """A parsed request: the CNI call plus the pod identity from CNI_ARGS (if it is a pod's)."""

    command: str
    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...]
    config: Mapping[str, Any]            # the merged config (request conf + daemon overlay)
    config_bytes: bytes                  # the request's config as the runtime sent it
    env: Mapping[str, str] = field(default_factory=dict)

    def arg(self, key: str) -> str:
        for name, value in self.args:
            if name == key:
                return value
        return ""

    @property
    def pod_namespace(self) -> str:
        return self.arg("K8S_POD_NAMESPACE")

    @property
    def pod_name(self) -> str:
        return self.arg("K8S_POD_NAME")

    @property
    def has_pod(self) -> bool:
        """A Kubernetes pod's sandbox (K8S_POD_NAMESPACE set), not a plain container's."""
        return bool(self.pod_namespace)

    @property
    def pod_uid(self) -> str:
        return self.arg("K8S_POD_UID")

    @property
    def infra_container_id(self) -> str:
        return self.arg("K8S_POD_INFRA_CONTAINER_ID")

    @property
    def cni_version(self) -> str:
        return str(self.config.get("cniVersion") or "")

    def k8s_fields(self) -> dict[str, str]:
        return {"K8S_POD_NAMESPACE": self.pod_namespace, "K8S_POD_NAME": self.pod_name,
                "K8S_POD_UID": self.pod_uid}


def decode_body(body: bytes) -> tuple[dict[str, str], bytes, dict[str, Any] | None]:
    """The env, the config bytes and the interfaceAttributes of a /cni or /delegate body."""
    try:
        request = json.loads(body)
    except ValueError as exc:
        raise DecodeFailure(f"the request body is not valid JSON: {exc}; multusd expects "
                            '{"env": {...}, "config": "<base64>"} from multus-shim') from None
    if not isinstance(request, dict):
        raise DecodeFailure("the request body must be a JSON object with \"env\" and \"config\"")
    env = request.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise DecodeFailure("\"env\" must be an object of strings (the CNI_* variables)")
    encoded = request.get("config") or ""
    try:
        config = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b""
    except (binascii.Error, ValueError):
        raise DecodeFailure("\"config\" is not valid base64: the shim sends the CNI config "
                            "(its stdin) base64-encoded") from None
    attributes = request.get("interfaceAttributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise DecodeFailure("\"interfaceAttributes\" must be an object")
    return env, config, attributes


def parse(env: Mapping[str, str], config: bytes, daemon: DaemonConfig) -> CmdArgs:
    """Check the CNI env as upstream does and build the request with the merged config."""
    command = env.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        raise InvalidEnvironment(f"unexpected or missing CNI_COMMAND {command!r}; "
                                 f"expected one of {', '.join(COMMANDS)}")
    merged = merge_config(config, daemon)
    if command in SANDBOX_FREE_COMMANDS:
        return CmdArgs(command, "", "", "", (), merged, config, env)
    for key in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_ARGS"):
        if key not in env:
            raise InvalidEnvironment(f"missing {key}: the container runtime must set it")
    args = tuple(parse_cni_args(env["CNI_ARGS"]))
    request = CmdArgs(command, env["CNI_CONTAINERID"], env["CNI_NETNS"],
                      env.get("CNI_IFNAME") or "eth0", args, merged, config, env)
    if not request.container_id and command != "DEL":
        raise InvalidEnvironment("CNI_CONTAINERID is empty: the container runtime must set it")
    if request.container_id and not is_valid_name(request.container_id):
        # It names files under cniDir: never let it be a path.
        raise InvalidEnvironment(f"invalid CNI_CONTAINERID {request.container_id!r}: it must "
                                 f"{NAME_RULE} (the CNI specification's rule)")
    if request.pod_namespace and not request.pod_name:
        # Half a pod identity is a broken runtime; none at all is a container that is not a
        # pod (podman, nerdctl, Nomad: K8S_POD_NAME, if any, is the container's name).
        raise InvalidEnvironment("missing K8S_POD_NAME in CNI_ARGS: K8S_POD_NAMESPACE is "
                                 f"{request.pod_namespace!r} but the pod's name is missing; "
                                 "kubelet's runtime sets both (other runtimes set neither)")
    return request


def merge_config(config: bytes, daemon: DaemonConfig) -> dict[str, Any]:
    """The request's CNI config with the daemon config laid over it (F09)."""
    try:
        conf = json.loads(config) if config.strip() else {}
    except ValueError as exc:
        raise DecodeFailure(f"the CNI config from the runtime is not valid JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise InvalidNetworkConfig("the CNI config from the runtime must be a JSON object")
    return overlay(conf, daemon)
