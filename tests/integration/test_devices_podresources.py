"""devices.py against a real gRPC server speaking the kubelet pod-resources v1 API.

The server is grpcio with a generic handler on a unix socket in a private tmp dir; its
answers are protobuf encoded by hand here, independently of the decoder under test.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent import futures
from typing import Callable, Iterator, List, Tuple

import pytest

from multusd.node import devices
from multusd.errors import DecodeFailure, IOFailure, TryAgainLater

grpc = pytest.importorskip("grpc", reason="python3-grpcio is not installed")

RESOURCE = "intel.com/sriov_netdevice"
Pods = List[Tuple[str, str, List[Tuple[str, List[Tuple[str, List[str]]]]]]]


# --- a minimal protobuf encoder (test side) ---------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def encode_list_response(pods: Pods) -> bytes:
    """ListPodResourcesResponse for [(namespace, name, [(container, [(resource, ids)])])],
    with unknown fields (cpu_ids, topology) sprinkled in to check they are skipped."""
    out = b""
    for namespace, name, containers in pods:
        pod = field_bytes(1, name.encode()) + field_bytes(2, namespace.encode())
        for container_name, container_devices in containers:
            container = field_bytes(1, container_name.encode()) + field_varint(3, 7)
            for resource, ids in container_devices:
                device = field_bytes(1, resource.encode())
                device += b"".join(field_bytes(2, i.encode()) for i in ids)
                device += field_bytes(3, field_bytes(1, field_varint(1, 1)))  # topology
                container += field_bytes(2, device)
            pod += field_bytes(3, container)
        out += field_bytes(1, pod)
    return out


# --- the server -------------------------------------------------------------------------------


class PodResourcesServer:
    """A real gRPC server on ``socket_path`` whose List answers with ``respond(request)``."""

    def __init__(self, socket_path: str, respond: Callable[[bytes, object], bytes]) -> None:
        self.socket_path = socket_path
        self.requests: List[bytes] = []
        self._lock = threading.Lock()

        def list_handler(request: bytes, context) -> bytes:
            with self._lock:
                self.requests.append(request)
            return respond(request, context)

        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            # No (de)serialisers: the handler sees and returns raw protobuf bytes.
            "List": grpc.unary_unary_rpc_method_handler(list_handler)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix:{socket_path}")

    def __enter__(self) -> "PodResourcesServer":
        self.server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.stop(None).wait()


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # Short path under /tmp: a unix socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="mdpr-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def serve(sock_dir: str, pods: Pods) -> PodResourcesServer:
    answer = encode_list_response(pods)
    return PodResourcesServer(f"{sock_dir}/kubelet.sock", lambda request, context: answer)


PODS: Pods = [
    ("default", "pod-a", [
        ("app", [(RESOURCE, ["0000:af:06.3", "0000:af:06.1"]), ("example.com/gpu", ["g0"])]),
        ("side", [(RESOURCE, ["0000:af:06.2"])]),
    ]),
    ("other", "pod-a", [("app", [(RESOURCE, ["0000:af:07.0"])])]),
    ("default", "pod-b", [("app", [])]),
]


def test_list_answer_matched_by_name_and_namespace_sorted(sock_dir, tmp_path):
    with serve(sock_dir, PODS) as server:
        found = devices.device_ids_for_pod("default", "pod-a", "uid-unused",
                                           pod_resources_socket=server.socket_path,
                                           checkpoint=str(tmp_path / "unused"))
    assert found == {RESOURCE: ["0000:af:06.1", "0000:af:06.2", "0000:af:06.3"],
                     "example.com/gpu": ["g0"]}
    assert server.requests == [b""], "ListPodResourcesRequest is an empty message"


def test_pod_not_in_the_answer_gets_nothing(sock_dir, tmp_path):
    with serve(sock_dir, PODS) as server:
        for namespace, name in (("default", "pod-b"), ("default", "pod-zzz"),
                                ("kube-system", "pod-a")):
            assert devices.device_ids_for_pod(namespace, name, "",
                                              pod_resources_socket=server.socket_path,
                                              checkpoint=str(tmp_path / "unused")) == {}


def test_allocator_over_the_socket_hands_out_ids_in_order(sock_dir, tmp_path):
    with serve(sock_dir, PODS) as server:
        allocate = devices.DeviceAllocator("default", "pod-a", "",
                                           pod_resources_socket=server.socket_path,
                                           checkpoint=str(tmp_path / "unused"))
        ids = [allocate(RESOURCE) for _ in range(4)]
    assert ids == ["0000:af:06.1", "0000:af:06.2", "0000:af:06.3", ""]
    assert len(server.requests) == 1, "the kubelet is asked once per pod ADD"


def test_rpc_errors_map_to_cni_errors(sock_dir):
    def refuse(request, context):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "not for you")

    with PodResourcesServer(f"{sock_dir}/kubelet.sock", refuse) as server:
        with pytest.raises(IOFailure) as err:
            devices.list_pod_resources(server.socket_path, "default", "pod-a", timeout=5)
    assert "PERMISSION_DENIED" in err.value.msg and "not for you" in err.value.msg


def test_a_socket_nobody_serves_is_try_again_later(sock_dir, tmp_path):
    stale = f"{sock_dir}/kubelet.sock"
    with PodResourcesServer(stale, lambda r, c: b""):
        pass  # started and stopped: the socket file stays, nothing listens
    with open(stale, "a"):
        pass
    with pytest.raises(TryAgainLater):
        devices.device_ids_for_pod("default", "pod-a", "uid", pod_resources_socket=stale,
                                   checkpoint=str(tmp_path / "unused"), timeout=2)


def test_garbage_answer_is_a_decode_failure(sock_dir):
    with PodResourcesServer(f"{sock_dir}/kubelet.sock", lambda r, c: b"\x0a\xff\x01") as s:
        with pytest.raises(DecodeFailure):
            devices.list_pod_resources(s.socket_path, "default", "pod-a", timeout=5)


def test_decoder_skips_fixed_width_and_unknown_fields():
    pod = (field_bytes(1, b"pod-a") + b"\x21" + b"\x00" * 8  # field 4, fixed64
           + field_bytes(2, b"default") + b"\x2d" + b"\x00" * 4  # field 5, fixed32
           + field_bytes(3, field_bytes(2, field_bytes(1, RESOURCE.encode())
                                        + field_bytes(2, b"d1"))))
    assert devices.pod_devices_from_list_response(field_bytes(1, pod), "default",
                                                  "pod-a") == {RESOURCE: ["d1"]}
