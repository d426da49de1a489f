#pragma once
// The value map: an object's data holding a map from strings to numbers, strings or vectors
// of numbers (FORMAT.md section 3, object encoding 2). Little-endian whatever the archive
// kind, keys in increasing byte order, each once; the reader bounds every length by the data.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"

namespace ckpt::detail {

enum class MapTag : std::uint8_t { number = 1, string = 2, vector = 3 };

/// Appends a value map's items, in the order given (the caller's keys increasing).
class ValueMapWriter {
public:
    explicit ValueMapWriter(std::uint64_t count, std::size_t reserve = 0) {
        out_.reserve(8 + reserve);
        u64(count);
    }
    void number(std::string_view key, DType dtype, const void* element) {
        head(key, MapTag::number);
        u32(static_cast<std::uint32_t>(dtype));
        out_.append(static_cast<const char*>(element), itemsize(dtype));
    }
    void string(std::string_view key, std::string_view value) {
        head(key, MapTag::string);
        u64(value.size());
        out_.append(value);
    }
    void vector(std::string_view key, DType dtype, const void* elements, std::size_t count) {
        head(key, MapTag::vector);
        u32(static_cast<std::uint32_t>(dtype));
        u64(count);
        out_.append(static_cast<const char*>(elements), count * itemsize(dtype));
    }
    std::string take() && { return std::move(out_); }

private:
    void head(std::string_view key, MapTag tag) {
        u64(key.size());
        out_.append(key);
        out_ += static_cast<char>(tag);
    }
    void u64(std::uint64_t v) {
        char b[8];
        for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
        out_.append(b, 8);
    }
    void u32(std::uint32_t v) {
        char b[4];
        for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
        out_.append(b, 4);
    }
    std::string out_;
};

/// Calls `item(key, tag, dtype, bytes)` for each item of a value map, in order, after checking
/// it (`bytes`: the element or elements as stored, or the string; `dtype` is uint8 for a
/// string). A malformed map is a FormatError saying where (`what`) before the item is given.
template <class Item>
void visit_value_map(std::string_view data, const std::string& what, Item&& item) {
    std::size_t at = 0;
    auto fail = [&](const std::string& why) -> void {
        throw FormatError(what + ": malformed value map: " + why + " (at byte " + std::to_string(at) + ")", "");
    };
    auto take = [&](std::uint64_t n) {
        if (n > data.size() - at) fail("needs " + std::to_string(n) + " bytes, " + std::to_string(data.size() - at) + " are left");
        at += static_cast<std::size_t>(n);
        return data.substr(at - static_cast<std::size_t>(n), static_cast<std::size_t>(n));
    };
    auto le = [&](std::size_t width) {
        const auto b = take(width);
        std::uint64_t v = 0;
        for (std::size_t i = width; i-- > 0;) v = v << 8 | static_cast<unsigned char>(b[i]);
        return v;
    };
    const std::uint64_t count = le(8);
    if (count > data.size() - at) fail("it counts " + std::to_string(count) + " items, more than its bytes hold");
    std::string_view previous;
    for (std::uint64_t i = 0; i < count; ++i) {
        const std::uint64_t key_size = le(8);
        if (key_size > data.size() - at) fail("a key of " + std::to_string(key_size) + " bytes runs past its end");
        const std::string_view key = take(key_size);
        if (i > 0 && !(previous < key)) fail("its keys are not in increasing order, each once");
        previous = key;
        const auto tag = static_cast<std::uint8_t>(take(1)[0]);
        if (tag < 1 || tag > 3) fail("an item has tag " + std::to_string(tag) + " (1 to 3 are known)");
        DType dtype = DType::uint8;
        std::uint64_t size = 0;
        if (tag != static_cast<std::uint8_t>(MapTag::string)) {
            const auto code = static_cast<std::uint32_t>(le(4));
            const auto known = dtype_from_code(code);
            if (!known) fail("an item has dtype code " + std::to_string(code) + ", which this version of ckpt does not know");
            dtype = *known;
            size = itemsize(dtype);
        }
        if (tag != static_cast<std::uint8_t>(MapTag::number)) {
            const std::uint64_t n = le(8);
            const bool elements = tag == static_cast<std::uint8_t>(MapTag::vector);
            if (n > data.size() - at || (elements && n > (data.size() - at) / size))
                fail("an item of " + std::to_string(n) + (elements ? " elements" : " bytes") + " runs past its end");
            size = elements ? n * size : n;
        }
        const std::string_view bytes = take(size);
        if (tag != static_cast<std::uint8_t>(MapTag::string) && dtype == DType::boolean &&
            std::any_of(bytes.begin(), bytes.end(), [](char c) { return c != 0 && c != 1; }))
            fail("key '" + std::string(key) + "' holds a bool byte other than 0 and 1");
        item(key, static_cast<MapTag>(tag), dtype, bytes);
    }
    if (at != data.size()) fail(std::to_string(data.size() - at) + " bytes follow the last item");
}

/// One item of a value map, as visit_value_map gives it, kept.
struct MapItem {
    std::string key;
    MapTag tag = MapTag::number;
    DType dtype = DType::float64;
    std::string bytes;
    std::size_t count() const { return tag == MapTag::string ? 0 : bytes.size() / itemsize(dtype); }
};

/// The items of a value map (for showing one); a malformed one is a FormatError.
inline std::vector<MapItem> decode_value_map(std::string_view data, const std::string& what) {
    std::vector<MapItem> items;
    visit_value_map(data, what, [&](std::string_view key, MapTag tag, DType dtype, std::string_view bytes) {
        items.push_back({std::string(key), tag, dtype, std::string(bytes)});
    });
    return items;
}

/// The data of `items`, which must be sorted by key with no key twice.
inline std::string encode_value_map(const std::vector<MapItem>& items) {
    ValueMapWriter w(items.size());
    for (const auto& item : items) {
        if (item.tag == MapTag::string) w.string(item.key, item.bytes);
        else if (item.tag == MapTag::number) w.number(item.key, item.dtype, item.bytes.data());
        else w.vector(item.key, item.dtype, item.bytes.data(), item.count());
    }
    return std::move(w).take();
}

/// "float64", "string" or "vector<int64>": what a map's type names for an item.
inline std::string map_item_type(MapTag tag, DType dtype) {
    if (tag == MapTag::string) return "string";
    const std::string name(dtype_name(dtype));
    return tag == MapTag::vector ? "vector<" + name + ">" : name;
}

}  // namespace ckpt::detail
