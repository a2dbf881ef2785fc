#include "controller/dispatcher/stages.h"

#include <atomic>
#include <string>
#include <string_view>

#include "controller/dispatcher/dispatcher.h"
#include "transport/local_reads.h"
#include "transport/wire.h"

namespace jax_pathways {
namespace {

struct Stream {
  std::shared_ptr<StageSink> sink;
  uint64_t stage;
  std::vector<StageDest> dests;
  std::atomic<int> refs{1};
};

void Forward(void* target, uint64_t offset, const char* const* data,
             const size_t* sizes, size_t n, void (*done)(void* owner),
             void* owner) {
  auto* s = static_cast<Stream*>(target);
  // done(owner) once the last frame holding the pieces is written.
  std::shared_ptr<void> keep(owner, done);
  std::vector<std::string_view> pieces;
  pieces.reserve(n);
  for (size_t i = 0; i < n; ++i) pieces.emplace_back(data[i], sizes[i]);
  s->sink->Forward(s->stage, s->dests, offset, pieces, std::move(keep));
}

void Retain(void* target) { ++static_cast<Stream*>(target)->refs; }

void Release(void* target) {
  auto* s = static_cast<Stream*>(target);
  if (--s->refs == 0) delete s;
}

}  // namespace

void StageSink::Forward(uint64_t stage, const std::vector<StageDest>& dests,
                        uint64_t offset,
                        const std::vector<std::string_view>& pieces,
                        std::shared_ptr<const void> owner) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dispatcher_ != nullptr) {
    dispatcher_->Stage(stage, dests, offset, pieces, std::move(owner));
  }
}

void StageSink::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  dispatcher_ = nullptr;
}

JpUploadStream MakeUploadStream(std::shared_ptr<StageSink> sink,
                                uint64_t stage, std::vector<StageDest> dests) {
  auto* s = new Stream{std::move(sink), stage, std::move(dests)};
  return JpUploadStream{2, s, &Forward, &Retain, &Release};
}


JpUploadStream Dispatcher::StreamUpload(uint64_t stage,
                                        std::vector<StageDest> dests) {
  return MakeUploadStream(stage_sink_, stage, std::move(dests));
}

void Dispatcher::Island::EndSentStage(uint64_t stage) {
  refused_stages.erase(stage);
  auto it = sent_stages.find(stage);
  if (it == sent_stages.end()) return;
  sent_stage_bytes -= it->second.total;
  sent_stages.erase(it);
}

bool Dispatcher::Island::SentStage::Holds(
    const std::vector<Bytes>& tails) const {
  if (sent != total || tails.size() != pieces.size()) return false;
  auto piece = pieces.begin();
  uint64_t offset = 0;
  for (const Bytes& t : tails) {
    if (piece->first != offset || piece->second.data() != t.data() ||
        piece->second.size() != t.size()) {
      return false;
    }
    offset += t.size();
    ++piece;
  }
  return true;
}

void Dispatcher::Stage(uint64_t stage, const std::vector<StageDest>& dests,
                       uint64_t offset,
                       const std::vector<std::string_view>& pieces,
                       std::shared_ptr<const void> owner) {
  uint64_t bytes = 0;
  for (std::string_view p : pieces) bytes += p.size();
  struct To {
    std::shared_ptr<Channel> channel;
    std::string head;  // stage, total, offset in it
    bool with_bytes;
  };
  std::vector<To> to;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const StageDest& dest : dests) {
      auto it = islands_.find(dest.island);
      if (it == islands_.end() || !it->second->alive) {
        continue;  // its PUT fails with the island
      }
      Island& island = *it->second;
      const uint64_t at = dest.base + offset;
      if (at > dest.total || bytes > dest.total - at) {
        continue;  // more than the request declared: its check refuses it
      }
      WireWriter head;
      head.U64(stage);
      head.U64(dest.total);
      head.U64(at);
      auto sent = island.sent_stages.find(stage);
      if (sent == island.sent_stages.end() && island.reads_locally) {
        island.staged_bytes += bytes;
        to.push_back(To{island.channel, head.Take(), false});
        continue;
      }
      if (sent == island.sent_stages.end()) {
        // The worker makes room for all of it at once, however little a
        // client then sends.
        if (island.refused_stages.count(stage)) continue;
        if (island.sent_stages.size() >= kMaxStages ||
            dest.total > kMaxSentStageBytes - island.sent_stage_bytes) {
          island.refused_stages.insert(stage);
          continue;  // its PUT comes with the bytes
        }
        sent = island.sent_stages.emplace(stage, Island::SentStage()).first;
        sent->second.total = dest.total;
        island.sent_stage_bytes += dest.total;
      }
      Island::SentStage& s = sent->second;
      if (dest.total != s.total) continue;  // a bug
      uint64_t piece_at = at;
      for (std::string_view p : pieces) {
        s.pieces.emplace(piece_at, p);
        piece_at += p.size();
      }
      s.sent += bytes;
      island.staged_bytes += bytes;
      to.push_back(To{island.channel, head.Take(), true});
    }
  }
  for (To& t : to) {
    std::vector<Channel::Frame> frames;
    if (t.with_bytes) {
      frames.push_back(
          Channel::Frame{FrameKind::kStageData, std::move(t.head), {}, pieces});
      // The channel's writer thread copies the bytes into the socket, not
      // the gRPC thread, which receives every client's requests.
      t.channel->SendMany(std::move(frames), owner, /*now=*/false);
    } else {
      frames.push_back(Channel::Frame{FrameKind::kStage,
                                      t.head + EncodeLocations(pieces), {}});
      t.channel->SendMany(std::move(frames), nullptr);
    }
  }
}

void Dispatcher::Unstage(const std::vector<IslandId>& islands,
                         uint64_t stage) {
  WireWriter head;
  head.U64(stage);
  const std::string frame = head.Take();
  std::vector<std::shared_ptr<Channel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (IslandId id : islands) {
      auto it = islands_.find(id);
      if (it == islands_.end() || !it->second->alive) continue;
      Island& island = *it->second;
      const bool held = island.sent_stages.count(stage) > 0;
      island.EndSentStage(stage);
      if (held || island.reads_locally) channels.push_back(island.channel);
    }
  }
  for (const std::shared_ptr<Channel>& c : channels) {
    std::vector<Channel::Frame> frames;
    frames.push_back(Channel::Frame{FrameKind::kUnstage, frame, {}});
    c->SendMany(std::move(frames), nullptr);
  }
}

}  // namespace jax_pathways
