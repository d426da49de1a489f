#pragma once
// Saving and loading one checkpoint file: save_checkpoint, load_checkpoint,
// load_checkpoint_into (straight into existing tensors) and load_param_into_net.

#include <boost/archive/archive_exception.hpp>
#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <locale>
#include <concepts>
#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <span>
#include <cstring>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "codec.hpp"
#include "detail/atomic_file.hpp"
#include "detail/body.hpp"
#include "detail/hash.hpp"
#include "detail/posix_io.hpp"
#include "detail/streams.hpp"
#include "error.hpp"
#include "format.hpp"
#include "param_dict.hpp"
#include "path.hpp"

namespace ckpt {

namespace fs = boost::filesystem;

struct SaveOptions {
    ArchiveKind archive = ArchiveKind::binary;
    std::int64_t epoch = 0;  ///< recorded in the header; latest() checks it against the file name
    std::int64_t step = 0;   ///< likewise
    bool overwrite = true;   ///< false: fail with EEXIST rather than replace an existing file
    CodecChain codecs{};     ///< what the body passes through, in order (see codec.hpp); none by default
};

struct LoadOptions {
    std::optional<ArchiveKind> archive;  ///< when set, a file of another archive kind is an error
    Key key{};                           ///< for encrypted checkpoints
    /// A compressed body larger than this once decoded is refused before it is decoded. zstd
    /// frames can expand thousands of times: a reader of files from elsewhere should set it.
    std::uint64_t max_decoded_bytes = UINT64_MAX;
};

/// What a load into existing tensors did, in the seed's terms.
struct LoadReport {
    std::vector<std::string> param_not_load;  ///< target tensors the checkpoint did not fill
    std::vector<std::string> ckpt_not_load;   ///< checkpoint tensors with no matching target
    std::vector<std::string> mismatches;      ///< same name, other dtype or shape (also in both lists above)
    ParamDict rest;                           ///< checkpoint entries not loaded into the target
    bool complete() const { return param_not_load.empty() && ckpt_not_load.empty(); }
};

/// One entry of a checkpoint's table of contents: name and kind; dtype, shape and size for a
/// tensor; the value itself for the other kinds.
using EntryInfo = detail::EntryMeta;

/// What read_contents() finds at the start of a file.
struct CheckpointContents {
    FileHeader header;
    std::vector<EntryInfo> entries;
};

/// Who wrote a checkpoint, as a CheckpointManager records it in every file it writes: its
/// prefix and the file's run prefix ("exp" and "exp_2"), and for an exception save the run of
/// regular checkpoints it continues. Names alone never decide whose a file is: a file named
/// like run 1 of "exp" that records prefix "exp_1" is not exp's. Files written without a
/// manager, or by versions before the record, hold none; their name is the only evidence.
struct CheckpointOwner {
    std::string prefix;
    std::string run_prefix;
    std::string follows_run;  ///< exception saves: the run prefix of the regular files it continues
    friend bool operator==(const CheckpointOwner&, const CheckpointOwner&) = default;
};

/// A type whose named state can be loaded in place: state_dict() returns views of its tensors.
template <class T>
concept HasStateDict = requires(T& t) {
    { t.state_dict() } -> std::same_as<ParamDict>;
};

namespace detail {

inline std::int64_t unix_time_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

inline std::string hex64(std::uint64_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
    return s;
}

inline ChecksumError body_checksum_error(const std::string& path, std::uint64_t expected, std::uint64_t got,
                                         const char* extra = "") {
    return ChecksumError("checkpoint '" + path + "' is corrupt: body xxh3 is " + hex64(got) + ", the header says " +
                             hex64(expected) + extra,
                         path);
}

// The owner record is kept in entries whose names start with "__ckpt.": a manager refuses
// such names in a user's state, and loads leave them out of what they return.
inline constexpr std::string_view reserved_name_prefix = "__ckpt.";
inline constexpr std::string_view owner_prefix_entry = "__ckpt.prefix";
inline constexpr std::string_view owner_run_entry = "__ckpt.run";
inline constexpr std::string_view owner_follows_entry = "__ckpt.follows_run";

inline bool is_reserved_name(std::string_view name) { return name.starts_with(reserved_name_prefix); }

inline void record_owner(ParamDict& dict, const CheckpointOwner& owner) {
    dict.set(std::string(owner_prefix_entry), owner.prefix);
    dict.set(std::string(owner_run_entry), owner.run_prefix);
    if (!owner.follows_run.empty()) dict.set(std::string(owner_follows_entry), owner.follows_run);
}

/// The owner record among a table of contents' entries, or nothing when there is none.
inline std::optional<CheckpointOwner> owner_in(const std::vector<EntryMeta>& toc) {
    CheckpointOwner owner;
    bool found = false;
    for (const auto& e : toc) {
        const std::string* s = e.scalar.get_if<std::string>();
        if (!s || e.kind != ValueKind::string) continue;
        if (e.name == owner_prefix_entry) owner.prefix = *s, found = true;
        else if (e.name == owner_run_entry) owner.run_prefix = *s;
        else if (e.name == owner_follows_entry) owner.follows_run = *s;
    }
    if (!found) return std::nullopt;
    return owner;
}

inline void drop_reserved(ParamDict& dict) {
    std::vector<std::string> reserved;
    for (const auto& [name, value] : dict)
        if (is_reserved_name(name)) reserved.push_back(name);
    for (const auto& name : reserved) dict.erase(name);
}

struct OpenedCheckpoint {
    Fd fd;
    FileHeader header;
};

inline OpenedCheckpoint open_checkpoint(const std::string& path, const LoadOptions& opts) {
    OpenedCheckpoint c{open_for_read(path), {}};
    const std::uint64_t size = file_size(c.fd.get(), path);
    std::array<std::byte, header_size> raw{};
    const std::size_t got = read_full(c.fd.get(), raw.data(), raw.size(), path);
    c.header = decode_header(raw.data(), got, size, path);
    if (opts.archive && *opts.archive != c.header.archive)
        throw FormatError("checkpoint '" + path + "' is a " + std::string(archive_kind_name(c.header.archive)) +
                              " archive, expected " + std::string(archive_kind_name(*opts.archive)),
                          path);
    return c;
}

/// Reads the whole body into one aligned block and checks it against the header.
inline std::shared_ptr<std::byte> read_verified_body(OpenedCheckpoint& c, const std::string& path) {
    const std::uint64_t n = c.header.body_length;
    auto body = allocate_aligned(static_cast<std::size_t>(n));
    VerifiedReader reader(c.fd.get(), path, header_size, n);  // after body: joined first
    reader.read(reinterpret_cast<char*>(body.get()), static_cast<std::size_t>(n));
    if (const auto got = reader.digest(); got != c.header.body_hash) throw body_checksum_error(path, c.header.body_hash, got);
    return body;
}

/// The verified body with its codecs undone: what the archive wrote. An outermost stage that
/// can decode while the body is read (aes-256-gcm) does; a damaged body is still a
/// ChecksumError before it is any codec's error.
inline BodyBytes read_decoded_body(OpenedCheckpoint& c, const std::string& path, const LoadOptions& opts) {
    const FileHeader& h = c.header;
    if (!h.encoded()) return {read_verified_body(c, path), h.body_length};
    const DecodeContext ctx{path, header_associated_data(h), opts.key, opts.max_decoded_bytes};
    require_key(h, ctx);
    std::size_t outer = max_codec_stages;
    while (h.codecs[outer - 1] == CodecId::none) --outer;
    if (const auto read_decode = codec_impl(h.codecs[outer - 1], path, "reading").read_decode) {
        StreamDecoded got = read_decode(c.fd.get(), header_size, h.body_length, ctx);
        if (got.body.data) {
            if (got.stored_digest != h.body_hash) throw body_checksum_error(path, h.body_hash, got.stored_digest);
            if (got.failure) std::rethrow_exception(got.failure);
            return decode_body(h, std::move(got.body), ctx, outer - 1);
        }
    }
    return decode_body(h, {read_verified_body(c, path), h.body_length}, ctx);
}

template <class F>
decltype(auto) translating_archive_errors(const std::string& path, F&& f) {
    try {
        return f();
    } catch (const boost::archive::archive_exception& e) {
        throw FormatError("checkpoint '" + path + "' could not be parsed: " + e.what(), path);
    } catch (const boost::archive::iterators::dataflow_exception& e) {  // bad base64 in text or xml
        throw FormatError("checkpoint '" + path + "' could not be parsed: " + e.what(), path);
    } catch (const std::length_error& e) {  // a length read from the file beyond any string's
        throw FormatError("checkpoint '" + path + "' could not be parsed: " + e.what(), path);
    }
}

inline void reject_duplicates(const std::vector<EntryMeta>& toc, const std::string& path) {
    std::unordered_set<std::string_view> seen;
    for (const auto& e : toc)
        if (!seen.insert(e.name).second)
            throw FormatError("checkpoint '" + path + "' is malformed: entry '" + e.name + "' appears twice", path);
}

/// The text archive reads its signature as a length-prefixed string, allocating what the
/// length says before reading: check the signature first.
inline void check_text_signature(const std::byte* body, std::size_t n, const std::string& path) {
    constexpr std::string_view signature = "22 serialization::archive ";
    if (n < signature.size() || std::memcmp(body, signature.data(), signature.size()) != 0)
        throw FormatError("checkpoint '" + path + "' is malformed: the text body does not start with '" +
                              std::string(signature) + "'",
                          path);
}

/// Parses a verified in-memory body. Binary payloads that sit 64-byte aligned (all of ours)
/// become tensors aliasing the body block: no copy.
inline ParamDict parse_body(ArchiveKind kind, std::shared_ptr<std::byte> body, std::uint64_t n,
                            const std::string& path) {
    MemoryReader src(reinterpret_cast<char*>(body.get()), static_cast<std::size_t>(n));
    auto parse = [&](auto& ar) {
        BodyParser parser(ar, src, path);
        auto toc = parser.read_toc();
        reject_duplicates(toc, path);
        ParamDict dict;
        for (auto& e : toc) dict.set(e.name, e.kind == ValueKind::tensor ? Value(Tensor()) : std::move(e.scalar));
        for (const auto& e : toc) {
            if (e.kind != ValueKind::tensor) continue;
            parser.read_padding();
            Tensor& slot = dict.tensor(e.name);
            if constexpr (is_binary_archive_v<std::remove_reference_t<decltype(ar)>>) {
                char* at = src.current();
                if (reinterpret_cast<std::uintptr_t>(at) % payload_alignment == 0 && e.nbytes <= parser.remaining()) {
                    slot = Tensor::aliasing(e.dtype, e.shape, body, at);
                    src.skip(static_cast<std::size_t>(e.nbytes));
                    continue;
                }
            }
            slot = Tensor::uninitialized(e.dtype, e.shape);
            parser.read_payload(e, slot.data());
        }
        if constexpr (is_binary_archive_v<std::remove_reference_t<decltype(ar)>>)
            if (parser.remaining() != 0)
                parser.fail(std::to_string(parser.remaining()) + " bytes after the last entry");
        return dict;
    };
    return translating_archive_errors(path, [&]() -> ParamDict {
        switch (kind) {
            case ArchiveKind::binary: {
                boost::archive::binary_iarchive ar(src, boost::archive::no_header | boost::archive::no_codecvt);
                return parse(ar);
            }
            case ArchiveKind::text: {
                check_text_signature(body.get(), static_cast<std::size_t>(n), path);
                std::istream is(&src);
                is.imbue(std::locale::classic());
                boost::archive::text_iarchive ar(is);
                return parse(ar);
            }
            case ArchiveKind::xml: {
                std::istream is(&src);
                is.imbue(std::locale::classic());
                boost::archive::xml_iarchive ar(is);
                ParamDict dict = parse(ar);
                // The archive's destructor parses the closing tag, and a destructor cannot
                // report a bad one but by ending the process: check it here, then leave the
                // stream failed so that the destructor does not read it again.
                std::string rest((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
                const auto first = rest.find_first_not_of(" \t\r\n"), last = rest.find_last_not_of(" \t\r\n");
                if (first == std::string::npos || rest.compare(first, last - first + 1, "</boost_serialization>") != 0)
                    throw FormatError("checkpoint '" + path + "' is malformed: the xml body does not end with </boost_serialization>",
                                      path);
                is.setstate(std::ios::failbit);
                return dict;
            }
        }
        throw FormatError("checkpoint '" + path + "' has an unknown archive kind", path);
    });
}

/// The dtype of a 0-d tensor that can take a checkpoint value of kind `k` (a view of an
/// int64_t, a double or a bool), or nothing for strings and tensors.
inline std::optional<DType> scalar_dtype(ValueKind k) {
    switch (k) {
        case ValueKind::int64: return DType::int64;
        case ValueKind::float64: return DType::float64;
        case ValueKind::boolean: return DType::boolean;
        default: return std::nullopt;
    }
}

/// Writes a checkpoint value into the 0-d tensor planned for it (same dtype, checked).
inline void write_scalar(const Value& v, Tensor& dst) {
    if (const auto* i = v.get_if<std::int64_t>()) std::memcpy(dst.data(), i, sizeof *i);
    else if (const auto* d = v.get_if<double>()) std::memcpy(dst.data(), d, sizeof *d);
    else if (const auto* b = v.get_if<bool>()) std::memcpy(dst.data(), b, sizeof *b);
}

/// Matches the checkpoint's table of contents against the target: its tensors, its 0-d
/// tensors (views of scalars) for the checkpoint's int64, double and bool values, and a
/// ParamDict's own values of the same kind. When the target is an object's state_dict(), its
/// values are copies that nothing can write back (`values_are_copies`): each is reported as
/// not loaded, and a strict load fails naming it.
struct LoadPlan {
    LoadReport report;
    std::vector<Tensor*> destinations;  // per toc entry: target tensor to fill, or null
    std::vector<Value*> value_slots;    // per toc entry: target value to replace, or null
    std::vector<std::string> missing;     // target tensors absent from the checkpoint
    std::vector<std::string> unexpected;  // checkpoint tensors absent from the target
    std::vector<std::string> copies;      // target values that are copies: nothing can be written back
};

inline LoadPlan plan_load(ParamDict& target, const std::vector<EntryMeta>& toc, bool values_are_copies = false) {
    LoadPlan plan;
    plan.destinations.assign(toc.size(), nullptr);
    plan.value_slots.assign(toc.size(), nullptr);
    std::unordered_set<std::string_view> in_file;
    for (std::size_t i = 0; i < toc.size(); ++i) {
        const auto& e = toc[i];
        Value* slot = target.find(e.name);
        Tensor* t = slot ? slot->get_if<Tensor>() : nullptr;
        if (e.kind != ValueKind::tensor) {
            // a value goes into a view of a scalar of its type; other values go to report.rest
            if (slot && !t && !values_are_copies && slot->kind() == e.kind) plan.value_slots[i] = slot;
            const auto want = scalar_dtype(e.kind);
            if (!t || !want) continue;
            in_file.insert(e.name);
            if (t->dtype() == *want && t->rank() == 0) {
                plan.destinations[i] = t;
            } else {
                plan.report.mismatches.push_back("'" + e.name + "': checkpoint has the value " +
                                                 std::string(dtype_name(*want)) + ", target has " + t->describe());
                plan.report.ckpt_not_load.push_back(e.name);
                plan.report.param_not_load.push_back(e.name);
            }
            continue;
        }
        in_file.insert(e.name);
        if (!t) {
            plan.report.ckpt_not_load.push_back(e.name);
            plan.unexpected.push_back(e.name);
        } else if (t->dtype() != e.dtype || t->shape() != e.shape) {
            plan.report.mismatches.push_back("'" + e.name + "': checkpoint has " + std::string(dtype_name(e.dtype)) +
                                             shape_string(e.shape) + ", target has " + t->describe());
            plan.report.ckpt_not_load.push_back(e.name);
            plan.report.param_not_load.push_back(e.name);
        } else {
            plan.destinations[i] = t;
        }
    }
    for (const auto& [name, value] : target) {
        if (!value.is_tensor()) {
            if (values_are_copies) {
                plan.report.param_not_load.push_back(name);
                plan.copies.push_back(name);
            }
        } else if (!in_file.contains(name)) {
            plan.report.param_not_load.push_back(name);
            plan.missing.push_back(name);
        }
    }
    return plan;
}

inline std::string join_names(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
    return s;
}

inline LoadMismatch strict_failure(const std::string& source, const LoadPlan& plan) {
    std::string msg = "strict load from " + source + " failed:";
    if (!plan.missing.empty()) msg += " missing from the checkpoint: " + join_names(plan.missing) + ";";
    if (!plan.unexpected.empty()) msg += " not in the target: " + join_names(plan.unexpected) + ";";
    if (!plan.copies.empty())
        msg += " values in the target that a load cannot write back (copies, not views): " + join_names(plan.copies) +
               " (set a view instead, ckpt::view_of(variable), or load with strict = false and read them from the "
               "report's rest);";
    for (const auto& m : plan.report.mismatches) msg += " dtype/shape mismatch " + m + ";";
    msg.pop_back();
    return LoadMismatch(msg);
}

}  // namespace detail

namespace detail {
/// Reads a body's table of contents from `src` and stops there. `first` holds the body's
/// first bytes (up to 32), for the text signature check.
template <class Source>
std::vector<EntryMeta> read_toc(ArchiveKind kind, Source& src, std::span<const std::byte> first, const std::string& path) {
    std::vector<EntryMeta> entries;
    auto read = [&](auto& ar) {
        BodyParser parser(ar, src, path);
        entries = parser.read_toc();
        reject_duplicates(entries, path);
    };
    translating_archive_errors(path, [&] {
        switch (kind) {
            case ArchiveKind::binary: {
                boost::archive::binary_iarchive ar(src, boost::archive::no_header | boost::archive::no_codecvt);
                read(ar);
                break;
            }
            case ArchiveKind::text:
            case ArchiveKind::xml: {
                if (kind == ArchiveKind::text) check_text_signature(first.data(), first.size(), path);
                std::istream is(&src);
                is.imbue(std::locale::classic());
                // The archives read on in their destructors (xml: its closing tag, which a
                // destructor can only report by ending the process): a failed stream stops them.
                auto stop_reading = [&] { is.setstate(std::ios::failbit); };
                if (kind == ArchiveKind::text) {
                    boost::archive::text_iarchive ar(is);
                    read(ar);
                    stop_reading();
                } else {
                    boost::archive::xml_iarchive ar(is);
                    read(ar);
                    stop_reading();
                }
                break;
            }
        }
    });
    return entries;
}
}  // namespace detail

namespace detail {
/// What a reader would refuse, refused before anything is written.
/// The table of contents of a decoded body (read_decoded_body).
inline std::vector<EntryMeta> decoded_toc(ArchiveKind kind, const BodyBytes& body, const std::string& path) {
    MemoryReader src(reinterpret_cast<char*>(body.data.get()), static_cast<std::size_t>(body.size));
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(32, body.size));
    return read_toc(kind, src, {body.data.get(), n}, path);
}

inline void check_savable(const ParamDict& dict, ArchiveKind archive, const std::string& path) {
    for (const auto& [name, value] : dict) {
        if (const Tensor* t = value.get_if<Tensor>(); t && t->rank() > max_tensor_rank)
            throw ConfigError("cannot save '" + path + "': tensor '" + name + "' has rank " + std::to_string(t->rank()) +
                              " (at most " + std::to_string(max_tensor_rank) + ")");
        // Boost's text and xml archives write "nan" and "inf" but cannot read them back.
        if (const double* d = value.get_if<double>(); d && !std::isfinite(*d) && archive != ArchiveKind::binary)
            throw ConfigError("cannot save '" + path + "': value '" + name + "' is " + std::to_string(*d) + "; a " +
                              std::string(archive_kind_name(archive)) +
                              " archive cannot hold a non-finite double (use the binary archive)");
    }
}
}  // namespace detail

/// Writes `dict` to `file` atomically and durably (see detail/atomic_file.hpp). On any error
/// the previous file at `file`, if any, is untouched and no temporary is left behind.
inline void save_checkpoint(const ParamDict& dict, const PathArg& file, const SaveOptions& opts = {}) {
    const std::string path = file.string();
    detail::check_savable(dict, opts.archive, path);
    detail::check_chain(opts.codecs, path);
    FileHeader h;
    h.archive = opts.archive;
    h.epoch = opts.epoch;
    h.step = opts.step;
    h.save_time_ns = detail::unix_time_ns();  // before the body: a codec may authenticate it
    if (!opts.codecs.empty()) h.version = format_version;
    for (std::size_t i = 0; i < opts.codecs.size(); ++i) h.codecs[i] = opts.codecs[i].id;
    detail::AtomicFile out(file, opts.overwrite);
    const std::array<std::byte, header_size> placeholder{};
    detail::write_all(out.fd(), placeholder.data(), placeholder.size(), path);
    std::optional<detail::FileSink> stored;  // with codecs: where the chain's output is hashed and written
    std::optional<detail::EncoderChain> encoders;
    if (!opts.codecs.empty()) {
        stored.emplace(out.fd(), path, header_size);
        encoders.emplace(opts.codecs, *stored, EncodeContext{path, header_associated_data(h)});
    }
    // Binary archives pass payloads and long strings of `dict` straight through (save_binary).
    detail::BodyWriter writer(out.fd(), path, encoders ? &encoders->head() : nullptr,
                              opts.archive == ArchiveKind::binary);
    try {
        auto position = [&] { return writer.position(); };
        switch (opts.archive) {
            case ArchiveKind::binary: {
                boost::archive::binary_oarchive ar(writer, boost::archive::no_header | boost::archive::no_codecvt);
                detail::write_body(ar, dict, position);
                break;
            }
            case ArchiveKind::text: {
                std::ostream os(&writer);
                os.imbue(std::locale::classic());  // numbers as FORMAT.md writes them, whatever the global locale
                {
                    boost::archive::text_oarchive ar(os);
                    detail::write_body(ar, dict, position);
                }
                os.flush();
                break;
            }
            case ArchiveKind::xml: {
                std::ostream os(&writer);
                os.imbue(std::locale::classic());  // numbers as FORMAT.md writes them, whatever the global locale
                {
                    boost::archive::xml_oarchive ar(os);
                    detail::write_body(ar, dict, position);
                }
                os.flush();
                break;
            }
        }
    } catch (...) {
        writer.rethrow_pending();  // the underlying I/O error says more than the archive's
        throw;
    }
    writer.finish();
    if (encoders) {
        encoders->head().finish();
        h.body_length = stored->written();
        h.body_hash = stored->digest();
    } else {
        h.body_length = writer.position();
        h.body_hash = writer.digest();
    }
    const auto bytes = encode_header(h);
    detail::pwrite_all(out.fd(), bytes.data(), bytes.size(), 0, path);
    out.commit();
}

/// Reads and checks the header only (64 bytes): cheap, but says nothing about the body.
inline FileHeader read_header(const PathArg& file) {
    return detail::open_checkpoint(file.string(), {}).header;
}

namespace detail {
/// read_contents() of an opened file, or, with `decode_encoded` false, only its header for a
/// body that passed through codecs (entries left empty): what a cheap look at a file costs.
inline CheckpointContents contents_of(OpenedCheckpoint& c, const std::string& path, const LoadOptions& opts,
                                      bool decode_encoded) {
    CheckpointContents out{c.header, {}};
    if (c.header.encoded()) {  // a codec's output cannot be read from the middle: decode it all
        if (decode_encoded) out.entries = decoded_toc(c.header.archive, read_decoded_body(c, path, opts), path);
        return out;
    }
    UncheckedBodyReader src(c.fd.get(), path, c.header.body_length);
    std::array<std::byte, 32> first{};
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(first.size(), c.header.body_length));
    if (c.header.archive == ArchiveKind::text)
        pread_exact(c.fd.get(), reinterpret_cast<char*>(first.data()), n, header_size, path);
    out.entries = read_toc(c.header.archive, src, {first.data(), n}, path);
    return out;
}
}  // namespace detail

/// Reads the header and the table of contents, never the tensor payloads: cheap for a file of
/// any size. The body checksum is not checked (that needs every byte; verify_checkpoint).
/// A body that passed through codecs is the exception: it is read, verified and decoded whole
/// (an encrypted one needs opts.key).
inline CheckpointContents read_contents(const PathArg& file, const LoadOptions& opts = {}) {
    const std::string path = file.string();
    auto c = detail::open_checkpoint(path, opts);
    return detail::contents_of(c, path, opts, true);
}

/// Reads the whole file and checks header and body checksum; throws if anything is wrong.
inline FileHeader verify_checkpoint(const PathArg& file, const LoadOptions& opts = {}) {
    const std::string path = file.string();
    auto c = detail::open_checkpoint(path, opts);
    constexpr std::size_t chunk = 4u << 20;
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, c.header.body_length));
    // One is read into while the other is hashed; two blocks, so that neither is larger than the file.
    const std::unique_ptr<char[]> buffers[2] = {std::unique_ptr<char[]>(new char[size]),
                                                std::unique_ptr<char[]>(new char[size])};
    detail::VerifiedReader reader(c.fd.get(), path, header_size, c.header.body_length);  // after: joined first
    std::uint64_t tickets[2] = {0, 0};
    for (int i = 0; reader.remaining() > 0; i ^= 1) {
        reader.wait(tickets[i]);
        const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(size, reader.remaining()));
        tickets[i] = reader.read(buffers[i].get(), len);
    }
    if (const auto got = reader.digest(); got != c.header.body_hash)
        throw detail::body_checksum_error(path, c.header.body_hash, got);
    return c.header;
}

