"""Router port mapping: UPnP IGD (miniupnpc), NAT-PMP (RFC 6886) and PCP (RFC 6887).

``natpmp`` and ``pcp`` are the pure wire formats, ``plan`` every decision (which ports, which
protocol, renewals, back-off, what may be advertised), ``gateway_client`` and ``upnp`` the thin
drivers, and ``service.PortMapper`` the Host service that runs them (``StackOptions.port_mapping``).
"""

from .plan import Lease, PortMapPlan, Wanted, wanted_ports
from .service import PortMapper

__all__ = ["Lease", "PortMapPlan", "PortMapper", "Wanted", "wanted_ports"]
