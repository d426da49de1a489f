#pragma once
// Backends: where a rank's parameters and optimizer state live, and what can go wrong with
// that memory. Two models:
//
//   Cpu          host memory; nothing to report.
//   AscendModel  a simulated NPU, faithful where fault handling cares: device memory with
//                capacity accounting, host <-> device copies, synchronization, and the
//                uncorrectable ECC error (UCE): a poisoned range surfaces, as on the real
//                runtime, as a device-memory error code on the next operation that touches
//                it; the device then reports itself unhealthy until the seed's sequence
//                stop -> clean -> repair has run.
//
// A backend B provides
//   void attach(std::string name, std::span<float> memory)   // a tensor now lives on it
//   void touch(std::string_view name)                        // an operation reads/writes it; may throw DeviceMemoryError
//   void touch_all()
//   void synchronize()                                       // waits for queued work; reports errors
//   Health health() const
//   void stop(); void clean(); void repair();                // the repair sequence
//   std::string_view name() const

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../ckpt/error.hpp"

namespace fault {

/// A device's state: healthy; uce once an operation met an uncorrectable memory error; then
/// stopped and cleaned on the way back to healthy (the repair sequence stop(), clean(), repair()).
enum class Health { healthy, uce, stopped, cleaned };

inline const char* health_name(Health h) {
    switch (h) {
        case Health::healthy: return "healthy";
        case Health::uce: return "uncorrectable memory error";
        case Health::stopped: return "stopped";
        case Health::cleaned: return "cleaned";
    }
    return "?";
}

/// A device reported a memory error on an operation. `code` is the runtime's error code
/// (ACL_ERROR_RT_DEVICE_MEM_ERROR, 507053, for a UCE on Ascend).
class DeviceMemoryError : public ckpt::Error {
public:
    DeviceMemoryError(const std::string& what, int code, std::string tensor)
        : ckpt::Error(what), code_(code), tensor_(std::move(tensor)) {}
    int code() const noexcept { return code_; }
    const std::string& tensor() const noexcept { return tensor_; }

private:
    int code_;
    std::string tensor_;
};

/// The device cannot hold what is asked of it.
class DeviceOutOfMemory : public ckpt::Error {
public:
    using ckpt::Error::Error;
};

/// Where a rank's parameters and optimizer state live, and what can go wrong with that memory:
/// attach() a tensor, touch() it as an operation does (a DeviceMemoryError surfaces there),
/// synchronize(), health(), and the repair sequence stop(), clean(), repair(). Cpu and
/// AscendModel model it.
template <class B>
concept Backend = requires(B& b, const B& cb, std::span<float> memory, std::string_view name) {
    b.attach(std::string(name), memory);
    b.touch(name);
    b.touch_all();
    b.synchronize();
    { cb.health() } -> std::same_as<Health>;
    b.stop();
    b.clean();
    b.repair();
    { cb.name() } -> std::convertible_to<std::string_view>;
};

/// Host memory: attached tensors are simply there, and nothing goes wrong that this layer
/// could see (a CPU memory error kills the process).
class Cpu {
public:
    void attach(std::string, std::span<float>) {}
    void touch(std::string_view) {}
    void touch_all() {}
    void synchronize() {}
    Health health() const { return Health::healthy; }
    void stop() {}
    void clean() {}
    void repair() {}
    std::string_view name() const { return "cpu"; }
};

/// A simulated Ascend NPU: device memory with capacity accounting, host and device copies,
/// synchronization, and uncorrectable ECC errors (inject_uce()) that surface as error 507053
/// (DeviceMemoryError) on the next operation touching the damaged range; the device is then
/// unhealthy until stop(), clean() and repair() have run. Thread-safe: a test may inject a UCE from
/// another thread.
class AscendModel {
public:
    static constexpr int mem_error_code = 507053;  // ACL_ERROR_RT_DEVICE_MEM_ERROR

    explicit AscendModel(int device_id = 0, std::size_t capacity_bytes = std::size_t(32) << 30)
        : device_(device_id), capacity_(capacity_bytes) {}

    /// Places a tensor in device memory (the simulation keeps the bytes where they are and
    /// accounts for them). Throws DeviceOutOfMemory beyond the capacity.
    void attach(std::string name, std::span<float> memory) {
        std::lock_guard lock(m_);
        const std::size_t bytes = memory.size_bytes();
        if (used_ + bytes > capacity_)
            throw DeviceOutOfMemory("device " + std::to_string(device_) + ": '" + name + "' needs " +
                                    std::to_string(bytes) + " bytes, " + std::to_string(capacity_ - used_) + " of " +
                                    std::to_string(capacity_) + " are free");
        used_ += bytes;
        tensors_[std::move(name)] = Region{memory, {}};
    }
    std::size_t used_bytes() const {
        std::lock_guard lock(m_);
        return used_;
    }

    /// Host -> device and device -> host copies of an attached tensor; both touch it.
    void copy_to_device(std::string_view name, std::span<const float> host) {
        touch(name);
        std::lock_guard lock(m_);
        auto& r = region(name);
        if (host.size() != r.memory.size())
            throw ckpt::ConfigError("copy to device: '" + std::string(name) + "' holds " + std::to_string(r.memory.size()) +
                                    " floats, the source " + std::to_string(host.size()));
        std::copy(host.begin(), host.end(), r.memory.begin());
    }
    void copy_to_host(std::string_view name, std::span<float> host) {
        touch(name);
        std::lock_guard lock(m_);
        auto& r = region(name);
        if (host.size() != r.memory.size())
            throw ckpt::ConfigError("copy to host: '" + std::string(name) + "' holds " + std::to_string(r.memory.size()) +
                                    " floats, the destination " + std::to_string(host.size()));
        std::copy(r.memory.begin(), r.memory.end(), host.begin());
    }

