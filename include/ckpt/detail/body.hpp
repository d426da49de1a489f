#pragma once
// The checkpoint body, written through a Boost.Serialization archive. Schema (version 1):
//
//   entries  u64                          number of entries
//   per entry, in order (the table of contents):
//     name   string
//     kind   u32                          ValueKind
//     tensor: dtype u32, rank u32, dim i64 x rank, nbytes u64
//     int64 / double / bool / string: value
//     bytes: size u64, data block; strings: count u64, value string x count;
//     object: type string, encoding u32, size u64, data block
//   a column-major tensor: its dims reversed, and right after it the string entry
//   "__ckpt.order.{name}" = "column_major" (entry.hpp)
//   per tensor entry, in the same order:
//     [binary only] pad u32 + pad zero bytes, so the payload starts 64-byte aligned in the body
//     data   the payload as one binary block (base64 in text and xml archives)
//
// The table of contents comes first so a load can check names, dtypes and shapes against its
// targets before any payload is written into them.
//
// Version 3 (binary only) adds what a reader needs to read one entry and verify only it:
//   chunk_bytes u64 before `entries`; after each tensor's nbytes, the XXH3-64 of each
//   chunk_bytes piece of its payload (u64 x ceil(nbytes / chunk_bytes)); and after the last
//   entry, toc_check u64: the XXH3-64 of the body bytes before it.

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/archive/text_iarchive.hpp>
#include <boost/archive/text_oarchive.hpp>
#include <boost/archive/xml_iarchive.hpp>
#include <boost/archive/xml_oarchive.hpp>
#include <boost/serialization/binary_object.hpp>
#include <boost/serialization/nvp.hpp>
#include <boost/serialization/string.hpp>
#include <boost/archive/iterators/dataflow_exception.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cctype>
#include <cstdint>
#include <streambuf>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../error.hpp"
#include "../format.hpp"
#include "hash.hpp"
#include "entry.hpp"
#include "../param_dict.hpp"
#include "../tensor.hpp"

namespace ckpt::detail {

// Payloads and binary fields are the machine's bytes; docs/FORMAT.md fixes them little-endian.
static_assert(std::endian::native == std::endian::little,
              "ckpt's file format is little-endian; this machine would write non-conforming files");

template <class A>
inline constexpr bool is_binary_archive_v =
    std::is_same_v<A, boost::archive::binary_oarchive> || std::is_same_v<A, boost::archive::binary_iarchive>;

using boost::serialization::make_nvp;

template <class A>
inline constexpr bool is_xml_archive_v =
    std::is_same_v<A, boost::archive::xml_oarchive> || std::is_same_v<A, boost::archive::xml_iarchive>;

/// Strings are a length then the bytes (base64 in text archives), so that a reader can
/// bound the length by the body before allocating; xml keeps them readable between tags.
template <class OArchive>
void write_string(OArchive& ar, const char* tag, const std::string& s) {
    if constexpr (is_xml_archive_v<OArchive>) {
        ar << make_nvp(tag, s);
    } else {
        const std::uint64_t n = s.size();
        ar << make_nvp(tag, n);
        ar.save_binary(s.data(), s.size());
    }
}

/// A byte string: its size, then the bytes as one block (base64 in text and xml).
template <class OArchive>
void write_block(OArchive& ar, const std::string& s) {
    const std::uint64_t n = s.size();
    ar << make_nvp("size", n);
    ar << make_nvp("data", boost::serialization::make_binary_object(const_cast<char*>(s.data()), s.size()));
}

inline bool is_column_major(const Value& v) {
    const Tensor* t = v.get_if<Tensor>();
    return t && t->order() == Order::column_major;
}

/// The chunk checksums of a version 3 body: the chunk size, and the hashes of every tensor's
/// chunks in the order of the dict. A chunk size of 0 means a version 1 body.
struct ChunkTable {
    std::uint64_t chunk_bytes = 0;
    std::vector<std::uint64_t> hashes;
};

inline std::uint64_t chunk_count(std::uint64_t nbytes, std::uint64_t chunk_bytes) {
    return nbytes / chunk_bytes + (nbytes % chunk_bytes != 0);
}

/// Hashes every tensor payload of `dict` in chunks of `chunk_bytes`, before the table of
/// contents that records them is written. Chunks are independent, so a large state hashes on
/// up to `threads` threads.
inline ChunkTable hash_chunks(const ParamDict& dict, std::uint64_t chunk_bytes, unsigned threads) {
    ChunkTable table{chunk_bytes, {}};
    std::vector<std::pair<const std::byte*, std::size_t>> chunks;
    std::uint64_t total = 0;
    for (const ParamDict::Entry& entry : dict)
        if (const Tensor* t = entry.value.get_if<Tensor>()) {
            for (std::uint64_t at = 0; at < t->nbytes(); at += chunk_bytes)
                chunks.emplace_back(t->data() + at, static_cast<std::size_t>(std::min(chunk_bytes, t->nbytes() - at)));
            total += t->nbytes();
        }
    table.hashes.resize(chunks.size());
    auto hash_from = [&](std::atomic<std::size_t>& next) {
        for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < chunks.size();)
            table.hashes[i] = xxh3(chunks[i].first, chunks[i].second);
    };
    std::atomic<std::size_t> next{0};
    // a thread pays for itself past a few MiB: below, hash here
    const auto helpers = static_cast<std::size_t>(
        std::min<std::uint64_t>(threads > 0 ? threads - 1 : 0, std::min<std::uint64_t>(chunks.size(), total >> 23)));
    std::vector<std::jthread> pool;
    pool.reserve(helpers);
    for (std::size_t k = 0; k < helpers; ++k) pool.emplace_back([&] { hash_from(next); });
    hash_from(next);
    return table;
}

