#pragma once
// Checkpoints saved by N ranks, loaded by M: the global index of a saved step, and a load
// that gives one rank of another layout the pieces it needs, reading only their bytes.
//
// Each rank's file holds whole tensors (parameters every data-parallel rank keeps) and pieces
// of global tensors (a sharded optimizer's state: elements [first, first + n) of a global
// tensor flattened in row-major order). A PieceMap says which entries are pieces and where
// they sit; describe_checkpoint() turns a saved file into TensorPieces: for each tensor, its
// place, the file offset of its bytes, and an xxh3-64 checksum of every chunk_bytes of them,
// so that a part read alone can be trusted. The index of a step is every rank's pieces plus
// the values (position, data order, hyperparameters) of the lowest rank, saved as a ckpt
// file of its own (fault::commit_global_index writes it once every rank's file is durable).
//
//   ckpt::PieceMap mine = dp.piece_map();                 // this rank's entries, new layout
//   auto got = ckpt::load_resharded(index_file, trainer.load_target(), mine);
//   trainer.resume_from_state(got.state, "step " + …, data);
//
// load_resharded() reads, for every tensor of the rank's state, the chunks of the pieces that
// cover its elements (the fewest pieces: of two files holding the same elements, the one
// holding more of them), checks each chunk before copying from it, and throws LoadMismatch
// when some elements are in no file, ChecksumError (naming file, tensor and chunk) when a
// chunk does not match. Byte ranges are read from binary checkpoints without codecs; a file
// with codecs (compressed, encrypted) cannot be read from the middle, so it is read and
// decoded whole, once, when one of its pieces is needed, and its chunks are checked there.

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "detail/hash.hpp"
#include "detail/verified_reader.hpp"
#include "error.hpp"
#include "latest.hpp"
#include "policies/naming.hpp"
#include "param_dict.hpp"
#include "tensor.hpp"

namespace ckpt {

/// How the copies of an entry that every rank saves whole relate across the ranks.
enum class Copies {
    same,        ///< equal on every rank (parameters a data-parallel rank keeps): checked when loaded
    per_rank,    ///< each rank's own (its random engine, its data position): rank r loads rank r's copy
    replicated,  ///< any copy serves: loaded from the lowest rank's, unchecked
};

/// Where an entry of a rank's file sits in a global tensor: elements [first, first + numel)
/// of `global`, flattened in row-major order (for a column-major tensor, of its stored form:
/// `global_shape` is the global tensor's stored shape, the reverse of its own). A piece of
/// rank 2 or more must be whole rows of that order: its dims after the first equal the global
/// tensor's, so that its elements are one range of the global tensor's.
///
/// With `global` empty, the entry is whole, and `copies` says how its copies relate across the
/// ranks: PiecePlace::per_rank(), PiecePlace::replicated(). An entry left out of a PieceMap is
/// whole with Copies::same.
struct PiecePlace {
    std::string global;
    Shape global_shape;
    std::uint64_t first = 0;
    Copies copies = Copies::same;

