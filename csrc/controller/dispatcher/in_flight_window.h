// InFlightWindow: the bound on launches sent to an island and not finished.
//
// Not optional: XLA:CPU hangs and aborts once ~64 collective launches are in
// flight (its rendezvous gives up after 40 s); windows of 8-32 are safe and
// keep the devices busy. Only launches count; other ops (puts, fetches,
// deletes) are cheap and never involve a rendezvous.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_IN_FLIGHT_WINDOW_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_IN_FLIGHT_WINDOW_H_

namespace jax_pathways {

class InFlightWindow {
 public:
  explicit InFlightWindow(int limit) : limit_(limit < 1 ? 1 : limit) {}

  bool HasRoom() const { return in_flight_ < limit_; }
  void Acquire() { ++in_flight_; }
  void Release() {
    if (in_flight_ > 0) --in_flight_;
  }
  int in_flight() const { return in_flight_; }
  int limit() const { return limit_; }

 private:
  const int limit_;
  int in_flight_ = 0;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_IN_FLIGHT_WINDOW_H_
