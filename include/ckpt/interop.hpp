#pragma once
// Exchange with other frameworks: safetensors, NumPy's npz, and reading PyTorch's torch.save
// files. Not part of ckpt.hpp: link the CMake target ckpt::interop (nlohmann-json for the
// safetensors header, libzip for the npz and PyTorch containers) and include this header.
//
//   save_safetensors(dict, path)            load_safetensors(path) -> ParamDict
//   save_npz(dict, path, compressed)        load_npz(path) -> ParamDict
//                                           load_torch(path) -> ParamDict    (.pt, .pth)
//   safetensors_contents(path), npz_contents(path), torch_contents(path): what the loads would
//   return, as a table of contents (names, dtypes, shapes, values), no tensor's bytes read.
//
// Every file is read as hostile: the loads take InteropLoadOptions, whose max_decoded_bytes
// (by default the larger of 256 MiB and 64 times the file) bounds what a file may decode to
// before the memory is taken; JSON nesting is bounded; no pickle is executed.
//
// safetensors: 8-byte little-endian header length, a JSON header naming each tensor's dtype,
// shape and [begin, end) byte range in the buffer that follows, then the buffer. Scalars and
// strings travel in "__metadata__" (whose values are strings); the reserved metadata key
// "ckpt.kinds" records which of them were int64, double or bool, so they come back as such,
// and "ckpt.order", written when values come before tensors, the order of the entries.
// Files from other writers load with their metadata as string entries. safetensors has no
// storage order: a column-major tensor is written transposed into row-major order (a copy of
// the same values, of its logical shape), and every tensor read is row-major.
//
// npz: a zip of "{name}.npy" members, stored or deflated (np.savez, np.savez_compressed).
// Scalars and strings become 0-d arrays ('<i8', '<f8', '|b1', '<U{n}'), marked by the
// member comment "ckpt:scalar" so that they come back as scalars rather than 0-d tensors;
// NumPy does not see the comment. A column-major tensor is written as it lies, with
// 'fortran_order': True and its logical shape, and a Fortran-ordered array is read as a
// column-major tensor: no element moves either way. Reading takes stored and deflated
// members, and either byte order.
//
// PyTorch: the zip that torch.save writes (since PyTorch 1.6), read without libtorch or Python
// by a restricted unpickler that takes dicts, lists, tuples, plain values and tensors and
// refuses every other Python global; nested dicts come out flattened with dots
// ("model.fc.weight", "optimizer.state.0.exp_avg"). See load_torch.
//
// Writes are atomic and durable like checkpoints (temporary, fsync, rename, fsync of the
// directory). Every length and offset read from a file is checked against the file's size
// before anything is allocated; a bad file is a FormatError naming the file and the field.

#include <zip.h>

#include <nlohmann/json.hpp>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "detail/atomic_file.hpp"
#include "detail/body.hpp"
#include "detail/decode_budget.hpp"
#include "detail/posix_io.hpp"
#include "detail/verified_reader.hpp"
#include "error.hpp"
#include "format.hpp"
#include "naming_policy.hpp"
#include "param_dict.hpp"
#include "path.hpp"
#include "tensor.hpp"

namespace ckpt {

namespace fs = boost::filesystem;

namespace detail {

// ---------------------------------------------------------------------------------------------
// Shared by both formats

/// Shortest text that reads back as the same double.
inline std::string double_text(double v) {
    std::array<char, 32> buf{};
    const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
    return std::string(buf.data(), r.ptr);
}

template <class T>
std::optional<T> parse_number(std::string_view s) {
    T v{};
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
    return v;
}

inline std::string value_kind_name(ValueKind k) {
    switch (k) {
        case ValueKind::int64: return "int64";
        case ValueKind::float64: return "float64";
        case ValueKind::boolean: return "bool";
        case ValueKind::string: return "string";
        case ValueKind::tensor: return "tensor";
    }
    return "?";
}

/// Reverses the bytes of each `width`-byte element (big-endian files on little-endian hosts).
inline void swap_bytes(std::byte* p, std::size_t n, std::size_t width) {
    if (width < 2) return;
    for (std::size_t i = 0; i + width <= n; i += width) std::reverse(p + i, p + i + width);
}

// ---------------------------------------------------------------------------------------------
// safetensors

inline constexpr std::string_view safetensors_kinds_key = "ckpt.kinds";
/// The dict's order of entries, when values come before tensors: the format keeps tensors and
/// metadata apart, and a round trip must give back a dict that compares equal.
inline constexpr std::string_view safetensors_order_key = "ckpt.order";
/// The header is JSON text; the reference implementation refuses headers above 100 MB.
inline constexpr std::uint64_t max_safetensors_header = 100'000'000;

inline std::string_view safetensors_dtype(DType d) {
    switch (d) {
        case DType::float32: return "F32";
        case DType::float64: return "F64";
        case DType::float16: return "F16";
        case DType::int32: return "I32";
        case DType::int64: return "I64";
        case DType::uint8: return "U8";
        case DType::boolean: return "BOOL";
    }
    return "?";
}

inline std::optional<DType> dtype_from_safetensors(std::string_view s) {
    for (int c = 0; c < dtype_count; ++c)
        if (safetensors_dtype(static_cast<DType>(c)) == s) return static_cast<DType>(c);
    return std::nullopt;
}

[[noreturn]] inline void safetensors_fail(const std::string& path, const std::string& why) {
    throw FormatError("safetensors file '" + path + "' is malformed: " + why, path);
}

/// How deep JSON may nest in a header: deeper is a FormatError, found as the text is read,
/// never a recursion as deep as a file asks for.
inline constexpr std::size_t max_json_depth = 64;

/// One tensor a safetensors header describes.
struct SafetensorsSlot {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
};

/// A safetensors header's events, from nlohmann's SAX parser: no tree of the header is built,
/// each tensor's description is checked as its object closes, time is linear in the text, and
/// nesting stops at max_json_depth. The first thing found wrong is kept, and the text read on
/// to its end, so that a header that is not JSON at all is called that first.
class SafetensorsHeaderEvents final : public nlohmann::json_sax<nlohmann::json> {
public:
    /// `text_size`: the header's length, which bounds how many tensors it can name.
    SafetensorsHeaderEvents(std::uint64_t buffer_size, std::size_t text_size) : buffer_size_(buffer_size) {
        names_.reserve(text_size / 64);  // no rehashing for headers of ckpt's ~70 bytes per tensor
    }

    /// Whether `name` is a key of the header's top level (a tensor, or __metadata__).
    bool named(const std::string& name) const { return names_.contains(name); }

    std::vector<SafetensorsSlot> slots;                          // in header order
    std::vector<std::pair<std::string, std::string>> metadata;  // in header order
    std::string problem;                                         // the first thing wrong, JSON syntax aside
    std::string syntax_error;
    bool too_deep = false;  // parsing stopped there: the text was not read to its end

    bool null() override { return scalar(Scalar::other); }
    bool boolean(bool) override { return scalar(Scalar::other); }
    bool number_integer(number_integer_t v) override {
        return v < 0 ? scalar(Scalar::other) : scalar(Scalar::count, static_cast<std::uint64_t>(v));
    }
    bool number_unsigned(number_unsigned_t v) override { return scalar(Scalar::count, v); }
    bool number_float(number_float_t, const string_t&) override { return scalar(Scalar::other); }
    bool binary(binary_t&) override { return scalar(Scalar::other); }
    bool string(string_t& s) override { return scalar(Scalar::text, 0, &s); }
    bool start_object(std::size_t) override { return open(true); }
    bool start_array(std::size_t) override { return open(false); }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        if (problem.empty() && !stack_.empty()) {
            switch (stack_.back()) {
                case Ctx::top:
                    if (!names_.insert(k).second)
                        fail(k == "__metadata__" ? "'__metadata__' appears twice" : "tensor '" + k + "' appears twice in the header");
                    key_ = k;
                    break;
                case Ctx::metadata:
                    if (!meta_keys_.insert(k).second) fail("__metadata__ '" + k + "' appears twice");
                    key_ = k;
                    break;
                case Ctx::tensor: {
                    field_ = k == "dtype" ? Field::dtype : k == "shape" ? Field::shape : k == "data_offsets" ? Field::offsets : Field::other;
                    bool* seen = field_ == Field::dtype ? &tensor_.has_dtype : field_ == Field::shape ? &tensor_.has_shape
                               : field_ == Field::offsets ? &tensor_.has_offsets : nullptr;
                    if (seen && std::exchange(*seen, true)) fail("tensor '" + tensor_.name + "' has '" + k + "' twice");
                    break;
                }
                default: break;
            }
        }
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        syntax_error = e.what();
        return false;
    }

private:
    enum class Ctx : std::uint8_t { top, metadata, tensor, shape, offsets, skip };
    enum class Field : std::uint8_t { dtype, shape, offsets, other };
    enum class Scalar : std::uint8_t { text, count, other };

    /// The tensor whose object is open. Reused from one tensor to the next: a header of many
    /// tensors costs no allocations per tensor beyond its name and shape.
    struct OpenTensor {
        std::string name, dtype;
        bool has_dtype = false, has_shape = false, has_offsets = false, shape_array = false;
        bool dtype_bad = false, shape_bad = false, offsets_bad = false;
        std::vector<std::uint64_t> shape, offsets;
        void reset(const std::string& n) {
            name = n;
            has_dtype = has_shape = has_offsets = shape_array = dtype_bad = shape_bad = offsets_bad = false;
            dtype.clear();
            shape.clear();
            offsets.clear();
        }
    };

    void fail(const std::string& why) {
        if (problem.empty()) problem = why;
    }
    std::string tensor_what() const { return "tensor '" + tensor_.name + "'"; }

    bool scalar(Scalar kind, std::uint64_t count = 0, string_t* text = nullptr) {
        if (!problem.empty()) return true;
        if (stack_.empty()) return fail("its header is not a JSON object"), true;
        switch (stack_.back()) {
            case Ctx::top:
                fail(key_ == "__metadata__" ? "__metadata__ is not an object" : "tensor '" + key_ + "' is not described by an object");
                break;
            case Ctx::metadata:
                if (kind != Scalar::text) fail("__metadata__ '" + key_ + "' is not a string");
                else metadata.emplace_back(key_, std::move(*text));
                break;
            case Ctx::tensor:
                if (field_ == Field::dtype) {
                    if (kind == Scalar::text) tensor_.dtype = std::move(*text);
                    else tensor_.dtype_bad = true;
                }
                tensor_.offsets_bad |= field_ == Field::offsets;  // data_offsets that are no array
                break;
            case Ctx::shape:
            case Ctx::offsets: {
                const bool shape = stack_.back() == Ctx::shape;
                auto& list = shape ? tensor_.shape : tensor_.offsets;
                bool& bad = shape ? tensor_.shape_bad : tensor_.offsets_bad;
                // a list longer than any valid one is wrong already: it is not kept growing
                if (kind != Scalar::count || list.size() > (shape ? max_tensor_rank : 2)) bad = true;
                else list.push_back(count);
                break;
            }
            case Ctx::skip: break;
        }
        return true;
    }

    bool open(bool object) {
        if (stack_.size() >= max_json_depth) {
            fail("its JSON nests deeper than " + std::to_string(max_json_depth) + " levels");
            too_deep = true;
            return false;  // no deeper: the parser keeps a stack of its own
        }
        Ctx next = Ctx::skip;
        if (problem.empty()) {
            if (stack_.empty()) {
                if (object) next = Ctx::top;
                else fail("its header is not a JSON object");
            } else {
                switch (stack_.back()) {
                    case Ctx::top:
                        if (!object) scalar(Scalar::other);  // the same complaint as a scalar there
                        else if (key_ == "__metadata__") next = Ctx::metadata;
                        else {
                            next = Ctx::tensor;
                            tensor_.reset(key_);
                        }
                        break;
                    case Ctx::metadata: scalar(Scalar::other); break;
                    case Ctx::tensor:
                        if (!object && field_ == Field::shape) next = Ctx::shape, tensor_.shape_array = true;
                        else if (!object && field_ == Field::offsets) next = Ctx::offsets;
                        else scalar(Scalar::other);
                        break;
                    case Ctx::shape: tensor_.shape_bad = true; break;
                    case Ctx::offsets: tensor_.offsets_bad = true; break;
                    case Ctx::skip: break;
                }
            }
        }
        stack_.push_back(next);
        return true;
    }

    bool close() {
        const Ctx done = stack_.back();
        stack_.pop_back();
        if (done == Ctx::tensor && problem.empty()) finish_tensor();
        return true;
    }