    /// A whole entry of which each rank holds its own copy.
    static PiecePlace per_rank() {
        PiecePlace p;
        p.copies = Copies::per_rank;
        return p;
    }
    /// A whole entry of which any rank's copy serves, unchecked.
    static PiecePlace replicated() {
        PiecePlace p;
        p.copies = Copies::replicated;
        return p;
    }
    bool whole() const noexcept { return global.empty(); }
    friend bool operator==(const PiecePlace&, const PiecePlace&) = default;
};

/// Entry name → its place; an entry not listed is a whole tensor of its own name, the same on
/// every rank (checked when loaded).
using PieceMap = std::map<std::string, PiecePlace>;

/// One piece of a global tensor in one rank's file.
struct TensorPiece {
    std::string global;  ///< the global tensor's name
    DType dtype = DType::float32;
    Shape global_shape;
    std::uint64_t first = 0;  ///< its first element in the flattened global tensor
    std::uint64_t count = 0;  ///< its elements
    std::int64_t rank = 0;    ///< the rank whose file holds it
    std::string file;         ///< that file, relative to the index's directory
    std::string entry;        ///< its name in that file
    std::uint64_t offset = 0; ///< file offset of its first byte; with `encoded`, its offset in the decoded body
    /// xxh3-64 of each chunk_bytes of its bytes (the last chunk may be shorter)
    std::vector<std::uint64_t> chunk_hashes;
    /// The file's body passed through codecs (compression, encryption): it cannot be read from
    /// the middle, so a reader decodes it whole and takes the piece from there.
    bool encoded = false;
    /// The entry's storage order. Pieces hold the stored bytes (for a column-major tensor, its
    /// transpose in row-major order, global_shape the stored shape), so only a tensor of the same
    /// order can take them.
    Order order = Order::row_major;
};

/// The index of one saved step.
struct GlobalIndex {
    std::int64_t global_step = 0;
    std::int64_t world_size = 0;
    std::uint64_t chunk_bytes = default_chunk_bytes;
    std::vector<TensorPiece> pieces;
    ParamDict values;  ///< the lowest rank's entries that are not tensors
    /// Each other rank's entries that are not tensors, where they differ from `values`.
    std::map<std::int64_t, ParamDict> rank_values;
    /// How the copies of whole entries relate, as the savers declared it (PiecePlace::per_rank(),
    /// replicated()); an entry not listed: Copies::same.
    std::map<std::string, Copies> copies;
};

/// A rank's state loaded from a global index, and what loading it took.
struct ReshardedState {
    ParamDict state;               ///< its tensors, then the index's values (position, data order, hyperparameters)
    std::uint64_t bytes_read = 0;  ///< from the files, chunk-aligned
    std::uint64_t bytes_needed = 0;
    std::size_t files_opened = 0;
};

namespace detail {

inline std::uint64_t numel_of(const Shape& s) {
    std::uint64_t n = 1;
    for (const auto d : s) n *= static_cast<std::uint64_t>(d);
    return n;
}

inline std::string elements_text(std::uint64_t a, std::uint64_t b) {
    return "elements [" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

inline const char* copies_name(Copies c) {
    return c == Copies::per_rank ? "per_rank" : c == Copies::replicated ? "replicated" : "same";
}

/// Refuses a piece whose elements are not one range of the global tensor's (stored) order: a
/// block of rank 2 or more must be whole rows of it. A row block of a column-major matrix is
/// not (its stored form is the transpose: the block is a column block there).
inline void check_piece_is_range(const EntryMeta& e, const PiecePlace& place, const std::string& path) {
    const Shape& local = e.shape;  // as stored
    const Shape& global = place.global_shape;
    if (local.size() < 2) return;  // a flat run of elements: any range is one
    std::uint64_t row = 1;
    bool rows = local.size() == global.size();
    for (std::size_t d = 1; rows && d < local.size(); ++d) {
        rows = local[d] == global[d];
        row *= static_cast<std::uint64_t>(global[d]);
    }
    if (rows && place.first % row == 0) return;
    const bool column_major = e.order == Order::column_major;
    throw ConfigError(
        "global index: entry '" + e.name + "' of '" + path + "' is a " + shape_string(e.logical_shape()) + " block" +
        (column_major ? " held column-major (stored as its transpose " + shape_string(local) + ")" : std::string()) +
        " of '" + place.global + "' (stored shape " + shape_string(global) + ", from element " + std::to_string(place.first) +
        "): its elements are not one range of the global tensor's stored order, which a PiecePlace describes. " +
        (column_major ? "Split a column-major matrix into blocks of whole columns (contiguous in its storage), "
                        "hold the blocks row-major (Eigen::RowMajor), or save each block as a flat vector"
                      : "Split a row-major tensor into blocks of whole rows, or save each block as a flat vector"));
}

}  // namespace detail

namespace detail {

/// Refuses an index (`what` names it) whose pieces of one tensor disagree on its dtype, shape
/// or order, or leave some of its elements in no rank's file: the ranks saved states that do
/// not fit together, and a load from it would fail.
inline void check_pieces_fit(const GlobalIndex& index, const std::string& what) {
    std::map<std::string_view, std::vector<const TensorPiece*>> by_tensor;
    for (const auto& p : index.pieces) by_tensor[p.global].push_back(&p);
    for (auto& [name, pieces] : by_tensor) {
        const TensorPiece& a = *pieces.front();
        for (const TensorPiece* b : pieces)
            if (b->dtype != a.dtype || b->global_shape != a.global_shape || b->order != a.order)
                throw ConfigError(what + ": rank " + std::to_string(a.rank) + " saved '" + std::string(name) + "' as " +
                                  std::string(dtype_name(a.dtype)) + " of (stored) shape " + shape_string(a.global_shape) +
                                  " " + std::string(order_name(a.order)) + ", rank " + std::to_string(b->rank) + " as " +
                                  std::string(dtype_name(b->dtype)) + " of " + shape_string(b->global_shape) + " " +
                                  std::string(order_name(b->order)));
        std::sort(pieces.begin(), pieces.end(), [](const TensorPiece* x, const TensorPiece* y) { return x->first < y->first; });
        std::uint64_t covered = 0;
        const std::uint64_t n = numel_of(a.global_shape);
        for (const TensorPiece* p : pieces) {
            if (p->first > covered) break;
            covered = std::max(covered, p->first + p->count);
        }
        if (covered < n) {
            std::uint64_t upto = n;  // the gap: up to the next piece's start after it
            for (const TensorPiece* p : pieces)
                if (p->first > covered) {
                    upto = p->first;
                    break;
                }
            throw ConfigError(what + ": no rank's file holds " + elements_text(covered, upto) + " of '" +
                              std::string(name) + "' (" + std::to_string(n) +
                              " elements): the ranks' pieces of it do not fit together");
        }
    }
}

}  // namespace detail

/// This rank's part of the index: the pieces of its saved `file` (named `relative` in the
/// index) and its values. Reads the file once, to checksum its chunks, unless it is a format
/// version 3 file of the same chunk size: its table of contents holds them (only the table is
/// read, and checked). A file with codecs is decoded (`opts.key` for an encrypted one) and its
/// pieces marked `encoded`.
inline GlobalIndex describe_checkpoint(const PathArg& file, const std::string& relative, std::int64_t rank,
                                       const PieceMap& places = {}, std::uint64_t chunk_bytes = default_chunk_bytes,
                                       const LoadOptions& opts = {}) {
    const std::string path = file.string();
    if (chunk_bytes == 0 || chunk_bytes % detail::payload_alignment)
        throw ConfigError("global index: chunk_bytes must be a positive multiple of " + std::to_string(detail::payload_alignment));
    auto c = detail::open_checkpoint(path, {});
    if (c.header.archive != ArchiveKind::binary)
        throw ConfigError("global index: '" + path + "' is not a binary checkpoint; resharding reads byte ranges of " +
                          "binary bodies only");
    const bool encoded = c.header.encoded();
    std::vector<detail::EntryMeta> toc;
    BodyBytes decoded;
    std::uint64_t file_chunk_bytes = 0;  // a version 3 file's: its chunks' hashes are those of the index
    if (encoded) {
        decoded = detail::read_decoded_body(c, path, opts);
        toc = detail::decoded_toc(c.header, decoded, path);
    } else if (c.header.chunked()) {
        auto checked = detail::read_checked_toc(c, path);
        toc = std::move(checked.entries);
        file_chunk_bytes = checked.chunk_bytes;
    } else {
        toc = read_contents(file).entries;
    }
    auto offsets = detail::payload_offsets(toc, c.header.chunked());
    if (encoded)
        for (auto& [name, at] : offsets) at -= header_size;  // offsets in the decoded body
    GlobalIndex out;
    out.chunk_bytes = chunk_bytes;
    std::unique_ptr<char[]> buf(new char[chunk_bytes]);
    for (const auto& e : toc) {
        const auto declared = places.find(e.name);
        if (declared != places.end() && declared->second.whole() && declared->second.copies != Copies::same)
            out.copies[e.name] = declared->second.copies;
        if (e.kind != ValueKind::tensor) {
            if (!detail::is_reserved_name(e.name)) out.values.set(e.name, e.scalar);  // not the rank file's owner
            continue;
        }
        TensorPiece p;
        p.dtype = e.dtype;
        p.count = detail::numel_of(e.shape);
        if (const auto it = declared; it != places.end() && !it->second.whole()) {
            detail::check_piece_is_range(e, it->second, path);
            p.global = it->second.global;
            p.global_shape = it->second.global_shape;
            p.first = it->second.first;
            if (p.first + p.count > detail::numel_of(p.global_shape))
                throw ConfigError("global index: entry '" + e.name + "' of '" + path + "' (" + std::to_string(p.count) +
                                  " elements from " + std::to_string(p.first) + ") does not fit in '" + p.global +
                                  "' of shape " + shape_string(p.global_shape));
        } else {
            p.global = e.name;
            p.global_shape = e.shape;
        }
        p.order = e.order;
        p.rank = rank;
        p.file = relative;
        p.entry = e.name;
        p.offset = offsets.at(e.name);
        p.encoded = encoded;
        if (encoded && p.offset + e.nbytes > decoded.size)
            throw FormatError("'" + path + "': the payload of '" + e.name + "' lies past the end of the decoded body", path);
        if (file_chunk_bytes == chunk_bytes) {  // hashed by the writer, and checked with the table: not read back
            p.chunk_hashes = e.chunk_hashes;
            out.pieces.push_back(std::move(p));
            continue;
        }
        for (std::uint64_t done = 0; done < e.nbytes; done += chunk_bytes) {
            const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, e.nbytes - done));
            const char* bytes = buf.get();
            if (encoded) bytes = reinterpret_cast<const char*>(decoded.data.get()) + p.offset + done;
            else detail::pread_exact(c.fd.get(), buf.get(), len, p.offset + done, path);
            p.chunk_hashes.push_back(detail::xxh3(bytes, len));
        }
        out.pieces.push_back(std::move(p));
    }
    return out;
}

