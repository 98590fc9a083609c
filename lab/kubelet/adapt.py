"""What the lab's kernel needs that the pod spec (rightly) does not say. Pure, and the only place where the
lab kubelet knows it runs the gateway pod. docs/e2e.md states each difference.

The lab kernel has no ESP (LAB-FACTS), so charon cannot use kernel-netlink for its SAs; it needs
``kernel-libipsec`` (userspace ESP over a TUN device, loaded before kernel-netlink). For the container the
pod spec names ``/usr/lib/ipsec/charon`` (and only for it), the lab kubelet therefore runs charon with:

* a strongswan.conf that is the image's ``images/gateway/strongswan.conf`` with ``kernel-libipsec``
  inserted in front of ``kernel-netlink`` in charon's ``load =`` list, nothing else changed (group,
  socket, logging stay the image's), at the image's path ``/etc/vpngw/strongswan.conf``;
* ``/dev/net/tun`` (libipsec's ``ipsec0``); from the image (podman) also the host's kernel-libipsec plugin
  and ``libipsec.so.0``, bound read-only into it: the image does not ship them (production does not use
  them). The kubelet checks that the host's strongSwan is the image's version first;
* the plan's ``nat.sourceAddress`` as a /32 on the pod's ``lo``: under kernel-libipsec a CHILD_SA whose
  local traffic selector holds no local address cannot install its route (LAB-FACTS); kernel-netlink
  does not need it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHARON = "/usr/lib/ipsec/charon"
IMAGE_STRONGSWAN_CONF = ROOT / "images" / "gateway" / "strongswan.conf"
STRONGSWAN_CONF_PATH = "/etc/vpngw/strongswan.conf"
LIBIPSEC_FILES = (
    (
        "/usr/lib/ipsec/plugins/libstrongswan-kernel-libipsec.so",
        "/usr/lib/ipsec/plugins/libstrongswan-kernel-libipsec.so",
    ),
    ("/usr/lib/ipsec/libipsec.so.0.0.0", "/usr/lib/ipsec/libipsec.so.0"),
)
"""(host file, path in the image) for charon from the image."""
TUN = "/dev/net/tun"


def is_charon(container: Mapping[str, Any]) -> bool:
    command = container.get("command") or []
    return bool(command) and command[0] == CHARON


def lab_strongswan_conf(image_conf: str) -> str:
    """The image's strongswan.conf with ``kernel-libipsec`` loaded before ``kernel-netlink`` (charon's
    ``load =`` only; the swanctl section is left alone). ValueError when the image's conf has no such list."""
    out, n = re.subn(
        r"^(charon \{.*?^\s*load = )(.*?)$",
        lambda m: m.group(1) + m.group(2).replace("kernel-netlink", "kernel-libipsec kernel-netlink", 1),
        image_conf,
        count=1,
        flags=re.M | re.S,
    )
    if n != 1 or "kernel-libipsec kernel-netlink" not in out:
        raise ValueError("the image's strongswan.conf has no charon 'load =' list naming kernel-netlink")
    return out


def source_address(plan_bytes: bytes) -> str | None:
    """The plan's ``nat.sourceAddress`` (None when it has none or is unreadable)."""
    import gwplan

    try:
        plan = gwplan.loads(plan_bytes)
    except gwplan.PlanError:
        return None
    return plan.nat.source_address if plan.nat is not None else None