/// Writes `dict`; `position()` tells the writer's offset in the body, for payload alignment.
/// With `chunks.chunk_bytes` set (binary archives only) it writes a version 3 body, whose
/// toc_check is `digest()`: the XXH3-64 of the body written so far.
template <class OArchive, class Position, class Digest>
void write_body(OArchive& ar, const ParamDict& dict, Position&& position, const ChunkTable& chunks, Digest&& digest) {
    std::uint64_t count = dict.size();
    for (const ParamDict::Entry& entry : dict) count += is_column_major(entry.value);
    const bool chunked = chunks.chunk_bytes != 0;
    if (chunked) ar << make_nvp("chunk_bytes", chunks.chunk_bytes);
    ar << make_nvp("entries", count);
    auto hash = chunks.hashes.begin();
    for (const ParamDict::Entry& entry : dict) {
        const Value& value = entry.value;
        write_string(ar, "name", entry.name);
        const auto kind = static_cast<std::uint32_t>(value.kind());
        ar << make_nvp("kind", kind);
        if (const Tensor* t = value.get_if<Tensor>()) {
            const auto dtype = static_cast<std::uint32_t>(t->dtype());
            const auto rank = static_cast<std::uint32_t>(t->rank());
            ar << make_nvp("dtype", dtype) << make_nvp("rank", rank);
            for (std::int64_t d : t->shape()) ar << make_nvp("dim", d);  // the stored shape
            const std::uint64_t nbytes = t->nbytes();
            ar << make_nvp("nbytes", nbytes);
            if (chunked)
                for (std::uint64_t k = chunk_count(nbytes, chunks.chunk_bytes); k > 0; --k)
                    ar << make_nvp("hash", *hash++);
            if (t->order() == Order::column_major) {
                write_string(ar, "name", order_record_name(entry.name));
                const auto string_kind = static_cast<std::uint32_t>(ValueKind::string);
                ar << make_nvp("kind", string_kind);
                write_string(ar, "value", std::string(column_major_value));
            }
        } else if (auto* i = value.get_if<std::int64_t>()) {
            ar << make_nvp("value", *i);
        } else if (auto* d = value.get_if<double>()) {
            ar << make_nvp("value", *d);
        } else if (auto* b = value.get_if<bool>()) {
            const std::uint32_t v = *b ? 1 : 0;  // a fixed width: a bool read from a bad byte is undefined
            ar << make_nvp("value", v);
        } else if (auto* s = value.get_if<std::string>()) {
            write_string(ar, "value", *s);
        } else if (auto* b = value.get_if<Bytes>()) {
            write_block(ar, b->data);
        } else if (auto* list = value.get_if<Strings>()) {
            const std::uint64_t n = list->size();
            ar << make_nvp("count", n);
            for (const auto& item : *list) write_string(ar, "value", item);
        } else if (auto* o = value.get_if<Object>()) {
            write_string(ar, "type", o->type);
            const auto encoding = static_cast<std::uint32_t>(o->encoding);
            ar << make_nvp("encoding", encoding);
            write_block(ar, o->data);
        } else {
            throw std::logic_error("entry '" + entry.name + "': a binding reached the writer (materialized() first)");
        }
    }
    if (chunked) {
        const std::uint64_t toc_check = digest();
        ar << make_nvp("toc_check", toc_check);
    }
    static constexpr std::array<char, payload_alignment> zeros{};
    for (const ParamDict::Entry& entry : dict) {
        const Tensor* t = entry.value.get_if<Tensor>();
        if (!t) continue;
        if constexpr (is_binary_archive_v<OArchive>) {
            const auto pad = static_cast<std::uint32_t>((payload_alignment - (position() + 4) % payload_alignment) %
                                                        payload_alignment);
            ar << make_nvp("pad", pad);
            ar.save_binary(zeros.data(), pad);
        }
        ar << make_nvp("data", boost::serialization::make_binary_object(const_cast<std::byte*>(t->data()), t->nbytes()));
    }
}

