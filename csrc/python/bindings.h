// Register(m) functions of the bound classes; module.cc only calls them.
#ifndef JAX_PATHWAYS_CSRC_PYTHON_BINDINGS_H_
#define JAX_PATHWAYS_CSRC_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace jax_pathways {

void RegisterOp(pybind11::module_& m);
void RegisterDispatcher(pybind11::module_& m);
void RegisterExecutor(pybind11::module_& m);
void RegisterPeerLinks(pybind11::module_& m);
void RegisterFastPath(pybind11::module_& m);

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_PYTHON_BINDINGS_H_