/// Loads every entry into a new ParamDict. The body is verified before anything in it is
/// parsed; binary payloads are not copied again after the read.
inline ParamDict load_checkpoint(const PathArg& file, const LoadOptions& opts = {}) {
    const std::string path = file.string();
    auto c = detail::open_checkpoint(path, opts);
    auto body = detail::read_decoded_body(c, path, opts);
    ParamDict dict = detail::parse_body(c.header.archive, std::move(body.data), body.size, path);
    detail::drop_reserved(dict);
    return dict;
}

namespace detail {
/// load_param_into_net(); an object's state_dict() values are copies (`values_are_copies`).
inline LoadReport load_param_into(ParamDict& target, const ParamDict& src, bool strict, bool values_are_copies) {
    std::vector<detail::EntryMeta> toc;
    for (const auto& [name, value] : src) {
        detail::EntryMeta e;
        e.name = name;
        e.kind = value.kind();
        if (const Tensor* t = value.get_if<Tensor>()) {
            e.dtype = t->dtype();
            e.shape = t->shape();
        }
        toc.push_back(std::move(e));
    }
    auto plan = detail::plan_load(target, toc, values_are_copies);
    if (strict && !plan.report.complete()) throw detail::strict_failure("a ParamDict", plan);
    auto it = src.begin();
    for (std::size_t i = 0; i < toc.size(); ++i, ++it) {
        if (Tensor* dst = plan.destinations[i]) {
            if (const Tensor* from = it->value.get_if<Tensor>()) {
                if (dst->data() != from->data() && from->nbytes()) std::memcpy(dst->data(), from->data(), from->nbytes());
            } else {
                detail::write_scalar(it->value, *dst);
            }
        } else if (Value* slot = plan.value_slots[i]) {
            *slot = it->value;
        } else {
            plan.report.rest.set(it->name, it->value);
        }
    }
    return plan.report;
}
}  // namespace detail

