"""Netlink inside a pod's network namespace (the only user of pyroute2): links and default routes.

Interface lookups are one ioctl on the namespace's socket; pyroute2 is imported only for
routes (pods with a ``default-route`` request).

Upstream: the netlink half of ``netutils.go`` (``DeleteDefaultGW``, ``SetDefaultGW``) and
the interface lookup of ``validateIfName`` (F37, F50).

How a namespace is entered: a short-lived thread of its own opens the netns file,
``setns()`` into it (which changes that thread's namespace only), creates a NETLINK_ROUTE
socket and ends. The daemon then drives that socket (an ioctl for interface lookups,
``IPRoute(fileno=...)`` for routes): a netlink socket stays bound to the namespace it was
created in, so no serving thread ever changes namespace and a missing namespace is never
created (pyroute2 0.7.2 has no ``IPRoute(netns=...)``, and
its ``NetNS`` proxy creates missing namespaces by default and costs four times more).

Usage, one namespace opening per ADD (see :class:`PodNetns`)::

    with PodNetns(netns_path) as pod_netns:
        change = pod_netns.replace_default_routes("net1", True, False, ["10.1.1.254"])

This module only changes the namespace and reports what it changed (:class:`RouteChange`);
deciding which delegate loses or gains a default route, and keeping libcni's cached result
in step (through :mod:`multusd.cni.result`'s edits), is :mod:`multusd.core.defaultroute`'s.
:func:`check_namespace` tells whether a CNI_NETNS opens as a namespace at all (CHECK, DEL).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import errno
import ipaddress
import logging
import os
import socket
import struct
import sys
import threading
from typing import (Any, NamedTuple, Iterator, List, Optional,
                    Sequence, Tuple)


from multusd.errors import (InvalidEnvironment, InvalidNetworkConfig, IOFailure,
                     MultusError, UnknownContainer)

LOG = logging.getLogger(__name__)


class RouteChange(NamedTuple):
    """What :meth:`PodNetns.replace_default_routes` changed in the namespace."""

    ifname: str
    removed: int
    added: Tuple[str, ...]

_CLONE_NEWNET = 0x40000000
_SIOCGIFINDEX = 0x8933
_IFNAMSIZ = 16
_RT_TABLE_MAIN = 254
_FAMILY_NAMES = {socket.AF_INET: "IPv4", socket.AF_INET6: "IPv6"}

_libc: Optional[ctypes.CDLL] = None
OPEN_TIMEOUT = 5.0  # a namespace file opens in microseconds; this is a hung mount


def check_namespace(path: str) -> None:
    """``path`` opens as a network namespace, within a bound (not a FIFO, a plain file or a
    hung mount).

    :raises UnknownContainer: it does not exist.
    :raises MultusError: it is something else, or does not open in time.
    """
    with PodNetns(path) as netns:
        netns.interface_exists("lo")


class PodNetns:
    """A pod's network namespace, opened on first use and closed by ``close()``/``with``.

    Opening takes a short-lived thread that enters the namespace (well under a millisecond),
    so one request keeps one instance and passes it around. Not thread-safe: one request,
    one instance.

    Every method raises :class:`~multusd.errors.UnknownContainer` when the namespace does
    not exist, and :class:`~multusd.errors.IOFailure` for netlink failures.
    """

    def __init__(self, netns_path: str) -> None:
        self.path = netns_path
        self._fd: Optional[int] = None  # the netlink socket the child made in the namespace
        self._ipr: Any = None  # pyroute2's IPRoute on that socket, for routes only

    def __enter__(self) -> "PodNetns":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the netlink socket, if one was opened."""
        if self._ipr is not None:
            ipr, self._ipr, self._fd = self._ipr, None, None
            ipr.close()  # it owns the socket
        elif self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    # --- interfaces -------------------------------------------------------------------------

    def interface_exists(self, ifname: str) -> bool:
        """True when a link named ``ifname`` exists in the namespace (F37 validateIfName)."""
        return self._link_index(ifname) is not None

    def link_index(self, ifname: str) -> int:
        """The index of ``ifname``.

        :raises IOFailure: when there is no such link in the namespace.
        """
        index = self._link_index(ifname)
        if index is None:
            raise IOFailure(f"interface {ifname!r} does not exist in network namespace "
                            f"{self.path!r}; the delegate plugin should have created it")
        return index

    # --- default routes ---------------------------------------------------------------------

    def delete_default_routes(self, ifname: str, family: int) -> int:
        """Delete the main-table default routes of ``family`` that leave through ``ifname``.

        :param family: ``socket.AF_INET`` or ``socket.AF_INET6``.
        :returns: how many routes were deleted.
        """
        family_name = _family_name(family)
        index = self.link_index(ifname)
        deleted = 0
        for route in self._default_routes(index, family):
            gateway = route.get_attr("RTA_GATEWAY")
            action = (f"cannot delete the {family_name} default route via {gateway} on "
                      f"{ifname!r} in network namespace {self.path!r}")
            try:
                with _netlink_errors(action):
                    self._iproute().route("del", family=family, dst_len=0, tos=route["tos"],
                                          table=_route_table(route), oif=index,
                                          gateway=gateway,
                                          priority=route.get_attr("RTA_PRIORITY"))
            except IOFailure as exc:
                if _netlink_code(exc.__cause__) == errno.ESRCH:
                    continue  # removed meanwhile (e.g. with its address): what we wanted
                raise
            deleted += 1
            LOG.debug("deleted %s default route via %s on %s in %s", family_name, gateway,
                      ifname, self.path)
        return deleted

    def add_default_route(self, ifname: str, gateway: str) -> bool:
        """Add a main-table default route via ``gateway`` on ``ifname``.

        :returns: True if added, False if that very route already existed (EEXIST).
        :raises InvalidNetworkConfig: ``gateway`` is not an IP address.
        :raises IOFailure: the kernel refused it, e.g. the gateway is not reachable on
            ``ifname`` or another link holds a default route with the same metric.
        """
        address = _parse_gateway(gateway)
        family = socket.AF_INET if address.version == 4 else socket.AF_INET6
        index = self.link_index(ifname)
        action = (f"cannot add the default route via {address} on {ifname!r} in network "
                  f"namespace {self.path!r}")
        try:
            with _netlink_errors(action):
                self._iproute().route("add", family=family, dst_len=0, gateway=str(address),
                                      oif=index, table=_RT_TABLE_MAIN)
        except IOFailure as exc:
            if _netlink_code(exc.__cause__) != errno.EEXIST:
                raise
            if not self._has_default_route(index, family, str(address)):
                raise IOFailure(f"{action}: another default route with the same metric "
                                "exists on a different interface; remove it first") from exc
            LOG.debug("default route via %s on %s in %s already exists", address, ifname,
                      self.path)
            return False
        LOG.debug("added default route via %s on %s in %s", address, ifname, self.path)
        return True

    def replace_default_routes(self, ifname: str, ipv4: bool, ipv6: bool,
                               gateways: Sequence[str]) -> "RouteChange":
        """Delete the IPv4/IPv6 default routes of ``ifname`` and add one via each gateway.

        Reports what it changed; the caller keeps libcni's cached result in step.

        :raises IOFailure: a netlink failure, or ``ifname`` missing.
        :raises InvalidNetworkConfig: a gateway is not an IP address.
        """
        removed = 0
        for family, wanted in ((socket.AF_INET, ipv4), (socket.AF_INET6, ipv6)):
            if wanted:
                removed += self.delete_default_routes(ifname, family)
        added = tuple(g for g in gateways if self.add_default_route(ifname, g))
        return RouteChange(ifname=ifname, removed=removed, added=added)

    # --- internals --------------------------------------------------------------------------

    def _socket(self) -> int:
        if self._fd is None:
            self._fd = _netlink_socket_in(self.path)
        return self._fd

    def _iproute(self) -> Any:
        if self._ipr is None:
            from pyroute2 import IPRoute  # only pods with a default-route request pay for it

            self._ipr = IPRoute(fileno=self._socket())
        return self._ipr

    def _link_index(self, ifname: str) -> Optional[int]:
        # SIOCGIFINDEX on the namespace's own socket: no pyroute2 (12 MB, tens of ms to
        # import) for the interface-name check every ADD makes.
        name = ifname.encode("utf-8", "surrogatepass")
        if not name or len(name) >= _IFNAMSIZ or b"\0" in name:
            return None  # no interface can have that name
        try:
            answer = fcntl.ioctl(self._socket(), _SIOCGIFINDEX, struct.pack("16si", name, 0))
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                return None
            raise IOFailure(f"cannot look up interface {ifname!r} in network namespace "
                            f"{self.path!r}: {exc.strerror}") from exc
        return int(struct.unpack("16si", answer)[1])

    def _default_routes(self, index: int, family: int) -> List[Any]:
        with _netlink_errors(f"cannot list routes in network namespace {self.path!r}"):
            routes = self._iproute().get_routes(family=family)
        # Main table only, as netlink.RouteList does upstream; local/other tables stay.
        return [r for r in routes
                if r["dst_len"] == 0 and _route_table(r) == _RT_TABLE_MAIN
                and r.get_attr("RTA_OIF") == index]

    def _has_default_route(self, index: int, family: int, gateway: str) -> bool:
        return any(_same_address(r.get_attr("RTA_GATEWAY"), gateway)
                   for r in self._default_routes(index, family))


