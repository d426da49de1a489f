#pragma once
// MNIST-format data (IDX files, plain or gzip), the seed's image transforms, batching,
// seeded shuffling and set_init_step.
//
//   nn::MnistDataset train("/usr/share/datasets/fashion-mnist", nn::Usage::train);
//   train.map({nn::Rescale(1.0 / 255.0, 0), nn::Resize(32, 32), nn::HWC2CHW()})
//        .batch(32, /*drop_remainder=*/true);
//
// Batches are a pure function of (shuffle seed, epoch, step): the order of epoch e is a
// permutation drawn from (seed, e) alone, so an epoch started at step n with
// set_init_step(n) sees exactly the batches an uninterrupted run would have seen.

#include <zlib.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "../ckpt/dtype.hpp"
#include "../ckpt/param_dict.hpp"
#include "../ckpt/path.hpp"
#include "core.hpp"

namespace nn {

namespace fs = boost::filesystem;

/// Which files of a directory to read: the seed's `usage`.
enum class Usage { train, test, all };

/// pixel · rescale + shift.
struct Rescale {
    double rescale = 1.0, shift = 0.0;
    Rescale(double r, double s = 0.0) : rescale(r), shift(s) {}
};
/// Bilinear resize to height × width, with half-pixel centres (as OpenCV's INTER_LINEAR).
struct Resize {
    std::size_t height, width;
    Resize(std::size_t h, std::size_t w) : height(h), width(w) {}
};
/// (pixel − mean[c]) / std[c] per channel (up to 4 channels).
struct Normalize {
    static constexpr std::size_t max_channels = 4;
    std::array<double, max_channels> mean{}, std{};
    std::size_t mean_count = 0, std_count = 0;
    Normalize(std::initializer_list<double> m, std::initializer_list<double> s)
        : mean_count(m.size()), std_count(s.size()) {
        if (m.size() > max_channels || s.size() > max_channels)
            throw ckpt::ConfigError("Normalize takes at most 4 channels");
        std::copy(m.begin(), m.end(), mean.begin());
        std::copy(s.begin(), s.end(), std.begin());
    }
};
/// Height × width × channels → channels × height × width.
struct HWC2CHW {};
/// Image elements are computed in float32; labels are delivered as int32. TypeCast states
/// it and checks that the requested type is one of those.
struct TypeCast {
    ckpt::DType dtype;
    explicit TypeCast(ckpt::DType d) : dtype(d) {}
};
using ImageTransform = std::variant<Rescale, Resize, Normalize, HWC2CHW, TypeCast>;

/// One batch: images (N, …) in the layout the transforms produce, labels as int32.
struct Batch {
    Array images;
    std::vector<std::int32_t> labels;
};

namespace detail {

struct IdxFile {
    std::vector<std::uint32_t> dims;
    std::vector<std::uint8_t> data;
};

/// Reads an IDX file of unsigned bytes, gzip-compressed or not, checking its size.
inline IdxFile read_idx(const fs::path& file, std::size_t expected_rank) {
    const std::string path = file.string();
    errno = 0;
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f)  // zlib sets errno when the open itself failed, and leaves it 0 when it ran out of memory
        throw DataError("cannot open '" + path + "': " + (errno ? std::strerror(errno) : "not enough memory"));
    struct Closer {
        gzFile f;
        ~Closer() { gzclose(f); }
    } closer{f};
    gzbuffer(f, 1 << 20);
    auto read_exact = [&](void* dst, std::size_t n, const char* what) {
        std::size_t done = 0;
        while (done < n) {
            const int chunk = static_cast<int>(std::min<std::size_t>(n - done, 1u << 30));
            const int got = gzread(f, static_cast<char*>(dst) + done, static_cast<unsigned>(chunk));
            if (got < 0) {
                int err = 0;
                throw DataError("'" + path + "' is corrupt: " + gzerror(f, &err));
            }
            if (got == 0)
                throw DataError("'" + path + "' is truncated: it ends inside the " + what + " (" + std::to_string(done) +
                                " of " + std::to_string(n) + " bytes)");
            done += static_cast<std::size_t>(got);
        }
    };
    unsigned char magic[4];
    read_exact(magic, 4, "IDX magic number");
    if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] != expected_rank)
        throw DataError("'" + path + "' is not an IDX file of unsigned bytes with " + std::to_string(expected_rank) +
                        " dimensions (magic " + std::to_string(magic[2]) + "/" + std::to_string(magic[3]) +
                        ", expected 8/" + std::to_string(expected_rank) + ")");
    IdxFile idx;
    std::size_t total = 1;
    for (std::size_t i = 0; i < expected_rank; ++i) {
        unsigned char b[4];
        read_exact(b, 4, "IDX dimensions");
        const std::uint32_t d = (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
        if (d == 0 || d > (1u << 28)) throw DataError("'" + path + "' has an implausible dimension " + std::to_string(d));
        idx.dims.push_back(d);
        total *= d;
        if (total > (std::size_t(1) << 34)) throw DataError("'" + path + "' declares more than 16 GiB of data");
    }
    idx.data.resize(total);
    read_exact(idx.data.data(), total, "data");
    char extra;
    if (gzread(f, &extra, 1) != 0)
        throw DataError("'" + path + "' has bytes after the " + std::to_string(total) + " its header declares");
    return idx;
}

