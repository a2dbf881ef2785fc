#include "controller/fast_path/fast_path.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <unordered_set>

namespace jax_pathways {
namespace {

int HandleHook(void* fast_path, uint64_t stream, const char* data,
               size_t size, uint64_t* wait_session, uint64_t* wait_handle) {
  return static_cast<FastPath*>(fast_path)->Handle(
      stream, std::string_view(data, size), wait_session, wait_handle);
}

// JpReplySink::store's release: the frontend is done with a read's bytes.
void ReleaseBytes(void* owner) { delete static_cast<Bytes*>(owner); }

// Upload plans and pending signatures a session keeps (a loop uploads
// arrays of a few kinds; more is a client trying every kind), and the
// longest signature kept (a dtype, shape and sharding take ~100 bytes; a
// client padding them must not make each entry cost megabytes).
constexpr size_t kUploadKinds = 64;
constexpr size_t kMaxSignature = 4096;

// JpReplySink::take's piece callback: a piece of upload `i`, lent.
void AddPiece(void* uploads, size_t i, const char* data, size_t n,
              void (*release)(void*), void* owner) {
  (*static_cast<std::vector<std::vector<Bytes>>*>(uploads))[i].push_back(
      Bytes::Borrow(std::shared_ptr<const void>(owner, release), data, n));
}

}  // namespace

void FastPath::Attach(const JpReplySink& sink) {
  std::lock_guard<std::mutex> lock(sink_mu_);
  sink_ = sink;
}

void FastPath::Detach() {
  std::lock_guard<std::mutex> lock(sink_mu_);
  sink_ = JpReplySink{};
}

JpRequestHook FastPath::hook() { return JpRequestHook{2, this, &HandleHook}; }

void FastPath::Open(uint64_t stream, ClientId client,
                    uint64_t host_session) {
  std::lock_guard<std::mutex> lock(mu_);
  Session& s = sessions_[stream];
  s.client = client;
  s.host_session = host_session;
}

std::vector<ArrayRecord> FastPath::Close(uint64_t stream) {
  std::vector<ArrayRecord> out;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(stream);
  if (it == sessions_.end()) return out;
  std::unordered_set<BufferId> seen;
  for (auto& [handle, record] : it->second.arrays) {
    if (seen.insert(record.buffer).second) out.push_back(std::move(record));
  }
  sessions_.erase(it);
  return out;
}

bool FastPath::Put(uint64_t stream, uint64_t handle, ArrayRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  return s != nullptr && s->arrays.emplace(handle, std::move(record)).second;
}

std::vector<std::pair<uint64_t, ArrayRecord>> FastPath::Take(
    uint64_t stream, uint64_t handle) {
  std::vector<std::pair<uint64_t, ArrayRecord>> out;
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  if (s == nullptr) return out;
  auto a = s->arrays.find(handle);
  if (a == s->arrays.end()) return out;
  bool alone = !Shared(*s, a->second);
  out.emplace_back(handle, std::move(a->second));
  s->arrays.erase(a);
  if (alone) return out;
  // Python holds a buffer's handles together (one Buffer, counted), and
  // knows which buffers share memory: take every record linked to this one
  // by a buffer or a `shares`, until none is left.
  std::unordered_set<BufferId> group;
  auto link = [&group](const ArrayRecord& r) {
    bool added = group.insert(r.buffer).second;
    if (r.shares != 0) added |= group.insert(r.shares).second;
    return added;
  };
  link(out[0].second);
  for (bool grew = true; grew;) {
    grew = false;
    for (auto it = s->arrays.begin(); it != s->arrays.end();) {
      if (group.count(it->second.buffer) ||
          (it->second.shares != 0 && group.count(it->second.shares))) {
        grew |= link(it->second);
        out.emplace_back(it->first, std::move(it->second));
        it = s->arrays.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (BufferId b : group) {
    s->holders.erase(b);
    s->sharers.erase(b);
  }
  return out;
}

void FastPath::SetFetchPayload(Bytes fetch) {
  std::lock_guard<std::mutex> lock(mu_);
  fetch_payload_ = std::move(fetch);
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
  if (handle >= server_handles_start_) return;
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
  // More argument layouts for the same schedule; else the new one.
  if (!added && known.epoch == program.epoch &&
      known.schedule.id == program.schedule.id &&
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

void FastPath::RegisterUpload(uint64_t stream, uint64_t array,
                              UploadPlan plan) {
  std::lock_guard<std::mutex> lock(mu_);
  Session* s = FindLocked(stream);
  if (s == nullptr) return;
  auto it = s->unplanned.find(array);
  if (it == s->unplanned.end()) return;
  if (s->uploads.size() >= kUploadKinds) s->uploads.clear();
  s->uploads[std::move(it->second)] = std::move(plan);
  s->unplanned.erase(it);
}

FastPath::Session* FastPath::FindLocked(uint64_t stream) {
  auto it = sessions_.find(stream);
  return it == sessions_.end() ? nullptr : &it->second;
}

FastPathStats FastPath::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int FastPath::Handle(uint64_t stream, std::string_view request,
                     uint64_t* wait_session, uint64_t* wait_handle) {
  IfrtRequest r = ifrt_wire::Read(request);
  if (r.kind == IfrtRequest::kOther) return 0;
  Gangs gangs;
  std::vector<BufferId> buffers;
  ClientId client = 0;
  uint64_t host_session = 0;
  bool taken = false;
  bool wait = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Session* found = FindLocked(stream)) {
      Session& s = *found;
      client = s.client;
      switch (r.kind) {
        case IfrtRequest::kExecute:
          taken = Execute(s, r, &gangs, &buffers);
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
        case IfrtRequest::kFullyReplicatedShard:
        case IfrtRequest::kDisassemble:
          taken = Split(s, r, &gangs);
          stats_.shards += taken;
          break;
        case IfrtRequest::kCopyToHostBuffer:
          taken = Fetch(s, r, &gangs);
          stats_.reads += taken;
          host_session = s.host_session;
          break;
        case IfrtRequest::kMakeArray:
        case IfrtRequest::kMakeArrays: {
          std::optional<uint64_t> wait_for;
          taken = Upload(s, r, &gangs, &wait_for);
          stats_.uploads += taken;
          if (wait_for) {
            wait = true;
            *wait_session = s.host_session;
            *wait_handle = *wait_for;
            ++stats_.upload_waits;
          }
          break;
        }
        case IfrtRequest::kOther:
          break;
      }
    }
    stats_.declined += !taken && !wait;
  }
  if (wait) return JP_WAIT_FOR_UPLOAD;
  if (!taken) return 0;
  // In request order: this thread handles the stream's requests one by
  // one, and Python submitted what it handled before settling it.
  if (r.kind == IfrtRequest::kCopyToHostBuffer) {
    Owe(stream);
    dispatcher_->Submit(
        std::move(gangs[0]),
        [this, stream, host_session, op_id = r.op_id,
         host_buffer = r.host_buffer](Completion done) {
          Fetched(stream, host_session, op_id, host_buffer, std::move(done));
        },
        client);
    return true;
  }
  // A launch of many gangs (an MPMD step) reaches each worker in one write.
  const bool cork = gangs.size() > 1;
  if (cork) dispatcher_->Cork();
  for (std::vector<IslandOp>& gang : gangs) {
    dispatcher_->Submit(std::move(gang), 0, client);
  }
  if (cork) dispatcher_->Uncork();
  switch (r.kind) {
    case IfrtRequest::kCheckValueReady:  // once the buffers are
      Owe(stream);
      dispatcher_->WhenReady(buffers, [this, stream,
                                        op_id = r.op_id](const Status& s) {
        ReplyOwed(stream, IfrtRequest::kCheckValueReady, op_id, s);
      });
      return true;
    case IfrtRequest::kExecute:
      if (!buffers.empty()) dispatcher_->Forget(buffers);
      break;
    case IfrtRequest::kDestructArray:
      dispatcher_->Forget(buffers);
      break;
    default:  // the results are the client's handles, named in the reply
      break;
  }
  Reply(stream, r.kind, r.op_id, Status(), r.results);
  return true;
}

bool FastPath::Execute(Session& s, const IfrtRequest& r, Gangs* gangs,
                       std::vector<BufferId>* temps) {
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
  // A donated buffer that shares memory or handles is Python's to consume.
  for (size_t i : program.donated) {
    if (i < args.size() && Shared(s, s.arrays.at(r.args[i]))) return false;
  }
  if (!FreshHandles(s, r.results)) return false;
  // Taken: nothing below declines.
  s.max_client_handle = r.results.back();
  for (size_t i : program.donated) {
    if (i < r.args.size()) s.arrays[r.args[i]].donated = true;
  }
  std::vector<BufferId> results = dispatcher_->NewBuffers(r.results.size());
  for (size_t i = 0; i < r.results.size(); ++i) {
    s.arrays[r.results[i]] = ArrayRecord{
        results[i], program.output_layouts[i], program.output_islands[i],
        false, program.output_shards[i]};
  }
  const Schedule& schedule = program.schedule;
  *temps = dispatcher_->NewBuffers(schedule.temps);
  auto buffer = [&](const StepRef& ref) {
    switch (ref.space) {
      case StepRef::kArg:
        return args[ref.index];
      case StepRef::kResult:
        return results[ref.index];
      default:
        return (*temps)[ref.index];
    }
  };
  std::vector<uint64_t> transfers =
      dispatcher_->NewTransfers(schedule.move_sources.size());
  for (const std::vector<StepOp>& planned : schedule.gangs) {
    std::vector<IslandOp>& gang = gangs->emplace_back(planned.size());
    for (size_t k = 0; k < planned.size(); ++k) {
      const StepOp& p = planned[k];
      IslandOp& op = gang[k];
      op.island = p.island;
      op.op.kind = p.kind;
      op.op.program = p.program;
      for (const StepRef& a : p.args) op.op.args.push_back(buffer(a));
      for (const StepRef& b : p.results) op.op.results.push_back(buffer(b));
      op.op.payload = p.payload;
      if (p.move >= 0) {
        op.op.program = transfers[p.move];
        if (p.fails_with_source) {
          op.fails_with = buffer(schedule.move_sources[p.move]);
        }
      }
      op.result_bytes = p.result_bytes;
    }
  }
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
    auto shared = s.holders.find(a->second.buffer);
    if (shared != s.holders.end()) {  // another handle keeps the buffer
      if (--shared->second == 1) s.holders.erase(shared);
      s.arrays.erase(a);
      continue;
    }
    for (IslandId island : a->second.islands) {
      by_island[island].push_back(a->second.buffer);
    }
    forget->push_back(a->second.buffer);
    Deleted(s, a->second);
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

bool FastPath::FreshHandles(const Session& s,
                            const std::vector<uint64_t>& handles) const {
  uint64_t last = s.max_client_handle;
  for (uint64_t h : handles) {
    if (h <= last || h >= server_handles_start_) return false;
    last = h;
  }
  return true;
}

bool FastPath::Shared(const Session& s, const ArrayRecord& record) {
  return record.shares != 0 || s.holders.count(record.buffer) ||
         s.sharers.count(record.buffer);
}

void FastPath::Deleted(Session& s, const ArrayRecord& record) {
  if (record.shares != 0) {
    auto it = s.sharers.find(record.shares);
    if (it != s.sharers.end() && --it->second == 0) s.sharers.erase(it);
  }
  // Its shards keep naming it (no scan of the table here): buffer ids are
  // never reused, and a stale `shares` only sends a launch donating such a
  // shard to Python.
  s.sharers.erase(record.buffer);
}

bool FastPath::Split(Session& s, const IfrtRequest& r, Gangs* gangs) {
  if (!r.reuse_input) return false;
  auto a = s.arrays.find(r.args[0]);
  if (a == s.arrays.end() || a->second.donated || !a->second.shards) {
    return false;
  }
  std::shared_ptr<const ShardPlan> plan = a->second.shards;
  // Python words the errors: a tiled array's only shard, a wrong count.
  bool first_only = r.kind == IfrtRequest::kFullyReplicatedShard;
  if ((first_only && !plan->replicated) ||
      (!first_only && r.results.size() != plan->layouts.size())) {
    return false;
  }
  if (!FreshHandles(s, r.results)) return false;
  s.max_client_handle = r.results.back();
  ArrayRecord array = a->second;
  if (plan->layouts.size() == 1) {  // the same buffer under another handle
    ArrayRecord shard = array;
    shard.layout = plan->layouts[0];
    int& holders = s.holders[array.buffer];
    holders = holders == 0 ? 2 : holders + 1;
    s.arrays.emplace(r.results[0], std::move(shard));
    return true;
  }
  // New buffers of parts of its memory.
  std::vector<BufferId> buffers = dispatcher_->NewBuffers(r.results.size());
  for (size_t k = 0; k < buffers.size(); ++k) {
    ArrayRecord shard;
    shard.buffer = buffers[k];
    shard.layout = plan->layouts[k];
    shard.islands = {plan->island};
    shard.shards = plan->shard_plans[k];
    shard.shares = array.buffer;
    s.arrays.emplace(r.results[k], std::move(shard));
  }
  s.sharers[array.buffer] += static_cast<int>(buffers.size());
  IslandOp copy;
  copy.island = plan->island;
  copy.op.kind = OpKind::kCopy;
  copy.op.args = {array.buffer};
  copy.op.results = std::move(buffers);
  copy.op.payload = first_only ? plan->first : plan->all;
  gangs->push_back({std::move(copy)});
  return true;
}

bool FastPath::Fetch(Session& s, const IfrtRequest& r, Gangs* gangs) {
  // Strides (a transposed read) are Python's to check; JAX's np.asarray
  // sends none. An array on several islands is gathered first: Python's.
  if (r.byte_strides || fetch_payload_.empty()) return false;
  auto a = s.arrays.find(r.args[0]);
  if (a == s.arrays.end() || a->second.donated ||
      a->second.islands.size() != 1) {
    return false;
  }
  IslandOp fetch;
  fetch.island = a->second.islands[0];
  fetch.op.kind = OpKind::kFetch;
  fetch.op.args = {a->second.buffer};
  fetch.op.payload = fetch_payload_;
  gangs->push_back({std::move(fetch)});
  return true;
}

bool FastPath::Upload(Session& s, const IfrtRequest& r, Gangs* gangs,
                      std::optional<uint64_t>* wait_for) {
  auto p = s.uploads.find(r.signature);
  if (p != s.uploads.end() && p->second.epoch != dispatcher_->epoch()) {
    s.uploads.erase(p);
    p = s.uploads.end();
  }
  if (p == s.uploads.end()) {
    if (r.signature.size() > kMaxSignature) return false;
    if (s.unplanned.size() >= kUploadKinds) s.unplanned.clear();
    s.unplanned[r.results[0]] = r.signature;  // Python may plan it
    return false;
  }
  const UploadPlan& plan = p->second;
  if (!FreshHandles(s, r.results) ||
      r.uploads.size() != plan.upload_bytes.size() ||
      r.results.size() != plan.arrays.size()) {
    return false;
  }
  std::vector<std::vector<Bytes>> uploads(r.uploads.size());
  {
    std::lock_guard<std::mutex> lock(sink_mu_);
    size_t missing = r.uploads.size();
    if (sink_.take == nullptr ||
        !sink_.take(sink_.server, s.host_session, r.uploads.data(),
                    plan.upload_bytes.data(), r.uploads.size(), &AddPiece,
                    &uploads, &missing)) {
      // Not all here yet (the client sends them beside the request), or
      // not the sizes planned. Small ones are waited for, the last missing
      // first: the frontend offers the request again when it is stored.
      // Else (or if that one is still missing: the wait ended without it)
      // Python waits for them (and streams them), or words the error.
      uint64_t total = std::accumulate(plan.upload_bytes.begin(),
                                       plan.upload_bytes.end(), uint64_t{0});
      if (sink_.take != nullptr && missing < r.uploads.size() &&
          total <= wait_max_bytes_ &&
          (s.waited_op != r.op_id || missing < s.waited_upload)) {
        s.waited_op = r.op_id;
        s.waited_upload = missing;
        *wait_for = r.uploads[missing];
      }
      return false;
    }
  }
  s.max_client_handle = r.results.back();
  std::vector<BufferId> buffers = dispatcher_->NewBuffers(r.results.size());
  for (size_t a = 0; a < plan.arrays.size(); ++a) {
    const UploadPlan::Array& array = plan.arrays[a];
    std::vector<IslandId> islands;
    std::vector<IslandOp> gang(array.puts.size());
    for (size_t k = 0; k < gang.size(); ++k) {
      const UploadPlan::Put& put = array.puts[k];
      islands.push_back(put.island);
      gang[k].island = put.island;
      gang[k].op.kind = OpKind::kPut;
      gang[k].op.results = {buffers[a]};
      gang[k].op.payload = put.head;
      for (const auto& [pad, upload] : put.blobs) {
        if (!pad.empty()) gang[k].op.payload_tails.push_back(pad);
        gang[k].op.payload_tails.insert(gang[k].op.payload_tails.end(),
                                        uploads[upload].begin(),
                                        uploads[upload].end());
      }
      gang[k].result_bytes = {put.bytes};
    }
    s.arrays[r.results[a]] = ArrayRecord{buffers[a], array.layout,
                                         std::move(islands), false,
                                         array.shards};
    gangs->push_back(std::move(gang));
  }
  return true;
}

void FastPath::Fetched(uint64_t stream, uint64_t host_session,
                       uint64_t op_id, uint64_t host_buffer,
                       Completion done) {
  Status status = done.status;
  if (status.ok() && done.payloads.size() != 1) {
    status = Status(Code::kInternal, "a read finished without its bytes");
  }
  if (status.ok()) {
    // Stored before the reply: the client looks it up only afterwards.
    auto* bytes = new Bytes(std::move(done.payloads[0]));
    char error[512] = "";
    int code = 0;
    {
      std::lock_guard<std::mutex> lock(sink_mu_);
      if (sink_.store == nullptr) {  // the frontend is gone (the reply too)
        delete bytes;
        code = static_cast<int>(Code::kUnavailable);
      } else {
        code = sink_.store(sink_.server, host_session, host_buffer,
                           bytes->data(), bytes->size(), &ReleaseBytes, bytes,
                           error, sizeof error);
      }
    }
    if (code != 0) status = Status(static_cast<Code>(code), error);
  }
  ReplyOwed(stream, IfrtRequest::kCopyToHostBuffer, op_id, status);
}

void FastPath::Owe(uint64_t stream) {
  std::lock_guard<std::mutex> lock(owed_mu_);
  ++owed_[stream];
}

void FastPath::ReplyOwed(uint64_t stream, IfrtRequest::Kind kind,
                         uint64_t op_id, const Status& status) {
  // Queued before it stops being owed: the stream's end waits for it then.
  Reply(stream, kind, op_id, status);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(owed_mu_);
    auto it = owed_.find(stream);
    if (it != owed_.end() && --it->second == 0) {
      owed_.erase(it);
      wake = awaited_.erase(stream) > 0;
    }
  }
  if (!wake) return;
  std::lock_guard<std::mutex> lock(sink_mu_);
  if (sink_.wake != nullptr) sink_.wake(sink_.server);
}

bool FastPath::PaidOrWake(uint64_t stream) {
  std::lock_guard<std::mutex> lock(owed_mu_);
  if (!owed_.count(stream)) return true;
  awaited_.insert(stream);
  return false;
}

void FastPath::Reply(uint64_t stream, IfrtRequest::Kind kind, uint64_t op_id,
                     const Status& status,
                     const std::vector<uint64_t>& results) {
  std::string reply = ifrt_wire::Reply(kind, op_id, status, results);
  std::lock_guard<std::mutex> lock(sink_mu_);
  if (sink_.send != nullptr) {
    sink_.send(sink_.server, stream, reply.data(), reply.size());
  }
}

}  // namespace jax_pathways
