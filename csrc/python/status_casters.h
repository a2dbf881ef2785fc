// The one place where a C++ Status becomes a Python exception.
//
// INVALID_ARGUMENT -> ValueError, UNIMPLEMENTED -> NotImplementedError,
// DEADLINE_EXCEEDED -> TimeoutError, everything else -> JaxPathwaysError with
// the numeric code in `.code`.
#ifndef JAX_PATHWAYS_CSRC_PYTHON_STATUS_CASTERS_H_
#define JAX_PATHWAYS_CSRC_PYTHON_STATUS_CASTERS_H_

#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "common/status.h"

namespace jax_pathways {

// Thrown by bindings; translated by the translator RegisterStatus() installs.
struct StatusError {
  Status status;
};

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError{s};
}

template <typename T>
T ValueOrThrow(StatusOr<T> v) {
  if (!v.ok()) throw StatusError{v.status()};
  return std::move(v.value());
}

// (code, message) as Python sees a Status inside data (completions).
inline pybind11::tuple StatusTuple(const Status& s) {
  return pybind11::make_tuple(static_cast<int>(s.code()), s.message());
}

// Installs this module's translator for StatusError. `error_type` is the
// JaxPathwaysError class (created by _core, shared by every module).
void RegisterStatus(pybind11::module_& m, pybind11::handle error_type);
// Creates JaxPathwaysError (in _core only).
pybind11::handle NewErrorType();

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_PYTHON_STATUS_CASTERS_H_
