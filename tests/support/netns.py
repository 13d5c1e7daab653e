"""A test host behind a network that can be cut: an OpenSSH server inside its own network namespace.

The namespace gets one end of a veth pair and a private /30; the other end stays in the root
namespace, where the tests (the control side) run. `partition()` loads an nftables table inside the
namespace that drops every packet in and out except loopback, which is what a pulled cable or a
dead switch looks like to TCP: no reset, no error, just silence. `heal()` deletes that table.

Only the network is private: the namespace shares the filesystem, so the host's workdir, job logs
and tmux sockets are ordinary local paths, readable from the test. Everything is created with
names and a subnet unique to this process and removed by `destroy()`. Needs root, iproute2 and nft;
`NetnsUnavailable` says why when the kernel or the sandbox does not allow it.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from testing.sshd import SSHD, SshServer, keygen

NFT_TABLE = "specops_partition"
SSH_PORT = 2222  # the namespace has its own port space: any port is free in it


class NetnsUnavailable(RuntimeError):
    """Network namespaces, veth pairs or nftables cannot be used here; the message says which."""


def _run(*argv: str, namespace: str | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if namespace is not None:
        argv = ("ip", "netns", "exec", namespace, *argv)
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)


def _must(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        raise NetnsUnavailable(f"{what}: {proc.stderr.strip() or f'exit {proc.returncode}'}")


_ROUTE_TYPES = {"local", "broadcast", "unicast", "unreachable", "blackhole", "prohibit", "throw", "multicast",
                "anycast", "nat"}


def _routed_networks() -> list[ipaddress.IPv4Network]:
    """Every destination the root namespace has a route for, in any table (default routes left out)."""
    networks = []
    for line in _run("ip", "-4", "-o", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        destination = words[1] if words and words[0] in _ROUTE_TYPES and len(words) > 1 else (words or [""])[0]
        with suppress(ValueError):
            networks.append(ipaddress.ip_network(destination, strict=False))
    return networks


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.0.0.0/8 that overlaps no route of the root namespace, picked from this PID."""
    taken = _routed_networks()
    for attempt in range(1000):
        index = (os.getpid() * 7919 + attempt * 104729) % (1 << 22)  # 2^22 /30s in 10/8
        candidate = ipaddress.ip_network((int(ipaddress.ip_address("10.0.0.0")) + index * 4, 30))
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise NetnsUnavailable("no free /30 in 10.0.0.0/8")


