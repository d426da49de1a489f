#pragma once
// Bindings of a program's variables that are not tensors: a save stores what they hold, a
// load (strict ones included) writes the stored value back, whole.
//
//   d.set("name", ckpt::view_of(name));          // std::string                -> string
//   d.set("blob", ckpt::bytes_of(blob));         // std::string or vector<byte> -> bytes
//   d.set("tags", ckpt::view_of(tags));          // std::vector<std::string>    -> strings
//   d.set("stats", ckpt::view_of(stats));        // std::map / unordered_map from std::string
//                                                //   to a number, a string or a vector of numbers
//
// and in ckpt/object.hpp (which ckpt.hpp includes, but not in compiled mode):
//   d.set("rng", ckpt::view_of(rng));            // std:: or boost::random engines and distributions
//   d.set("config", ckpt::object(config));       // any type with a Boost.Serialization serialize()
//
// A load checks the stored value against the variable (its kind, an object's type, a map's
// value types) and decodes it into a copy before anything is written: a value that cannot be
// the variable's is a LoadMismatch naming the entry, and leaves the variable unchanged.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "detail/value_map.hpp"
#include "error.hpp"
#include "param_dict.hpp"

namespace ckpt {

namespace detail {

/// A copy of `var` to decode into (so that what a decoder leaves alone keeps its value), or a
/// default-constructed T when T cannot be copied.
template <class T>
std::shared_ptr<T> staging_copy(const T& var) {
    if constexpr (std::is_copy_constructible_v<T>) return std::make_shared<T>(var);
    else return std::make_shared<T>();
}

template <class T>
std::function<void()> assign_later(T& var, std::shared_ptr<T> staged) {
    return [&var, staged = std::move(staged)] { var = std::move(*staged); };
}

[[noreturn]] inline void bound_mismatch(const std::string& entry, const std::string& why) {
    throw LoadMismatch("entry '" + entry + "': " + why);
}

/// `stored` is not an object of `type`, or not in the encoding its binding reads.
[[noreturn]] inline void not_its_object(const std::string& entry, const Value& stored, const std::string& type) {
    const Object* o = stored.get_if<Object>();
    bound_mismatch(entry, "checkpoint has " + stored.type_name() +
                              (o ? " (" + std::string(object_encoding_name(o->encoding)) + ")" : "") +
                              ", the variable is a " + type);
}

/// A binding whose stored value is of one plain kind (string, bytes, strings).
template <class Var, class Stored, ValueKind Kind>
class PlainBinding final : public Binding::Target {
public:
    explicit PlainBinding(Var& var) : var_(var) {}
    ValueKind kind() const override { return Kind; }
    Value read(ObjectEncoding) const override {
        if constexpr (std::is_same_v<Stored, Bytes>) return Bytes{std::string(reinterpret_cast<const char*>(var_.data()), var_.size())};
        else return Stored(var_);
    }
    std::function<void()> stage(const Value& stored, const std::string& entry) const override {
        const Stored* s = stored.get_if<Stored>();
        if (!s) bound_mismatch(entry, "checkpoint has " + stored.type_name() + ", the variable takes " + Value::kind_name(Kind));
        auto staged = std::make_shared<Var>();
        if constexpr (std::is_same_v<Stored, Bytes>) {
            const auto* p = reinterpret_cast<const typename Var::value_type*>(s->data.data());
            staged->assign(p, p + s->data.size());
        } else {
            *staged = *s;
        }
        return assign_later(var_, std::move(staged));
    }

private:
    Var& var_;
};

template <class T> struct map_value_traits;  // what a map's values are stored as
template <Element T> struct map_value_traits<T> {
    static constexpr MapTag tag = MapTag::number;
    static constexpr DType dtype = dtype_v<T>;
    static void write(ValueMapWriter& w, std::string_view key, const T& v) { w.number(key, dtype, &v); }
    static T value(std::string_view b) {
        T v;
        std::memcpy(&v, b.data(), sizeof v);
        return v;
    }
};
template <> struct map_value_traits<std::string> {
    static constexpr MapTag tag = MapTag::string;
    static constexpr DType dtype = DType::uint8;  // not stored
    static void write(ValueMapWriter& w, std::string_view key, const std::string& v) { w.string(key, v); }
    static std::string value(std::string_view b) { return std::string(b); }
};
template <Element E, class A> struct map_value_traits<std::vector<E, A>> {
    static constexpr MapTag tag = MapTag::vector;
    static constexpr DType dtype = dtype_v<E>;
    static void write(ValueMapWriter& w, std::string_view key, const std::vector<E, A>& v) {
        w.vector(key, dtype, v.data(), v.size());
    }
    static std::vector<E, A> value(std::string_view b) {
        std::vector<E, A> v(b.size() / sizeof(E));
        if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
        return v;
    }
};

template <class M>
concept StringKeyedMap = std::is_same_v<typename M::key_type, std::string> &&
                         requires { map_value_traits<typename M::mapped_type>::tag; };

/// A std::map keeps its keys in the order a value map stores them (std::string's operator<
/// compares bytes); an unordered_map's are sorted first.
template <class M>
inline constexpr bool keys_in_order_v = false;
template <class V, class A>
inline constexpr bool keys_in_order_v<std::map<std::string, V, std::less<std::string>, A>> = true;
template <class V, class A>
inline constexpr bool keys_in_order_v<std::map<std::string, V, std::less<>, A>> = true;

template <StringKeyedMap M>
class MapBinding final : public Binding::Target {
    using V = typename M::mapped_type;
    using Traits = map_value_traits<V>;

public:
    explicit MapBinding(M& var) : var_(var) {}
    ValueKind kind() const override { return ValueKind::object; }
    std::string type() const override { return "map<string, " + map_item_type(Traits::tag, Traits::dtype) + ">"; }
    Value read(ObjectEncoding) const override {
        ValueMapWriter w(var_.size(), var_.size() * 32);
        if constexpr (keys_in_order_v<M>) {
            for (const auto& [key, value] : var_) Traits::write(w, key, value);
        } else {
            std::vector<const typename M::value_type*> sorted;
            sorted.reserve(var_.size());
            for (const auto& kv : var_) sorted.push_back(&kv);
            std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
            for (const auto* kv : sorted) Traits::write(w, kv->first, kv->second);
        }
        return Object{type(), ObjectEncoding::value_map, std::move(w).take()};
    }
    std::function<void()> stage(const Value& stored, const std::string& entry) const override {
        const Object* o = stored.get_if<Object>();
        if (!o || o->encoding != ObjectEncoding::value_map)
            not_its_object(entry, stored, type());
        auto staged = std::make_shared<M>();
        try {
            visit_value_map(o->data, "entry '" + entry + "'",
                            [&](std::string_view key, MapTag tag, DType dtype, std::string_view bytes) {
                                if (tag != Traits::tag || (tag != MapTag::string && dtype != Traits::dtype))
                                    bound_mismatch(entry, "key '" + std::string(key) + "' holds " +
                                                              map_item_type(tag, dtype) + ", the variable is a " + type());
                                staged->emplace_hint(staged->end(), key, Traits::value(bytes));  // keys come in order
                            });
        } catch (const FormatError& e) {
            throw LoadMismatch(e.what());
        }
        return assign_later(var_, std::move(staged));
    }

private:
    M& var_;
};

template <class B, class Var>
Binding bind(Var& var) {
    return Binding(std::make_shared<const B>(var));
}

}  // namespace detail

// (templates, the std::string overloads too: a binding's class is then instantiated only in
// the files that bind one, not in every file that includes ckpt.hpp)

/// A std::string, stored as a string.
template <std::same_as<std::string> S>
Binding view_of(S& s) {
    return detail::bind<detail::PlainBinding<std::string, std::string, ValueKind::string>>(s);
}

/// A list of strings.
template <class A>
Binding view_of(std::vector<std::string, A>& list) {
    return detail::bind<detail::PlainBinding<std::vector<std::string, A>, Strings, ValueKind::strings>>(list);
}

/// A byte string, held in a std::string or a vector of bytes.
template <std::same_as<std::string> S>
Binding bytes_of(S& s) {
    return detail::bind<detail::PlainBinding<std::string, Bytes, ValueKind::bytes>>(s);
}
template <class B, class A>
    requires(std::is_same_v<B, std::byte> || std::is_same_v<B, unsigned char> || std::is_same_v<B, char>)
Binding bytes_of(std::vector<B, A>& v) {
    return detail::bind<detail::PlainBinding<std::vector<B, A>, Bytes, ValueKind::bytes>>(v);
}

/// A std::map or std::unordered_map from std::string to a number, a std::string or a
/// std::vector of numbers: an object of type "map<string, V>" (a value map). A load replaces
/// the whole map, so keys added, removed or changed since the save are as they were.
template <class K, class V, class C, class A>
    requires detail::StringKeyedMap<std::map<K, V, C, A>>
Binding view_of(std::map<K, V, C, A>& m) {
    return detail::bind<detail::MapBinding<std::map<K, V, C, A>>>(m);
}
template <class K, class V, class H, class E, class A>
    requires detail::StringKeyedMap<std::unordered_map<K, V, H, E, A>>
Binding view_of(std::unordered_map<K, V, H, E, A>& m) {
    return detail::bind<detail::MapBinding<std::unordered_map<K, V, H, E, A>>>(m);
}

namespace detail {
template <class> inline constexpr bool always_false = false;
}

/// Maps of other keys or values: a message that says what to write, rather than the
/// candidates that did not match.
template <class K, class V, class C, class A>
    requires(!detail::StringKeyedMap<std::map<K, V, C, A>>)
Binding view_of(std::map<K, V, C, A>&) {
    static_assert(detail::always_false<K>,
                  "ckpt::view_of binds a map whose keys are std::string and whose values are numbers, std::string or "
                  "std::vector of numbers; bind other maps with ckpt::object(m) (Boost.Serialization, "
                  "#include <boost/serialization/map.hpp>)");
    return Binding(nullptr);
}
template <class K, class V, class H, class E, class A>
    requires(!detail::StringKeyedMap<std::unordered_map<K, V, H, E, A>>)
Binding view_of(std::unordered_map<K, V, H, E, A>&) {
    static_assert(detail::always_false<K>,
                  "ckpt::view_of binds a map whose keys are std::string and whose values are numbers, std::string or "
                  "std::vector of numbers; bind other maps with ckpt::object(m) (Boost.Serialization, "
                  "#include <boost/serialization/unordered_map.hpp>)");
    return Binding(nullptr);
}

}  // namespace ckpt
