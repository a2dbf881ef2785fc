// Register(m) of the frontend module's classes.
#ifndef JAX_PATHWAYS_CSRC_PYTHON_FRONTEND_BINDINGS_H_
#define JAX_PATHWAYS_CSRC_PYTHON_FRONTEND_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace jax_pathways {

void RegisterGrpcServer(pybind11::module_& m);

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_PYTHON_FRONTEND_BINDINGS_H_
