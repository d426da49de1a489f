#pragma once
// PyTorch's torch.save files (.pt, .pth): load_torch and torch_contents, read without libtorch
// or Python. Link ckpt::interop (libzip).
//
// The zip that torch.save writes since PyTorch 1.6 is read by a restricted unpickler
// (detail/pickle.hpp) that takes dicts, lists, tuples, plain values and tensors and refuses
// every other Python global; nested dicts come out flattened with dots ("model.fc.weight",
// "optimizer.state.0.exp_avg"). See load_torch. To save libtorch state, see types/torch.hpp.

#include <zip.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../detail/pickle.hpp"
#include "../detail/verified_reader.hpp"
#include "../detail/zip.hpp"
#include "../path.hpp"
#include "common.hpp"

namespace ckpt {

namespace detail {

/// Nested dicts, lists and tuples → (dotted name, leaf) pairs, in the pickle's order.
class TorchFlattener {
public:
    /// Visits may cost at most `budget` (a visit costs its name's length + 1): a small pickle
    /// whose shared containers hold each other many times over expands exponentially.
    TorchFlattener(const TorchUnpickler& u, std::string path, std::uint64_t budget, DecodeBudget& decoded)
        : u_(u), path_(std::move(path)), budget_(budget), decoded_(decoded) {}

    /// What an entry of the result costs besides its name: its place here, in the ParamDict
    /// and in the ParamDict's index.
    static constexpr std::uint64_t entry_cost = sizeof(std::pair<std::string, PyRef>) + sizeof(ParamDict::Entry) + 64;

    std::vector<std::pair<std::string, PyRef>> entries;

    void walk(const PyRef& v, const std::string& name, std::size_t depth) {
        const std::string where = name.empty() ? "the top level" : "'" + name + "'";
        spent_ += name.size() + 1;
        if (spent_ > budget_)
            torch_fail(path_, "its dicts and lists expand to more than " + std::to_string(budget_) +
                                  " bytes of entry names (containers shared many times over)");
        switch (v.kind) {
            case PyRef::none: return;
            case PyRef::dict:
            case PyRef::list:
            case PyRef::tuple: {
                if (depth >= max_depth)
                    torch_fail(path_, "its dicts and lists nest more than " + std::to_string(max_depth) + " deep at " + where);
                const auto& items = u_.containers[static_cast<std::size_t>(v.i)];
                const std::string prefix = name.empty() ? name : name + ".";
                if (v.kind != PyRef::dict) {
                    for (std::size_t k = 0; k < items.size(); ++k) walk(items[k], prefix + std::to_string(k), depth + 1);
                    return;
                }
                for (std::size_t k = 0; k + 1 < items.size(); k += 2) {
                    const PyRef& key = items[k];
                    if (key.kind == PyRef::string) walk(items[k + 1], prefix + u_.strings[static_cast<std::size_t>(key.i)], depth + 1);
                    else if (key.kind == PyRef::integer) walk(items[k + 1], prefix + std::to_string(key.i), depth + 1);
                    else torch_fail(path_, "a dict at " + where + " has a key of type " + py_kind_name(key.kind) + " (str and int keys are read)");
                }
                return;
            }
            case PyRef::boolean:
            case PyRef::integer:
            case PyRef::floating:
            case PyRef::string:
            case PyRef::tensor:
                decoded_.take(2 * name.size() + entry_cost, [&] { return "its entries, at " + where; });
                entries.emplace_back(name, v);
                return;
            case PyRef::bytes:
            case PyRef::global:
            case PyRef::storage: break;
        }
        torch_fail(path_, "entry " + where + " holds a " + py_kind_name(v.kind) +
                              ", which ckpt does not hold (tensors, ints, floats, bools and strings, in dicts, lists and tuples)");
    }

    static constexpr std::size_t max_depth = 64;

private:
    const TorchUnpickler& u_;
    std::string path_;
    std::uint64_t budget_, spent_ = 0;
    DecodeBudget& decoded_;
};

/// Makes the tensors of a torch.save file, reading each storage record once, when a tensor
/// first needs it. Contiguous tensors alias their storage (tensors that shared memory in
/// PyTorch share it here too); non-contiguous ones are copied into C order, at most four
/// times the bytes of the storages read so far.
class TorchTensorMaker {
public:
    /// Each storage record read, and each tensor made (its bytes are what a caller copies or
    /// writes, though views share them here), takes its bytes of `budget`.
    TorchTensorMaker(zip_t* za, const TorchUnpickler& u, std::string path, std::string prefix, std::uint64_t file_bytes,
                     bool swap, DecodeBudget& budget)
        : za_(za), u_(u), path_(std::move(path)), prefix_(std::move(prefix)), file_bytes_(file_bytes), swap_(swap),
          made_(u.tensors.size()), budget_(budget) {}