/// The index as a ParamDict (how it is saved, and sent between ranks).
inline ParamDict index_to_dict(const GlobalIndex& index) {
    ParamDict d;
    d.set("index.global_step", index.global_step);
    d.set("index.world_size", index.world_size);
    d.set("index.chunk_bytes", static_cast<std::int64_t>(index.chunk_bytes));
    d.set("index.pieces", static_cast<std::int64_t>(index.pieces.size()));
    for (std::size_t k = 0; k < index.pieces.size(); ++k) {
        const TensorPiece& p = index.pieces[k];
        const std::string at = "piece." + std::to_string(k) + ".";
        d.set(at + "global", p.global);
        d.set(at + "dtype", static_cast<std::int64_t>(p.dtype));
        d.set(at + "global_shape", Tensor::from(std::vector<std::int64_t>(p.global_shape.begin(), p.global_shape.end()),
                                                {static_cast<std::int64_t>(p.global_shape.size())}));
        d.set(at + "first", static_cast<std::int64_t>(p.first));
        d.set(at + "count", static_cast<std::int64_t>(p.count));
        d.set(at + "rank", p.rank);
        d.set(at + "file", p.file);
        d.set(at + "entry", p.entry);
        d.set(at + "offset", static_cast<std::int64_t>(p.offset));
        std::vector<std::int64_t> hashes(p.chunk_hashes.size());
        std::memcpy(hashes.data(), p.chunk_hashes.data(), hashes.size() * sizeof(std::int64_t));
        d.set(at + "chunk_xxh3", Tensor::from(hashes, {static_cast<std::int64_t>(hashes.size())}));
        if (p.encoded) d.set(at + "encoded", std::int64_t{1});
        if (p.order == Order::column_major) d.set(at + "order", std::string(detail::column_major_value));
    }
    for (const auto& [name, value] : index.values) d.set("value." + name, value);
    for (const auto& [rank, values] : index.rank_values)
        for (const auto& [name, value] : values) d.set("rank." + std::to_string(rank) + ".value." + name, value);
    for (const auto& [name, copies] : index.copies) d.set("copies." + name, std::string(detail::copies_name(copies)));
    return d;
}

