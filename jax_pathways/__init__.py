"""jax_pathways: one Python process drives many accelerator hosts.

    import jax_pathways
    jax_pathways.initialize()      # embedded local cluster, or
    jax_pathways.initialize("grpc://controller:port")

From then on unchanged JAX code runs through the single controller.
"""
import os

# Before any gRPC loads (grpcio here, the copies in jaxlib and the C++
# frontend read it too): this package's processes fork only to exec
# (subprocess), never to use gRPC in the child, and gRPC's fork handlers,
# run while its threads are busy, left a poller on a closed epoll fd
# (workers and clients aborted, "epoll_wait error: Bad file descriptor").
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# pylint: disable=wrong-import-position
from jax_pathways._initialize import connection
from jax_pathways._initialize import initialize
from jax_pathways._initialize import local_cluster
from jax_pathways._initialize import shutdown
from jax_pathways.profiling import profile
from jax_pathways.tracing import trace

__version__ = "0.1.0"

__all__ = ["connection", "initialize", "local_cluster", "profile", "shutdown",
           "trace", "__version__"]
