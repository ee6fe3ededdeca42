"""The one error hierarchy of multusd: every failure becomes CNI error JSON.

Standard library only (the shim imports it).

Hierarchy::

    * MultusError                 code 100 unless a subclass says otherwise
      + IncompatibleCNIVersion    1
      + UnsupportedField          2
      + UnknownContainer          3
      + InvalidEnvironment        4
      + IOFailure                 5
      + DecodeFailure             6
        - InvalidJSON             6, JSON Go's decoder refuses (also a ValueError)
      + InvalidNetworkConfig      7
        - ConfigError             7, carries a list of ConfigProblem
      + TryAgainLater             11
      + NotReady                  50, STATUS: multusd cannot serve ADD now
      + PluginError               the code a delegate plugin itself returned
      + DelegateError             100, a plugin failed without a CNI error of its own
      + ForwardedError            the code of a CNI error the daemon answered the shim with
      + PodNotFound               3
      + DeadlineExceeded          11, a request or a plugin ran past its deadline

``str(err)`` is the msg; ``err.to_cni_error(version)`` is the JSON the runtime sees.
"""

from __future__ import annotations

from multusd import CURRENT_VERSION, ResultError

#: The cniVersion of an error whose request named none.
DEFAULT_CNI_VERSION = CURRENT_VERSION


class MultusError(Exception):
    """A failure that reaches the runtime as a CNI error."""

    code = 100

    def __init__(self, msg: str, details: str = "", code: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details
        if code is not None:
            self.code = code

    def to_cni_error(self, cni_version: str = DEFAULT_CNI_VERSION) -> dict:
        """The CNI error object (spec "Error" section) for this failure."""
        return {
            "cniVersion": cni_version or DEFAULT_CNI_VERSION,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        }

    def with_prefix(self, prefix: str) -> "MultusError":
        """The same error with ``prefix`` put in front of its msg (pod identity, network)."""
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        Exception.__init__(clone, f"{prefix}{self.msg}")
        clone.msg = f"{prefix}{self.msg}"
        return clone


class IncompatibleCNIVersion(MultusError):
    """The config asks for a CNI version the plugin or multusd cannot speak."""

    code = 1


class UnsupportedField(MultusError):
    """The config carries a field that cannot be honoured."""

    code = 2


class UnknownContainer(MultusError):
    """The container, or its network namespace, does not exist."""

    code = 3


class InvalidEnvironment(MultusError):
    """A CNI_* variable is missing or malformed."""

    code = 4


class IOFailure(MultusError):
    """Reading or writing a file or socket failed."""

    code = 5


class DecodeFailure(MultusError):
    """JSON, base64 or another encoding could not be decoded."""

    code = 6


class InvalidJSON(DecodeFailure, ValueError):
    """JSON that Go's decoder refuses (:func:`multusd.go_loads`); a ValueError too, as the
    errors of Python's ``json`` are, for the callers that catch those."""


class InvalidNetworkConfig(MultusError):
    """A network configuration is wrong."""

    code = 7


class TryAgainLater(MultusError):
    """A transient condition; the runtime should retry."""

    code = 11


class NotReady(MultusError):
    """STATUS: multusd cannot serve ADD now (CNI 1.1's "the plugin is not available");
    the msg names what is missing."""

    code = 50


class PodNotFound(MultusError):
    """The pod does not exist in the Kubernetes API."""

    code = 3


class DeadlineExceeded(MultusError):
    """A request or a plugin ran past its deadline and was stopped."""

    code = 11


class PluginError(MultusError):
    """A delegate plugin's own CNI error, passed through unchanged."""

    def __init__(self, error: dict) -> None:
        super().__init__(str(error.get("msg", "")), str(error.get("details", "")),
                         code=int(error.get("code", 100) or 100))
        self.error = dict(error)

    def to_cni_error(self, cni_version: str = DEFAULT_CNI_VERSION) -> dict:
        out = dict(self.error)
        out["msg"] = self.msg  # may carry a prefix added by with_prefix
        out.setdefault("cniVersion", cni_version or DEFAULT_CNI_VERSION)
        out.setdefault("details", self.details)
        return out


class ForwardedError(MultusError):
    """A CNI error received as JSON (the daemon's answer to the shim), passed on unchanged
    but for its cniVersion, which becomes the runtime's."""

    def __init__(self, error: dict) -> None:
        super().__init__(str(error.get("msg")), str(error.get("details", "")),
                         code=int(error.get("code") or 100))
        self.error = error

    def to_cni_error(self, cni_version: str = "") -> dict:
        out = dict(self.error)
        if cni_version:
            out["cniVersion"] = cni_version
        return out


class DelegateError(MultusError):
    """A delegate plugin failed without printing a CNI error of its own."""

    code = 100


class ConfigProblem(tuple):
    """One problem found in a configuration: where it is and what to do about it.

    A (path, message) tuple; not a typing.NamedTuple, so that importing this module (the
    shim does, for every pod) does not import typing.
    """

    def __new__(cls, path: str, message: str) -> "ConfigProblem":
        return super().__new__(cls, (path, message))

    @property
    def path(self) -> str:
        return self[0]

    @property
    def message(self) -> str:
        return self[1]

    def format(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(InvalidNetworkConfig):
    """A configuration has one or more problems; all of them are listed."""

    def __init__(self, source: str, problems: list) -> None:
        self.problems = list(problems)
        lines = "; ".join(p.format() for p in self.problems)
        super().__init__(f"invalid configuration {source}: {lines}")


def from_exception(exc: BaseException) -> MultusError:
    """Any exception as a MultusError; unknown ones become code 100 without a traceback."""
    if isinstance(exc, MultusError):
        return exc
    if isinstance(exc, ResultError):  # what multusd.convert reports, as the error it stands for
        return (IncompatibleCNIVersion if exc.code == IncompatibleCNIVersion.code
                else DecodeFailure)(exc.msg)
    return MultusError(f"internal error: {type(exc).__name__}: {exc}")