    /// Checks the description of the tensor whose object just closed, in the order: dtype,
    /// shape, data_offsets, then whether they agree.
    void finish_tensor() {
        const std::string what = tensor_what();
        if (!tensor_.has_dtype || tensor_.dtype_bad) return fail(what + " has no dtype string");
        const auto dtype = dtype_from_safetensors(tensor_.dtype);
        if (!dtype)
            return fail(what + " has dtype " + tensor_.dtype +
                        ", which ckpt does not hold (F32, F64, F16, I32, I64, U8, BOOL)");
        if (!tensor_.shape_array || tensor_.shape.size() > max_tensor_rank)
            return fail(what + " has no shape array of at most " + std::to_string(max_tensor_rank) + " dimensions");
        if (tensor_.shape_bad) return fail(what + " has a shape entry that is not a count");
        Shape shape;
        for (const auto v : tensor_.shape) {
            if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
                return fail(what + " has an impossible dimension " + std::to_string(v));
            shape.push_back(static_cast<std::int64_t>(v));
        }
        if (!tensor_.has_offsets || tensor_.offsets_bad || tensor_.offsets.size() != 2)
            return fail(what + " has no data_offsets pair [begin, end]");
        const auto begin = tensor_.offsets[0], end = tensor_.offsets[1];
        if (begin > end || end > buffer_size_)
            return fail(what + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
                        std::to_string(buffer_size_) + "-byte buffer");
        std::size_t numel = 0;
        try {
            numel = checked_numel(shape, static_cast<std::size_t>(buffer_size_));
        } catch (const FormatError&) {
            return fail(what + " has an impossible shape " + shape_string(shape));
        }
        if (numel * itemsize(*dtype) != end - begin)
            return fail(what + " of " + std::string(dtype_name(*dtype)) + shape_string(shape) + " needs " +
                        std::to_string(numel * itemsize(*dtype)) + " bytes, its data_offsets hold " +
                        std::to_string(end - begin));
        slots.push_back({tensor_.name, *dtype, std::move(shape), begin, end});
    }

    std::uint64_t buffer_size_;
    std::vector<Ctx> stack_;
    std::string key_;  // the key whose value comes next, at the top or in __metadata__
    Field field_ = Field::other;
    OpenTensor tensor_;
    std::unordered_set<std::string> names_, meta_keys_;
};

/// The JSON text of a ckpt metadata value (ckpt.kinds: an object of strings; ckpt.order: an
/// array of strings), read flat: anything else in it is a FormatError.
class FlatStringsEvents final : public nlohmann::json_sax<nlohmann::json> {
public:
    explicit FlatStringsEvents(bool object) : object_(object) {}
    std::vector<std::pair<std::string, std::string>> items;  // key (empty in an array), value

    bool null() override { return false; }
    bool boolean(bool) override { return false; }
    bool number_integer(number_integer_t) override { return false; }
    bool number_unsigned(number_unsigned_t) override { return false; }
    bool number_float(number_float_t, const string_t&) override { return false; }
    bool binary(binary_t&) override { return false; }
    bool string(string_t& s) override {
        if (!open_) return false;
        items.emplace_back(std::move(key_), std::move(s));
        key_.clear();
        return true;
    }
    bool start_object(std::size_t) override { return object_ && !std::exchange(open_, true) && !done_; }
    bool start_array(std::size_t) override { return !object_ && !std::exchange(open_, true) && !done_; }
    bool end_object() override { return open_ = false, done_ = true; }
    bool end_array() override { return open_ = false, done_ = true; }
    bool key(string_t& k) override { return key_ = std::move(k), true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

private:
    bool object_, open_ = false, done_ = false;
    std::string key_;
};

/// The items of the ckpt metadata value `text` (FlatStringsEvents), or a FormatError.
inline std::vector<std::pair<std::string, std::string>> metadata_strings(const std::string& text, std::string_view key,
                                                                        bool object, const std::string& path) {
    FlatStringsEvents events(object);
    if (!nlohmann::json::sax_parse(text, &events))
        safetensors_fail(path, "__metadata__ '" + std::string(key) + "' is not a JSON " +
                                   (object ? "object" : "array") + " of strings");
    return std::move(events.items);
}

/// What a safetensors file's header describes, its tensors' bytes not read.
struct SafetensorsContents {
    std::vector<SafetensorsSlot> slots;  // in buffer order
    ParamDict values;                     // the __metadata__ entries, typed as ckpt.kinds says
    std::vector<std::string> order;       // ckpt.order: the writer's order of entries, when it recorded one
    std::uint64_t buffer_start = 0, buffer_size = 0;
};

/// Reads and checks the header of the open file `fd` of `size` bytes.
inline SafetensorsContents read_safetensors_header(int fd, std::uint64_t size, const std::string& path) {
    std::array<std::byte, 8> raw{};
    if (size < raw.size())
        safetensors_fail(path, "it is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
    pread_exact(fd, reinterpret_cast<char*>(raw.data()), raw.size(), 0, path);
    const auto header_len = get_le<std::uint64_t>(raw.data());
    if (header_len > size - 8)
        safetensors_fail(path, "header length " + std::to_string(header_len) + " runs past the end of the " +
                                   std::to_string(size) + "-byte file");
    if (header_len > max_safetensors_header)
        safetensors_fail(path, "header length " + std::to_string(header_len) + " exceeds the " +
                                   std::to_string(max_safetensors_header) + "-byte limit");
    std::string text(static_cast<std::size_t>(header_len), '\0');
    pread_exact(fd, text.data(), text.size(), 8, path);
    SafetensorsContents out;
    out.buffer_start = 8 + header_len;
    out.buffer_size = size - out.buffer_start;

    SafetensorsHeaderEvents events(out.buffer_size, text.size());
    nlohmann::json::sax_parse(text, &events);
    if (!events.too_deep && !events.syntax_error.empty())
        safetensors_fail(path, "its header is not valid JSON: " + events.syntax_error);
    if (!events.problem.empty()) safetensors_fail(path, events.problem);
    text = std::string();

    // The buffer is covered exactly: no overlaps, no holes, nothing after the last tensor.
    out.slots = std::move(events.slots);
    std::stable_sort(out.slots.begin(), out.slots.end(), [](const SafetensorsSlot& a, const SafetensorsSlot& b) {
        return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    std::uint64_t covered = 0;
    for (const auto& s : out.slots) {
        if (s.begin < covered)
            safetensors_fail(path, "tensor '" + s.name + "' at [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                                       "] overlaps the tensor before it");
        if (s.begin > covered)
            safetensors_fail(path, "bytes [" + std::to_string(covered) + ", " + std::to_string(s.begin) +
                                       ") of the buffer belong to no tensor");
        covered = s.end;
    }
    if (covered != out.buffer_size)
        safetensors_fail(path, std::to_string(out.buffer_size - covered) + " bytes after the last tensor's data");

    std::unordered_map<std::string, std::string> kinds;
    for (const auto& [key, text_value] : events.metadata) {
        if (key == safetensors_kinds_key)
            for (auto& [name, kind] : metadata_strings(text_value, key, true, path)) kinds[name] = std::move(kind);
        if (key == safetensors_order_key) {
            std::unordered_set<std::string> named;
            for (auto& [unused, name] : metadata_strings(text_value, key, false, path)) {
                if (!named.insert(name).second)
                    safetensors_fail(path, "__metadata__ '" + std::string(key) + "' names '" + name + "' twice");
                out.order.push_back(std::move(name));
            }
        }
    }
    for (auto& [key, text_value] : events.metadata) {
        if (key == safetensors_kinds_key || key == safetensors_order_key) continue;
        if (key != "__metadata__" && events.named(key)) safetensors_fail(path, "'" + key + "' is both a tensor and a __metadata__ key");
        const auto it = kinds.find(key);
        const std::string kind = it == kinds.end() ? "string" : it->second;
        auto bad = [&, &key = key, &text_value = text_value] {
            safetensors_fail(path, "__metadata__ '" + key + "' = '" + text_value + "' is not a " + kind);
        };
        if (kind == "int64") {
            const auto v = parse_number<std::int64_t>(text_value);
            if (!v) bad();
            out.values.set(key, *v);
        } else if (kind == "float64") {
            const auto v = parse_number<double>(text_value);
            if (!v) bad();
            out.values.set(key, *v);
        } else if (kind == "bool") {
            if (text_value != "true" && text_value != "false") bad();
            out.values.set(key, text_value == "true");
        } else {
            out.values.set(key, std::move(text_value));
        }
    }
    return out;
}

/// `dict` in the writer's recorded order (names it does not hold are passed over), then what the
/// order does not name, as read.
inline ParamDict in_recorded_order(ParamDict dict, const std::vector<std::string>& order) {
    if (order.empty()) return dict;
    ParamDict ordered;
    for (const auto& name : order)  // no name twice: read_safetensors_header refuses that
        if (Value* v = dict.find(name)) ordered.set(name, std::move(*v));
    for (auto& [name, value] : dict)
        if (!ordered.contains(name)) ordered.set(name, std::move(value));
    return ordered;
}

/// A string as JSON text; a name or value that is not UTF-8 cannot be one.
inline std::string json_string(const std::string& s, const std::string& path, const std::string& what) {
    try {
        return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    } catch (const nlohmann::json::exception&) {
        throw ConfigError("cannot save '" + path + "': " + what + " is not valid UTF-8, which a JSON header cannot hold");
    }
}

/// Throws on a name the format cannot carry.
inline void check_safetensors_name(const std::string& name, const std::string& path) {
    if (name == "__metadata__" || name == safetensors_kinds_key || name == safetensors_order_key)
        throw ConfigError("cannot save '" + path + "': the entry name '" + name + "' is reserved in safetensors files");
}

/// Throws on a bool tensor holding a byte other than 0 and 1: the readers refuse those (a bool
/// read from any other byte is undefined behaviour), so no writer writes one.
inline void check_bool_bytes(const std::string& name, const Tensor& t, const std::string& path) {
    if (t.dtype() != DType::boolean) return;
    const std::byte* p = t.data();
    for (std::size_t i = 0; i < t.nbytes(); ++i)
        if (static_cast<unsigned>(p[i]) > 1)
            throw ConfigError("cannot save '" + path + "': bool tensor '" + name + "' holds the byte " +
                              std::to_string(static_cast<unsigned>(p[i])) + " at element " + std::to_string(i) +
                              ", neither 0 nor 1");
}

/// A read of `path` (detail::reading), nlohmann's exceptions too made FormatErrors naming it.
template <class F>
decltype(auto) reading_foreign(const std::string& path, F&& f) {
    return reading(path, [&]() -> decltype(auto) {
        try {
            return f();
        } catch (const nlohmann::json::exception& e) {
            throw FormatError("cannot read '" + path + "': " + e.what(), path);
        }
    });
}

}  // namespace detail

/// How load_safetensors, load_npz and load_torch read a file from elsewhere.
struct InteropLoadOptions {
    /// A file whose tensors and values would take more than this is refused (FormatError)
    /// before the memory is taken: a deflated npz member or PyTorch record, a pickle's objects,
    /// views of one storage under many names. Unset: the larger of 256 MiB and 64 times the
    /// file's size (detail/decode_budget.hpp says why); UINT64_MAX: no limit.
    std::optional<std::uint64_t> max_decoded_bytes = std::nullopt;
};

namespace detail {
inline constexpr const char* interop_budget_option = "InteropLoadOptions::max_decoded_bytes";
}  // namespace detail

/// Writes `dict` as a safetensors file: tensors in dict order, other values in __metadata__.
/// The format has no storage order: column-major tensors are copied into row-major order.
inline void save_safetensors(const ParamDict& dict, const PathArg& file) {
    const std::string path = file.string();
    // The header text is written as it goes: a JSON object keyed by name would look every name
    // up in the names before it.
    std::string tensors, metadata, kinds;
    std::vector<Tensor> row_major;  // the payloads, in dict order
    std::uint64_t offset = 0;
    auto member = [&](std::string& out, const std::string& key, const std::string& value_text) {
        if (!out.empty()) out += ',';
        out.append(key).append(":").append(value_text);
    };
    auto quoted = [](const std::string& text) { return std::string("\"").append(text).append("\""); };
    for (const auto& [name, value] : dict) {
        detail::check_safetensors_name(name, path);
        const std::string key = detail::json_string(name, path, "entry name '" + name + "'");
        if (const Tensor* t = value.get_if<Tensor>()) {
            detail::check_bool_bytes(name, *t, path);
            row_major.push_back(t->in_order(Order::row_major));
            std::string shape;
            for (const auto d : t->logical_shape()) shape.append(shape.empty() ? "" : ",").append(std::to_string(d));
            member(tensors, key,
                   "{\"dtype\":\"" + std::string(detail::safetensors_dtype(t->dtype())) + "\",\"shape\":[" + shape +
                       "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t->nbytes()) + "]}");
            offset += t->nbytes();
        } else if (const auto* s = value.get_if<std::string>()) {
            member(metadata, key, detail::json_string(*s, path, "string '" + name + "'"));
        } else {
            member(kinds, key, quoted(detail::value_kind_name(value.kind())));
            if (const auto* i = value.get_if<std::int64_t>()) member(metadata, key, quoted(std::to_string(*i)));
            else if (const auto* d = value.get_if<double>()) member(metadata, key, quoted(detail::double_text(*d)));
            else member(metadata, key, quoted(*value.get_if<bool>() ? "true" : "false"));
        }
    }
    auto text_of = [](const std::string& json_text) { return nlohmann::json(json_text).dump(); };
    if (!kinds.empty()) member(metadata, text_of(std::string(detail::safetensors_kinds_key)), text_of("{" + kinds + "}"));
    bool value_seen = false, reordered = false;  // a value before a tensor: the order needs recording
    std::string order;
    for (const auto& [name, value] : dict) {
        order.append(order.empty() ? "" : ",").append(detail::json_string(name, path, "entry name '" + name + "'"));
        reordered = reordered || (value_seen && value.is_tensor());
        value_seen = value_seen || !value.is_tensor();
    }
    if (reordered) member(metadata, text_of(std::string(detail::safetensors_order_key)), text_of("[" + order + "]"));
    std::string text = "{";
    if (!metadata.empty()) text += "\"__metadata__\":{" + metadata + "}";  // first, as the reference writer puts it
    if (!metadata.empty() && !tensors.empty()) text += ",";
    text += tensors + "}";
    text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-byte aligned
    std::array<std::byte, 8> length{};
    detail::put_le<std::uint64_t>(length.data(), text.size());

    detail::AtomicFile out(file);
    detail::write_all(out.fd(), length.data(), length.size(), path);
    detail::write_all(out.fd(), text.data(), text.size(), path);
    for (const Tensor& t : row_major) detail::write_all(out.fd(), t.data(), t.nbytes(), path);
    out.commit();
}

namespace detail {
inline ParamDict load_safetensors_file(const std::string& path, const InteropLoadOptions& opts) {
    auto fd = open_for_read(path);
    const std::uint64_t size = file_size(fd.get(), path);
    auto contents = read_safetensors_header(fd.get(), size, path);
    DecodeBudget budget("safetensors file '" + path + "'", path, opts.max_decoded_bytes, size, interop_budget_option);
    budget.take(contents.buffer_size, [&] { return "its tensors' " + std::to_string(contents.buffer_size) + " bytes"; });
    auto block = allocate_aligned(static_cast<std::size_t>(contents.buffer_size));
    pread_exact(fd.get(), reinterpret_cast<char*>(block.get()), static_cast<std::size_t>(contents.buffer_size),
                contents.buffer_start, path);
    ParamDict dict;
    for (const auto& s : contents.slots) {
        std::byte* at = block.get() + s.begin;
        if (s.dtype == DType::boolean)  // a bool read from any other byte is undefined behaviour
            for (std::uint64_t b = 0; b < s.end - s.begin; ++b)
                if (static_cast<unsigned>(at[b]) > 1)
                    safetensors_fail(path, "tensor '" + s.name + "' holds a BOOL byte that is neither 0 nor 1");
        if (s.begin % itemsize(s.dtype) == 0) {
            dict.set(s.name, Tensor::aliasing(s.dtype, s.shape, block, at));
        } else {  // a misaligned element type gets its own block
            Tensor t = Tensor::uninitialized(s.dtype, s.shape);
            std::memcpy(t.data(), at, t.nbytes());
            dict.set(s.name, std::move(t));
        }
    }
    for (auto& [name, value] : contents.values) dict.set(name, std::move(value));
    return in_recorded_order(std::move(dict), contents.order);
}
}  // namespace detail

/// Reads a safetensors file. Tensors come first, in buffer order, then the metadata entries.
/// Tensors whose bytes sit aligned in the buffer share one block read in a single pass.
inline ParamDict load_safetensors(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] { return detail::load_safetensors_file(path, opts); });
}

/// What load_safetensors would return, in its order, as a table of contents: each tensor's dtype
/// and shape, the values of the others. Reads the header only.
inline std::vector<detail::EntryMeta> safetensors_contents(const PathArg& file, const InteropLoadOptions& = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        auto fd = detail::open_for_read(path);
        auto contents = detail::read_safetensors_header(fd.get(), detail::file_size(fd.get(), path), path);
        std::vector<detail::EntryMeta> entries;
        for (auto& s : contents.slots) {
            detail::EntryMeta& e = entries.emplace_back();
            e.name = std::move(s.name);
            e.kind = ValueKind::tensor;
            e.dtype = s.dtype;
            e.shape = std::move(s.shape);
            e.nbytes = s.end - s.begin;
        }
        for (auto& [name, value] : contents.values) {
            detail::EntryMeta& e = entries.emplace_back();
            e.name = name;
            e.kind = value.kind();
            e.scalar = std::move(value);
        }
        if (contents.order.empty()) return entries;
        // the recorded order first, then what it does not name (no name is in it twice)
        std::unordered_map<std::string_view, std::size_t> at;
        for (std::size_t k = 0; k < entries.size(); ++k) at.emplace(entries[k].name, k);
        std::vector<std::size_t> picks;
        std::vector<bool> picked(entries.size());
        for (const auto& name : contents.order)
            if (const auto it = at.find(name); it != at.end()) picks.push_back(it->second), picked[it->second] = true;
        for (std::size_t k = 0; k < entries.size(); ++k)
            if (!picked[k]) picks.push_back(k);
        std::vector<detail::EntryMeta> ordered;
        ordered.reserve(entries.size());
        for (const auto k : picks) ordered.push_back(std::move(entries[k]));
        return ordered;
    });
}

