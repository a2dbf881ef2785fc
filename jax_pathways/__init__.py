"""jax_pathways: one Python process drives many accelerator hosts.

    import jax_pathways
    jax_pathways.initialize()      # embedded local cluster, or
    jax_pathways.initialize("grpc://controller:port")

From then on unchanged JAX code runs through the single controller.
"""
import importlib
import os
from typing import TYPE_CHECKING, Any

# Before any gRPC loads (grpcio here, the copies in jaxlib and the C++
# frontend read it too): this package's processes fork only to exec
# (subprocess), never to use gRPC in the child, and gRPC's fork handlers,
# run while its threads are busy, left a poller on a closed epoll fd
# (workers and clients aborted, "epoll_wait error: Bad file descriptor").
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"

# What a user calls, imported at first use: this package is also the parent
# of every controller, worker, program reader and coordination host
# (`python -m jax_pathways...`), which need none of the client's modules
# (0.3 s of CPU each, in processes a cluster starts by the dozen).
_PUBLIC = {
    "connection": "jax_pathways._initialize",
    "initialize": "jax_pathways._initialize",
    "local_cluster": "jax_pathways._initialize",
    "shutdown": "jax_pathways._initialize",
    "profile": "jax_pathways.profiling",
    "trace": "jax_pathways.tracing",
}

if TYPE_CHECKING:
  from jax_pathways._initialize import connection
  from jax_pathways._initialize import initialize
  from jax_pathways._initialize import local_cluster
  from jax_pathways._initialize import shutdown
  from jax_pathways.profiling import profile
  from jax_pathways.tracing import trace

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
  if name not in _PUBLIC:
    raise AttributeError(f"module 'jax_pathways' has no attribute {name!r}")
  value = getattr(importlib.import_module(_PUBLIC[name]), name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_PUBLIC))
