"""This node's addresses, from the kernel: no `ifconfig`, no probe to 8.8.8.8 (air-gapped clusters)."""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915


class NetworkError(RuntimeError):
    pass


def interface_ipv4(ifname: str) -> str:
    """IPv4 address of a network interface, or NetworkError naming the interface and the ones that exist."""
    names = [n for _, n in socket.if_nameindex()]
    if ifname not in names:
        raise NetworkError(
            f"SOCKET_IFNAME={ifname!r}: no such interface on {socket.gethostname()} (this node has: {', '.join(names)})"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError:
            raise NetworkError(f"SOCKET_IFNAME={ifname!r} has no IPv4 address on {socket.gethostname()}") from None
    return socket.inet_ntoa(packed[20:24])


def local_ipv4s() -> set[str]:
    out = set()
    for _, name in socket.if_nameindex():
        try:
            out.add(interface_ipv4(name))
        except NetworkError:
            continue
    return out


def resolve_ipv4(address: str) -> str:
    try:
        return socket.gethostbyname(address)
    except OSError as e:
        raise NetworkError(f"MASTER_ADDR={address!r} does not resolve: {e}") from None


def is_this_node(address: str) -> bool:
    return resolve_ipv4(address) in local_ipv4s()