namespace detail {

// ---------------------------------------------------------------------------------------------
// npy: one array. "\x93NUMPY", major, minor, header length (u16 in 1.0, u32 in 2.0 and 3.0),
// then a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a newline so that the data starts 64-byte aligned.

inline constexpr std::string_view npy_magic = "\x93NUMPY";
inline constexpr std::string_view npz_scalar_comment = "ckpt:scalar";

inline std::string_view npy_descr(DType d) {
    switch (d) {
        case DType::float32: return "<f4";
        case DType::float64: return "<f8";
        case DType::float16: return "<f2";
        case DType::int32: return "<i4";
        case DType::int64: return "<i8";
        case DType::uint8: return "|u1";
        case DType::boolean: return "|b1";
    }
    return "?";
}

/// What an npy header describes: a tensor dtype, or a string of `chars` characters
/// ('U': 4-byte code points, 'S': bytes).
struct NpyType {
    std::optional<DType> dtype;
    char string_kind = 0;
    std::size_t chars = 0;
    bool big_endian = false;
    std::size_t itemsize() const { return dtype ? ckpt::itemsize(*dtype) : string_kind == 'U' ? 4 * chars : chars; }
};

/// `shape` is the array's (logical) shape; `fortran`: its bytes are in Fortran (column-major) order.
inline std::string npy_header(std::string_view descr, const Shape& shape, bool fortran = false) {
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) dims += ",";
    std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': (" + dims + "), }";
    const bool v2 = dict.size() + 11 > 65535;
    const std::size_t prelude = v2 ? 12 : 10;
    dict.append((64 - (prelude + dict.size() + 1) % 64) % 64, ' ');
    dict += '\n';
    std::string out(npy_magic);
    out += static_cast<char>(v2 ? 2 : 1);
    out += '\0';
    std::array<std::byte, 4> len{};
    put_le<std::uint32_t>(len.data(), static_cast<std::uint32_t>(dict.size()));
    out.append(reinterpret_cast<const char*>(len.data()), v2 ? 4 : 2);
    return out + dict;
}

/// A malformed zip-based file: "{format} file '{path}' is malformed: {why}".
[[noreturn]] inline void zip_format_fail(std::string_view format, const std::string& path, const std::string& why) {
    throw FormatError(std::string(format) + " file '" + path + "' is malformed: " + why, path);
}

[[noreturn]] inline void npz_fail(const std::string& path, const std::string& why) { zip_format_fail("npz", path, why); }

/// A cursor over the header's dict literal, with the member's name for errors.
class NpyHeaderParser {
public:
    NpyHeaderParser(std::string_view text, std::string path, std::string member)
        : s_(text), path_(std::move(path)), member_(std::move(member)) {}

    [[noreturn]] void fail(const std::string& why) const {
        npz_fail(path_, "member '" + member_ + "' has a bad npy header: " + why);
    }

