"""Who the client is behind a reverse proxy: X-Forwarded-For, believed from trusted addresses only.

Behind nginx or a load balancer every connection comes from the proxy, so the per-client
connection limit (listener.py) would cap the whole server at one client's share. With
`--trusted-proxy ADDR` (an address or a network, repeatable), a connection from ADDR is not
counted against ADDR; each request on it counts instead against the client that its
`X-Forwarded-For` names, as requests in flight at once (a proxy reuses its connections for
many clients). The client is the rightmost address of the header that is not itself a trusted
proxy (what a proxy appends is its peer; what is to the left of that, a client could have written).
A header from any other address is ignored: anyone can send one.
"""
from __future__ import annotations

import ipaddress


def networks(addresses) -> tuple:
    """The networks of `--trusted-proxy` values (addresses or CIDR networks); ValueError naming a bad one."""
    out = []
    for a in addresses:
        try:
            out.append(ipaddress.ip_network(a.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--trusted-proxy {a!r} is not an IP address or network") from None
    return tuple(out)


def _address(text: str):
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class TrustedProxies:
    """The trusted proxies' networks; who a request from one of them is for."""

    def __init__(self, addresses=()):
        self.networks = networks(addresses)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, host: str | None) -> bool:
        address = _address(host) if host else None
        return address is not None and any(address in n for n in self.networks)

    def client(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The client that a trusted proxy's X-Forwarded-For names (None: no header, or only proxies
        and unreadable entries in it)."""
        hops = [h for name, value in headers if name.lower() == b"x-forwarded-for"
                for h in value.decode("latin-1").split(",")]
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return None  # past what a proxy wrote: nothing further left can be believed
            if not any(address in n for n in self.networks):
                return str(address)
        return None
