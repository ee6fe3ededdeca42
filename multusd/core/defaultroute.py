"""default-route (F50) after each delegate's ADD: which routes go, and libcni's cache kept in step.

Upstream: ``netutils.go`` (``DeleteDefaultGW``, ``SetDefaultGW``, ``DeleteDefaultGWCache``,
``AddDefaultGWCache``) and the default-route part of ``multus.go:CmdAdd``. The delegate
flags come from :func:`multusd.core.podnetworks.mark_gateway_filters`, set only when some
selection carries ``default-route`` (ECMP is rejected there):

* a delegate whose result configured an interface and which is marked ``filter_v4_gateway``
  (``filter_v6_gateway``) loses its IPv4 (IPv6) default routes, in the namespace and in its
  libcni cached result;
* the delegate with a non-empty ``default-route`` loses every default route of its link,
  gets one via each requested gateway, and its cached result gets the matching route;
* as upstream, ``"default-route": []`` marks every delegate for both families, so the pod
  ends up with no default route at all.

Fixed upstream bugs: only the marked family is deleted (upstream deletes both); cached
``::/0`` routes are recognised (upstream only matched the spelling ``::0/0``), routes without
``dst`` are kept; the cache is read before the namespace is touched, so a missing cache file
fails the ADD without leaving the namespace and the cache disagreeing. The namespace work
itself is :class:`multusd.node.netns.PodNetns`'s, which reports what it changed.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd.cni import resultcache
from multusd.cni.version import has_ip_sections
from multusd.core.delegate import Delegate
from multusd.errors import DecodeFailure, InvalidNetworkConfig, IOFailure
from multusd.node.netns import PodNetns  # pyroute2 itself only when a pod asks for routes

LOG = logging.getLogger(__name__)

_DEFAULT_DST = {4: "0.0.0.0/0", 6: "::/0"}


class DefaultRoutes:
    """default-route handling after each delegate's ADD, in one netns opening per request.

    The namespace is opened on first use (:meth:`namespace`): the ADD's interface-name check
    and every default-route fixup share that one opening.
    """

    def __init__(self, netns_path: str, cache_dir: str, container_id: str) -> None:
        self.netns_path = netns_path
        self.cache_dir = cache_dir
        self.container_id = container_id
        self._netns = None

    def apply(self, delegate: Delegate, result: Mapping[str, Any]) -> None:
        """Apply ``delegate``'s default-route flags after its ADD returned ``result``.

        ``result`` itself is never modified; the cached copy on disk is.

        :raises IOFailure: no cached result for the delegate (nothing is changed then), or
            a netlink failure.
        :raises DecodeFailure: the cached result has malformed routes.
        """
        if not _configures_interfaces(result):
            return
        gateways = tuple(delegate.gateway_request or ())
        drop_v4 = delegate.filter_v4_gateway or bool(gateways)
        drop_v6 = delegate.filter_v6_gateway or bool(gateways)
        if not (drop_v4 or drop_v6):
            return
        net_name, ifname = delegate.conf_name, delegate.ifname
        cached = resultcache.read_result(self.cache_dir, net_name, self.container_id, ifname)
        if cached is None:
            raise IOFailure(
                f"error deleting default gateway in cache: no cached result for network "
                f"{net_name!r} interface {ifname!r} under {self.cache_dir!r}; the delegate's "
                "ADD should have written it")
        where = resultcache.result_path(self.cache_dir, net_name, self.container_id, ifname)
        updated = with_default_routes(without_default_routes(cached, drop_v4, drop_v6, where),
                                      gateways, where)
        change = self.namespace().replace_default_routes(ifname, drop_v4, drop_v6, gateways)
        if updated != cached:
            resultcache.update_result(self.cache_dir, net_name, self.container_id, ifname, updated)
        LOG.info("default routes of %s (%s) in %s: removed %d (%s), added via %s", ifname,
                 delegate.name, self.netns_path, change.removed,
                 "+".join(n for n, on in (("IPv4", drop_v4), ("IPv6", drop_v6)) if on),
                 ", ".join(gateways) or "none")

    def __enter__(self) -> "DefaultRoutes":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._netns is not None:
            self._netns.close()
            self._netns = None

    def namespace(self):
        """The pod's namespace (a :class:`~multusd.node.netns.PodNetns`), opened on first use."""
        if self._netns is None:
            self._netns = PodNetns(self.netns_path)
        return self._netns


