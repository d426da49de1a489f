#pragma once
// The zstd body codec (CMake target ckpt::zstd, Debian libzstd-dev). Including this header
// also lets every reader in the program decode zstd bodies.
//
// Stored form: blocks of up to 1 MiB of input, each
//   u32 input length (1 .. 1 MiB), u32 stored length, then the stored bytes:
//   stored length == input length: the input as is (it did not shrink);
//   stored length <  input length: one zstd frame that decompresses to exactly the input.
// A block of 32 KiB or more whose first 16 KiB do not shrink by 2% is stored as is without
// compressing the rest: random-looking tensors (and already compressed or encrypted data) cost
// a probe, not a pass.

#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codec.hpp"
#include "../detail/block_pipeline.hpp"
#include "../error.hpp"
#include "../tensor.hpp"

namespace ckpt {

/// Compresses the body with zstd at `level` (1 fast .. 19 small; negative: faster still).
struct Zstd {
    int level = 3;
    Zstd() = default;
    explicit Zstd(int lvl) : level(lvl) {
        if (lvl < ZSTD_minCLevel() || lvl > ZSTD_maxCLevel() || lvl == 0)
            throw ConfigError("Zstd level must be in " + std::to_string(ZSTD_minCLevel()) + " .. " +
                              std::to_string(ZSTD_maxCLevel()) + " and not 0, got " + std::to_string(lvl));
    }
    CodecChain codecs() const { return {Codec{CodecId::zstd, level, {}}}; }
};

namespace detail {

inline constexpr std::size_t zstd_block_size = BlockPipeline::block_size;
inline constexpr std::size_t zstd_probe_size = 16u << 10;
inline constexpr std::size_t zstd_block_header = 8;

inline std::string zstd_error(size_t code) { return ZSTD_getErrorName(code); }

/// Compression contexts kept between saves: a context allocates its tables on first use,
/// and a save should not pay for that (nor for the page faults) every time.
class ZstdContextPool {
public:
    using Context = std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)>;
    static ZstdContextPool& instance() {
        static ZstdContextPool pool;
        return pool;
    }
    Context take() {
        {
            std::lock_guard lock(mutex_);
            if (!free_.empty()) {
                Context c = std::move(free_.back());
                free_.pop_back();
                return c;
            }
        }
        Context c(ZSTD_createCCtx(), &ZSTD_freeCCtx);
        if (!c) throw std::bad_alloc();
        return c;
    }
    void give_back(Context c) {
        ZSTD_CCtx_reset(c.get(), ZSTD_reset_session_and_parameters);
        std::lock_guard lock(mutex_);
        if (free_.size() < 8) free_.push_back(std::move(c));
    }

private:
    std::mutex mutex_;
    std::vector<Context> free_;
};

/// Compresses 1 MiB blocks through a BlockPipeline, one context per thread.
class ZstdEncoder final : public ByteSink {
public:
    ZstdEncoder(const Codec& c, ByteSink& next, const EncodeContext& ctx) : path_(ctx.path) {
        BlockPipeline::Options opts{zstd_block_header + ZSTD_compressBound(zstd_block_size), true, true, {}};
        // On the caller: small blocks (the table of contents, a payload's padding) are compressed
        // there and then, and large ones probed; only those worth compressing go to a helper.
        opts.screen = [this](const std::byte* in, std::size_t n, std::byte* out, BlockPipeline::Encoded& result) {
            if (n < 2 * zstd_probe_size)
                result = encode(in, n, out, contexts_[0].get());
            else if (worth_compressing(in, out + zstd_block_header, contexts_[0].get()))
                return false;
            else
                result = stored_as_is(in, n, out);
            return true;
        };
        pipeline_.emplace(next, std::move(opts),
                          [this](std::uint64_t, const std::byte* in, std::size_t n, bool, std::byte* out, unsigned worker) {
                              return encode(in, n, out, contexts_[worker].get());
                          });
        for (unsigned i = 0; i < pipeline_->threads(); ++i) {
            contexts_.push_back(ZstdContextPool::instance().take());
            ZSTD_CCtx* cctx = contexts_.back().get();
            check(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, c.level));
            check(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0));     // the body checksum covers it
            check(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1));  // readers check it
        }
    }
    ~ZstdEncoder() override {
        pipeline_.reset();  // its threads use the contexts
        for (auto& c : contexts_) ZstdContextPool::instance().give_back(std::move(c));
    }

    void put(const std::byte* data, std::size_t n) override { pipeline_->put(data, n); }
    void put_lasting(const std::byte* data, std::size_t n) override { pipeline_->put(data, n, true); }
    void finish() override { pipeline_->finish(); }

