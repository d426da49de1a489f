#pragma once
// Bindings stored as objects of a C++ type (ckpt/bound.hpp has the others): view_of a random
// engine or distribution, its state as its stream operator writes it; and ckpt::object(x), any
// type with a Boost.Serialization serialize(), a Boost archive of it. Included by
// ckpt/ckpt.hpp in header-only mode; in compiled mode (CKPT_SEPARATE_COMPILATION), whose
// ckpt.hpp reads neither Boost.Serialization nor <random>, include it where they are bound.

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/archive/text_iarchive.hpp>
#include <boost/archive/text_oarchive.hpp>
#include <boost/core/demangle.hpp>

#include <exception>
#include <istream>
#include <locale>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

#include "bound.hpp"

namespace ckpt {

namespace detail {

/// The name of T: the standard's own for its engines (the same with every standard library),
/// else the compiler's, demangled.
template <class T>
std::string cxx_type_name() {
    if constexpr (std::is_same_v<T, std::minstd_rand0>) return "std::minstd_rand0";
    else if constexpr (std::is_same_v<T, std::minstd_rand>) return "std::minstd_rand";
    else if constexpr (std::is_same_v<T, std::mt19937>) return "std::mt19937";
    else if constexpr (std::is_same_v<T, std::mt19937_64>) return "std::mt19937_64";
    else if constexpr (std::is_same_v<T, std::ranlux24_base>) return "std::ranlux24_base";
    else if constexpr (std::is_same_v<T, std::ranlux48_base>) return "std::ranlux48_base";
    else if constexpr (std::is_same_v<T, std::ranlux24>) return "std::ranlux24";
    else if constexpr (std::is_same_v<T, std::ranlux48>) return "std::ranlux48";
    else if constexpr (std::is_same_v<T, std::knuth_b>) return "std::knuth_b";
    else return boost::core::demangle(typeid(T).name());
}

/// Random engines (std:: and boost::random) and distributions: their stream operators write
/// and read their whole state, exactly (the standard requires it of both; a distribution's
/// state includes what it caches, such as normal_distribution's second value).
template <class T>
concept RandomEngine = requires(T& t) {  // not std::uniform_random_bit_generator: Boost's min() is not constexpr
    typename T::result_type;
    t();
    t.seed();
};
template <class T>
concept RandomDistribution = requires {
    typename T::param_type;
    typename T::result_type;
};
template <class T>
concept StreamState = (RandomEngine<T> || RandomDistribution<T>) && requires(std::ostream& os, std::istream& is, T& t) {
    os << t;
    is >> t;
};

template <StreamState T>
class StreamBinding final : public Binding::Target {
public:
    explicit StreamBinding(T& var) : var_(var) {}
    ValueKind kind() const override { return ValueKind::object; }
    std::string type() const override { return cxx_type_name<T>(); }
    Value read(ObjectEncoding) const override { return Object{type(), ObjectEncoding::stream_text, text_of(var_)}; }
    std::function<void()> stage(const Value& stored, const std::string& entry) const override {
        const Object* o = stored.get_if<Object>();
        if (!o || o->encoding != ObjectEncoding::stream_text || o->type != type())
            not_its_object(entry, stored, type());
        auto staged = staging_copy(var_);
        std::istringstream is(o->data);
        is.imbue(std::locale::classic());
        is >> *staged;
        // Stream flags cannot tell (Boost's engines set failbit at the end of a whole state):
        // what was read is the state when it writes back to the same text.
        if (text_of(*staged) != o->data)
            bound_mismatch(entry, "the state of " + type() + " in the checkpoint does not read back as one");
        return assign_later(var_, std::move(staged));
    }

private:
    static std::string text_of(const T& state) {
        std::ostringstream os;
        os.imbue(std::locale::classic());
        os << state;
        return std::move(os).str();
    }

    T& var_;
};

/// A type with a Boost.Serialization serialize(): a Boost archive of it, binary in binary
/// checkpoints, text in text and xml ones (an xml archive would need every member of every
/// such type named with make_nvp).
template <class T>
class ObjectBinding final : public Binding::Target {
public:
    explicit ObjectBinding(T& var) : var_(var) {}
    ValueKind kind() const override { return ValueKind::object; }
    std::string type() const override { return cxx_type_name<T>(); }
    Value read(ObjectEncoding boost) const override {
        std::ostringstream os;
        os.imbue(std::locale::classic());
        const T& value = var_;  // Boost saves through const references
        if (boost == ObjectEncoding::boost_binary) {
            boost::archive::binary_oarchive ar(os);
            ar << value;
        } else {
            boost::archive::text_oarchive ar(os);
            ar << value;
        }
        return Object{type(), boost, std::move(os).str()};
    }
    std::function<void()> stage(const Value& stored, const std::string& entry) const override {
        const Object* o = stored.get_if<Object>();
        const bool boost = o && (o->encoding == ObjectEncoding::boost_binary || o->encoding == ObjectEncoding::boost_text);
        if (!boost || o->type != type())
            not_its_object(entry, stored, type());
        // Boost reads its own header's length before it checks it: what does not start like
        // one of its archives never reaches it (a length read from other bytes is a huge allocation)
        static constexpr std::string_view binary_head{"\x16\0\0\0\0\0\0\0serialization::archive", 30};
        static constexpr std::string_view text_head{"22 serialization::archive "};
        if (!std::string_view(o->data).starts_with(o->encoding == ObjectEncoding::boost_binary ? binary_head : text_head))
            bound_mismatch(entry, "its data is not a " + std::string(object_encoding_name(o->encoding)) + " archive");
        auto staged = staging_copy(var_);
        std::istringstream is(o->data);
        is.imbue(std::locale::classic());
        try {
            if (o->encoding == ObjectEncoding::boost_binary) {
                boost::archive::binary_iarchive ar(is);
                ar >> *staged;
            } else {
                boost::archive::text_iarchive ar(is);
                ar >> *staged;
            }
        } catch (const std::exception& e) {  // Boost's archive_exception, and bad_alloc or length_error from damaged lengths
            bound_mismatch(entry, "its " + std::string(object_encoding_name(o->encoding)) + " archive of " + type() +
                                      " does not load: " + e.what());
        }
        if (is.fail() || !(is >> std::ws).eof())
            bound_mismatch(entry, "its " + std::string(object_encoding_name(o->encoding)) + " archive of " + type() +
                                      " holds more than the object read");
        return assign_later(var_, std::move(staged));
    }

private:
    T& var_;
};

}  // namespace detail

/// A random engine or distribution (std:: or boost::random): an object holding its state as
/// its stream operator writes it, which reads back to the same next numbers.
template <detail::StreamState T>
    requires(!std::is_const_v<T>)
Binding view_of(T& state) {
    return detail::bind<detail::StreamBinding<T>>(state);
}

/// Any type with a Boost.Serialization serialize() (member or free): an object holding a Boost
/// archive of it, restored in place. Include the Boost headers its members need
/// (boost/serialization/vector.hpp, …). T must be copy- or default-constructible and movable.
template <class T>
    requires(!std::is_const_v<T>)
Binding object(T& value) {
    return detail::bind<detail::ObjectBinding<T>>(value);
}

}  // namespace ckpt
