"""WireGuard boundary: device/peer state and the backends that read and program it (UAPI, netlink)."""
