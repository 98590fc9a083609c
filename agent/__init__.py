"""status-agent: the gateway pod's sidecar that pushes the plan to charon (VICI) or WireGuard and writes
status back to the custom resource."""
