"""The one naming rule for container IDs, network names and interface names."""

import pytest

from multusd.cni.names import is_valid_ifname, is_valid_name


@pytest.mark.parametrize("name, ok", [
    ("eth0", True), ("a" * 15, True), ("a" * 16, False), ("", False), (".", False),
    ("..", False), ("a/b", False), ("a b", False), ("a\nb", False), ("eth0:1", False),
    ("a\0b", False), ("é" * 7, True), ("é" * 8, False),  # 16 bytes in 8 characters
    ("\u00a0x", False),  # Unicode whitespace
])
def test_interface_names_follow_the_kernel(name, ok):
    assert is_valid_ifname(name) is ok


@pytest.mark.parametrize("name, ok", [
    ("abc123", True), ("a_b.c-d", True), ("", False), ("-a", False), ("a/b", False),
    ("abc\n", False),  # a full match: a trailing newline does not pass
    ("a b", False), ("..", False),
])
def test_container_ids_and_network_names_follow_libcni(name, ok):
    assert is_valid_name(name) is ok
