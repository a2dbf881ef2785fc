// jax_pathways._core: the C++ hot path (ordering, futures, transport).
// The contract Python sees is jax_pathways/_core.pyi.
#include <pybind11/pybind11.h>

#include "python/bindings.h"
#include "python/status_casters.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "jax_pathways C++ core: dispatcher, executor endpoint, transport.";
  jax_pathways::RegisterStatus(m, jax_pathways::NewErrorType());
  jax_pathways::RegisterOp(m);
  jax_pathways::RegisterDispatcher(m);
  jax_pathways::RegisterExecutor(m);
  jax_pathways::RegisterPeerLinks(m);
  jax_pathways::RegisterFastPath(m);
}
