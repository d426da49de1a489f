#pragma once
// ParamDict: what a checkpoint holds. An ordered map from name to Value, where a Value is
// a tensor, an int64, a double, a bool or a string (the seed's append_info kinds), a byte
// string, a list of strings, an object (a value only its type reads: a map, a random
// engine, a type with serialize()), or a binding of a program's variable of one of these
// kinds, which a save reads and a load writes back (ckpt/bound.hpp makes them).

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "error.hpp"
#include "tensor.hpp"

namespace ckpt {

/// The kinds of value a checkpoint holds; the codes are the file's (FORMAT.md section 3).
enum class ValueKind : std::uint8_t {
    tensor = 0, int64 = 1, float64 = 2, boolean = 3, string = 4, bytes = 5, strings = 6, object = 7
};
inline constexpr std::uint32_t max_value_kind = 7;

/// A byte string: binary data, as opposed to a string's text.
struct Bytes {
    std::string data;
    friend bool operator==(const Bytes&, const Bytes&) = default;
};

/// A list of strings.
using Strings = std::vector<std::string>;

/// How an object's data is laid out (FORMAT.md section 3).
enum class ObjectEncoding : std::uint32_t { boost_binary = 0, boost_text = 1, value_map = 2, stream_text = 3 };
inline constexpr std::uint32_t max_object_encoding = 3;

constexpr std::string_view object_encoding_name(ObjectEncoding e) {
    switch (e) {
        case ObjectEncoding::boost_binary: return "boost binary";
        case ObjectEncoding::boost_text: return "boost text";
        case ObjectEncoding::value_map: return "value map";
        case ObjectEncoding::stream_text: return "stream text";
    }
    return "?";
}

/// A value only its type can read: `type` names it ("map<string, float64>", "std::mt19937_64",
/// a class with serialize()), `encoding` says how `data` is laid out.
struct Object {
    std::string type;
    ObjectEncoding encoding = ObjectEncoding::boost_binary;
    std::string data;
    friend bool operator==(const Object&, const Object&) = default;
};

class Value;

/// A program's variable that is not a tensor (a std::string, a map, a random engine, an
/// object with serialize()): a save stores what it holds then, a load writes the stored value
/// back into it, whole. Made by ckpt::view_of and ckpt::object (ckpt/bound.hpp).
class Binding {
public:
    /// What a binding does with its variable: one implementation per kind of variable bound
    /// (ckpt/bound.hpp, ckpt/object.hpp).
    struct Target {
        virtual ~Target() = default;
        /// The kind stored; for an object, its type name.
        virtual ValueKind kind() const = 0;
        virtual std::string type() const { return {}; }
        /// What a save stores now. `boost` is the encoding a type with serialize() takes in
        /// this checkpoint (boost_binary in binary archives, else boost_text).
        virtual Value read(ObjectEncoding boost) const = 0;
        /// Decodes `stored` (of kind()) into a copy of the variable and returns what moves the
        /// copy into it; throws LoadMismatch naming `entry` when `stored` cannot be its value,
        /// the variable unchanged.
        virtual std::function<void()> stage(const Value& stored, const std::string& entry) const = 0;
    };

    explicit Binding(std::shared_ptr<const Target> target) : target_(std::move(target)) {}
    const Target& target() const noexcept { return *target_; }
    /// Two bindings are equal when they bind the same variable the same way (one binding).
    friend bool operator==(const Binding& a, const Binding& b) noexcept { return a.target_ == b.target_; }

private:
    std::shared_ptr<const Target> target_;
};

/// One value of a ParamDict: a tensor, an int64, a double, a bool, a string, Bytes, Strings, an
/// Object, or a Binding of a program's variable. Integers of any width are stored as int64 and
/// floating-point numbers as double; kind() says what it holds, get_if<T>() reads it.
class Value {
public:
    Value() : v_(std::int64_t{0}) {}
    Value(Tensor t) : v_(std::move(t)) {}
    Value(bool b) : v_(b) {}
    template <std::integral I>
        requires(!std::same_as<I, bool>)
    Value(I i) : v_(static_cast<std::int64_t>(i)) {}
    template <std::floating_point F>
    Value(F f) : v_(static_cast<double>(f)) {}
    Value(std::string s) : v_(std::move(s)) {}
    Value(const char* s) : v_(std::string(s)) {}
    Value(std::string_view s) : v_(std::string(s)) {}
    Value(Bytes b) : v_(box(std::move(b))) {}
    Value(Strings s) : v_(box(std::move(s))) {}
    Value(Object o) : v_(box(std::move(o))) {}
    Value(Binding b) : v_(box(std::move(b))) {}

