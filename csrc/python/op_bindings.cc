#include <pybind11/stl.h>

#include "python/bytes_casters.h"
#include "python/bindings.h"
#include "transport/messages.h"

namespace py = pybind11;

namespace jax_pathways {

void RegisterOp(py::module_& m) {
  py::enum_<OpKind>(m, "OpKind")
      .value("COMPILE", OpKind::kCompile)
      .value("LAUNCH", OpKind::kLaunch)
      .value("PUT", OpKind::kPut)
      .value("FETCH", OpKind::kFetch)
      .value("DELETE", OpKind::kDelete)
      .value("SEND", OpKind::kSend)
      .value("RECEIVE", OpKind::kReceive)
      .value("COPY", OpKind::kCopy)
      .value("SHUTDOWN", OpKind::kShutdown)
      .value("TRACE", OpKind::kTrace)
      .value("PEER_LOST", OpKind::kPeerLost)
      .value("JOIN_GLOBAL", OpKind::kJoinGlobal);

  py::class_<Op>(m, "Op")
      .def_readonly("kind", &Op::kind)
      .def_readonly("seq", &Op::seq)
      .def_readonly("program", &Op::program)
      .def_readonly("args", &Op::args)
      .def_readonly("results", &Op::results)
      // A read-only uint8 view that keeps the Op alive.
      .def_property_readonly(
          "payload", [](const Op& op) { return ToNumpy(op.payload); })
      .def("__repr__", [](const Op& op) {
        return "Op(kind=" + std::to_string(static_cast<int>(op.kind)) +
               ", seq=" + std::to_string(op.seq) +
               ", program=" + std::to_string(op.program) + ")";
      });

  m.attr("WIRE_VERSION") = kWireVersion;
}

}  // namespace jax_pathways
