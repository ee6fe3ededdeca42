"""Device-plugin allocations of a pod and the device-info files that describe them (F41, F42).

Only NADs annotated ``k8s.v1.cni.cncf.io/resourceName`` need any of this; nothing here runs
for other pods. Upstream: ``kubeletclient.go``, ``checkpoint.go``,
``k8sclient.go:getKubernetesDelegate`` (index per resource) and network-attachment-definition
-client's devinfo helpers (``GetCNIDeviceInfoPath``, ``CopyDeviceInfoForCNIFromDP``).

Where the allocations come from, as upstream:

* the kubelet pod-resources API, ``v1.PodResourcesLister/List`` over
  ``/var/lib/kubelet/pod-resources/kubelet.sock``, matched by pod name and namespace. Needs
  ``grpcio`` (Debian: python3-grpcio), imported only here and only when the socket exists;
  messages are (de)serialised by hand, so no generated code and no protobuf package;
* else the kubelet device-manager checkpoint, matched by pod UID.

Device IDs are sorted per resource; successive NADs with the same resource take successive
IDs (:class:`DeviceAllocator`). Devices from DRA ResourceClaims (upstream ``draclient``) are
looked up elsewhere (the caller hands them in as ``extra``) and merged per resource here; a
DRA-only node, with neither socket nor checkpoint, needs neither for what its claims give.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from multusd import go_loads, store
from multusd.errors import DecodeFailure, InvalidEnvironment, IOFailure, TryAgainLater

LOG = logging.getLogger(__name__)

KUBELET_DIR = "/var/lib/kubelet"  # the kubelet's root directory (kubeletRootDir)
# The device-info spec's directory (deviceInfoDir): device plugins write under dp/, what the
# CNI plugins get under cni/.
DEVINFO_DIR = "/var/run/k8s.cni.cncf.io/devinfo"


def pod_resources_socket(kubelet_dir: str = KUBELET_DIR) -> str:
    """The kubelet's pod-resources socket under its root directory ``kubelet_dir``."""
    return os.path.join(kubelet_dir, "pod-resources", "kubelet.sock")


def checkpoint_file(kubelet_dir: str = KUBELET_DIR) -> str:
    """The kubelet's device-manager checkpoint under its root directory ``kubelet_dir``."""
    return os.path.join(kubelet_dir, "device-plugins", "kubelet_internal_checkpoint")


def devinfo_dp_dir(devinfo_dir: str = DEVINFO_DIR) -> str:
    """Where device plugins write device-info files (``<deviceInfoDir>/dp``)."""
    return os.path.join(devinfo_dir, "dp")


def devinfo_cni_dir(devinfo_dir: str = DEVINFO_DIR) -> str:
    """Where the delegates' device-info files go (``<deviceInfoDir>/cni``)."""
    return os.path.join(devinfo_dir, "cni")


POD_RESOURCES_SOCKET = pod_resources_socket()
CHECKPOINT_FILE = checkpoint_file()
DEVINFO_DP_DIR = devinfo_dp_dir()

POD_RESOURCES_LIST_METHOD = "/v1.PodResourcesLister/List"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # upstream's MaxCallRecvMsgSize
_DEFAULT_TIMEOUT = 10.0  # seconds, upstream's kubelet connection/List timeout

ResourceMap = Dict[str, List[str]]


def device_ids_for_pod(namespace: str, name: str, uid: str, *,
                       pod_resources_socket: str = POD_RESOURCES_SOCKET,
                       checkpoint: str = CHECKPOINT_FILE,
                       timeout: float = _DEFAULT_TIMEOUT) -> ResourceMap:
    """The device IDs the kubelet allocated to a pod: resource name -> sorted IDs.

    Asks the pod-resources socket when it exists (and grpcio is importable), else reads
    the checkpoint file. A pod with no allocations gives ``{}``.

    :raises TryAgainLater: the kubelet socket did not answer in time or is not serving.
    :raises IOFailure: another pod-resources failure, or no socket and no checkpoint file.
    :raises DecodeFailure: the answer or the checkpoint file cannot be decoded.
    :raises InvalidEnvironment: the checkpoint is needed but ``uid`` is empty.
    """
    if os.path.exists(pod_resources_socket):
        grpc = _import_grpc()
        if grpc is not None:
            return _sorted(list_pod_resources(pod_resources_socket, namespace, name,
                                              timeout=timeout, grpc=grpc))
        LOG.warning("kubelet pod-resources socket %s exists but grpcio is not installed "
                    "(Debian: python3-grpcio); reading the device-plugin checkpoint %s "
                    "instead", pod_resources_socket, checkpoint)
    return _sorted(checkpoint_device_ids(checkpoint, uid))


