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


PLACEHOLDER_PROBE = f"""
import sys
sys.path.insert(0, {REPO!r})
from multusd.kube import lean
lean.enable()
from kubernetes import client
configuration = client.Configuration()
api = client.ApiClient(configuration)
deferred = ("requests", "dateutil", "multiprocessing")
print(sorted(m for m in sys.modules if m.split(".")[0] in deferred))
assert configuration.connection_pool_maxsize == __import__("os").cpu_count() * 5
from kubernetes.client import rest, api_client
# the stand-ins do what the real functions do, importing them on first use
assert rest.should_bypass_proxies("http://10.0.0.1:6443", no_proxy="10.0.0.1") is True
assert rest.should_bypass_proxies("http://10.0.0.1:6443", no_proxy="") is False
assert api_client.parse("2026-12-01T10:00:00Z").year == 2026
pool = api.pool
assert type(pool).__name__ == "ThreadPool"
api.close()
# and a real import afterwards is the real package, untouched
import requests, requests.utils, dateutil.parser, multiprocessing.pool
assert requests.utils.should_bypass_proxies is not rest.should_bypass_proxies
assert hasattr(requests, "Session") and hasattr(multiprocessing, "Process")
print("ok")
"""


def test_the_client_core_imports_without_requests_dateutil_or_multiprocessing():
    out = subprocess.run([sys.executable, "-c", PLACEHOLDER_PROBE], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "ok"]


def test_a_process_that_imported_requests_first_keeps_the_real_one():
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import requests.utils; "
            "from multusd.kube import lean; lean.enable(); from kubernetes import client; "
            "client.ApiClient; from kubernetes.client import rest; "
            "print(rest.should_bypass_proxies is requests.utils.should_bypass_proxies)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"


def run_with_configuration_edited(old: str, new: str, then: str, path: str = "") -> list:
    """Run ``then`` in a fresh interpreter whose kubernetes.client.configuration has ``old``
    replaced by ``new`` (as another release might write it), after the lean import; its
    printed words."""
    code = f"""
import sys, importlib.util
sys.path.insert(0, {REPO!r}); sys.path.insert(0, {path!r})
from multusd.kube import lean
lean.enable()
spec = importlib.util.find_spec("kubernetes.client.configuration")
source = open(spec.origin).read().replace({old!r}, {new!r}, 1)
class Loader(type(spec.loader)):
    def get_code(self, name):
        return compile(source, spec.origin, "exec")
spec.loader.__class__ = Loader
class Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return spec if name == spec.name else None
sys.meta_path.insert(0, Finder)
from kubernetes import client
client.Configuration  # the lean way in: the client's core with its placeholders
{then}
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_client_release_that_needs_more_than_the_placeholders_is_imported_whole():
    # more of multiprocessing at import time than the placeholder has: the lean import
    # falls back to the real modules instead of failing
    words = run_with_configuration_edited(
        "import multiprocessing", "import multiprocessing\nmultiprocessing.get_context",
        'print(hasattr(sys.modules["multiprocessing"], "Process"), '
        "client.Configuration().connection_pool_maxsize > 0)")
    assert words == ["True", "True"]


def test_only_the_client_modules_see_the_placeholders(tmp_path):
    # a module imported while the client core is being imported (as pyroute2 may be, on
    # another thread) gets the real multiprocessing; the client module the placeholder
    (tmp_path / "probe_mod.py").write_text(
        "import multiprocessing\nREAL = hasattr(multiprocessing, 'Process')\n")
    words = run_with_configuration_edited(
        "import copy", "import copy\nimport probe_mod",
        "import probe_mod, kubernetes.client.configuration as configuration\n"
        'print(probe_mod.REAL, hasattr(configuration.multiprocessing, "Process"), '
        'sys.modules["multiprocessing"] is not configuration.multiprocessing)', str(tmp_path))
    assert words == ["True", "False", "True"]
