#pragma once
// Definitions of checkpoint.hpp: compiled in every file that includes it, or once in the
// library with CKPT_SEPARATE_COMPILATION (detail/linkage.hpp).

#include <boost/archive/archive_exception.hpp>
#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <istream>
#include <iterator>
#include <locale>
#include <ostream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "../checkpoint.hpp"
#include "../detail/atomic_file.hpp"
#include "../detail/body.hpp"
#include "../detail/hash.hpp"
#include "../detail/streams.hpp"

namespace ckpt {

namespace detail {

CKPT_INLINE std::int64_t unix_time_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

CKPT_INLINE std::string hex64(std::uint64_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
    return s;
}

CKPT_INLINE ChecksumError body_checksum_error(const std::string& path, std::uint64_t expected, std::uint64_t got,
                                              const char* extra = "") {
    return ChecksumError("checkpoint '" + path + "' is corrupt: body xxh3 is " + hex64(got) + ", the header says " +
                             hex64(expected) + extra,
                         path);
}

CKPT_INLINE void record_owner(ParamDict& dict, const CheckpointOwner& owner) {
    dict.set(std::string(owner_prefix_entry), owner.prefix);
    dict.set(std::string(owner_run_entry), owner.run_prefix);
    if (!owner.follows_run.empty()) dict.set(std::string(owner_follows_entry), owner.follows_run);
}

/// The owner record among a table of contents' entries, or nothing when there is none.
CKPT_INLINE std::optional<CheckpointOwner> owner_in(const std::vector<EntryMeta>& toc) {
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

CKPT_INLINE std::optional<std::string> share_in(const std::vector<EntryMeta>& toc) {
    for (const auto& e : toc)
        if (const std::string* s = e.scalar.get_if<std::string>(); s && e.name == share_record_entry) return *s;
    return std::nullopt;
}

/// `m`, and when the file (`toc`) is one rank's share of a step, what it is: a load of it
/// alone cannot fill a whole state.
CKPT_INLINE LoadMismatch with_share_record(const LoadMismatch& m, const std::vector<EntryMeta>& toc) {
    const auto share = share_in(toc);
    if (!share) return m;
    return LoadMismatch(std::string(m.what()) + ". The file is " + *share);
}

CKPT_INLINE std::vector<std::string> record_metrics(ParamDict& dict, const Metrics& metrics) {
    std::vector<std::string> left_out;
    for (const auto& [name, value] : metrics) {
        if (name.empty()) throw ConfigError("a metric needs a name (Progress::metrics)");
        if (!std::isfinite(value)) {
            left_out.push_back(name);
            continue;
        }
        dict.set(std::string(metric_entry_prefix) + name, value);
    }
    return left_out;
}

CKPT_INLINE std::map<std::string, double> recorded_metrics(const std::vector<EntryMeta>& toc) {
    std::map<std::string, double> recorded;
    for (const auto& e : toc)
        if (const double* d = e.scalar.get_if<double>();
            d && e.kind == ValueKind::float64 && std::string_view(e.name).starts_with(metric_entry_prefix))
            recorded[e.name.substr(metric_entry_prefix.size())] = *d;
    return recorded;
}

CKPT_INLINE std::map<std::string, double> metrics_in(const std::vector<EntryMeta>& toc) {
    std::map<std::string, double> metrics = recorded_metrics(toc);
    for (const auto& e : toc) {
        if (is_reserved_name(e.name)) continue;
        // emplace: a recorded metric of the same name stays
        if (const double* d = e.scalar.get_if<double>(); d && e.kind == ValueKind::float64)
            metrics.emplace(e.name, *d);
        else if (const auto* i = e.scalar.get_if<std::int64_t>(); i && e.kind == ValueKind::int64)
            metrics.emplace(e.name, static_cast<double>(*i));
    }
    return metrics;
}

CKPT_INLINE void drop_reserved(ParamDict& dict) {
    // one pass: erasing names one by one re-indexes the dict each time, and a file of many
    // reserved names would cost the square of their number
    if (std::none_of(dict.begin(), dict.end(), [](const ParamDict::Entry& e) { return is_reserved_name(e.name); }))
        return;
    ParamDict kept;
    for (auto& [name, value] : dict)
        if (!is_reserved_name(name)) kept.set(name, std::move(value));
    dict = std::move(kept);
}

CKPT_INLINE OpenedCheckpoint open_checkpoint(const std::string& path, const LoadOptions& opts) {
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
CKPT_INLINE std::shared_ptr<std::byte> read_verified_body(OpenedCheckpoint& c, const std::string& path) {
    const std::uint64_t n = c.header.body_length;
    auto body = allocate_aligned(static_cast<std::size_t>(n));
    VerifiedReader reader(c.fd.get(), path, header_size, n);  // after body: joined first
    reader.read(reinterpret_cast<char*>(body.get()), static_cast<std::size_t>(n));
    if (const auto got = reader.digest(); got != c.header.body_hash) throw body_checksum_error(path, c.header.body_hash, got);
    return body;
}

/// What decoding the body of `h` needs: its key, and its budget (LoadOptions::max_decoded_bytes,
/// or the default for a body of its stored length).
CKPT_INLINE DecodeContext decode_context(const std::string& path, const FileHeader& h, const LoadOptions& opts) {
    return {path, header_associated_data(h), opts.key, decoded_budget(opts.max_decoded_bytes, h.body_length),
            budget_origin(opts.max_decoded_bytes, h.body_length, "LoadOptions::max_decoded_bytes")};
}

/// The verified body with its codecs undone: what the archive wrote. An outermost stage that
/// can decode while the body is read (aes-256-gcm) does; a damaged body is still a
/// ChecksumError before it is any codec's error.
CKPT_INLINE BodyBytes read_decoded_body(OpenedCheckpoint& c, const std::string& path, const LoadOptions& opts) {
    const FileHeader& h = c.header;
    if (!h.encoded()) return {read_verified_body(c, path), h.body_length};
    const DecodeContext ctx = decode_context(path, h, opts);
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
        throw FormatError("checkpoint '" + path + "' is malformed: it could not be parsed: " + e.what(), path);
    } catch (const boost::archive::iterators::dataflow_exception& e) {  // bad base64 in text or xml
        throw FormatError("checkpoint '" + path + "' is malformed: it could not be parsed: " + e.what(), path);
    } catch (const std::length_error& e) {  // a length read from the file beyond any string's
        throw FormatError("checkpoint '" + path + "' is malformed: it could not be parsed: " + e.what(), path);
    }
}

CKPT_INLINE void reject_duplicates(const std::vector<EntryMeta>& toc, const std::string& path) {
    std::unordered_set<std::string_view> seen;
    for (const auto& e : toc)
        if (!seen.insert(e.name).second)
            throw FormatError("checkpoint '" + path + "' is malformed: entry '" + e.name + "' appears twice", path);
}

/// The text archive reads its signature as a length-prefixed string, allocating what the
/// length says before reading: check the signature first.
CKPT_INLINE void check_text_signature(const std::byte* body, std::size_t n, const std::string& path) {
    constexpr std::string_view signature = "22 serialization::archive ";
    if (n < signature.size() || std::memcmp(body, signature.data(), signature.size()) != 0)
        throw FormatError("checkpoint '" + path + "' is malformed: the text body does not start with '" +
                              std::string(signature) + "'",
                          path);
}

/// Parses a verified in-memory body. Binary payloads that sit 64-byte aligned (all of ours)
/// become tensors aliasing the body block: no copy.
CKPT_INLINE ParamDict parse_body(const FileHeader& header, std::shared_ptr<std::byte> body, std::uint64_t n,
                                 const std::string& path) {
    const ArchiveKind kind = header.archive;
    MemoryReader src(reinterpret_cast<char*>(body.get()), static_cast<std::size_t>(n));
    // `source`: src, or for xml the check in front of it (XmlEntityCheck)
    auto parse = [&](auto& ar, auto& source) {
        BodyParser parser(ar, source, path, header.chunked());
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
                    slot = Tensor::aliasing(e.dtype, e.logical_shape(), body, at, e.order);
                    src.skip(static_cast<std::size_t>(e.nbytes));
                    continue;
                }
            }
            slot = Tensor::uninitialized(e.dtype, e.logical_shape(), e.order);
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
                return parse(ar, src);
            }
            case ArchiveKind::text: {
                check_text_signature(body.get(), static_cast<std::size_t>(n), path);
                std::istream is(&src);
                is.imbue(std::locale::classic());
                boost::archive::text_iarchive ar(is);
                return parse(ar, src);
            }
            case ArchiveKind::xml: {
                XmlEntityCheck checked(src, path);
                try {
                    std::istream is(&checked);
                    is.imbue(std::locale::classic());
                    boost::archive::xml_iarchive ar(is);
                    ParamDict dict = parse(ar, checked);
                    // The archive's destructor parses the closing tag, and a destructor cannot
                    // report a bad one but by ending the process: check it here, then leave the
                    // stream failed so that the destructor does not read it again.
                    std::string rest((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
                    checked.rethrow_refusal();
                    const auto first = rest.find_first_not_of(" \t\r\n"), last = rest.find_last_not_of(" \t\r\n");
                    if (first == std::string::npos || rest.compare(first, last - first + 1, "</boost_serialization>") != 0)
                        throw FormatError("checkpoint '" + path +
                                              "' is malformed: the xml body does not end with </boost_serialization>",
                                          path);
                    is.setstate(std::ios::failbit);
                    return dict;
                } catch (...) {
                    checked.rethrow_refusal();  // what made the archive fail
                    throw;
                }
            }
        }
        throw FormatError("checkpoint '" + path + "' has an unknown archive kind", path);
    });
}

