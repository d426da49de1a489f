#pragma once
// Tensor: a dtype, a shape and one contiguous block of bytes. It either owns its block
// (64-byte aligned) or borrows memory that belongs to a network, so that saving a
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
#include <vector>

#include "dtype.hpp"
#include "error.hpp"

namespace ckpt {

using Shape = std::vector<std::int64_t>;

inline std::string shape_string(const Shape& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

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
}  // namespace detail

class Tensor {
public:
    /// An empty float32 tensor of shape [0].
    Tensor() : Tensor(DType::float32, Shape{0}) {}

    /// An owning, zero-filled tensor.
    Tensor(DType dtype, Shape shape) : Tensor(uninitialized(dtype, std::move(shape))) {
        if (nbytes_) std::memset(data_.get(), 0, nbytes_);
    }

    /// An owning tensor whose bytes are left for the caller to fill.
    static Tensor uninitialized(DType dtype, Shape shape) {
        Tensor t(dtype, std::move(shape), nullptr);
        t.data_ = detail::allocate_aligned(t.nbytes_);
        return t;
    }

    /// A tensor over memory owned by someone else (typically a network parameter).
    /// The memory must stay valid, and hold numel * itemsize bytes, while the tensor is used.
    static Tensor view(DType dtype, Shape shape, void* data) {
        Tensor t(dtype, std::move(shape), nullptr);
        t.data_ = std::shared_ptr<std::byte>(std::shared_ptr<void>(), static_cast<std::byte*>(data));
        t.view_ = true;
        return t;
    }
    template <Element T>
    static Tensor view(std::span<T> values, Shape shape) {
        Tensor t = view(dtype_v<T>, std::move(shape), const_cast<std::remove_const_t<T>*>(values.data()));
        t.require_count(values.size());
        return t;
    }

    /// A tensor sharing `owner`'s lifetime whose bytes start at `data` (used by loaders).
    static Tensor aliasing(DType dtype, Shape shape, std::shared_ptr<void> owner, void* data) {
        Tensor t(dtype, std::move(shape), nullptr);
        t.data_ = std::shared_ptr<std::byte>(std::move(owner), static_cast<std::byte*>(data));
        return t;
    }

    /// An owning copy of `values`; shape defaults to one dimension.
    template <Element T>
    static Tensor from(std::span<const T> values, Shape shape) {
        Tensor t = uninitialized(dtype_v<T>, std::move(shape));
        t.require_count(values.size());
        if (t.nbytes_) std::memcpy(t.data_.get(), values.data(), t.nbytes_);
        return t;
    }
    template <Element T>
    static Tensor from(const std::vector<T>& values, Shape shape) {
        return from(std::span<const T>(values.data(), values.size()), std::move(shape));
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
    const Shape& shape() const noexcept { return shape_; }
    std::size_t rank() const noexcept { return shape_.size(); }
    std::size_t numel() const noexcept { return numel_; }
    std::size_t nbytes() const noexcept { return nbytes_; }
    /// True when the bytes belong to someone else (see view()).
    bool is_view() const noexcept { return view_; }

    std::byte* data() noexcept { return data_.get(); }
    const std::byte* data() const noexcept { return data_.get(); }

    /// The elements as T; throws TypeMismatch when T is not this tensor's dtype.
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

    /// A deep, owning copy.
    Tensor clone() const {
        Tensor t = uninitialized(dtype_, shape_);
        if (nbytes_) std::memcpy(t.data_.get(), data_.get(), nbytes_);
        return t;
    }

    /// Same dtype, same shape, same bytes.
    friend bool operator==(const Tensor& a, const Tensor& b) {
        return a.dtype_ == b.dtype_ && a.shape_ == b.shape_ &&
               (a.nbytes_ == 0 || std::memcmp(a.data_.get(), b.data_.get(), a.nbytes_) == 0);
    }

    std::string describe() const { return std::string(dtype_name(dtype_)) + shape_string(shape_); }

private:
    Tensor(DType dtype, Shape shape, std::nullptr_t)
        : dtype_(dtype), shape_(std::move(shape)),
          numel_(detail::checked_numel(shape_, SIZE_MAX / itemsize(dtype))), nbytes_(numel_ * itemsize(dtype)) {}

    template <Element T>
    void check_type() const {
        if (dtype_v<T> != dtype_)
            throw TypeMismatch("tensor " + describe() + " read as " + std::string(dtype_name(dtype_v<T>)));
    }
    void require_count(std::size_t n) const {
        if (n != numel_)
            throw TypeMismatch("shape " + shape_string(shape_) + " needs " + std::to_string(numel_) +
                               " elements, got " + std::to_string(n));
    }

    DType dtype_;
    Shape shape_;
    std::size_t numel_;
    std::size_t nbytes_;
    std::shared_ptr<std::byte> data_;
    bool view_ = false;
};

/// A 0-d tensor viewing one variable (an int64_t, a double, a float, a bool, …): saving reads
/// it, loading writes it back, as with a network's parameters.
///   d.set("iteration", ckpt::view_of(iteration));
template <Element T>
    requires(!std::is_const_v<T>)
Tensor view_of(T& value) {
    return Tensor::view(dtype_v<T>, Shape{}, &value);
}

/// A tensor viewing a contiguous standard container (std::vector, std::array, std::span, a
/// C array): one dimension of its size, or `shape` when given (its element count must match).
/// A container that reallocates (a std::vector that grows) must not do so while the view is used.
template <std::ranges::contiguous_range C>
    requires Element<std::ranges::range_value_t<C>> &&
             (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<C>>>) &&
             (!requires { C::static_layout; })  // xtensor containers: xtensor.hpp's view_of, with their shape
Tensor view_of(C& container, Shape shape = {}) {
    using T = std::ranges::range_value_t<C>;
    const auto n = static_cast<std::size_t>(std::ranges::size(container));
    if (shape.empty()) shape = Shape{static_cast<std::int64_t>(n)};
    return Tensor::view(std::span<T>(std::ranges::data(container), n), std::move(shape));
}

}  // namespace ckpt
