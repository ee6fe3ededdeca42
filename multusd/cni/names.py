"""The naming rules for what becomes a file or a kernel name: container IDs, networks, interfaces.

One definition each, used by the daemon's request checks, the engine, the selection parser
and the chain loader:

* a container ID and a network name (libcni's rule; both name files under the cache
  directory): a letter or digit, then letters, digits, ``_``, ``.`` and ``-``, matched as a
  whole (a trailing newline does not pass);
* an interface name (the kernel's ``dev_valid_name``, which libcni's ``ValidateInterfaceName``
  follows): 1 to 15 *bytes* (``IFNAMSIZ`` is 16 with the NUL), not ``.`` or ``..``, no ``/``,
  no ``:``, no whitespace and no NUL. A colon is never allowed in an interface name: it only
  appears in IPv4 address labels (``eth0:1``), which are not interfaces and which no CNI
  field names.
"""

from __future__ import annotations

import re

MAX_IFNAME_BYTES = 15
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
_IFNAME_FORBIDDEN = frozenset("/:\0")

NAME_RULE = "start with a letter or digit and hold only letters, digits, '_', '.' and '-'"
IFNAME_RULE = (f"1 to {MAX_IFNAME_BYTES} bytes, not '.' or '..', with no ':', without '/' or "
               "whitespace")


def is_valid_name(name: str) -> bool:
    """True if ``name`` may be a container ID or a network name (libcni's rule)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_valid_ifname(name: str) -> bool:
    """True if ``name`` can be a Linux interface name (the kernel's ``dev_valid_name``)."""
    return (isinstance(name, str) and 0 < len(name.encode("utf-8", "surrogatepass"))
            <= MAX_IFNAME_BYTES and name not in (".", "..")
            and not any(c in _IFNAME_FORBIDDEN or c.isspace() for c in name))
