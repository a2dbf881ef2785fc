// The two messages that cross the controller <-> worker channel.
//
// An Op travels controller -> worker and has one place (`seq`) in its island's
// gang order. An Event travels back and finishes exactly one Op. The core reads
// only `kind` (launches count against the in-flight window), the sequence
// number and the buffer ids; `payload` is opaque bytes that Python writes and
// reads (programs, compile options, host data, transfer routes).
#ifndef JAX_PATHWAYS_CSRC_TRANSPORT_MESSAGES_H_
#define JAX_PATHWAYS_CSRC_TRANSPORT_MESSAGES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace jax_pathways {

using BufferId = uint64_t;
using IslandId = int32_t;

// Version of the controller <-> worker wire format; bumped on any change.
inline constexpr uint32_t kWireVersion = 15;

// Uploads a worker holds staged at once (FrameKind::kStage, kStageData),
// and the bytes of those sent to a worker on another host (which holds
// each whole from its first part on, as a client declared its size): the
// controller sends it no more.
inline constexpr size_t kMaxStages = 256;
inline constexpr uint64_t kMaxSentStageBytes = uint64_t{1} << 30;

enum class OpKind : uint32_t {
  kCompile = 1,   // payload: program + options; program = compile key
  kLaunch = 2,    // run `program` on `args`, producing `results`
  kPut = 3,       // host bytes in payload -> `results[0]`
  kFetch = 4,     // `args[0]` -> host bytes in the event payload
  kDelete = 5,    // drop `args`, and `program` if not 0 (none names it again)
  // An exchange between islands (route in payload; `program`: its
  // transfer id):
  kSend = 6,      // push `args` to a peer worker
  kReceive = 7,   // wait for a peer's push into `results`
  kCopy = 8,      // on-island copy/reshard of `args` into `results`
  kShutdown = 9,  // worker exits after finishing earlier ops
  kTrace = 10,    // start/stop recording op timings; the event carries them
  // Out of gang order, handed out before any op and never answered: island
  // `program` is lost (payload: why); `seq`: the last op numbered for this
  // island before the loss (its moves from `program` come from the lost
  // worker, later ones from its replacement). Work on the islands' global
  // client can no longer finish, so the worker fails it instead of waiting,
  // and moves from the lost worker too.
  kPeerLost = 11,
  // Build the islands' global client anew (payload: its coordination
  // service, generation and island count), after a lost island rejoined;
  // answered once built (or failed).
  kJoinGlobal = 12,
  // The data plane (jax_pathways/storage/): write this island's shards of
  // `args` to storage (payload: where, as what); answered once durable.
  kSave = 13,
  // Read this island's shards of `results` from storage (payload: where,
  // their shapes and shardings).
  kLoad = 14,
  // Run a client's colocated_python function beside this island (payload:
  // its pickle, the shards it reads and makes; jax_pathways/colocated/).
  kColocated = 15,
};
// The highest kind a frame may carry.
inline constexpr OpKind kLastOpKind = OpKind::kColocated;

// Heads are padded so payloads start 64-byte aligned in a received frame.

// Every op but DELETE is answered by exactly one Event. A DELETE is done as
// soon as it has its place in the order (nothing can wait for it), so the
// worker sends nothing back: on the hot path every call destructs the
// previous step's arrays, and an event per deletion would double the traffic.
inline bool ExpectsEvent(OpKind kind) {
  return kind != OpKind::kDelete && kind != OpKind::kPeerLost;
}

struct Op {
  OpKind kind = OpKind::kLaunch;
  uint64_t seq = 0;
  uint64_t program = 0;
  std::vector<BufferId> args;
  std::vector<BufferId> results;
  Bytes payload;
  // Sent right after `payload`, in order, as the rest of it (the receiver
  // sees one payload): large bodies the controller already holds, such as
  // uploads, go to the socket without being copied behind their header.
  std::vector<Bytes> payload_tails;
  // A PUT whose tails a worker on this host may have staged already under
  // this id (FrameKind::kStage); 0: none. Sent only in kOpLocal frames.
  uint64_t stage = 0;
  size_t TailBytes() const {
    size_t n = 0;
    for (const Bytes& t : payload_tails) n += t.size();
    return n;
  }
};

// How a worker words (DATA_LOSS) its part of a program spanning islands
// whose connection to another island's worker broke: the loss of that
// worker is the likely cause, and the dispatcher holds such a failure a
// while for the loss's own words, which name the worker (Dispatcher).
inline constexpr std::string_view kBrokenLinkWords =
    "aborted: the program spans islands and its connection to another "
    "island's worker broke";

// Whether `s` is such a failure.
inline bool BrokeLink(const Status& s) {
  return s.code() == Code::kDataLoss &&
         std::string_view(s.message()).substr(0, kBrokenLinkWords.size()) ==
             kBrokenLinkWords;
}

struct Event {
  uint64_t seq = 0;
  Status status;
  Bytes payload;
  // How long a launch held its island, as its worker measured it (no
  // network in it: what fair sharing charges); 0: not measured.
  uint64_t device_ns = 0;
};

// The most device time an event may report (a day): beyond it a frame is
// malformed, so no report can overflow a client's account.
inline constexpr uint64_t kMaxEventDeviceNs = uint64_t{86400} * 1000000000;

// A frame body is the head followed by the payload bytes, so large payloads
// go to the socket without another copy (Channel::Send(kind, head, payload)).
// Decoded payloads are slices of the frame body (no copy).
std::string EncodeOpHead(const Op& op);
Status DecodeOp(const Bytes& body, Op* op);
std::string EncodeEventHead(uint64_t seq, const Status& status,
                            size_t payload_size, uint64_t device_ns = 0);
Status DecodeEvent(const Bytes& body, Event* event);

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_MESSAGES_H_
