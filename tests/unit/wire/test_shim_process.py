"""What the shim imports (``posix``, not ``os``; no errors until one happens), and that its
stand-ins for ``os`` give the same answers."""

import os
import subprocess
import sys

import pytest

from multusd.wire import api, shim
from testlib import REPO


@pytest.mark.parametrize("socket_dir", ["/run/multus", "/run/multus/", "/", "/a//b", "relative"])
def test_socket_path_joins_as_os_path_join(socket_dir):
    assert api.socket_path(socket_dir) == os.path.join(socket_dir, api.SOCKET_NAME)


def test_socket_path_default_dir():
    assert api.socket_path("") == "/run/multus/multus.sock"


def test_environment_decodes_as_os_environ():
    assert shim.environment() == dict(os.environ)


def test_environment_keeps_undecodable_bytes_as_os_does():
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from multusd.wire import shim; "
            "print(shim.environment() == dict(os.environ), "
            "shim.environment()['MULTUSD_TEST_BYTES'] == os.environ['MULTUSD_TEST_BYTES'])")
    env = {b"PATH": b"/usr/bin:/bin", b"MULTUSD_TEST_BYTES": b"caf\xe9-\xff"}
    out = subprocess.run([sys.executable, "-I", "-c", code, REPO], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


def test_the_shim_imports_neither_os_nor_the_errors_on_its_happy_path():
    """Nor json, re, enum: reading its config as Go does and writing its answer included."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import multusd.wire.shim; "
            "multusd.convert({'cniVersion': '1.1.0', 'ips': [{'address': '10.0.0.2/24'}]}, "
            "'0.3.1'); multusd.wire.shim.parse_config(b'{\"CNIVersion\": \"1.0.0\", "
            "\"a\": [1.5, \"\\\\ud800\", {}]}'); multusd.ascii_json({'a': [1.5]}); "
            "print(sorted(m for m in ('os', 'socket', 'json', 'typing', 'enum', "
            "'re', 'multusd.errors', '__future__') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, REPO],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
