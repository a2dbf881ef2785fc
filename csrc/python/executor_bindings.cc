#include <pybind11/stl.h>

#include <optional>

#include "worker/executor.h"
#include "python/bindings.h"
#include "python/bytes_casters.h"
#include "python/status_casters.h"
#include "transport/peer_links.h"

namespace py = pybind11;

namespace jax_pathways {

void RegisterExecutor(py::module_& m) {
  py::class_<Executor>(m, "Executor")
      .def(py::init<int, std::string, double>(), py::arg("controller_fd"),
           py::arg("controller") = "", py::arg("controller_timeout_s") = 0.0)
      .def(
          "next",
          [](Executor& e, double timeout_s) -> std::optional<Op> {
            StatusOr<std::vector<Op>> ops = [&] {
              py::gil_scoped_release nogil;
              return e.Next(timeout_s, 1);
            }();
            std::vector<Op> one = ValueOrThrow(std::move(ops));
            if (one.empty()) return std::nullopt;
            return std::move(one.front());
          },
          py::arg("timeout_s"))
      .def(
          "next_batch",
          [](Executor& e, double timeout_s, size_t max_ops) {
            if (max_ops < 1) throw py::value_error("max_ops must be >= 1");
            StatusOr<std::vector<Op>> ops = [&] {
              py::gil_scoped_release nogil;
              return e.Next(timeout_s, max_ops);
            }();
            return ValueOrThrow(std::move(ops));
          },
          py::arg("timeout_s"), py::arg("max_ops"))
      .def(
          "complete",
          [](Executor& e, uint64_t seq, int code, std::string message,
             py::buffer payload, double device_seconds) {
            if (!(device_seconds >= 0 &&
                  device_seconds * 1e9 <= kMaxEventDeviceNs)) {
              throw py::value_error("device_seconds must be in [0, 86400]");
            }
            const auto device_ns = static_cast<uint64_t>(device_seconds * 1e9);
            BytesView bytes(payload);
            Status status(static_cast<Code>(code), message);
            Status s;
            if (bytes.view().size() <= Executor::kSmallEvent) {
              // A launch's report: written (or queued) at once. Keeping the
              // GIL saves the op loop a hand-off of it per op.
              s = e.CompleteSmall(seq, status, bytes.view(), device_ns);
            } else {
              py::gil_scoped_release nogil;
              s = e.Complete(seq, status, bytes.view(), device_ns);
            }
            ThrowIfError(s);
          },
          py::arg("seq"), py::arg("code"), py::arg("message"),
          py::arg("payload"), py::arg("device_seconds") = 0.0)
      .def("backlog", &Executor::backlog)
      .def("pending_losses",
           [](Executor& e) {
             py::list out;
             for (const Executor::Loss& l : e.PendingLosses()) {
               out.append(py::make_tuple(l.island, l.upto, l.why));
             }
             return out;
           })
      // (taken from their stage, read instead): PUTs that named a stage.
      .def_property_readonly("staged_puts",
                             [](Executor& e) {
                               return py::make_tuple(e.staged_puts(),
                                                     e.unstaged_puts());
                             })
      .def("lost",
           [](Executor& e) -> std::string { return e.closed().message(); })
      .def("shutdown", &Executor::Shutdown,
           py::call_guard<py::gil_scoped_release>());
}

void RegisterPeerLinks(py::module_& m) {
  py::class_<PeerLinks>(m, "PeerLinks")
      .def(py::init<>())
      .def("add", &PeerLinks::Add, py::arg("fd"), py::arg("peer_name"))
      .def(
          "send",
          [](PeerLinks& p, int link, uint64_t transfer_id, int code,
             std::string message, py::buffer data) {
            BytesView bytes(data);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = p.Send(link, transfer_id,
                         Status(static_cast<Code>(code), message),
                         bytes.view());
            }
            ThrowIfError(s);
          },
          py::arg("link"), py::arg("transfer_id"), py::arg("code"),
          py::arg("message"), py::arg("data"))
      .def(
          "receive",
          [](PeerLinks& p, int link, uint64_t transfer_id, double timeout_s) {
            StatusOr<Bytes> got = [&] {
              py::gil_scoped_release nogil;
              return p.Receive(link, transfer_id, timeout_s);
            }();
            return ToNumpy(ValueOrThrow(std::move(got)));
          },
          py::arg("link"), py::arg("transfer_id"), py::arg("timeout_s"))
      .def("close", &PeerLinks::Close, py::arg("link"), py::arg("why"),
           py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &PeerLinks::Shutdown,
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace jax_pathways
