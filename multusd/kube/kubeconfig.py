"""Reading a node's kubeconfig into :class:`Settings`: the API server, its TLS files, credentials.

A node daemon's kubeconfig (the one the multus installer writes, or the kubelet's) uses a few
forms, which :func:`load` reads itself, with client-go's rules:

* the current context's cluster: ``server`` (trailing ``/`` dropped), and for ``https`` only
  ``certificate-authority`` / ``certificate-authority-data``, ``insecure-skip-tls-verify``,
  ``tls-server-name``; ``proxy-url`` (read as written: the transport takes an ``http://``
  proxy, and refuses an ``https://`` or SOCKS one when it is built);
* its user: ``token`` or ``tokenFile`` (kept as a path: it is re-read when it changes),
  ``client-certificate`` / ``client-key`` (and their ``-data``; loaded for ``https`` only; the
  files are named, not read, so a rotated kubelet certificate is picked up),
  ``username`` + ``password``;
* file names relative to the kubeconfig's directory; a ``-data`` value wins over its file,
  unless it is empty (then the file counts, as in client-go).

A user with ``exec`` gives an :class:`ExecPlugin` that multusd runs itself, with a timeout
(:mod:`multusd.kube.execplugin`; ``load(path, exec_plugins=True)``, what the daemon calls);
one with ``auth-provider`` gives None: the caller hands it to the ``kubernetes`` package's
own loader (:func:`from_configuration` reads its result back).
``-data`` certificates and keys become files (Python's TLS reads only files) named by the
hash of their content in a root-only directory, so a restart reuses them instead of leaving
another copy of the private key behind. Errors name keys and files, never values.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from multusd import store
from multusd.errors import MultusError
from multusd.store.valueclass import Record

DATA_DIR_NAME = "multusd-kubeconfig"
API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names keys and files, never their values."""


class ExecPlugin(NamedTuple):
    """What a user's ``exec`` says: the credential plugin :mod:`multusd.kube.execplugin` runs."""

    command: str
    args: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...]
    api_version: str
    cwd: str
    cluster: Optional[str] = None  # the JSON of spec.cluster, with provideClusterInfo
    install_hint: str = ""

    @property
    def name(self) -> str:
        """The command as the operator wrote it, for messages."""
        return self.command


class Settings(Record):
    """Where the API server is and how to authenticate to it (no secret in ``repr``)."""

    host: str
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    verify: bool = True
    tls_server_name: Optional[str] = None
    proxy_url: Optional[str] = None
    token: Optional[str] = None  # the bearer token itself (not the header)
    token_file: Optional[str] = None  # re-read when it changes
    basic: Optional[str] = None  # "user:password"
    exec_plugin: Optional[ExecPlugin] = None  # a credential plugin multusd runs itself

    def __repr__(self) -> str:
        return (f"Settings(host={self.host!r}, ca_file={self.ca_file!r}, "
                f"cert_file={self.cert_file!r}, token_file={self.token_file!r})")


def load(path: str, *, exec_plugins: bool = False) -> Optional[Settings]:
    """The :class:`Settings` of the kubeconfig at ``path``.

    :param exec_plugins: an ``exec`` user gives Settings whose :attr:`Settings.exec_plugin`
        multusd runs itself (:mod:`multusd.kube.execplugin`: with a timeout).
    :returns: None when the current user needs a credential plugin (``auth-provider``, and
        ``exec`` unless ``exec_plugins``): use the ``kubernetes`` package's loader then.
    :raises KubeconfigError: the kubeconfig is not usable (the message says why).
    :raises OSError: a file it names cannot be read. YAML errors come from ``yaml``.
        The parsed document is kept for the next start (:func:`read_document`).
    """
    document = read_document(path)
    base = os.path.abspath(os.path.dirname(path))
    if "current-context" not in document:
        raise KubeconfigError("it has no 'current-context'")
    context = _named(document, "contexts", document["current-context"], "context")
    user = _user(document, context)
    if "auth-provider" in user or ("exec" in user and not exec_plugins):
        return None
    # the package's order: auth-provider, then token or tokenFile, then exec
    runs_exec = "exec" in user and not user.get("token") and not user.get("tokenFile")
    cluster = _named(document, "clusters", context.get("cluster"), "cluster")
    settings: Dict[str, Any] = {"host": str(cluster.get("server") or "").rstrip("/")}
    if settings["host"].startswith("https"):
        settings["ca_file"] = _file(cluster, "certificate-authority", base)
        settings["cert_file"] = _file(user, "client-certificate", base)
        settings["key_file"] = _file(user, "client-key", base)
        if cluster.get("tls-server-name"):
            settings["tls_server_name"] = str(cluster["tls-server-name"])
    if "insecure-skip-tls-verify" in cluster:
        settings["verify"] = not cluster["insecure-skip-tls-verify"]
    if cluster.get("proxy-url"):
        settings["proxy_url"] = str(cluster["proxy-url"])
    if runs_exec:
        settings["exec_plugin"] = exec_plugin(user["exec"], cluster, base)
    elif user.get("token"):
        settings["token"] = str(user["token"]).strip()
    elif user.get("tokenFile"):
        settings["token_file"] = os.path.normpath(os.path.join(base, str(user["tokenFile"])))
        read_token_file(settings["token_file"])  # a missing file is an error now, not later
    elif "username" in user and "password" in user:
        settings["basic"] = f"{user['username']}:{user['password']}"
    return Settings(**settings)


