#include "sessions/fast_path.h"

#include <algorithm>
#include <map>
#include <string>

namespace jax_pathways {
namespace {

// Handles the controller mints start here (controller/handle_store.py);
// a client naming one as a result handle goes to Python.
constexpr uint64_t kServerHandlesStart = uint64_t{1} << 48;

int HandleHook(void* fast_path, uint64_t stream, const char* data,
               size_t size) {
  return static_cast<FastPath*>(fast_path)->Handle(
      stream, std::string_view(data, size));
}

}  // namespace

void FastPath::Attach(const JpReplySink& sink) {
  std::lock_guard<std::mutex> lock(sink_mu_);
  sink_ = sink;
}

void FastPath::Detach() {
  std::lock_guard<std::mutex> lock(sink_mu_);
  sink_ = JpReplySink{1, nullptr, nullptr};
}

JpRequestHook FastPath::hook() { return JpRequestHook{1, this, &HandleHook}; }

void FastPath::Open(uint64_t stream, ClientId client) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_[stream].client = client;
}

std::vector<ArrayRecord> FastPath::Close(uint64_t stream) {
  std::vector<ArrayRecord> out;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(stream);
  if (it == sessions_.end()) return out;
  for (auto& [handle, record] : it->second.arrays) {
    out.push_back(std::move(record));
  }
  sessions_.erase(it);
  return out;
}

bool FastPath::Put(uint64_t stream, uint64_t handle, ArrayRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  return s != nullptr && s->arrays.emplace(handle, std::move(record)).second;
}

std::optional<ArrayRecord> FastPath::Take(uint64_t stream, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  if (s == nullptr) return std::nullopt;
  auto a = s->arrays.find(handle);
  if (a == s->arrays.end()) return std::nullopt;
  ArrayRecord record = std::move(a->second);
  s->arrays.erase(a);
  return record;
}

bool FastPath::Contains(uint64_t stream, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  return s != nullptr && s->arrays.count(handle) > 0;
}

size_t FastPath::Count(uint64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  return s == nullptr ? 0 : s->arrays.size();
}

std::vector<std::pair<uint64_t, ArrayRecord>> FastPath::Records(
    uint64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  if (s == nullptr) return {};
  return {s->arrays.begin(), s->arrays.end()};
}

void FastPath::NoteClientHandle(uint64_t stream, uint64_t handle) {
  if (handle >= kServerHandlesStart) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (Session* s = FindLocked(stream)) {
    s->max_client_handle = std::max(s->max_client_handle, handle);
  }
}

void FastPath::Register(uint64_t stream, uint64_t executable,
                        FastProgram program) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  if (s == nullptr) return;
  auto [p, added] = s->programs.try_emplace(executable);
  FastProgram& known = p->second;
  if (!added && known.program == program.program &&
      known.epoch == program.epoch &&
      known.arg_layouts.size() == program.arg_layouts.size()) {
    for (size_t i = 0; i < known.arg_layouts.size(); ++i) {
      std::vector<int64_t>& accepted = known.arg_layouts[i];
      for (int64_t layout : program.arg_layouts[i]) {
        if (std::find(accepted.begin(), accepted.end(), layout) ==
            accepted.end()) {
          accepted.push_back(layout);
        }
      }
    }
    return;
  }
  known = std::move(program);
}

void FastPath::Unregister(uint64_t stream, uint64_t executable) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Session* s = FindLocked(stream)) s->programs.erase(executable);
}

FastPath::Session* FastPath::FindLocked(uint64_t stream) {
  auto it = sessions_.find(stream);
  return it == sessions_.end() ? nullptr : &it->second;
}

FastPathStats FastPath::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool FastPath::Handle(uint64_t stream, std::string_view request) {
  IfrtRequest r = ifrt_wire::Read(request);
  if (r.kind == IfrtRequest::kOther) return false;
  Gangs gangs;
  std::vector<BufferId> buffers;
  ClientId client = 0;
  bool taken = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Session* found = FindLocked(stream)) {
      Session& s = *found;
      client = s.client;
      switch (r.kind) {
        case IfrtRequest::kExecute:
          taken = Execute(s, r, &gangs);
          stats_.executes += taken;
          break;
        case IfrtRequest::kDestructArray:
          taken = Destruct(s, r, &gangs, &buffers);
          stats_.destructs += taken;
          break;
        case IfrtRequest::kCheckValueReady:
          taken = ReadyBuffers(s, r, &buffers);
          stats_.ready_checks += taken;
          break;
        case IfrtRequest::kOther:
          break;
      }
    }
    stats_.declined += !taken;
  }
  if (!taken) return false;
  // In request order: this thread handles the stream's requests one by
  // one, and Python submitted what it handled before settling it.
  for (std::vector<IslandOp>& gang : gangs) {
    dispatcher_->Submit(std::move(gang), 0, client);
  }
  switch (r.kind) {
    case IfrtRequest::kExecute:
      Reply(stream, r.op_id, ifrt_wire::kExecuteField, Status());
      break;
    case IfrtRequest::kDestructArray:
      dispatcher_->Forget(buffers);
      Reply(stream, r.op_id, ifrt_wire::kDestructArrayField, Status());
      break;
    default:  // CheckValueReady: once the buffers are
      dispatcher_->WhenReady(buffers, [this, stream,
                                        op_id = r.op_id](const Status& s) {
        Reply(stream, op_id, ifrt_wire::kCheckValueReadyField, s);
      });
      break;
  }
  return true;
}