    void skip_space() {
        while (!s_.empty() && (s_.front() == ' ' || s_.front() == '\t' || s_.front() == '\n' || s_.front() == '\r'))
            s_.remove_prefix(1);
    }
    bool eat(char c) {
        skip_space();
        if (s_.empty() || s_.front() != c) return false;
        s_.remove_prefix(1);
        return true;
    }
    void expect(char c) {
        if (!eat(c)) fail(std::string("expected '") + c + "' at '" + std::string(s_.substr(0, 20)) + "'");
    }
    std::string quoted() {
        skip_space();
        if (s_.empty() || (s_.front() != '\'' && s_.front() != '"')) fail("expected a quoted string");
        const char q = s_.front();
        const auto close = s_.find(q, 1);
        if (close == std::string_view::npos) fail("a string is not terminated");
        std::string out(s_.substr(1, close - 1));
        s_.remove_prefix(close + 1);
        return out;
    }
    bool boolean() {
        skip_space();
        for (auto [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
            if (s_.starts_with(word)) {
                s_.remove_prefix(std::strlen(word));
                return value;
            }
        fail("fortran_order is neither True nor False");
    }
    Shape tuple() {
        expect('(');
        Shape shape;
        while (!eat(')')) {
            skip_space();
            std::size_t n = 0;
            while (n < s_.size() && s_[n] >= '0' && s_[n] <= '9') ++n;
            const auto v = parse_count(s_.substr(0, n));
            if (!v) fail("the shape has an entry that is not a count");
            shape.push_back(*v);
            s_.remove_prefix(n);
            eat('L');  // Python 2 longs
            if (shape.size() > max_tensor_rank) fail("the shape has more than " + std::to_string(max_tensor_rank) + " dimensions");
            if (!eat(',')) {
                expect(')');
                break;
            }
        }
        return shape;
    }
    bool at_end() {
        skip_space();
        return s_.empty();
    }

private:
    std::string_view s_;
    std::string path_, member_;
};

inline NpyType parse_npy_descr(const std::string& descr, const NpyHeaderParser& p) {
    if (descr.size() < 2) p.fail("unknown descr '" + descr + "'");
    NpyType t;
    const char order = descr[0];
    if (order != '<' && order != '>' && order != '|' && order != '=') p.fail("unknown descr '" + descr + "'");
    t.big_endian = order == '>' && std::endian::native == std::endian::little;
    const std::string code = descr.substr(1);
    if (code[0] == 'U' || code[0] == 'S') {
        const auto n = parse_count(std::string_view(code).substr(1));
        if (!n) p.fail("unknown descr '" + descr + "'");
        t.string_kind = code[0];
        t.chars = static_cast<std::size_t>(*n);
        return t;
    }
    for (int c = 0; c < dtype_count; ++c)
        if (npy_descr(static_cast<DType>(c)).substr(1) == code) t.dtype = static_cast<DType>(c);
    if (!t.dtype)
        p.fail("dtype '" + descr + "' is not one ckpt holds (f2, f4, f8, i4, i8, u1, b1, or a string)");
    return t;
}

/// UTF-8 → code points, refusing malformed sequences.
inline std::vector<char32_t> utf8_to_utf32(std::string_view s, const std::string& what) {
    std::vector<char32_t> out;
    for (std::size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        const std::size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > s.size()) throw ConfigError(what + " is not valid UTF-8");
        char32_t c = len == 1 ? b : b & (0x7f >> len);
        for (std::size_t k = 1; k < len; ++k) {
            const auto cont = static_cast<unsigned char>(s[i + k]);
            if ((cont >> 6) != 2) throw ConfigError(what + " is not valid UTF-8");
            c = (c << 6) | (cont & 0x3f);
        }
        out.push_back(c);
        i += len;
    }
    return out;
}

/// Code points → UTF-8; false on a value that is no code point.
inline bool append_utf8(std::string& out, char32_t c) {
    if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return false;
    if (c < 0x80) {
        out += static_cast<char>(c);
    } else if (c < 0x800) {
        out += static_cast<char>(0xc0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        out += static_cast<char>(0xe0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (c & 0x3f));
    }
    return true;
}

/// The elements of a strided view of `src` (`stride[k]` elements apart along dimension k) into
/// `dst` in C (row-major) order; `width` bytes an element.
inline void gather_strided(const std::byte* src, std::byte* dst, const Shape& shape, const std::vector<std::size_t>& stride,
                           std::size_t width) {
    const std::size_t rank = shape.size();
    std::size_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::size_t>(d);
    if (numel == 0) return;
    std::vector<std::size_t> index(rank, 0);
    std::size_t from = 0;
    for (std::size_t out = 0; out < numel; ++out) {
        std::memcpy(dst + out * width, src + from * width, width);
        for (std::size_t k = rank; k-- > 0;) {  // the last index moves fastest in C order
            from += stride[k];
            if (++index[k] < static_cast<std::size_t>(shape[k])) break;
            from -= stride[k] * index[k];
            index[k] = 0;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// npz: the zip container, through libzip

struct ZipArchive {
    zip_t* za = nullptr;
    ~ZipArchive() {
        if (za) zip_discard(za);
    }
};

struct ZipFile {
    zip_file_t* zf = nullptr;
    ~ZipFile() {
        if (zf) zip_fclose(zf);
    }
};

inline std::string zip_error_text(int code) {
    zip_error_t e;
    zip_error_init_with_code(&e, code);
    std::string text = zip_error_strerror(&e);
    zip_error_fini(&e);
    return text;
}

/// Deflate expands at most about 1032:1; a member claiming more is damaged.
inline constexpr std::uint64_t max_deflate_ratio = 1032;

/// Refuses a member whose directory entry the readers cannot trust: encrypted, compressed
/// other than stored or deflated, or claiming more bytes than the file can hold.
inline void check_member_entry(const zip_stat_t& st, std::uint64_t file_bytes, std::string_view format,
                               const std::string& path, const std::string& member) {
    auto fail = [&](const std::string& why) { zip_format_fail(format, path, "member '" + member + "' " + why); };
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE) fail("is encrypted");
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || !(st.valid & ZIP_STAT_COMP_METHOD))
        fail("has no size in the zip directory");
    if (st.comp_method != ZIP_CM_STORE && st.comp_method != ZIP_CM_DEFLATE)
        fail("uses compression method " + std::to_string(st.comp_method) + " (stored and deflated are read)");
    if (st.comp_size > file_bytes || (st.comp_method == ZIP_CM_STORE ? st.size != st.comp_size
                                                                     : st.size > st.comp_size * max_deflate_ratio + 1024))
        fail("claims " + std::to_string(st.size) + " bytes from " + std::to_string(st.comp_size) + " stored, in a file of " +
             std::to_string(file_bytes));
}

/// Reads one member in order, never past the size its directory entry gives. Errors are
/// FormatErrors of the `format` ("npz", "PyTorch") naming the file and the member.
class MemberReader {
public:
    MemberReader(zip_t* za, zip_uint64_t index, std::uint64_t size, std::string path, std::string member,
                 std::string_view format = "npz")
        : file_{zip_fopen_index(za, index, 0)}, remaining_(size), path_(std::move(path)), member_(std::move(member)),
          format_(format) {
        if (!file_.zf) fail("member '" + member_ + "' cannot be opened: " + zip_strerror(za));
    }
    std::uint64_t remaining() const { return remaining_; }

    void read(std::byte* dst, std::uint64_t n) {
        if (n > remaining_)
            fail("member '" + member_ + "' has " + std::to_string(remaining_) + " bytes left where " +
                 std::to_string(n) + " are needed");
        while (n > 0) {
            const zip_int64_t r = zip_fread(file_.zf, dst, std::min<std::uint64_t>(n, std::uint64_t{1} << 30));
            if (r < 0) fail("member '" + member_ + "': " + zip_file_strerror(file_.zf));
            if (r == 0) fail("member '" + member_ + "' ends " + std::to_string(remaining_) + " bytes early");
            dst += r;
            n -= static_cast<std::uint64_t>(r);
            remaining_ -= static_cast<std::uint64_t>(r);
        }
    }

    /// `n` bytes in a string that grows with the bytes libzip delivers rather than with the
    /// claim: a deflated member's size may be up to max_deflate_ratio times what it stores,
    /// and a damaged one claims that much without holding it.
    std::string read_growing(std::uint64_t n) {
        std::string out;
        while (out.size() < n) {
            const std::size_t at = out.size();
            const auto chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n - at, std::uint64_t{1} << 16));
            if (at + chunk > out.capacity())  // doubling, but never past n
                out.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, std::max(2 * out.capacity(), at + chunk))));
            out.resize(at + chunk);
            read(reinterpret_cast<std::byte*>(out.data() + at), chunk);
        }
        return out;
    }

    /// After the last byte: reading on is where libzip checks the CRC.
    void finish() {
        std::byte extra{};
        if (zip_fread(file_.zf, &extra, 1) != 0)
            fail("member '" + member_ + "' fails its CRC check or is longer than its directory entry: " +
                 zip_file_strerror(file_.zf));
    }

private:
    [[noreturn]] void fail(const std::string& why) const { zip_format_fail(format_, path_, why); }

    ZipFile file_;
    std::uint64_t remaining_;
    std::string path_, member_;
    std::string_view format_;
};

/// Throws on an entry name that would make an unsafe or unreadable npz member "{name}.npy": a
/// NUL (which ends the name), an absolute path or a "." or ".." component (which unzip and
/// np.load's callers would put outside the folder they extract to), bytes that are not UTF-8.
inline void check_npz_member_name(const std::string& name, const std::string& path) {
    auto refuse = [&](const std::string& why) {
        throw ConfigError("cannot save '" + path + "': the entry name '" + name + "' would be the zip member '" + name +
                          ".npy', which " + why + "; rename it (ckpt export --rename FROM=TO)");
    };
    if (name.find('\0') != std::string::npos) refuse("a NUL byte would cut short");
    if (!name.empty() && (name.front() == '/' || name.front() == '\\'))
        refuse("is an absolute path, which an unzip writes outside the folder it extracts to");
    for (std::size_t at = 0; at <= name.size();) {
        const auto end = std::min(name.find_first_of("/\\", at), name.size());
        const std::string_view part = std::string_view(name).substr(at, end - at);
        if (part == ".." || part == ".")
            refuse("has a '" + std::string(part) + "' component, which an unzip follows outside the folder it extracts to");
        at = end + 1;
    }
    try {
        utf8_to_utf32(name, "");
    } catch (const ConfigError&) {
        refuse("is not valid UTF-8, as a zip member's name must be for NumPy to read it");
    }
}

}  // namespace detail

