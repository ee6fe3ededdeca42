"""One CNI request as the daemon sees it: the shim's env and config, parsed and checked (F08).

The request's configuration is resolved here, once (:func:`multusd.core.effective.for_request`:
the daemon-config overlay, F09, its directories and settings), so everything downstream works
on the configuration of this request alone. The pod identity it carries (CNI_ARGS'
``K8S_POD_*``) also heads every error about the request (:func:`pod_prefix`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Mapping, Tuple

from multusd import GoObject, go_field, go_fields, go_loads
from multusd.cni.args import parse_cni_args
from multusd.cni.names import IFNAME_RULE, NAME_RULE, is_valid_ifname, is_valid_name
from multusd.cni.version import require_supported
from multusd.config.daemonconf import DaemonConfig
from multusd.core import effective
from multusd.core.effective import EffectiveConfig
from multusd.errors import DecodeFailure, InvalidEnvironment, InvalidNetworkConfig
from multusd.store.valueclass import Record, field

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
SANDBOX_FREE_COMMANDS = ("STATUS", "GC")


class PodIdentity:
    """The pod identity that CNI_ARGS carry (``K8S_POD_*``), for anything holding the pairs."""

    cni_args: Tuple[Tuple[str, str], ...]

    def arg(self, key: str) -> str:
        """The value of ``key`` in CNI_ARGS ("" when absent)."""
        return next((value for name, value in self.cni_args if name == key), "")

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


class CmdArgs(PodIdentity, Record):
    """A parsed request: the CNI call plus the pod identity from CNI_ARGS (if it is a pod's)."""

    command: str
    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...]
    effective: EffectiveConfig           # the configuration it is judged by (see config)
    config_bytes: bytes                  # the request's config as the runtime sent it
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def config(self) -> Mapping[str, Any]:
        """The merged config (the runtime's, daemon-config.json over it): ``runtimeConfig``,
        ``binDir``...; the directories are :attr:`effective`'s fields."""
        return self.effective.merged

    @property
    def cni_args(self) -> Tuple[Tuple[str, str], ...]:
        return self.args

    @property
    def cni_version(self) -> str:
        return str(go_field(self.config, "cniVersion") or "")

    def k8s_fields(self) -> dict[str, str]:
        return {"K8S_POD_NAMESPACE": self.pod_namespace, "K8S_POD_NAME": self.pod_name,
                "K8S_POD_UID": self.pod_uid}


def pod_prefix(req: CmdArgs, network: str = "") -> str:
    """Upstream's ``[namespace/pod/uid:network]`` in front of an error message.

    ``[container <name>:network]`` for a container that is not a pod (podman's
    K8S_POD_NAME is the container's name).
    """
    suffix = f":{network}" if network else ""
    if not req.has_pod:
        return f"[container {req.pod_name or req.container_id}{suffix}]"
    return f"[{req.pod_namespace}/{req.pod_name}/{req.pod_uid}{suffix}]"