/// Reads body elements while bounding every length by the bytes the body has left.
template <class IArchive, class Source>
class BodyParser {
public:
    /// `chunked`: a version 3 body (FileHeader::chunked()).
    BodyParser(IArchive& ar, Source& src, const std::string& path, bool chunked)
        : ar_(ar), src_(src), path_(path), chunked_(chunked) {}

    std::vector<EntryMeta> read_toc() {
        if (chunked_) {
            ar_ >> make_nvp("chunk_bytes", chunk_bytes_);
            if (!valid_chunk_bytes(chunk_bytes_))
                fail("the chunk size " + std::to_string(chunk_bytes_) + " is not a power of two from " +
                     std::to_string(min_chunk_bytes) + " to " + std::to_string(max_chunk_bytes));
        }
        std::uint64_t count = 0;
        ar_ >> make_nvp("entries", count);
        if (count > remaining()) fail("entry count " + std::to_string(count) + " exceeds the body size");
        // An entry takes a few bytes of the body but over a hundred in memory: the table grows
        // with the entries actually read, never to the size a damaged count asks for.
        std::vector<EntryMeta> toc;
        std::uint64_t payload_total = 0;
        for (std::uint64_t i = 0; i < count; ++i) {
            EntryMeta& e = toc.emplace_back();
            read_string("name", e.name);
            std::uint32_t kind = 0;
            ar_ >> make_nvp("kind", kind);
            check_code(kind, max_value_kind, "entry '" + e.name + "' has", "value kind");
            e.kind = static_cast<ValueKind>(kind);
            switch (e.kind) {
                case ValueKind::tensor: read_tensor_meta(e); break;
                case ValueKind::int64: e.scalar = read_value<std::int64_t>(); break;
                case ValueKind::float64: e.scalar = read_value<double>(); break;
                case ValueKind::boolean: {
                    const auto v = read_value<std::uint32_t>();
                    if (v > 1) fail("entry '" + e.name + "' holds bool value " + std::to_string(v));
                    e.scalar = v == 1;
                    break;
                }
                case ValueKind::string: {
                    std::string s;
                    read_string("value", s);
                    e.scalar = std::move(s);
                    break;
                }
                case ValueKind::bytes: e.scalar = Bytes{read_block(e.name)}; break;
                case ValueKind::strings: {
                    std::uint64_t n = 0;
                    ar_ >> make_nvp("count", n);
                    if (n > remaining()) fail("entry '" + e.name + "' counts " + std::to_string(n) + " strings, more than the body holds");
                    Strings list;  // grows with the strings read, never to a damaged count
                    for (std::uint64_t k = 0; k < n; ++k) read_string("value", list.emplace_back());
                    e.scalar = std::move(list);
                    break;
                }
                case ValueKind::object: {
                    Object o;
                    read_string("type", o.type);
                    std::uint32_t encoding = 0;
                    ar_ >> make_nvp("encoding", encoding);
                    check_code(encoding, max_object_encoding, "object '" + e.name + "' has", "encoding");
                    o.encoding = static_cast<ObjectEncoding>(encoding);
                    o.data = read_block(e.name);
                    e.scalar = std::move(o);
                    break;
                }
            }
            payload_total += e.nbytes;
            if (payload_total > src_.length())
                fail("tensor payloads add up to more than the body's " + std::to_string(src_.length()) + " bytes");
        }
        if (chunked_) {
            toc_end_ = src_.position();
            ar_ >> make_nvp("toc_check", toc_check_);
        }
        apply_order_records(toc);
        return toc;
    }

    /// Version 3: the chunk size, the body offset of toc_check (the length of the bytes it
    /// covers) and its value, once read_toc() returned.
    std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    std::uint64_t toc_end() const noexcept { return toc_end_; }
    std::uint64_t toc_check() const noexcept { return toc_check_; }