/// Writes `dict` as an npz file: one "{name}.npy" per entry, stored (np.savez) or deflated
/// (np.savez_compressed).
inline void save_npz(const ParamDict& dict, const PathArg& file, bool compressed = false) {
    const std::string path = file.string();
    for (const auto& [name, value] : dict) {
        detail::check_npz_member_name(name, path);
        if (const Tensor* t = value.get_if<Tensor>()) detail::check_bool_bytes(name, *t, path);
    }
    detail::AtomicFile out(file);
    if (dict.empty()) {  // libzip writes no file for an empty archive: the bare end record
        std::array<std::byte, 22> end{};
        detail::put_le<std::uint32_t>(end.data(), 0x06054b50u);
        detail::write_all(out.fd(), end.data(), end.size(), path);
        out.commit();
        return;
    }
    int err = 0;
    detail::ZipArchive zip{zip_open(out.temp_path().c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err)};
    if (!zip.za) throw IoError("cannot save '" + path + "': " + detail::zip_error_text(err), path);
    auto fail = [&](const std::string& what) -> void {
        throw IoError("cannot save '" + path + "': " + what + ": " + zip_strerror(zip.za), path);
    };
    // libzip reads the members at zip_close(): what they point to must live until then.
    std::vector<std::string> headers;
    std::vector<std::u32string> texts;
    headers.reserve(dict.size());
    texts.reserve(dict.size());
    for (const auto& [name, value] : dict) {
        const void* data = nullptr;  // the payload, when it is not in the header's string
        std::size_t nbytes = 0;
        // An int64, double or bool: its bytes follow the header in the same string.
        auto header_with = [&](DType dtype, const auto& scalar) {
            headers.push_back(detail::npy_header(detail::npy_descr(dtype), {}));
            headers.back().append(reinterpret_cast<const char*>(&scalar), sizeof scalar);
        };
        if (const Tensor* t = value.get_if<Tensor>()) {
            headers.push_back(detail::npy_header(detail::npy_descr(t->dtype()), t->logical_shape(),
                                                 t->order() == Order::column_major));
            data = t->data();
            nbytes = t->nbytes();
        } else if (const auto* s = value.get_if<std::string>()) {
            const auto points = detail::utf8_to_utf32(*s, "cannot save '" + path + "': string '" + name + "'");
            texts.emplace_back(points.begin(), points.end());
            if (texts.back().empty()) texts.back().push_back(U'\0');  // NumPy's '' is one NUL code point
            headers.push_back(detail::npy_header("<U" + std::to_string(texts.back().size()), {}));
            data = texts.back().data();
            nbytes = texts.back().size() * 4;
        } else if (const auto* i = value.get_if<std::int64_t>()) {
            header_with(DType::int64, *i);
        } else if (const auto* d = value.get_if<double>()) {
            header_with(DType::float64, *d);
        } else {
            header_with(DType::boolean, *value.get_if<bool>());
        }
        zip_buffer_fragment_t fragments[2] = {{reinterpret_cast<zip_uint8_t*>(headers.back().data()), headers.back().size()},
                                              {static_cast<zip_uint8_t*>(const_cast<void*>(data)), nbytes}};
        zip_source_t* src = zip_source_buffer_fragment(zip.za, fragments, nbytes == 0 ? 1 : 2, 0);
        if (!src) fail("member '" + name + ".npy'");
        // as NumPy (Python's zipfile) writes them: flagged UTF-8 only when beyond ASCII (libzip
        // refuses a UTF-8 name holding a control character, as a guess of CP437)
        const bool ascii = std::all_of(name.begin(), name.end(), [](char c) { return (c & 0x80) == 0; });
        const zip_int64_t index =
            zip_file_add(zip.za, (name + ".npy").c_str(), src, ascii ? ZIP_FL_ENC_CP437 : ZIP_FL_ENC_UTF_8);
        if (index < 0) {
            zip_source_free(src);
            fail("member '" + name + ".npy'");
        }
        const auto at = static_cast<zip_uint64_t>(index);
        if (zip_set_file_compression(zip.za, at, compressed ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0)
            fail("member '" + name + ".npy'");
        if (!value.is_tensor() &&
            zip_file_set_comment(zip.za, at, detail::npz_scalar_comment.data(),
                                 static_cast<zip_uint16_t>(detail::npz_scalar_comment.size()), 0) != 0)
            fail("member '" + name + ".npy'");
    }
    if (zip_close(zip.za) != 0) fail("writing the archive");
    zip.za = nullptr;
    out.reopen_replaced();  // libzip wrote a new file in place of the temporary
    out.commit();
}

namespace detail {
/// Reads the npz file at `path`: every member's npy header and, with `payloads`, its data into
/// `dict`. Without payloads (what `ckpt show` lists), tensors are described into `entries`,
/// their bytes (and their members' CRCs) not read; values, single strings and the scalars ckpt
/// marks, are read either way.
inline void read_npz(const std::string& path, const InteropLoadOptions& opts, bool payloads, ParamDict& dict,
                     std::vector<EntryMeta>& entries) {
    std::uint64_t file_bytes = 0;
    {
        auto fd = open_for_read(path);  // an IoError naming the file when it cannot be read
        file_bytes = file_size(fd.get(), path);
    }
    int err = 0;
    ZipArchive zip{zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err)};
    if (!zip.za) npz_fail(path, "it is not a readable zip archive: " + zip_error_text(err));
    DecodeBudget budget("npz file '" + path + "'", path, opts.max_decoded_bytes, file_bytes, interop_budget_option);
    std::unordered_set<std::string> names;
    auto add = [&](const std::string& name, Value v) {
        if (payloads) {
            dict.set(name, std::move(v));
            return;
        }
        EntryMeta& e = entries.emplace_back();
        e.name = name;
        e.kind = v.kind();
        e.scalar = std::move(v);
    };
    const zip_int64_t count = zip_get_num_entries(zip.za, 0);
    for (zip_int64_t k = 0; k < count; ++k) {
        const auto i = static_cast<zip_uint64_t>(k);
        zip_stat_t st;
        zip_stat_init(&st);
        // the name's bytes as stored: NumPy's names are ASCII or flagged UTF-8, and libzip's guess
        // would take an ASCII control character for CP437 (ESC for an arrow)
        if (zip_stat_index(zip.za, i, ZIP_FL_ENC_RAW, &st) != 0)
            npz_fail(path, "member " + std::to_string(k) + ": " + zip_strerror(zip.za));
        const std::string member = st.name ? st.name : "";
        if (!member.empty() && member.back() == '/') continue;  // a directory
        if (member.size() <= 4 || member.substr(member.size() - 4) != ".npy")
            npz_fail(path, "member '" + member + "' is not a .npy array");
        const std::string name = member.substr(0, member.size() - 4);
        auto fail = [&](const std::string& why) { npz_fail(path, "member '" + member + "' " + why); };
        check_member_entry(st, file_bytes, "npz", path, member);
        if (!names.insert(name).second) npz_fail(path, "'" + name + "' appears twice");
        auto take = [&](std::uint64_t n) {
            budget.take(n, [&] { return "member '" + member + "' unpacks to " + std::to_string(st.size) + " bytes"; });
        };

        MemberReader in(zip.za, i, st.size, path, member);
        std::array<std::byte, 12> prelude{};
        in.read(prelude.data(), 10);
        if (std::memcmp(prelude.data(), npy_magic.data(), npy_magic.size()) != 0)
            fail("is not an npy array (bad magic bytes)");
        const auto major = static_cast<unsigned>(prelude[6]);
        if (major < 1 || major > 3) fail("has npy format version " + std::to_string(major) + " (1 to 3 are read)");
        std::uint64_t header_len = get_le<std::uint16_t>(prelude.data() + 8);
        if (major > 1) {
            in.read(prelude.data() + 10, 2);
            header_len = get_le<std::uint32_t>(prelude.data() + 8);
        }
        if (header_len > in.remaining())
            fail("has an npy header of " + std::to_string(header_len) + " bytes, more than the member's " +
                 std::to_string(in.remaining()) + " left");
        take(header_len);
        const std::string header = in.read_growing(header_len);

        NpyHeaderParser parser(header, path, member);
        std::optional<NpyType> type;
        std::optional<bool> fortran;
        std::optional<Shape> shape;
        parser.expect('{');
        while (!parser.eat('}')) {
            const std::string key = parser.quoted();
            parser.expect(':');
            if (key == "descr") type = parse_npy_descr(parser.quoted(), parser);
            else if (key == "fortran_order") fortran = parser.boolean();
            else if (key == "shape") shape = parser.tuple();
            else parser.fail("unknown key '" + key + "'");
            if (!parser.eat(',')) {
                parser.expect('}');
                break;
            }
        }
        if (!parser.at_end()) parser.fail("text after the dict");
        if (!type || !fortran || !shape) parser.fail("descr, fortran_order or shape is missing");

        std::size_t numel = 0;
        try {
            numel = checked_numel(*shape, static_cast<std::size_t>(in.remaining()));
        } catch (const FormatError&) {
            fail("has an impossible shape " + shape_string(*shape));
        }
        const std::size_t width = type->itemsize();
        const bool overflow = width != 0 && numel > std::numeric_limits<std::uint64_t>::max() / width;
        const std::uint64_t nbytes = numel * width;
        if (overflow || nbytes != in.remaining())
            fail("holds " + std::to_string(in.remaining()) + " data bytes, its header describes " +
                 (overflow ? "more" : std::to_string(nbytes)));
        const bool scalar_marked = [&] {
            zip_uint32_t len = 0;
            const char* c = zip_file_get_comment(zip.za, i, &len, 0);
            return c && std::string_view(c, len) == npz_scalar_comment;
        }();

        if (type->string_kind) {
            if (!shape->empty()) fail("is an array of strings; only single strings are read");
            take(nbytes);
            const std::string raw = in.read_growing(nbytes);
            in.finish();
            std::string text;
            if (type->string_kind == 'S') {
                text = raw;
            } else {
                for (std::size_t c = 0; c < type->chars; ++c) {
                    auto code = get_le<std::uint32_t>(reinterpret_cast<const std::byte*>(raw.data()) + 4 * c);
                    if (type->big_endian) code = __builtin_bswap32(code);
                    if (!append_utf8(text, static_cast<char32_t>(code)))
                        fail("holds a string with the invalid code point " + std::to_string(code));
                }
            }
            text.erase(text.find_last_not_of('\0') + 1);  // NumPy pads with NULs (npos + 1: all of it)
            add(name, std::move(text));
            continue;
        }
        const DType dtype = *type->dtype;
        const bool value = scalar_marked && shape->empty() &&
                           (dtype == DType::int64 || dtype == DType::float64 || dtype == DType::boolean);
        const Order order = *fortran ? Order::column_major : Order::row_major;
        if (!payloads && !value) {
            EntryMeta& e = entries.emplace_back();
            e.name = name;
            e.kind = ValueKind::tensor;
            e.dtype = dtype;
            e.order = order;
            e.shape = order == Order::column_major ? reversed(*shape) : *shape;  // as stored, like a tensor's shape()
            e.nbytes = nbytes;
            continue;
        }
        take(nbytes);
        // a Fortran-ordered array is a column-major tensor: its bytes as they are
        Tensor t = Tensor::uninitialized(dtype, *shape, order);
        in.read(t.data(), t.nbytes());
        in.finish();
        if (type->big_endian) swap_bytes(t.data(), t.nbytes(), width);
        if (dtype == DType::boolean)
            for (std::size_t b = 0; b < t.nbytes(); ++b)
                if (static_cast<unsigned>(t.data()[b]) > 1) fail("holds a bool that is neither 0 nor 1");
        if (!value) add(name, std::move(t));
        else if (dtype == DType::int64) add(name, t.values<std::int64_t>()[0]);
        else if (dtype == DType::float64) add(name, t.values<double>()[0]);
        else add(name, t.values<bool>()[0]);
    }
}
}  // namespace detail

/// Reads an npz file (np.savez or np.savez_compressed): one entry per "{name}.npy" member,
/// in the archive's order.
inline ParamDict load_npz(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict dict;
        std::vector<detail::EntryMeta> unused;
        detail::read_npz(path, opts, true, dict, unused);
        return dict;
    });
}

/// What load_npz would return, in its order, as a table of contents: each tensor's dtype,
/// shape and storage order from its npy header, its bytes not read (nor their CRC checked);
/// values and strings with their value. Reads the zip directory and each member's header.
inline std::vector<detail::EntryMeta> npz_contents(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict unused;
        std::vector<detail::EntryMeta> entries;
        detail::read_npz(path, opts, false, unused, entries);
        return entries;
    });
}


namespace detail {

// ---------------------------------------------------------------------------------------------
// PyTorch: what torch.save writes since 1.6, a zip of "{archive}/data.pkl" (a pickle of the
// saved object, protocol 2), "{archive}/data/{key}" (the bytes of each storage, stored),
// "{archive}/version" and, since 2.1, "{archive}/byteorder". Tensors are pickled as calls of
// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
// backward_hooks), each storage as the persistent id ("storage", torch.FloatStorage, key,
// location, numel). The reader below takes that and nothing more: it builds dicts, lists,
// tuples and plain values itself, and every global the pickle names is looked up in a fixed
// table; none is ever called.

[[noreturn]] inline void torch_fail(const std::string& path, const std::string& why) { zip_format_fail("PyTorch", path, why); }

/// What torch.save's pickles before the zip format start with: the legacy magic number
/// 0x1950a86a20f9469cfc6c as a pickled int (LONG1, 10 bytes).
inline constexpr std::string_view torch_legacy_magic = "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

/// A global a torch.save pickle may name, and what the reader makes of it.
struct TorchGlobal {
    enum Role : std::uint8_t { ordered_dict, rebuild_tensor, rebuild_parameter, device, storage };
    std::string_view module, name;
    Role role;
    std::optional<DType> dtype = std::nullopt;  // a storage type: its elements, when ckpt holds them
    std::string_view dtype_text = {};           // a storage type: PyTorch's name of its elements
    std::size_t itemsize = 0;
};

inline constexpr TorchGlobal torch_globals[] = {
    {"collections", "OrderedDict", TorchGlobal::ordered_dict},
    {"torch._utils", "_rebuild_tensor_v2", TorchGlobal::rebuild_tensor},
    {"torch._utils", "_rebuild_parameter", TorchGlobal::rebuild_parameter},
    {"torch", "device", TorchGlobal::device},
    {"torch", "FloatStorage", TorchGlobal::storage, DType::float32, "float32", 4},
    {"torch", "DoubleStorage", TorchGlobal::storage, DType::float64, "float64", 8},
    {"torch", "HalfStorage", TorchGlobal::storage, DType::float16, "float16", 2},
    {"torch", "IntStorage", TorchGlobal::storage, DType::int32, "int32", 4},
    {"torch", "LongStorage", TorchGlobal::storage, DType::int64, "int64", 8},
    {"torch", "ByteStorage", TorchGlobal::storage, DType::uint8, "uint8", 1},
    {"torch", "BoolStorage", TorchGlobal::storage, DType::boolean, "bool", 1},
    // storage types whose elements ckpt does not hold: known, so that the error names the tensor
    {"torch", "BFloat16Storage", TorchGlobal::storage, std::nullopt, "bfloat16", 2},
    {"torch", "CharStorage", TorchGlobal::storage, std::nullopt, "int8", 1},
    {"torch", "ShortStorage", TorchGlobal::storage, std::nullopt, "int16", 2},
    {"torch", "ComplexFloatStorage", TorchGlobal::storage, std::nullopt, "complex64", 8},
    {"torch", "ComplexDoubleStorage", TorchGlobal::storage, std::nullopt, "complex128", 16},
    {"torch", "QInt8Storage", TorchGlobal::storage, std::nullopt, "qint8", 1},
    {"torch", "QUInt8Storage", TorchGlobal::storage, std::nullopt, "quint8", 1},
    {"torch", "QInt32Storage", TorchGlobal::storage, std::nullopt, "qint32", 4},
    {"torch", "QUInt4x2Storage", TorchGlobal::storage, std::nullopt, "quint4x2", 1},
    {"torch", "QUInt2x4Storage", TorchGlobal::storage, std::nullopt, "quint2x4", 1},
};

/// A value of the pickle. Booleans, ints and floats are held here; strings, containers,
/// storages and tensors are indices into the unpickler's tables, so that what the pickle's
/// memo shares stays shared, and a container that holds itself is no cycle of owners.
struct PyRef {
    enum Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, tuple, list, dict, global, storage, tensor };
    Kind kind = none;
    std::int64_t i = 0;  // a boolean's or int's value; the table index of the others
    double f = 0;
};

inline std::string py_kind_name(PyRef::Kind k) {
    switch (k) {
        case PyRef::none: return "None";
        case PyRef::boolean: return "bool";
        case PyRef::integer: return "int";
        case PyRef::floating: return "float";
        case PyRef::string: return "str";
        case PyRef::bytes: return "bytes";
        case PyRef::tuple: return "tuple";
        case PyRef::list: return "list";
        case PyRef::dict: return "dict";
        case PyRef::global: return "Python global";
        case PyRef::storage: return "torch storage";
        case PyRef::tensor: return "tensor";
    }
    return "?";
}

/// A storage as a persistent id names it: the record "data/{key}", its type (an index into
/// torch_globals) and its number of elements.
struct TorchStorageRef {
    std::string key;
    std::size_t type = 0;
    std::uint64_t numel = 0;
};

/// The arguments of one _rebuild_tensor_v2 call, checked for their types only.
struct TorchTensorRef {
    std::size_t storage = 0;
    std::uint64_t offset = 0;
    Shape size;
    std::vector<std::uint64_t> stride;
};

