"""Unit tests of multusd.kube that need no API server: the views of objects (the fields read,
a pod's whole object kept), static pods, kubeconfig errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from multusd.errors import InvalidNetworkConfig
from multusd.kube.client import KubeClient
from multusd.kube.objects import (NETWORK_STATUS_ANNOTATION, is_static_pod, nad_from_object,
                                  pod_from_object)

SECRET = "unit-secret-token-4b0a9c8d7e6f"


def full_pod() -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team", "uid": "u-1", "resourceVersion": "42",
                     "annotations": {"k8s.v1.cni.cncf.io/networks": "net1"},
                     "managedFields": [{"manager": "kubelet"}]},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "env": [{"name": "X"}]}]},
        "status": {"phase": "Running"},
    }


def test_import_does_not_load_kubernetes():
    code = ("import sys, multusd.kube.client, multusd.kube.clientconfig, multusd.kube.reflector, "
            "multusd.kube.status, multusd.kube.identity; "
            "print(any(m.startswith('kubernetes') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pod_is_trimmed_to_what_multusd_reads():
    pod = pod_from_object(full_pod())
    assert (pod.namespace, pod.name, pod.uid, pod.resource_version) == ("team", "web", "u-1", "42")
    assert dict(pod.annotations) == {"k8s.v1.cni.cncf.io/networks": "net1"}
    assert pod.is_static is False
    assert pod.node_name == "node-a"
    with pytest.raises(TypeError):
        pod.annotations[NETWORK_STATUS_ANNOTATION] = "[]"  # read-only view


def test_a_pod_keeps_its_whole_object_for_the_status_put_out_of_repr_and_equality():
    obj = full_pod()
    pod = pod_from_object(obj)
    assert json.loads(pod.source) == obj  # status, spec and managedFields included
    assert " source=" not in repr(pod) and "managedFields" not in repr(pod)
    other = dict(obj, status={"phase": "Running", "podIP": "10.9.9.9"})
    assert pod_from_object(other) == pod  # the fields multusd reads decide equality


def test_pod_phase_and_whether_it_is_terminating():
    pod = pod_from_object(full_pod())
    assert (pod.phase, pod.deleting) == ("Running", False)
    obj = full_pod()
    obj["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    del obj["status"]
    assert (pod_from_object(obj).phase, pod_from_object(obj).deleting) == ("", True)


def test_pod_without_annotations():
    obj = full_pod()
    del obj["metadata"]["annotations"]
    assert dict(pod_from_object(obj).annotations) == {}


@pytest.mark.parametrize("annotations, expected", [
    ({}, False),
    ({"kubernetes.io/config.source": "api"}, False),
    ({"kubernetes.io/config.source": "file"}, True),
    ({"kubernetes.io/config.source": "http"}, True),
    ({"kubernetes.io/config.mirror": "abc"}, False),
])
def test_is_static_pod(annotations, expected):
    assert is_static_pod(annotations) is expected


def test_nad_keeps_config_and_annotations():
    nad = nad_from_object({
        "metadata": {"name": "net1", "namespace": "team",
                     "annotations": {"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov"}},
        "spec": {"config": '{"cniVersion":"1.0.0","type":"macvlan"}'}})
    assert (nad.namespace, nad.name) == ("team", "net1")
    assert json.loads(nad.config)["type"] == "macvlan"
    assert nad.annotations["k8s.v1.cni.cncf.io/resourceName"] == "intel.com/sriov"


def test_nad_without_spec_has_empty_config():
    assert nad_from_object({"metadata": {"name": "n", "namespace": "d"}}).config == ""


def test_missing_kubeconfig_names_the_file(tmp_path):
    path = str(tmp_path / "absent.kubeconfig")
    with pytest.raises(InvalidNetworkConfig) as info:
        KubeClient(path, "node-a")
    assert repr(path) in info.value.msg
    assert "kubeconfig" in info.value.msg


def test_broken_kubeconfig_does_not_leak_its_contents(tmp_path):
    path = tmp_path / "kubeconfig"
    # a YAML syntax error on the token's line: parsers like to quote the line back
    path.write_text(f"apiVersion: v1\nusers:\n- name: u\n  user: {{token: {SECRET}\n")
    with pytest.raises(InvalidNetworkConfig) as info:
        KubeClient(str(path), "node-a")
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert str(path) in info.value.msg


def test_kubeconfig_without_server_is_a_config_error(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {}}],
        "users": [{"name": "u", "user": {"token": SECRET}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    with pytest.raises(InvalidNetworkConfig) as info:
        KubeClient(str(path), "node-a")
    assert "'server'" in info.value.msg
    assert SECRET not in str(info.value)


def test_pod_claims_from_status_and_spec_each_once():
    obj = full_pod()
    obj["spec"]["resourceClaims"] = [
        {"name": "net", "resourceClaimTemplateName": "sriov-template"},  # named in status
        {"name": "shared", "resourceClaimName": "shared-vfs"},
        {"name": "again", "resourceClaimName": "web-net-x7k"}, "junk", {"name": "x"}]
    obj["status"]["resourceClaimStatuses"] = [
        {"name": "net", "resourceClaimName": "web-net-x7k"},
        {"name": "none-needed"},  # no claim was generated
        {"name": "bad", "resourceClaimName": 7}]
    pod = pod_from_object(obj)
    assert pod.resource_claims == (("net", "web-net-x7k"), ("shared", "shared-vfs"))
    assert pod.extended_claim is None


def test_pod_extended_resource_claim_status():
    obj = full_pod()
    obj["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "web-extended-resources-abc",
        "requestMappings": [{"containerName": "c", "resourceName": "example.com/vf",
                             "requestName": "container-0-request-0"}, "junk"]}
    extended = pod_from_object(obj).extended_claim
    assert extended.claim == "web-extended-resources-abc"
    assert extended.mappings == (("c", "example.com/vf", "container-0-request-0"),)


@pytest.mark.parametrize("status", [{"resourceClaimStatuses": "junk"},
                                    {"extendedResourceClaimStatus": {"requestMappings": []}},
                                    {"extendedResourceClaimStatus": "junk"}])
def test_malformed_claim_fields_are_ignored(status):
    obj = full_pod()
    obj["status"].update(status)
    obj["spec"]["resourceClaims"] = {"not": "a list"}
    pod = pod_from_object(obj)
    assert pod.resource_claims == () and pod.extended_claim is None

