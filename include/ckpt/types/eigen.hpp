#pragma once
// Eigen glue: Eigen's dense objects as checkpoint tensors, in their own storage order, and a
// state whose dynamic-size objects take the file's sizes when loaded. Not part of ckpt.hpp:
// link the CMake target ckpt::eigen (Eigen 3.3 or later) and include this header.
//
//   Eigen::MatrixXd u(n, n);                  // column-major, Eigen's default
//   d.set("u", ckpt::view_of(u));             // float64[n, n] column-major, over u's memory
//
//   ckpt::EigenState state;                   // restore() resizes u, v to the file's sizes
//   state.add("u", u).add("v", v).add("step", step);
//
// view_of() takes a Matrix or Array (fixed or dynamic sizes, either order), a Map of one
// (contiguous only), an Eigen::Tensor or a TensorMap of one (any rank, either layout). A vector
// (a dimension fixed at 1 at compile time: VectorXd, RowVectorXf, Array<T, Dynamic, 1>) is a
// tensor of rank 1 [n]; any other matrix or array of rank 2 [rows, cols]; a Tensor of rank N has
// its N dimensions. The tensor is a view: saving reads the object's memory, loading writes into
// it, nothing is copied. Column-major objects are stored as they lie, with their order recorded
// (docs/FORMAT.md section 3.1), so they load back bit-exact and reach NumPy as the same matrix;
// a file of the other order loads into them element by element (checkpoint.hpp), and a square
// matrix is never taken for its transpose.

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../checkpoint.hpp"
#include "../error.hpp"
#include "../param_dict.hpp"
#include "../tensor.hpp"

namespace ckpt {

namespace detail::eigen {

template <class Scalar>
constexpr void check_scalar() {
    static_assert(Element<Scalar>,
                  "ckpt::view_of: a checkpoint holds float, double, std::int32_t, std::int64_t, std::uint8_t and bool "
                  "elements; this Eigen object's Scalar is none of them (cast it into one that is)");
}

/// The data of a map (whose data() is const when the map is), for a view: a map of const data
/// cannot be one, since loading writes into it.
template <class PlainObjectType, class Map>
auto* mapped_data(const Map& m) {
    static_assert(!std::is_const_v<PlainObjectType>,
                  "ckpt::view_of: a view is written when a checkpoint is loaded, so it cannot be a map of const data "
                  "(map the data without const, or view the object the data belongs to)");
    return const_cast<typename PlainObjectType::Scalar*>(m.data());
}

/// A tensor over an Eigen matrix's or array's memory: rank 1 for vectors, else [rows, cols].
template <class Derived, class Scalar>
Tensor matrix_view(Scalar* data, Eigen::Index rows, Eigen::Index cols) {
    check_scalar<Scalar>();
    constexpr auto dtype = dtype_v<Scalar>;
    if constexpr (Derived::RowsAtCompileTime == 1 || Derived::ColsAtCompileTime == 1)
        return Tensor::view(dtype, Shape{static_cast<std::int64_t>(rows * cols)}, data);
    else
        return Tensor::view(dtype, Shape{static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)}, data,
                            Derived::IsRowMajor ? Order::row_major : Order::column_major);
}

/// A tensor over an Eigen::Tensor's memory, of its dimensions and layout.
template <int Layout, class Scalar, class Dimensions>
Tensor tensor_view(Scalar* data, const Dimensions& dims) {
    check_scalar<Scalar>();
    Shape shape;
    for (std::size_t k = 0; k < static_cast<std::size_t>(dims.size()); ++k) shape.push_back(static_cast<std::int64_t>(dims[k]));
    return Tensor::view(dtype_v<Scalar>, std::move(shape), data,
                        Layout == Eigen::RowMajor ? Order::row_major : Order::column_major);
}

/// "[*, 3]": the shapes an object takes, * where its size is dynamic.
inline std::string takes_text(const std::vector<Eigen::Index>& fixed) {
    std::string s = "[";
    for (std::size_t k = 0; k < fixed.size(); ++k)
        s += (k ? ", " : "") + (fixed[k] == Eigen::Dynamic ? std::string("*") : std::to_string(fixed[k]));
    return s + "]";
}

[[noreturn]] inline void cannot_take(std::string_view name, const EntryInfo& e, const std::vector<Eigen::Index>& fixed,
                                     const std::string& why) {
    throw LoadMismatch("cannot resize '" + std::string(name) + "' to the checkpoint's " +
                       std::string(dtype_name(e.dtype)) + shape_string(e.logical_shape()) +
                       (e.order == Order::column_major ? " column-major" : "") + ": it takes " + takes_text(fixed) +
                       " (" + why + ")");
}

/// Resizes a Matrix or Array to the logical shape of the file's tensor `e`, or with `apply`
/// false only checks that it can.
template <class Derived>
void resize_to(Eigen::PlainObjectBase<Derived>& x, std::string_view name, const EntryInfo& e, bool apply) {
    const Shape shape = e.logical_shape();
    constexpr Eigen::Index rows = Derived::RowsAtCompileTime, cols = Derived::ColsAtCompileTime;
    constexpr Eigen::Index max_rows = Derived::MaxRowsAtCompileTime, max_cols = Derived::MaxColsAtCompileTime;
    auto fits = [](std::int64_t n, Eigen::Index fixed, Eigen::Index max) {
        return (fixed == Eigen::Dynamic || n == fixed) && (max == Eigen::Dynamic || n <= max);
    };
    // why a shape does not fit: sizes fixed at compile time, or maximum sizes
    auto limits = [](std::vector<Eigen::Index> fixed, std::vector<Eigen::Index> max) {
        return fixed == max ? std::string("sizes fixed at compile time")
                            : "at most " + takes_text(max) + " at compile time";
    };
    if constexpr (rows == 1 || cols == 1) {
        constexpr Eigen::Index size = Derived::SizeAtCompileTime, max_size = Derived::MaxSizeAtCompileTime;
        if (shape.size() != 1) cannot_take(name, e, {size}, "a vector");
        if (!fits(shape[0], size, max_size)) cannot_take(name, e, {size}, limits({size}, {max_size}));
        if (apply) x.resize(static_cast<Eigen::Index>(shape[0]));
    } else {
        if (shape.size() != 2) cannot_take(name, e, {rows, cols}, "a matrix");
        if (!fits(shape[0], rows, max_rows) || !fits(shape[1], cols, max_cols))
            cannot_take(name, e, {rows, cols}, limits({rows, cols}, {max_rows, max_cols}));
        if (apply) x.resize(static_cast<Eigen::Index>(shape[0]), static_cast<Eigen::Index>(shape[1]));
    }
}

/// Resizes an Eigen::Tensor to the logical shape of the file's tensor `e` (with `apply`).
template <class Scalar, int Rank, int Options, class Index>
void resize_to(Eigen::Tensor<Scalar, Rank, Options, Index>& x, std::string_view name, const EntryInfo& e, bool apply) {
    const Shape shape = e.logical_shape();
    if (shape.size() != static_cast<std::size_t>(Rank))
        cannot_take(name, e, std::vector<Eigen::Index>(static_cast<std::size_t>(Rank), Eigen::Dynamic),
                    "an Eigen::Tensor of rank " + std::to_string(Rank));
    if (!apply) return;
    std::array<Index, static_cast<std::size_t>(Rank)> dims{};
    for (std::size_t k = 0; k < dims.size(); ++k) dims[k] = static_cast<Index>(shape[k]);
    x.resize(dims);
}

template <class X>
concept Resizable = requires(X& x, std::string_view name, const EntryInfo& e) { resize_to(x, name, e, true); };

}  // namespace detail::eigen