/// Copies the tensors of `src` into the same-named tensors of `target` (often views of a
/// network's parameters), its int64, double and bool values into views of scalars, and
/// values into the target's values of the same kind. Other entries of `src` go to
/// report.rest. Strict: any missing, unexpected or mismatched tensor throws LoadMismatch
/// naming all of them, before anything is copied.
inline LoadReport load_param_into_net(ParamDict& target, const ParamDict& src, bool strict = false) {
    return detail::load_param_into(target, src, strict, false);
}


/// Into an object's state_dict(): its values are copies, which nothing can write back (a
/// strict load names them; use views of scalars, ckpt::view_of).
template <HasStateDict T>
LoadReport load_param_into_net(T& net, const ParamDict& src, bool strict = false) {
    ParamDict views = net.state_dict();
    return detail::load_param_into(views, src, strict, true);
}

namespace detail {

/// Parses a binary body from `src` (BodyReader, or a codec's PlainBodyStream) straight into
/// `target`'s tensors, then checks the stored bytes' checksum and any decoding failure.
template <class Source>
LoadReport load_binary_into(Source& src, const FileHeader& header, const std::string& path, ParamDict& target,
                            bool strict, bool values_are_copies) {
    // A parse or decoding error in a body whose checksum also fails is reported as the
    // corruption it is.
    auto corruption_instead = [&](const char* extra) -> std::optional<ChecksumError> {
        const std::uint64_t got = src.drain_and_digest();
        if (got != header.body_hash) return body_checksum_error(path, header.body_hash, got, extra);
        return std::nullopt;
    };
    // Out here, the tensors made for entries the target lacks outlive the reads into them.
    std::vector<EntryMeta> toc;
    LoadPlan plan;
    try {
        translating_archive_errors(path, [&] {
            boost::archive::binary_iarchive ar(src, boost::archive::no_header | boost::archive::no_codecvt);
            BodyParser parser(ar, src, path);
            toc = parser.read_toc();
            reject_duplicates(toc, path);
            plan = plan_load(target, toc, values_are_copies);
            if (strict && !plan.report.complete()) {
                if (auto e = corruption_instead("")) throw *e;
                throw strict_failure("'" + path + "'", plan);
            }
            for (std::size_t i = 0; i < toc.size(); ++i) {
                auto& e = toc[i];
                if (e.kind != ValueKind::tensor) {
                    if (Tensor* dst = plan.destinations[i]) write_scalar(e.scalar, *dst);
                    else if (Value* slot = plan.value_slots[i]) *slot = std::move(e.scalar);
                    else if (!is_reserved_name(e.name)) plan.report.rest.set(e.name, std::move(e.scalar));
                    continue;
                }
                parser.read_padding();
                if (Tensor* dst = plan.destinations[i]) {
                    parser.read_payload(e, dst->data());
                } else {
                    Tensor fresh = Tensor::uninitialized(e.dtype, e.shape);
                    parser.read_payload(e, fresh.data());
                    plan.report.rest.set(e.name, std::move(fresh));
                }
            }
            if (parser.remaining() != 0) parser.fail(std::to_string(parser.remaining()) + " bytes after the last entry");
        });
    } catch (const FormatError&) {
        if (auto e = corruption_instead("; the target tensors may hold partial data")) throw *e;
        throw;
    } catch (...) {
        src.settle();
        throw;
    }
    if (auto e = corruption_instead("; the target tensors may hold partial data")) throw *e;
    if constexpr (std::is_base_of_v<PlainBodyStream, Source>)
        if (auto failed = src.failure()) std::rethrow_exception(failed);
    return std::move(plan.report);
}

}  // namespace detail