/// The restricted unpickler: the opcodes of protocols 2 to 5 that torch.save's pickles of
/// dicts, lists, tuples, plain values and tensors use (protocol 2 unless pickle_protocol is
/// given; FRAME, SHORT_BINUNICODE, STACK_GLOBAL and MEMOIZE come with 4 and 5). Anything else
/// is a FormatError naming the file, the record and the byte.
class TorchUnpickler {
public:
    /// Every opcode takes op_cost of `budget`, and every string its bytes: what a pickle can
    /// build is bounded by the budget, however it is packed (a deflated list of 8 million ints).
    TorchUnpickler(std::string_view pickle, std::string path, std::string member, DecodeBudget& budget)
        : data_(pickle), path_(std::move(path)), member_(std::move(member)), budget_(budget) {}

    /// What an opcode may cost in memory: its value on the stack and in the container it joins.
    static constexpr std::uint64_t op_cost = 2 * sizeof(PyRef);

    std::vector<std::string> strings;            // str and bytes values
    std::vector<std::vector<PyRef>> containers;  // tuple and list items; a dict's keys and values, alternating
    std::vector<TorchStorageRef> storages;
    std::vector<TorchTensorRef> tensors;

    /// The pickled object.
    PyRef run() {
        while (pos_ < data_.size()) {
            op_at_ = pos_;
            budget_.take(op_cost, [&] { return "the objects of its pickle (record '" + member_ + "', byte " + std::to_string(op_at_) + ")"; });
            const auto op = static_cast<unsigned char>(data_[pos_++]);
            switch (op) {
                case 0x80: {  // PROTO
                    const unsigned v = byte();
                    if (v < 2 || v > 5) fail("pickle protocol " + std::to_string(v) + " (2 to 5 are read)");
                    break;
                }
                case 0x95: take(8); break;  // FRAME: the length of what follows, a hint for readers of streams
                case '.': return pop();     // STOP
                case '(': marks_.push_back(stack_.size()); break;  // MARK
                case '}': push(container(PyRef::dict, {})); break;
                case ']': push(container(PyRef::list, {})); break;
                case ')': push(container(PyRef::tuple, {})); break;
                case 't': push(container(PyRef::tuple, pop_mark())); break;
                case 0x85:  // TUPLE1, TUPLE2, TUPLE3
                case 0x86:
                case 0x87: {
                    const std::size_t n = op - 0x84u;
                    if (stack_.size() < fence() + n) fail("TUPLE" + std::to_string(n) + " on a stack of fewer items");
                    std::vector<PyRef> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
                    stack_.resize(stack_.size() - n);
                    push(container(PyRef::tuple, std::move(items)));
                    break;
                }
                case 'X': push(text(PyRef::string, le<std::uint32_t>())); break;     // BINUNICODE
                case 0x8c: push(text(PyRef::string, byte())); break;                  // SHORT_BINUNICODE
                case 0x8d: push(text(PyRef::string, le<std::uint64_t>())); break;     // BINUNICODE8
                case 'B': push(text(PyRef::bytes, le<std::uint32_t>())); break;       // BINBYTES
                case 'C': push(text(PyRef::bytes, byte())); break;                    // SHORT_BINBYTES
                case 'J': push(integer(le<std::int32_t>())); break;                   // BININT
                case 'K': push(integer(byte())); break;                               // BININT1
                case 'M': push(integer(le<std::uint16_t>())); break;                  // BININT2
                case 0x8a: {                                                          // LONG1
                    const unsigned n = byte();
                    if (n > 8) fail("an int of " + std::to_string(n) + " bytes (ckpt holds 64-bit ints)");
                    const auto bytes = take(n);
                    std::uint64_t u = 0;
                    for (unsigned k = 0; k < n; ++k) u |= std::uint64_t{static_cast<unsigned char>(bytes[k])} << (8 * k);
                    if (n > 0 && n < 8 && (static_cast<unsigned char>(bytes[n - 1]) & 0x80))  // negative: sign-extend
                        u |= ~std::uint64_t{0} << (8 * n);
                    push(integer(static_cast<std::int64_t>(u)));
                    break;
                }
                case 'G': {  // BINFLOAT: big-endian
                    const auto bytes = take(8);
                    std::uint64_t u = 0;
                    for (unsigned k = 0; k < 8; ++k) u = (u << 8) | static_cast<unsigned char>(bytes[k]);
                    push(PyRef{PyRef::floating, 0, std::bit_cast<double>(u)});
                    break;
                }
                case 0x88: push(PyRef{PyRef::boolean, 1}); break;  // NEWTRUE
                case 0x89: push(PyRef{PyRef::boolean, 0}); break;  // NEWFALSE
                case 'N': push(PyRef{}); break;                     // NONE
                case 'q': memo_[byte()] = top(); break;             // BINPUT
                case 'r': memo_[le<std::uint32_t>()] = top(); break;  // LONG_BINPUT
                case 0x94: {                                          // MEMOIZE
                    const auto at = static_cast<std::uint32_t>(memo_.size());
                    memo_[at] = top();
                    break;
                }
                case 'h': push(memo(byte())); break;                  // BINGET
                case 'j': push(memo(le<std::uint32_t>())); break;     // LONG_BINGET
                case 'c': {                                           // GLOBAL "module\nname\n"
                    const std::string module(line()), name(line());
                    push(global(module, name));
                    break;
                }
                case 0x93: {  // STACK_GLOBAL
                    const PyRef name = pop(), module = pop();
                    if (name.kind != PyRef::string || module.kind != PyRef::string)
                        fail("STACK_GLOBAL of a " + py_kind_name(module.kind) + " and a " + py_kind_name(name.kind));
                    push(global(strings[static_cast<std::size_t>(module.i)], strings[static_cast<std::size_t>(name.i)]));
                    break;
                }
                case 'R': {  // REDUCE: callable(*args)
                    const PyRef args = pop(), callable = pop();
                    if (callable.kind != PyRef::global) fail("REDUCE calls a " + py_kind_name(callable.kind));
                    if (args.kind != PyRef::tuple) fail("REDUCE with a " + py_kind_name(args.kind) + " of arguments");
                    push(reduce(torch_globals[callable.i], items_of(args)));
                    break;
                }
                case 'b': {  // BUILD: an OrderedDict's attributes (a state_dict's _metadata); not entries
                    const PyRef state = pop(), object = top();
                    if (object.kind != PyRef::dict || state.kind != PyRef::dict)
                        fail("BUILD of a " + py_kind_name(object.kind) + " from a " + py_kind_name(state.kind) +
                             " (only an OrderedDict's attributes are taken, and left out)");
                    break;
                }
                case 's': {  // SETITEM
                    const PyRef value = pop(), key = pop();
                    add_to(PyRef::dict, {key, value});
                    break;
                }
                case 'u': {  // SETITEMS
                    auto items = pop_mark();
                    if (items.size() % 2) fail("SETITEMS with a key and no value");
                    add_to(PyRef::dict, std::move(items));
                    break;
                }
                case 'a': add_to(PyRef::list, {pop()}); break;    // APPEND
                case 'e': add_to(PyRef::list, pop_mark()); break;  // APPENDS
                case 'Q': push(persistent(pop())); break;          // BINPERSID
                default: {
                    static constexpr char hex[] = "0123456789abcdef";
                    fail(std::string("opcode 0x") + hex[op >> 4] + hex[op & 15] + ", which torch.save's pickles do not use");
                }
            }
        }
        fail("ends without a STOP opcode");
    }

private:
    [[noreturn]] void fail(const std::string& why) const {
        torch_fail(path_, "record '" + member_ + "', byte " + std::to_string(op_at_) + ": " + why);
    }

    std::string_view take(std::uint64_t n) {
        if (n > data_.size() - pos_) fail("the record ends inside an opcode's argument");
        const auto out = data_.substr(pos_, static_cast<std::size_t>(n));
        pos_ += static_cast<std::size_t>(n);
        return out;
    }
    unsigned byte() { return static_cast<unsigned char>(take(1)[0]); }
    template <class T>
    T le() {
        return get_le<T>(reinterpret_cast<const std::byte*>(take(sizeof(T)).data()));
    }
    std::string_view line() {
        const auto end = data_.find('\n', pos_);
        if (end == std::string_view::npos || end - pos_ > 256) fail("GLOBAL without a name ending in a newline");
        const std::size_t n = end - pos_;
        return take(n + 1).substr(0, n);
    }

    /// The stack above the innermost MARK is what opcodes take from.
    std::size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
    void push(PyRef v) { stack_.push_back(v); }
    PyRef pop() {
        if (stack_.size() <= fence()) fail("an opcode takes from an empty stack");
        const PyRef v = stack_.back();
        stack_.pop_back();
        return v;
    }
    PyRef top() const {
        if (stack_.size() <= fence()) fail("an opcode uses the top of an empty stack");
        return stack_.back();
    }
    std::vector<PyRef> pop_mark() {
        if (marks_.empty()) fail("an opcode takes the items after a MARK, and there is none");
        const std::size_t at = marks_.back();
        marks_.pop_back();
        std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
        stack_.resize(at);
        return items;
    }
    PyRef memo(std::uint32_t at) const {
        const auto it = memo_.find(at);
        if (it == memo_.end()) fail("memo entry " + std::to_string(at) + " is read before it is written");
        return it->second;
    }

    static PyRef integer(std::int64_t v) { return PyRef{PyRef::integer, v}; }
    PyRef text(PyRef::Kind kind, std::uint64_t n) {
        const std::string_view bytes = take(n);
        budget_.take(bytes.size(), [&] { return "the strings of its pickle (record '" + member_ + "', byte " + std::to_string(op_at_) + ")"; });
        strings.emplace_back(bytes);
        return PyRef{kind, static_cast<std::int64_t>(strings.size() - 1)};
    }
    PyRef container(PyRef::Kind kind, std::vector<PyRef> items) {
        containers.push_back(std::move(items));
        return PyRef{kind, static_cast<std::int64_t>(containers.size() - 1)};
    }
    std::vector<PyRef> items_of(const PyRef& v) const { return containers[static_cast<std::size_t>(v.i)]; }
    void add_to(PyRef::Kind kind, std::vector<PyRef> items) {
        const PyRef target = top();
        if (target.kind != kind)
            fail((kind == PyRef::dict ? "SETITEM on a " : "APPEND to a ") + py_kind_name(target.kind));
        auto& to = containers[static_cast<std::size_t>(target.i)];
        to.insert(to.end(), items.begin(), items.end());
    }

    PyRef global(std::string_view module, std::string_view name) const {
        for (std::size_t g = 0; g < std::size(torch_globals); ++g)
            if (torch_globals[g].module == module && torch_globals[g].name == name)
                return PyRef{PyRef::global, static_cast<std::int64_t>(g)};
        throw FormatError("PyTorch file '" + path_ + "' refers to the Python global '" + std::string(module) + "." +
                              std::string(name) +
                              "', which ckpt does not load: it reads tensors, dicts, lists, tuples and plain values, "
                              "and never constructs an object or calls a function that a file names",
                          path_);
    }

