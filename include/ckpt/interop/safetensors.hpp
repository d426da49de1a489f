#pragma once
// safetensors files (Hugging Face's format): save_safetensors, load_safetensors and
// safetensors_contents. Link ckpt::interop (nlohmann-json).
//
// The file: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
// shape and [begin, end) byte range in the buffer that follows, then the buffer. Scalars and
// strings travel in "__metadata__" (whose values are strings); the reserved metadata key
// "ckpt.kinds" records which of them were int64, double or bool, so they come back as such,
// and "ckpt.order", written when values come before tensors, the order of the entries.
// Files from other writers load with their metadata as string entries. safetensors has no
// storage order: a column-major tensor is written transposed into row-major order (a copy of
// the same values, of its logical shape), and every tensor read is row-major.

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../detail/atomic_file.hpp"
#include "../detail/posix_io.hpp"
#include "../detail/safetensors_json.hpp"
#include "../detail/verified_reader.hpp"
#include "../path.hpp"
#include "common.hpp"

namespace ckpt {

namespace detail {

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

}  // namespace detail

/// Writes `dict` as a safetensors file: tensors in dict order, other values in `__metadata__`.
/// The format has no storage order: column-major tensors are copied into row-major order.
inline void save_safetensors(const ParamDict& state, const PathArg& file) {
    const std::string path = file.string();
    const ParamDict dict = detail::exportable(state, path, "safetensors");
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
            if (detail::safetensors_dtype(t->dtype()).empty())
                throw ConfigError("cannot save '" + path + "': tensor '" + name + "' is " +
                                  std::string(dtype_name(t->dtype())) +
                                  ", which safetensors has no dtype for; save it as npz or a checkpoint");
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
    auto fd = open_for_read(path, "safetensors file");
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
        auto fd = detail::open_for_read(path, "safetensors file");
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


}  // namespace ckpt