/// The file `kind` ("train-images-idx3-ubyte", …) in `dir`: plain, ".gz", or with the
/// original distribution's '.' before "idx".
inline std::optional<fs::path> find_idx(const fs::path& dir, const std::string& stem, const std::string& kind) {
    for (const std::string sep : {"-", "."})
        for (const std::string ext : {"", ".gz"}) {
            fs::path p = dir / (stem + sep + kind + ext);
            if (fs::is_regular_file(p)) return p;
        }
    return std::nullopt;
}

/// Output index → (lower source index, upper source index, weight of the upper).
struct LinearTaps {
    std::vector<std::uint32_t> lo, hi;
    std::vector<float> w;
};
inline LinearTaps linear_taps(std::size_t src, std::size_t dst) {
    LinearTaps t;
    const double scale = static_cast<double>(src) / static_cast<double>(dst);
    for (std::size_t i = 0; i < dst; ++i) {
        double x = (static_cast<double>(i) + 0.5) * scale - 0.5;
        if (x < 0) x = 0;
        auto lo = static_cast<std::size_t>(x);
        if (lo > src - 1) lo = src - 1;
        const std::size_t hi = std::min(lo + 1, src - 1);
        t.lo.push_back(static_cast<std::uint32_t>(lo));
        t.hi.push_back(static_cast<std::uint32_t>(hi));
        t.w.push_back(static_cast<float>(x - static_cast<double>(lo)));
    }
    return t;
}

/// A transform compiled for a known input shape.
struct ImageStep {
    ImageTransform what;
    std::size_t h = 0, w = 0, c = 0;  // input shape (HWC order of sizes)
    LinearTaps rows, cols;            // Resize only
};

inline std::uint64_t bounded(std::mt19937_64& g, std::uint64_t n) {  // uniform in [0, n), unbiased
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % n);
    std::uint64_t x;
    do x = g();
    while (x >= limit);
    return x % n;
}

}  // namespace detail