    /// Tensor `index` under `name`: its storage read on first use.
    Tensor make(std::size_t index, const std::string& name) {
        if (made_[index]) return *made_[index];  // the same tensor object under several names (tied weights)
        const TorchTensorRef& t = u_.tensors[index];
        const TorchStorageRef& s = u_.storages[t.storage];
        const View v = check(index, name);
        auto fail = [&](const std::string& why) { torch_fail(path_, "tensor '" + name + "' " + why); };
        if (v.numel == 0) return remember(index, Tensor::uninitialized(v.dtype, t.size));
        const std::byte* base = storage_bytes(s, v.width, name) + t.offset * v.width;
        budget_.take(v.numel * v.width,
                     [&] { return "tensor '" + name + "' (" + v.what + ") among views of the storages read"; });
        Tensor out;
        if (v.contiguous) {
            out = Tensor::aliasing(v.dtype, t.size, blocks_.at(s.key).data, const_cast<std::byte*>(base));
        } else {
            copied_ += v.numel * v.width;
            if (copied_ > 4 * read_)
                fail("(" + v.what + ") is one of non-contiguous views that add up to " + std::to_string(copied_) +
                     " bytes, more than four times the " + std::to_string(read_) +
                     " bytes of the storages read so far; save them with .contiguous()");
            out = Tensor::uninitialized(v.dtype, t.size);
            gather_strided(base, out.data(), t.size, std::vector<std::size_t>(t.stride.begin(), t.stride.end()), v.width);
        }
        if (v.dtype == DType::boolean)
            for (std::size_t b = 0; b < out.nbytes(); ++b)
                if (static_cast<unsigned>(out.data()[b]) > 1) fail("holds a bool that is neither 0 nor 1");
        return remember(index, std::move(out));
    }

    /// Tensor `index` under `name` as a table of contents lists it: its dtype and shape, checked
    /// against its storage's persistent id and the size of the storage's record in the zip
    /// directory; no byte of the storage is read.
    EntryMeta describe(std::size_t index, const std::string& name) {
        const TorchTensorRef& t = u_.tensors[index];
        const View v = check(index, name);
        if (v.numel > 0) storage_record(u_.storages[t.storage], v.width, name);
        EntryMeta e;
        e.name = name;
        e.kind = ValueKind::tensor;
        e.dtype = v.dtype;
        e.shape = t.size;
        e.nbytes = v.numel * v.width;
        return e;
    }

private:
    /// What a tensor's arguments say, checked against its storage's persistent id.
    struct View {
        DType dtype;
        std::size_t width = 0, numel = 0;
        bool contiguous = true;
        std::string what;  // "float32[2, 3]"
    };

    View check(std::size_t index, const std::string& name) const {
        const TorchTensorRef& t = u_.tensors[index];
        const TorchStorageRef& s = u_.storages[t.storage];
        const TorchGlobal& type = torch_globals[s.type];
        auto fail = [&](const std::string& why) { torch_fail(path_, "tensor '" + name + "' " + why); };
        if (!type.dtype)
            throw FormatError("PyTorch file '" + path_ + "': tensor '" + name + "' has dtype " + std::string(type.dtype_text) +
                                  ", which ckpt does not hold (a quantized dtype); convert it before saving, e.g. with "
                                  ".dequantize()",
                              path_);
        View v;
        v.dtype = *type.dtype;
        v.width = itemsize(v.dtype);
        v.what = std::string(dtype_name(v.dtype)) + shape_string(t.size);
        const std::string& what = v.what;
        std::size_t& numel = v.numel;
        try {
            numel = checked_numel(t.size, std::numeric_limits<std::size_t>::max() / v.width);
        } catch (const FormatError&) {
            fail("has an impossible shape " + shape_string(t.size));
        }
        if (numel == 0) return v;
        const std::string storage = "storage '" + s.key + "' of " + std::to_string(s.numel) + " elements";
        if (numel > s.numel)
            fail("(" + what + ") has more elements than its " + storage +
                 ": an expanded view, which ckpt does not rebuild; save it with .contiguous()");
        // The furthest element the view reaches, checked against the storage term by term.
        if (t.offset >= s.numel) fail("(" + what + ") starts at element " + std::to_string(t.offset) + " of its " + storage);
        std::uint64_t last = t.offset;
        for (std::size_t k = 0; k < t.size.size(); ++k) {
            const auto span = static_cast<std::uint64_t>(t.size[k]) - 1;
            if (span == 0 || t.stride[k] == 0) continue;
            if (span > (s.numel - 1 - last) / t.stride[k])
                fail("(" + what + ", offset " + std::to_string(t.offset) + ", strides " + strides_text(t.stride) +
                     ") reaches past the end of its " + storage);
            last += span * t.stride[k];
        }
        std::uint64_t expected = 1;
        for (std::size_t k = t.size.size(); k-- > 0;) {
            if (t.size[k] != 1 && t.stride[k] != expected) v.contiguous = false;
            expected *= static_cast<std::uint64_t>(t.size[k]);
        }
        return v;
    }