/// The dtype of a 0-d tensor that can take a checkpoint value of kind `k` (a view of an
/// int64_t, a double or a bool), or nothing for strings and tensors.
CKPT_INLINE std::optional<DType> scalar_dtype(ValueKind k) {
    switch (k) {
        case ValueKind::int64: return DType::int64;
        case ValueKind::float64: return DType::float64;
        case ValueKind::boolean: return DType::boolean;
        default: return std::nullopt;
    }
}

/// Writes a checkpoint value into the 0-d tensor planned for it (same dtype, checked).
CKPT_INLINE void write_scalar(const Value& v, Tensor& dst) {
    if (const auto* i = v.get_if<std::int64_t>()) std::memcpy(dst.data(), i, sizeof *i);
    else if (const auto* d = v.get_if<double>()) std::memcpy(dst.data(), d, sizeof *d);
    else if (const auto* b = v.get_if<bool>()) std::memcpy(dst.data(), b, sizeof *b);
}

/// Copies the values of `from` into `to`, a tensor of the same dtype and logical shape (a
/// checked plan): the bytes as they are when both lie in the same order, else each element to
/// its place in the other order, so that a matrix is never taken for its transpose.
CKPT_INLINE void copy_values(const Tensor& from, Tensor& to) {
    if (to.data() == from.data() || from.nbytes() == 0) return;
    if (from.order() == to.order()) std::memcpy(to.data(), from.data(), from.nbytes());
    else reverse_axes(from.data(), to.data(), from.shape(), itemsize(from.dtype()));
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
    std::vector<const Binding*> bindings;  // per toc entry: bound variable to write back, or null
    std::vector<std::string> missing;     // target tensors absent from the checkpoint
    std::vector<std::string> unexpected;  // checkpoint tensors absent from the target
    std::vector<std::string> copies;      // target values that are copies: nothing can be written back
};

