"""Reading a node's kubeconfig into a client Configuration without ``kubernetes.config``.

``kubernetes.config`` imports google-auth, oauthlib and requests-oauthlib for the credential
plugins it supports: ~20 ms of a socket-activated daemon's first ADD. A node daemon's
kubeconfig (the one the multus installer writes, or the kubelet's) uses none of them, so
:func:`load` reads the forms it does use itself, with the package loader's rules:

* the current context's cluster: ``server`` (trailing ``/`` dropped), and for ``https`` only
  ``certificate-authority`` / ``certificate-authority-data``; ``insecure-skip-tls-verify``;
* its user: ``token`` or ``tokenFile``, ``client-certificate`` / ``client-key`` (and their
  ``-data``; loaded for ``https`` only), ``username`` + ``password``;
* file names relative to the kubeconfig's directory; a ``-data`` value wins over its file,
  unless it is empty (then the file counts, as in client-go; the Python package would then
  use neither).

A user with ``exec`` or ``auth-provider`` returns False: the caller uses the package's
loader. ``-data`` certificates and keys become files (Python's TLS reads only files) named by
the hash of their content in a root-only directory, so a restart reuses them instead of
leaving another copy of the private key behind (the package loader's temporary files are
removed only at interpreter exit, which the daemon skips). Errors name keys and files, never
values.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any, Dict, Optional

DATA_DIR_NAME = "multusd-kubeconfig"
_PLUGIN_KEYS = ("exec", "auth-provider")


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names keys and files, never their values."""


def load(path: str, configuration: Any) -> bool:
    """Fill ``configuration`` (host, api_key, TLS files) from the kubeconfig at ``path``.

    :returns: False, with ``configuration`` untouched, when the current user needs a
        credential plugin (``exec``, ``auth-provider``): use ``kubernetes.config`` then.
    :raises KubeconfigError: the kubeconfig is not usable (the message says why).
    :raises OSError: a file it names cannot be read. YAML errors come from ``yaml``.
    """
    import yaml

    with open(path, encoding="utf-8") as handle:
        document = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    document = document if isinstance(document, dict) else {}
    base = os.path.abspath(os.path.dirname(path))
    if "current-context" not in document:
        raise KubeconfigError("it has no 'current-context'")
    context = _named(document, "contexts", document["current-context"], "context")
    user = _user(document, context)
    if any(key in user for key in _PLUGIN_KEYS):
        return False
    cluster = _named(document, "clusters", context.get("cluster"), "cluster")
    settings: Dict[str, Any] = {}
    if "server" in cluster:
        settings["host"] = str(cluster["server"]).rstrip("/")
        if settings["host"].startswith("https"):
            settings["ssl_ca_cert"] = _file(cluster, "certificate-authority", base)
            settings["cert_file"] = _file(user, "client-certificate", base)
            settings["key_file"] = _file(user, "client-key", base)
    if "insecure-skip-tls-verify" in cluster:
        settings["verify_ssl"] = not cluster["insecure-skip-tls-verify"]
    token = _token(user, base)
    if token:
        configuration.api_key["authorization"] = token
    for key, value in settings.items():
        setattr(configuration, key, value)
    return True


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


def _token(user: Dict[str, Any], base: str) -> Optional[str]:
    """The Authorization header value: a bearer token, else basic auth, else None."""
    if "token" in user:
        token = user["token"]
    elif "tokenFile" in user:
        with open(os.path.normpath(os.path.join(base, str(user["tokenFile"]))),
                  encoding="utf-8") as handle:
            token = handle.read()
    else:
        token = None
    if token:
        return f"Bearer {token}"
    if "username" in user and "password" in user:
        pair = f"{user['username']}:{user['password']}".encode("latin-1")
        return "Basic " + base64.b64encode(pair).decode()
    return None


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


def data_file(content: bytes) -> str:
    """A file holding ``content`` (mode 0600), named by its SHA-256 and reused if present."""
    import hashlib
    import tempfile

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
    path = os.path.join(directory, hashlib.sha256(content).hexdigest()[:32] + ".pem")
    if not os.path.isfile(path):
        fd, scratch = tempfile.mkstemp(dir=directory, prefix=".new-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            os.replace(scratch, path)
        except BaseException:
            os.unlink(scratch)
            raise
    return path
