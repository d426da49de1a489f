#pragma once
// The JSON of a safetensors header, read by nlohmann's SAX parser in one pass: each tensor's
// dtype, shape and byte range, and the __metadata__ strings, checked as they are read, with
// nesting bounded (max_json_depth) and no name twice. For interop/safetensors.hpp.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../format.hpp"
#include "../error.hpp"
#include "../tensor.hpp"
#include "entry.hpp"

namespace ckpt::detail {

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
        case DType::int8: return "I8";
        case DType::int16: return "I16";
        case DType::uint16: return "U16";
        case DType::uint32: return "U32";
        case DType::uint64: return "U64";
        case DType::bfloat16: return "BF16";
        case DType::float8_e4m3fn: return "F8_E4M3";
        case DType::float8_e5m2: return "F8_E5M2";
        case DType::complex64:   // safetensors has no complex dtype
        case DType::complex128: return "";
    }
    return "";
}

inline std::optional<DType> dtype_from_safetensors(std::string_view s) {
    for (int c = 0; c < dtype_count; ++c)
        if (!s.empty() && safetensors_dtype(static_cast<DType>(c)) == s) return static_cast<DType>(c);
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
                        ", which ckpt does not hold (BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F8_E4M3, F8_E5M2, F16, BF16, F32, F64)");
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

}  // namespace ckpt::detail
