"""What the project's programs share, below all of them: the daemon clients (VICI for charon; WireGuard's
UAPI and netlink), and the run-time pieces every command sets up the same way.

``agent``, ``exporter``, ``initnat`` and ``controller`` are programs; none imports another. Code two of
them need lives here (or, for the plan contract, in ``gwplan``).
"""
