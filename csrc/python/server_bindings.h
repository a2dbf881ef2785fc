// Register(m) of the _server module's classes.
#ifndef JAX_PATHWAYS_CSRC_PYTHON_SERVER_BINDINGS_H_
#define JAX_PATHWAYS_CSRC_PYTHON_SERVER_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace jax_pathways {

void RegisterGrpcServer(pybind11::module_& m);

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_PYTHON_SERVER_BINDINGS_H_
