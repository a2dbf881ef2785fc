#include "python/status_casters.h"

namespace py = pybind11;

namespace jax_pathways {

py::handle NewErrorType() {
  return PyErr_NewExceptionWithDoc(
      "jax_pathways._core.JaxPathwaysError",
      "A jax_pathways runtime error; `.code` holds the absl/gRPC status code.",
      PyExc_RuntimeError, nullptr);
}

void RegisterStatus(py::module_& m, py::handle error_type_handle) {
  // Leaked on purpose: the type must outlive every translator call, including
  // ones during interpreter shutdown.
  static PyObject* error_type = error_type_handle.inc_ref().ptr();
  m.attr("JaxPathwaysError") = error_type_handle;
  // Module-local: each extension has its own (hidden) StatusError type.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const Status& s = e.status;
      switch (s.code()) {
        case Code::kInvalidArgument:
          PyErr_SetString(PyExc_ValueError, s.message().c_str());
          return;
        case Code::kUnimplemented:
          PyErr_SetString(PyExc_NotImplementedError, s.message().c_str());
          return;
        case Code::kDeadlineExceeded:
          PyErr_SetString(PyExc_TimeoutError, s.message().c_str());
          return;
        default: {
          py::object err = py::reinterpret_borrow<py::object>(error_type)(
              s.message());
          err.attr("code") = static_cast<int>(s.code());
          PyErr_SetObject(error_type, err.ptr());
          return;
        }
      }
    }
  });
}

}  // namespace jax_pathways
