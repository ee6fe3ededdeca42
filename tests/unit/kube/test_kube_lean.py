"""multusd.kube.lean: the daemon's partial import of ``kubernetes`` behaves as the whole one."""

import subprocess
import sys

from testlib import REPO

PROBE = f"""
import sys
sys.path.insert(0, {REPO!r})
from multusd.kube import lean
assert lean.enable() is True
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
api = client.ApiClient(client.Configuration())
for cls in (client.CoreV1Api, client.CustomObjectsApi, client.VersionApi,
            client.AuthorizationV1Api):
    cls(api)
assert client.V1Pod.__module__ == "kubernetes.client.models.v1_pod"
pod = api.deserialize(type("R", (), {{"data": '{{"metadata": {{"name": "p"}}}}'}})(), "V1Pod")
assert pod.metadata.name == "p"  # models still load on demand when a caller wants them
assert callable(config.load_kube_config) and issubclass(config.ConfigException, Exception)
assert lean.enable() is True  # idempotent
loaded = [m for m in sys.modules if m.startswith("kubernetes.client.models.")]
print(len(loaded))
"""


def test_the_lean_import_gives_the_classes_multusd_uses_and_skips_the_rest():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True)
    assert int(out.stdout) <= 5  # the ~700 generated models are not imported up front


def test_a_process_that_imported_kubernetes_whole_keeps_it():
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import kubernetes; "
            "from multusd.kube import lean; print(lean.enable())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
