#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/bytes_casters.h"
#include "controller/fast_path/fast_path.h"

namespace py = pybind11;

namespace jax_pathways {
namespace {

// (buffer, layout, islands, donated, shares): a record as Python sees it.
using PyRecord =
    std::tuple<BufferId, int64_t, std::vector<IslandId>, bool, BufferId>;

// An upload plan's array as Python gives it: (layout, shards, puts), each
// put (island, bytes, head, blobs), each blob (padding before it, upload).
using PyUploadArray = std::tuple<
    int64_t, std::shared_ptr<ShardPlan>,
    std::vector<std::tuple<IslandId, int64_t, py::buffer,
                           std::vector<std::tuple<py::buffer, size_t>>>>>;

// controller/gangs.py's Schedule.for_fast_path(): (id, temps, move
// sources, gangs), each op (island, kind, program, args, results, payload,
// move, fails_with_source, result_bytes), each buffer (space, index).
using PyRef = std::pair<int, uint32_t>;
using PyStepOp =
    std::tuple<IslandId, int, uint64_t, std::vector<PyRef>, std::vector<PyRef>,
               py::buffer, int64_t, bool, std::vector<int64_t>>;
using PySchedule = std::tuple<uint64_t, size_t, std::vector<PyRef>,
                              std::vector<std::vector<PyStepOp>>>;

// A schedule checked: every buffer it names is one of the launch's, every
// move one of its moves, every op kind one there is.
Schedule ToSchedule(const PySchedule& py_schedule, size_t args,
                    size_t results) {
  const auto& [id, temps, move_sources, gangs] = py_schedule;
  Schedule out;
  out.id = id;
  out.temps = temps;
  auto ref = [&](const PyRef& r) {
    size_t bound = r.first == StepRef::kArg      ? args
                   : r.first == StepRef::kResult ? results
                   : r.first == StepRef::kTemp   ? temps
                                                 : 0;
    if (r.second >= bound) {
      throw py::value_error("a schedule names a buffer the launch has not");
    }
    return StepRef{static_cast<StepRef::Space>(r.first), r.second};
  };
  for (const PyRef& r : move_sources) out.move_sources.push_back(ref(r));
  for (const auto& py_gang : gangs) {
    std::vector<StepOp>& gang = out.gangs.emplace_back();
    for (const auto& [island, kind, program, op_args, op_results, payload,
                      move, fails_with_source, bytes] : py_gang) {
      if (kind < static_cast<int>(OpKind::kCompile) ||
          kind > static_cast<int>(OpKind::kShutdown)) {
        throw py::value_error("a schedule's op kind is not one there is");
      }
      if (move >= static_cast<int64_t>(out.move_sources.size())) {
        throw py::value_error("a schedule's move is not one of its moves");
      }
      StepOp& op = gang.emplace_back();
      op.island = island;
      op.kind = static_cast<OpKind>(kind);
      op.program = program;
      for (const PyRef& r : op_args) op.args.push_back(ref(r));
      for (const PyRef& r : op_results) op.results.push_back(ref(r));
      op.payload = SharedOrCopy(payload);
      op.move = move;
      op.fails_with_source = fails_with_source;
      op.result_bytes = bytes;
    }
  }
  return out;
}

PyRecord ToPython(const ArrayRecord& r) {
  return {r.buffer, r.layout, r.islands, r.donated, r.shares};
}

}  // namespace

void RegisterFastPath(py::module_& m) {
  py::class_<ShardPlan, std::shared_ptr<ShardPlan>>(m, "ShardPlan")
      .def(py::init([](IslandId island, std::vector<int64_t> layouts,
                       bool replicated, const py::buffer& first,
                       const py::buffer& all,
                       std::vector<std::shared_ptr<ShardPlan>> shard_plans) {
             if (layouts.empty() ||
                 (layouts.size() > 1 &&
                  shard_plans.size() != layouts.size())) {
               throw py::value_error("a shard plan needs a layout per "
                                     "shard, and then a plan per shard");
             }
             return std::make_shared<ShardPlan>(ShardPlan{
                 island, std::move(layouts), replicated, SharedOrCopy(first),
                 SharedOrCopy(all),
                 {shard_plans.begin(), shard_plans.end()}});
           }),
           py::arg("island"), py::arg("layouts"), py::arg("replicated"),
           py::arg("first"), py::arg("all"), py::arg("shard_plans"));
  py::class_<FastPath>(m, "FastPath")
      .def(py::init<Dispatcher*, uint64_t, uint64_t>(), py::arg("dispatcher"),
           py::arg("wait_max_bytes"), py::arg("server_handles_start"),
           py::keep_alive<1, 2>())
      .def(
          "attach",
          [](FastPath& f, py::capsule sink) {
            if (std::string(sink.name()) != kReplySinkCapsule) {
              throw py::type_error("not a reply sink capsule");
            }
            f.Attach(*sink.get_pointer<JpReplySink>());
          },
          py::arg("sink"))
      .def("detach", &FastPath::Detach)
      .def("hook",
           [](FastPath& f) {
             return py::capsule(new JpRequestHook(f.hook()),
                                kRequestHookCapsule, [](void* p) {
                                  delete static_cast<JpRequestHook*>(p);
                                });
           })
      .def("open", &FastPath::Open, py::arg("stream"), py::arg("client"),
           py::arg("host_session"))
      .def(
          "close",
          [](FastPath& f, uint64_t stream) {
            std::vector<PyRecord> out;
            for (const ArrayRecord& r : f.Close(stream)) {
              out.push_back(ToPython(r));
            }
            return out;
          },
          py::arg("stream"))
      .def(
          "put",
          [](FastPath& f, uint64_t stream, uint64_t handle, BufferId buffer,
             int64_t layout, std::vector<IslandId> islands,
             std::shared_ptr<ShardPlan> shards) {
            return f.Put(stream, handle,
                         ArrayRecord{buffer, layout, std::move(islands),
                                     false, std::move(shards)});
          },
          py::arg("stream"), py::arg("handle"), py::arg("buffer"),
          py::arg("layout"), py::arg("islands"), py::arg("shards"))
      .def(
          "take",
          [](FastPath& f, uint64_t stream, uint64_t handle) {
            std::vector<std::pair<uint64_t, PyRecord>> out;
            for (const auto& [h, r] : f.Take(stream, handle)) {
              out.emplace_back(h, ToPython(r));
            }
            return out;
          },
          py::arg("stream"), py::arg("handle"))
      .def("contains", &FastPath::Contains, py::arg("stream"),
           py::arg("handle"))
      .def("count", &FastPath::Count, py::arg("stream"))
      .def(
          "records",
          [](FastPath& f, uint64_t stream) {
            std::vector<std::pair<uint64_t, PyRecord>> out;
            for (const auto& [h, r] : f.Records(stream)) {
              out.emplace_back(h, ToPython(r));
            }
            return out;
          },
          py::arg("stream"))
      .def("note_client_handle", &FastPath::NoteClientHandle,
           py::arg("stream"), py::arg("handle"))
      .def(
          "register",
          [](FastPath& f, uint64_t stream, uint64_t executable,
             uint64_t epoch, std::vector<std::vector<int64_t>> arg_layouts,
             std::vector<int64_t> output_layouts,
             std::vector<std::vector<IslandId>> output_islands,
             std::vector<std::shared_ptr<ShardPlan>> output_shards,
             std::vector<size_t> donated, const PySchedule& schedule) {
            if (output_islands.size() != output_layouts.size() ||
                output_shards.size() != output_layouts.size()) {
              throw py::value_error("a fast program's lists do not match");
            }
            Schedule checked = ToSchedule(schedule, arg_layouts.size(),
                                          output_layouts.size());
            f.Register(stream, executable,
                       FastProgram{epoch, std::move(arg_layouts),
                                   std::move(output_layouts),
                                   std::move(output_islands),
                                   {output_shards.begin(),
                                    output_shards.end()},
                                   std::move(donated), std::move(checked)});
          },
          py::arg("stream"), py::arg("executable"), py::arg("epoch"),
          py::arg("arg_layouts"), py::arg("output_layouts"),
          py::arg("output_islands"), py::arg("output_shards"),
          py::arg("donated"), py::arg("schedule"))
      .def(
          "set_fetch_payload",
          [](FastPath& f, const py::buffer& fetch) {
            f.SetFetchPayload(SharedOrCopy(fetch));
          },
          py::arg("fetch"))
      .def("unregister", &FastPath::Unregister, py::arg("stream"),
           py::arg("executable"))
      .def(
          "register_upload",
          [](FastPath& f, uint64_t stream, uint64_t array,
             std::vector<size_t> upload_bytes,
             const std::vector<PyUploadArray>& arrays, uint64_t epoch) {
            UploadPlan plan{std::move(upload_bytes), {}, epoch};
            for (const auto& [layout, shards, puts] : arrays) {
              UploadPlan::Array& a = plan.arrays.emplace_back();
              a.layout = layout;
              a.shards = shards;
              for (const auto& [island, bytes, head, blobs] : puts) {
                UploadPlan::Put& put = a.puts.emplace_back();
                put.island = island;
                put.bytes = bytes;
                put.head = SharedOrCopy(head);
                for (const auto& [pad, upload] : blobs) {
                  if (upload >= plan.upload_bytes.size()) {
                    throw py::value_error("an upload plan names an upload "
                                          "the request does not");
                  }
                  put.blobs.emplace_back(SharedOrCopy(pad), upload);
                }
              }
            }
            f.RegisterUpload(stream, array, std::move(plan));
          },
          py::arg("stream"), py::arg("array"), py::arg("upload_bytes"),
          py::arg("arrays"), py::arg("epoch"))
      .def("stats", [](FastPath& f) {
        FastPathStats s = f.stats();
        py::dict d;
        d["executes"] = s.executes;
        d["ready_checks"] = s.ready_checks;
        d["destructs"] = s.destructs;
        d["shards"] = s.shards;
        d["reads"] = s.reads;
        d["uploads"] = s.uploads;
        d["upload_waits"] = s.upload_waits;
        d["declined"] = s.declined;
        return d;
      })
      .def("paid_or_wake", &FastPath::PaidOrWake, py::arg("stream"));
}

}  // namespace jax_pathways
