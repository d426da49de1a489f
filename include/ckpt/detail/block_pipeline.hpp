#pragma once
// The engine of the block codecs (zstd, AES-256-GCM): the body is cut into blocks of at most
// 1 MiB, helper threads encode them, and the calling thread hands the encoded blocks to the
// next stage in order (the last stage hashes and write()s them). On two cores the encoding
// overlaps the write() copy into the page cache instead of adding to it. When encoding is the
// slower part (compression), a caller that would wait encodes a queued block itself; when it
// is not (AES-GCM runs faster than write()), the caller leaves it to the helpers, as time it
// spends encoding is time it does not write.
//
// A block that arrives whole in one put() (most of a large payload) is encoded straight from
// the caller's memory. That memory is the caller's only until put() returns, so put() hands on
// every such block before it returns; put_lasting() (a tensor's payload, valid until the save
// ends) lets them go on while the caller passes the next payload. Smaller pieces gather in a
// staging buffer.

#include <string.h>  // explicit_bzero

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../codecs/codec.hpp"
#include "../tensor.hpp"

namespace ckpt::detail {

class BlockPipeline {
public:
    static constexpr std::size_t block_size = 1u << 20;

    /// What a block became: `head` bytes at the start of its output buffer, then `tail_size`
    /// bytes at `tail` (which may point into the input: a block stored as is).
    struct Encoded {
        std::size_t head = 0;
        const std::byte* tail = nullptr;
        std::size_t tail_size = 0;
    };
    /// Encodes block `index` (`last`: it ends the body, and may then be empty) into `out`
    /// (`out_capacity` bytes). `worker` (0 .. threads() - 1) picks per-thread state; calls
    /// with different workers run at the same time.
    using Encode = std::function<Encoded(std::uint64_t index, const std::byte* in, std::size_t n, bool last,
                                         std::byte* out, unsigned worker)>;

    /// A quick test the caller runs on a block before queuing it (zstd: a probe that finds it
    /// does not shrink). Returning true, it has encoded the block into `out` and `result`, and
    /// no thread is woken for it: on a virtual machine a wake-up costs more than the probe.
    using Screen = std::function<bool(const std::byte* in, std::size_t n, std::byte* out, Encoded& result)>;

    struct Options {
        std::size_t out_capacity = 0;  ///< the output buffer of a block
        bool short_blocks = false;     ///< a block may end where a large put() begins (zstd), rather
                                       ///< than all but the last holding block_size bytes (AES)
        bool caller_encodes = false;   ///< a waiting caller encodes queued blocks
        Screen screen;                 ///< optional
    };

    BlockPipeline(ByteSink& next, Options opts, Encode encode)
        : next_(next), encode_(std::move(encode)), screen_(std::move(opts.screen)), helpers_(helper_count()),
          depth_(2 * (helpers_ + 1)),
          out_capacity_(round_up(opts.out_capacity)), short_blocks_(opts.short_blocks),
          caller_encodes_(opts.caller_encodes || helpers_ == 0), slots_(depth_) {
        // One block for every buffer: large enough for huge pages, so a save does not pay a
        // page fault per 4 KiB of scratch space.
        memory_ = allocate_aligned(depth_ * (out_capacity_ + block_size));
        for (std::size_t i = 0; i < depth_; ++i) {
            slots_[i].out = memory_.get() + i * (out_capacity_ + block_size);
            slots_[i].staging = slots_[i].out + out_capacity_;
        }
        for (unsigned w = 0; w < helpers_; ++w) threads_.emplace_back([this, w] { work(w + 1); });
    }
    ~BlockPipeline() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        work_ready_.notify_all();
        for (auto& t : threads_) t.join();  // a block being encoded is finished first: it uses our memory
        ::explicit_bzero(memory_.get(), depth_ * (out_capacity_ + block_size));  // may hold plaintext
    }
    BlockPipeline(const BlockPipeline&) = delete;
    BlockPipeline& operator=(const BlockPipeline&) = delete;

    /// The threads that encode: the caller (worker 0) and the helpers.
    unsigned threads() const noexcept { return helpers_ + 1; }

    void put(const std::byte* data, std::size_t n, bool lasting = false) {
        bool from_caller = false;
        while (n > 0) {
            if (filled_ > 0 && short_blocks_ && n >= block_size) submit_staged(false);
            if (filled_ == 0 && n >= block_size) {
                submit(data, block_size, false);
                from_caller = !lasting;
                data += block_size;
                n -= block_size;
                continue;
            }
            if (filled_ == 0) staged_slot_ = &free_slot();
            const std::size_t take = std::min(n, block_size - filled_);
            std::memcpy(staged_slot_->staging + filled_, data, take);
            filled_ += take;
            data += take;
            n -= take;
            if (filled_ == block_size) submit_staged(false);
        }
        if (from_caller) hand_on(submitted_);  // the caller's memory is ours only until we return
    }

    /// Encodes what is left as the last block (empty if nothing is) and hands on everything.
    void finish() {
        if (filled_ == 0) staged_slot_ = &free_slot();
        submit_staged(true);
        hand_on(submitted_);
        next_.finish();
    }

private:
    enum class State { free, queued, running, done };
    struct Slot {
        std::byte* out = nullptr;
        std::byte* staging = nullptr;
        const std::byte* in = nullptr;
        std::size_t n = 0;
        bool last = false;
        std::uint64_t index = 0;
        State state = State::free;
        Encoded result;
        std::exception_ptr error;
    };

