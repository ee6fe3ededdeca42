"""The pod's network-selection annotations: what networks a pod asks for, parsed and validated.

Owns the ``k8s.v1.cni.cncf.io/networks`` and ``v1.multus-cni.io/default-network`` values, in
both forms upstream Multus accepts (upstream ``k8sclient.go:parsePodNetworkAnnotation``):

* the comma form, ``[<namespace>/]<name>[@<interface>]`` items separated by commas;
* the JSON form, a list of network-selection objects (NPWG spec section 4.1.2).

Pure logic: no Kubernetes, no files. Every malformed value raises
:class:`~multusd.errors.InvalidNetworkConfig` naming the pod, the annotation and the bad part.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

from multusd import go_fields, go_loads
from multusd.cni.names import IFNAME_RULE, is_valid_ifname
from multusd.errors import InvalidNetworkConfig
from multusd.store import go_json
from multusd.store.valueclass import Record, field

LOG = logging.getLogger(__name__)

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
DEFAULT_NETWORK_ANNOTATION = "v1.multus-cni.io/default-network"
NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"

# DNS-1123 label: what the comma form accepts for a namespace and a network name.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_COMMA_FORM = "[<namespace>/]<name>[@<interface>] items separated by commas"
_JSON_FORM = 'a JSON list of objects such as [{"name": "net1", "interface": "net1"}]'


class Request(NamedTuple):
    """One per-attachment request a selection element carries to its delegate, by its name in
    each place it goes."""

    key: str          # in the selection element (the annotation's JSON form)
    attribute: str    # of :class:`NetworkSelection`
    delegate: str     # of :class:`multusd.core.delegate.Delegate`
    capability: str   # the runtimeConfig capability that hands it to a plugin
    cache_key: str    # in the scratch cache; "" where upstream does not record it
    legacy_arg: str   # the deprecated CNI_ARGS name upstream also sets; "" for none


IPS = Request("ips", "ips", "ip_request", "ips", "ipRequest", "IP")
MAC = Request("mac", "mac", "mac_request", "mac", "macRequest", "MAC")
INFINIBAND_GUID = Request("infiniband-guid", "infiniband_guid", "infiniband_guid_request",
                          "infinibandGUID", "infinibandGUIDRequest", "")
PORT_MAPPINGS = Request("portMappings", "port_mappings", "port_mappings", "portMappings", "", "")
BANDWIDTH = Request("bandwidth", "bandwidth", "bandwidth", "bandwidth", "", "")
DEVICE_ID = Request("deviceID", "device_id", "device_id", "deviceID", "deviceID", "")
#: Every per-attachment request, in the element's key order (upstream's NetworkSelectionElement).
REQUESTS = (IPS, MAC, INFINIBAND_GUID, PORT_MAPPINGS, BANDWIDTH, DEVICE_ID)


def requested(value: Any) -> bool:
    """True when a request's value asks for something: set and not empty (an empty
    ``bandwidth`` object is a request)."""
    return value is not None and (isinstance(value, dict) or bool(value))


class NetworkSelection(Record):
    """One element of a network-selection annotation.

    ``default_route`` is None when the key is absent and ``()`` when it is present but empty:
    upstream treats any present ``default-route`` as "filter default routes" (F50).
    ``cni_args`` and ``bandwidth`` are plain dicts; treat them as read-only.
    """

    name: str
    namespace: str
    interface: str = ""
    ips: Tuple[str, ...] = ()
    mac: str = ""
    infiniband_guid: str = ""
    cni_args: Optional[Dict[str, Any]] = None
    port_mappings: Tuple[Dict[str, Any], ...] = ()
    bandwidth: Optional[Dict[str, Any]] = None
    default_route: Optional[Tuple[str, ...]] = None
    device_id: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], default_namespace: str = "") -> "NetworkSelection":
        """Build from one JSON element.

        :raises ValueError: naming the bad key (callers add the pod and annotation).
        """
        return _element_from_dict(data, default_namespace)

    def to_dict(self) -> Dict[str, Any]:
        """The element as JSON, with upstream's keys in upstream's order, values left at their
        default (or empty) left out."""
        out: Dict[str, Any] = {}
        for key, (attribute, _) in _FIELDS.items():
            value = getattr(self, attribute, _ABSENT)  # "interfaceRequest" has no attribute
            if value is not _ABSENT and value != getattr(NetworkSelection, attribute, ""):
                out[key] = json_value(value)
        return out


def parse_selections(value: str, pod_namespace: str, *, pod: str = "",
                     annotation: str = NETWORKS_ANNOTATION) -> List[NetworkSelection]:
    """Parse a ``k8s.v1.cni.cncf.io/networks`` value into its elements, in order.

    An empty (or blank) value selects nothing. Elements without a namespace get
    ``pod_namespace``. The same network may appear twice (two attachments).

    :param pod: ``"namespace/name"`` of the pod, used in error messages only.
    :raises InvalidNetworkConfig: on any malformed value; the message names the pod, the
        annotation, the bad part and the expected form.
    """
    if not value or not value.strip():
        return []
    fail = _failer(pod, annotation)
    if any(c in value for c in '[{"'):
        selections = _parse_json_form(value, pod_namespace, fail)
    else:
        selections = [_parse_comma_item(item, pod_namespace, fail) for item in value.split(",")]
    for index, selection in enumerate(selections):
        _validate_requests(selection, index, fail)
    LOG.debug("parsed %s of pod %s: %s", annotation, pod, selections)
    return selections


def parse_default_network(value: str, multus_namespace: str, pod: str = "") -> NetworkSelection:
    """Parse a ``v1.multus-cni.io/default-network`` value: exactly one network.

    Its default namespace is ``multus_namespace`` (upstream: the pod's primary network lives
    there), not the pod's.

    :raises InvalidNetworkConfig: when malformed, empty, or naming more than one network.
    """
    fail = _failer(pod, DEFAULT_NETWORK_ANNOTATION)
    if not value or not value.strip():
        raise fail("the value is empty; name one network-attachment-definition, e.g. "
                   "'kube-system/alt-net'")
    selections = parse_selections(value, multus_namespace, pod=pod,
                                  annotation=DEFAULT_NETWORK_ANNOTATION)
    if len(selections) > 1:
        raise fail(f"more than one default network is specified: {value!r}; "
                   "name exactly one network")
    if not selections:
        raise fail(f"no network is named in {value!r}; name exactly one network")
    return selections[0]


def parse_mac(text: str) -> bytes:
    """Parse a MAC the way Go's ``net.ParseMAC`` does: 6, 8 or 20 bytes, ``:``/``-``/``.`` forms.

    :raises ValueError: when ``text`` is not such an address.
    """
    if len(text) >= 14:
        if text[2] in ":-" and (len(text) + 1) % 3 == 0:
            sep = text[2]
            groups = text.split(sep)
            if len(groups) in (6, 8, 20) and all(_is_hex(g, 2) for g in groups):
                return bytes(int(g, 16) for g in groups)
        elif text[4] == "." and (len(text) + 1) % 5 == 0:
            groups = text.split(".")
            if 2 * len(groups) in (6, 8, 20) and all(_is_hex(g, 4) for g in groups):
                return b"".join(int(g, 16).to_bytes(2, "big") for g in groups)
    raise ValueError(f"address {text}: invalid MAC address")


def parse_ip(text: str) -> Union[ipaddress.IPv4Address, ipaddress.IPv6Address]:
    """Parse an IP the way Go's ``net.ParseIP`` does (no zone, no leading zeros in IPv4)."""
    if "%" in text or not text:
        raise ValueError(f"invalid IP address: {text}")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"invalid IP address: {text}") from None


