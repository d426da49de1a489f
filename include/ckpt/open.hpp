#pragma once
// ckpt::open(): one checkpoint file kept open to read any of its entries, or rows of a
// tensor, verifying only what is read. A format version 3 file (binary, no codecs: what
// save_checkpoint writes by default) checksums each chunk of each payload in its table of
// contents, and the table itself: a read costs its own bytes, not the file's. Older files,
// text and xml bodies and bodies with codecs have no such pieces: open() verifies and reads
// them whole, once, and serves every read from memory.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "checkpoint.hpp"
#include "detail/decode_budget.hpp"
#include "detail/hash.hpp"
#include "detail/posix_io.hpp"
#include "detail/verified_reader.hpp"
#include "error.hpp"
#include "format.hpp"
#include "param_dict.hpp"
#include "path.hpp"
#include "tensor.hpp"

namespace ckpt {

/// An open checkpoint (ckpt::open()). Reads may run on several threads at once.
class CheckpointReader {
public:
    /// The file's header: format version, archive kind, codecs, recorded epoch and step.
    const FileHeader& header() const noexcept { return header_; }
    const std::string& path() const noexcept { return path_; }

    /// The program's entries in file order (the writer's `__ckpt.` records left out): name and
    /// kind, dtype and logical shape of tensors, the value of the others.
    const std::vector<EntryInfo>& entries() const noexcept { return entries_; }
    bool contains(std::string_view name) const { return index_.contains(std::string(name)); }
    /// @throws NotFound naming the file and the entry
    const EntryInfo& entry(std::string_view name) const { return entries_[find(name)]; }

    /// Whether reads check the pieces they read (a version 3 file), rather than the file
    /// having been verified whole when it was opened.
    bool verifies_pieces() const noexcept { return !whole_; }

    /// Entry `name`: a tensor read and checked chunk by chunk, or the value of another kind
    /// (checked with the table of contents when the file was opened).
    /// @throws NotFound, ChecksumError naming the file, the tensor and the bytes that failed
    Value read(std::string_view name) const {
        const EntryInfo& e = entry(name);
        if (e.kind != ValueKind::tensor) return e.scalar;
        if (whole_) return whole_->at(e.name);
        return read_range(e, 0, e.shape.empty() ? 1 : e.shape[0], true);
    }
    /// Rows [begin, end) of row-major tensor `name` along its first dimension: a tensor of that
    /// many rows. Only the chunks holding them are read and checked.
    /// @throws NotFound, LoadMismatch (not a row-major tensor of rank 1 or more, rows out of
    /// range), ChecksumError
    Tensor read_rows(std::string_view name, std::int64_t begin, std::int64_t end) const {
        const EntryInfo& e = entry(name);
        if (e.kind != ValueKind::tensor || e.shape.empty() || e.order != Order::row_major)
            throw LoadMismatch("cannot read rows of '" + e.name + "' in '" + path_ + "': rows are slices of a row-major tensor of rank 1 or more" +
                               (e.order == Order::column_major ? " (it is column-major: read it whole)" : ""));
        const std::int64_t rows = e.shape[0];
        if (begin < 0 || begin > end || end > rows)
            throw LoadMismatch("cannot read rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of '" +
                               e.name + "' in '" + path_ + "': it has " + std::to_string(rows) + " rows");
        if (whole_) {
            const Tensor& t = whole_->tensor(e.name);
            Shape shape = t.shape();
            shape[0] = end - begin;
            Tensor out = Tensor::uninitialized(t.dtype(), shape);
            const std::uint64_t row = rows ? t.nbytes() / static_cast<std::uint64_t>(rows) : 0;
            std::copy_n(t.data() + begin * row, out.nbytes(), out.data());
            return out;
        }
        return read_range(e, begin, end, false);
    }

    /// Payload bytes read from the file by read() and read_rows() so far, whole chunks counted
    /// (0 when the file was read whole at open()).
    std::uint64_t bytes_read() const noexcept { return bytes_read_->load(std::memory_order_relaxed); }

private:
    friend CheckpointReader open(const PathArg& file, const LoadOptions& opts);
    CheckpointReader() = default;

    std::size_t find(std::string_view name) const {
        const auto it = index_.find(std::string(name));
        if (it == index_.end()) throw NotFound("checkpoint '" + path_ + "' has no entry '" + std::string(name) + "'");
        return it->second;
    }

