#pragma once
// The Communicator concept: the collectives data-parallel training needs, each with a
// timeout, each able to fail with PeerFailure naming the ranks that did not take part.
//
//   allreduce(std::span<float> data, ReduceOp op)        in place; sum or mean over ranks
//   broadcast(std::span<float> data, int root)          root's data to every rank
//   allgather(std::span<const float> in, std::span<float> out)   out = in of rank 0, 1, …
//   barrier()
//   send(std::span<const float> data, int dst, int tag) / recv(std::span<float> data, int src, int tag)
//       send returns once dst has the data (a rendezvous, as Gloo's send + waitSend): two
//       ranks must not both send to each other before receiving
//   rank(), size()
//
// Buffers are passed by span and copied in and out: no implementation may rely on ranks
// sharing memory, so the same code runs over threads (ThreadComm) and processes or hosts.
// Results are deterministic: a reduction adds the ranks' values in rank order, whatever the
// order in which they arrive, so a run repeated with the same inputs gives the same bits.

#include <chrono>
#include <concepts>
#include <cstring>
#include <exception>
#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "../ckpt/error.hpp"

namespace fault {

/// What allreduce makes of the ranks' buffers: their element-wise sum (added in rank order), or
/// that sum divided by the number of ranks.
enum class ReduceOp { sum, mean };

/// A collective or point-to-point call could not complete because of other ranks: they
/// failed, or did not arrive before the timeout.
class PeerFailure : public ckpt::Error {
public:
    PeerFailure(const std::string& what, std::vector<int> ranks) : ckpt::Error(what), ranks_(std::move(ranks)) {}
    /// The ranks that failed or did not arrive, ascending.
    const std::vector<int>& ranks() const noexcept { return ranks_; }

private:
    std::vector<int> ranks_;
};

/// Another rank asked every rank to stop where it stands so that it can be repaired (an
/// uncorrectable memory error): calls in progress and later calls throw this until the
/// ranks rejoin.
class Interrupted : public ckpt::Error {
public:
    Interrupted(const std::string& what, int by_rank) : ckpt::Error(what), by_rank_(by_rank) {}
    int by_rank() const noexcept { return by_rank_; }

private:
    int by_rank_;
};

/// The calls data-parallel training needs, on float buffers copied in and out: rank(), size(),
/// allreduce(data, op), broadcast(data, root), allgather(in, out), barrier(), send(data, dst,
/// tag) and recv(data, src, tag). Each has a timeout and fails with PeerFailure naming the ranks
/// that did not take part. ThreadComm, GlooComm and MpiComm model it.
template <class C>
concept Communicator = requires(C& c, std::span<float> data, std::span<const float> in, int peer) {
    { c.rank() } -> std::convertible_to<int>;
    { c.size() } -> std::convertible_to<int>;
    c.allreduce(data, ReduceOp::sum);
    c.broadcast(data, peer);
    c.allgather(in, data);
    c.barrier();
    c.send(in, peer, 0);
    c.recv(data, peer, 0);
};

namespace detail {

/// Records of a trivially copyable type as the bit patterns of floats, so that allgather
/// (which moves floats without arithmetic) can exchange them exactly.
template <class T>
std::vector<float> to_floats(const T& record) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % sizeof(float) == 0);
    std::vector<float> out(sizeof(T) / sizeof(float));
    std::memcpy(out.data(), &record, sizeof(T));
    return out;
}
template <class T>
std::vector<T> from_floats(const std::vector<float>& all) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % sizeof(float) == 0);
    std::vector<T> out(all.size() * sizeof(float) / sizeof(T));
    std::memcpy(static_cast<void*>(out.data()), all.data(), out.size() * sizeof(T));
    return out;
}
/// Exchanges one record per rank; the result is in rank order.
template <class T, class Comm>
std::vector<T> allgather_records(Comm& comm, const T& mine) {
    std::vector<float> all(sizeof(T) / sizeof(float) * static_cast<std::size_t>(comm.size()));
    comm.allgather(to_floats(mine), all);
    return from_floats<T>(all);
}

/// Whether `e` holds an exception of type E.
template <class E>
bool holds(const std::exception_ptr& e) {
    if (!e) return false;
    try {
        std::rethrow_exception(e);
    } catch (const E&) {
        return true;
    } catch (...) {
        return false;
    }
}

}  // namespace detail

/// A Communicator whose ranks can go on without the failed, as the last words need:
/// - job_rank(): this rank's number in the original job
/// - declare_failed(): this rank's own failure: the others' calls that need it throw PeerFailure
/// - shrink(): a communicator of the same type over the ranks still active
template <class C>
concept ShrinkableCommunicator = Communicator<C> && requires(C& c) {
    { c.job_rank() } -> std::convertible_to<int>;
    c.declare_failed();
    { c.shrink() } -> std::same_as<C>;
};

/// One that can also stop every rank for a repair, as UCE repair needs:
/// - interrupt(): asks every rank to stop (their calls throw Interrupted) for a repair
/// - rejoin(): after an interrupt, waits for every active rank, then starts afresh
template <class C>
concept RecoverableCommunicator = ShrinkableCommunicator<C> && requires(C& c) {
    c.interrupt();
    c.rejoin();
};

}  // namespace fault
