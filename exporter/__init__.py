"""Prometheus exporter for IPsec (VICI) and WireGuard gateways."""