# --- helpers ----------------------------------------------------------------------------------


def _netlink_socket_in(netns_path: str) -> int:
    """A NETLINK_ROUTE socket created inside ``netns_path`` by a short-lived thread; its fd.

    ``setns()`` changes the namespace of the calling thread only, so a thread of its own
    enters the pod's namespace, makes the socket and ends: no other thread ever changes
    namespace, and nothing is forked (forking the daemon cost ~5 ms per ADD). The thread
    opens the path: a hung mount blocks it, never this worker (bounded wait; a socket made
    after the wait is closed, not leaked).
    """
    setns = _setns_function()
    outcome: dict = {}
    lock = threading.Lock()

    def enter() -> None:
        try:
            # O_NONBLOCK: a FIFO at CNI_NETNS opens at once (and setns refuses it: EINVAL).
            netns_fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                setns(netns_fd)
            finally:
                os.close(netns_fd)
            made = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE)
        except OSError as exc:
            outcome["error"] = exc
            return
        with lock:
            if outcome.get("abandoned"):
                made.close()
            else:
                outcome["fd"] = made.detach()

    worker = threading.Thread(target=enter, name="multusd-netns-enter", daemon=True)
    worker.start()
    worker.join(OPEN_TIMEOUT)
    with lock:
        if "fd" in outcome:
            return outcome["fd"]
        if "error" not in outcome:
            outcome["abandoned"] = True
            raise IOFailure(f"network namespace {netns_path!r} did not open within "
                            f"{OPEN_TIMEOUT:.0f}s: CNI_NETNS is on a hung mount or is not a "
                            "namespace file")
    raise _netns_error(netns_path, outcome["error"])