    /// Skips the alignment padding in front of a payload (binary archives only).
    void read_padding() {
        if constexpr (is_binary_archive_v<IArchive>) {
            std::uint32_t pad = 0;
            ar_ >> make_nvp("pad", pad);
            if (pad >= payload_alignment) fail("payload padding of " + std::to_string(pad) + " bytes is invalid");
            std::array<char, payload_alignment> scratch;
            ar_.load_binary(scratch.data(), pad);
        }
    }

    void read_payload(const EntryMeta& e, void* dst) {
        if (e.nbytes > remaining())
            fail("tensor '" + e.name + "' needs " + std::to_string(e.nbytes) + " bytes, the body has " +
                 std::to_string(remaining()) + " left");
        auto blob = boost::serialization::make_binary_object(dst, static_cast<std::size_t>(e.nbytes));
        ar_ >> make_nvp("data", blob);
    }

    std::uint64_t remaining() const { return src_.length() - src_.position(); }

    [[noreturn]] void fail(const std::string& why) const {
        throw FormatError("checkpoint '" + path_ + "' is malformed: " + why, path_);
    }

private:
    template <class T>
    T read_value() {
        T v{};
        ar_ >> make_nvp("value", v);
        return v;
    }

    void read_string(const char* tag, std::string& s) {
        if constexpr (is_xml_archive_v<IArchive>) {
            ar_ >> make_nvp(tag, s);  // the text between two tags: bounded by the body
        } else {
            std::uint64_t n = 0;
            ar_ >> make_nvp(tag, n);
            if (n > remaining()) fail("a string of " + std::to_string(n) + " bytes exceeds the body size");
            s.resize(static_cast<std::size_t>(n));
            ar_.load_binary(s.data(), s.size());
        }
    }

    /// A value kind or object encoding (`what`) above `known`: the body passed its checksum
    /// before it is parsed, so a newer writer's, unless no writer numbers one so high (damage).
    void check_code(std::uint32_t code, std::uint32_t known, const std::string& subject, const char* what) const {
        if (code > max_plausible_code) fail(subject + " unknown " + what + " " + std::to_string(code));
        if (code > known)
            throw VersionError("checkpoint '" + path_ + "': " + subject + " " + what + " " + std::to_string(code) +
                                   ", which this version of ckpt does not know (written by a newer version?)",
                               path_);
    }

    std::string read_block(const std::string& entry) {
        std::uint64_t n = 0;
        ar_ >> make_nvp("size", n);
        if (n > remaining())
            fail("entry '" + entry + "' holds " + std::to_string(n) + " bytes, more than the body has left");
        std::string s(static_cast<std::size_t>(n), '\0');
        auto blob = boost::serialization::make_binary_object(s.data(), s.size());
        ar_ >> make_nvp("data", blob);
        return s;
    }

    void read_tensor_meta(EntryMeta& e) {
        std::uint32_t dtype = 0, rank = 0;
        ar_ >> make_nvp("dtype", dtype) >> make_nvp("rank", rank);
        const auto dt = dtype_from_code(dtype);
        // the body passed its checksum before it is parsed: a code this reader lacks is a newer writer's
        if (!dt)
            throw VersionError("checkpoint '" + path_ + "': tensor '" + e.name + "' has dtype code " +
                                   std::to_string(dtype) + ", which this version of ckpt does not know (" +
                                   "written by a newer version?)",
                               path_);
        if (rank > max_tensor_rank)
            fail("tensor '" + e.name + "' has rank " + std::to_string(rank) + " (at most " +
                 std::to_string(max_tensor_rank) + ")");
        e.dtype = *dt;
        e.shape.resize(rank);
        for (auto& d : e.shape) ar_ >> make_nvp("dim", d);
        ar_ >> make_nvp("nbytes", e.nbytes);
        std::size_t numel = 0;
        try {
            numel = checked_numel(e.shape, static_cast<std::size_t>(src_.length()));
        } catch (const FormatError&) {
            fail("tensor '" + e.name + "' has an impossible shape " + shape_string(e.shape));
        }
        if (numel * itemsize(e.dtype) != e.nbytes)
            fail("tensor '" + e.name + "' of " + std::string(dtype_name(e.dtype)) + shape_string(e.shape) +
                 " should hold " + std::to_string(numel * itemsize(e.dtype)) + " bytes, not " +
                 std::to_string(e.nbytes));
        if (chunked_) {
            // the count is bounded by the body before anything is allocated
            const std::uint64_t n = chunk_count(e.nbytes, chunk_bytes_);
            if (n > remaining() / 8)
                fail("tensor '" + e.name + "' of " + std::to_string(e.nbytes) + " bytes needs " + std::to_string(n) +
                     " chunk checksums, more than the body holds");
            e.chunk_hashes.resize(static_cast<std::size_t>(n));
            for (auto& h : e.chunk_hashes) ar_ >> make_nvp("hash", h);
        }
    }

