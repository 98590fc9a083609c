"""The IPsec backend: keeps charon configured over VICI and reports status.tunnels."""
