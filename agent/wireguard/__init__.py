"""The agent's WireGuard backend: plan -> desired device (pure), diff, status, and the run loop. The
device clients it drives (UAPI, netlink) are in ``gwkit.wireguard``."""
