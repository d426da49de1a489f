#pragma once
// ParamDict: what a checkpoint holds. An ordered map from name to Value, where a Value is
// a tensor, an int64, a double, a bool or a string (the seed's append_info kinds).

#include <concepts>
#include <cstdint>
#include <initializer_list>
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

enum class ValueKind : std::uint8_t { tensor = 0, int64 = 1, float64 = 2, boolean = 3, string = 4 };

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

    ValueKind kind() const noexcept { return static_cast<ValueKind>(v_.index()); }
    bool is_tensor() const noexcept { return kind() == ValueKind::tensor; }

    /// "float32[6, 1, 5, 5]", "int64", "double", "bool" or "string".
    std::string type_name() const {
        switch (kind()) {
            case ValueKind::tensor: return std::get<Tensor>(v_).describe();
            case ValueKind::int64: return "int64";
            case ValueKind::float64: return "double";
            case ValueKind::boolean: return "bool";
            case ValueKind::string: return "string";
        }
        return "?";
    }

    template <class T> T* get_if() noexcept { return std::get_if<T>(&v_); }
    template <class T> const T* get_if() const noexcept { return std::get_if<T>(&v_); }

    friend bool operator==(const Value&, const Value&) = default;

private:
    std::variant<Tensor, std::int64_t, double, bool, std::string> v_;
};

namespace detail {
template <class T> constexpr const char* value_type_name() {
    if constexpr (std::same_as<T, Tensor>) return "tensor";
    else if constexpr (std::same_as<T, bool>) return "bool";
    else if constexpr (std::integral<T>) return "integer";
    else if constexpr (std::floating_point<T>) return "double";
    else return "string";
}
}  // namespace detail

class ParamDict {
public:
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
        return checked_ref<T>(name, const_cast<Value&>(v));
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

}  // namespace ckpt
