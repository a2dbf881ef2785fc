#include <pybind11/native_enum.h>
#include <pybind11/stl.h>

#include <vector>

#include "python/bytes_casters.h"
#include "python/bindings.h"
#include "transport/messages.h"

namespace py = pybind11;

namespace jax_pathways {

void RegisterOp(py::module_& m) {
  // An IntEnum: the op loop compares kinds and looks handlers up by kind for
  // every op, which on a pybind11 enum cost ~1 us a lookup.
  py::native_enum<OpKind>(m, "OpKind", "enum.IntEnum")
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
      .value("JOIN_GLOBAL", OpKind::kJoinGlobal)
      .value("SAVE", OpKind::kSave)
      .value("LOAD", OpKind::kLoad)
      .value("COLOCATED", OpKind::kColocated)
      .finalize();
  // Op.kind hands out these members, by value: converting the C++ value
  // would call the enum class at every read. Decoding refuses other values.
  std::vector<py::object> kinds(static_cast<size_t>(kLastOpKind) + 1);
  for (const py::handle member : m.attr("OpKind")) {
    kinds.at(member.cast<size_t>()) = py::reinterpret_borrow<py::object>(member);
  }

  py::class_<Op>(m, "Op")
      .def_property_readonly(
          "kind",
          [kinds = std::move(kinds)](const Op& op) {
            return kinds.at(static_cast<size_t>(op.kind));
          })
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
  m.attr("BROKEN_LINK") = std::string(kBrokenLinkWords);
}

}  // namespace jax_pathways
