// jax_pathways._server: the controller's gRPC endpoint (links grpc++).
// A module of its own so that workers and clients never load grpc++.
#include <pybind11/pybind11.h>

#include "absl/synchronization/mutex.h"

#include "python/server_bindings.h"
#include "python/status_casters.h"

PYBIND11_MODULE(_server, m) {
  m.doc() = "jax_pathways C++ gRPC frontend for JAX's IFRT-proxy client.";
  // The distribution's abseil may be built without NDEBUG, which turns on
  // its lock-order deadlock detector: every absl::Mutex gRPC takes (several
  // per message) then updates a process-wide graph, ~7% of the gRPC
  // thread's CPU (perf). Release builds of abseil run without it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  jax_pathways::RegisterStatus(
      m, pybind11::module_::import("jax_pathways._core").attr("JaxPathwaysError"));
  jax_pathways::RegisterGrpcServer(m);
}