/// The index back from a ParamDict; `what` names it in errors.
inline GlobalIndex index_from_dict(const ParamDict& d, const std::string& what) {
    GlobalIndex index;
    try {
        index.global_step = d.get<std::int64_t>("index.global_step");
        index.world_size = d.get<std::int64_t>("index.world_size");
        index.chunk_bytes = static_cast<std::uint64_t>(d.get<std::int64_t>("index.chunk_bytes"));
        const auto n = d.get<std::int64_t>("index.pieces");
        if (n < 0 || index.chunk_bytes == 0) throw FormatError(what + ": not a global index", what);
        for (std::int64_t k = 0; k < n; ++k) {
            const std::string at = "piece." + std::to_string(k) + ".";
            TensorPiece p;
            p.global = d.get<std::string>(at + "global");
            const auto dtype = dtype_from_code(static_cast<std::uint8_t>(d.get<std::int64_t>(at + "dtype")));
            if (!dtype) throw FormatError(what + ": piece " + std::to_string(k) + " has an unknown dtype", what);
            p.dtype = *dtype;
            const auto shape = d.get<Tensor>(at + "global_shape").values<std::int64_t>();
            p.global_shape.assign(shape.begin(), shape.end());
            p.first = static_cast<std::uint64_t>(d.get<std::int64_t>(at + "first"));
            p.count = static_cast<std::uint64_t>(d.get<std::int64_t>(at + "count"));
            p.rank = d.get<std::int64_t>(at + "rank");
            p.file = d.get<std::string>(at + "file");
            p.entry = d.get<std::string>(at + "entry");
            p.offset = static_cast<std::uint64_t>(d.get<std::int64_t>(at + "offset"));
            const auto hashes = d.get<Tensor>(at + "chunk_xxh3").values<std::int64_t>();
            p.chunk_hashes.resize(hashes.size());
            std::memcpy(p.chunk_hashes.data(), hashes.data(), hashes.size() * sizeof(std::int64_t));
            p.encoded = d.contains(at + "encoded") && d.get<std::int64_t>(at + "encoded") != 0;
            if (d.contains(at + "order")) {
                if (d.get<std::string>(at + "order") != detail::column_major_value)
                    throw FormatError(what + ": piece " + std::to_string(k) + " has an unknown order '" +
                                          d.get<std::string>(at + "order") + "'",
                                      what);
                p.order = Order::column_major;
            }
            const std::uint64_t bytes = p.count * itemsize(p.dtype);
            if (p.first + p.count > detail::numel_of(p.global_shape) ||
                p.chunk_hashes.size() != (bytes + index.chunk_bytes - 1) / index.chunk_bytes)
                throw FormatError(what + ": piece " + std::to_string(k) + " ('" + p.entry + "' of '" + p.file +
                                      "') is inconsistent (its place or its chunk count)",
                                  what);
            index.pieces.push_back(std::move(p));
        }
    } catch (const NotFound& e) {
        throw FormatError(what + ": not a global index (" + e.what() + ")", what);
    } catch (const TypeMismatch& e) {
        throw FormatError(what + ": not a global index (" + e.what() + ")", what);
    }
    for (const auto& [name, value] : d) {
        if (name.rfind("value.", 0) == 0) {
            index.values.set(name.substr(6), value);
        } else if (name.rfind("copies.", 0) == 0) {
            const auto* c = value.get_if<std::string>();
            if (!c || (*c != "per_rank" && *c != "replicated"))
                throw FormatError(what + ": '" + name + "' is not 'per_rank' or 'replicated'", what);
            index.copies[name.substr(7)] = *c == "per_rank" ? Copies::per_rank : Copies::replicated;
        } else if (name.rfind("rank.", 0) == 0) {
            const auto dot = name.find(".value.", 5);
            const auto rank = dot == std::string::npos ? std::nullopt : detail::parse_count(std::string_view(name).substr(5, dot - 5));
            if (!rank) throw FormatError(what + ": entry '" + name + "' is not 'rank.{r}.value.{name}'", what);
            index.rank_values[*rank].set(name.substr(dot + 7), value);
        }
    }
    return index;
}

/// Loads a global index file (verified like any checkpoint).
inline GlobalIndex read_global_index(const PathArg& file) {
    return index_from_dict(load_checkpoint(file), "global index '" + file.string() + "'");
}

