"""``multusd doctor``: every check of a healthy node, each with a verdict and, failing, the fix."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from multusd import clock_now, go_field, go_loads
from multusd.tools import common

OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"
VERSION_TIMEOUT = 5.0


@dataclass
class Check:
    """One check's outcome: ``status`` is ok, fail, warn or skip."""

    name: str
    status: str
    verdict: str
    fix: str = ""
    details: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "status": self.status, "ok": self.status != FAIL,
                "verdict": self.verdict, "fix": self.fix, "details": self.details}


class Doctor:
    """Runs the checks in order; later ones use what earlier ones found (the API client)."""

    def __init__(self, config_path: str, rbac_path: str = "") -> None:
        self.config_path = config_path
        self.rbac_path = rbac_path
        self.config: Any = None
        self.probe: Any = None
        self.node: Any = None  # config.nodename.NodeName, once the config is read
        self.api_ok = False
        self.pods: Optional[List[Any]] = None
        self.sandboxes: Optional[List[Any]] = None  # every sandbox recorded on the node
        self.checks: List[Check] = []

    def run(self) -> List[Check]:
        self._add(self.check_config)
        if self.config is None:
            return self.checks
        for check in (self.check_socket, self.check_service, self.check_kubeconfig,
                      self.check_api, self.check_permissions, self.check_nad_api,
                      self.check_node, self.check_dra,
                      self.check_plugins, self.check_multus_conf, self.check_readiness,
                      self.check_stale, self.check_unreleased):
            self._add(check)
        return self.checks

    def _add(self, check: Callable[[], Check]) -> None:
        try:
            self.checks.append(check())
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
            name = check.__name__.replace("check_", "")
            self.checks.append(Check(name, FAIL, f"the check itself failed: "
                                     f"{type(exc).__name__}: {exc}"))

    # -- the checks ---------------------------------------------------------------------------
    def check_config(self) -> Check:
        try:
            self.config = common.load_config(self.config_path)
        except common.ToolError as exc:
            return Check("config", FAIL, str(exc), f"fix {self.config_path} (every problem is "
                         "listed above); the other checks need it")
        self.node = common.node_identity(self.config)
        warnings = list(self.config.warnings)
        return Check("config", WARN if warnings else OK, f"{self.config_path} is valid"
                     + (f" ({len(warnings)} warning(s))" if warnings else ""), details=warnings)

    def check_socket(self) -> Check:
        facts = common.socket_facts(self.config.socket_path)
        path = facts["path"]
        fix = ("multusd.socket creates it with SocketMode=0600 and DirectoryMode=0700: "
               "`systemctl restart multusd.socket` (do not chmod it by hand)")
        if not facts["exists"]:
            return Check("socket", FAIL, f"no socket at {path}: nothing listens for the shim",
                         "`systemctl enable --now multusd.socket`")
        if not facts["isSocket"]:
            return Check("socket", FAIL, f"{path} is not a socket", f"remove it; {fix}")
        problems = []
        if facts["mode"] != "0600":
            problems.append(f"{path} has mode {facts['mode']}, not 0600")
        if facts["dirMode"] != "0700":
            problems.append(f"{os.path.dirname(path)} has mode {facts['dirMode']}, not 0700")
        if problems:
            return Check("socket", FAIL, "; ".join(problems) + ": other users could reach "
                         "the daemon", fix)
        return Check("socket", OK, f"{path} is a socket, mode 0600 in a 0700 directory")

    def check_service(self) -> Check:
        units = common.systemd_units()
        details = [f"{u}: {p.get('ActiveState')} ({p.get('SubState')})"
                   for u, p in (units or {}).items()]
        if units is not None and units[common.SOCKET_UNIT].get("ActiveState") != "active":
            return Check("service", FAIL, f"{common.SOCKET_UNIT} is "
                         f"{units[common.SOCKET_UNIT].get('ActiveState')}",
                         f"`systemctl enable --now {common.SOCKET_UNIT}`", details)
        started = time.monotonic()
        ok, why = common.healthz(self.config.socket_path)  # under systemd: starts the service
        took = (time.monotonic() - started) * 1000
        if not ok:
            return Check("service", FAIL, f"the daemon does not answer /healthz on "
                         f"{self.config.socket_path} ({why})",
                         "see `journalctl -u multusd.service -b` for why it cannot start; "
                         "`multusd check-config` and `systemctl restart multusd.socket`", details)
        return Check("service", OK, f"the daemon answers /healthz ({took:.0f} ms)", "", details)

    def check_kubeconfig(self) -> Check:
        path = self.config.kubeconfig
        if not path:
            return Check("kubeconfig", SKIP, "no kubeconfig in daemon-config.json: multusd runs "
                         "without Kubernetes (no NetworkAttachmentDefinitions)")
        if not os.access(path, os.R_OK):
            return Check("kubeconfig", FAIL, f"kubeconfig {path} is not readable",
                         "point \"kubeconfig\" in daemon-config.json at the node's kubeconfig "
                         "(e.g. /etc/kubernetes/kubelet.conf), readable by root")
        from multusd.errors import MultusError
        from multusd.kube.access import ApiProbe

        try:
            self.probe = ApiProbe(path, self.node.name, node_source=self.node.source,
                                  request_timeout=5.0)
        except MultusError as exc:
            return Check("kubeconfig", FAIL, exc.msg, "fix the kubeconfig")
        return Check("kubeconfig", OK, f"{path} is readable; server {self.probe.server_url}")

    def check_api(self) -> Check:
        if self.probe is None:
            return Check("api", SKIP, "no usable kubeconfig")
        from multusd.errors import MultusError

        try:
            version, seconds = self.probe.version()
        except MultusError as exc:
            return Check("api", FAIL, exc.msg, "make the API server reachable from this node "
                         "(firewall, 'server' in the kubeconfig, its certificate)")
        self.api_ok = True
        return Check("api", OK, f"{self.probe.server_url} answered in {seconds * 1000:.0f} ms "
                     f"({version})")

    def check_permissions(self) -> Check:
        if not self.api_ok:
            return Check("permissions", SKIP, "the API server is not reachable")
        from multusd.errors import MultusError
        from multusd.kube.access import GRANTED_BY_NODE, PERMISSIONS
        from multusd.kube.clientconfig import RBAC_FILE

        rbac = self.rbac_path or RBAC_FILE
        denied, fixes = [], []
        for group, resource, verb, granted_by in PERMISSIONS:
            try:
                allowed, reason = self.probe.can(verb, group, resource)
            except MultusError as exc:
                return Check("permissions", FAIL, exc.msg, "allow SelfSubjectAccessReview "
                             "(every authenticated user may by default)")
            if allowed:
                continue
            denied.append(f"{verb} {resource}" + (f".{group}" if group else "")
                          + (f": {reason}" if reason else ""))
            fix = (f"`kubectl apply -f {rbac}` (once per cluster: NADs for every node)"
                   if granted_by != GRANTED_BY_NODE else
                   "the Node authorizer grants pods, pods/status and events to a node's own "
                   "kubeconfig (kube-apiserver --authorization-mode=Node,RBAC): point "
                   "\"kubeconfig\" at /etc/kubernetes/kubelet.conf, or bind upstream's multus "
                   "ClusterRole to this kubeconfig's user")
            if fix not in fixes:
                fixes.append(fix)
        if denied:
            return Check("permissions", FAIL, f"{len(denied)} of {len(PERMISSIONS)} "
                         "permissions multusd uses are denied", "; ".join(fixes), denied)
        return Check("permissions", OK, f"all {len(PERMISSIONS)} permissions multusd uses "
                     "are granted")

    def check_nad_api(self) -> Check:
        if not self.api_ok:
            return Check("nad-api", SKIP, "the API server is not reachable")
        problem = self.probe.nad_api()
        if problem is None:
            return Check("nad-api", OK, "NetworkAttachmentDefinitions can be listed")
        condition, message = problem
        fix = message[message.index("`"):] if "`" in message else "see the verdict"
        return Check("nad-api", FAIL, f"pods that ask for a NetworkAttachmentDefinition fail "
                     f"({condition}): {message}", fix)

    def check_node(self) -> Check:
        if not self.api_ok:
            return Check("node", SKIP, "the API server is not reachable")
        from multusd.errors import MultusError

        node, source = self.node.name, self.node.source
        fix = (f"set \"nodeName\" in {self.config.path} to this node's name as `kubectl get "
               "nodes` shows it")
        try:
            exists = self.probe.node_exists()
            self.pods = self.probe.pods_on_node()
            elsewhere = self._recorded_pods_elsewhere()
        except MultusError as exc:
            return Check("node", FAIL, exc.msg, "")
        if exists is False:
            return Check("node", FAIL, f"the API has no Node named {node!r} (from {source}): "
                         "no pod is ever cached, every ADD pays a live GET of its pod", fix)
        if elsewhere:
            return Check("node", FAIL, f"pods attached on this node are scheduled on another "
                         f"node per the API: {node!r} (from {source}) is not this node's name",
                         fix, elsewhere)
        known = "exists" if exists else "cannot be read (forbidden), but its pods can"
        return Check("node", OK, f"node {node!r} {known}; {len(self.pods)} pod(s) scheduled here")

    def check_dra(self) -> Check:
        """DRA (issue 22): may this node's credentials read ResourceClaims and ResourceSlices?"""
        if not self.api_ok:
            return Check("dra", SKIP, "the API server is not reachable")
        from multusd.errors import MultusError
        from multusd.kube.clientconfig import RBAC_FILE

        claimed = [f"{p.namespace}/{p.name}" for p in self.pods or []
                   if p.resource_claims or p.extended_claim is not None]
        try:
            self.probe.get_json("/apis/resource.k8s.io/v1")
        except self.probe.config.request_errors() as exc:
            if getattr(exc, "status", None) != 404:
                return Check("dra", FAIL, self.probe.config.failure(
                    exc, "read the resource.k8s.io/v1 API").msg, "")
            return Check("dra", FAIL if claimed else SKIP, "the API server does not serve "
                         "resource.k8s.io/v1 (DRA, Kubernetes 1.34+)" + (
                             f", yet {len(claimed)} pod(s) here hold claims" if claimed else
                             ": no pod can get a device from a ResourceClaim"),
                         "serve resource.k8s.io/v1 (Kubernetes 1.34 or later): multusd reads "
                         "ResourceClaims at v1 only" if claimed else "", claimed)
        denied = []
        for verb, resource in (("get", "resourceclaims"), ("list", "resourceslices")):
            try:
                allowed, reason = self.probe.can(verb, "resource.k8s.io", resource)
            except MultusError as exc:
                return Check("dra", FAIL, exc.msg, "")
            if not allowed:
                denied.append(f"{verb} {resource}.resource.k8s.io" + (f": {reason}"
                                                                      if reason else ""))
        if denied:
            affected = (f"; {len(claimed)} pod(s) on this node hold claims: their ADDs fail"
                        if claimed else "; ADDs of pods with DRA claims would fail")
            return Check("dra", FAIL, "this node's credentials may not read the DRA objects "
                         "that give NADs their devices" + affected, "`kubectl apply -f "
                         f"{self.rbac_path or RBAC_FILE}` (the multusd ClusterRole grants "
                         "resourceclaims get and resourceslices list)", denied + claimed)
        return Check("dra", OK, "resourceclaims (get) and resourceslices (list) of "
                     f"resource.k8s.io/v1 are readable; {len(claimed)} pod(s) here hold claims")

    def check_plugins(self) -> Check:
        from multusd.cni import invoke
        from multusd.cni.conflist import NetworkConfigList
        from multusd.core import effective
        from multusd.core.multus import Multus
        from multusd.core.podnetworks import build_delegates
        from multusd.errors import MultusError

        node = effective.for_node(self.config)  # what an ADD on this node is judged by
        if node.settings is None:
            return Check("plugins", FAIL, "the node's multus configuration (daemon-config.json "
                         f"over {node.source or 'no runtime config'}) does not load: "
                         f"{node.why_no_settings}", "fix clusterNetwork / delegates in "
                         "daemon-config.json or the runtime's multus config")
        get_nad = _memoized(self.probe.get_nad) if self.api_ok else None
        sources = [("the cluster network and defaultNetworks", "", "", {})]
        sources += [(f"pod {p.namespace}/{p.name}", p.namespace, p.name, dict(p.annotations))
                    for p in self.pods or []]
        wanted: Dict[str, tuple] = {}  # type -> (cniVersion, used by)
        warnings = []
        for label, namespace, name, pod_annotations in sources:
            try:
                delegates = build_delegates(
                    node.settings, pod_namespace=namespace, pod_name=name,
                    annotations=pod_annotations, cni_ifname="eth0", get_nad=get_nad)
            except MultusError as exc:
                if not namespace:
                    return Check("plugins", FAIL, f"{label}: {exc.msg}", "fix clusterNetwork / "
                                 "defaultNetworks in daemon-config.json")
                warnings.append(f"{label}: {exc.msg}")
                continue
            for delegate in delegates:
                try:
                    net = NetworkConfigList.load(delegate.conf, source=delegate.name)
                except MultusError as exc:
                    warnings.append(f"{label}: {exc.msg}")
                    continue
                for plugin in net.plugins:
                    ipam = plugin.get("ipam") if isinstance(plugin.get("ipam"), dict) else {}
                    for kind in (plugin.get("type"), ipam.get("type")):
                        if kind:
                            wanted.setdefault(str(kind), (net.cni_version, delegate.name))
        bin_dirs = Multus(self.config).engine(node.merged).bin_dirs
        missing = []
        for kind, (version, used_by) in sorted(wanted.items()):
            problem = _plugin_problem(invoke, kind, version, bin_dirs)
            if problem:
                missing.append(f"{kind} (used by {used_by}): {problem}")
        if missing:
            return Check("plugins", FAIL, f"{len(missing)} plugin(s) missing or broken",
                         f"install them in {bin_dirs[0]} (binDir), e.g. the "
                         "containernetworking-plugins package", missing + warnings)
        return Check("plugins", WARN if warnings else OK,
                     f"{len(wanted)} plugin type(s) found and answering VERSION in "
                     f"{':'.join(bin_dirs)}: {', '.join(sorted(wanted))}", "", warnings)

    def check_multus_conf(self) -> Check:
        state = common.multus_conf_state(self.config)
        path = state["path"]
        if state["state"] == "error":
            return Check("00-multus.conf", FAIL, state["detail"], "fix daemon-config.json")
        if state["state"] == "waiting":
            return Check("00-multus.conf", FAIL, f"{path} is not written: {state['detail']}",
                         "the primary network (or its readiness file) must exist first")
        if state["state"] in ("missing", "empty"):
            return Check("00-multus.conf", FAIL, f"{path} is {state['state']}: the runtime does "
                         "not call multus-shim", common.REGENERATE)
        problems = []
        try:
            with open(path, "rb") as handle:
                data = go_loads(handle.read())
        except (OSError, ValueError) as exc:
            return Check("00-multus.conf", FAIL, f"{path} is not valid JSON ({exc})",
                         common.REGENERATE)
        shim = str(go_field(self.config.raw, "type") or "multus-shim")
        if not isinstance(data, dict) or data.get("type") != shim:
            problems.append(f"its type is {data.get('type') if isinstance(data, dict) else '?'!r}"
                            f", not {shim!r}")
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode != 0o600:
            problems.append(f"mode {mode:04o}, not 0600")
        first = _first_conf(os.path.dirname(path))
        if first != os.path.basename(path):
            problems.append(f"{first!r} sorts before it: the runtime uses that one instead")
        if state["state"] == "differs":
            problems.append(state["detail"])
        if problems:
            return Check("00-multus.conf", FAIL, f"{path}: " + "; ".join(problems),
                         common.REGENERATE + (f"; move {first} away" if first and first !=
                                              os.path.basename(path) else ""))
        return Check("00-multus.conf", OK, f"{path} is current, first in its directory, "
                     "calls multus-shim, mode 0600")

    def check_readiness(self) -> Check:
        path = go_field(self.config.raw, "readinessindicatorfile")
        if not path:
            return Check("readiness", SKIP, "no readinessindicatorfile configured")
        if os.path.exists(path):
            return Check("readiness", OK, f"readiness indicator {path} is present")
        return Check("readiness", FAIL, f"readiness indicator {path} is absent: every ADD "
                     "waits for it and then fails", "check that the default network's pods "
                     "run on this node (they write it), or fix readinessindicatorfile")

    def check_stale(self) -> Check:
        from multusd.core import records

        stale = [r for r in self._sandboxes()
                 if r.netns_state() == records.GONE and r.failed_delete is None]
        # (those whose DEL failed are check_unreleased's)
        if not stale:
            return Check("stale", OK, "no sandbox outlived its network namespace")
        details = [f"{r.pod or '?'} {r.container_id}: netns {r.netns} is gone; "
                   + ", ".join(f"{a.ifname} {','.join(a.ips) or '-'}" for a in r.attachments)
                   for r in stale]
        return Check("stale", FAIL, f"{len(stale)} sandbox(es) whose network namespace is gone "
                     "still hold their addresses (the runtime's DEL was lost)",
                     "`multusd gc` lists them, `multusd gc --release` releases them", details)

    def check_unreleased(self) -> Check:
        """Sandboxes whose DEL failed: past deleteRetryWindow (unreleased), or still failing."""
        now = clock_now()
        failed = [r for r in self._sandboxes() if r.failed_delete is not None]
        details = [common.failed_delete_line(r, now) for r in failed]
        gone = [r for r in failed if r.is_unreleased(now)]
        if gone:
            return Check("unreleased", FAIL, f"{len(gone)} sandbox(es) could not be released: "
                         "their DEL kept failing past deleteRetryWindow and was answered "
                         "success so that their pods could terminate; what they hold "
                         "(addresses, interfaces) is still recorded",
                         "fix what each failure names (a plugin installed again, its daemon "
                         "running): the daemon retries them by itself, and `multusd gc` "
                         "releases them at once", details)
        if failed:
            return Check("unreleased", WARN, f"{len(failed)} sandbox(es) whose DEL is failing "
                         "(the runtime retries it)", "fix what each failure names", details)
        return Check("unreleased", OK, "no sandbox has a failing or unreleased DEL")

    # -- helpers ------------------------------------------------------------------------------
    def _sandboxes(self) -> List[Any]:
        """Every sandbox the node records (read once: three checks look at them)."""
        from multusd.core import records

        if self.sandboxes is None:
            self.sandboxes = records.read_node(common.cni_dirs(self.config),
                                               spare=common.spare_of(self.config))
        return self.sandboxes

    def _recorded_pods_elsewhere(self) -> List[str]:
        """Recorded (live) sandboxes whose pod the API schedules on another node."""
        from multusd.core import records

        here = {(p.namespace, p.name) for p in self.pods or []}
        found = []
        for record in self._sandboxes():
            key = (record.pod_namespace, record.pod_name)
            if not record.pod_name or key in here or record.netns_state() != records.PRESENT:
                continue
            node = self.probe.pod_node(*key)
            if node:
                found.append(f"pod {record.pod} (container {common.short(record.container_id)})"
                             f" is on node {node!r}")
        return found