def decode_body(body: bytes) -> tuple[dict[str, str], bytes, dict[str, Any] | None]:
    """The env, the config bytes and the interfaceAttributes of a /cni or /delegate body, read
    as upstream's daemon reads its api.Request (``"Env"`` is ``env``; a null string is "")."""
    try:
        request = go_loads(body)
    except ValueError as exc:
        raise DecodeFailure(f"the request body is not valid JSON: {exc}; multusd expects "
                            '{"env": {...}, "config": "<base64>"} from multus-shim') from None
    if not isinstance(request, dict):
        raise DecodeFailure("the request body must be a JSON object with \"env\" and \"config\"")
    request = go_fields(request, ("env", "config", "interfaceAttributes"),
                        nils=("env", "config", "interfaceAttributes"),
                        merges=("env", "interfaceAttributes"))
    env = request.get("env") or {}
    if not isinstance(env, dict) or not all(v is None or isinstance(v, str)
                                            for v in env.values()):
        raise DecodeFailure("\"env\" must be an object of strings (the CNI_* variables)")
    env = {key: value or "" for key, value in env.items()}
    encoded = request.get("config")
    if not isinstance(encoded, str) or not encoded:
        raise DecodeFailure(f"\"config\" must be a non-empty base64 string (got "
                            f"{_kind(encoded)}): the shim sends the runtime's CNI config (its "
                            "stdin) base64-encoded")
    try:
        config = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise DecodeFailure("\"config\" is not valid base64: the shim sends the CNI config "
                            "(its stdin) base64-encoded") from None
    attributes = request.get("interfaceAttributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise DecodeFailure("\"interfaceAttributes\" must be an object")
    if attributes is not None:  # upstream's DelegateInterfaceAttributes: ips, mac, cni-args
        attributes = go_fields(attributes, ("ips", "mac", "cni-args"), nils=("ips", "cni-args"),
                               merges=("cni-args",), check=_check_attribute)
        if attributes.get("ips") is not None:  # a []string: a null in it is ""
            attributes["ips"] = ["" if ip is None else ip for ip in attributes["ips"]]
    return env, config, attributes


_ATTRIBUTE_TYPES = {"ips": (list, "a list of strings"), "mac": (str, "a string"),
                    "cni-args": (dict, "an object")}


def _check_attribute(key: str, value: Any) -> None:
    kind, what = _ATTRIBUTE_TYPES[key]
    if not isinstance(value, kind) or (key == "ips" and not all(
            ip is None or isinstance(ip, str) for ip in value)):
        raise DecodeFailure(f"\"interfaceAttributes\": \"{key}\" must be {what}, not "
                            f"{_kind(value)}")


def parse(env: Mapping[str, str], config: bytes, daemon: DaemonConfig) -> CmdArgs:
    """Check the CNI env as upstream does and build the request with its configuration."""
    command = env.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        raise InvalidEnvironment(f"unexpected or missing CNI_COMMAND {command!r}; "
                                 f"expected one of {', '.join(COMMANDS)}")
    resolved = merge_config(config, daemon)
    if command in SANDBOX_FREE_COMMANDS:
        return CmdArgs(command, "", "", "", (), resolved, config, env)
    for key in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_ARGS"):
        if key not in env:
            raise InvalidEnvironment(f"missing {key}: the container runtime must set it")
    check_env(command, env)
    args = tuple(parse_cni_args(env["CNI_ARGS"]))
    check_cni_args(args)
    request = CmdArgs(command, env["CNI_CONTAINERID"], env["CNI_NETNS"],
                      env["CNI_IFNAME"], args, resolved, config, env)
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


def merge_config(config: bytes, daemon: DaemonConfig) -> EffectiveConfig:
    """The request's configuration: its CNI config, checked, with the daemon config laid over
    it (F09), resolved.

    Read as upstream's daemon reads it: into a map (a key given twice keeps its last value),
    the daemon config laid over it, written out (keys sorted) and read into its NetConf
    struct (:func:`multusd.config.daemonconf.overlay` keeps that order, for
    :func:`multusd.go_field`).
    """
    try:
        conf = go_loads(config)
    except ValueError as exc:
        raise DecodeFailure(f"the CNI config from the runtime is not valid JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise InvalidNetworkConfig("the CNI config from the runtime must be a JSON object")
    check_runtime_config(GoObject(sorted(conf.items())))  # the map, as its struct reads it
    return effective.for_request(conf, daemon)


MAX_CNI_ARGS = 64 * 1024
# Go's strconv.ParseBool, which the CNI libraries use for IgnoreUnknown.
GO_BOOLEANS = ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False")
# Keys of the runtime's config that multusd or the shim read, with the JSON type each must have.
_CONFIG_TYPES: dict = {
    "cniVersion": str, "name": str, "type": str, "daemonSocketDir": str, "logFile": str,
    "logLevel": str, "logToStderr": bool, "clusterNetwork": str, "defaultNetworks": list,
    "delegates": list, "runtimeConfig": dict, "capabilities": dict, "kubeconfig": str,
    "confDir": str, "cniDir": str, "binDir": str, "multusNamespace": str,
    "systemNamespaces": list, "readinessindicatorfile": str, "retryDeleteOnError": bool,
    "namespaceIsolation": bool, "globalNamespaces": str, "auxiliaryCNIChainName": str,
    "logOptions": dict, "deviceInfoDir": str, "kubeletRootDir": str}
_JSON_TYPE_NAMES = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}