/// Whether `name` is a global index's ("index-step_{g}.ckpt"), and its step.
inline std::optional<std::int64_t> global_index_step(std::string_view name) {
    if (!detail::consume(name, "index-step_") || !name.ends_with(".ckpt")) return std::nullopt;
    name.remove_suffix(5);
    return detail::parse_count(name);
}

namespace detail {

/// Why the global index at `path` cannot be used (it does not verify, or a file it names is
/// gone or too short: broken, as retention left it), and whether this program cannot read it
/// rather than it being damaged; or nothing. `broken`, when given, says whether the index
/// itself reads and a file it names is gone.
inline std::optional<CheckpointIssue> global_index_issue(const boost::filesystem::path& path, bool* broken = nullptr) {
    if (broken) *broken = false;
    try {
        const auto index = read_global_index(path);
        for (const auto& p : index.pieces) {
            const auto file = path.parent_path() / p.file;
            boost::system::error_code ec;
            const auto size = boost::filesystem::file_size(file, ec);
            if (ec) {
                if (broken) *broken = true;
                return CheckpointIssue{"'" + file.string() + "' (rank " + std::to_string(p.rank) + ") is gone"};
            }
            if (!p.encoded && size < p.offset + p.count * itemsize(p.dtype))
                return CheckpointIssue{"'" + file.string() + "' (rank " + std::to_string(p.rank) +
                                       ") is shorter than its pieces"};
        }
    } catch (const Error& e) {
        return CheckpointIssue{e.what(), unsupported_here(e)};
    }
    return std::nullopt;
}

}  // namespace detail