@dataclass
class NetnsSshServer(SshServer):
    """The tests' sshd, run inside a namespace and listening on the namespace's address."""

    namespace: str = ""
    address: str = ""

    def write_config(self) -> Path:
        config = super().write_config()
        config.write_text(config.read_text().replace("ListenAddress 127.0.0.1", f"ListenAddress {self.address}"))
        return config

    def known_hosts_line(self) -> str:
        key_type, key_b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {key_type} {key_b64}\n"

    def start(self) -> None:
        import socket

        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        config = self.write_config()
        log = (self.root / "sshd.log").open("ab")
        # `ip netns exec` execs sshd: the PID is the listener's, so connection_children() works.
        self.process = subprocess.Popen(["ip", "netns", "exec", self.namespace, SSHD, "-D", "-e", "-f", str(config)],
                                        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NetnsUnavailable(f"sshd in {self.namespace} exited: "
                                       f"{(self.root / 'sshd.log').read_text()[-1000:]}")
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise NetnsUnavailable(f"sshd in {self.namespace} did not answer on {self.address}:{self.port} within 10 s")


@dataclass
class NetnsHost:
    """A namespace, its veth pair and addresses, and the sshd in it."""

    namespace: str
    outer_link: str
    outer_address: str
    address: str  # the host's address, inside the namespace
    server: NetnsSshServer | None = None
    _partitioned: bool = field(default=False, repr=False)

    @property
    def port(self) -> int:
        return SSH_PORT

    def partition(self) -> None:
        """Drop every packet to and from the namespace (loopback inside it keeps working)."""
        ruleset = (f"table inet {NFT_TABLE} {{\n"
                   "  chain input { type filter hook input priority -10; policy drop; iifname \"lo\" accept; }\n"
                   "  chain output { type filter hook output priority -10; policy drop; oifname \"lo\" accept; }\n"
                   "}\n")
        _must("nft partition", _run("nft", "-f", "-", namespace=self.namespace, stdin=ruleset))
        self._partitioned = True

    def heal(self) -> None:
        if self._partitioned:
            _must("nft heal", _run("nft", "delete", "table", "inet", NFT_TABLE, namespace=self.namespace))
            self._partitioned = False

    @contextmanager
    def partitioned(self) -> Iterator[None]:
        self.partition()
        try:
            yield
        finally:
            self.heal()

    def destroy(self) -> None:
        """Remove everything, whatever state it is in; safe to call twice."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        _run("ip", "link", "del", self.outer_link)  # deletes its peer in the namespace too
        _run("ip", "netns", "del", self.namespace)


def create_netns_host(root: Path, tag: str = "", *, routed: bool = False) -> NetnsHost:
    """Namespace, veth pair, addresses, and a running sshd on the namespace's address.

    tag      a short suffix ([a-z0-9], up to 3) telling this process's hosts apart, for tests of several
    routed   give the namespace a default route through the root namespace (which forwards), so
             hosts in different namespaces reach each other: a torchrun group across them"""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    for tool in ("ip", "nft"):
        if not shutil.which(tool):
            raise NetnsUnavailable(f"{tool} is not installed")
    if tag and (len(tag) > 3 or not tag.isalnum()):
        raise ValueError(f"tag {tag!r}: up to 3 letters or digits")
    tag = f"{os.getpid() % 100000}{tag}"
    subnet = _free_subnet()
    outer_address, inner_address = (str(address) for address in subnet.hosts())
    host = NetnsHost(namespace=f"specops-t{tag}", outer_link=f"spo{tag}", outer_address=outer_address,
                     address=inner_address)
    inner_link = f"spi{tag}"
    _must("ip netns add", _run("ip", "netns", "add", host.namespace))
    try:
        _must("veth pair", _run("ip", "link", "add", host.outer_link, "type", "veth", "peer", "name", inner_link))
        _must("veth into the namespace", _run("ip", "link", "set", inner_link, "netns", host.namespace))
        _must("outer address", _run("ip", "addr", "add", f"{outer_address}/30", "dev", host.outer_link))
        _must("outer link up", _run("ip", "link", "set", host.outer_link, "up"))
        ns = host.namespace
        _must("inner address", _run("ip", "addr", "add", f"{inner_address}/30", "dev", inner_link, namespace=ns))
        _must("inner link up", _run("ip", "link", "set", inner_link, "up", namespace=ns))
        _must("loopback up", _run("ip", "link", "set", "lo", "up", namespace=ns))
        if routed:
            _must("default route", _run("ip", "route", "add", "default", "via", outer_address, namespace=ns))
            _must("forwarding", _run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))
        # nftables must work in the namespace before any test relies on it: try a partition once.
        host.partition()
        host.heal()
        root.mkdir(parents=True, exist_ok=True)
        host_key, client_key = root / "host_ed25519", root / "client_ed25519"
        keygen(host_key, "specops-netns-host")
        keygen(client_key, "specops-netns-client")
        host.server = NetnsSshServer(root=root, port=SSH_PORT, host_key=host_key, client_key=client_key,
                                     namespace=ns, address=inner_address)
        host.server.start()
    except BaseException:
        host.destroy()
        raise
    return host


def netns_hosts(root_for: Callable[[str], Path], tags: tuple[str, ...], *, routed: bool = False) -> list[NetnsHost]:
    """One namespace host per tag (root_for(tag) its folder); all or none: when one cannot be made the
    others are destroyed and NetnsUnavailable is raised."""
    hosts: list[NetnsHost] = []
    try:
        for tag in tags:
            hosts.append(create_netns_host(root_for(tag), tag, routed=routed))
    except NetnsUnavailable:
        for host in hosts:
            host.destroy()
        raise
    return hosts