def exec_plugin(spec: Any, cluster: Dict[str, Any], base: str) -> ExecPlugin:
    """The :class:`ExecPlugin` of a user's ``exec`` mapping (``base``: the kubeconfig's dir).

    :raises KubeconfigError: it lacks ``command`` or ``apiVersion``, asks for an unknown
        protocol version, or for an interactive plugin.
    """
    if not isinstance(spec, dict) or not spec.get("command"):
        raise KubeconfigError("its user's 'exec' has no 'command'")
    version = str(spec.get("apiVersion") or "")
    if version not in API_VERSIONS:
        raise KubeconfigError(f"its user's 'exec' asks for apiVersion {version!r}; multusd "
                              f"speaks {' and '.join(API_VERSIONS)}")
    if spec.get("interactiveMode") == "Always":
        raise KubeconfigError("its user's 'exec' plugin needs a terminal (interactiveMode: "
                              "Always), which a node daemon never has; use a plugin that "
                              "runs unattended")
    env: List[Tuple[str, str]] = []
    for item in spec.get("env") or []:
        if not isinstance(item, dict) or "name" not in item:
            raise KubeconfigError("its user's 'exec' has an 'env' entry without a 'name'")
        env.append((str(item["name"]), str(item.get("value", ""))))
    return ExecPlugin(command=str(spec["command"]),
                      args=tuple(str(arg) for arg in spec.get("args") or ()),
                      env=tuple(env), api_version=version, cwd=base,
                      cluster=_cluster_info(cluster, base) if spec.get("provideClusterInfo")
                      else None,
                      install_hint=str(spec.get("installHint") or "")[:300])


def _cluster_info(cluster: Dict[str, Any], base: str) -> str:
    """spec.cluster of KUBERNETES_EXEC_INFO: the cluster's connection facts and the
    ``client.authentication.k8s.io/exec`` extension's config."""
    info: Dict[str, Any] = {"server": str(cluster.get("server") or "")}
    for key in ("tls-server-name", "insecure-skip-tls-verify", "certificate-authority-data",
                "proxy-url", "disable-compression"):
        if cluster.get(key) not in (None, ""):
            info[key] = cluster[key]
    if "certificate-authority-data" not in info and cluster.get("certificate-authority"):
        try:
            with open(os.path.join(base, str(cluster["certificate-authority"])), "rb") as handle:
                info["certificate-authority-data"] = base64.b64encode(handle.read()).decode()
        except OSError:
            pass
    for extension in cluster.get("extensions") or []:
        if isinstance(extension, dict) and \
                extension.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = extension.get("extension")
    return json.dumps(info)