    static std::string strides_text(const std::vector<std::uint64_t>& stride) {
        std::string out = "[";
        for (std::size_t k = 0; k < stride.size(); ++k) out += (k ? ", " : "") + std::to_string(stride[k]);
        return out + "]";
    }

    Tensor remember(std::size_t index, Tensor t) {
        made_[index] = t;
        return t;
    }

    /// The zip entry of storage record "data/{key}": present, and of the size its persistent id
    /// says, or a FormatError naming the tensor.
    std::pair<zip_uint64_t, zip_stat_t> storage_record(const TorchStorageRef& s, std::size_t width, const std::string& name) {
        const std::string member = prefix_ + "data/" + s.key;
        const std::string what = "storage '" + s.key + "' (record '" + member + "')";
        const bool overflow = s.numel > std::numeric_limits<std::uint64_t>::max() / width;
        const zip_int64_t index = zip_name_locate(za_, member.c_str(), ZIP_FL_ENC_RAW);
        if (index < 0) torch_fail(path_, "tensor '" + name + "' is in " + what + ", which the file does not have");
        zip_stat_t st;
        zip_stat_init(&st);
        if (zip_stat_index(za_, static_cast<zip_uint64_t>(index), ZIP_FL_ENC_RAW, &st) != 0)
            torch_fail(path_, "record '" + member + "': " + zip_strerror(za_));
        check_member_entry(st, file_bytes_, "PyTorch", path_, member);
        if (overflow || st.size != s.numel * width)
            torch_fail(path_, what + " holds " + std::to_string(st.size) + " bytes where its " + std::to_string(s.numel) +
                                  " elements of " + std::to_string(width) + " bytes need " +
                                  (overflow ? "more" : std::to_string(s.numel * width)));
        return {static_cast<zip_uint64_t>(index), st};
    }

    /// The bytes of storage record "data/{key}", read on first use; its size must be what the
    /// persistent id says, before anything is allocated.
    const std::byte* storage_bytes(const TorchStorageRef& s, std::size_t width, const std::string& name) {
        const std::string member = prefix_ + "data/" + s.key;
        const std::string what = "storage '" + s.key + "' (record '" + member + "')";
        const bool overflow = s.numel > std::numeric_limits<std::uint64_t>::max() / width;
        auto it = blocks_.find(s.key);
        if (it == blocks_.end()) {
            const auto [index, st] = storage_record(s, width, name);
            const auto size = st.size;  // clang 14 cannot capture a structured binding
            budget_.take(size, [&] { return what + ", of " + std::to_string(size) + " bytes"; });
            Block b{nullptr, st.size, swap_ ? width : 1};
            MemberReader in(za_, index, st.size, path_, member, "PyTorch");
            if (st.comp_method == ZIP_CM_STORE) {  // torch.save stores: the size is what the file holds
                b.data = allocate_aligned(static_cast<std::size_t>(st.size));
                in.read(b.data.get(), st.size);
            } else {  // deflated, up to max_deflate_ratio: believed only as the bytes arrive
                const std::string bytes = in.read_growing(st.size);
                b.data = allocate_aligned(bytes.size());
                std::memcpy(b.data.get(), bytes.data(), bytes.size());
            }
            in.finish();
            // a complex's parts are swapped apart
            const auto& type = torch_globals[s.type];
            if (swap_) swap_bytes(b.data.get(), static_cast<std::size_t>(st.size), type.dtype ? number_size(*type.dtype) : width);
            read_ += st.size;
            it = blocks_.emplace(s.key, std::move(b)).first;
        }
        const Block& b = it->second;
        if (overflow || b.bytes != s.numel * width)
            torch_fail(path_, what + " holds " + std::to_string(b.bytes) + " bytes, and another of its references gives " +
                                  std::to_string(s.numel) + " elements of " + std::to_string(width) + " bytes");
        if (swap_ && b.swapped_width != width)
            torch_fail(path_, what + " of a big-endian file is read as elements of " + std::to_string(b.swapped_width) +
                                  " and of " + std::to_string(width) + " bytes");
        return b.data.get();
    }