# --- cached-result rewriting (pure) -----------------------------------------------------------


def without_default_routes(result: Mapping[str, Any], ipv4: bool, ipv6: bool,
                           where: str = "the cached result") -> Dict[str, Any]:
    """A copy of ``result`` without its IPv4 and/or IPv6 default routes.

    A default route is one whose ``dst`` has prefix length 0 (``0.0.0.0/0``, ``::/0``,
    ``::0/0``); routes without a parsable ``dst`` are kept. 0.1.0/0.2.0 results keep
    routes in ``ip4``/``ip6``; later ones in ``routes`` (dropped when it becomes empty).

    :raises DecodeFailure: ``routes`` is not a list of objects (``where`` names the file).
    """
    out = copy.deepcopy(dict(result))
    for section, version, wanted in _route_sections(out, where):
        if not wanted(ipv4, ipv6):
            continue
        routes = _routes_of(section, where)
        if routes is None:
            continue
        kept = [r for r in routes if _route_default_version(r) != version]
        if kept:
            section["routes"] = kept
        else:
            section.pop("routes", None)
    return out


def with_default_routes(result: Mapping[str, Any], gateways: Sequence[str],
                        where: str = "the cached result") -> Dict[str, Any]:
    """A copy of ``result`` with a ``{"dst": <default>, "gw": <gateway>}`` route per gateway.

    For a 0.1.0/0.2.0 result the route goes into ``ip4``/``ip6`` and only if that section
    exists (upstream behaviour).

    :raises InvalidNetworkConfig: a gateway is not an IP address.
    :raises DecodeFailure: ``routes`` is not a list of objects.
    """
    out = copy.deepcopy(dict(result))
    for gateway in gateways:
        address = _parse_gateway(gateway)
        route = {"dst": _DEFAULT_DST[address.version], "gw": str(address)}
        if has_ip_sections(out.get("cniVersion")):
            section = out.get("ip4" if address.version == 4 else "ip6")
            if not isinstance(section, dict):
                continue
        else:
            section = out
        routes = _routes_of(section, where) or []
        section["routes"] = routes + [route]
    return out



# --- helpers
def _configures_interfaces(result: Mapping[str, Any]) -> bool:
    # Upstream acts only when the (1.0-converted) result has interfaces or IPs: a plugin
    # that only tweaks something (e.g. a meta plugin) does not own a default route.
    return any(result.get(key) for key in ("interfaces", "ips", "ip4", "ip6"))


def _route_sections(result: Dict[str, Any], where: str) -> List[Tuple[Dict[str, Any], int, Any]]:
    """(section holding "routes", IP version it may hold a default for, family selector)."""
    def v4(ipv4: bool, ipv6: bool) -> bool:
        return ipv4

    def v6(ipv4: bool, ipv6: bool) -> bool:
        return ipv6

    if not has_ip_sections(result.get("cniVersion")):
        # One list for both families: select per route, so run it once per family.
        return [(result, 4, v4), (result, 6, v6)]
    sections = []
    for key, version, wanted in (("ip4", 4, v4), ("ip6", 6, v6)):
        section = result.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise DecodeFailure(f"{where}: {key!r} is not an object")
        sections.append((section, version, wanted))
    return sections


def _routes_of(section: Mapping[str, Any], where: str) -> Optional[List[Dict[str, Any]]]:
    routes = section.get("routes")
    if routes is None:
        return None
    if not isinstance(routes, list) or not all(isinstance(r, dict) for r in routes):
        raise DecodeFailure(f"{where}: 'routes' must be a list of route objects; remove the "
                            "corrupt cache file and recreate the pod sandbox")
    return list(routes)


def _route_default_version(route: Mapping[str, Any]) -> Optional[int]:
    """4 or 6 when ``route`` is a default route of that version, else None."""
    dst = route.get("dst")
    if not isinstance(dst, str):
        return None
    try:
        network = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return None
    return network.version if network.prefixlen == 0 else None


def _parse_gateway(gateway: str) -> Any:
    try:
        return ipaddress.ip_address(gateway)
    except ValueError:
        raise InvalidNetworkConfig(f"default-route gateway {gateway!r} is not an IP address; "
                                   "fix the pod's network selection") from None