CKPT_INLINE LoadPlan plan_load(ParamDict& target, const std::vector<EntryMeta>& toc, bool values_are_copies = false) {
    LoadPlan plan;
    plan.destinations.assign(toc.size(), nullptr);
    plan.value_slots.assign(toc.size(), nullptr);
    plan.bindings.assign(toc.size(), nullptr);
    std::unordered_set<std::string_view> in_file;
    for (std::size_t i = 0; i < toc.size(); ++i) {
        const auto& e = toc[i];
        Value* slot = target.find(e.name);
        Tensor* t = slot ? slot->get_if<Tensor>() : nullptr;
        if (const Binding* b = slot ? slot->get_if<Binding>() : nullptr) {
            in_file.insert(e.name);
            if (b->target().kind() == e.kind) {
                plan.bindings[i] = b;
            } else {
                plan.report.mismatches.push_back("'" + e.name + "': checkpoint has " +
                                                 (e.kind == ValueKind::tensor ? "a tensor" : e.scalar.type_name()) +
                                                 ", target has " + slot->type_name());
                plan.report.ckpt_not_load.push_back(e.name);
                plan.report.param_not_load.push_back(e.name);
            }
            continue;
        }
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
        } else if (t->dtype() != e.dtype || t->logical_shape() != e.logical_shape()) {
            // the orders too, when either is column-major: a matrix and its transpose look alike
            const bool orders = e.order == Order::column_major || t->order() == Order::column_major;
            auto layout = [&](DType dtype, const Shape& shape, Order order) {
                return std::string(dtype_name(dtype)) + shape_string(shape) +
                       (orders ? " " + std::string(order_name(order)) : std::string());
            };
            plan.report.mismatches.push_back("'" + e.name + "': checkpoint has " + layout(e.dtype, e.logical_shape(), e.order) +
                                             ", target has " + layout(t->dtype(), t->logical_shape(), t->order()));
            plan.report.ckpt_not_load.push_back(e.name);
            plan.report.param_not_load.push_back(e.name);
        } else {
            plan.destinations[i] = t;
        }
    }
    for (const auto& [name, value] : target) {
        if (value.is_binding()) {
            if (!in_file.contains(name)) {
                plan.report.param_not_load.push_back(name);
                plan.missing.push_back(name);
            }
        } else if (!value.is_tensor()) {
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

CKPT_INLINE std::string join_names(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
    return s;
}

CKPT_INLINE LoadMismatch strict_failure(const std::string& source, const LoadPlan& plan) {
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

/// Decodes the checkpoint's value of every bound variable of the plan into a copy, before
/// anything is written: returns what writes the copies back. A value that cannot be its
/// variable's is a LoadMismatch naming `source` (the file, quoted, or "a ParamDict") when
/// `strict`, else a mismatch of the report (the value goes to report.rest).
CKPT_INLINE std::vector<std::function<void()>> stage_bindings(LoadPlan& plan, const std::vector<EntryMeta>& toc,
                                                              bool strict, const std::string& source) {
    std::vector<std::function<void()>> commits;
    for (std::size_t i = 0; i < toc.size(); ++i) {
        const Binding* b = plan.bindings[i];
        if (!b) continue;
        try {
            commits.push_back(b->target().stage(toc[i].scalar, toc[i].name));
        } catch (const LoadMismatch& e) {
            if (strict) throw LoadMismatch("loading " + source + ": " + e.what());
            plan.bindings[i] = nullptr;
            plan.report.mismatches.push_back(e.what());
            plan.report.ckpt_not_load.push_back(toc[i].name);
            plan.report.param_not_load.push_back(toc[i].name);
        }
    }
    return commits;
}

}  // namespace detail

namespace detail {
/// Reads a body's table of contents from `src` and stops there. `first` holds the body's
/// first bytes (up to 32), for the text signature check.
template <class Source>
std::vector<EntryMeta> read_toc(const FileHeader& header, Source& src, std::span<const std::byte> first,
                                const std::string& path) {
    const ArchiveKind kind = header.archive;
    std::vector<EntryMeta> entries;
    // `source`: src, or for xml the check in front of it (XmlEntityCheck)
    auto read = [&](auto& ar, auto& source) {
        BodyParser parser(ar, source, path, header.chunked());
        entries = parser.read_toc();
        reject_duplicates(entries, path);
    };
    translating_archive_errors(path, [&] {
        switch (kind) {
            case ArchiveKind::binary: {
                boost::archive::binary_iarchive ar(src, boost::archive::no_header | boost::archive::no_codecvt);
                read(ar, src);
                break;
            }
            case ArchiveKind::text: {
                check_text_signature(first.data(), first.size(), path);
                std::istream is(&src);
                is.imbue(std::locale::classic());
                boost::archive::text_iarchive ar(is);
                read(ar, src);
                is.setstate(std::ios::failbit);  // the archive reads on in its destructor: a failed stream stops it
                break;
            }
            case ArchiveKind::xml: {
                XmlEntityCheck checked(src, path);
                try {
                    std::istream is(&checked);
                    is.imbue(std::locale::classic());
                    boost::archive::xml_iarchive ar(is);
                    read(ar, checked);
                    checked.rethrow_refusal();
                    // the archive's destructor parses its closing tag, and can report a bad one
                    // only by ending the process: a failed stream stops it
                    is.setstate(std::ios::failbit);
                } catch (...) {
                    checked.rethrow_refusal();  // what made the archive fail
                    throw;
                }
                break;
            }
        }
    });
    return entries;
}
}  // namespace detail

namespace detail {
CKPT_INLINE std::vector<EntryMeta> decoded_toc(const FileHeader& header, const BodyBytes& body, const std::string& path) {
    MemoryReader src(reinterpret_cast<char*>(body.data.get()), static_cast<std::size_t>(body.size));
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(32, body.size));
    return read_toc(header, src, {body.data.get(), n}, path);
}

CKPT_INLINE void check_savable(const ParamDict& dict, ArchiveKind archive, const std::string& path) {
    for (const auto& [name, value] : dict) {
        // the writer's own records of storage order: one in the state would misdescribe a tensor
        if (std::string_view(name).starts_with(order_record_prefix))
            throw ConfigError("cannot save '" + path + "': the entry name '" + name + "' starts with '" +
                              std::string(order_record_prefix) +
                              "', which the writer uses to record a tensor's storage order (a column-major "
                              "tensor gets its record by itself)");
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

CKPT_INLINE void save_checkpoint(const ParamDict& state, const PathArg& file, const SaveOptions& opts) {
    const std::string path = file.string();
    // bound variables are read once, here, before anything is written
    std::optional<ParamDict> read;
    if (detail::has_bindings(state)) read = detail::materialized(state, detail::boost_encoding(opts.archive));
    const ParamDict& dict = read ? *read : state;
    detail::check_savable(dict, opts.archive, path);
    detail::check_chain(opts.codecs, path);
    FileHeader h;
    h.archive = opts.archive;
    h.epoch = opts.epoch;
    h.step = opts.step;
    h.save_time_ns = detail::unix_time_ns();  // before the body: a codec may authenticate it
    const bool chunked = opts.archive == ArchiveKind::binary && opts.codecs.empty() && opts.chunk_bytes != 0;
    if (chunked && !valid_chunk_bytes(opts.chunk_bytes))
        throw ConfigError("cannot save '" + path + "': chunk_bytes " + std::to_string(opts.chunk_bytes) +
                          " is not a power of two from " + std::to_string(min_chunk_bytes) + " to " +
                          std::to_string(max_chunk_bytes) + " (or 0, for a version 1 file)");
    if (!opts.codecs.empty()) h.version = format_version_codecs;
    else if (chunked) h.version = format_version_chunked;
    detail::ChunkTable chunks;
    if (chunked)
        chunks = detail::hash_chunks(dict, opts.chunk_bytes,
                                     opts.hash_threads ? opts.hash_threads : std::max(1u, std::thread::hardware_concurrency()));
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
        auto digest = [&] { return writer.digest_so_far(); };
        switch (opts.archive) {
            case ArchiveKind::binary: {
                boost::archive::binary_oarchive ar(writer, boost::archive::no_header | boost::archive::no_codecvt);
                detail::write_body(ar, dict, position, chunks, digest);
                break;
            }
            case ArchiveKind::text: {
                std::ostream os(&writer);
                os.imbue(std::locale::classic());  // numbers as FORMAT.md writes them, whatever the global locale
                {
                    boost::archive::text_oarchive ar(os);
                    detail::write_body(ar, dict, position, chunks, digest);
                }
                os.flush();
                break;
            }
            case ArchiveKind::xml: {
                std::ostream os(&writer);
                os.imbue(std::locale::classic());  // numbers as FORMAT.md writes them, whatever the global locale
                {
                    boost::archive::xml_oarchive ar(os);
                    detail::write_body(ar, dict, position, chunks, digest);
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

namespace detail {
CKPT_INLINE CheckedToc read_checked_toc(OpenedCheckpoint& c, const std::string& path) {
    CheckedToc out;
    // the xxh3 of the first `length` body bytes, read a piece at a time
    auto hash_body = [&](std::uint64_t length) {
        Xxh3 hash;
        std::vector<char> buf(static_cast<std::size_t>(std::min<std::uint64_t>(length, stream_buffer_size)));
        for (std::uint64_t at = 0; at < length;) {
            const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), length - at));
            pread_exact(c.fd.get(), buf.data(), n, header_size + at, path);
            hash.update(buf.data(), n);
            at += n;
        }
        return hash.digest();
    };
    UncheckedBodyReader src(c.fd.get(), path, c.header.body_length);
    std::uint64_t toc_end = 0, toc_check = 0;
    try {
        translating_archive_errors(path, [&] {
            boost::archive::binary_iarchive ar(src, boost::archive::no_header | boost::archive::no_codecvt);
            BodyParser parser(ar, src, path, true);
            out.entries = parser.read_toc();
            reject_duplicates(out.entries, path);
            out.chunk_bytes = parser.chunk_bytes();
            toc_end = parser.toc_end();
            toc_check = parser.toc_check();
        });
    } catch (const FormatError&) {  // damage is reported as such: a malformed table in a whole file is not
        if (const auto got = hash_body(c.header.body_length); got != c.header.body_hash)
            throw body_checksum_error(path, c.header.body_hash, got);
        throw;
    }
    // what was parsed above is trusted only once its bytes hash to toc_check
    if (const auto got = hash_body(toc_end); got != toc_check)
        throw ChecksumError("checkpoint '" + path + "' has a corrupt table of contents (its check reads " +
                                hex64(toc_check) + ", its " + std::to_string(toc_end) + " bytes hash to " + hex64(got) + ")",
                            path);
    out.payload_offsets = payload_offsets(out.entries, true);
    std::uint64_t end = header_size + toc_end + 8;  // where the payloads end, in the file
    for (const auto& e : out.entries)
        if (e.kind == ValueKind::tensor) end = std::max(end, out.payload_offsets.at(e.name) + e.nbytes);
    if (end != header_size + c.header.body_length)
        throw FormatError("checkpoint '" + path + "' is malformed: its payloads end at byte " + std::to_string(end) +
                              " of a " + std::to_string(header_size + c.header.body_length) + "-byte file",
                          path);
    return out;
}
}  // namespace detail

CKPT_INLINE FileHeader read_header(const PathArg& file) {
    const std::string path = file.string();
    return detail::reading(path, [&] { return detail::open_checkpoint(path, {}).header; });
}

namespace detail {
/// read_contents() of an opened file, or, with `decode_encoded` false, only its header for a
/// body that passed through codecs (entries left empty): what a cheap look at a file costs.
CKPT_INLINE CheckpointContents contents_of(OpenedCheckpoint& c, const std::string& path, const LoadOptions& opts,
                                           bool decode_encoded) {
    CheckpointContents out{c.header, {}};
    if (c.header.encoded()) {  // a codec's output cannot be read from the middle: decode it all
        if (decode_encoded) out.entries = decoded_toc(c.header, read_decoded_body(c, path, opts), path);
        return out;
    }
    UncheckedBodyReader src(c.fd.get(), path, c.header.body_length);
    std::array<std::byte, 32> first{};
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(first.size(), c.header.body_length));
    if (c.header.archive == ArchiveKind::text)
        pread_exact(c.fd.get(), reinterpret_cast<char*>(first.data()), n, header_size, path);
    out.entries = read_toc(c.header, src, {first.data(), n}, path);
    return out;
}
}  // namespace detail

CKPT_INLINE CheckpointContents read_contents(const PathArg& file, const LoadOptions& opts) {
    const std::string path = file.string();
    return detail::reading(path, [&] {
        auto c = detail::open_checkpoint(path, opts);
        return detail::contents_of(c, path, opts, true);
    });
}

CKPT_INLINE FileHeader verify_checkpoint(const PathArg& file, const LoadOptions& opts) {
    const std::string path = file.string();
    return detail::reading(path, [&] { return detail::verify_opened(path, opts); });
}

namespace detail {
CKPT_INLINE FileHeader verify_opened(const std::string& path, const LoadOptions& opts) {
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
}  // namespace detail

CKPT_INLINE ParamDict load_checkpoint(const PathArg& file, const LoadOptions& opts) {
    const std::string path = file.string();
    return detail::reading(path, [&] {
        auto c = detail::open_checkpoint(path, opts);
        auto body = detail::read_decoded_body(c, path, opts);
        ParamDict dict = detail::parse_body(c.header, std::move(body.data), body.size, path);
        detail::drop_reserved(dict);
        return dict;
    });
}

namespace detail {
/// load_param_into_net(); an object's state_dict() values are copies (`values_are_copies`).
CKPT_INLINE LoadReport load_param_into(ParamDict& target, const ParamDict& src, bool strict, bool values_are_copies,
                                       const TargetShaper* shape, const std::string& source) {
    std::vector<detail::EntryMeta> toc;
    for (const auto& [name, value] : src) {
        toc.push_back(entry_of(name, value));
        if (toc.back().kind != ValueKind::tensor) toc.back().scalar = materialized(value, ObjectEncoding::boost_binary);
    }
    if (shape) naming_source(source, [&] { (*shape)(toc, target); });
    auto plan = detail::plan_load(target, toc, values_are_copies);
    if (strict && !plan.report.complete()) throw detail::strict_failure(source, plan);
    const auto commits = stage_bindings(plan, toc, strict, source);
    auto it = src.begin();
    for (std::size_t i = 0; i < toc.size(); ++i, ++it) {
        if (plan.bindings[i]) continue;
        if (Tensor* dst = plan.destinations[i]) {
            if (const Tensor* from = it->value.get_if<Tensor>()) {
                copy_values(*from, *dst);
            } else {
                detail::write_scalar(it->value, *dst);
            }
        } else if (Value* slot = plan.value_slots[i]) {
            *slot = it->value;
        } else {
            plan.report.rest.set(it->name, toc[i].kind == ValueKind::tensor ? it->value : toc[i].scalar);  // read once
        }
    }
    for (const auto& commit : commits) commit();
    return plan.report;
}
}  // namespace detail

CKPT_INLINE LoadReport load_param_into_net(ParamDict& target, const ParamDict& src, bool strict) {
    return detail::load_param_into(target, src, strict, false);
}


namespace detail {

/// Parses a binary body from `src` (BodyReader, or a codec's PlainBodyStream) straight into
/// `target`'s tensors, then checks the stored bytes' checksum and any decoding failure.
template <class Source>
LoadReport load_binary_into(Source& src, const FileHeader& header, const std::string& path, ParamDict& target,
                            bool strict, bool values_are_copies, const TargetShaper* shape) {
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
    std::vector<std::function<void()>> commits;
    try {
        translating_archive_errors(path, [&] {
            boost::archive::binary_iarchive ar(src, boost::archive::no_header | boost::archive::no_codecvt);
            BodyParser parser(ar, src, path, header.chunked());
            toc = parser.read_toc();
            reject_duplicates(toc, path);
            if (shape) naming_source("'" + path + "'", [&] { (*shape)(toc, target); });
            plan = plan_load(target, toc, values_are_copies);
            if (strict && !plan.report.complete()) {
                if (auto e = corruption_instead("")) throw *e;
                throw with_share_record(strict_failure("'" + path + "'", plan), toc);
            }
            try {
                commits = stage_bindings(plan, toc, strict, "'" + path + "'");
            } catch (const LoadMismatch& m) {
                if (auto e = corruption_instead("")) throw *e;
                throw with_share_record(m, toc);
            }
            for (std::size_t i = 0; i < toc.size(); ++i) {
                auto& e = toc[i];
                if (plan.bindings[i]) continue;
                if (e.kind != ValueKind::tensor) {
                    if (Tensor* dst = plan.destinations[i]) write_scalar(e.scalar, *dst);
                    else if (Value* slot = plan.value_slots[i]) *slot = std::move(e.scalar);
                    else if (!is_reserved_name(e.name)) plan.report.rest.set(e.name, std::move(e.scalar));
                    continue;
                }
                parser.read_padding();
                Tensor* dst = plan.destinations[i];
                if (dst && dst->order() == e.order) {
                    parser.read_payload(e, dst->data());
                } else {
                    Tensor fresh = Tensor::uninitialized(e.dtype, e.logical_shape(), e.order);
                    parser.read_payload(e, fresh.data());
                    if (dst) copy_values(fresh, *dst);  // a target of the other order: the elements move
                    else plan.report.rest.set(e.name, std::move(fresh));
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
    for (const auto& commit : commits) commit();  // bound variables once every byte is known good
    return std::move(plan.report);
}

}  // namespace detail

namespace detail {
CKPT_INLINE LoadReport load_file_into(const PathArg& file, ParamDict& target, bool strict, const LoadOptions& opts,
                                      bool values_are_copies, const TargetShaper* shape) {
    const std::string path = file.string();
    return reading(path, [&]() -> LoadReport {
        auto c = detail::open_checkpoint(path, opts);
        const FileHeader& h = c.header;
        if (h.archive == ArchiveKind::binary && !h.encoded()) {
            detail::BodyReader src(c.fd.get(), path, h.body_length);
            return detail::load_binary_into(src, h, path, target, strict, values_are_copies, shape);
        }
        if (h.archive == ArchiveKind::binary && h.codecs[1] == CodecId::none) {  // one stage
            const DecodeContext ctx = decode_context(path, h, opts);
            detail::require_key(h, ctx);
            if (const auto open_stream = detail::codec_impl(h.codecs[0], path, "reading").open_stream)
                if (auto src = open_stream(c.fd.get(), header_size, h.body_length, ctx))
                    return detail::load_binary_into(*src, h, path, target, strict, values_are_copies, shape);
        }
        auto body = detail::read_decoded_body(c, path, opts);
        ParamDict dict = detail::parse_body(h, std::move(body.data), body.size, path);
        detail::drop_reserved(dict);
        return detail::load_param_into(target, dict, strict, values_are_copies, shape, "'" + path + "'");
    });
}
}  // namespace detail

CKPT_INLINE LoadReport load_checkpoint_into(const PathArg& file, ParamDict& target, bool strict,
                                            const LoadOptions& opts) {
    return detail::load_file_into(file, target, strict, opts, false);
}

}  // namespace ckpt