class DeviceAllocator:
    """Hands out a pod's device IDs to its NADs, one per call, per resource (F41).

    Callable as ``podnetworks.build_delegates(device_id_for=...)`` expects: given a NAD's
    resourceName, the next ID allocated to the pod for it, or "" when none is left. Nothing is
    asked until the first call, so pods without such NADs cost nothing. Two sources:

    * ``extra`` gives (resourceName, deviceID, origin) of devices allocated otherwise (DRA
      ResourceClaims), asked once, on the first call;
    * the kubelet's device plugins (pod-resources socket, else checkpoint), asked on the first
      call when the node has either, else only for a resource ``extra`` did not supply: a
      DRA-only node has neither, and needs neither.

    The IDs of one resource from both are sorted together (upstream appends DRA's to the
    kubelet's map and sorts each resource). A resource no source can supply fails the ADD
    with what was tried.
    """

    def __init__(self, namespace: str, name: str, uid: str, *,
                 pod_resources_socket: str = POD_RESOURCES_SOCKET,
                 checkpoint: str = CHECKPOINT_FILE,
                 timeout: float = _DEFAULT_TIMEOUT,
                 extra: Optional[Callable[[], Sequence[Tuple[str, str, Any]]]] = None) -> None:
        self._lookup: Callable[[], ResourceMap] = lambda: device_ids_for_pod(
            namespace, name, uid, pod_resources_socket=pod_resources_socket,
            checkpoint=checkpoint, timeout=timeout)
        self._socket, self._checkpoint = pod_resources_socket, checkpoint
        self._extra = extra
        self._pod = f"{namespace}/{name}"
        self._resources: Optional[ResourceMap] = None
        self._kubelet_asked = False
        self._next: Dict[str, int] = {}
        self._origins: Dict[Tuple[str, str], Any] = {}
        self._handed: set = set()

    def __call__(self, resource_name: str) -> str:
        if self._resources is None:
            self._resources = self._first_look()
        if resource_name not in self._resources and not self._kubelet_asked:
            self._ask_kubelet_for(resource_name)
        ids = self._resources.get(resource_name, [])
        index = self._next.get(resource_name, 0)
        if index >= len(ids):
            LOG.warning("pod %s has no %s device left for another network with that "
                        "resourceName (%d allocated)", self._pod, resource_name, len(ids))
            return ""
        self._next[resource_name] = index + 1
        self._handed.add((resource_name, ids[index]))
        return ids[index]

    def origin(self, resource_name: str, device_id: str) -> Any:
        """The ``extra`` origin of a device this allocator handed out, None for the kubelet's
        (or one it did not hand out)."""
        key = (resource_name, device_id)
        return self._origins.get(key) if key in self._handed else None

    def _first_look(self) -> ResourceMap:
        resources: ResourceMap = {}
        if self._extra is not None:
            for resource, device_id, origin in self._extra():
                resources.setdefault(resource, []).append(device_id)
                self._origins[(resource, device_id)] = origin
        if self._kubelet_present():
            self._kubelet_asked = True
            found = self._lookup()
            LOG.debug("device-plugin allocations of pod %s: %s", self._pod, found)
            for resource, ids in found.items():
                resources.setdefault(resource, []).extend(ids)
        return _sorted(resources)

    def _kubelet_present(self) -> bool:
        """The node has kubelet device-plugin state this process can read."""
        if os.path.exists(self._checkpoint):
            return True
        return os.path.exists(self._socket) and _import_grpc() is not None

    def _ask_kubelet_for(self, resource_name: str) -> None:
        """The node has no device-plugin state and DRA gave no ``resource_name`` device: ask
        the kubelet anyway (its state may have just appeared), and say what was tried."""
        self._kubelet_asked = True
        try:
            found = self._lookup()
        except IOFailure as exc:
            raise IOFailure(
                f"pod {self._pod} has no device for resourceName {resource_name!r}: tried its "
                f"DRA ResourceClaims ({self._dra_said()}) and the kubelet's device plugins "
                f"({self._kubelet_said(exc)}); on a DRA node, give the pod a ResourceClaim "
                f"that allocates a {resource_name!r} device; on a device-plugin node, check "
                "kubeletRootDir in daemon-config.json", details=exc.details) from exc
        LOG.debug("device-plugin allocations of pod %s: %s", self._pod, found)
        assert self._resources is not None
        for resource, ids in _sorted(found).items():
            self._resources.setdefault(resource, ids)  # DRA's, handed out already, stay as are

    def _kubelet_said(self, failure: IOFailure) -> str:
        if os.path.exists(self._socket):
            return failure.msg
        return f"no pod-resources socket {self._socket!r}; {failure.msg}"

    def _dra_said(self) -> str:
        if self._extra is None:
            return "not asked: no pod object from the API server"
        supplied = sorted(self._resources or {})
        if supplied:
            return f"they allocate devices of {', '.join(map(repr, supplied))} only"
        return "they allocate no device with a resourceName"


