"""init-nat: NIC2 discovery, source-policy routing, NAT/authz rules and conntrack revocation."""