    static unsigned helper_count() {
        const unsigned hw = std::thread::hardware_concurrency();
        return hw < 2 ? 0 : std::min(hw - 1, 3u);
    }
    static std::size_t round_up(std::size_t n) { return (n + tensor_alignment - 1) / tensor_alignment * tensor_alignment; }

    /// The slot the next block goes to, once the block that used it last is handed on.
    Slot& free_slot() {
        if (submitted_ - handed_on_ == depth_) hand_on(handed_on_ + 1);
        return slots_[submitted_ % depth_];
    }

    void submit_staged(bool last) {
        Slot& s = *staged_slot_;
        const std::size_t n = filled_;
        filled_ = 0;
        submit(s.staging, n, last);
    }

    void submit(const std::byte* in, std::size_t n, bool last) {
        Slot& s = free_slot();
        s.in = in;
        s.n = n;
        s.last = last;
        s.index = submitted_;
        s.error = nullptr;
        const bool settled = screen_ && screen_(in, n, s.out, s.result);
        {
            std::lock_guard lock(mutex_);
            s.state = settled ? State::done : State::queued;
            ++submitted_;
        }
        if (settled) return;
        if (helpers_ > 0) {
            work_ready_.notify_one();
            return;
        }
        {
            std::lock_guard lock(mutex_);
            take_queued();
        }
        run(s, 0);
    }

    /// Hands on blocks in order until `count` blocks have been; waits for each, encoding
    /// queued blocks meanwhile. Blocks already done after the one waited for go along with it,
    /// in one put_pieces(): a file takes them in one writev.
    void hand_on(std::uint64_t count) {
        while (handed_on_ < count) {
            Slot& s = slots_[handed_on_ % depth_];
            std::uint64_t end = handed_on_ + 1;
            {
                std::unique_lock lock(mutex_);
                for (;;) {
                    if (s.state == State::done) break;
                    // Rather than wait, encode one.
                    if (Slot* q = caller_encodes_ ? take_queued() : nullptr) {
                        lock.unlock();
                        run(*q, 0);
                        lock.lock();
                        continue;
                    }
                    // Encoding a block is bounded CPU work on a helper that is running it.
                    block_done_.wait(lock);
                }
                if (!s.error)
                    while (end < submitted_ && slots_[end % depth_].state == State::done && !slots_[end % depth_].error) ++end;
                for (std::uint64_t i = handed_on_; i < end; ++i) slots_[i % depth_].state = State::free;
            }
            pieces_.clear();
            for (std::uint64_t i = handed_on_; i < end; ++i) {
                Slot& b = slots_[i % depth_];
                if (b.error) {
                    handed_on_ = end;
                    std::rethrow_exception(b.error);
                }
                pieces_.push_back({b.out, b.result.head});
                if (b.result.tail_size) pieces_.push_back({b.result.tail, b.result.tail_size});
            }
            handed_on_ = end;
            next_.put_pieces(pieces_);
        }
    }

    /// The oldest queued block, marked running (with mutex_ held).
    Slot* take_queued() {
        while (next_to_run_ < submitted_) {
            Slot& q = slots_[next_to_run_++ % depth_];
            if (q.state == State::queued) {
                q.state = State::running;
                return &q;
            }
        }
        return nullptr;
    }

    void run(Slot& s, unsigned worker) {
        try {
            s.result = encode_(s.index, s.in, s.n, s.last, s.out, worker);
        } catch (...) {
            s.error = std::current_exception();
        }
        {
            std::lock_guard lock(mutex_);
            s.state = State::done;
        }
        block_done_.notify_all();
    }

    void work(unsigned worker) {
        std::unique_lock lock(mutex_);
        for (;;) {
            if (stopping_) return;  // blocks still queued are dropped: their input may be gone
            Slot* s = take_queued();
            if (!s) {
                work_ready_.wait(lock);
                continue;
            }
            lock.unlock();
            run(*s, worker);
            lock.lock();
        }
    }

    ByteSink& next_;
    Encode encode_;
    Screen screen_;
    unsigned helpers_;
    std::size_t depth_, out_capacity_;
    bool short_blocks_, caller_encodes_;
    std::shared_ptr<std::byte> memory_;
    std::vector<Slot> slots_;
    Slot* staged_slot_ = nullptr;
    std::size_t filled_ = 0;
    std::uint64_t submitted_ = 0, handed_on_ = 0, next_to_run_ = 0;
    std::vector<ConstBytes> pieces_;  // what hand_on() passes on
    std::mutex mutex_;
    std::condition_variable work_ready_, block_done_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

/// Runs f(0, n/2) here and f(n/2, n) on a second thread when there are at least `min_pieces`
/// of the `n` independent pieces (segments, blocks) and a second core; otherwise f(0, n).
/// Rethrows the first failure once both are done.
template <class F>
void on_two_threads(std::uint64_t n, std::uint64_t min_pieces, F&& f) {
    if (n < std::max<std::uint64_t>(2, min_pieces) || std::thread::hardware_concurrency() < 2) {
        f(0, n);
        return;
    }
    const std::uint64_t split = n / 2;
    std::exception_ptr failed;
    std::thread second([&] {
        try {
            f(split, n);
        } catch (...) {
            failed = std::current_exception();
        }
    });
    try {
        f(0, split);
    } catch (...) {
        second.join();
        throw;
    }
    second.join();
    if (failed) std::rethrow_exception(failed);
}

}  // namespace ckpt::detail