    /// The kind stored: a binding's is that of what it binds.
    ValueKind kind() const noexcept {
        if (v_.index() < 5) return static_cast<ValueKind>(v_.index());
        const Other& other = *std::get<Boxed>(v_).other;
        if (const Binding* b = std::get_if<Binding>(&other)) return b->target().kind();
        return static_cast<ValueKind>(5 + other.index());
    }
    bool is_tensor() const noexcept { return v_.index() == 0; }
    bool is_binding() const noexcept { return get_if<Binding>() != nullptr; }

    /// "float32[6, 1, 5, 5]", "int64", "double", "bool", "string", "bytes", "strings", an
    /// object's type, and "… (bound)" for a binding.
    std::string type_name() const {
        if (const Binding* b = get_if<Binding>()) {
            const auto& t = b->target();
            return (t.kind() == ValueKind::object ? t.type() : kind_name(t.kind())) + " (bound)";
        }
        if (const Object* o = get_if<Object>()) return o->type;
        if (const Tensor* t = std::get_if<Tensor>(&v_)) return t->describe();
        return kind_name(kind());
    }

    static std::string kind_name(ValueKind k) {
        switch (k) {
            case ValueKind::tensor: return "tensor";
            case ValueKind::int64: return "int64";
            case ValueKind::float64: return "double";
            case ValueKind::boolean: return "bool";
            case ValueKind::string: return "string";
            case ValueKind::bytes: return "bytes";
            case ValueKind::strings: return "strings";
            case ValueKind::object: return "object";
        }
        return "?";
    }

    /// The value as a T, or null. Bytes, Strings, Object and Binding are shared between the
    /// copies of a value and read only.
    template <class T> auto* get_if() noexcept {
        if constexpr (is_other<T>) return std::as_const(*this).get_if<T>();
        else return std::get_if<T>(&v_);
    }
    template <class T> const T* get_if() const noexcept {
        if constexpr (is_other<T>) {
            const Boxed* b = std::get_if<Boxed>(&v_);
            return b ? std::get_if<T>(b->other.get()) : nullptr;
        } else {
            return std::get_if<T>(&v_);
        }
    }

    friend bool operator==(const Value&, const Value&) = default;

private:
    // The kinds of 0.2 and bindings are boxed: every alternative of v_ costs each file that
    // copies or compares a Value (the variant's machinery for nine alternatives made a
    // header-only file compile a fifth longer), and most values are tensors and numbers.
    using Other = std::variant<Bytes, Strings, Object, Binding>;
    template <class T>
    static constexpr bool is_other = std::is_same_v<T, Bytes> || std::is_same_v<T, Strings> ||
                                     std::is_same_v<T, Object> || std::is_same_v<T, Binding>;
    struct Boxed {
        std::shared_ptr<const Other> other;
        friend bool operator==(const Boxed& a, const Boxed& b) { return a.other == b.other || *a.other == *b.other; }
    };
    template <class T>
    static Boxed box(T value) {
        return Boxed{std::make_shared<const Other>(std::move(value))};
    }

    // the first five in the order of ValueKind's codes; the rest in Other, in that order
    std::variant<Tensor, std::int64_t, double, bool, std::string, Boxed> v_;
};

namespace detail {
template <class T> constexpr const char* value_type_name() {
    if constexpr (std::same_as<T, Tensor>) return "tensor";
    else if constexpr (std::same_as<T, bool>) return "bool";
    else if constexpr (std::integral<T>) return "integer";
    else if constexpr (std::floating_point<T>) return "double";
    else if constexpr (std::same_as<T, Bytes>) return "bytes";
    else if constexpr (std::same_as<T, Strings>) return "strings";
    else if constexpr (std::same_as<T, Object>) return "object";
    else return "string";
}
}  // namespace detail

/// What a checkpoint holds: an ordered map from name to Value. Entries keep the order in which
/// they were first set (a file's order, when loaded); set() replaces a value in place. Typed
/// access (get<T>(), tensor()) names the key and both types on a mismatch.
class ParamDict {
public:
    /// One named value, as iterating yields it: `for (const auto& [name, value] : dict)`.
    struct Entry {
        std::string name;
        Value value;
        friend bool operator==(const Entry&, const Entry&) = default;
    };

    ParamDict() = default;
    ParamDict(std::initializer_list<Entry> entries) {
        for (const auto& e : entries) set(e.name, e.value);
    }