    struct Block {
        std::shared_ptr<std::byte> data;
        std::uint64_t bytes = 0;
        std::size_t swapped_width = 1;
    };

    zip_t* za_;
    const TorchUnpickler& u_;
    std::string path_, prefix_;
    std::uint64_t file_bytes_;
    bool swap_;
    std::vector<std::optional<Tensor>> made_;
    std::unordered_map<std::string, Block> blocks_;
    std::uint64_t read_ = 0, copied_ = 0;
    DecodeBudget& budget_;
};

/// One small record of the archive ("data.pkl", "byteorder") as text.
inline std::string torch_record(zip_t* za, zip_uint64_t index, std::uint64_t file_bytes, const std::string& path,
                                const std::string& member, DecodeBudget& budget) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(za, index, ZIP_FL_ENC_RAW, &st) != 0) torch_fail(path, "record '" + member + "': " + zip_strerror(za));
    check_member_entry(st, file_bytes, "PyTorch", path, member);
    budget.take(st.size, [&] { return "record '" + member + "' unpacks to " + std::to_string(st.size) + " bytes"; });
    MemberReader in(za, index, st.size, path, member, "PyTorch");
    std::string out = in.read_growing(st.size);
    in.finish();
    return out;
}

}  // namespace detail

namespace detail {
/// Reads the torch.save file at `path`: its pickle and, with `payloads`, its storages, into
/// `dict`. Without payloads (what `ckpt show` lists), tensors are described into `entries` from
/// the pickle and the zip directory, no storage read.
inline void read_torch(const std::string& path, const InteropLoadOptions& opts, bool payloads, ParamDict& dict,
                       std::vector<EntryMeta>& entries) {
    std::uint64_t file_bytes = 0;
    {
        auto fd = open_for_read(path, "PyTorch file");
        file_bytes = file_size(fd.get(), path);
        std::array<char, 32> head{};
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, head.size()));
        pread_exact(fd.get(), head.data(), n, 0, path);
        const std::string_view start(head.data(), n);
        if (start.starts_with('\x80') && start.find(torch_legacy_magic) != std::string_view::npos)
            throw FormatError("PyTorch file '" + path +
                                  "' is a legacy torch.save file (before PyTorch 1.6); re-save it with torch.save(..., "
                                  "_use_new_zipfile_serialization=True)",
                              path);
    }
    int err = 0;
    ZipArchive zip{zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err)};
    if (!zip.za) torch_fail(path, "it is not a readable zip archive: " + zip_error_text(err));
    DecodeBudget budget("PyTorch file '" + path + "'", path, opts.max_decoded_bytes, file_bytes, interop_budget_option);

    // The archive's folder: the one holding data.pkl ("archive/" since PyTorch 2.0; the file's
    // stem before).
    std::string prefix;
    std::optional<zip_uint64_t> pickle_index;
    const zip_int64_t count = zip_get_num_entries(zip.za, 0);
    for (zip_int64_t k = 0; k < count && !pickle_index; ++k) {
        const char* name = zip_get_name(zip.za, static_cast<zip_uint64_t>(k), ZIP_FL_ENC_RAW);
        const std::string_view member = name ? name : "";
        const auto slash = member.find('/');
        if (slash != std::string_view::npos && member.substr(slash + 1) == "data.pkl") {
            prefix = std::string(member.substr(0, slash + 1));
            pickle_index = static_cast<zip_uint64_t>(k);
        }
    }
    if (!pickle_index) torch_fail(path, "it has no '{archive}/data.pkl' record: it is a zip, but not one torch.save wrote");
    if (zip_name_locate(zip.za, (prefix + "constants.pkl").c_str(), ZIP_FL_ENC_RAW) >= 0)
        throw FormatError("PyTorch file '" + path +
                              "' is a TorchScript archive (torch.jit.save), which holds code; ckpt reads what torch.save "
                              "writes: save the module's state_dict() with torch.save",
                          path);

    bool swap = false;  // the storages' byte order differs from this machine's
    if (const zip_int64_t at = zip_name_locate(zip.za, (prefix + "byteorder").c_str(), ZIP_FL_ENC_RAW); at >= 0) {
        const std::string order = torch_record(zip.za, static_cast<zip_uint64_t>(at), file_bytes, path, prefix + "byteorder", budget);
        if (order != "little" && order != "big")
            torch_fail(path, "record '" + prefix + "byteorder' is neither 'little' nor 'big'");
        swap = (order == "big") != (std::endian::native == std::endian::big);
    }

    const std::string pickle = torch_record(zip.za, *pickle_index, file_bytes, path, prefix + "data.pkl", budget);
    TorchUnpickler unpickler(pickle, path, prefix + "data.pkl", budget);
    const PyRef root = unpickler.run();
    if (root.kind != PyRef::dict && root.kind != PyRef::list && root.kind != PyRef::tuple)
        torch_fail(path, "it holds a single " + py_kind_name(root.kind) +
                                     ", not a dict: ckpt reads what torch.save(model.state_dict()) or torch.save({...}) writes");
    TorchFlattener flat(unpickler, path, 16 * std::uint64_t{pickle.size()} + (std::uint64_t{1} << 20), budget);
    flat.walk(root, "", 0);

    TorchTensorMaker maker(zip.za, unpickler, path, prefix, file_bytes, swap, budget);
    std::unordered_set<std::string_view> names;
    for (const auto& [name, v] : flat.entries) {
        if (!names.insert(name).second)
            torch_fail(path, "'" + name + "' appears twice once nested dicts are flattened with dots");
        Value value;
        switch (v.kind) {
            case PyRef::boolean: value = v.i != 0; break;
            case PyRef::integer: value = v.i; break;
            case PyRef::floating: value = v.f; break;
            case PyRef::string: value = unpickler.strings[static_cast<std::size_t>(v.i)]; break;
            default:
                if (!payloads) {
                    entries.push_back(maker.describe(static_cast<std::size_t>(v.i), name));
                    continue;
                }
                value = maker.make(static_cast<std::size_t>(v.i), name);
                break;
        }
        if (payloads) {
            dict.set(name, std::move(value));
            continue;
        }
        EntryMeta& e = entries.emplace_back();
        e.name = name;
        e.kind = value.kind();
        e.scalar = std::move(value);
    }
}
}  // namespace detail

