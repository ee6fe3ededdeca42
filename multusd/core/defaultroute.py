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
  ends up with no default route at all;
* an empty gateway (``""`` or ``null``: Go reads either as a nil ``net.IP``) counts as an IPv6
  one (``To4()`` is nil) for the marks and the ECMP check, as upstream counts it; no route can
  go via it: upstream's ``SetDefaultGW`` logs its failed route and goes on, and fails the ADD
  ("error setting default gateway") when it was the last gateway of the list (its loop keeps
  the last route's error), so multusd fails the ADD then too (before touching the namespace,
  and the ADD is rolled back), skips it with a warning otherwise, and never writes it into the
  cached result (upstream writes a route via ``<nil>`` there, which no plugin can read back).

Fixed upstream bugs: only the marked family is deleted (upstream deletes both); cached
``::/0`` routes are recognised (upstream only matched the spelling ``::0/0``), routes without
``dst`` are kept; the cache is read before the namespace is touched, so a missing cache file
fails the ADD without leaving the namespace and the cache disagreeing. This module decides;
the lower layers do: the namespace work is :class:`multusd.node.netns.PodNetns`'s, which
reports what it changed, and the cached result's edits are :mod:`multusd.cni.result`'s.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any, List, Mapping, Sequence

from multusd.cni import resultcache
from multusd.cni.result import with_default_routes, without_default_routes
from multusd.core.delegate import Delegate
from multusd.errors import InvalidNetworkConfig, IOFailure
from multusd.node.netns import PodNetns  # pyroute2 itself only when a pod asks for routes

LOG = logging.getLogger(__name__)


def apply_default_routes(delegate: Delegate, result: Mapping[str, Any], netns: PodNetns,
                         cache_dir: str, container_id: str) -> None:
    """Apply ``delegate``'s default-route flags after its ADD returned ``result``.

    ``netns`` is the request's one opening of the pod's namespace; ``cache_dir`` and
    ``container_id`` find the delegate's cached result. ``result`` itself is never modified;
    the cached copy on disk is.

    :raises IOFailure: no cached result for the delegate (nothing is changed then), or
        a netlink failure.
    :raises DecodeFailure: the cached result has malformed routes.
    :raises InvalidNetworkConfig: a requested gateway is not an IP address, or the last one
        is empty (nothing is changed then).
    """
    if not _configures_interfaces(result):
        return
    gateways = tuple(delegate.gateway_request or ())
    drop_v4 = delegate.filter_v4_gateway or bool(gateways)
    drop_v6 = delegate.filter_v6_gateway or bool(gateways)
    if not (drop_v4 or drop_v6):
        return
    net_name, ifname = delegate.conf_name, delegate.ifname
    if gateways and not gateways[-1]:
        raise InvalidNetworkConfig(
            f"error setting default gateway: the default-route of network {delegate.name!r} "
            "ends with an empty gateway (\"\" or null), and no route can go via none (upstream "
            "fails the same way: \"either Dst.IP, Src.IP or Gw must be set\"); name the "
            "gateway's address or remove it from the pod's network-selection annotation")
    if not all(gateways):
        LOG.warning("the default-route of network %r holds an empty gateway (\"\" or null): "
                    "no route goes via it (upstream logs the same failure and goes on)",
                    delegate.name)
        gateways = tuple(gateway for gateway in gateways if gateway)
    cached = resultcache.read_result(cache_dir, net_name, container_id, ifname)
    if cached is None:
        raise IOFailure(
            f"error deleting default gateway in cache: no cached result for network "
            f"{net_name!r} interface {ifname!r} under {cache_dir!r}; the delegate's "
            "ADD should have written it")
    where = resultcache.result_path(cache_dir, net_name, container_id, ifname)
    kept = without_default_routes(cached, drop_v4, drop_v6, where)
    updated = with_default_routes(kept, _addresses(gateways), where)
    change = netns.replace_default_routes(ifname, drop_v4, drop_v6, gateways)
    if updated != cached:
        resultcache.update_result(cache_dir, net_name, container_id, ifname, updated)
    LOG.info("default routes of %s (%s) in %s: removed %d (%s), added via %s", ifname,
             delegate.name, netns.path, change.removed,
             "+".join(n for n, on in (("IPv4", drop_v4), ("IPv6", drop_v6)) if on),
             ", ".join(gateways) or "none")


def _addresses(gateways: Sequence[str]) -> List[Any]:
    """The requested gateways as addresses (the pod's selection is the one to fix)."""
    addresses = []
    for gateway in gateways:
        try:
            addresses.append(ipaddress.ip_address(gateway))
        except ValueError:
            raise InvalidNetworkConfig(f"default-route gateway {gateway!r} is not an IP "
                                       "address; fix the pod's network selection") from None
    return addresses


def _configures_interfaces(result: Mapping[str, Any]) -> bool:
    # Upstream acts only when the (1.0-converted) result has interfaces or IPs: a plugin
    # that only tweaks something (e.g. a meta plugin) does not own a default route.
    return any(result.get(key) for key in ("interfaces", "ips", "ip4", "ip6"))
