"""A process owns the ports it listens on: a second one that asks for a port already held is
refused at startup, before it starts anything, with a message that names the port and the flag.

Why a check of our own: p2pd (hivemind's libp2p daemon) listens with SO_REUSEPORT, so a second
DHT node on the DHT port of a running one binds it as well and starts without an error; the
kernel then splits incoming connections between the two swarms. gRPC servers here are created
with SO_REUSEPORT off (protocol/channels.py) and fail on their own, but only once the DHT is up.
So both are tried here first, by binding the address without SO_REUSEPORT: that fails while any
other socket listens on it, SO_REUSEPORT or not. SO_REUSEADDR is set so that connections of a
process that just ended (TIME_WAIT) do not count as a holder. Port 0 (any free port) is never
checked. A process that takes the port between the check and the real bind is not caught: the
check is for the common mistake (two coordinators on 31337), not a lock.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Iterable


class PortInUse(OSError):
    """A port this process must listen on is held by another process; the message says what to pass instead."""


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int
    transport: str = "tcp"  # or "udp" (a QUIC multiaddr)


def listen_addresses(maddrs: Iterable[str]) -> list[ListenAddress]:
    """The fixed (non-zero) IP ports of multiaddrs like /ip4/0.0.0.0/tcp/31337 or /ip6/::/udp/31337/quic;
    names (/dns/...) and port 0 are left out: there is nothing to check before they are resolved or picked."""
    found = []
    for maddr in maddrs:
        parts = str(maddr).strip("/").split("/")
        if len(parts) >= 4 and parts[0] in ("ip4", "ip6") and parts[2] in ("tcp", "udp") and parts[3].isdigit() and int(parts[3]):
            found.append(ListenAddress(parts[1], int(parts[3]), parts[2]))
    return found


def in_use(address: ListenAddress) -> bool:
    """Does another socket listen on `address` now (SO_REUSEPORT or not)? Other bind errors (an
    address this machine does not have, a privileged port) are not a holder: the real bind reports them."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    kind = socket.SOCK_STREAM if address.transport == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT connections hold nothing
        try:
            probe.bind((address.host, address.port))
            if kind == socket.SOCK_STREAM:
                probe.listen()
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def ensure_free(addresses: Iterable[ListenAddress], *, what: str, advice: str) -> None:
    """Raise PortInUse naming the first address of `addresses` that another process holds.
    `what` names the port ("DHT", "gRPC"); `advice` says what to pass instead."""
    for address in addresses:
        if in_use(address):
            raise PortInUse(f"{what} port {address.port} is already in use by another process "
                            f"({address.transport} {address.host}:{address.port} cannot be bound): {advice}")


def check_dht_ports(maddrs: Iterable[str]) -> None:
    """Refuse (PortInUse) DHT listen multiaddrs (--host-maddrs) whose fixed port another process holds."""
    ensure_free(listen_addresses(maddrs), what="DHT",
                advice="pass --host-maddrs /ip4/0.0.0.0/tcp/PORT with a free PORT (0: any free port)")


def check_grpc_port(host: str, port: int) -> None:
    """Refuse (PortInUse) a fixed gRPC port (--port) another process holds; port 0 is never refused."""
    if port:
        ensure_free([ListenAddress(host, port)], what="gRPC", advice="pass --port with a free port (0: any free port)")