/// An MNIST-format data set (the seed's MnistDataset): images and labels from IDX files in
/// one directory, e.g. the seed's MNIST_Data/train or Debian's
/// /usr/share/datasets/fashion-mnist. Usage::all reads the train files, then the test
/// files, whichever exist.
class MnistDataset {
public:
    explicit MnistDataset(const ckpt::PathArg& dir, Usage usage = Usage::all, std::size_t num_classes = 10)
        : num_classes_(num_classes) {
        if (!fs::is_directory(dir)) throw DataError("data directory '" + dir.string() + "' does not exist");
        std::vector<std::string> stems;
        if (usage != Usage::test) stems.push_back("train");
        if (usage != Usage::train) stems.push_back("t10k");
        for (const auto& stem : stems) {
            auto images = detail::find_idx(dir, stem, "images-idx3-ubyte");
            auto labels = detail::find_idx(dir, stem, "labels-idx1-ubyte");
            if (!images && !labels && usage == Usage::all) continue;
            if (!images || !labels)
                throw DataError("data directory '" + dir.string() + "' has no " + stem + "-" +
                                (images ? "labels-idx1-ubyte" : "images-idx3-ubyte") + "[.gz]");
            append(*images, *labels);
        }
        if (labels_.empty())
            throw DataError("data directory '" + dir.string() +
                            "' has no MNIST files (train-images-idx3-ubyte[.gz], t10k-images-idx3-ubyte[.gz], …)");
        rebuild_plan();
    }

    /// Keeps the first n samples (the seed's take(n)).
    MnistDataset& take(std::size_t n) {
        if (n < labels_.size()) {
            labels_.resize(n);
            pixels_.resize(n * height_ * width_);
        }
        return *this;
    }
    /// Appends image transforms, applied in order.
    MnistDataset& map(std::vector<ImageTransform> transforms) {
        for (auto& t : transforms) transforms_.push_back(std::move(t));
        rebuild_plan();
        return *this;
    }
    /// The label column's TypeCast: labels are int32, so int32 and int64 are accepted.
    MnistDataset& map_label(const TypeCast& t) {
        if (t.dtype != ckpt::DType::int32 && t.dtype != ckpt::DType::int64)
            throw ckpt::ConfigError(std::string("labels are delivered as int32; TypeCast to ") +
                                    std::string(ckpt::dtype_name(t.dtype)) + " is not supported");
        return *this;
    }
    MnistDataset& batch(std::size_t batch_size, bool drop_remainder = false) {
        if (!batch_size) throw ckpt::ConfigError("batch size must be at least 1");
        batch_size_ = batch_size;
        drop_remainder_ = drop_remainder;
        check_shards();
        return *this;
    }
    /// Shuffles each epoch with a permutation drawn from (seed, epoch).
    MnistDataset& shuffle(std::uint64_t seed) {
        shuffle_ = true;
        seed_ = seed;
        return *this;
    }
    /// Data parallelism: this data set yields shard `shard_id` of `num_shards` of every
    /// batch, i.e. samples [id·b/n, (id+1)·b/n) of each global batch of b. The batch size
    /// must divide evenly and the remainder must be dropped, so every rank trains on equal
    /// shards of the same global batches and the mean of their gradients is the global one.
    MnistDataset& shard(std::size_t num_shards, std::size_t shard_id) {
        if (!num_shards || shard_id >= num_shards)
            throw ckpt::ConfigError("shard " + std::to_string(shard_id) + " of " + std::to_string(num_shards) +
                                    " does not exist");
        num_shards_ = num_shards;
        shard_id_ = shard_id;
        check_shards();
        return *this;
    }
    std::size_t num_shards() const noexcept { return num_shards_; }
    std::size_t shard_id() const noexcept { return shard_id_; }

    /// The next epoch the trainer runs starts at step n (0-based) of its order.
    void set_init_step(std::int64_t n) {
        if (n < 0 || n >= steps_per_epoch())
            throw ckpt::ConfigError("set_init_step(" + std::to_string(n) + "): an epoch has " +
                                    std::to_string(steps_per_epoch()) + " steps");
        init_step_ = n;
    }
    /// The step set by set_init_step, once; 0 afterwards.
    std::int64_t take_init_step() { return std::exchange(init_step_, 0); }

    std::size_t size() const noexcept { return labels_.size(); }
    std::size_t batch_size() const noexcept { return batch_size_; }
    std::int64_t steps_per_epoch() const noexcept {
        const std::size_t n = labels_.size();
        return static_cast<std::int64_t>(drop_remainder_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_);
    }
    /// One sample's shape after the transforms, e.g. {1, 32, 32} after HWC2CHW.
    const std::vector<std::size_t>& sample_shape() const noexcept { return sample_shape_; }
    std::int32_t label(std::size_t i) const { return labels_.at(i); }