/// A view of a Matrix or Array (fixed or dynamic sizes, either order).
template <class Derived>
Tensor view_of(Eigen::PlainObjectBase<Derived>& x) {
    return detail::eigen::matrix_view<Derived>(x.data(), x.rows(), x.cols());
}

/// A view of the memory a Map maps. Its elements must lie side by side: a stride fixed at
/// compile time that says otherwise does not compile, one given at run time is a ConfigError.
template <class PlainObjectType, int MapOptions, class StrideType>
Tensor view_of(const Eigen::Map<PlainObjectType, MapOptions, StrideType>& m) {
    using Mapped = Eigen::Map<PlainObjectType, MapOptions, StrideType>;
    constexpr bool vector = Mapped::RowsAtCompileTime == 1 || Mapped::ColsAtCompileTime == 1;
    constexpr int inner = StrideType::InnerStrideAtCompileTime, outer = StrideType::OuterStrideAtCompileTime;
    // the size of one column (column-major) or row (row-major), when the type fixes it
    constexpr int inner_size = Mapped::IsRowMajor ? Mapped::ColsAtCompileTime : Mapped::RowsAtCompileTime;
    static_assert(inner == 0 || inner == 1 || inner == Eigen::Dynamic,
                  "ckpt::view_of: this Eigen::Map's inner stride is fixed at compile time to more than 1, so its "
                  "elements do not lie side by side and no view of them is a tensor: copy it into a Matrix first");
    static_assert(vector || outer == 0 || outer == Eigen::Dynamic || inner_size == Eigen::Dynamic || outer == inner_size,
                  "ckpt::view_of: this Eigen::Map's outer stride is fixed at compile time to another value than its "
                  "inner size, so its columns (or rows) do not lie side by side: copy it into a Matrix first");
    const bool contiguous =
        m.innerStride() == 1 && (vector || m.outerSize() <= 1 || m.outerStride() == m.innerSize());
    if (!contiguous)
        throw ConfigError("ckpt::view_of: an Eigen::Map of " + std::to_string(m.rows()) + " x " +
                          std::to_string(m.cols()) + " elements with inner stride " + std::to_string(m.innerStride()) +
                          " and outer stride " + std::to_string(m.outerStride()) +
                          " is not contiguous; a view needs its elements side by side (copy it into a Matrix, or map "
                          "it without strides)");
    return detail::eigen::matrix_view<Mapped>(detail::eigen::mapped_data<PlainObjectType>(m), m.rows(), m.cols());
}

