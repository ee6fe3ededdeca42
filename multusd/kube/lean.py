"""Importing only the parts of the ``kubernetes`` package multusd uses (the daemon's start-up).

``import kubernetes`` runs the package's ``__init__``, which imports every API class, ~700
generated models, the dynamic client, watch, stream and utils: ~200 ms and ~20 MB that a
socket-activated daemon pays before its first ADD, for classes it never touches (multusd reads
the API's JSON itself). :func:`enable` instead registers the ``kubernetes`` and
``kubernetes.client`` packages (and its ``api``/``models`` subpackages) without running their
``__init__``; each API class or model is then imported on first use by name
(``client.CoreV1Api`` -> ``kubernetes.client.api.core_v1_api``), as the package's own
``__init__`` would have bound it. Everything else (``Configuration``, ``ApiClient``,
``kubernetes.config``) is the package's own code, unchanged.

The client's core modules also import, at their top, three things multusd never or rarely
calls: ``requests.utils`` (rest: one function, called only when a proxy is configured; ~30 ms
of chardet, cookiejar, ...), ``dateutil.parser`` (api_client: dates of generated models) and
``multiprocessing`` with its ``pool`` (configuration: ``cpu_count``; api_client: the pool of
``async_req`` calls): ~15 ms more. While those three modules are imported, their own
import statements get placeholders, whose functions import the real one on their first call
(``cpu_count`` is ``os.cpu_count``, as in ``multiprocessing``); every other import, in any
thread, then or later, gets the real module. A name already imported for real is used.

Only the daemon enables it, before anything imported ``kubernetes``; any failure (another
layout in a future release) falls back to the ordinary import, so the cost is the only thing
at stake. Code in the same process that imported ``kubernetes`` before is left alone.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import logging
import os
import re
import sys
import threading
import types
from typing import Any

LOG = logging.getLogger(__name__)

_PACKAGES = ("kubernetes", "kubernetes.client", "kubernetes.client.api",
             "kubernetes.client.models")
# What kubernetes/client/__init__.py binds besides the API classes and models.
_CLIENT_NAMES = {"Configuration": "configuration", "ApiClient": "api_client",
                 "ApiException": "exceptions", "ApiTypeError": "exceptions",
                 "ApiValueError": "exceptions", "ApiKeyError": "exceptions",
                 "OpenApiException": "exceptions"}
_CORE_MODULES = ("kubernetes.client.configuration", "kubernetes.client.api_client",
                 "kubernetes.client.rest", "kubernetes.client.exceptions",
                 "kubernetes.client.api.core_v1_api")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_lock = threading.Lock()


def enable() -> bool:
    """Register the lean packages; True when they are in use (False: the ordinary import)."""
    with _lock:
        if "kubernetes" in sys.modules:
            return getattr(sys.modules["kubernetes"], "_multusd_lean", False)
        try:
            _register()
            for name in _CORE_MODULES:  # the layout this relies on; imported on first use
                if importlib.util.find_spec(name) is None:
                    raise ImportError(f"no {name}")
        except Exception as exc:  # noqa: BLE001 - any surprise: the ordinary import
            for name in [m for m in sys.modules if m == "kubernetes" or
                         m.startswith("kubernetes.")]:
                del sys.modules[name]
            LOG.debug("lean import of kubernetes not possible (%s); importing it whole", exc)
            return False
        return True


def _register() -> None:
    modules = {}
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{name} is not a package")
        module = types.ModuleType(name)
        module.__path__ = list(spec.submodule_search_locations)
        module.__spec__ = spec
        module.__file__ = spec.origin
        module.__package__ = name
        module._multusd_lean = True
        modules[name] = sys.modules[name] = module
    top, client = modules["kubernetes"], modules["kubernetes.client"]
    api, models = modules["kubernetes.client.api"], modules["kubernetes.client.models"]
    top.client, client.api, client.models = client, api, models
    top.__getattr__ = _kubernetes_attribute
    client.__getattr__ = _client_attribute
    api.__getattr__ = _submodule_class("kubernetes.client.api")
    models.__getattr__ = _submodule_class("kubernetes.client.models")


def _kubernetes_attribute(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"kubernetes.{name}")  # config, watch, ... on first use


def _client_attribute(name: str) -> Any:
    _import_core()
    if name in _CLIENT_NAMES:
        module = importlib.import_module(f"kubernetes.client.{_CLIENT_NAMES[name]}")
        return getattr(module, name)
    if name.endswith("Api"):
        return getattr(sys.modules["kubernetes.client.api"], name)
    if name[:1].isupper():
        return getattr(sys.modules["kubernetes.client.models"], name)
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"kubernetes.client.{name}")  # rest, exceptions, ...


def _should_bypass_proxies(url: str, no_proxy: Any = None) -> bool:
    """requests.utils.should_bypass_proxies, imported when first called (a proxy is set)."""
    from requests.utils import should_bypass_proxies

    return should_bypass_proxies(url, no_proxy=no_proxy)


def _parse_date(*args: Any, **kwargs: Any) -> Any:
    """dateutil.parser.parse, imported when first called (a generated model's date)."""
    from dateutil.parser import parse

    return parse(*args, **kwargs)


def _thread_pool(*args: Any, **kwargs: Any) -> Any:
    """multiprocessing.pool.ThreadPool, imported when first called (``async_req``)."""
    from multiprocessing.pool import ThreadPool

    return ThreadPool(*args, **kwargs)


def _cpu_count() -> int:
    """multiprocessing.cpu_count without importing multiprocessing."""
    count = os.cpu_count()
    if count is None:
        raise NotImplementedError("cannot determine number of cpus")
    return count


_PLACEHOLDERS = {
    "requests.utils": {"should_bypass_proxies": _should_bypass_proxies},
    "dateutil.parser": {"parse": _parse_date},
    "multiprocessing": {"cpu_count": _cpu_count},
    "multiprocessing.pool": {"ThreadPool": _thread_pool},
}
_PLACEHELD_IMPORTS = ("kubernetes.client.configuration", "kubernetes.client.rest",
                      "kubernetes.client.api_client")


def _import_core() -> None:
    """Import the client's core modules with the placeholders standing in (once).

    Only their own import statements see the placeholders (``builtins.__import__`` asks who
    imports): another thread importing ``multiprocessing`` meanwhile (pyroute2 does) gets
    the real one, and nothing is ever put in ``sys.modules``.
    """
    if _PLACEHELD_IMPORTS[-1] in sys.modules:
        return
    with _lock:
        if any(name in sys.modules for name in _PLACEHELD_IMPORTS):
            return  # imported some other way already: nothing to save
        stand_ins = {}
        for name, attributes in _PLACEHOLDERS.items():
            if name.split(".")[0] not in sys.modules:  # else the real package is there: use it
                module = stand_ins[name] = types.ModuleType(name)
                module.__dict__.update(attributes)
        original = builtins.__import__

        def importing(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and name in stand_ins and globals is not None and \
                    globals.get("__name__") in _PLACEHELD_IMPORTS:
                return stand_ins[name if fromlist else name.split(".")[0]]
            return original(name, globals, locals, fromlist, level)

        builtins.__import__ = importing
        try:
            for name in _PLACEHELD_IMPORTS:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - another release uses more of them: import it whole
            LOG.debug("kubernetes.client not imported the lean way", exc_info=True)
            for name in _PLACEHELD_IMPORTS:  # what used a placeholder is imported again
                sys.modules.pop(name, None)
        finally:
            builtins.__import__ = original


def _submodule_class(package: str):
    def attribute(name: str) -> Any:
        if not name[:1].isupper():
            raise AttributeError(name)
        try:
            module = importlib.import_module(f"{package}.{_CAMEL.sub('_', name).lower()}")
        except ImportError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value
    return attribute
