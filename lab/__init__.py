"""The embedded network-namespace lab: real charon and wireguard-go daemons for tests and the demo."""