/// A view of an Eigen::Tensor (any rank, either layout).
template <class Scalar, int Rank, int Options, class Index>
Tensor view_of(Eigen::Tensor<Scalar, Rank, Options, Index>& t) {
    return detail::eigen::tensor_view<Options & Eigen::RowMajor ? Eigen::RowMajor : Eigen::ColMajor>(t.data(),
                                                                                                      t.dimensions());
}

/// A view of the memory a TensorMap maps.
template <class PlainObjectType, int Options, template <class> class MakePointer>
Tensor view_of(const Eigen::TensorMap<PlainObjectType, Options, MakePointer>& m) {
    return detail::eigen::tensor_view<PlainObjectType::Layout>(detail::eigen::mapped_data<PlainObjectType>(m),
                                                                m.dimensions());
}

/// Any other dense expression (a block, a transpose, a product) has no memory of its own to view.
template <class Derived>
Tensor view_of(const Eigen::DenseBase<Derived>&) {
    static_assert(sizeof(Derived) == 0,
                  "ckpt::view_of views Eigen Matrix, Array, Map, Tensor and TensorMap objects; this is an expression "
                  "(a block, a transpose, a product...): evaluate it into a Matrix, and view that");
    return {};
}

/// Named Eigen objects (and other values) as one checkpointable state whose dynamic-size objects
/// are resized to the file's sizes when a checkpoint is loaded into it: restore() into
/// default-constructed or wrongly-sized matrices, arrays and tensors. A size fixed at compile
/// time that does not fit the file's is a LoadMismatch naming the tensor, the file's shape and
/// what the object takes, thrown before anything is loaded. It refers to the objects it was
/// given, which must outlive it. Without it, a load into a view of a wrongly-sized object is a
/// mismatch like any other.
///
/// ```
/// Eigen::MatrixXd u;                              // sized by the checkpoint
/// ckpt::EigenState state;
/// state.add("u", u).add("step", step);            // views of both
/// mgr.restore(state);
/// mgr.on_step(progress, state);
/// ```
class EigenState {
public:
    /// Adds a view of `x` under `name`: a Matrix, Array or Eigen::Tensor (resized on load when
    /// dynamic), a Map or TensorMap (viewed as it is; a map cannot be resized), or anything else
    /// ckpt::view_of takes (a scalar variable, a std::vector).
    template <class X>
        requires requires(X& x) { view_of(x); }
    EigenState& add(std::string name, X& x) {
        Item item{std::move(name), [&x] { return view_of(x); }, {}, {}};
        if constexpr (detail::eigen::Resizable<X>)
            item.resize = [&x, n = item.name](const EntryInfo& e, bool apply) { detail::eigen::resize_to(x, n, e, apply); };
        return insert(std::move(item));
    }
    /// Adds a value as it is: a view made elsewhere, or a copy (a string, a constant), which is
    /// saved but cannot be loaded back.
    EigenState& add(std::string name, Value value) { return insert(Item{std::move(name), {}, {}, std::move(value)}); }

    /// Views of the objects and the values: what a save writes.
    ParamDict state_dict() const {
        ParamDict d;
        for (const auto& item : items_) d.set(item.name, item.view ? Value(item.view()) : item.value);
        return d;
    }

    /// What a load writes into (ShapedByCheckpoint): each dynamic object resized to the logical
    /// shape of the file's tensor of its name and dtype first, once every one is known to fit
    /// (a refusal changes no object).
    ParamDict state_dict_for(const std::vector<EntryInfo>& entries) {
        std::map<std::string_view, const EntryInfo*> in_file;
        for (const auto& e : entries) in_file.emplace(e.name, &e);
        std::vector<std::pair<Item*, const EntryInfo*>> resized;
        for (auto& item : items_) {
            if (!item.resize) continue;
            const auto it = in_file.find(item.name);
            if (it == in_file.end() || it->second->kind != ValueKind::tensor) continue;
            if (it->second->dtype != item.view().dtype()) continue;  // a mismatch the load reports
            item.resize(*it->second, false);
            resized.emplace_back(&item, it->second);
        }
        for (const auto& [item, entry] : resized) item->resize(*entry, true);
        return state_dict();
    }
    void loaded(const LoadReport&) {}

private:
    struct Item {
        std::string name;
        std::function<Tensor()> view;                    // Eigen objects
        std::function<void(const EntryInfo&, bool apply)> resize;  // dynamic ones: check, or resize
        Value value;                                     // anything else
    };

    EigenState& insert(Item item) {
        if (item.name.starts_with(detail::reserved_name_prefix))
            throw ConfigError("'" + item.name + "' starts with the reserved prefix '__ckpt.'");
        for (const auto& other : items_)
            if (other.name == item.name) throw ConfigError("EigenState holds '" + item.name + "' already");
        items_.push_back(std::move(item));
        return *this;
    }

    std::vector<Item> items_;
};

}  // namespace ckpt
