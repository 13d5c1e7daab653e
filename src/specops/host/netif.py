"""Which network interface of this host holds an address: the one torch's collectives must use.

gloo and NCCL pick their interface from the hostname unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
name one; a host whose hostname resolves to loopback (or to the wrong network) then trains over the
wrong link or not at all. The inventory names the host's training address; this finds its interface.
Asks iproute2 (`ip`) when the host has it; else the standard library (Linux): each interface's primary
IPv4 address through the SIOCGIFADDR ioctl, IPv6 from /proc/net/if_inet6.
"""

from __future__ import annotations

import fcntl
import ipaddress
import shutil
import socket
import struct
import subprocess
from pathlib import Path

SIOCGIFADDR = 0x8915
IF_INET6 = Path("/proc/net/if_inet6")


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on this interface
            return None
    return socket.inet_ntoa(answer[20:24])


def _ipv6_addresses() -> list[tuple[str, str]]:
    """(interface, address) for every IPv6 address; none where the kernel has IPv6 off."""
    try:
        lines = IF_INET6.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        words = line.split()
        if len(words) >= 6 and len(words[0]) == 32:
            found.append((words[5], str(ipaddress.IPv6Address(bytes.fromhex(words[0])))))
    return found


def addresses() -> dict[str, list[str]]:
    """Every interface of this host (its network namespace) with its addresses."""
    found: dict[str, list[str]] = {name: [] for _index, name in socket.if_nameindex()}
    for name in found:
        ipv4 = _ipv4_of(name)
        if ipv4:
            found[name].append(ipv4)
    for name, address in _ipv6_addresses():
        found.setdefault(name, []).append(address)
    return found


def _ip_tool_interface(address: str) -> str | None:
    """iproute2's answer (`ip -o addr show to ADDR`), which also knows secondary IPv4 addresses."""
    ip = shutil.which("ip")
    if ip is None:
        return None
    try:
        listed = subprocess.run([ip, "-o", "addr", "show", "to", address], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = listed.stdout.split()
    return words[1].split("@")[0] if listed.returncode == 0 and len(words) > 1 else None


def interface_of(address: str) -> str | None:
    """The interface holding `address` (an IP literal), or None when no interface of this host has it."""
    found = _ip_tool_interface(address)
    if found:
        return found
    wanted = ipaddress.ip_address(address)
    for name, held in addresses().items():
        if any(ipaddress.ip_address(item) == wanted for item in held):
            return name
    return None
