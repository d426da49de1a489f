#pragma once
// A fault on purpose, for tests of the memory level (yours too): a Communicator that forwards
// every call to another, except that it kills its own process with SIGKILL in the middle of
// a point-to-point transfer: after the first message on `tag` of the chosen transfer (the
// memory level sends a copy's length, then the copy), before the next. The partner has the
// length and waits for a copy that never comes, as when a worker dies mid-transfer.
//
//   fault::DieInTransfer<fault::GlooComm> dying(comm, fault::MemoryLevel::tag, /*transfer=*/15);
//   fault::MemoryCheckpoint<fault::DieInTransfer<fault::GlooComm>> every_2(dying, memory, 2);

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <span>

#include "communicator.hpp"

namespace fault {

/// A Communicator that forwards every call to `inner`, but kills its own process (SIGKILL) in the
/// middle of the `transfer`-th point-to-point transfer on `tag`, between its length and the copy:
/// a test of the memory level's partner losing a copy half-way.
template <Communicator Comm>
class DieInTransfer {
public:
    /// Dies during the `transfer`-th transfer (counted from 1) this rank sends on `tag`.
    DieInTransfer(Comm& inner, int tag, std::int64_t transfer) : inner_(inner), tag_(tag), transfer_(transfer) {}

    int rank() const { return inner_.rank(); }
    int size() const { return inner_.size(); }
    void allreduce(std::span<float> data, ReduceOp op) { inner_.allreduce(data, op); }
    void broadcast(std::span<float> data, int root) { inner_.broadcast(data, root); }
    void allgather(std::span<const float> in, std::span<float> out) { inner_.allgather(in, out); }
    void barrier() { inner_.barrier(); }
    void recv(std::span<float> data, int src, int tag) { inner_.recv(data, src, tag); }
    void send(std::span<const float> data, int dst, int tag) {
        if (tag == tag_ && ++sends_ == 2 * transfer_) ::kill(::getpid(), SIGKILL);  // the copy itself, unsent
        inner_.send(data, dst, tag);
    }

private:
    Comm& inner_;
    int tag_;
    std::int64_t transfer_;
    std::int64_t sends_ = 0;
};

}  // namespace fault