def check_runtime_config(conf: Mapping[str, Any]) -> None:
    """``cniVersion`` (supported), ``name`` and ``type`` (or ``plugins``) present; known keys
    of the right type, read as upstream's NetConf struct reads them (``"CNIVersion"`` is a
    ``cniVersion``, null leaves a key unset, a key given twice keeps its last value).

    :raises InvalidNetworkConfig: naming the field and what is wrong with it.
    """
    fields = go_fields(conf, tuple(_CONFIG_TYPES), check=_check_config_type)
    # /delegate (hot-plug) sends a network's own config, which may be a conflist.
    required = ("cniVersion", "name") if isinstance(go_field(conf, "plugins", nil=True), list) \
        else ("cniVersion", "name", "type")
    for key in required:
        if key not in fields:
            raise InvalidNetworkConfig(f"the CNI config from the runtime has no \"{key}\": "
                                       "check the generated 00-multus.conf")
    for key in required[1:]:
        if not fields[key].strip():
            raise InvalidNetworkConfig(f"\"{key}\" in the CNI config from the runtime is empty")
    require_supported(fields["cniVersion"], "the CNI config from the runtime (\"cniVersion\")")


def _check_config_type(key: str, value: Any) -> None:
    kind = _CONFIG_TYPES[key]
    if not isinstance(value, kind):
        raise InvalidNetworkConfig(f"\"{key}\" in the CNI config from the runtime must be "
                                   f"{_JSON_TYPE_NAMES[kind]}, not {_kind(value)}")


def check_env(command: str, env: Mapping[str, str]) -> None:
    """The spec's per-command variables: CNI_IFNAME for ADD/DEL/CHECK, CNI_NETNS for ADD/CHECK."""
    ifname = env.get("CNI_IFNAME")
    if not ifname:
        raise InvalidEnvironment(f"missing CNI_IFNAME: the container runtime must name the "
                                 f"pod's interface for {command}")
    if not is_valid_ifname(ifname):
        raise InvalidEnvironment(f"invalid CNI_IFNAME {ifname!r}: an interface name has "
                                 f"{IFNAME_RULE}")
    if command in ("ADD", "CHECK") and not env.get("CNI_NETNS"):
        raise InvalidEnvironment(f"CNI_NETNS is empty: {command} needs the path of the pod's "
                                 "network namespace")
    if "\0" in env.get("CNI_NETNS", ""):
        raise InvalidEnvironment("invalid CNI_NETNS: it holds a NUL byte")
    if len(env.get("CNI_ARGS", "").encode("utf-8", "surrogatepass")) > MAX_CNI_ARGS:
        raise InvalidEnvironment(f"CNI_ARGS is over {MAX_CNI_ARGS} bytes: kubelet's runtime "
                                 "sends a few hundred")


def check_cni_args(args: tuple) -> None:
    """No key twice, and IgnoreUnknown a boolean as Go's ParseBool reads it."""
    seen = set()
    for key, value in args:
        if key in seen:
            raise InvalidEnvironment(f"invalid CNI_ARGS: {key} is given more than once")
        seen.add(key)
        if key == "IgnoreUnknown" and value not in GO_BOOLEANS:
            raise InvalidEnvironment(f"invalid CNI_ARGS: IgnoreUnknown={value!r} is not a "
                                     "boolean (use true or false, or 1 or 0)")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