    /// A storage's persistent id: ("storage", storage type, key, location, numel).
    PyRef persistent(const PyRef& id) {
        const auto items = id.kind == PyRef::tuple ? items_of(id) : std::vector<PyRef>{};
        const auto is = [&](std::size_t k, PyRef::Kind kind) { return items.size() > k && items[k].kind == kind; };
        if (items.size() != 5 || !is(0, PyRef::string) || strings[static_cast<std::size_t>(items[0].i)] != "storage" ||
            !is(1, PyRef::global) || torch_globals[items[1].i].role != TorchGlobal::storage || !is(2, PyRef::string) ||
            !is(3, PyRef::string) || !is(4, PyRef::integer) || items[4].i < 0)
            fail("a persistent id that is not ('storage', storage type, key, location, numel)");
        const std::string& key = strings[static_cast<std::size_t>(items[2].i)];
        if (key.empty() || key.size() > 64 ||
            !std::all_of(key.begin(), key.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
            fail("a storage key that is not a plain name");
        // A key seen before is that storage, whatever type and size this reference gives: so
        // torch.load reads it (its first reference makes the storage, later ones reuse it), and
        // so a tensor over it has the first reference's dtype.
        if (const auto seen = storage_by_key_.find(key); seen != storage_by_key_.end())
            return PyRef{PyRef::storage, static_cast<std::int64_t>(seen->second)};
        storage_by_key_.emplace(key, storages.size());
        storages.push_back({key, static_cast<std::size_t>(items[1].i), static_cast<std::uint64_t>(items[4].i)});
        return PyRef{PyRef::storage, static_cast<std::int64_t>(storages.size() - 1)};
    }

    /// Sizes and strides: tuples of non-negative ints, at most max_tensor_rank of them.
    std::vector<std::uint64_t> dims(const PyRef& v, const char* what) const {
        if (v.kind != PyRef::tuple) fail(std::string("_rebuild_tensor_v2 with a ") + py_kind_name(v.kind) + " for " + what);
        const auto& items = containers[static_cast<std::size_t>(v.i)];
        if (items.size() > max_tensor_rank)
            fail(std::string("a tensor ") + what + " of more than " + std::to_string(max_tensor_rank) + " dimensions");
        std::vector<std::uint64_t> out;
        for (const auto& d : items) {
            if (d.kind != PyRef::integer || d.i < 0) fail(std::string("a tensor ") + what + " that is not all non-negative ints");
            out.push_back(static_cast<std::uint64_t>(d.i));
        }
        return out;
    }

    PyRef reduce(const TorchGlobal& g, const std::vector<PyRef>& args) {
        const std::string call = std::string(g.module) + "." + std::string(g.name) + "() ";
        switch (g.role) {
            case TorchGlobal::ordered_dict:
                if (!args.empty()) fail(call + "with arguments");
                return container(PyRef::dict, {});
            case TorchGlobal::rebuild_parameter:  // (data, requires_grad, backward_hooks)
                if (args.size() != 3 || args[0].kind != PyRef::tensor) fail(call + "with other arguments than a tensor's");
                return args[0];
            case TorchGlobal::device: {  // ("cuda", 0) -> "cuda:0"
                if (args.empty() || args.size() > 2 || args[0].kind != PyRef::string ||
                    (args.size() == 2 && args[1].kind != PyRef::integer && args[1].kind != PyRef::none))
                    fail(call + "with other arguments than a device type and index");
                std::string text = strings[static_cast<std::size_t>(args[0].i)];
                if (args.size() == 2 && args[1].kind == PyRef::integer) text += ":" + std::to_string(args[1].i);
                strings.push_back(std::move(text));
                return PyRef{PyRef::string, static_cast<std::int64_t>(strings.size() - 1)};
            }
            case TorchGlobal::rebuild_tensor: {
                // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
                if ((args.size() != 6 && args.size() != 7) || args[0].kind != PyRef::storage ||
                    args[1].kind != PyRef::integer || args[1].i < 0 || args[4].kind != PyRef::boolean ||
                    args[5].kind != PyRef::dict ||
                    (args.size() == 7 && args[6].kind != PyRef::none &&
                     (args[6].kind != PyRef::dict || !containers[static_cast<std::size_t>(args[6].i)].empty())))
                    fail(call + "with other arguments than (storage, offset, size, stride, requires_grad, hooks)");
                TorchTensorRef t;
                t.storage = static_cast<std::size_t>(args[0].i);
                t.offset = static_cast<std::uint64_t>(args[1].i);
                for (const auto d : dims(args[2], "size")) {
                    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) fail("an impossible size");
                    t.size.push_back(static_cast<std::int64_t>(d));
                }
                t.stride = dims(args[3], "stride");
                if (t.stride.size() != t.size.size()) fail(call + "with " + std::to_string(t.size.size()) + " sizes and " +
                                                           std::to_string(t.stride.size()) + " strides");
                tensors.push_back(std::move(t));
                return PyRef{PyRef::tensor, static_cast<std::int64_t>(tensors.size() - 1)};
            }
            case TorchGlobal::storage: break;
        }
        fail(call + "is not a call torch.save's pickles make");
    }

    std::string_view data_;
    std::string path_, member_;
    std::size_t pos_ = 0, op_at_ = 0;
    std::vector<PyRef> stack_;
    std::vector<std::size_t> marks_;
    std::unordered_map<std::uint32_t, PyRef> memo_;
    std::unordered_map<std::string, std::size_t> storage_by_key_;
    DecodeBudget& budget_;
};

/// Nested dicts, lists and tuples → (dotted name, leaf) pairs, in the pickle's order.
class TorchFlattener {
public:
    /// Visits may cost at most `budget` (a visit costs its name's length + 1): a small pickle
    /// whose shared containers hold each other many times over expands exponentially.
    TorchFlattener(const TorchUnpickler& u, std::string path, std::uint64_t budget, DecodeBudget& decoded)
        : u_(u), path_(std::move(path)), budget_(budget), decoded_(decoded) {}

    /// What an entry of the result costs besides its name: its place here, in the ParamDict
    /// and in the ParamDict's index.
    static constexpr std::uint64_t entry_cost = sizeof(std::pair<std::string, PyRef>) + sizeof(ParamDict::Entry) + 64;

    std::vector<std::pair<std::string, PyRef>> entries;

    void walk(const PyRef& v, const std::string& name, std::size_t depth) {
        const std::string where = name.empty() ? "the top level" : "'" + name + "'";
        spent_ += name.size() + 1;
        if (spent_ > budget_)
            torch_fail(path_, "its dicts and lists expand to more than " + std::to_string(budget_) +
                                  " bytes of entry names (containers shared many times over)");
        switch (v.kind) {
            case PyRef::none: return;
            case PyRef::dict:
            case PyRef::list:
            case PyRef::tuple: {
                if (depth >= max_depth)
                    torch_fail(path_, "its dicts and lists nest more than " + std::to_string(max_depth) + " deep at " + where);
                const auto& items = u_.containers[static_cast<std::size_t>(v.i)];
                const std::string prefix = name.empty() ? name : name + ".";
                if (v.kind != PyRef::dict) {
                    for (std::size_t k = 0; k < items.size(); ++k) walk(items[k], prefix + std::to_string(k), depth + 1);
                    return;
                }
                for (std::size_t k = 0; k + 1 < items.size(); k += 2) {
                    const PyRef& key = items[k];
                    if (key.kind == PyRef::string) walk(items[k + 1], prefix + u_.strings[static_cast<std::size_t>(key.i)], depth + 1);
                    else if (key.kind == PyRef::integer) walk(items[k + 1], prefix + std::to_string(key.i), depth + 1);
                    else torch_fail(path_, "a dict at " + where + " has a key of type " + py_kind_name(key.kind) + " (str and int keys are read)");
                }
                return;
            }
            case PyRef::boolean:
            case PyRef::integer:
            case PyRef::floating:
            case PyRef::string:
            case PyRef::tensor:
                decoded_.take(2 * name.size() + entry_cost, [&] { return "its entries, at " + where; });
                entries.emplace_back(name, v);
                return;
            case PyRef::bytes:
            case PyRef::global:
            case PyRef::storage: break;
        }
        torch_fail(path_, "entry " + where + " holds a " + py_kind_name(v.kind) +
                              ", which ckpt does not hold (tensors, ints, floats, bools and strings, in dicts, lists and tuples)");
    }

    static constexpr std::size_t max_depth = 64;

private:
    const TorchUnpickler& u_;
    std::string path_;
    std::uint64_t budget_, spent_ = 0;
    DecodeBudget& decoded_;
};

/// Makes the tensors of a torch.save file, reading each storage record once, when a tensor
/// first needs it. Contiguous tensors alias their storage (tensors that shared memory in
/// PyTorch share it here too); non-contiguous ones are copied into C order, at most four
/// times the bytes of the storages read so far.
class TorchTensorMaker {
public:
    /// Each storage record read, and each tensor made (its bytes are what a caller copies or
    /// writes, though views share them here), takes its bytes of `budget`.
    TorchTensorMaker(zip_t* za, const TorchUnpickler& u, std::string path, std::string prefix, std::uint64_t file_bytes,
                     bool swap, DecodeBudget& budget)
        : za_(za), u_(u), path_(std::move(path)), prefix_(std::move(prefix)), file_bytes_(file_bytes), swap_(swap),
          made_(u.tensors.size()), budget_(budget) {}

    /// Tensor `index` under `name`: its storage read on first use.
    Tensor make(std::size_t index, const std::string& name) {
        if (made_[index]) return *made_[index];  // the same tensor object under several names (tied weights)
        const TorchTensorRef& t = u_.tensors[index];
        const TorchStorageRef& s = u_.storages[t.storage];
        const View v = check(index, name);
        auto fail = [&](const std::string& why) { torch_fail(path_, "tensor '" + name + "' " + why); };
        if (v.numel == 0) return remember(index, Tensor::uninitialized(v.dtype, t.size));
        const std::byte* base = storage_bytes(s, v.width, name) + t.offset * v.width;
        budget_.take(v.numel * v.width,
                     [&] { return "tensor '" + name + "' (" + v.what + ") among views of the storages read"; });
        Tensor out;
        if (v.contiguous) {
            out = Tensor::aliasing(v.dtype, t.size, blocks_.at(s.key).data, const_cast<std::byte*>(base));
        } else {
            copied_ += v.numel * v.width;
            if (copied_ > 4 * read_)
                fail("(" + v.what + ") is one of non-contiguous views that add up to " + std::to_string(copied_) +
                     " bytes, more than four times the " + std::to_string(read_) +
                     " bytes of the storages read so far; save them with .contiguous()");
            out = Tensor::uninitialized(v.dtype, t.size);
            gather_strided(base, out.data(), t.size, std::vector<std::size_t>(t.stride.begin(), t.stride.end()), v.width);
        }
        if (v.dtype == DType::boolean)
            for (std::size_t b = 0; b < out.nbytes(); ++b)
                if (static_cast<unsigned>(out.data()[b]) > 1) fail("holds a bool that is neither 0 nor 1");
        return remember(index, std::move(out));
    }

    /// Tensor `index` under `name` as a table of contents lists it: its dtype and shape, checked
    /// against its storage's persistent id and the size of the storage's record in the zip
    /// directory; no byte of the storage is read.
    EntryMeta describe(std::size_t index, const std::string& name) {
        const TorchTensorRef& t = u_.tensors[index];
        const View v = check(index, name);
        if (v.numel > 0) storage_record(u_.storages[t.storage], v.width, name);
        EntryMeta e;
        e.name = name;
        e.kind = ValueKind::tensor;
        e.dtype = v.dtype;
        e.shape = t.size;
        e.nbytes = v.numel * v.width;
        return e;
    }

private:
    /// What a tensor's arguments say, checked against its storage's persistent id.
    struct View {
        DType dtype;
        std::size_t width = 0, numel = 0;
        bool contiguous = true;
        std::string what;  // "float32[2, 3]"
    };

    View check(std::size_t index, const std::string& name) const {
        const TorchTensorRef& t = u_.tensors[index];
        const TorchStorageRef& s = u_.storages[t.storage];
        const TorchGlobal& type = torch_globals[s.type];
        auto fail = [&](const std::string& why) { torch_fail(path_, "tensor '" + name + "' " + why); };
        if (!type.dtype)
            throw FormatError("PyTorch file '" + path_ + "': tensor '" + name + "' has dtype " + std::string(type.dtype_text) +
                                  ", which ckpt does not hold (float32, float64, float16, int32, int64, uint8, bool); "
                                  "convert it before saving, e.g. with .float()",
                              path_);
        View v;
        v.dtype = *type.dtype;
        v.width = itemsize(v.dtype);
        v.what = std::string(dtype_name(v.dtype)) + shape_string(t.size);
        const std::string& what = v.what;
        std::size_t& numel = v.numel;
        try {
            numel = checked_numel(t.size, std::numeric_limits<std::size_t>::max() / v.width);
        } catch (const FormatError&) {
            fail("has an impossible shape " + shape_string(t.size));
        }
        if (numel == 0) return v;
        const std::string storage = "storage '" + s.key + "' of " + std::to_string(s.numel) + " elements";
        if (numel > s.numel)
            fail("(" + what + ") has more elements than its " + storage +
                 ": an expanded view, which ckpt does not rebuild; save it with .contiguous()");
        // The furthest element the view reaches, checked against the storage term by term.
        if (t.offset >= s.numel) fail("(" + what + ") starts at element " + std::to_string(t.offset) + " of its " + storage);
        std::uint64_t last = t.offset;
        for (std::size_t k = 0; k < t.size.size(); ++k) {
            const auto span = static_cast<std::uint64_t>(t.size[k]) - 1;
            if (span == 0 || t.stride[k] == 0) continue;
            if (span > (s.numel - 1 - last) / t.stride[k])
                fail("(" + what + ", offset " + std::to_string(t.offset) + ", strides " + strides_text(t.stride) +
                     ") reaches past the end of its " + storage);
            last += span * t.stride[k];
        }
        std::uint64_t expected = 1;
        for (std::size_t k = t.size.size(); k-- > 0;) {
            if (t.size[k] != 1 && t.stride[k] != expected) v.contiguous = false;
            expected *= static_cast<std::uint64_t>(t.size[k]);
        }
        return v;
    }