def _plugin_problem(invoke, kind: str, cni_version: str, bin_dirs) -> str:
    from multusd.errors import MultusError

    try:
        path = invoke.find_plugin(kind, bin_dirs)
        env = invoke.build_env("VERSION", "", "", "", "", ":".join(bin_dirs))
        answer = invoke.exec_plugin(path, command="VERSION", env=env,
                                    stdin=json.dumps({"cniVersion": cni_version}).encode(),
                                    deadline=time.monotonic() + VERSION_TIMEOUT)
    except MultusError as exc:
        return exc.msg
    supported = (answer or {}).get("supportedVersions") or []
    if cni_version and supported and cni_version not in supported:
        return f"{path} does not support cniVersion {cni_version} (only {', '.join(supported)})"
    return ""


def _memoized(get_nad: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """One live GET per NAD however many pods select it (the probe has no watch cache)."""
    seen: Dict[tuple, Any] = {}

    def lookup(namespace: str, name: str) -> Any:
        if (namespace, name) not in seen:
            seen[(namespace, name)] = get_nad(namespace, name)
        return seen[(namespace, name)]

    return lookup


def _first_conf(directory: str) -> str:
    """The file a runtime loads from ``directory``: the lexically first CNI config."""
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.endswith((".conf", ".conflist", ".json")) and
                       os.path.isfile(os.path.join(directory, n)))
    except OSError:
        return ""
    return names[0] if names else ""


def run(config_path: str, *, as_json: bool = False, rbac_path: str = "") -> int:
    checks = Doctor(config_path, rbac_path).run()
    failed = [c for c in checks if c.status == FAIL]
    if as_json:
        common.emit_json({"ok": not failed, "checks": [c.to_json() for c in checks]})
    else:
        for check in checks:
            label = {OK: "ok", FAIL: "FAIL", WARN: "warn", SKIP: "skip"}[check.status]
            print(f"{label:<5} {check.name:<15} {check.verdict}")
            for detail in check.details:
                print(f"{'':<22}- {detail}")
            if check.fix and check.status in (FAIL, WARN):
                print(f"{'':<22}fix: {check.fix}")
        print(f"{len(failed)} check(s) failed" if failed else "all checks passed",
              file=sys.stderr if failed else sys.stdout)
    return common.EXIT_PROBLEM if failed else common.EXIT_OK