bool FastPath::Execute(Session& s, const IfrtRequest& r, Gangs* gangs) {
  // The first call's results are handles the controller mints, and a
  // status to fill is a future Python keeps: both Python's.
  if (r.fill_status || r.results.empty()) return false;
  auto p = s.programs.find(r.executable);
  if (p == s.programs.end()) return false;
  const FastProgram& program = p->second;
  if (program.epoch != dispatcher_->epoch() ||
      r.args.size() != program.arg_layouts.size() ||
      r.results.size() != program.output_layouts.size()) {
    return false;
  }
  std::vector<BufferId> args;
  args.reserve(r.args.size());
  for (size_t i = 0; i < r.args.size(); ++i) {
    auto a = s.arrays.find(r.args[i]);
    if (a == s.arrays.end() || a->second.donated) return false;
    const std::vector<int64_t>& accepted = program.arg_layouts[i];
    if (std::find(accepted.begin(), accepted.end(), a->second.layout) ==
        accepted.end()) {
      return false;
    }
    args.push_back(a->second.buffer);
  }
  // New handles, counting up from every one the client used before.
  uint64_t last = s.max_client_handle;
  for (uint64_t h : r.results) {
    if (h <= last || h >= kServerHandlesStart) return false;
    last = h;
  }
  // Taken: nothing below declines.
  s.max_client_handle = last;
  for (size_t i : program.donated) {
    if (i < r.args.size()) s.arrays[r.args[i]].donated = true;
  }
  std::vector<BufferId> results = dispatcher_->NewBuffers(r.results.size());
  for (size_t i = 0; i < r.results.size(); ++i) {
    s.arrays[r.results[i]] = ArrayRecord{
        results[i], program.output_layouts[i], program.output_islands[i],
        false};
  }
  std::vector<IslandOp> gang(program.islands.size());
  for (size_t k = 0; k < gang.size(); ++k) {
    gang[k].island = program.islands[k];
    gang[k].op.kind = OpKind::kLaunch;
    gang[k].op.program = program.program;
    gang[k].op.args = args;
    gang[k].op.results = results;
    gang[k].result_bytes = program.result_bytes[k];
  }
  gangs->push_back(std::move(gang));
  return true;
}

bool FastPath::Destruct(Session& s, const IfrtRequest& r, Gangs* gangs,
                        std::vector<BufferId>* forget) {
  // Every handle here and named once; else Python says which are unknown.
  for (size_t i = 0; i < r.args.size(); ++i) {
    if (!s.arrays.count(r.args[i]) ||
        std::count(r.args.begin(), r.args.begin() + i, r.args[i])) {
      return false;
    }
  }
  // As moves.release: one DELETE per island, after the ops queued there.
  std::map<IslandId, std::vector<BufferId>> by_island;
  for (uint64_t h : r.args) {
    auto a = s.arrays.find(h);
    for (IslandId island : a->second.islands) {
      by_island[island].push_back(a->second.buffer);
    }
    forget->push_back(a->second.buffer);
    s.arrays.erase(a);
  }
  for (auto& [island, buffers] : by_island) {
    IslandOp op;
    op.island = island;
    op.op.kind = OpKind::kDelete;
    op.op.args = std::move(buffers);
    gangs->push_back({std::move(op)});
  }
  return true;
}

bool FastPath::ReadyBuffers(Session& s, const IfrtRequest& r,
                            std::vector<BufferId>* buffers) {
  for (uint64_t h : r.args) {
    auto a = s.arrays.find(h);
    // A donated array's error ("deleted") is Python's to word.
    if (a == s.arrays.end() || a->second.donated) return false;
    buffers->push_back(a->second.buffer);
  }
  return true;
}

void FastPath::Reply(uint64_t stream, uint64_t op_id, uint32_t field,
                     const Status& status) {
  std::string reply = ifrt_wire::Reply(op_id, field, status);
  std::lock_guard<std::mutex> lock(sink_mu_);
  if (sink_.send != nullptr) {
    sink_.send(sink_.server, stream, reply.data(), reply.size());
  }
}

}  // namespace jax_pathways