    /// Batch `step` (0-based) of epoch `epoch` (1-based).
    void load_batch(std::int64_t epoch, std::int64_t step, Batch& out) const {
        if (step < 0 || step >= steps_per_epoch())
            throw ckpt::ConfigError("batch " + std::to_string(step) + " requested; an epoch has " +
                                    std::to_string(steps_per_epoch()) + " steps");
        const std::size_t per_shard = batch_size_ / num_shards_;
        const std::size_t first = static_cast<std::size_t>(step) * batch_size_ + shard_id_ * per_shard;
        const std::size_t n = num_shards_ > 1 ? per_shard : std::min(batch_size_, labels_.size() - first);
        std::vector<std::size_t> shape{n};
        shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
        if (!std::equal(out.images.shape().begin(), out.images.shape().end(), shape.begin(), shape.end()))
            out.images.resize(shape);
        out.labels.resize(n);
        const std::size_t sample = out.images.size() / std::max<std::size_t>(n, 1);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t idx = index_at(epoch, first + i);
            transform(idx, out.images.data() + i * sample);
            out.labels[i] = labels_[idx];
        }
    }

    /// What a checkpoint must hold to replay the order and find the position again: the
    /// shuffle settings, and what makes a step the same samples (the batch size, the number of
    /// samples, drop_remainder). Sharding is left out: a step is the same global batch on any
    /// number of ranks.
    ckpt::ParamDict state() const {
        return ckpt::ParamDict{{"data.shuffle", shuffle_},
                               {"data.seed", static_cast<std::int64_t>(seed_)},
                               {"data.steps_per_epoch", steps_per_epoch()},
                               {"data.batch_size", static_cast<std::int64_t>(batch_size_)},
                               {"data.size", static_cast<std::int64_t>(labels_.size())},
                               {"data.drop_remainder", drop_remainder_}};
    }
    /// Checks a checkpoint's data state against this data set, then takes its shuffle settings.
    /// Another batch size, number of samples, drop_remainder or step count would put the
    /// resumed run on other samples: LoadMismatch naming each. So would another shuffle seed
    /// when this data set was given one; a data set without shuffle() takes the checkpoint's.
    void load_state(const ckpt::ParamDict& d) {
        std::string differences;
        auto compare = [&](const char* key, std::int64_t here, const char* what) {
            if (!d.contains(key)) return;  // files written before the field existed
            const auto saved = d.get<std::int64_t>(key);
            if (saved != here)
                differences += std::string(differences.empty() ? "" : "; ") + what + " " + std::to_string(saved) +
                               " when saved, " + std::to_string(here) + " now";
        };
        compare("data.batch_size", static_cast<std::int64_t>(batch_size_), "batch size");
        compare("data.size", static_cast<std::int64_t>(labels_.size()), "samples");
        if (d.contains("data.drop_remainder") && d.get<bool>("data.drop_remainder") != drop_remainder_)
            differences += std::string(differences.empty() ? "" : "; ") + "drop_remainder " +
                           (drop_remainder_ ? "false when saved, true now" : "true when saved, false now");
        if (differences.empty())  // steps per epoch alone: a file written before the fields above
            compare("data.steps_per_epoch", steps_per_epoch(), "steps per epoch");
        if (shuffle_ && d.contains("data.shuffle")) {
            if (!d.get<bool>("data.shuffle"))
                differences += std::string(differences.empty() ? "" : "; ") + "no shuffle when saved, shuffle seed " +
                               std::to_string(seed_) + " now";
            else
                compare("data.seed", static_cast<std::int64_t>(seed_), "shuffle seed");
        }
        if (!differences.empty())
            throw ckpt::LoadMismatch("the checkpoint's data order differs from this data set's (" + differences +
                                     "): resuming would train on other samples; resume with the same data settings");
        if (d.contains("data.shuffle")) shuffle_ = d.get<bool>("data.shuffle");
        if (d.contains("data.seed")) seed_ = static_cast<std::uint64_t>(d.get<std::int64_t>("data.seed"));
        order_epoch_ = -1;
    }

