// jax_pathways._frontend: the controller's gRPC endpoint (links grpc++).
// A module of its own so that workers and clients never load grpc++.
#include <pybind11/pybind11.h>

#include "python/frontend_bindings.h"
#include "python/status_casters.h"

PYBIND11_MODULE(_frontend, m) {
  m.doc() = "jax_pathways C++ gRPC frontend for JAX's IFRT-proxy client.";
  jax_pathways::RegisterStatus(
      m, pybind11::module_::import("jax_pathways._core").attr("JaxPathwaysError"));
  jax_pathways::RegisterGrpcServer(m);
}
