#include "controller/dispatcher/stages.h"

#include <atomic>

#include "controller/dispatcher/dispatcher.h"

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

}  // namespace jax_pathways