def _setns_function() -> Any:
    native = getattr(os, "setns", None)  # Python 3.12+
    if native is not None:
        return lambda fd: native(fd, _CLONE_NEWNET)
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    libc_setns = _libc.setns

    def setns(fd: int) -> None:
        if libc_setns(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return setns


def _netns_error(netns_path: str, exc: OSError) -> MultusError:
    if exc.errno == errno.ENOENT:
        return UnknownContainer(f"network namespace {netns_path!r} does not exist: the "
                                "container is gone or CNI_NETNS is wrong")
    if exc.errno == errno.EINVAL:
        return InvalidEnvironment(f"{netns_path!r} is not a network namespace: CNI_NETNS must "
                                  "name a network namespace file such as /var/run/netns/<name>")
    if exc.errno in (errno.EPERM, errno.EACCES):
        return IOFailure(f"cannot enter network namespace {netns_path!r}: {exc.strerror}; "
                         "multusd needs CAP_SYS_ADMIN and CAP_NET_ADMIN")
    return IOFailure(f"cannot enter network namespace {netns_path!r}: {exc.strerror}")


@contextlib.contextmanager
def _netlink_errors(action: str) -> Iterator[None]:
    """Translate pyroute2/OS errors into IOFailure, keeping the original as ``__cause__``."""
    try:
        yield
    except OSError as exc:
        raise IOFailure(f"{action}: {exc.strerror or exc}") from exc
    except Exception as exc:
        code = _netlink_code(exc)
        if code is None:
            raise
        reason = os.strerror(code) if code else str(exc)
        hint = ""
        if code == errno.ENETUNREACH:
            hint = "; the gateway must be inside a subnet configured on that interface"
        raise IOFailure(f"{action}: {reason}{hint}") from exc


def _netlink_code(exc: Optional[BaseException]) -> Optional[int]:
    """The errno of a pyroute2 NetlinkError (None for anything else, or without pyroute2)."""
    errors = sys.modules.get("pyroute2.netlink.exceptions")
    if errors is None or not isinstance(exc, errors.NetlinkError):
        return None
    return int(exc.code or 0)


def _family_name(family: int) -> str:
    try:
        return _FAMILY_NAMES[family]
    except KeyError:
        raise ValueError(f"address family {family!r} is neither AF_INET nor AF_INET6") \
            from None


def _route_table(route: Any) -> int:
    return int(route.get_attr("RTA_TABLE") or route["table"])


def _same_address(left: Optional[str], right: str) -> bool:
    if not left:
        return False
    return ipaddress.ip_address(left) == ipaddress.ip_address(right)


def _parse_gateway(gateway: str) -> Any:
    try:
        return ipaddress.ip_address(gateway)
    except ValueError:
        raise InvalidNetworkConfig(f"a default route needs a gateway address, not "
                                   f"{gateway!r}") from None