# --- kubelet pod-resources API (gRPC) ---------------------------------------------------------


def list_pod_resources(socket_path: str, namespace: str, name: str, *,
                       timeout: float = _DEFAULT_TIMEOUT, grpc: Any = None) -> ResourceMap:
    """Device IDs of one pod from ``PodResourcesLister/List`` on ``socket_path`` (unsorted).

    :raises TryAgainLater: UNAVAILABLE or DEADLINE_EXCEEDED (the kubelet may be restarting).
    :raises IOFailure: any other RPC failure, or grpcio missing.
    :raises DecodeFailure: the answer is not a valid ListPodResourcesResponse.
    """
    grpc = grpc or _import_grpc()
    if grpc is None:
        raise IOFailure("cannot ask the kubelet pod-resources API: grpcio is not installed; "
                        "install python3-grpcio")
    target = f"unix://{os.path.abspath(socket_path)}"
    options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        list_call = channel.unary_unary(POD_RESOURCES_LIST_METHOD,
                                        request_serializer=_identity,
                                        response_deserializer=_identity)
        try:
            answer = list_call(b"", timeout=timeout)  # ListPodResourcesRequest is empty
        except grpc.RpcError as exc:
            raise _rpc_error(grpc, exc, socket_path) from None
    return pod_devices_from_list_response(answer, namespace, name)


def pod_devices_from_list_response(data: bytes, namespace: str, name: str) -> ResourceMap:
    """Decode a ListPodResourcesResponse and collect the devices of ``namespace/name``.

    Wire format (k8s.io/kubelet podresources v1): ListPodResourcesResponse{1: repeated
    PodResources}; PodResources{1: name, 2: namespace, 3: repeated ContainerResources};
    ContainerResources{2: repeated ContainerDevices}; ContainerDevices{1: resource_name,
    2: repeated device_ids}. Other fields (CPUs, memory, topology, DRA) are skipped.

    :raises DecodeFailure: ``data`` is not valid protobuf of that shape.
    """
    resources: ResourceMap = {}
    try:
        for field, pod in _fields(data):
            if field != 1:
                continue
            pod_fields = list(_fields(_as_bytes(pod)))
            if (_string(pod_fields, 1) != name or _string(pod_fields, 2) != namespace):
                continue
            for container in _messages(pod_fields, 3):
                for device in _messages(list(_fields(container)), 2):
                    device_fields = list(_fields(device))
                    resource = _string(device_fields, 1)
                    ids = [_as_bytes(v).decode() for f, v in device_fields if f == 2]
                    resources.setdefault(resource, []).extend(ids)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeFailure(f"cannot decode the kubelet pod-resources List answer: {exc}") \
            from None
    return resources


def _import_grpc() -> Any:
    try:
        import grpc  # lazily: only device-plugin pods need it
    except ImportError:
        return None
    return grpc


def _identity(data: bytes) -> bytes:
    return data