private:
    /// Compresses a block (stored as is if that does not shrink it).
    BlockPipeline::Encoded encode(const std::byte* in, std::size_t n, std::byte* out, ZSTD_CCtx* cctx) const {
        if (n == 0) return {};  // the body ended with a block
        const std::size_t got = ZSTD_compress2(cctx, out + zstd_block_header, ZSTD_compressBound(n), in, n);
        check(got);
        if (got >= n) return stored_as_is(in, n, out);
        put_le<std::uint32_t>(out, static_cast<std::uint32_t>(n));
        put_le<std::uint32_t>(out + 4, static_cast<std::uint32_t>(got));
        return {zstd_block_header + got};
    }
    /// The block's header, then the input itself.
    static BlockPipeline::Encoded stored_as_is(const std::byte* in, std::size_t n, std::byte* out) {
        put_le<std::uint32_t>(out, static_cast<std::uint32_t>(n));
        put_le<std::uint32_t>(out + 4, static_cast<std::uint32_t>(n));
        return {zstd_block_header, in, n};
    }
    /// Whether the block's first zstd_probe_size bytes shrink by 2%.
    bool worth_compressing(const std::byte* in, std::byte* scratch, ZSTD_CCtx* cctx) const {
        const std::size_t got = ZSTD_compress2(cctx, scratch, ZSTD_compressBound(zstd_probe_size), in, zstd_probe_size);
        check(got);
        return got < zstd_probe_size - zstd_probe_size / 50;
    }
    void check(size_t code) const {
        if (ZSTD_isError(code)) throw Error("zstd failed compressing '" + path_ + "': " + zstd_error(code));
    }

    std::string path_;
    std::vector<ZstdContextPool::Context> contexts_;  // one per pipeline thread
    std::optional<BlockPipeline> pipeline_;
};

inline BodyBytes zstd_decode(BodyBytes stored, const DecodeContext& ctx) {
    const std::byte* p = stored.data.get();
    const std::uint64_t n = stored.size;
    auto malformed = [&](std::uint64_t at, const std::string& what) {
        return FormatError("checkpoint '" + ctx.path + "' has a malformed zstd body: " + what + " (block at stored byte " +
                               std::to_string(at) + ")",
                           ctx.path);
    };
    // First the block and frame headers alone: the decoded size, bounded by the frames really
    // present, is known before anything is allocated.
    std::uint64_t total = 0;
    for (std::uint64_t at = 0; at < n;) {
        if (n - at < zstd_block_header) throw malformed(at, "a block header is cut off");
        const auto plain = get_le<std::uint32_t>(p + at), kept = get_le<std::uint32_t>(p + at + 4);
        if (plain == 0 || plain > zstd_block_size)
            throw malformed(at, "a block of " + std::to_string(plain) + " bytes (1 .. " + std::to_string(zstd_block_size) + ")");
        if (kept > plain) throw malformed(at, "a block stores more bytes than it decodes to");
        if (n - at - zstd_block_header < kept) throw malformed(at, "the block is cut off");
        // A compressed block's frame must declare the block's length in its own header: a
        // claim backed by a frame, not by eight bytes.
        if (kept < plain && ZSTD_getFrameContentSize(p + at + zstd_block_header, kept) != plain)
            throw malformed(at, "its zstd frame does not declare the block's " + std::to_string(plain) + " bytes");
        total += plain;
        if (total > ctx.max_decoded_bytes)
            throw FormatError("checkpoint '" + ctx.path + "' decodes to more than " + std::to_string(ctx.max_decoded_bytes) +
                                  " bytes (" + ctx.budget_origin + "): refused before decoding",
                              ctx.path);
        at += zstd_block_header + kept;
    }
    BodyBytes out{nullptr, total};
    try {
        out.data = allocate_aligned(static_cast<std::size_t>(total));
    } catch (const std::bad_alloc&) {
        throw OutOfMemory("checkpoint '" + ctx.path + "' decodes to " + std::to_string(total) +
                              " bytes, more memory than this process could get (LoadOptions::max_decoded_bytes bounds "
                              "the claim)",
                          ctx.path);
    }
    // Blocks are independent and their places known: large bodies decode on two threads,
    // each taking half of the blocks.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks;  // stored offset, decoded offset
    for (std::uint64_t at = 0, to = 0; at < n;) {
        blocks.emplace_back(at, to);
        to += get_le<std::uint32_t>(p + at);
        at += zstd_block_header + get_le<std::uint32_t>(p + at + 4);
    }
    on_two_threads(blocks.size(), 8, [&](std::uint64_t first, std::uint64_t end) {
        std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
        if (!dctx) throw std::bad_alloc();
        for (std::uint64_t b = first; b < end; ++b) {
            const auto [at, to] = blocks[static_cast<std::size_t>(b)];
            const auto plain = get_le<std::uint32_t>(p + at), kept = get_le<std::uint32_t>(p + at + 4);
            const std::byte* src = p + at + zstd_block_header;
            std::byte* dst = out.data.get() + to;
            if (kept == plain) {
                std::memcpy(dst, src, plain);
                continue;
            }
            const std::size_t got = ZSTD_decompressDCtx(dctx.get(), dst, plain, src, kept);
            if (ZSTD_isError(got)) throw malformed(at, std::string("zstd says: ") + zstd_error(got));
            if (got != plain)
                throw malformed(at, "it decodes to " + std::to_string(got) + " bytes, its header says " + std::to_string(plain));
        }
    });
    return out;
}

inline std::unique_ptr<ByteSink> make_zstd_encoder(const Codec& c, ByteSink& next, const EncodeContext& ctx) {
    return std::make_unique<ZstdEncoder>(c, next, ctx);
}

inline const bool zstd_registered = register_codec(CodecId::zstd, {&make_zstd_encoder, &zstd_decode});

}  // namespace detail
}  // namespace ckpt