namespace detail {

inline std::string ranks_text(const std::vector<std::int64_t>& ranks) {
    std::string out;
    for (const auto r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
}

/// How the copies of whole entry `name` relate: as the loader declares it in `places`, else as
/// the savers declared it in the index, else Copies::same.
inline Copies copies_of(const std::string& name, const PieceMap& places, const GlobalIndex& index) {
    if (const auto it = places.find(name); it != places.end() && it->second.whole() && it->second.copies != Copies::same)
        return it->second.copies;
    if (const auto it = index.copies.find(name); it != index.copies.end()) return it->second;
    return Copies::same;
}

inline std::string declare_hint() {
    return "; if each rank's copy is its own (a random engine, a data position), declare it "
           "ckpt::PiecePlace::per_rank() in the PieceMap, and rank r loads rank r's copy; if any copy serves, "
           "ckpt::PiecePlace::replicated()";
}

/// Of the ranks' copies of whole tensor `name` (`candidates`, by rank), the one(s) rank `rank`
/// loads: any when they are equal (Copies::same, checked by their chunk checksums), its own
/// (per_rank), the lowest rank's (replicated).
inline std::vector<const TensorPiece*> choose_copy(const std::vector<const TensorPiece*>& candidates, Copies mode,
                                                    std::int64_t rank, const std::string& name, const std::string& where) {
    std::vector<const TensorPiece*> whole;
    for (const TensorPiece* p : candidates)
        if (p->first == 0 && p->count == numel_of(p->global_shape)) whole.push_back(p);
    if (whole.empty()) return candidates;
    switch (mode) {
        case Copies::same: {
            std::vector<std::int64_t> differ;
            for (const TensorPiece* p : whole)
                if (p->chunk_hashes != whole.front()->chunk_hashes) differ.push_back(p->rank);
            if (!differ.empty())
                throw LoadMismatch(where + ": entry '" + name + "' differs between the ranks that saved it: rank(s) " +
                                   ranks_text(differ) + " hold other values than rank " +
                                   std::to_string(whole.front()->rank) + " (by their checksums)" + declare_hint());
            return candidates;
        }
        case Copies::replicated: return {whole.front()};
        case Copies::per_rank: {
            if (rank < 0)
                throw ConfigError(where + ": entry '" + name + "' is per-rank: pass the loading rank to load_resharded");
            for (const TensorPiece* p : whole)
                if (p->rank == rank) return {p};
            throw LoadMismatch(where + ": entry '" + name + "' is per-rank, and rank " + std::to_string(rank) +
                               " saved none (the step was saved by " + std::to_string(whole.size()) + " rank(s))");
        }
    }
    return candidates;
}

}  // namespace detail

namespace detail {

/// Where tensor `name` (`t`) of a loading rank sits: as `places` says, else whole.
inline PiecePlace place_of(const std::string& name, const Tensor& t, const PieceMap& places) {
    const auto declared = places.find(name);
    if (declared != places.end() && !declared->second.whole()) return declared->second;
    return PiecePlace{name, t.shape(), 0};
}

/// The pieces of `index` (`by_tensor`: its pieces by global tensor) that tensor `name` (`t`,
/// placed by `places`) of rank `rank` may be loaded from; throws LoadMismatch when there are
/// none, when the ranks' whole copies differ and may not (choose_copy), or when they are of
/// another dtype, shape or order. `where` names the index.
inline std::vector<const TensorPiece*> sources_of(
    const GlobalIndex& index, const std::map<std::string_view, std::vector<const TensorPiece*>>& by_tensor,
    const std::string& where, const std::string& name, const Tensor& t, const PieceMap& places, std::int64_t rank) {
    const PiecePlace place = place_of(name, t, places);
    const auto declared = places.find(name);
    const bool whole = declared == places.end() || declared->second.whole();
    const auto found = by_tensor.find(place.global);
    if (found == by_tensor.end()) throw LoadMismatch(where + " has no tensor '" + place.global + "' (for '" + name + "')");
    std::vector<const TensorPiece*> candidates =
        whole ? choose_copy(found->second, copies_of(name, places, index), rank, name, where) : found->second;
    const TensorPiece& some = *candidates.front();
    if (some.dtype != t.dtype() || some.global_shape != place.global_shape)
        throw LoadMismatch(where + ": '" + place.global + "' is " + std::string(dtype_name(some.dtype)) + " of shape " +
                           shape_string(some.global_shape) + ", '" + name + "' wants " + std::string(dtype_name(t.dtype())) +
                           " of shape " + shape_string(place.global_shape));
    for (const TensorPiece* p : candidates)  // an index that disagrees with itself: damaged or crafted
        if (p->dtype != some.dtype || p->global_shape != some.global_shape)
            throw FormatError(where + ": its pieces of '" + place.global + "' disagree: '" + p->entry + "' of '" +
                                  p->file + "' says " + std::string(dtype_name(p->dtype)) + " of shape " +
                                  shape_string(p->global_shape) + ", '" + some.entry + "' of '" + some.file + "' " +
                                  std::string(dtype_name(some.dtype)) + " of shape " + shape_string(some.global_shape),
                              where);
    // the pieces are stored bytes: another order would read a matrix as its transpose
    for (const TensorPiece* p : candidates)
        if (p->order != t.order())
            throw LoadMismatch(where + ": '" + p->entry + "' of '" + p->file + "' is stored " +
                               std::string(order_name(p->order)) + ", '" + name + "' is " +
                               std::string(order_name(t.order())) + " (stored shapes " + shape_string(some.global_shape) +
                               ")");
    return candidates;
}

}  // namespace detail

/// The state of one rank of a new layout: a tensor for every tensor of `like` (same name,
/// dtype and shape; Trainer::load_target() gives them), placed in the global tensors by
/// `places` (entries not listed are whole tensors), filled from the pieces the index at
/// `index_file` lists: for each tensor, only the chunks of the fewest pieces that cover its
/// elements are read, each checked against its checksum before it is used (ChecksumError
/// naming file, tensor and chunk; LoadMismatch for elements no file holds). New memory:
/// nothing live changes, whatever fails.
/// A file with codecs is read and decoded whole, once (`opts.key` for an encrypted one).
///
/// A whole entry (a tensor or a value) that differs between the ranks that saved it is loaded
/// only when declared per-rank (rank `rank`'s copy; `rank` is the loading rank) or replicated,
/// in `places` or by the savers: otherwise LoadMismatch names it and the ranks.
inline ReshardedState load_resharded(const GlobalIndex& index, const PathArg& index_file, const ParamDict& like,
                                     const PieceMap& places = {}, const LoadOptions& opts = {}, std::int64_t rank = -1) {
    const boost::filesystem::path dir = index_file.parent_path();
    const std::string where = "global index '" + index_file.string() + "'";
    struct Read {  // a part of one piece this rank needs
        const TensorPiece* piece;
        std::uint64_t from, to;  // elements of the global tensor
        std::byte* into;         // where element `from` goes
    };
    std::vector<Read> reads;
    ReshardedState report;
    std::map<std::string_view, std::vector<const TensorPiece*>> by_tensor;
    for (const auto& p : index.pieces) by_tensor[p.global].push_back(&p);
    // one block for every tensor, each 64-byte aligned in it, filled by the reads alone
    std::size_t total = 0;
    for (const auto& [name, value] : like)
        if (const Tensor* t = value.get_if<Tensor>()) total += (t->nbytes() + 63) & ~std::size_t{63};
    const std::shared_ptr<std::byte> block = detail::allocate_aligned(total);
    std::size_t used = 0;
    for (const auto& [name, value] : like) {
        const Tensor* t = value.get_if<Tensor>();
        if (!t) continue;
        std::byte* const base = block.get() + used;
        used += (t->nbytes() + 63) & ~std::size_t{63};
        report.state.set(name, Tensor::aliasing(t->dtype(), t->logical_shape(), block, base, t->order()));
        const PiecePlace place = detail::place_of(name, *t, places);
        const std::uint64_t first = place.first, last = place.first + t->numel();
        const std::vector<const TensorPiece*> candidates =
            detail::sources_of(index, by_tensor, where, name, *t, places, rank);
        // walk [first, last): at each point the piece covering it that reaches furthest
        for (std::uint64_t at = first; at < last;) {
            const TensorPiece* best = nullptr;
            for (const TensorPiece* p : candidates)
                if (p->first <= at && at < p->first + p->count && (!best || p->first + p->count > best->first + best->count))
                    best = p;
            if (!best)
                throw LoadMismatch(where + ": no rank's file holds " + detail::elements_text(at, last) + " of '" +
                                   place.global + "' (for '" + name + "')");
            const std::uint64_t to = std::min(last, best->first + best->count);
            reads.push_back({best, at, to, base + (at - first) * itemsize(t->dtype())});
            at = to;
        }
        report.bytes_needed += t->nbytes();
    }
    // every chunk to read, then read by two threads when there is much to read; each chunk is
    // checked before anything is copied from it
    struct Chunk {
        const Read* read;
        std::uint64_t index;     // of the chunk in its piece
        std::uint64_t begin, end;  // its bytes in the piece
    };
    std::vector<Chunk> chunks;
    std::map<std::string, detail::Fd> open;
    std::map<std::string, BodyBytes> decoded;  // the bodies of files with codecs
    for (const Read& r : reads) {
        const TensorPiece& p = *r.piece;
        if (p.encoded) {
            if (auto [it, fresh] = decoded.try_emplace(p.file); fresh) {
                const std::string path = (dir / p.file).string();
                auto c = detail::open_checkpoint(path, {});
                it->second = detail::read_decoded_body(c, path, opts);
                report.bytes_read += c.header.body_length;
                ++report.files_opened;
            }
            if (p.offset + p.count * itemsize(p.dtype) > decoded.at(p.file).size)
                throw FormatError("'" + (dir / p.file).string() + "': '" + p.entry + "' lies past the end of its decoded body (" +
                                      where + ")",
                                  (dir / p.file).string());
        } else if (auto [it, fresh] = open.try_emplace(p.file); fresh) {
            it->second = detail::open_checkpoint((dir / p.file).string(), {}).fd;
            ++report.files_opened;
        }
        const std::uint64_t item = itemsize(p.dtype), chunk = index.chunk_bytes;
        const std::uint64_t need_begin = (r.from - p.first) * item, need_end = (r.to - p.first) * item;
        for (std::uint64_t c = need_begin / chunk; c * chunk < need_end; ++c) {
            chunks.push_back({&r, c, c * chunk, std::min(p.count * item, (c + 1) * chunk)});
            if (!p.encoded) report.bytes_read += chunks.back().end - chunks.back().begin;
        }
    }
    auto read_chunks = [&](std::size_t from, std::size_t to) {
        std::shared_ptr<std::byte> bounce;
        for (std::size_t k = from; k < to; ++k) {
            const Chunk& c = chunks[k];
            const Read& r = *c.read;
            const TensorPiece& p = *r.piece;
            const std::uint64_t item = itemsize(p.dtype);
            const std::uint64_t need_begin = (r.from - p.first) * item, need_end = (r.to - p.first) * item;
            const std::uint64_t lo = std::max(c.begin, need_begin), hi = std::min(c.end, need_end);
            std::byte* dst = r.into + (lo - need_begin);
            // a whole chunk goes straight where it belongs; a part of one through a bounce buffer;
            // a chunk of a decoded body is checked where it lies
            std::byte* land = lo == c.begin && hi == c.end ? dst : nullptr;
            if (p.encoded) {
                land = decoded.at(p.file).data.get() + p.offset + c.begin;
            } else if (!land) {
                if (!bounce) bounce = detail::allocate_aligned(static_cast<std::size_t>(index.chunk_bytes));
                land = bounce.get();
            }
            const std::string path = (dir / p.file).string();
            const auto len = static_cast<std::size_t>(c.end - c.begin);
            if (!p.encoded)
                detail::pread_exact(open.at(p.file).get(), reinterpret_cast<char*>(land), len, p.offset + c.begin, path);
            if (detail::xxh3(land, len) != p.chunk_hashes[static_cast<std::size_t>(c.index)])
                throw ChecksumError("'" + path + "': chunk " + std::to_string(c.index) + " of '" + p.entry + "' (" +
                                        detail::elements_text(p.first + c.begin / item, p.first + c.end / item) + " of '" +
                                        p.global + "') does not match its checksum in " + where,
                                    path);
            if (land != dst) std::memcpy(dst, land + (lo - c.begin), static_cast<std::size_t>(hi - lo));
        }
    };
    if (report.bytes_read < detail::parallel_read_threshold) {
        read_chunks(0, chunks.size());
    } else {  // a helper takes the second half
        const std::size_t half = chunks.size() / 2;
        std::exception_ptr helper_error;
        std::thread helper([&] {
            try {
                read_chunks(half, chunks.size());
            } catch (...) {
                helper_error = std::current_exception();
            }
        });
        std::exception_ptr mine;
        try {
            read_chunks(0, half);
        } catch (...) {
            mine = std::current_exception();
        }
        helper.join();
        if (mine) std::rethrow_exception(mine);  // the first chunk in order that failed
        if (helper_error) std::rethrow_exception(helper_error);
    }
    // the values: the lowest rank's, unless the ranks' differ (see above)
    std::vector<std::string> names;
    for (const auto& [name, value] : index.values) names.push_back(name);
    for (const auto& [r, values] : index.rank_values)
        for (const auto& [name, value] : values)
            if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    for (const auto& name : names) {
        if (report.state.contains(name)) continue;
        const Value* value = index.values.contains(name) ? &index.values.at(name) : nullptr;
        std::vector<std::int64_t> differ;
        for (const auto& [r, values] : index.rank_values)
            if (values.contains(name)) differ.push_back(r);
        if (!differ.empty()) {
            switch (detail::copies_of(name, places, index)) {
                case Copies::same:
                    throw LoadMismatch(where + ": value '" + name + "' differs between the ranks that saved it: rank(s) " +
                                       detail::ranks_text(differ) + " hold other values than the lowest rank" +
                                       detail::declare_hint());
                case Copies::replicated:
                    if (!value) value = &index.rank_values.at(differ.front()).at(name);
                    break;
                case Copies::per_rank:
                    if (rank < 0)
                        throw ConfigError(where + ": value '" + name + "' is per-rank: pass the loading rank to load_resharded");
                    if (rank >= index.world_size)
                        throw LoadMismatch(where + ": value '" + name + "' is per-rank, and rank " + std::to_string(rank) +
                                           " saved none (the step was saved by " + std::to_string(index.world_size) +
                                           " rank(s))");
                    if (const auto it = index.rank_values.find(rank); it != index.rank_values.end() && it->second.contains(name))
                        value = &it->second.at(name);
                    break;
            }
        }
        if (value) report.state.set(name, *value);
    }
    return report;
}
inline ReshardedState load_resharded(const PathArg& index_file, const ParamDict& like, const PieceMap& places = {},
                                     const LoadOptions& opts = {}, std::int64_t rank = -1) {
    return load_resharded(read_global_index(index_file), index_file, like, places, opts, rank);
}

/// What a rank of any layout finds in `index` to shape a target by (ShapedByCheckpoint): each
/// tensor, with its dtype and (stored) shape, and every value. A tensor is listed when some
/// rank saved it whole, or when its pieces, each saved under the tensor's own name, make it
/// whole (a replica-parallel save) and `places` (the loader's) does not place a piece of it:
/// a tensor the loader holds a piece of has that piece's shape, which `places` says.
inline std::vector<EntryInfo> index_entries(const GlobalIndex& index, const PieceMap& places = {}) {
    std::vector<EntryInfo> out;
    std::map<std::string, std::vector<const TensorPiece*>> split;  // tensors no piece holds whole, in order
    std::vector<std::string> order;
    for (const auto& p : index.pieces) {
        if (std::any_of(out.begin(), out.end(), [&](const EntryInfo& e) { return e.name == p.global; })) continue;
        if (p.first != 0 || p.count != detail::numel_of(p.global_shape) || p.global != p.entry) {
            if (!split.contains(p.global)) order.push_back(p.global);
            split[p.global].push_back(&p);
            continue;
        }
        EntryInfo e;
        e.name = p.global;
        e.kind = ValueKind::tensor;
        e.dtype = p.dtype;
        e.shape = p.global_shape;
        e.order = p.order;
        e.nbytes = p.count * itemsize(p.dtype);
        out.push_back(std::move(e));
    }
    for (const auto& name : order) {
        if (std::any_of(out.begin(), out.end(), [&](const EntryInfo& e) { return e.name == name; })) continue;
        if (const auto it = places.find(name); it != places.end() && !it->second.whole()) continue;
        auto pieces = split.at(name);
        if (std::any_of(pieces.begin(), pieces.end(), [&](const TensorPiece* p) { return p->entry != name; })) continue;
        std::sort(pieces.begin(), pieces.end(), [](const TensorPiece* a, const TensorPiece* b) { return a->first < b->first; });
        std::uint64_t covered = 0;
        for (const TensorPiece* p : pieces)
            if (p->first <= covered) covered = std::max(covered, p->first + p->count);
        const TensorPiece& some = *pieces.front();
        if (covered < detail::numel_of(some.global_shape)) continue;
        EntryInfo e;
        e.name = name;
        e.kind = ValueKind::tensor;
        e.dtype = some.dtype;
        e.shape = some.global_shape;
        e.order = some.order;
        e.nbytes = detail::numel_of(some.global_shape) * itemsize(some.dtype);
        out.push_back(std::move(e));
    }
    for (const auto& [name, value] : index.values) {
        EntryInfo e;
        e.name = name;
        e.kind = value.kind();
        e.scalar = value;
        out.push_back(std::move(e));
    }
    return out;
}

/// load_resharded() into `target`, an object that shapes itself after what it loads (a
/// ShapedByCheckpoint: EigenState, TorchState, a growing history): it is shaped after the
/// index's entries (index_entries()), the state is read into new memory, then written into
/// it (strictly, as restore() does), and its loaded() runs. For a state loaded in several
/// parts, each part loads from the same `index_file`: one step. Returns what the load read.
template <ShapedByCheckpoint T>
ReshardedState load_resharded_into(const PathArg& index_file, T& target, const PieceMap& places = {},
                                   const LoadOptions& opts = {}, std::int64_t rank = -1) {
    const GlobalIndex index = read_global_index(index_file);
    const std::string source = "global index '" + index_file.string() + "'";
    ParamDict views = detail::naming_source(source, [&] { return target.state_dict_for(index_entries(index, places)); });
    ReshardedState got = load_resharded(index, index_file, views, places, opts, rank);
    LoadReport report;
    try {
        report = load_param_into_net(views, got.state, /*strict=*/true);
    } catch (const LoadMismatch& e) {
        throw LoadMismatch(source + " does not fit: " + e.what());
    }
    detail::naming_source(source, [&] { target.loaded(report); });
    return got;
}

}  // namespace ckpt