private:
    void append(const fs::path& images, const fs::path& labels) {
        auto img = detail::read_idx(images, 3);
        auto lab = detail::read_idx(labels, 1);
        if (img.dims[0] != lab.dims[0])
            throw DataError("'" + images.string() + "' holds " + std::to_string(img.dims[0]) + " images but '" +
                            labels.string() + "' holds " + std::to_string(lab.dims[0]) + " labels");
        if (!labels_.empty() && (img.dims[1] != height_ || img.dims[2] != width_))
            throw DataError("'" + images.string() + "' holds " + std::to_string(img.dims[1]) + "x" +
                            std::to_string(img.dims[2]) + " images, the other files " + std::to_string(height_) + "x" +
                            std::to_string(width_));
        height_ = img.dims[1];
        width_ = img.dims[2];
        for (std::size_t i = 0; i < lab.data.size(); ++i)
            if (lab.data[i] >= num_classes_)
                throw DataError("'" + labels.string() + "': label " + std::to_string(lab.data[i]) + " of sample " +
                                std::to_string(i) + " is outside the " + std::to_string(num_classes_) + " classes");
        pixels_.insert(pixels_.end(), img.data.begin(), img.data.end());
        labels_.insert(labels_.end(), lab.data.begin(), lab.data.end());
    }

    void check_shards() const {
        if (num_shards_ == 1) return;
        if (batch_size_ % num_shards_ || !drop_remainder_)
            throw ckpt::ConfigError("sharding batches of " + std::to_string(batch_size_) + " over " +
                                    std::to_string(num_shards_) +
                                    " ranks needs a batch size they divide and batch(size, drop_remainder=true)");
    }

    void rebuild_plan() {
        plan_.clear();
        std::size_t h = height_, w = width_, c = 1;
        bool chw = false;
        for (const auto& t : transforms_) {
            detail::ImageStep s{t, h, w, c, {}, {}};
            if (const auto* r = std::get_if<Resize>(&t)) {
                if (chw) throw ckpt::ConfigError("Resize must come before HWC2CHW");
                if (!r->height || !r->width) throw ckpt::ConfigError("Resize to a zero size");
                s.rows = detail::linear_taps(h, r->height);
                s.cols = detail::linear_taps(w, r->width);
                h = r->height;
                w = r->width;
            } else if (std::holds_alternative<HWC2CHW>(t)) {
                if (chw) throw ckpt::ConfigError("HWC2CHW applied twice");
                chw = true;
            } else if (const auto* nz = std::get_if<Normalize>(&t)) {
                if (nz->mean_count != c || nz->std_count != c)
                    throw ckpt::ConfigError("Normalize needs " + std::to_string(c) + " mean and std values, got " +
                                            std::to_string(nz->mean_count) + " and " + std::to_string(nz->std_count));
                for (std::size_t ch = 0; ch < c; ++ch)
                    if (!(nz->std[ch] > 0)) throw ckpt::ConfigError("Normalize: std must be > 0");
            } else if (const auto* tc = std::get_if<TypeCast>(&t)) {
                if (tc->dtype != ckpt::DType::float32)
                    throw ckpt::ConfigError(std::string("images are computed in float32; TypeCast to ") +
                                            std::string(ckpt::dtype_name(tc->dtype)) + " is not supported");
            }
            plan_.push_back(std::move(s));
        }
        sample_shape_ = chw ? std::vector<std::size_t>{c, h, w} : std::vector<std::size_t>{h, w, c};
        chw_ = chw;
    }

    // Applies the plan to sample idx, writing sample_shape_ floats to out.
    void transform(std::size_t idx, float* out) const {
        const std::uint8_t* px = pixels_.data() + idx * height_ * width_;
        std::vector<float>* a = &scratch_;
        std::vector<float>* b = &resized_;
        std::size_t n = height_ * width_;
        a->resize(n);
        for (std::size_t i = 0; i < n; ++i) (*a)[i] = px[i];
        for (const auto& s : plan_) {
            if (const auto* r = std::get_if<Rescale>(&s.what)) {
                const auto k = static_cast<float>(r->rescale), c = static_cast<float>(r->shift);
                float* v = a->data();
                for (std::size_t i = 0; i < n; ++i) v[i] = v[i] * k + c;
            } else if (const auto* rs = std::get_if<Resize>(&s.what)) {
                n = rs->height * rs->width * s.c;
                b->resize(n);
                resize_bilinear(s, rs->height, rs->width, a->data(), b->data());
                std::swap(a, b);
            } else if (const auto* nz = std::get_if<Normalize>(&s.what)) {
                float* v = a->data();
                for (std::size_t i = 0; i < n; ++i) {
                    const std::size_t ch = i % s.c;
                    v[i] = static_cast<float>((v[i] - nz->mean[ch]) / nz->std[ch]);
                }
            }
            // HWC2CHW is applied on the way out; TypeCast changes nothing (float32 already).
        }
        const std::size_t c = chw_ ? sample_shape_[0] : sample_shape_[2];
        if (!chw_ || c == 1) {
            std::copy(a->begin(), a->begin() + static_cast<std::ptrdiff_t>(n), out);
        } else {
            const std::size_t hw = n / c;
            for (std::size_t i = 0; i < hw; ++i)
                for (std::size_t ch = 0; ch < c; ++ch) out[ch * hw + i] = (*a)[i * c + ch];
        }
    }

    static void resize_bilinear(const detail::ImageStep& s, std::size_t oh, std::size_t ow, const float* src,
                                float* dst) {
        const std::size_t c = s.c, row = s.w * c;
        for (std::size_t y = 0; y < oh; ++y) {
            const float wy = s.rows.w[y];
            const float* r0 = src + s.rows.lo[y] * row;
            const float* r1 = src + s.rows.hi[y] * row;
            float* d = dst + y * ow * c;
            for (std::size_t x = 0; x < ow; ++x) {
                const float wx = s.cols.w[x];
                const std::size_t x0 = s.cols.lo[x] * c, x1 = s.cols.hi[x] * c;
                for (std::size_t ch = 0; ch < c; ++ch) {
                    const float top = r0[x0 + ch] + (r0[x1 + ch] - r0[x0 + ch]) * wx;
                    const float bottom = r1[x0 + ch] + (r1[x1 + ch] - r1[x0 + ch]) * wx;
                    d[x * c + ch] = top + (bottom - top) * wy;
                }
            }
        }
    }

    std::size_t index_at(std::int64_t epoch, std::size_t position) const {
        if (!shuffle_) return position;
        if (order_epoch_ != epoch) {
            order_.resize(labels_.size());
            for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<std::uint32_t>(i);
            std::seed_seq seq{static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32),
                              static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)};
            std::mt19937_64 g(seq);
            for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[detail::bounded(g, i)]);
            order_epoch_ = epoch;
        }
        return order_[position];
    }

    std::size_t num_classes_;
    std::size_t height_ = 0, width_ = 0;
    std::vector<std::uint8_t> pixels_;
    std::vector<std::int32_t> labels_;
    std::vector<ImageTransform> transforms_;
    std::vector<detail::ImageStep> plan_;
    std::vector<std::size_t> sample_shape_;
    bool chw_ = false;
    std::size_t batch_size_ = 1;
    bool drop_remainder_ = false;
    std::size_t num_shards_ = 1, shard_id_ = 0;
    bool shuffle_ = false;
    std::uint64_t seed_ = 0;
    std::int64_t init_step_ = 0;
    // caches for load_batch (logically const)
    mutable std::vector<float> scratch_, resized_;
    mutable std::vector<std::uint32_t> order_;
    mutable std::int64_t order_epoch_ = -1;
};

}  // namespace nn