def _rpc_error(grpc: Any, exc: Any, socket_path: str) -> Exception:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    message = (f"kubelet pod-resources List on {socket_path!r} failed: "
               f"{getattr(code, 'name', code)}: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return TryAgainLater(f"{message}; is the kubelet running?")
    return IOFailure(message)


# --- protobuf wire format (only what the messages above use) -----------------------------------


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(data: bytes) -> Iterator[Tuple[int, Any]]:
    """(field number, value) pairs: an int for varint/fixed fields, bytes (a memoryview
    slice) for length-delimited ones."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        key, pos = _varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire_type == 0:
            value, pos = _varint(data, pos)
        elif wire_type == 1:
            value, pos = int.from_bytes(view[pos:pos + 8], "little"), pos + 8
        elif wire_type == 5:
            value, pos = int.from_bytes(view[pos:pos + 4], "little"), pos + 4
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(view):
                raise ValueError(f"field {field} runs past the end of the message")
            value, pos = view[pos:pos + length], pos + length
        else:
            raise ValueError(f"unsupported wire type {wire_type} (field {field})")
        if pos > len(view):
            raise ValueError(f"field {field} runs past the end of the message")
        yield field, value


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, int):
        raise ValueError("expected a length-delimited field, got a number")
    return bytes(value)


def _string(fields: List[Tuple[int, Any]], number: int) -> str:
    """The last value of string field ``number`` (protobuf: last one wins), "" if absent."""
    value = ""
    for field, raw in fields:
        if field == number:
            value = _as_bytes(raw).decode()
    return value


def _messages(fields: List[Tuple[int, Any]], number: int) -> List[bytes]:
    return [_as_bytes(raw) for field, raw in fields if field == number]


# --- kubelet device-manager checkpoint ---------------------------------------------------------


def checkpoint_device_ids(path: str, uid: str) -> ResourceMap:
    """Device IDs of the pod with ``uid`` from the kubelet checkpoint file (unsorted).

    Reads ``Data.PodDeviceEntries[]`` (``PodUID``, ``ResourceName``, ``DeviceIDs``); the
    IDs are a map of NUMA node -> list (kubelet >= 1.20) or a plain list (older kubelets).

    :raises IOFailure: the file cannot be read.
    :raises DecodeFailure: it is not a device-manager checkpoint.
    :raises InvalidEnvironment: ``uid`` is empty.
    """
    if not uid:
        raise InvalidEnvironment(
            f"the pod's UID is unknown, and the device-plugin checkpoint {path!r} is keyed by "
            "pod UID; make the pod available from the API server or enable the kubelet "
            "pod-resources socket")
    try:
        with open(path, "rb") as handle:
            data = go_loads(handle.read())  # as the kubelet and upstream read it
    except OSError as exc:
        raise IOFailure(f"cannot read the kubelet device-plugin checkpoint {path!r}: "
                        f"{exc.strerror}; neither it nor the pod-resources socket is "
                        "available to find the pod's devices") from exc
    except ValueError as exc:
        raise DecodeFailure(f"the kubelet device-plugin checkpoint {path!r} is not valid "
                            f"JSON: {exc}") from None
    entries = data.get("Data", {}).get("PodDeviceEntries") if isinstance(data, dict) else None
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise DecodeFailure(f"the kubelet device-plugin checkpoint {path!r} has a malformed "
                            "Data.PodDeviceEntries")
    resources: ResourceMap = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("PodUID") != uid:
            continue
        ids = resources.setdefault(str(entry.get("ResourceName", "")), [])
        ids.extend(_checkpoint_entry_ids(entry.get("DeviceIDs"), path))
    return resources


def _checkpoint_entry_ids(value: Any, path: str) -> List[str]:
    if value is None:
        return []
    groups = value.values() if isinstance(value, dict) else [value]
    ids: List[str] = []
    for group in groups:
        if not isinstance(group, list) or not all(isinstance(i, str) for i in group):
            raise DecodeFailure(f"the kubelet device-plugin checkpoint {path!r} has malformed "
                                "DeviceIDs")
        ids.extend(group)
    return ids


def _sorted(resources: ResourceMap) -> ResourceMap:
    return {resource: sorted(ids) for resource, ids in resources.items()}


# --- device-info files (F42) -------------------------------------------------------------------


def device_plugin_info_path(resource_name: str, device_id: str, *,
                            dp_dir: str = DEVINFO_DP_DIR) -> str:
    """Where a device plugin leaves the device-info of one device (NAD utils' DP path)."""
    filename = f"{resource_name.replace('/', '-')}-{device_id.replace('/', '-')}-device.json"
    return os.path.join(dp_dir, filename)


def copy_device_plugin_info(resource_name: str, device_id: str, dest: str, *,
                            dp_dir: str = DEVINFO_DP_DIR) -> bool:
    """Copy the device plugin's device-info file of ``device_id`` to ``dest`` (mode 0444).

    Best effort, as upstream: a missing or invalid source, or a failed write, is logged and
    False is returned; the CNI plugin may still write ``dest`` itself. An existing ``dest``
    is replaced atomically (upstream refused to overwrite, keeping stale data).

    :returns: True when ``dest`` was written.
    """
    source = device_plugin_info_path(resource_name, device_id, dp_dir=dp_dir)
    try:
        with open(source, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        LOG.debug("no device-plugin device-info file %s for %s device %s", source,
                  resource_name, device_id)
        return False
    except OSError as exc:
        LOG.warning("cannot read device-plugin device-info file %s: %s", source, exc.strerror)
        return False
    if _json_object(raw) is None:
        LOG.warning("not copying device-plugin device-info file %s: it is not a JSON object; "
                    "the device plugin for %s wrote a malformed file", source, resource_name)
        return False
    try:
        store.atomic_write(dest, raw, mode=0o444, dir_mode=0o755)
    except IOFailure as exc:
        LOG.warning("cannot copy device-info for %s device %s to %s: %s", resource_name,
                    device_id, dest, exc)
        return False
    return True


def load_device_info(path: str) -> Optional[Dict[str, Any]]:
    """The device-info object in ``path`` (for network-status ``device-info``), or None
    when the file is missing or unusable (logged)."""
    return store.read_json_object(path, "device-info file")


def remove_device_info(path: str) -> bool:
    """Delete a device-info file; True if it existed. Failures are logged, never raised
    (DEL must go on)."""
    try:
        return store.remove(path)
    except IOFailure as exc:
        LOG.warning("cannot remove device-info file %s: %s", path, exc)
        return False


def _json_object(raw: bytes) -> Optional[Dict[str, Any]]:
    try:
        value = go_loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