def parse_ip_or_cidr(text: str) -> None:
    """Accept ``10.1.1.5`` or ``10.1.1.5/24`` (host bits allowed), as upstream does.

    :raises ValueError: with upstream's wording.
    """
    if "/" in text:
        address, _, prefix = text.partition("/")
        try:
            ip = parse_ip(address)
        except ValueError:
            ip = None
        if ip is None or not prefix.isdigit() or int(prefix) > ip.max_prefixlen:
            raise ValueError(f"failed to parse CIDR {text!r}: invalid CIDR address: {text}")
        return
    try:
        parse_ip(text)
    except ValueError:
        raise ValueError(f"failed to parse IP address {text!r}") from None


def json_value(value: Any) -> Any:
    """``value`` as JSON holds it: tuples as lists, objects copied."""
    if isinstance(value, (tuple, list)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    return value


# --- internals -------------------------------------------------------------------------------

Fail = Callable[[str], InvalidNetworkConfig]
_ABSENT = object()


def _failer(pod: str, annotation: str) -> Fail:
    where = f"pod {pod!r} annotation {annotation!r}" if pod else f"annotation {annotation!r}"

    def fail(problem: str) -> InvalidNetworkConfig:
        return InvalidNetworkConfig(f"{where}: {problem}")

    return fail


def _is_hex(group: str, width: int) -> bool:
    return len(group) == width and all(c in "0123456789abcdefABCDEF" for c in group)


def _parse_comma_item(item: str, pod_namespace: str, fail: Fail) -> NetworkSelection:
    item = item.strip()
    if not item:
        raise fail("an empty item in the comma-separated list (a stray or trailing ','?); "
                   f"expected {_COMMA_FORM}")
    slash_parts = item.split("/")
    if len(slash_parts) > 2:
        raise fail(f"Invalid network object (failed at '/') in {item!r}: "
                   f"expected {_COMMA_FORM}")
    namespace = slash_parts[0].strip() if len(slash_parts) == 2 else ""
    at_parts = slash_parts[-1].split("@")
    if len(at_parts) > 2:
        raise fail(f"Invalid network object (failed at '@') in {item!r}: "
                   f"expected {_COMMA_FORM}")
    name = at_parts[0].strip()
    interface = at_parts[1].strip() if len(at_parts) == 2 else ""
    for part in (namespace, name):
        if part and not _DNS_LABEL.match(part):
            raise fail(f"{part!r} in {item!r} is not a valid name: namespaces and network "
                       "names must consist of lower case alphanumeric characters or '-', and "
                       f"start and end with an alphanumeric character; expected {_COMMA_FORM}")
    if not name:
        raise fail(f"{item!r} names no network; expected {_COMMA_FORM}")
    return NetworkSelection(name=name, namespace=namespace or pod_namespace, interface=interface,
                            raw={"name": name, "namespace": namespace, "interface": interface})


def _parse_json_form(value: str, pod_namespace: str, fail: Fail) -> List[NetworkSelection]:
    try:
        data = go_loads(value)
    except ValueError as exc:
        raise fail("failed to parse pod Network Attachment Selection Annotation JSON format: "
                   f"{exc}; expected {_JSON_FORM} or {_COMMA_FORM}") from None
    if data is None:
        return []
    if isinstance(data, dict):
        raise fail("the JSON value is a single object, but a list is required: wrap it in "
                   f"[ ], i.e. {_JSON_FORM}")
    if not isinstance(data, list):
        raise fail(f"the JSON value is a {type(data).__name__}, not a list; "
                   f"expected {_JSON_FORM}")
    selections = []
    for index, element in enumerate(data):
        if not isinstance(element, dict):
            raise fail(f"element {index} is {_shown(element)}, not an object; "
                       f"expected {_JSON_FORM}")
        try:
            selections.append(_element_from_dict(element, pod_namespace))
        except ValueError as exc:
            raise fail(f"element {index} ({_shown(element)}): {exc}") from None
    return selections


# JSON key -> (attribute, converter), in upstream's NetworkSelectionElement order, which to_dict
# keeps. Each key is read as Go reads that struct field (go_fields): "Interface" sets
# "interface", a key given twice keeps its last value, null leaves a string field as it was.
def _string(key: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ValueError(f'"{key}" must be a string, got {_shown(value)}')
        return value
    return convert


def _string_list(key: str) -> Callable[[Any], Optional[Tuple[str, ...]]]:
    def convert(value: Any) -> Optional[Tuple[str, ...]]:
        if value is None:
            return None
        if not isinstance(value, list) or not all(v is None or isinstance(v, str)
                                                  for v in value):
            raise ValueError(f'"{key}" must be a list of strings, got {_shown(value)}')
        return tuple("" if v is None else v for v in value)  # Go: a null element is empty
    return convert


_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _int_value(value: Any, owner: str, key: str) -> int:
    """A Go ``int`` field's value: an integer literal (``1.0`` and ``1e2`` are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or \
            not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f'"{owner}.{key}" must be an integer, got {_shown(value)}')
    return value


def _go_struct(value: Any, owner: str, ints: Tuple[str, ...],
               strings: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """A Go struct of int and string fields (PortMapEntry, BandwidthEntry) as Go reads it."""
    def check(key: str, member: Any) -> None:
        if key in ints:
            _int_value(member, owner, key)
        else:
            _string(f"{owner}.{key}")(member)
    return go_fields(value, ints + strings, check=check)


def _port_mappings(value: Any) -> Tuple[Optional[Dict[str, Any]], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(v is None or isinstance(v, dict) for v in value):
        raise ValueError('"portMappings" must be a list of objects such as '
                         '{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}')
    mappings: List[Optional[Dict[str, Any]]] = []
    for entry in value:
        if entry is None:  # a nil *PortMapEntry, handed on as null as upstream does
            mappings.append(None)
            continue
        # Upstream re-encodes each entry through its PortMapEntry struct: these keys only.
        fields = _go_struct(entry, "portMappings", ("hostPort", "containerPort"),
                            ("protocol", "hostIP"))
        mapping: Dict[str, Any] = {"hostPort": fields.get("hostPort", 0),
                                   "containerPort": fields.get("containerPort", 0)}
        for key in ("protocol", "hostIP"):
            if fields.get(key):
                mapping[key] = fields[key]
        mappings.append(mapping)
    return tuple(mappings)


_BANDWIDTH_KEYS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")


def _bandwidth(value: Any) -> Optional[Dict[str, Any]]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError('"bandwidth" must be an object such as '
                         '{"ingressRate": 1000, "ingressBurst": 1000, ...}')
    fields = _go_struct(value, "bandwidth", _BANDWIDTH_KEYS)
    return {key: fields.get(key, 0) for key in _BANDWIDTH_KEYS}


def _cni_args(value: Any) -> Optional[Dict[str, Any]]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f'"cni-args" must be an object, got {_shown(value)}')
    return dict(value)  # a Go map: its keys as written, the last of a key given twice


def _shown(value: Any) -> str:
    return go_json(value)[:200]


_FIELDS: Dict[str, Tuple[str, Callable[[Any], Any]]] = {
    "name": ("name", _string("name")),
    "namespace": ("namespace", _string("namespace")),
    IPS.key: (IPS.attribute, _string_list(IPS.key)),
    MAC.key: (MAC.attribute, _string(MAC.key)),
    INFINIBAND_GUID.key: (INFINIBAND_GUID.attribute, _string(INFINIBAND_GUID.key)),
    "interface": ("interface", _string("interface")),
    "interfaceRequest": ("interface_request", _string("interfaceRequest")),
    PORT_MAPPINGS.key: (PORT_MAPPINGS.attribute, _port_mappings),
    BANDWIDTH.key: (BANDWIDTH.attribute, _bandwidth),
    DEVICE_ID.key: (DEVICE_ID.attribute, _string(DEVICE_ID.key)),
    "cni-args": ("cni_args", _cni_args),
    "default-route": ("default_route", _string_list("default-route")),
}
# Slices, maps and pointers: null sets them to nil; an object given twice to a map or a
# pointer to a struct is decoded into the first (their members add up).
_NILS = (IPS.key, PORT_MAPPINGS.key, BANDWIDTH.key, "cni-args", "default-route")
_MERGES = (BANDWIDTH.key, "cni-args")


def _check_element_field(key: str, value: Any) -> None:
    _FIELDS[key][1](value)  # Go refuses a value of the wrong type wherever it is


def _element_from_dict(data: Mapping[str, Any], default_namespace: str) -> NetworkSelection:
    values: Dict[str, Any] = {}
    fields = go_fields(data, tuple(_FIELDS), nils=_NILS, merges=_MERGES,
                       check=_check_element_field)
    for key, value in fields.items():  # unknown keys (ipam-claim-reference) are ignored
        attribute, convert = _FIELDS[key]
        values[attribute] = convert(value)
    name = values.pop("name", "")
    if not name:
        raise ValueError('"name" is missing or empty; every element must name a '
                         "network-attachment-definition")
    namespace = values.pop("namespace", "") or default_namespace
    # "interfaceRequest" is the pre-3.2 spelling of "interface"; the new key wins.
    interface, interface_request = values.pop("interface", ""), values.pop("interface_request", "")
    given = {attribute: value for attribute, value in values.items() if value is not None}
    return NetworkSelection(name=name, namespace=namespace,  # a null leaves a field's default
                            interface=interface or interface_request, raw=dict(data), **given)


def _validate_requests(selection: NetworkSelection, index: int, fail: Fail) -> None:
    where = f"network {selection.namespace}/{selection.name} (element {index})"
    if selection.interface and not is_valid_ifname(selection.interface):
        raise fail(f"{where}: interface name {selection.interface!r} is invalid: it must be "
                   f"{IFNAME_RULE}")
    if selection.mac:
        try:
            parse_mac(selection.mac)
        except ValueError as exc:
            raise fail(f"{where}: failed to parse mac {selection.mac!r}: {exc}; expected "
                       "a MAC address such as 'c2:11:22:33:44:55'") from None
    if selection.infiniband_guid:
        try:
            parse_mac(selection.infiniband_guid)
        except ValueError as exc:
            raise fail(f"{where}: failed to validate infiniband GUID "
                       f"{selection.infiniband_guid!r}: {exc}; expected 8 or 20 "
                       "colon-separated hex bytes") from None
    for ip in selection.ips:
        try:
            parse_ip_or_cidr(ip)
        except ValueError as exc:
            raise fail(f"{where}: {exc}; expected an IP address or CIDR such as "
                       "'10.1.1.5/24'") from None
    for gateway in selection.default_route or ():
        if gateway == "":
            continue  # "" or null: Go's nil IP, which upstream accepts (see core/defaultroute)
        try:
            parse_ip(gateway)
        except ValueError as exc:
            raise fail(f"{where}: default-route {exc}; expected a list of gateway IP "
                       "addresses such as [\"10.1.1.254\"]") from None