    /// Marks the tensors that storage-order records name column-major, and drops the records.
    void apply_order_records(std::vector<EntryMeta>& toc) const {
        auto is_record = [](const EntryMeta& e) { return std::string_view(e.name).starts_with(order_record_prefix); };
        if (std::none_of(toc.begin(), toc.end(), is_record)) return;
        std::unordered_map<std::string_view, EntryMeta*> tensors;
        for (auto& e : toc)
            if (e.kind == ValueKind::tensor) tensors.emplace(e.name, &e);
        for (const auto& e : toc) {
            if (!is_record(e)) continue;
            const std::string tensor = e.name.substr(order_record_prefix.size());
            const std::string* value = e.scalar.get_if<std::string>();
            if (e.kind != ValueKind::string || !value || *value != column_major_value)
                fail("the storage order record '" + e.name + "' of tensor '" + tensor + "' holds " +
                     (value && e.kind == ValueKind::string ? "'" + *value + "'" : "no string") + ", not '" +
                     std::string(column_major_value) + "'");
            const auto it = tensors.find(tensor);
            if (it == tensors.end())
                fail("the storage order record '" + e.name + "' names no tensor entry ('" + tensor + "')");
            EntryMeta& t = *it->second;
            if (t.order == Order::column_major)  // reject_duplicates() runs after the records are gone
                fail("entry '" + e.name + "' appears twice");
            if (t.shape.size() < 2)
                fail("the storage order record '" + e.name + "' marks tensor '" + tensor + "' of rank " +
                     std::to_string(t.shape.size()) + " column-major; only tensors of rank 2 or more have an order");
            t.order = Order::column_major;
        }
        std::erase_if(toc, is_record);
    }

    IArchive& ar_;
    Source& src_;
    const std::string& path_;
    bool chunked_;
    std::uint64_t chunk_bytes_ = 0, toc_end_ = 0, toc_check_ = 0;
};

/// An xml body on its way to Boost's xml archive, refusing a '&' that starts none of the five
/// entities FORMAT.md section 6 allows (&amp; &lt; &gt; &quot; &apos;): Boost would decode a
/// character reference (&#27; an ESC) that no writer writes and the Python reader refuses. It
/// reads `src` ahead in chunks, and tells BodyParser the position of what it has handed on.
template <class Source>
class XmlEntityCheck final : public std::streambuf {
public:
    XmlEntityCheck(Source& src, const std::string& path) : src_(src), path_(path) {}

    std::uint64_t position() const noexcept { return src_.position() - static_cast<std::uint64_t>(egptr() - gptr()); }
    std::uint64_t length() const noexcept { return src_.length(); }

    /// The FormatError of a '&' refused, if there was one (reading stopped there).
    void rethrow_refusal() const {
        if (!problem_.empty()) throw FormatError(problem_, path_);
    }

protected:
    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        if (!problem_.empty()) return traits_type::eof();
        const std::streamsize n = src_.sgetn(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
        if (n <= 0) {
            if (in_entity_) refuse();
            return traits_type::eof();
        }
        for (std::streamsize i = 0; i < n; ++i) scan(buffer_[static_cast<std::size_t>(i)]);
        if (!problem_.empty()) return traits_type::eof();  // the parser stops, and the refusal is reported
        setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
        return traits_type::to_int_type(buffer_[0]);
    }

private:
    void scan(char c) {
        ++offset_;
        if (!in_entity_) {
            in_entity_ = c == '&';
            entity_.clear();
            return;
        }
        if (c != ';') {
            if (entity_.size() >= 4 || !std::isalpha(static_cast<unsigned char>(c))) refuse();
            else entity_ += c;
            return;
        }
        if (entity_ != "amp" && entity_ != "lt" && entity_ != "gt" && entity_ != "quot" && entity_ != "apos") refuse();
        in_entity_ = false;
    }
    void refuse() {
        if (problem_.empty())
            problem_ = "checkpoint '" + path_ + "' is malformed: the xml body holds a '&' that starts no entity (by byte " +
                       std::to_string(offset_) + "; only &amp; &lt; &gt; &quot; and &apos; stand for characters)";
        in_entity_ = false;
    }

    Source& src_;
    const std::string& path_;
    std::array<char, 4096> buffer_{};
    std::string entity_, problem_;
    bool in_entity_ = false;
    std::uint64_t offset_ = 0;  // body bytes scanned
};

}  // namespace ckpt::detail
