"""This node's addresses come from the kernel (no `ifconfig`, no 8.8.8.8 probe), and a wrong interface
name is an error that lists the interfaces this node has."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from verl_patches.base import node_ip
from verl_patches.base.node_ip import NetworkError, interface_ipv4, is_this_node, local_ipv4s, resolve_ipv4


def test_loopback_interface() -> None:
    assert interface_ipv4("lo") == "127.0.0.1"


def test_unknown_interface_lists_the_existing_ones() -> None:
    with pytest.raises(NetworkError) as e:
        interface_ipv4("SOCKET IFNAME FOR CURRENT NODE")
    msg = str(e.value)
    assert msg.startswith("SOCKET_IFNAME='SOCKET IFNAME FOR CURRENT NODE': no such interface")
    for _, name in socket.if_nameindex():
        assert name in msg


def test_every_interface_address_is_ipv4() -> None:
    addrs = local_ipv4s()
    assert "127.0.0.1" in addrs
    for a in addrs:
        assert isinstance(ipaddress.ip_address(a), ipaddress.IPv4Address)


def test_is_this_node() -> None:
    assert is_this_node("127.0.0.1")
    assert is_this_node("localhost")
    assert not is_this_node("192.0.2.254") or "192.0.2.254" in local_ipv4s()  # TEST-NET-1


def test_unresolvable_master_addr_names_the_variable() -> None:
    with pytest.raises(NetworkError) as e:
        resolve_ipv4("no-such-host.invalid")
    assert "MASTER_ADDR='no-such-host.invalid'" in str(e.value)


def test_no_probe_socket_is_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vendor found its IP by connecting a UDP socket to 8.8.8.8; ours never connects anywhere."""

    def refuse(*_a, **_k):
        raise AssertionError("node_ip connected a socket")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert interface_ipv4("lo") == "127.0.0.1" and "127.0.0.1" in node_ip.local_ipv4s()