/// Loads straight into the memory of `target`'s tensors. Binary archives stream from the file
/// into them, an aes-256-gcm body too (each segment decrypted in place there); text and xml,
/// and bodies that passed through other codecs, go through a verified in-memory copy. The
/// body checksum is checked at the end: if it fails (ChecksumError), or an encrypted segment
/// fails authentication (AuthenticationError), the target tensors may hold partial data, so
/// reload them from another checkpoint. Strict mode checks names, dtypes and shapes against
/// the file's table of contents before writing any payload.
namespace detail {
inline LoadReport load_file_into(const PathArg& file, ParamDict& target, bool strict, const LoadOptions& opts,
                                 bool values_are_copies) {
    const std::string path = file.string();
    auto c = detail::open_checkpoint(path, opts);
    const FileHeader& h = c.header;
    if (h.archive == ArchiveKind::binary && !h.encoded()) {
        detail::BodyReader src(c.fd.get(), path, h.body_length);
        return detail::load_binary_into(src, h, path, target, strict, values_are_copies);
    }
    if (h.archive == ArchiveKind::binary && h.codecs[1] == CodecId::none) {  // one stage
        const DecodeContext ctx{path, header_associated_data(h), opts.key, opts.max_decoded_bytes};
        detail::require_key(h, ctx);
        if (const auto open_stream = detail::codec_impl(h.codecs[0], path, "reading").open_stream)
            if (auto src = open_stream(c.fd.get(), header_size, h.body_length, ctx))
                return detail::load_binary_into(*src, h, path, target, strict, values_are_copies);
    }
    auto body = detail::read_decoded_body(c, path, opts);
    ParamDict dict = detail::parse_body(h.archive, std::move(body.data), body.size, path);
    detail::drop_reserved(dict);
    return detail::load_param_into(target, dict, strict, values_are_copies);
}
}  // namespace detail

/// A ParamDict target's own values (int64, double, bool, string) are replaced by the
/// checkpoint's of the same name and kind.
inline LoadReport load_checkpoint_into(const PathArg& file, ParamDict& target, bool strict = false,
                                       const LoadOptions& opts = {}) {
    return detail::load_file_into(file, target, strict, opts, false);
}

/// Into an object's state_dict(): its values are copies, which nothing can write back (a
/// strict load names them, before anything is loaded; use views of scalars, ckpt::view_of).
template <HasStateDict T>
LoadReport load_checkpoint_into(const PathArg& file, T& net, bool strict = false, const LoadOptions& opts = {}) {
    ParamDict views = net.state_dict();
    return detail::load_file_into(file, views, strict, opts, true);
}

}  // namespace ckpt
