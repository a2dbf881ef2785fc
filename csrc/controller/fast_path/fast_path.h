// FastPath: a training loop's steady-state requests, answered in C++.
//
// Execute of a program Python registered, CheckValueReady, DestructArray,
// an upload alike to one Python made (MakeArrayFromHostBuffer, or a sharded
// one: MakeArraysFromHostBufferShards), and a
// logged value's read (FullyReplicatedShard or
// DisassembleIntoSingleDeviceArrays of an array on one island, then
// CopyToHostBuffer of the shards) are handled on the
// frontend's completion-queue thread (through common/request_hook.h)
// without entering Python, when every array they name is in this session's
// table here. Anything else -- another request, an array Python holds, a
// handle that is not plainly new, a program whose islands changed
// (dispatcher epoch), a donated argument, a read with strides -- is
// declined and goes to Python unchanged, which checks it fully and answers
// every error.
//
// One source of truth: an array handle lives either in this table or in
// Python's (controller/array_store.py), never both. Python puts the outputs
// of the programs it registered here, and takes a record over (it moves to
// Python) when a rare request needs the array. Records here share no memory
// with other buffers (Python takes them before making any), except the
// shards made here: a one-device array's only shard is the array, named by
// another handle of the same buffer (a buffer's handles are counted, and
// the last one's destruct deletes it); another array's shards are new
// buffers holding parts of its memory (a COPY op). A launch donating a
// buffer that shares memory or handles goes to Python, and Python takes
// such buffers' handles over together.
//
// Thread safety: every method may be called from any thread.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_FAST_PATH_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_FAST_PATH_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "common/request_hook.h"
#include "controller/dispatcher/dispatcher.h"
#include "controller/fast_path/ifrt_messages.h"

namespace jax_pathways {

// How an array of one layout splits into single-device arrays, as Python's
// handlers split it (controller/handlers/array.py `_split`): Python's plan,
// one per layout.
struct ShardPlan {
  IslandId island = 0;  // the array's only island
  // Per device of the array, in order: its shard's layout. One entry: the
  // shard is the array itself, under another handle.
  std::vector<int64_t> layouts;
  bool replicated = false;  // not tiled: FullyReplicatedShard applies
  // COPY op payloads making arrays of the first local shard, and of every
  // one in order.
  Bytes first;
  Bytes all;
  // With several layouts: how each shard splits in turn (JAX reads a shard
  // through its own FullyReplicatedShard).
  std::vector<std::shared_ptr<const ShardPlan>> shard_plans;
};

struct ArrayRecord {
  BufferId buffer = 0;
  // Python's interned (dtype, shape, sharding, islands) of the array.
  int64_t layout = 0;
  std::vector<IslandId> islands;
  bool donated = false;  // a launch consumed it
  // How to split it; null: Python's to answer.
  std::shared_ptr<const ShardPlan> shards;
  // The buffer whose device memory this one is part of (a shard made here;
  // it may have been deleted since); 0: none.
  BufferId shares = 0;
};

// A buffer of one launch by its role: the Execute's argument or result
// `index`, or a temporary the launch makes and deletes.
struct StepRef {
  enum Space : uint8_t { kArg = 0, kResult = 1, kTemp = 2 };
  Space space = kArg;
  uint32_t index = 0;
};

// One op of a launch's schedule (controller/gangs.py), its buffers by
// role.
struct StepOp {
  IslandId island = 0;
  OpKind kind = OpKind::kLaunch;
  uint64_t program = 0;
  std::vector<StepRef> args;
  std::vector<StepRef> results;
  Bytes payload;
  // Which move between islands of the launch: its transfer id (fresh per
  // launch) is the op's program. -1: none.
  int64_t move = -1;
  // A move's op that does not take its source (a receive): it fails with
  // the source if that has failed by the time the op is numbered
  // (IslandOp::fails_with).
  bool fails_with_source = false;
  std::vector<int64_t> result_bytes;
};

// What one Execute submits: gangs in order, then the temporaries forgotten.
struct Schedule {
  uint64_t id = 0;  // Python's: the same program at the same epoch and
                    // argument layouts has the same one
  std::vector<std::vector<StepOp>> gangs;
  size_t temps = 0;
  std::vector<StepRef> move_sources;  // per move
};

// What Python checked once of a compiled program (one program, or an MPMD
// program of several), for the launches after.
struct FastProgram {
  // Dispatcher epoch Python checked the program's islands at.
  uint64_t epoch = 0;
  // Per argument, the layouts Python accepted there (a call's arguments
  // may come from an upload, another program or this one's outputs).
  std::vector<std::vector<int64_t>> arg_layouts;
  std::vector<int64_t> output_layouts;
  std::vector<std::vector<IslandId>> output_islands;
  std::vector<std::shared_ptr<const ShardPlan>> output_shards;
  std::vector<size_t> donated;  // argument indices
  Schedule schedule;
};

// What Python made of one upload request (MakeArrayFromHostBuffer, or
// MakeArraysFromHostBufferShards), for the requests alike (the same but for
// their handles).
struct UploadPlan {
  // One island's PUT op of an array.
  struct Put {
    IslandId island = 0;
    int64_t bytes = 0;  // its device memory there
    Bytes head;         // the payload before its first blob
    // Its blobs in order: the padding before each (none before the first:
    // that is in the head), and which of the request's uploads it is.
    std::vector<std::pair<Bytes, size_t>> blobs;
  };
  struct Array {
    int64_t layout = 0;
    std::shared_ptr<const ShardPlan> shards;
    std::vector<Put> puts;  // one per island of the array, in order
  };
  // The size of each upload the request names, in order.
  std::vector<size_t> upload_bytes;
  std::vector<Array> arrays;  // one per array the request makes
  // Dispatcher epoch Python placed them at: islands lost or rejoined since
  // send the next one to Python again.
  uint64_t epoch = 0;
};

struct FastPathStats {
  uint64_t executes = 0;
  uint64_t ready_checks = 0;
  uint64_t destructs = 0;
  uint64_t shards = 0;  // FullyReplicatedShard and Disassemble
  uint64_t reads = 0;   // CopyToHostBuffer
  uint64_t uploads = 0;  // MakeArray(s)FromHostBuffer(Shards)
  // Uploads whose request came before their bytes, offered again once
  // they had arrived (counted in `uploads` once taken).
  uint64_t upload_waits = 0;
  uint64_t declined = 0;  // requests left to Python
};

class FastPath {
 public:
  // An upload planned here whose request comes before its bytes is waited
  // for up to `wait_max_bytes`; a larger one goes to Python, which streams
  // it to its workers while it arrives.
  // `server_handles_start`: the first handle the controller mints (Python's
  // validation.SERVER_HANDLES_START); a client naming one as a result
  // handle goes to Python.
  FastPath(Dispatcher* dispatcher, uint64_t wait_max_bytes,
           uint64_t server_handles_start)
      : dispatcher_(dispatcher),
        wait_max_bytes_(wait_max_bytes),
        server_handles_start_(server_handles_start) {}
  FastPath(const FastPath&) = delete;
  FastPath& operator=(const FastPath&) = delete;

