#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "controller/dispatcher/dispatcher.h"
#include "python/bindings.h"
#include "python/bytes_casters.h"
#include "python/status_casters.h"

namespace py = pybind11;

namespace jax_pathways {
namespace {

// (island, kind, program, args, results, payload) as Python writes one op;
// the payload is bytes, or (head, tail) whose tail is shared, not copied,
// when it is an array the C++ side made (SharedOrCopy).
using PyIslandOp = std::tuple<IslandId, OpKind, uint64_t, std::vector<BufferId>,
                              std::vector<BufferId>, py::object>;

const char* StateName(BufferState s) {
  switch (s) {
    case BufferState::kPending:
      return "pending";
    case BufferState::kReady:
      return "ready";
    case BufferState::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace

void RegisterDispatcher(py::module_& m) {
  py::class_<Dispatcher>(m, "Dispatcher")
      .def(py::init<int>(), py::arg("max_in_flight"))
      .def(
          "add_island",
          [](Dispatcher& d, IslandId island, int fd, std::string name,
             int64_t memory_bytes) {
            ThrowIfError(
                d.AddIsland(island, fd, std::move(name), memory_bytes));
          },
          py::arg("island"), py::arg("fd"), py::arg("name"),
          py::arg("memory_bytes") = 0)
      .def(
          "submit",
          [](Dispatcher& d, const std::vector<PyIslandOp>& gang,
             uint64_t tag, ClientId client,
             const std::vector<std::vector<int64_t>>& result_bytes,
             const std::vector<uint64_t>& stages,
             const std::vector<BufferId>& fails_with) {
            std::vector<IslandOp> ops;
            ops.reserve(gang.size());
            for (const auto& [island, kind, program, args, results, payload] :
                 gang) {
              IslandOp io;
              io.island = island;
              io.op.kind = kind;
              io.op.program = program;
              io.op.args = args;
              io.op.results = results;
              if (py::isinstance<py::tuple>(payload)) {
                auto parts = payload.cast<py::tuple>();
                if (parts.size() != 2) {
                  throw py::value_error(
                      "a payload in parts is (head, [tails])");
                }
                io.op.payload = Bytes::Copy(
                    BytesView(parts[0].cast<py::buffer>()).view());
                for (py::handle tail : parts[1].cast<py::sequence>()) {
                  if (const std::vector<Bytes>* pieces =
                          PiecesInCapsule(tail)) {
                    io.op.payload_tails.insert(io.op.payload_tails.end(),
                                               pieces->begin(), pieces->end());
                  } else {
                    io.op.payload_tails.push_back(
                        SharedOrCopy(tail.cast<py::buffer>()));
                  }
                }
              } else {
                io.op.payload = Bytes::Copy(
                    BytesView(payload.cast<py::buffer>()).view());
              }
              if (ops.size() < result_bytes.size()) {
                io.result_bytes = result_bytes[ops.size()];
              }
              if (ops.size() < stages.size()) io.op.stage = stages[ops.size()];
              if (ops.size() < fails_with.size()) {
                io.fails_with = fails_with[ops.size()];
              }
              ops.push_back(std::move(io));
            }
            py::gil_scoped_release nogil;
            d.Submit(std::move(ops), tag, client);
          },
          py::arg("gang"), py::arg("tag"), py::arg("client") = 0,
          py::arg("result_bytes") = std::vector<std::vector<int64_t>>(),
          py::arg("stages") = std::vector<uint64_t>(),
          py::arg("fails_with") = std::vector<BufferId>())
      .def(
          "stream_upload",
          [](Dispatcher& d, uint64_t stage,
             const std::vector<std::tuple<IslandId, uint64_t, uint64_t>>&
                 dests) {
            // A capsule holding one reference.
            std::vector<StageDest> to;
            for (const auto& [island, total, base] : dests) {
              to.push_back(StageDest{island, total, base});
            }
            auto* stream =
                new JpUploadStream(d.StreamUpload(stage, std::move(to)));
            return py::capsule(stream, kUploadStreamCapsule, [](void* p) {
              auto* s = static_cast<JpUploadStream*>(p);
              s->release(s->target);
              delete s;
            });
          },
          py::arg("stage"), py::arg("dests"))
      .def("new_stage", &Dispatcher::NewStage)
      .def("unstage", &Dispatcher::Unstage, py::arg("islands"),
           py::arg("stage"), py::call_guard<py::gil_scoped_release>())
      .def("set_weight", &Dispatcher::SetWeight, py::arg("client"),
           py::arg("weight"))
      .def("forget_client", &Dispatcher::ForgetClient, py::arg("client"))
      .def("expire_memory_waits", &Dispatcher::ExpireMemoryWaits,
           py::arg("max_wait_s"), py::call_guard<py::gil_scoped_release>())
      .def("expire_silent_islands", &Dispatcher::ExpireSilentIslands,
           py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("shares",
           [](Dispatcher& d) {
             py::list out;
             for (const ClientShare& s : d.Shares()) {
               py::dict row;
               row["client"] = s.client;
               row["weight"] = s.weight;
               row["device_seconds"] = s.device_seconds;
               row["waiting"] = s.waiting;
               out.append(row);
             }
             return out;
           })
      .def("when_ready",
           py::overload_cast<const std::vector<BufferId>&, uint64_t>(
               &Dispatcher::WhenReady),
           py::arg("ids"), py::arg("tag"),
           py::call_guard<py::gil_scoped_release>())
      .def("new_buffers", &Dispatcher::NewBuffers, py::arg("n"))
      .def("new_transfers", &Dispatcher::NewTransfers, py::arg("n"))
      .def_property_readonly("epoch", &Dispatcher::epoch)
      .def(
          "state",
          [](Dispatcher& d, BufferId id) {
            Status failure;
            BufferState s = d.State(id, &failure);
            return py::make_tuple(StateName(s), StatusTuple(failure));
          },
          py::arg("id"))
      .def("cork", &Dispatcher::Cork)
      .def("uncork", &Dispatcher::Uncork,
           py::call_guard<py::gil_scoped_release>())
      .def("forget", &Dispatcher::Forget, py::arg("ids"),
           py::call_guard<py::gil_scoped_release>())
      .def("note_loss", &Dispatcher::NoteLoss, py::arg("island"),
           py::arg("note"), py::call_guard<py::gil_scoped_release>())
      .def(
          "fail_island",
          [](Dispatcher& d, IslandId island, int code, std::string message) {
            py::gil_scoped_release nogil;
            d.FailIsland(island,
                         Status(static_cast<Code>(code), std::move(message)));
          },
          py::arg("island"), py::arg("code"), py::arg("message"))
      .def(
          "poll",
          [](Dispatcher& d, double timeout_s, size_t max_items) {
            std::vector<Completion> done;
            {
              py::gil_scoped_release nogil;
              done = d.Poll(timeout_s, max_items);
            }
            py::list out;
            for (Completion& c : done) {
              py::list payloads;
              for (Bytes& p : c.payloads) payloads.append(ToNumpy(std::move(p)));
              out.append(py::make_tuple(c.tag, static_cast<int>(c.status.code()),
                                        c.status.message(), payloads));
            }
            return out;
          },
          py::arg("timeout_s"), py::arg("max_items") = 1024)
      .def("stats",
           [](Dispatcher& d) {
             py::list out;
             for (const IslandStats& s : d.Stats()) {
               py::dict row;
               row["island"] = s.island;
               row["name"] = s.name;
               row["alive"] = s.alive;
               row["error"] = s.error;
               row["restarts"] = s.restarts;
               row["last_lost"] = s.last_lost;
               row["last_lost_at"] = s.last_lost_at;
               row["queued"] = s.queued;
               row["in_flight"] = s.in_flight;
               row["unfinished"] = s.unfinished;
               row["submitted"] = s.submitted;
               row["finished"] = s.finished;
               row["memory_used"] = s.memory_used;
               row["memory_capacity"] = s.memory_capacity;
               row["reads_locally"] = s.reads_locally;
               row["lent"] = s.lent;
               row["staged_bytes"] = s.staged_bytes;
               row["held_stage_bytes"] = s.held_stage_bytes;
               row["send_backlog_bytes"] = s.send_backlog_bytes;
               row["running_client"] = s.running_client;
               row["running_program"] = s.running_program;
               row["running_s"] = s.running_s;
               row["others_waiting"] = s.others_waiting;
               out.append(row);
             }
             return out;
           })
      .def("live_buffers", &Dispatcher::live_buffers)
      .def("shutdown", &Dispatcher::Shutdown,
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace jax_pathways