    /// Inserts at the end, or replaces the value in place (keeping its position).
    Value& set(std::string name, Value value) {
        if (auto it = index_.find(name); it != index_.end()) {
            entries_[it->second].value = std::move(value);
            return entries_[it->second].value;
        }
        index_.emplace(name, entries_.size());
        entries_.push_back({std::move(name), std::move(value)});
        return entries_.back().value;
    }

    bool contains(std::string_view name) const { return find(name) != nullptr; }
    std::size_t size() const noexcept { return entries_.size(); }
    bool empty() const noexcept { return entries_.empty(); }

    const Value* find(std::string_view name) const {
        auto it = index_.find(std::string(name));
        return it == index_.end() ? nullptr : &entries_[it->second].value;
    }
    Value* find(std::string_view name) {
        return const_cast<Value*>(static_cast<const ParamDict*>(this)->find(name));
    }

    const Value& at(std::string_view name) const {
        if (const Value* v = find(name)) return *v;
        throw NotFound("no entry named '" + std::string(name) + "' in the checkpoint values");
    }
    Value& at(std::string_view name) { return const_cast<Value&>(static_cast<const ParamDict*>(this)->at(name)); }

    /// Typed access: integral T reads an int64 (range-checked), floating T a double, bool a
    /// bool, std::string a string, Tensor a tensor. A mismatch names the key and both types.
    /// @throws NotFound no entry is named `name`
    /// @throws TypeMismatch the entry is of another kind, or its integer does not fit T
    template <class T>
    T get(std::string_view name) const {
        const Value& v = at(name);
        if constexpr (std::same_as<T, bool>) {
            return checked<bool>(name, v);
        } else if constexpr (std::integral<T>) {
            const std::int64_t i = checked<std::int64_t>(name, v);
            if (!std::in_range<T>(i))
                throw TypeMismatch("checkpoint value '" + std::string(name) + "' = " + std::to_string(i) +
                                   " does not fit the requested integer type");
            return static_cast<T>(i);
        } else if constexpr (std::floating_point<T>) {
            return static_cast<T>(checked<double>(name, v));
        } else {
            return checked<T>(name, v);
        }
    }

    /// The tensor named `name`, by reference.
    /// @throws NotFound no entry is named `name`
    /// @throws TypeMismatch the entry is not a tensor
    Tensor& tensor(std::string_view name) { return checked_ref<Tensor>(name, at(name)); }
    const Tensor& tensor(std::string_view name) const {
        return checked_ref<Tensor>(name, const_cast<Value&>(at(name)));
    }

    bool erase(std::string_view name) {
        auto it = index_.find(std::string(name));
        if (it == index_.end()) return false;
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
        reindex();
        return true;
    }

    auto begin() const noexcept { return entries_.begin(); }
    auto end() const noexcept { return entries_.end(); }
    auto begin() noexcept { return entries_.begin(); }
    auto end() noexcept { return entries_.end(); }

    friend bool operator==(const ParamDict& a, const ParamDict& b) { return a.entries_ == b.entries_; }

private:
    template <class T>
    static T checked(std::string_view name, const Value& v) {
        if (const T* p = v.get_if<T>()) return *p;
        throw TypeMismatch("checkpoint value '" + std::string(name) + "' is " + v.type_name() + ", expected " +
                           detail::value_type_name<T>());
    }
    template <class T>
    static T& checked_ref(std::string_view name, Value& v) {
        if (T* p = v.get_if<T>()) return *p;
        throw TypeMismatch("checkpoint value '" + std::string(name) + "' is " + v.type_name() + ", expected " +
                           detail::value_type_name<T>());
    }
    void reindex() {
        index_.clear();
        for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
    }

    std::vector<Entry> entries_;
    std::unordered_map<std::string, std::size_t> index_;
};

namespace detail {
/// `value` itself, or for a binding what its variable holds now (Binding::Target::read).
inline Value materialized(const Value& value, ObjectEncoding boost) {
    if (const Binding* b = value.get_if<Binding>()) return b->target().read(boost);
    return value;
}

inline bool has_bindings(const ParamDict& dict) {
    return std::any_of(dict.begin(), dict.end(), [](const ParamDict::Entry& e) { return e.value.is_binding(); });
}

/// `dict` with its bindings read: what a save stores (tensors are shared, not copied).
inline ParamDict materialized(const ParamDict& dict, ObjectEncoding boost) {
    ParamDict out;
    for (const auto& [name, value] : dict) out.set(name, materialized(value, boost));
    return out;
}
}  // namespace detail

}  // namespace ckpt