  // Where replies go; Detach() before the frontend goes away.
  void Attach(const JpReplySink& sink);
  void Detach();
  JpRequestHook hook();

  // `host_session`: the session's id in the frontend's HostBuffers.
  void Open(uint64_t stream, ClientId client, uint64_t host_session);
  // The session's records, one per buffer, which the caller releases.
  std::vector<ArrayRecord> Close(uint64_t stream);
  // False if `handle` is in use here.
  bool Put(uint64_t stream, uint64_t handle, ArrayRecord record);
  // The record of `handle` and of every other handle naming its buffer
  // (`handle`'s first), moved out; empty if `handle` is not here.
  std::vector<std::pair<uint64_t, ArrayRecord>> Take(uint64_t stream,
                                                     uint64_t handle);
  // The payload (its format is Python's: controller/op_payloads.py) of a
  // FETCH op that reads an array densely, in row-major order. Reads are
  // left to Python until it is set.
  void SetFetchPayload(Bytes fetch);
  bool Contains(uint64_t stream, uint64_t handle);
  size_t Count(uint64_t stream);
  std::vector<std::pair<uint64_t, ArrayRecord>> Records(uint64_t stream);
  // A client-minted handle Python used: result handles the fast path takes
  // must be above every one (JAX's client counts up), so that none can name
  // an array Python holds.
  void NoteClientHandle(uint64_t stream, uint64_t handle);
  // Adds the program, or, for the same program at the same epoch, the
  // argument layouts of another call Python checked.
  void Register(uint64_t stream, uint64_t executable, FastProgram program);
  void Unregister(uint64_t stream, uint64_t executable);
  // The plan of the upload request whose first new array was `array` (one
  // this declined, which Python answered), for those alike.
  void RegisterUpload(uint64_t stream, uint64_t array, UploadPlan plan);
  FastPathStats stats();
  // Whether `stream` is owed no reply that comes later, from the
  // dispatcher's threads (CheckValueReady, CopyToHostBuffer); if one is
  // owed, the frontend is woken (the sink's wake) once the last is queued.
  // Python ends a stream its client closed only once it is paid.
  bool PaidOrWake(uint64_t stream);