    /// An uncorrectable ECC error in floats [first, first + count) of tensor `name`: the
    /// bits there are scrambled now, and the next operation touching the tensor fails. When
    /// not `repairable` (the range cannot be mapped out), repair() fails: the device is lost.
    void inject_uce(std::string_view name, std::size_t first = 0, std::size_t count = 16, bool repairable = true) {
        std::lock_guard lock(m_);
        if (!repairable) lost_ = true;
        auto& r = region(name);
        if (first >= r.memory.size()) throw ckpt::ConfigError("inject_uce: '" + std::string(name) + "' has no float " + std::to_string(first));
        count = std::min(count, r.memory.size() - first);
        for (std::size_t i = first; i < first + count; ++i) {
            std::uint32_t bits;
            std::memcpy(&bits, &r.memory[i], sizeof bits);
            bits ^= 0x5a5a5a5au;
            std::memcpy(&r.memory[i], &bits, sizeof bits);
        }
        r.poisoned.push_back({first, count});
    }

    /// An operation on tensor `name`: throws DeviceMemoryError if it holds a poisoned range,
    /// and marks the device unhealthy.
    void touch(std::string_view name) {
        std::lock_guard lock(m_);
        check_usable(name);
        auto& r = region(name);
        if (!r.poisoned.empty()) {
            health_ = Health::uce;
            const auto p = r.poisoned.front();
            throw DeviceMemoryError("device " + std::to_string(device_) + ": error " + std::to_string(mem_error_code) +
                                        " (device memory error) touching '" + std::string(name) + "', floats " +
                                        std::to_string(p.first) + "-" + std::to_string(p.first + p.count - 1),
                                    mem_error_code, std::string(name));
        }
    }
    /// Whether a tensor of this name is attached.
    bool holds(std::string_view name) const {
        std::lock_guard lock(m_);
        return tensors_.contains(std::string(name));
    }
    void touch_all() {
        std::vector<std::string> names;
        {
            std::lock_guard lock(m_);
            for (const auto& [n, r] : tensors_) names.push_back(n);
        }
        for (const auto& n : names) touch(n);
    }
    void synchronize() {
        std::lock_guard lock(m_);
        if (health_ == Health::uce)
            throw DeviceMemoryError("device " + std::to_string(device_) + ": error " + std::to_string(mem_error_code) +
                                        " reported at synchronize",
                                    mem_error_code, "");
    }
    Health health() const {
        std::lock_guard lock(m_);
        return health_;
    }

    /// The seed's repair sequence: stop the device's work, clean (scrub) the poisoned
    /// memory, repair (map out the bad range and resume). Out of order is an error.
    void stop() {
        std::lock_guard lock(m_);
        health_ = Health::stopped;
    }
    void clean() {
        std::lock_guard lock(m_);
        if (health_ != Health::stopped) throw ckpt::ConfigError("device " + std::to_string(device_) + ": clean before stop");
        for (auto& [n, r] : tensors_) {
            for (const auto& p : r.poisoned) std::fill_n(r.memory.begin() + static_cast<std::ptrdiff_t>(p.first), p.count, 0.0f);
            r.poisoned.clear();
        }
        health_ = Health::cleaned;
    }
    void repair() {
        std::lock_guard lock(m_);
        if (health_ != Health::cleaned) throw ckpt::ConfigError("device " + std::to_string(device_) + ": repair before clean");
        if (lost_)
            throw DeviceMemoryError("device " + std::to_string(device_) + ": error " + std::to_string(mem_error_code) +
                                        " at repair: the damaged memory cannot be mapped out; the device needs replacing",
                                    mem_error_code, "");
        health_ = Health::healthy;
        ++repairs_;
    }
    int repairs() const {
        std::lock_guard lock(m_);
        return repairs_;
    }
    std::string_view name() const { return "ascend-model"; }

private:
    struct Range {
        std::size_t first, count;
    };
    struct Region {
        std::span<float> memory;
        std::vector<Range> poisoned;
    };
    Region& region(std::string_view name) {
        auto it = tensors_.find(std::string(name));
        if (it == tensors_.end()) throw ckpt::ConfigError("device " + std::to_string(device_) + " holds no tensor '" + std::string(name) + "'");
        return it->second;
    }
    void check_usable(std::string_view name) const {
        if (health_ == Health::stopped || health_ == Health::cleaned)
            throw DeviceMemoryError("device " + std::to_string(device_) + " is " + health_name(health_) +
                                        ": no operation on '" + std::string(name) + "' until it is repaired",
                                    mem_error_code, std::string(name));
    }

    int device_;
    std::size_t capacity_, used_ = 0;
    mutable std::mutex m_;
    std::map<std::string, Region> tensors_;
    Health health_ = Health::healthy;
    bool lost_ = false;  // an unrepairable UCE was injected
    int repairs_ = 0;
};

static_assert(Backend<Cpu>);
static_assert(Backend<AscendModel>);

}  // namespace fault
