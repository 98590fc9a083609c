"""From validated resources to the gateway PLAN: allocation (virtual IPs, conntrack marks), rendering,
and the swanctl.conf view of a plan. Pure."""