  // The hook (common/request_hook.h): 1 if it took the request, 0 if
  // Python is to, JP_WAIT_FOR_UPLOAD to offer it again once the upload
  // `*wait_handle` of host-buffer session `*wait_session` is stored.
  int Handle(uint64_t stream, std::string_view request,
             uint64_t* wait_session, uint64_t* wait_handle);

 private:
  struct Session {
    ClientId client = 0;
    uint64_t host_session = 0;
    std::unordered_map<uint64_t, ArrayRecord> arrays;
    // Buffers more than one handle names, and how many do.
    std::unordered_map<BufferId, int> holders;
    // Buffers part of whose memory shards made here hold, and how many.
    std::unordered_map<BufferId, int> sharers;
    std::unordered_map<uint64_t, FastProgram> programs;
    // Upload plans by request signature; the signatures of uploads left to
    // Python, by the first array they make (both bounded).
    std::unordered_map<std::string, UploadPlan> uploads;
    std::unordered_map<uint64_t, std::string> unplanned;
    uint64_t max_client_handle = 0;
    // The last upload request told to wait for its bytes, and the index
    // of the upload it waits for: it waits again only for an earlier one,
    // so at most once per upload.
    std::optional<uint64_t> waited_op;
    size_t waited_upload = 0;
  };
  using Gangs = std::vector<std::vector<IslandOp>>;

  // Requires mu_. The session of `stream`, or nullptr.
  Session* FindLocked(uint64_t stream);
  // Require mu_. Check everything first, change nothing unless taken; the
  // work to submit (outside mu_) goes to `gangs`.
  // `temps`: the launch's temporaries, to forget once submitted.
  bool Execute(Session& s, const IfrtRequest& r, Gangs* gangs,
               std::vector<BufferId>* temps);
  bool Destruct(Session& s, const IfrtRequest& r, Gangs* gangs,
                std::vector<BufferId>* forget);
  bool ReadyBuffers(Session& s, const IfrtRequest& r,
                    std::vector<BufferId>* buffers);
  // FullyReplicatedShard (the first shard) and Disassemble (every one).
  bool Split(Session& s, const IfrtRequest& r, Gangs* gangs);
  // Whether `buffer` shares memory or handles (see Take).
  static bool Shared(const Session& s, const ArrayRecord& record);
  // The last handle of `record`'s buffer is gone.
  static void Deleted(Session& s, const ArrayRecord& record);
  bool Fetch(Session& s, const IfrtRequest& r, Gangs* gangs);
  // Sets *wait_for to the upload to offer the request again once it has
  // arrived, if it is to be.
  bool Upload(Session& s, const IfrtRequest& r, Gangs* gangs,
              std::optional<uint64_t>* wait_for);
  // Whether `handles` are new: counting up from every one the client used
  // before, below the controller's own.
  bool FreshHandles(const Session& s,
                    const std::vector<uint64_t>& handles) const;
  // Stores a finished read's bytes in the frontend, then replies.
  void Fetched(uint64_t stream, uint64_t host_session, uint64_t op_id,
               uint64_t host_buffer, Completion done);
  void Reply(uint64_t stream, IfrtRequest::Kind kind, uint64_t op_id,
             const Status& status, const std::vector<uint64_t>& results = {});
  // A reply to `stream` will come later (ReplyOwed).
  void Owe(uint64_t stream);
  void ReplyOwed(uint64_t stream, IfrtRequest::Kind kind, uint64_t op_id,
                 const Status& status);

  Dispatcher* const dispatcher_;
  const uint64_t wait_max_bytes_;
  const uint64_t server_handles_start_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Session> sessions_;
  FastPathStats stats_;
  Bytes fetch_payload_;  // guarded by mu_; empty: reads go to Python
  std::mutex owed_mu_;  // guards owed_ and awaited_ (a leaf)
  std::unordered_map<uint64_t, size_t> owed_;
  std::unordered_set<uint64_t> awaited_;  // owed, and PaidOrWake() was asked
  std::mutex sink_mu_;  // guards sink_ (replies may come from any thread)
  JpReplySink sink_{};  // version 0: none attached
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_FAST_PATH_H_
