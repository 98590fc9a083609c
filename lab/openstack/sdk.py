"""openstacksdk connections to the lab: noauth Neutron plus (optionally) the Nova emulator.

The settings that work (measured with openstacksdk 4.22.0 / keystoneauth1 5.18.1)::

    openstack.connect(
        load_yaml_config=False, load_envvars=False,   # hermetic: no clouds.yaml, no OS_* variables
        auth_type="none",                              # keystoneauth1's noauth plugin: no token at all
        auth={"endpoint": NEUTRON},                    # http://127.0.0.1:<port>, the ROOT, not .../v2.0
        network_endpoint_override=NEUTRON,             # (the same: explicit for readers)
        compute_endpoint_override=NOVA + "/v2.1",      # the emulator's versioned endpoint
        api_timeout=T,                                 # per-request timeout, seconds
    )

With ``auth_type="none"`` every service would otherwise get the ``auth.endpoint``: the compute override is
what sends compute calls to the emulator. Neutron's root must be given (not ``/v2.0``): openstacksdk runs
version discovery on it. Nova's is given versioned (``/v2.1``), as in a real service catalog; the SDK asks
it for the microversion range (``GET /v2.1/``) before microversioned calls.
"""

from __future__ import annotations

from typing import Any

import openstack
import openstack.connection


def connect(
    network: str,
    *,
    compute: str | None = None,
    timeout: float | None = 30.0,
    **kwargs: Any,
) -> openstack.connection.Connection:
    """An openstacksdk Connection: network calls to ``network`` (Neutron's root URL or a proxy in front of
    it), compute calls to ``compute`` (the Nova emulator's root URL or a proxy in front of it; ``/v2.1`` is
    appended). ``timeout`` is the per-request timeout (``api_timeout``); ``kwargs`` are further
    openstacksdk/keystoneauth options (e.g. ``connect_retries``, ``status_code_retries``)."""
    options: dict[str, Any] = {
        "load_yaml_config": False,
        "load_envvars": False,
        "auth_type": "none",
        "auth": {"endpoint": network.rstrip("/")},
        "network_endpoint_override": network.rstrip("/"),
        "region_name": "RegionOne",
    }
    if compute is not None:
        options["compute_endpoint_override"] = compute.rstrip("/") + "/v2.1"
    if timeout is not None:
        options["api_timeout"] = timeout
    options.update(kwargs)
    return openstack.connect(**options)
