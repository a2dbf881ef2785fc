#include <pybind11/stl.h>

#include "controller/server/grpc_server.h"
#include "python/bytes_casters.h"
#include "python/server_bindings.h"
#include "python/status_casters.h"

namespace py = pybind11;

namespace jax_pathways {

void RegisterGrpcServer(py::module_& m) {
  py::class_<HostBuffers>(m, "HostBuffers")
      .def(py::init<>())
      .def("open_session", &HostBuffers::OpenSession, py::arg("session"))
      .def("close_session", &HostBuffers::CloseSession, py::arg("session"))
      .def(
          "take",
          [](HostBuffers& h, uint64_t session, uint64_t handle,
             std::optional<py::capsule> stream) -> py::object {
            const JpUploadStream* s = nullptr;
            if (stream) {
              if (std::string(stream->name()) != kUploadStreamCapsule) {
                throw py::type_error("not an upload stream capsule");
              }
              s = stream->get_pointer<JpUploadStream>();
            }
            StatusOr<std::optional<HostBuffer>> got = [&] {
              py::gil_scoped_release nogil;
              return h.TakeOrWatch(session, handle, s);
            }();
            std::optional<HostBuffer> taken = ValueOrThrow(std::move(got));
            if (!taken) return py::none();
            // (pieces, size): the pieces in one capsule, not copied; handed
            // to Dispatcher.submit as a payload tail they are not copied
            // either.
            size_t size = SizeOf(*taken);
            return py::make_tuple(PiecesToCapsule(std::move(*taken)), size);
          },
          py::arg("session"), py::arg("handle"),
          py::arg("stream") = std::nullopt)
      .def("unstream", &HostBuffers::Unstream, py::arg("session"),
           py::arg("handle"), py::call_guard<py::gil_scoped_release>())
      .def(
          "store",
          [](HostBuffers& h, uint64_t session, uint64_t handle,
             py::buffer data) {
            // A fetched array's bytes (an event payload) are kept, not
            // copied.
            ThrowIfError(h.Store(session, handle, {SharedOrCopy(data)}));
          },
          py::arg("session"), py::arg("handle"), py::arg("data"))
      .def("total_bytes", &HostBuffers::total_bytes);

  py::enum_<FrontendEvent::Kind>(m, "EventKind")
      .value("OPEN", FrontendEvent::kOpen)
      .value("REQUEST", FrontendEvent::kRequest)
      .value("CLOSED", FrontendEvent::kClosed)
      .value("UNARY", FrontendEvent::kUnary)
      .value("WAKE", FrontendEvent::kWake);

  py::class_<GrpcServer>(m, "GrpcServer")
      .def(py::init<>())
      .def(
          "start",
          [](GrpcServer& s, const std::string& address,
             int max_request_bytes, double first_message_timeout_s,
             std::vector<std::string> python_unary,
             std::vector<std::string> python_streams) {
            StatusOr<int> port = [&] {
              py::gil_scoped_release nogil;
              return s.Start(address, max_request_bytes,
                             first_message_timeout_s, std::move(python_unary),
                             std::move(python_streams));
            }();
            return ValueOrThrow(std::move(port));
          },
          py::arg("address"), py::arg("max_request_bytes"),
          py::arg("first_message_timeout_s"), py::arg("python_unary"),
          py::arg("python_streams"))
      .def(
          "poll",
          [](GrpcServer& s, double timeout_s, size_t max_items) {
            std::vector<FrontendEvent> events;
            {
              py::gil_scoped_release nogil;
              events = s.Poll(timeout_s, max_items);
            }
            // (kind, id, data, method, metadata, peer); the last three are
            // empty except for OPEN and UNARY events.
            py::list out;
            for (FrontendEvent& e : events) {
              py::dict metadata;
              for (auto& [k, v] : e.metadata) {
                metadata[py::str(k)] = py::bytes(v);
              }
              out.append(py::make_tuple(e.kind, e.id, py::bytes(e.data),
                                        e.method, metadata, e.peer));
            }
            return out;
          },
          py::arg("timeout_s"), py::arg("max_items") = 256)
      .def(
          "send",
          [](GrpcServer& s, uint64_t id, py::bytes data) {
            std::string bytes = data;
            py::gil_scoped_release nogil;
            return s.Send(id, std::move(bytes));
          },
          py::arg("id"), py::arg("data"))
      // Offers held requests to the fast path: C++ only.
      .def("settle", &GrpcServer::Settle, py::arg("id"), py::arg("n") = 1,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "set_request_hook",
          [](GrpcServer& s, py::capsule hook) {
            if (std::string(hook.name()) != kRequestHookCapsule) {
              throw py::type_error("not a request hook capsule");
            }
            s.SetRequestHook(*hook.get_pointer<JpRequestHook>());
          },
          py::arg("hook"))
      .def("reply_sink",
           [](GrpcServer& s) {
             return py::capsule(new JpReplySink(s.reply_sink()),
                                kReplySinkCapsule, [](void* p) {
                                  delete static_cast<JpReplySink*>(p);
                                });
           })
      .def("cork", &GrpcServer::Cork)
      .def("uncork", &GrpcServer::Uncork,
           py::call_guard<py::gil_scoped_release>())
      .def("admit", &GrpcServer::Admit, py::arg("id"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "finish",
          [](GrpcServer& s, uint64_t id, int code, std::string message) {
            py::gil_scoped_release nogil;
            s.Finish(id, Status(static_cast<Code>(code), std::move(message)));
          },
          py::arg("id"), py::arg("code"), py::arg("message"))
      .def(
          "reply",
          [](GrpcServer& s, uint64_t id, int code, std::string message,
             py::bytes data) {
            std::string bytes = data;
            py::gil_scoped_release nogil;
            s.Reply(id, Status(static_cast<Code>(code), std::move(message)),
                    std::move(bytes));
          },
          py::arg("id"), py::arg("code"), py::arg("message"), py::arg("data"))
      .def_property_readonly(
          "host_buffers",
          [](GrpcServer& s) -> HostBuffers& { return s.host_buffers(); },
          py::return_value_policy::reference_internal)
      .def("wake", &GrpcServer::Wake)
      .def("open_calls", &GrpcServer::open_calls)
      .def("shutdown", &GrpcServer::Shutdown,
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace jax_pathways