/// Reads a file written by PyTorch's torch.save (the zip format, the default since PyTorch
/// 1.6): `torch.save(model.state_dict(), path)`, or a dict of state_dicts and plain values
/// such as `{"model": ..., "optimizer": opt.state_dict(), "epoch": 3}`.
///
/// Nested dicts, lists and tuples are flattened with dots, in the file's order: "model.fc.weight",
/// "optimizer.state.0.exp_avg" (int keys become their decimal text), "optimizer.param_groups.0.betas.1".
/// Tensors of float32, float64, float16, int32, int64, uint8 and bool become tensors, Python
/// ints int64, floats double, bools bool, str strings, a torch.device its text ("cuda:0"). None
/// and empty dicts, lists and tuples give no entry. Tensors that are contiguous share the memory
/// of the storage read for them (as tensors sharing a storage did in PyTorch); non-contiguous
/// views (a transpose, a strided slice) are copied into C order.
///
/// The pickle inside is read by a restricted unpickler: it knows only the opcodes and globals
/// torch.save uses for these (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
/// _rebuild_parameter, the storage types, torch.device), and never calls or constructs anything
/// a file names. Any other global is a FormatError naming it (an object of a user's class, a
/// function), and so are other dtypes (bfloat16, int8, int16, complex; the error names the
/// tensor), expanded views, legacy non-zip files and TorchScript archives. Every offset, size and
/// stride is checked against its storage, and each storage's size against the file, before
/// anything is allocated or read; a damaged file is a FormatError naming the file.
inline ParamDict load_torch(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict dict;
        std::vector<detail::EntryMeta> unused;
        detail::read_torch(path, opts, true, dict, unused);
        return dict;
    });
}

/// What load_torch would return, in its order, as a table of contents: each tensor's dtype and
/// shape from the pickle, checked against its storage's entry in the zip directory; no storage
/// is read. Reads the zip directory and the pickle.
inline std::vector<detail::EntryMeta> torch_contents(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict unused;
        std::vector<detail::EntryMeta> entries;
        detail::read_torch(path, opts, false, unused, entries);
        return entries;
    });
}

}  // namespace ckpt
