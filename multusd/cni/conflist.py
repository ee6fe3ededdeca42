"""Running a network configuration list: our equivalent of libcni's AddNetworkList & co.

Usage (:class:`~multusd.cni.resultcache.RuntimeConf` is the cache module's)::

    net = NetworkConfigList.load(open("/etc/cni/net.d/10-br.conflist", "rb").read(),
                                 source="/etc/cni/net.d/10-br.conflist")
    rt = RuntimeConf(container_id="abc123", netns="/var/run/netns/x", ifname="eth0",
                     args=(("K8S_POD_NAME", "web"),), cache_dir="/var/lib/cni/multus")
    engine = Engine(["/opt/cni/bin"])
    result = engine.add(net, rt, deadline=time.monotonic() + 60)
    engine.delete(net, rt)

The engine keeps no per-request state: the daemon calls one instance from many threads.
Like libcni, a failed ADD does not undo the plugins that already ran: the caller decides
(multus runs DEL for the failed delegate).
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from multusd import CURRENT_VERSION, go_field, go_fields, go_loads
from multusd.errors import (DecodeFailure, DelegateError, IncompatibleCNIVersion,
                      InvalidEnvironment, InvalidNetworkConfig, MultusError, UnknownContainer)
from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.cni.args import format_cni_args
from multusd.cni.invoke import (PluginObserver, RunningPlugins, build_env, exec_plugin,
                                find_plugin, missing_plugin)
from multusd.cni.names import IFNAME_RULE, is_valid_ifname, is_valid_name
from multusd.cni.result import convert_result
from multusd.cni.version import (is_supported, parse_version, require_supported, supports_check,
                                 supports_status_gc)
from multusd.store import go_json
from multusd.store.valueclass import Record

LOG = logging.getLogger(__name__)




class NetworkConfigList(Record):
    """A parsed conflist (or a single conf wrapped as a one-plugin list)."""

    name: str
    cni_version: str
    plugins: Tuple[dict, ...]
    raw: dict
    data: bytes
    disable_check: bool = False
    disable_gc: bool = False

    @classmethod
    def load(cls, data: Union[bytes, dict], *, source: str = "") -> "NetworkConfigList":
        """Parse a conflist (has ``plugins``) or a single conf (has ``type``).

        :param source: where ``data`` came from (file, NAD), named in every error.
        :raises DecodeFailure: when ``data`` is not a JSON object.
        :raises InvalidNetworkConfig: when it is neither a conf nor a conflist, or a
            field has the wrong type.
        :raises IncompatibleCNIVersion: when its cniVersion is not one multusd supports.
        """
        where = source or "the network configuration"
        raw, raw_bytes = _decode(data, where)
        header: Mapping[str, Any] = raw  # libcni reads a list into a map: its keys exactly
        if "plugins" in raw:
            plugins = _plugins(raw, where)
        elif go_field(raw, "type"):
            plugins = (raw,)  # libcni's ConfListFromConf: the conf is its only plugin
            # ... read into a NetConf struct: "Name" and "CNIVersion" count too
            header = dict(raw, **go_fields(raw, ("cniVersion", "name")))
        else:
            raise InvalidNetworkConfig(
                f"error loading CNI config {where}: no 'type'; perhaps this is supposed to "
                "be a .conflist?")
        name = header.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidNetworkConfig(f"{where} has no 'name': set a network name")
        return cls(name=name, cni_version=_cni_version(header, where), plugins=plugins, raw=raw,
                   data=raw_bytes, disable_check=_flag(raw, "disableCheck", where),
                   disable_gc=_flag(raw, "disableGC", where))


class Engine:
    """Runs the plugins of network configuration lists (ADD, DEL, CHECK, STATUS, GC)."""

    def __init__(self, bin_dirs: Sequence[str], default_timeout: float = 120.0, *,
                 observer: Optional[PluginObserver] = None,
                 running: Optional[RunningPlugins] = None) -> None:
        """:param bin_dirs: directories searched for plugins, in order; also CNI_PATH.
        :param default_timeout: seconds a call may take when it is given no deadline.
        :param observer: told of every plugin execution (see :data:`PluginObserver`).
        :param running: every plugin run registers there (see :class:`RunningPlugins`)."""
        self.bin_dirs = tuple(bin_dirs)
        self.observer = observer
        self.running = running
        self.default_timeout = default_timeout
        self.cni_path = ":".join(self.bin_dirs)

    def add(self, net: NetworkConfigList, rt: RuntimeConf,
            deadline: Optional[float] = None) -> dict:
        """Run ADD through every plugin, chaining ``prevResult``; cache and return the
        final result (at ``net.cni_version``).

        :raises MultusError: the first plugin failure (a plugin's CNI error unchanged).
        """
        deadline = self._deadline(deadline)
        _validate_attachment(net, rt)
        result: Optional[dict] = None
        for plugin in net.plugins:
            conf = _plugin_conf(net, plugin, prev_result=result, rt=rt)
            output = self._run(plugin, "ADD", conf, rt, deadline)
            if output is None:
                raise DelegateError(
                    f"plugin {_describe(plugin)} of network {net.name!r} printed no result "
                    "on ADD; a CNI plugin must print its result JSON")
            result = _as_version(output, net.cni_version, plugin)
        assert result is not None  # load() guarantees at least one plugin
        resultcache.write(rt.cache_dir, net.name, rt, net.data, result)
        return result

    def delete(self, net: NetworkConfigList, rt: RuntimeConf,
               deadline: Optional[float] = None) -> None:
        """Run DEL through the plugins in reverse, then drop the cache entry.

        Every plugin gets its DEL even when an earlier one failed; the cache entry is
        kept when any failed, so that a retried DEL still has ``prevResult``.

        :raises MultusError: the first failure (a plugin's CNI error unchanged).
        """
        deadline = self._deadline(deadline)
        prev = self._cached_prev_result(net, rt) if supports_check(net.cni_version) else None
        errors: List[MultusError] = []
        for plugin in reversed(net.plugins):
            conf = _plugin_conf(net, plugin, prev_result=prev, rt=rt)
            try:
                self._run(plugin, "DEL", conf, rt, deadline)
            except MultusError as exc:
                LOG.warning("DEL of network %r (container %s, %s) failed in plugin %s: %s",
                            net.name, rt.container_id, rt.ifname, _describe(plugin), exc)
                errors.append(exc)
        if errors:
            # a missing binary first: it is what the operator must act on
            raise next((e for e in errors if missing_plugin(e)), errors[0])
        resultcache.delete(rt.cache_dir, net.name, rt.container_id, rt.ifname)

    def check(self, net: NetworkConfigList, rt: RuntimeConf,
              deadline: Optional[float] = None) -> None:
        """Run CHECK through every plugin with the cached result as ``prevResult``.

        :raises IncompatibleCNIVersion: for a network below spec 0.4.0.
        :raises UnknownContainer: when there is no cached result for the attachment.
        :raises MultusError: the first plugin failure.
        """
        if not supports_check(net.cni_version):
            raise IncompatibleCNIVersion(
                f"configuration version {net.cni_version!r} of network {net.name!r} does not "
                "support the CHECK command (it needs cniVersion 0.4.0 or newer)")
        if net.disable_check:
            return
        deadline = self._deadline(deadline)
        prev = self._cached_prev_result(net, rt)
        if prev is None:
            raise UnknownContainer(
                f"cannot CHECK network {net.name!r} for container {rt.container_id!r} "
                f"interface {rt.ifname!r}: no cached result at "
                f"{resultcache.result_path(rt.cache_dir, net.name, rt.container_id, rt.ifname)}; "
                "was ADD run for this attachment (with the same cache directory)?")
        for plugin in net.plugins:
            self._run(plugin, "CHECK", _plugin_conf(net, plugin, prev_result=prev, rt=rt),
                      rt, deadline)

    def status(self, net: NetworkConfigList, deadline: Optional[float] = None) -> None:
        """Ask every plugin for STATUS (spec 1.1.0+; older networks succeed at once).

        :raises MultusError: the first plugin that is not ready, its error unchanged.
        """
        if not supports_status_gc(net.cni_version):
            return
        deadline = self._deadline(deadline)
        for plugin in net.plugins:
            self._run(plugin, "STATUS", _plugin_conf(net, plugin), None, deadline)

    def gc(self, net: NetworkConfigList, rt_cache_dir: str, valid_attachments: List[dict],
           deadline: Optional[float] = None) -> None:
        """Garbage-collect network ``net`` as libcni's GCNetworkList does.

        DEL every attachment cached under ``rt_cache_dir`` for this network that is not
        in ``valid_attachments`` (``{"containerID": ..., "ifname": ...}`` dicts), then (spec
        1.1.0+) send GC to every plugin with ``cni.dev/valid-attachments``.

        :raises MultusError: after trying everything, the first failure (all are logged).
        """
        if net.disable_gc:
            return
        deadline = self._deadline(deadline)
        valid = {(a.get("containerID"), a.get("ifname")) for a in valid_attachments}
        errors: List[MultusError] = []
        for entry in resultcache.list_entries(rt_cache_dir):
            if entry["networkName"] != net.name:
                continue
            if (entry["containerId"], entry["ifName"]) in valid:
                continue
            try:
                self.delete(net, _runtime_from_cache(entry, rt_cache_dir), deadline)
            except MultusError as exc:
                LOG.warning("GC of network %r: DEL of stale attachment %s/%s failed: %s",
                            net.name, entry["containerId"], entry["ifName"], exc)
                errors.append(exc)
        if supports_status_gc(net.cni_version):
            attachments = [dict(a) for a in valid_attachments]
            extra = {"cni.dev/valid-attachments": attachments,
                     # libcni also sends the name an older spec draft used (cni#1101)
                     "cni.dev/attachments": attachments}
            for plugin in net.plugins:
                try:
                    self._run(plugin, "GC", _plugin_conf(net, plugin, extra=extra), None,
                              deadline)
                except MultusError as exc:
                    LOG.warning("GC of network %r failed in plugin %s: %s", net.name,
                                _describe(plugin), exc)
                    errors.append(exc)
        if errors:
            raise errors[0]

    def cached_result(self, net_name: str, rt: RuntimeConf) -> Optional[dict]:
        """The result cached by the last ADD of ``net_name`` for ``rt``, or None."""
        return resultcache.read_result(rt.cache_dir, net_name, rt.container_id, rt.ifname)

    def _cached_prev_result(self, net: NetworkConfigList, rt: RuntimeConf) -> Optional[dict]:
        cached = self.cached_result(net.name, rt)
        if cached is None:
            return None
        try:
            return convert_result(cached, net.cni_version)
        except MultusError as exc:
            # As libcni: an unusable cached result is as good as none.
            LOG.warning("ignoring cached result of network %r for container %s: %s",
                        net.name, rt.container_id, exc)
            return None

    def _run(self, plugin: dict, command: str, conf: dict, rt: Optional[RuntimeConf],
             deadline: float) -> Optional[dict]:
        path = find_plugin(go_field(plugin, "type", ""), self.bin_dirs)
        if rt is None:  # STATUS and GC concern no attachment
            env = build_env(command, "", "", "", "", self.cni_path)
        else:
            env = build_env(command, rt.container_id, rt.netns, rt.ifname,
                            format_cni_args(rt.args), self.cni_path)
        LOG.debug("%s %s: plugin %s", command, conf.get("name"), path)
        # libcni injects name, cniVersion, prevResult and runtimeConfig into the plugin's config
        # read as a map, and writes it out again: Go's JSON, keys sorted (1e2 is 100)
        stdin = go_json(conf, sort_keys=True).encode()
        return exec_plugin(path, command=command, stdin=stdin, env=env,
                           deadline=deadline, observer=self.observer, running=self.running)

    def _deadline(self, deadline: Optional[float]) -> float:
        return time.monotonic() + self.default_timeout if deadline is None else deadline


def _plugin_conf(net: NetworkConfigList, plugin: dict, *, prev_result: Optional[dict] = None,
                 rt: Optional[RuntimeConf] = None,
                 extra: Optional[Dict[str, Any]] = None) -> dict:
    """The stdin of one plugin call: a copy of its conf with the list's name and version,
    ``prevResult``, and ``runtimeConfig`` holding only the capabilities it declares."""
    conf = dict(plugin)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    if prev_result is not None:
        conf["prevResult"] = prev_result
    if rt is not None:
        runtime_config = _runtime_config(plugin, rt.capability_args)
        if runtime_config:
            conf["runtimeConfig"] = runtime_config
    if extra:
        conf.update(extra)
    return conf


def _runtime_config(plugin: dict, capability_args: Mapping[str, Any]) -> Dict[str, Any]:
    capabilities = go_field(plugin, "capabilities", nil=True)  # its NetConf struct's field
    if not isinstance(capabilities, dict):
        return {}
    return {name: capability_args[name] for name, enabled in capabilities.items()
            if enabled is True and name in capability_args}


def _as_version(output: dict, cni_version: str, plugin: dict) -> dict:
    # A plugin that omits cniVersion answered in the config's version (libcni, cni#895).
    result = dict(output)
    if not result.get("cniVersion"):
        result["cniVersion"] = cni_version
    try:
        return convert_result(result, cni_version)
    except MultusError as exc:
        raise DelegateError(
            f"plugin {_describe(plugin)} returned a result that cannot be used: {exc.msg}",
            go_json(output)[:4096]) from exc


def _runtime_from_cache(entry: dict, cache_dir: str) -> RuntimeConf:
    args = tuple((str(k), str(v)) for k, v in entry.get("cniArgs") or ())
    return RuntimeConf(container_id=entry["containerId"], netns=entry.get("netns", ""),
                       ifname=entry["ifName"], args=args,
                       capability_args=dict(entry.get("capabilityArgs") or {}),
                       cache_dir=cache_dir)


def _validate_attachment(net: NetworkConfigList, rt: RuntimeConf) -> None:
    """libcni's checks before ADD: they keep cache file names and plugin input sane."""
    if not rt.container_id:
        raise UnknownContainer("missing container ID (CNI_CONTAINERID is empty)")
    if not is_valid_name(rt.container_id):
        raise InvalidEnvironment(
            f"invalid characters in container ID {rt.container_id!r}: use letters, digits, "
            "'_', '.' and '-', starting with a letter or digit")
    if not is_valid_name(net.name):
        raise InvalidNetworkConfig(
            f"invalid characters in network name {net.name!r}: use letters, digits, '_', "
            "'.' and '-', starting with a letter or digit")
    ifname = rt.ifname
    if not is_valid_ifname(ifname):
        raise InvalidEnvironment(f"invalid interface name {ifname!r}: it must be {IFNAME_RULE}")


def _describe(plugin: dict) -> str:
    return f"type={go_field(plugin, 'type')!r}"


def _decode(data: Union[bytes, dict], where: str) -> Tuple[dict, bytes]:
    if isinstance(data, dict):
        # A private copy: the caller may go on changing its dict.
        return copy.deepcopy(data), go_json(data).encode()
    try:
        raw = go_loads(data)
    except ValueError as exc:
        raise DecodeFailure(f"error parsing CNI config {where}: invalid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise DecodeFailure(f"error parsing CNI config {where}: expected a JSON object, "
                            f"got {type(raw).__name__}")
    return raw, bytes(data)


def _plugins(raw: dict, where: str) -> Tuple[dict, ...]:
    plugins = raw["plugins"]
    if not isinstance(plugins, list) or not plugins:
        raise InvalidNetworkConfig(f"{where}: 'plugins' must be a non-empty list")
    for index, plugin in enumerate(plugins):
        if not isinstance(plugin, dict):
            raise InvalidNetworkConfig(f"{where}: plugins[{index}] must be an object")
        plugin_type = go_field(plugin, "type")  # each plugin is read into a NetConf struct
        if not isinstance(plugin_type, str) or not plugin_type:
            raise InvalidNetworkConfig(f"{where}: plugins[{index}] has no 'type': name the "
                                       "plugin binary to run")
    return tuple(plugins)


def _cni_version(raw: dict, where: str) -> str:
    """The version to run at: ``cniVersion``, or the newest supported of ``cniVersions``."""
    version = raw.get("cniVersion")
    if version is not None and not isinstance(version, str):
        raise InvalidNetworkConfig(f"{where}: 'cniVersion' must be a string, got {version!r}")
    candidates = [version] if version else []
    listed = raw.get("cniVersions")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
            raise InvalidNetworkConfig(f"{where}: 'cniVersions' must be a list of strings")
        for entry in listed:
            parse_version(entry)
        candidates += [v for v in listed if is_supported(v)]
        # Versions newer than ours are skipped, as libcni does.
        newest = parse_version(CURRENT_VERSION)
        candidates = [v for v in candidates if parse_version(v) <= newest]
    if not candidates:
        raise InvalidNetworkConfig(f"{where} has no 'cniVersion': set it to one of the "
                                   "versions its plugins support, e.g. \"1.0.0\"")
    chosen = max(candidates, key=parse_version)
    return require_supported(chosen, where)


def _flag(raw: dict, key: str, where: str) -> bool:
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidNetworkConfig(f"{where}: {key!r} must be true or false, got {value!r}")
