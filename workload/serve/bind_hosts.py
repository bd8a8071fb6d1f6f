"""Ray Serve's listeners on the endpoint's own addresses, where Ray Serve 2.60 binds every interface with no setting.

- HAProxy's stats page (`bind *:8404`) and Prometheus exporter (`bind :9101`): its config template
  (ray/serve/_private/haproxy_templates.py) binds them on every interface while the HTTP frontend binds
  `http_options.host`. They are rewritten to bind the HTTP frontend's host.
- Each replica's inter-deployment gRPC server (ray/serve/_private/replica.py, `"[::]:0"`). When the Ray node's address
  is loopback (the endpoint's private local Ray, workload/serve/endpoint.py) it binds that address, which is the one
  Serve's routers dial; on a cluster node (a reachable address) it is left as Ray binds it.

`keep_serve_listeners_on_their_hosts` is a Ray `worker_process_setup_hook`: it runs in every Ray worker before Serve's
actors render HAProxy's config or start a replica. If Ray's code no longer has what it rewrites, the worker fails
to start naming this module, rather than silently binding every interface.
"""

from __future__ import annotations

import ipaddress
from typing import Any

_REBINDS = {
    "bind :{{ config.metrics_port }}": "bind {{ config.frontend_host }}:{{ config.metrics_port }}",
    "bind *:{{ config.stats_port }}": "bind {{ config.frontend_host }}:{{ config.stats_port }}",
}
_ALL_INTERFACES = "[::]:"


def rebind(template: str) -> str:
    """HAProxy's config template with the stats and metrics listeners on the HTTP frontend's host."""
    for old, new in _REBINDS.items():
        if old not in template:
            raise RuntimeError(
                f"workload.serve.bind_hosts: Ray Serve's HAProxy template has no {old!r} line any more; "
                "check where this Ray version binds HAProxy's stats and metrics listeners"
            )
        template = template.replace(old, new)
    return template


def grpc_binder(add_port: Any, node_address: str) -> Any:
    """`add_port_to_grpc_server` with an all-interfaces address replaced by `node_address`."""

    def add_port_on_node_address(server: Any, address: str) -> int:
        if address.startswith(_ALL_INTERFACES):
            address = f"{node_address}:{address[len(_ALL_INTERFACES) :]}"
        return int(add_port(server, address))

    return add_port_on_node_address


def keep_serve_listeners_on_their_hosts() -> None:
    """The setup hook (`ray.init(runtime_env={"worker_process_setup_hook": ...})`)."""
    import ray
    from ray.serve._private import haproxy, replica

    if "{{ config.frontend_host }}:{{ config.stats_port }}" not in haproxy.HAPROXY_CONFIG_TEMPLATE:
        haproxy.HAPROXY_CONFIG_TEMPLATE = rebind(haproxy.HAPROXY_CONFIG_TEMPLATE)
    node_address = ray.util.get_node_ip_address()
    if ipaddress.ip_address(node_address).is_loopback:
        if not hasattr(replica, "add_port_to_grpc_server"):
            raise RuntimeError(
                "workload.serve.bind_hosts: ray.serve._private.replica no longer binds its gRPC server through "
                "add_port_to_grpc_server; check where this Ray version binds it"
            )
        replica.add_port_to_grpc_server = grpc_binder(replica.add_port_to_grpc_server, node_address)
