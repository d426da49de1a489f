#pragma once
// Tensor: a dtype, a shape, a storage order and one contiguous block of bytes. It either owns
// its block (64-byte aligned) or borrows memory that belongs to a network, so that saving a
// network's parameters copies nothing and loading can write straight into them.

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <ranges>
#include <type_traits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"

namespace ckpt {

/// A tensor's dimensions, outermost first; empty for a 0-d tensor (a scalar).
using Shape = std::vector<std::int64_t>;

inline std::string shape_string(const Shape& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

/// How a tensor's elements lie in its bytes. Row-major (C order): the last index varies
/// fastest. Column-major (Fortran order, Eigen's default): the first one does. The bytes of a
/// column-major tensor of shape [r, c] are those of the row-major tensor [c, r], its
/// transpose. Tensors of rank 0 and 1 are row-major: for them the two are the same bytes.
enum class Order : std::uint8_t { row_major, column_major };

constexpr std::string_view order_name(Order o) { return o == Order::column_major ? "column-major" : "row-major"; }

namespace detail {
inline constexpr std::size_t tensor_alignment = 64;

inline constexpr std::size_t huge_page_size = 2u << 20;

/// Large blocks are mapped 2 MiB-aligned and marked for transparent huge pages: first touch
/// then costs one fault per 2 MiB instead of per 4 KiB, which on virtual machines is the
/// difference between reading a fresh 256 MiB checkpoint in tens of milliseconds and in most
/// of a second.
inline std::shared_ptr<std::byte> allocate_huge(std::size_t n) {
    const std::size_t size = (n + huge_page_size - 1) / huge_page_size * huge_page_size;
    void* raw = ::mmap(nullptr, size + huge_page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<std::uintptr_t>(raw);
    const auto aligned = (base + huge_page_size - 1) / huge_page_size * huge_page_size;
    if (aligned > base) ::munmap(raw, aligned - base);
    if (const auto tail = base + size + huge_page_size - (aligned + size)) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
#ifdef MADV_HUGEPAGE
    ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
    return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(aligned),
                                      [size](std::byte* p) { ::munmap(p, size); });
}

inline std::shared_ptr<std::byte> allocate_aligned(std::size_t n) {
    if (n >= 2 * huge_page_size) return allocate_huge(n);
    auto* p = static_cast<std::byte*>(::operator new(std::max<std::size_t>(n, 1), std::align_val_t{tensor_alignment}));
    return std::shared_ptr<std::byte>(p, [](std::byte* q) { ::operator delete(q, std::align_val_t{tensor_alignment}); });
}

/// Number of elements of a shape; throws on negative dimensions or overflow past `limit`.
/// A shape with a zero anywhere has no elements, whatever the dimensions before the zero.
inline std::size_t checked_numel(const Shape& shape, std::size_t limit) {
    for (auto d : shape)
        if (d < 0) throw FormatError("negative dimension in shape " + shape_string(shape), "");
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
    std::size_t n = 1;
    for (auto d : shape) {
        const auto ud = static_cast<std::size_t>(d);
        if (n > limit / ud) throw FormatError("shape " + shape_string(shape) + " is too large", "");
        n *= ud;
    }
    return n;
}

inline Shape reversed(Shape s) {
    std::reverse(s.begin(), s.end());
    return s;
}

/// dst[j0, …, jn-1] = src[jn-1, …, j0]: the row-major bytes of `src` (shape `shape`, elements of
/// `width` bytes) with its axes reversed, i.e. the row-major bytes of a tensor of shape
/// reversed(shape). This turns a column-major tensor's bytes into the row-major ones of the
/// same values, and back. It walks the first and last axes in tiles, so that both the reads
/// and the writes stay within a few cache lines.
template <std::size_t Width>
void reverse_axes_of(const std::byte* src, std::byte* dst, const Shape& shape) {
    const std::size_t n = shape.size();
    const auto rows = static_cast<std::size_t>(shape.front()), cols = static_cast<std::size_t>(shape.back());
    // the middle axes: src axis k and dst axis n-1-k; strides in elements
    std::vector<std::size_t> src_stride(n, 1), dst_stride(n, 1);
    for (std::size_t k = n - 1; k-- > 0;) src_stride[k] = src_stride[k + 1] * static_cast<std::size_t>(shape[k + 1]);
    for (std::size_t k = 1; k < n; ++k) dst_stride[k] = dst_stride[k - 1] * static_cast<std::size_t>(shape[k - 1]);
    // dst_stride[k]: the stride in dst of the axis that is axis k of src
    std::size_t middle = 1;
    for (std::size_t k = 1; k + 1 < n; ++k) middle *= static_cast<std::size_t>(shape[k]);
    std::vector<std::size_t> index(n, 0);
    std::size_t src_base = 0, dst_base = 0;
    constexpr std::size_t tile = 32;
    for (std::size_t m = 0; m < middle; ++m) {
        // one slice: src[i, mid, j] (strides src_stride[0], 1) to dst[j, mid', i] (strides dst_stride[n-1], 1)
        for (std::size_t i0 = 0; i0 < rows; i0 += tile)
            for (std::size_t j0 = 0; j0 < cols; j0 += tile)
                for (std::size_t i = i0; i < std::min(rows, i0 + tile); ++i)
                    for (std::size_t j = j0; j < std::min(cols, j0 + tile); ++j)
                        std::memcpy(dst + (dst_base + j * dst_stride[n - 1] + i) * Width,
                                    src + (src_base + i * src_stride[0] + j) * Width, Width);
        for (std::size_t k = n - 1; k-- > 1;) {  // the next middle index, the last middle axis fastest
            src_base += src_stride[k];
            dst_base += dst_stride[k];
            if (++index[k] < static_cast<std::size_t>(shape[k])) break;
            src_base -= src_stride[k] * index[k];
            dst_base -= dst_stride[k] * index[k];
            index[k] = 0;
        }
    }
}

inline void reverse_axes(const std::byte* src, std::byte* dst, const Shape& shape, std::size_t width) {
    if (shape.size() < 2 || std::find(shape.begin(), shape.end(), 0) != shape.end()) {
        if (const auto n = checked_numel(shape, SIZE_MAX / width) * width) std::memcpy(dst, src, n);  // the same bytes
        return;
    }
    switch (width) {
        case 1: return reverse_axes_of<1>(src, dst, shape);
        case 2: return reverse_axes_of<2>(src, dst, shape);
        case 4: return reverse_axes_of<4>(src, dst, shape);
        case 8: return reverse_axes_of<8>(src, dst, shape);
    }
}
}  // namespace detail

/// A dtype, a shape, a storage order and one contiguous block of bytes: owned (64-byte aligned:
/// the constructor, from(), clone()) or borrowed from memory that belongs to someone else
/// (view(), ckpt::view_of), so that saving a network's parameters copies nothing and a load
/// writes straight into them. Copies of a Tensor share its bytes.
class Tensor {
public:
    /// An empty float32 tensor of shape [0].
    Tensor() : Tensor(DType::float32, Shape{0}) {}

    /// An owning, zero-filled tensor. Wherever a factory takes an Order, the shape it takes is
    /// the logical one (logical_shape()), the one its elements are indexed by.
    Tensor(DType dtype, Shape shape, Order order = Order::row_major)
        : Tensor(uninitialized(dtype, std::move(shape), order)) {
        if (nbytes_) std::memset(data_.get(), 0, nbytes_);
    }

    /// An owning tensor whose bytes are left for the caller to fill.
    static Tensor uninitialized(DType dtype, Shape shape, Order order = Order::row_major) {
        Tensor t(dtype, std::move(shape), order, nullptr);
        t.data_ = detail::allocate_aligned(t.nbytes_);
        return t;
    }

    /// A tensor over memory owned by someone else (typically a network parameter).
    /// The memory must stay valid, and hold numel * itemsize bytes, while the tensor is used.
    static Tensor view(DType dtype, Shape shape, void* data, Order order = Order::row_major) {
        Tensor t(dtype, std::move(shape), order, nullptr);
        t.data_ = std::shared_ptr<std::byte>(std::shared_ptr<void>(), static_cast<std::byte*>(data));
        t.view_ = true;
        return t;
    }
    template <Element T>
    static Tensor view(std::span<T> values, Shape shape, Order order = Order::row_major) {
        Tensor t = view(dtype_v<T>, std::move(shape), const_cast<std::remove_const_t<T>*>(values.data()), order);
        t.require_count(values.size());
        return t;
    }

    /// A tensor sharing `owner`'s lifetime whose bytes start at `data` (used by loaders).
    static Tensor aliasing(DType dtype, Shape shape, std::shared_ptr<void> owner, void* data,
                           Order order = Order::row_major) {
        Tensor t(dtype, std::move(shape), order, nullptr);
        t.data_ = std::shared_ptr<std::byte>(std::move(owner), static_cast<std::byte*>(data));
        return t;
    }

    /// An owning copy of `values`, which lie in `order`; shape defaults to one dimension.
    template <Element T>
    static Tensor from(std::span<const T> values, Shape shape, Order order = Order::row_major) {
        Tensor t = uninitialized(dtype_v<T>, std::move(shape), order);
        t.require_count(values.size());
        if (t.nbytes_) std::memcpy(t.data_.get(), values.data(), t.nbytes_);
        return t;
    }
    template <Element T>
    static Tensor from(const std::vector<T>& values, Shape shape, Order order = Order::row_major) {
        return from(std::span<const T>(values.data(), values.size()), std::move(shape), order);
    }
    template <Element T>
    static Tensor from(const std::vector<T>& values) {
        return from(values, Shape{static_cast<std::int64_t>(values.size())});
    }
    /// std::vector<bool> packs its bits, so it cannot be viewed: this copies it, one byte an element.
    static Tensor from(const std::vector<bool>& values) {
        Tensor t = uninitialized(DType::boolean, Shape{static_cast<std::int64_t>(values.size())});
        auto out = t.values<bool>();
        std::copy(values.begin(), values.end(), out.begin());
        return t;
    }

    DType dtype() const noexcept { return dtype_; }
    /// The shape of the bytes read in row-major order: for a column-major tensor, its logical
    /// shape reversed (the transpose), which is what a reader that assumes row-major sees.
    const Shape& shape() const noexcept { return shape_; }
    /// The shape its elements are indexed by: shape(), reversed for a column-major tensor.
    Shape logical_shape() const { return order_ == Order::column_major ? detail::reversed(shape_) : shape_; }
    Order order() const noexcept { return order_; }
    std::size_t rank() const noexcept { return shape_.size(); }
    std::size_t numel() const noexcept { return numel_; }
    std::size_t nbytes() const noexcept { return nbytes_; }
    /// True when the bytes belong to someone else (see view()).
    bool is_view() const noexcept { return view_; }

    std::byte* data() noexcept { return data_.get(); }
    const std::byte* data() const noexcept { return data_.get(); }

    /// The elements as T, in the tensor's order; throws TypeMismatch when T is not this
    /// tensor's dtype.
    template <Element T>
    std::span<T> values() {
        check_type<T>();
        return {reinterpret_cast<T*>(data_.get()), numel_};
    }
    template <Element T>
    std::span<const T> values() const {
        check_type<T>();
        return {reinterpret_cast<const T*>(data_.get()), numel_};
    }

    /// A deep, owning copy, in the same order.
    Tensor clone() const {
        Tensor t = uninitialized(dtype_, logical_shape(), order_);
        if (nbytes_) std::memcpy(t.data_.get(), data_.get(), nbytes_);
        return t;
    }

    /// The same values laid out in `order`: this tensor (sharing its bytes) when it already
    /// is, otherwise an owning copy with the elements moved to their places.
    Tensor in_order(Order order) const {
        if (rank() < 2 || order == order_) return *this;
        Tensor t = uninitialized(dtype_, logical_shape(), order);
        detail::reverse_axes(data(), t.data(), shape_, itemsize(dtype_));
        return t;
    }

    /// Same dtype, same shape, same order, same bytes.
    friend bool operator==(const Tensor& a, const Tensor& b) {
        return a.dtype_ == b.dtype_ && a.shape_ == b.shape_ && a.order_ == b.order_ &&
               (a.nbytes_ == 0 || std::memcmp(a.data_.get(), b.data_.get(), a.nbytes_) == 0);
    }

    /// "float32[2, 3]", "float64[2, 3] column-major": the dtype, the logical shape and, when it
    /// is not row-major, the order.
    std::string describe() const {
        return std::string(dtype_name(dtype_)) + shape_string(logical_shape()) +
               (order_ == Order::column_major ? " column-major" : "");
    }

private:
    Tensor(DType dtype, Shape logical, Order order, std::nullptr_t)
        : dtype_(dtype), order_(logical.size() < 2 ? Order::row_major : order),
          shape_(order_ == Order::column_major ? detail::reversed(std::move(logical)) : std::move(logical)),
          numel_(detail::checked_numel(shape_, SIZE_MAX / itemsize(dtype))), nbytes_(numel_ * itemsize(dtype)) {}

    template <Element T>
    void check_type() const {
        if (dtype_v<T> != dtype_)
            throw TypeMismatch("tensor " + describe() + " read as " + std::string(dtype_name(dtype_v<T>)));
    }
    void require_count(std::size_t n) const {
        if (n != numel_)
            throw TypeMismatch("shape " + shape_string(logical_shape()) + " needs " + std::to_string(numel_) +
                               " elements, got " + std::to_string(n));
    }

    DType dtype_;
    Order order_;
    Shape shape_;  // the bytes' shape read row-major (reversed for a column-major tensor)
    std::size_t numel_;
    std::size_t nbytes_;
    std::shared_ptr<std::byte> data_;
    bool view_ = false;
};

/// A 0-d tensor viewing one variable (an int64_t, a double, a float, a bool, …): saving reads
/// it, loading writes it back, as with a network's parameters:
/// `d.set("iteration", ckpt::view_of(iteration))`.
template <Element T>
    requires(!std::is_const_v<T>)
Tensor view_of(T& value) {
    return Tensor::view(dtype_v<T>, Shape{}, &value);
}

namespace detail {
/// Containers whose own view_of (with their shape and order) lives in an adapter header:
/// xtensor's (types/xtensor.hpp), Eigen's matrices, arrays, maps (Eigen 3.4's vectors are ranges
/// too) and tensors (types/eigen.hpp).
template <class C>
concept has_adapter_view = requires { C::static_layout; } || requires { C::RowsAtCompileTime; } ||
                           requires { C::NumIndices; };
}  // namespace detail

/// A tensor viewing a contiguous standard container (std::vector, std::array, std::span, a
/// C array): one dimension of its size, or `shape` when given (its element count must match).
/// A container that reallocates (a std::vector that grows) must not do so while the view is used.
template <std::ranges::contiguous_range C>
    requires Element<std::ranges::range_value_t<C>> &&
             (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<C>>>) &&
             (!detail::has_adapter_view<C>)
Tensor view_of(C& container, Shape shape = {}) {
    using T = std::ranges::range_value_t<C>;
    const auto n = static_cast<std::size_t>(std::ranges::size(container));
    if (shape.empty()) shape = Shape{static_cast<std::int64_t>(n)};
    return Tensor::view(std::span<T>(std::ranges::data(container), n), std::move(shape));
}

}  // namespace ckpt