    /// Rows [begin, end) of `e` from a version 3 file: the chunks that hold them are read,
    /// checked, and the rows copied out (or, for the whole tensor, kept where they were read).
    Tensor read_range(const EntryInfo& e, std::int64_t begin, std::int64_t end, bool whole) const {
        const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
        const std::uint64_t row = rows ? e.nbytes / static_cast<std::uint64_t>(rows) : 0;
        const std::uint64_t lo = static_cast<std::uint64_t>(begin) * row, hi = static_cast<std::uint64_t>(end) * row;
        const std::uint64_t first = lo / chunk_bytes_, last = hi == lo ? first : (hi - 1) / chunk_bytes_ + 1;
        const std::uint64_t from = first * chunk_bytes_, to = std::min(e.nbytes, last * chunk_bytes_);
        Shape shape = e.logical_shape();
        if (!whole) shape[0] = end - begin;
        Tensor out = Tensor::uninitialized(e.dtype, shape, e.order);
        const bool in_place = from == lo && to == hi;  // the rows are whole chunks: read into `out`
        std::shared_ptr<std::byte> scratch;
        std::byte* at = out.data();
        if (!in_place) {
            scratch = detail::allocate_aligned(static_cast<std::size_t>(to - from));
            at = scratch.get();
        }
        const std::uint64_t offset = payload_offsets_.at(e.name) + from;
        detail::pread_exact(fd_->get(), reinterpret_cast<char*>(at), static_cast<std::size_t>(to - from), offset, path_);
        bytes_read_->fetch_add(to - from, std::memory_order_relaxed);
        for (std::uint64_t k = first; k < last; ++k) {
            const std::uint64_t start = k * chunk_bytes_ - from, n = std::min(chunk_bytes_, e.nbytes - k * chunk_bytes_);
            const std::uint64_t got = detail::xxh3(at + start, static_cast<std::size_t>(n));
            if (got != e.chunk_hashes[static_cast<std::size_t>(k)])
                throw ChecksumError("checkpoint '" + path_ + "' is corrupt: chunk " + std::to_string(k + 1) + " of " +
                                        std::to_string(e.chunk_hashes.size()) + " of tensor '" + e.name + "' (bytes " +
                                        std::to_string(k * chunk_bytes_) + " to " + std::to_string(k * chunk_bytes_ + n) +
                                        " of its payload) fails its checksum",
                                    path_);
        }
        if (!in_place) std::copy_n(at + (lo - from), hi - lo, out.data());
        return out;
    }

    std::string path_;
    FileHeader header_;
    std::vector<EntryInfo> entries_;
    std::unordered_map<std::string, std::size_t> index_;
    // a version 3 file: its descriptor, chunk size and payload offsets
    std::shared_ptr<detail::Fd> fd_;
    std::uint64_t chunk_bytes_ = 0;
    std::map<std::string, std::uint64_t> payload_offsets_;
    // any other file: its entries, verified and read whole at open()
    std::shared_ptr<const ParamDict> whole_;
    std::unique_ptr<std::atomic<std::uint64_t>> bytes_read_ = std::make_unique<std::atomic<std::uint64_t>>(0);
};

/// Opens a checkpoint to read entries one by one (CheckpointReader). A version 3 file has its
/// header and table of contents read and checked here, and nothing else; any other file is
/// verified and read whole here (with `opts.key` for an encrypted one).
/// @throws FormatError, ChecksumError, VersionError, KeyError, IoError naming the file
inline CheckpointReader open(const PathArg& file, const LoadOptions& opts = {}) {
    CheckpointReader r;
    r.path_ = file.string();
    const std::string& path = r.path_;
    std::vector<EntryInfo> toc;
    detail::reading(path, [&] {
        auto c = detail::open_checkpoint(path, opts);
        r.header_ = c.header;
        if (c.header.chunked()) {
            auto checked = detail::read_checked_toc(c, path);
            toc = std::move(checked.entries);
            r.chunk_bytes_ = checked.chunk_bytes;
            r.payload_offsets_ = std::move(checked.payload_offsets);
            r.fd_ = std::make_shared<detail::Fd>(std::move(c.fd));
        }
    });
    if (!r.header_.chunked()) {
        auto whole = std::make_shared<ParamDict>(load_checkpoint(file, opts));
        for (const auto& [name, value] : *whole) toc.push_back(detail::entry_of(name, value));
        r.whole_ = std::move(whole);
    }
    for (auto& e : toc)
        if (!detail::is_reserved_name(e.name)) {
            r.index_.emplace(e.name, r.entries_.size());
            r.entries_.push_back(std::move(e));
        }
    return r;
}

}  // namespace ckpt