    static std::string strides_text(const std::vector<std::uint64_t>& stride) {
        std::string out = "[";
        for (std::size_t k = 0; k < stride.size(); ++k) out += (k ? ", " : "") + std::to_string(stride[k]);
        return out + "]";
    }

    Tensor remember(std::size_t index, Tensor t) {
        made_[index] = t;
        return t;
    }

    /// The zip entry of storage record "data/{key}": present, and of the size its persistent id
    /// says, or a FormatError naming the tensor.
    std::pair<zip_uint64_t, zip_stat_t> storage_record(const TorchStorageRef& s, std::size_t width, const std::string& name) {
        const std::string member = prefix_ + "data/" + s.key;
        const std::string what = "storage '" + s.key + "' (record '" + member + "')";
        const bool overflow = s.numel > std::numeric_limits<std::uint64_t>::max() / width;
        const zip_int64_t index = zip_name_locate(za_, member.c_str(), ZIP_FL_ENC_RAW);
        if (index < 0) torch_fail(path_, "tensor '" + name + "' is in " + what + ", which the file does not have");
        zip_stat_t st;
        zip_stat_init(&st);
        if (zip_stat_index(za_, static_cast<zip_uint64_t>(index), ZIP_FL_ENC_RAW, &st) != 0)
            torch_fail(path_, "record '" + member + "': " + zip_strerror(za_));
        check_member_entry(st, file_bytes_, "PyTorch", path_, member);
        if (overflow || st.size != s.numel * width)
            torch_fail(path_, what + " holds " + std::to_string(st.size) + " bytes where its " + std::to_string(s.numel) +
                                  " elements of " + std::to_string(width) + " bytes need " +
                                  (overflow ? "more" : std::to_string(s.numel * width)));
        return {static_cast<zip_uint64_t>(index), st};
    }

    /// The bytes of storage record "data/{key}", read on first use; its size must be what the
    /// persistent id says, before anything is allocated.
    const std::byte* storage_bytes(const TorchStorageRef& s, std::size_t width, const std::string& name) {
        const std::string member = prefix_ + "data/" + s.key;
        const std::string what = "storage '" + s.key + "' (record '" + member + "')";
        const bool overflow = s.numel > std::numeric_limits<std::uint64_t>::max() / width;
        auto it = blocks_.find(s.key);
        if (it == blocks_.end()) {
            const auto [index, st] = storage_record(s, width, name);
            const auto size = st.size;  // clang 14 cannot capture a structured binding
            budget_.take(size, [&] { return what + ", of " + std::to_string(size) + " bytes"; });
            Block b{nullptr, st.size, swap_ ? width : 1};
            MemberReader in(za_, index, st.size, path_, member, "PyTorch");
            if (st.comp_method == ZIP_CM_STORE) {  // torch.save stores: the size is what the file holds
                b.data = allocate_aligned(static_cast<std::size_t>(st.size));
                in.read(b.data.get(), st.size);
            } else {  // deflated, up to max_deflate_ratio: believed only as the bytes arrive
                const std::string bytes = in.read_growing(st.size);
                b.data = allocate_aligned(bytes.size());
                std::memcpy(b.data.get(), bytes.data(), bytes.size());
            }
            in.finish();
            if (swap_) swap_bytes(b.data.get(), static_cast<std::size_t>(st.size), width);
            read_ += st.size;
            it = blocks_.emplace(s.key, std::move(b)).first;
        }
        const Block& b = it->second;
        if (overflow || b.bytes != s.numel * width)
            torch_fail(path_, what + " holds " + std::to_string(b.bytes) + " bytes, and another of its references gives " +
                                  std::to_string(s.numel) + " elements of " + std::to_string(width) + " bytes");
        if (swap_ && b.swapped_width != width)
            torch_fail(path_, what + " of a big-endian file is read as elements of " + std::to_string(b.swapped_width) +
                                  " and of " + std::to_string(width) + " bytes");
        return b.data.get();
    }

    struct Block {
        std::shared_ptr<std::byte> data;
        std::uint64_t bytes = 0;
        std::size_t swapped_width = 1;
    };

    zip_t* za_;
    const TorchUnpickler& u_;
    std::string path_, prefix_;
    std::uint64_t file_bytes_;
    bool swap_;
    std::vector<std::optional<Tensor>> made_;
    std::unordered_map<std::string, Block> blocks_;
    std::uint64_t read_ = 0, copied_ = 0;
    DecodeBudget& budget_;
};

/// One small record of the archive ("data.pkl", "byteorder") as text.
inline std::string torch_record(zip_t* za, zip_uint64_t index, std::uint64_t file_bytes, const std::string& path,
                                const std::string& member, DecodeBudget& budget) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(za, index, ZIP_FL_ENC_RAW, &st) != 0) torch_fail(path, "record '" + member + "': " + zip_strerror(za));
    check_member_entry(st, file_bytes, "PyTorch", path, member);
    budget.take(st.size, [&] { return "record '" + member + "' unpacks to " + std::to_string(st.size) + " bytes"; });
    MemberReader in(za, index, st.size, path, member, "PyTorch");
    std::string out = in.read_growing(st.size);
    in.finish();
    return out;
}

}  // namespace detail

namespace detail {
/// Reads the torch.save file at `path`: its pickle and, with `payloads`, its storages, into
/// `dict`. Without payloads (what `ckpt show` lists), tensors are described into `entries` from
/// the pickle and the zip directory, no storage read.
inline void read_torch(const std::string& path, const InteropLoadOptions& opts, bool payloads, ParamDict& dict,
                       std::vector<EntryMeta>& entries) {
    std::uint64_t file_bytes = 0;
    {
        auto fd = open_for_read(path, "PyTorch file");
        file_bytes = file_size(fd.get(), path);
        std::array<char, 32> head{};
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, head.size()));
        pread_exact(fd.get(), head.data(), n, 0, path);
        const std::string_view start(head.data(), n);
        if (start.starts_with('\x80') && start.find(torch_legacy_magic) != std::string_view::npos)
            throw FormatError("PyTorch file '" + path +
                                  "' is a legacy torch.save file (before PyTorch 1.6); re-save it with torch.save(..., "
                                  "_use_new_zipfile_serialization=True)",
                              path);
    }
    int err = 0;
    ZipArchive zip{zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err)};
    if (!zip.za) torch_fail(path, "it is not a readable zip archive: " + zip_error_text(err));
    DecodeBudget budget("PyTorch file '" + path + "'", path, opts.max_decoded_bytes, file_bytes, interop_budget_option);

    // The archive's folder: the one holding data.pkl ("archive/" since PyTorch 2.0; the file's
    // stem before).
    std::string prefix;
    std::optional<zip_uint64_t> pickle_index;
    const zip_int64_t count = zip_get_num_entries(zip.za, 0);
    for (zip_int64_t k = 0; k < count && !pickle_index; ++k) {
        const char* name = zip_get_name(zip.za, static_cast<zip_uint64_t>(k), ZIP_FL_ENC_RAW);
        const std::string_view member = name ? name : "";
        const auto slash = member.find('/');
        if (slash != std::string_view::npos && member.substr(slash + 1) == "data.pkl") {
            prefix = std::string(member.substr(0, slash + 1));
            pickle_index = static_cast<zip_uint64_t>(k);
        }
    }
    if (!pickle_index) torch_fail(path, "it has no '{archive}/data.pkl' record: it is a zip, but not one torch.save wrote");
    if (zip_name_locate(zip.za, (prefix + "constants.pkl").c_str(), ZIP_FL_ENC_RAW) >= 0)
        throw FormatError("PyTorch file '" + path +
                              "' is a TorchScript archive (torch.jit.save), which holds code; ckpt reads what torch.save "
                              "writes: save the module's state_dict() with torch.save",
                          path);

    bool swap = false;  // the storages' byte order differs from this machine's
    if (const zip_int64_t at = zip_name_locate(zip.za, (prefix + "byteorder").c_str(), ZIP_FL_ENC_RAW); at >= 0) {
        const std::string order = torch_record(zip.za, static_cast<zip_uint64_t>(at), file_bytes, path, prefix + "byteorder", budget);
        if (order != "little" && order != "big")
            torch_fail(path, "record '" + prefix + "byteorder' is neither 'little' nor 'big'");
        swap = (order == "big") != (std::endian::native == std::endian::big);
    }

    const std::string pickle = torch_record(zip.za, *pickle_index, file_bytes, path, prefix + "data.pkl", budget);
    TorchUnpickler unpickler(pickle, path, prefix + "data.pkl", budget);
    const PyRef root = unpickler.run();
    if (root.kind != PyRef::dict && root.kind != PyRef::list && root.kind != PyRef::tuple)
        torch_fail(path, "it holds a single " + py_kind_name(root.kind) +
                                     ", not a dict: ckpt reads what torch.save(model.state_dict()) or torch.save({...}) writes");
    TorchFlattener flat(unpickler, path, 16 * std::uint64_t{pickle.size()} + (std::uint64_t{1} << 20), budget);
    flat.walk(root, "", 0);

    TorchTensorMaker maker(zip.za, unpickler, path, prefix, file_bytes, swap, budget);
    std::unordered_set<std::string_view> names;
    for (const auto& [name, v] : flat.entries) {
        if (!names.insert(name).second)
            torch_fail(path, "'" + name + "' appears twice once nested dicts are flattened with dots");
        Value value;
        switch (v.kind) {
            case PyRef::boolean: value = v.i != 0; break;
            case PyRef::integer: value = v.i; break;
            case PyRef::floating: value = v.f; break;
            case PyRef::string: value = unpickler.strings[static_cast<std::size_t>(v.i)]; break;
            default:
                if (!payloads) {
                    entries.push_back(maker.describe(static_cast<std::size_t>(v.i), name));
                    continue;
                }
                value = maker.make(static_cast<std::size_t>(v.i), name);
                break;
        }
        if (payloads) {
            dict.set(name, std::move(value));
            continue;
        }
        EntryMeta& e = entries.emplace_back();
        e.name = name;
        e.kind = value.kind();
        e.scalar = std::move(value);
    }
}
}  // namespace detail

/// Reads a file written by PyTorch's torch.save (the zip format, the default since PyTorch
/// 1.6): `torch.save(model.state_dict(), path)`, or a dict of state_dicts and plain values
/// such as `{"model": ..., "optimizer": opt.state_dict(), "epoch": 3}`.
///
/// Nested dicts, lists and tuples are flattened with dots, in the file's order: "model.fc.weight",
/// "optimizer.state.0.exp_avg" (int keys become their decimal text), "optimizer.param_groups.0.betas.1".
/// Tensors of float32, float64, float16, int32, int64, uint8 and bool become tensors, Python
/// ints int64, floats double, bools bool, str strings, a torch.device its text ("cuda:0"). None
/// and empty dicts, lists and tuples give no entry. Tensors that are contiguous share the memory
/// of the storage read for them (as tensors sharing a storage did in PyTorch); non-contiguous
/// views (a transpose, a strided slice) are copied into C order.
///
/// The pickle inside is read by a restricted unpickler: it knows only the opcodes and globals
/// torch.save uses for these (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
/// _rebuild_parameter, the storage types, torch.device), and never calls or constructs anything
/// a file names. Any other global is a FormatError naming it (an object of a user's class, a
/// function), and so are other dtypes (bfloat16, int8, int16, complex; the error names the
/// tensor), expanded views, legacy non-zip files and TorchScript archives. Every offset, size and
/// stride is checked against its storage, and each storage's size against the file, before
/// anything is allocated or read; a damaged file is a FormatError naming the file.
inline ParamDict load_torch(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict dict;
        std::vector<detail::EntryMeta> unused;
        detail::read_torch(path, opts, true, dict, unused);
        return dict;
    });
}

/// What load_torch would return, in its order, as a table of contents: each tensor's dtype and
/// shape from the pickle, checked against its storage's entry in the zip directory; no storage
/// is read. Reads the zip directory and the pickle.
inline std::vector<detail::EntryMeta> torch_contents(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict unused;
        std::vector<detail::EntryMeta> entries;
        detail::read_torch(path, opts, false, unused, entries);
        return entries;
    });
}

}  // namespace ckpt
