"""jax_pathways on a Ray cluster: `start`, `connect`, `stop`
(deploy/ray_actors.py).

Needs Ray: pip install 'jax_pathways[ray]'.
"""
from jax_pathways.deploy.ray_actors import (DEFAULT_NAME, Cluster, ClusterError,
                                     connect, start, stop)

__all__ = ["DEFAULT_NAME", "Cluster", "ClusterError", "connect", "start",
           "stop"]