def read_document(path: str) -> Dict[str, Any]:
    """The kubeconfig at ``path`` as a mapping ({} if it holds something else).

    Parsing YAML (importing ``yaml`` is ~100M instructions, a third of the client's start-up)
    is done once per content: the result is kept as JSON, named by the hash of the path and
    of the bytes, in the root-only directory of the ``-data`` files (a tmpfs: gone at boot),
    so a restarted daemon reads JSON. A changed file has another hash; its old entry goes.
    """
    import hashlib

    with open(path, "rb") as handle:
        raw = handle.read()
    prefix = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
    name = f"{prefix}-{hashlib.sha256(raw).hexdigest()[:32]}.json"
    cached = os.path.join(data_dir(), name)
    try:
        with open(cached, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        document = _parse_yaml(raw)
        _keep(cached, prefix, document)
    return document if isinstance(document, dict) else {}


def _parse_yaml(raw: bytes) -> Any:
    import yaml

    return yaml.load(raw.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _keep(cached: str, prefix: str, document: Any) -> None:
    """Write the parsed kubeconfig for the next start; a failure only costs that start time."""
    try:
        text = json.dumps(document)
    except (TypeError, ValueError):  # YAML-only values (dates, ...): not cached
        return
    try:
        directory = private_dir()
        for old in os.listdir(directory):
            if old.startswith(prefix + "-") and old.endswith(".json"):
                os.unlink(os.path.join(directory, old))
        _write_private(cached, text.encode())
    except (OSError, KubeconfigError, MultusError):
        pass


def from_configuration(configuration: Any) -> Settings:
    """The :class:`Settings` a ``kubernetes.client.Configuration`` holds (the package loader's
    result, for credential plugins), read from its public attributes only.

    The token is not copied: it is the package's, refreshed by its ``refresh_api_key_hook``
    (see :func:`configuration_token`).
    """
    return Settings(host=str(configuration.host or "").rstrip("/"),
                    ca_file=configuration.ssl_ca_cert or None,
                    cert_file=configuration.cert_file or None,
                    key_file=configuration.key_file or None,
                    verify=bool(configuration.verify_ssl),
                    tls_server_name=getattr(configuration, "tls_server_name", None) or None,
                    proxy_url=getattr(configuration, "proxy", None) or None)


def configuration_token(configuration: Any) -> Optional[str]:
    """The Authorization header value a package Configuration holds now, after its refresh hook.

    The package keys it ``authorization`` up to release 35 and ``BearerToken`` since; both
    releases' ``refresh_api_key_hook`` (set by the loader for plugin credentials) re-runs the
    plugin when the credential has expired.
    """
    hook = getattr(configuration, "refresh_api_key_hook", None)
    if hook is not None:
        hook(configuration)
    for key in ("BearerToken", "authorization"):
        value = configuration.api_key.get(key)
        if value:
            prefix = configuration.api_key_prefix.get(key)
            return f"{prefix} {value}" if prefix else str(value).strip()
    return None


def read_token_file(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace and the newline dropped).

    :raises KubeconfigError: the file is empty.
    :raises OSError: it cannot be read.
    """
    with open(path, encoding="utf-8") as handle:
        token = handle.read().strip()
    if not token:
        raise KubeconfigError(f"its 'tokenFile' {path!r} is empty")
    return token


def basic_header(pair: str) -> str:
    """The Authorization header of ``user:password`` (latin-1, as HTTP basic auth has it)."""
    return "Basic " + base64.b64encode(pair.encode("latin-1")).decode()


def _named(document: Dict[str, Any], section: str, name: Any, field: str) -> Dict[str, Any]:
    """``document[section]``'s entry called ``name``: its ``field`` mapping."""
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(field)
            if not isinstance(value, dict):
                raise KubeconfigError(f"its {section} entry {name!r} has no '{field}' mapping")
            return value
    raise KubeconfigError(f"it has no entry named {name!r} in '{section}'")


def _user(document: Dict[str, Any], context: Dict[str, Any]) -> Dict[str, Any]:
    """The context's user; an empty mapping when it names none or none of that name exists."""
    name = context.get("user")
    if not name:
        return {}
    for entry in document.get("users") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get("user") if isinstance(entry.get("user"), dict) else {}
    return {}


def _file(section: Dict[str, Any], key: str, base: str) -> Optional[str]:
    """The file behind ``key`` or ``key-data`` (base64, written to a private file), or None."""
    data = section.get(f"{key}-data")
    if f"{key}-data" not in section or not data:
        if key not in section:
            return None
        name = os.path.normpath(os.path.join(base, str(section[key])))
        if not os.path.isfile(name):
            raise KubeconfigError(f"its '{key}' file {name!r} does not exist")
        return name
    try:
        content = base64.standard_b64decode(data.encode() if isinstance(data, str) else data)
    except (binascii.Error, AttributeError, TypeError):
        raise KubeconfigError(f"its '{key}-data' is not base64") from None
    return data_file(content)


def data_dir() -> str:
    """The root-only directory of the ``-data`` files: /run's when writable, else the temp dir."""
    import tempfile

    parent = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    return os.path.join(parent, f"{DATA_DIR_NAME}-{os.geteuid()}")


def private_dir() -> str:
    """:func:`data_dir`, made if missing, and refused unless it is this user's alone."""
    directory = data_dir()
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not os.path.isdir(directory) or os.path.islink(directory) or \
            info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise KubeconfigError(f"{directory!r} is not a directory only this user can use; "
                              "remove it so that multusd can create it")
    return directory


def data_file(content: bytes) -> str:
    """A file holding ``content`` (mode 0600), named by its SHA-256 and reused if present."""
    import hashlib

    path = os.path.join(private_dir(), hashlib.sha256(content).hexdigest()[:32] + ".pem")
    if not os.path.isfile(path):
        _write_private(path, content)
    return path


def _write_private(path: str, content: bytes) -> None:
    """Atomically, mode 0600; not fsynced: the directory is a tmpfs, remade at every boot."""
    store.atomic_write(path, content, mode=0o600, durable=False)

