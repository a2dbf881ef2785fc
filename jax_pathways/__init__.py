"""jax_pathways: one Python process drives many accelerator hosts.

    import jax_pathways
    jax_pathways.initialize()      # embedded local cluster, or
    jax_pathways.initialize("grpc://controller:port")

From then on unchanged JAX code runs through the single controller.
"""
from jax_pathways._initialize import connection
from jax_pathways._initialize import initialize
from jax_pathways._initialize import local_cluster
from jax_pathways._initialize import shutdown
from jax_pathways.profiling import profile
from jax_pathways.tracing import trace

__version__ = "0.1.0"

__all__ = ["connection", "initialize", "local_cluster", "profile", "shutdown",
           "trace", "__version__"]
