"""The OpenStack test bed: a REAL Neutron on MariaDB, a fault-injecting proxy, a Nova os-interface EMULATOR.

Modules, from the bottom up (docs/openstack-lab.md has the whole story and the numbers):

* ``process``  daemons in their own process groups, run directories, stale cleanup after a SIGKILL
* ``rest``     plain HTTP JSON calls for the lab's own plumbing
* ``sdk``      ``connect(network, compute=...)``: the openstacksdk settings that work against the lab
* ``proxy``    ``FaultProxy``: status / hang / reset / delay rules by method and path, and a call log
* ``neutron``  ``start_neutron()`` -> ``Neutron``: MariaDB + Neutron 29.0.0 under pyuwsgi, stop/start
* ``nova``     ``NovaEmulator``: servers declared by the test, interfaces attached through the real Neutron
* ``cloud``    ``build_cloud()`` -> ``Cloud`` (the gateway operator's topology), ``Baseline.sweep()``
* ``fixtures`` the pytest plugin: ``openstack_neutron``, ``openstack_cloud``, ``openstack_nova``,
  ``neutron_proxy``, ``nova_proxy``, ``openstack_lab``
* ``__main__`` ``python -m lab.openstack up``: the same lab by hand, until Ctrl-C
"""
