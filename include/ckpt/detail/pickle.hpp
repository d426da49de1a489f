#pragma once
// The restricted unpickler behind load_torch (interop/pytorch.hpp): it runs the opcodes and
// knows the globals torch.save writes for tensors and their containers, builds dicts, lists,
// tuples and plain values itself, and never calls or constructs anything a pickle names.
// Memory is taken from a DecodeBudget before it is used; containers nest at most 64 deep.

#include <zip.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../format.hpp"
#include "../tensor.hpp"
#include "decode_budget.hpp"
#include "entry.hpp"
#include "zip.hpp"

namespace ckpt::detail {

// ---------------------------------------------------------------------------------------------
// PyTorch: what torch.save writes since 1.6, a zip of "{archive}/data.pkl" (a pickle of the
// saved object, protocol 2), "{archive}/data/{key}" (the bytes of each storage, stored),
// "{archive}/version" and, since 2.1, "{archive}/byteorder". Tensors are pickled as calls of
// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
// backward_hooks), each storage as the persistent id ("storage", torch.FloatStorage, key,
// location, numel). The reader below takes that and nothing more: it builds dicts, lists,
// tuples and plain values itself, and every global the pickle names is looked up in a fixed
// table; none is ever called.

[[noreturn]] inline void torch_fail(const std::string& path, const std::string& why) { zip_format_fail("PyTorch", path, why); }

/// What torch.save's pickles before the zip format start with: the legacy magic number
/// 0x1950a86a20f9469cfc6c as a pickled int (LONG1, 10 bytes).
inline constexpr std::string_view torch_legacy_magic = "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

/// A global a torch.save pickle may name, and what the reader makes of it.
struct TorchGlobal {
    enum Role : std::uint8_t { ordered_dict, rebuild_tensor, rebuild_parameter, device, storage };
    std::string_view module, name;
    Role role;
    std::optional<DType> dtype = std::nullopt;  // a storage type: its elements, when ckpt holds them
    std::string_view dtype_text = {};           // a storage type: PyTorch's name of its elements
    std::size_t itemsize = 0;
};

inline constexpr TorchGlobal torch_globals[] = {
    {"collections", "OrderedDict", TorchGlobal::ordered_dict},
    {"torch._utils", "_rebuild_tensor_v2", TorchGlobal::rebuild_tensor},
    {"torch._utils", "_rebuild_parameter", TorchGlobal::rebuild_parameter},
    {"torch", "device", TorchGlobal::device},
    {"torch", "FloatStorage", TorchGlobal::storage, DType::float32, "float32", 4},
    {"torch", "DoubleStorage", TorchGlobal::storage, DType::float64, "float64", 8},
    {"torch", "HalfStorage", TorchGlobal::storage, DType::float16, "float16", 2},
    {"torch", "IntStorage", TorchGlobal::storage, DType::int32, "int32", 4},
    {"torch", "LongStorage", TorchGlobal::storage, DType::int64, "int64", 8},
    {"torch", "ByteStorage", TorchGlobal::storage, DType::uint8, "uint8", 1},
    {"torch", "BoolStorage", TorchGlobal::storage, DType::boolean, "bool", 1},
    {"torch", "BFloat16Storage", TorchGlobal::storage, DType::bfloat16, "bfloat16", 2},
    {"torch", "CharStorage", TorchGlobal::storage, DType::int8, "int8", 1},
    {"torch", "ShortStorage", TorchGlobal::storage, DType::int16, "int16", 2},
    {"torch", "ComplexFloatStorage", TorchGlobal::storage, DType::complex64, "complex64", 8},
    {"torch", "ComplexDoubleStorage", TorchGlobal::storage, DType::complex128, "complex128", 16},
    // storage types whose elements ckpt does not hold: known, so that the error names the tensor
    {"torch", "QInt8Storage", TorchGlobal::storage, std::nullopt, "qint8", 1},
    {"torch", "QUInt8Storage", TorchGlobal::storage, std::nullopt, "quint8", 1},
    {"torch", "QInt32Storage", TorchGlobal::storage, std::nullopt, "qint32", 4},
    {"torch", "QUInt4x2Storage", TorchGlobal::storage, std::nullopt, "quint4x2", 1},
    {"torch", "QUInt2x4Storage", TorchGlobal::storage, std::nullopt, "quint2x4", 1},
};

/// A value of the pickle. Booleans, ints and floats are held here; strings, containers,
/// storages and tensors are indices into the unpickler's tables, so that what the pickle's
/// memo shares stays shared, and a container that holds itself is no cycle of owners.
struct PyRef {
    enum Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, tuple, list, dict, global, storage, tensor };
    Kind kind = none;
    std::int64_t i = 0;  // a boolean's or int's value; the table index of the others
    double f = 0;
};

inline std::string py_kind_name(PyRef::Kind k) {
    switch (k) {
        case PyRef::none: return "None";
        case PyRef::boolean: return "bool";
        case PyRef::integer: return "int";
        case PyRef::floating: return "float";
        case PyRef::string: return "str";
        case PyRef::bytes: return "bytes";
        case PyRef::tuple: return "tuple";
        case PyRef::list: return "list";
        case PyRef::dict: return "dict";
        case PyRef::global: return "Python global";
        case PyRef::storage: return "torch storage";
        case PyRef::tensor: return "tensor";
    }
    return "?";
}

/// A storage as a persistent id names it: the record "data/{key}", its type (an index into
/// torch_globals) and its number of elements.
struct TorchStorageRef {
    std::string key;
    std::size_t type = 0;
    std::uint64_t numel = 0;
};

/// The arguments of one _rebuild_tensor_v2 call, checked for their types only.
struct TorchTensorRef {
    std::size_t storage = 0;
    std::uint64_t offset = 0;
    Shape size;
    std::vector<std::uint64_t> stride;
};

/// The restricted unpickler: the opcodes of protocols 2 to 5 that torch.save's pickles of
/// dicts, lists, tuples, plain values and tensors use (protocol 2 unless pickle_protocol is
/// given; FRAME, SHORT_BINUNICODE, STACK_GLOBAL and MEMOIZE come with 4 and 5). Anything else
/// is a FormatError naming the file, the record and the byte.
class TorchUnpickler {
public:
    /// Every opcode takes op_cost of `budget`, and every string its bytes: what a pickle can
    /// build is bounded by the budget, however it is packed (a deflated list of 8 million ints).
    TorchUnpickler(std::string_view pickle, std::string path, std::string member, DecodeBudget& budget)
        : data_(pickle), path_(std::move(path)), member_(std::move(member)), budget_(budget) {}

    /// What an opcode may cost in memory: its value on the stack and in the container it joins.
    static constexpr std::uint64_t op_cost = 2 * sizeof(PyRef);

    std::vector<std::string> strings;            // str and bytes values
    std::vector<std::vector<PyRef>> containers;  // tuple and list items; a dict's keys and values, alternating
    std::vector<TorchStorageRef> storages;
    std::vector<TorchTensorRef> tensors;

    /// The pickled object.
    PyRef run() {
        while (pos_ < data_.size()) {
            op_at_ = pos_;
            budget_.take(op_cost, [&] { return "the objects of its pickle (record '" + member_ + "', byte " + std::to_string(op_at_) + ")"; });
            const auto op = static_cast<unsigned char>(data_[pos_++]);
            switch (op) {
                case 0x80: {  // PROTO
                    const unsigned v = byte();
                    if (v < 2 || v > 5) fail("pickle protocol " + std::to_string(v) + " (2 to 5 are read)");
                    break;
                }
                case 0x95: take(8); break;  // FRAME: the length of what follows, a hint for readers of streams
                case '.': return pop();     // STOP
                case '(': marks_.push_back(stack_.size()); break;  // MARK
                case '}': push(container(PyRef::dict, {})); break;
                case ']': push(container(PyRef::list, {})); break;
                case ')': push(container(PyRef::tuple, {})); break;
                case 't': push(container(PyRef::tuple, pop_mark())); break;
                case 0x85:  // TUPLE1, TUPLE2, TUPLE3
                case 0x86:
                case 0x87: {
                    const std::size_t n = op - 0x84u;
                    if (stack_.size() < fence() + n) fail("TUPLE" + std::to_string(n) + " on a stack of fewer items");
                    std::vector<PyRef> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
                    stack_.resize(stack_.size() - n);
                    push(container(PyRef::tuple, std::move(items)));
                    break;
                }
                case 'X': push(text(PyRef::string, le<std::uint32_t>())); break;     // BINUNICODE
                case 0x8c: push(text(PyRef::string, byte())); break;                  // SHORT_BINUNICODE
                case 0x8d: push(text(PyRef::string, le<std::uint64_t>())); break;     // BINUNICODE8
                case 'B': push(text(PyRef::bytes, le<std::uint32_t>())); break;       // BINBYTES
                case 'C': push(text(PyRef::bytes, byte())); break;                    // SHORT_BINBYTES
                case 'J': push(integer(le<std::int32_t>())); break;                   // BININT
                case 'K': push(integer(byte())); break;                               // BININT1
                case 'M': push(integer(le<std::uint16_t>())); break;                  // BININT2
                case 0x8a: {                                                          // LONG1
                    const unsigned n = byte();
                    if (n > 8) fail("an int of " + std::to_string(n) + " bytes (ckpt holds 64-bit ints)");
                    const auto bytes = take(n);
                    std::uint64_t u = 0;
                    for (unsigned k = 0; k < n; ++k) u |= std::uint64_t{static_cast<unsigned char>(bytes[k])} << (8 * k);
                    if (n > 0 && n < 8 && (static_cast<unsigned char>(bytes[n - 1]) & 0x80))  // negative: sign-extend
                        u |= ~std::uint64_t{0} << (8 * n);
                    push(integer(static_cast<std::int64_t>(u)));
                    break;
                }
                case 'G': {  // BINFLOAT: big-endian
                    const auto bytes = take(8);
                    std::uint64_t u = 0;
                    for (unsigned k = 0; k < 8; ++k) u = (u << 8) | static_cast<unsigned char>(bytes[k]);
                    push(PyRef{PyRef::floating, 0, std::bit_cast<double>(u)});
                    break;
                }
                case 0x88: push(PyRef{PyRef::boolean, 1}); break;  // NEWTRUE
                case 0x89: push(PyRef{PyRef::boolean, 0}); break;  // NEWFALSE
                case 'N': push(PyRef{}); break;                     // NONE
                case 'q': memo_[byte()] = top(); break;             // BINPUT
                case 'r': memo_[le<std::uint32_t>()] = top(); break;  // LONG_BINPUT
                case 0x94: {                                          // MEMOIZE
                    const auto at = static_cast<std::uint32_t>(memo_.size());
                    memo_[at] = top();
                    break;
                }
                case 'h': push(memo(byte())); break;                  // BINGET
                case 'j': push(memo(le<std::uint32_t>())); break;     // LONG_BINGET
                case 'c': {                                           // GLOBAL "module\nname\n"
                    const std::string module(line()), name(line());
                    push(global(module, name));
                    break;
                }
                case 0x93: {  // STACK_GLOBAL
                    const PyRef name = pop(), module = pop();
                    if (name.kind != PyRef::string || module.kind != PyRef::string)
                        fail("STACK_GLOBAL of a " + py_kind_name(module.kind) + " and a " + py_kind_name(name.kind));
                    push(global(strings[static_cast<std::size_t>(module.i)], strings[static_cast<std::size_t>(name.i)]));
                    break;
                }
                case 'R': {  // REDUCE: callable(*args)
                    const PyRef args = pop(), callable = pop();
                    if (callable.kind != PyRef::global) fail("REDUCE calls a " + py_kind_name(callable.kind));
                    if (args.kind != PyRef::tuple) fail("REDUCE with a " + py_kind_name(args.kind) + " of arguments");
                    push(reduce(torch_globals[callable.i], items_of(args)));
                    break;
                }
                case 'b': {  // BUILD: an OrderedDict's attributes (a state_dict's _metadata); not entries
                    const PyRef state = pop(), object = top();
                    if (object.kind != PyRef::dict || state.kind != PyRef::dict)
                        fail("BUILD of a " + py_kind_name(object.kind) + " from a " + py_kind_name(state.kind) +
                             " (only an OrderedDict's attributes are taken, and left out)");
                    break;
                }
                case 's': {  // SETITEM
                    const PyRef value = pop(), key = pop();
                    add_to(PyRef::dict, {key, value});
                    break;
                }
                case 'u': {  // SETITEMS
                    auto items = pop_mark();
                    if (items.size() % 2) fail("SETITEMS with a key and no value");
                    add_to(PyRef::dict, std::move(items));
                    break;
                }
                case 'a': add_to(PyRef::list, {pop()}); break;    // APPEND
                case 'e': add_to(PyRef::list, pop_mark()); break;  // APPENDS
                case 'Q': push(persistent(pop())); break;          // BINPERSID
                default: {
                    static constexpr char hex[] = "0123456789abcdef";
                    fail(std::string("opcode 0x") + hex[op >> 4] + hex[op & 15] + ", which torch.save's pickles do not use");
                }
            }
        }
        fail("ends without a STOP opcode");
    }

private:
    [[noreturn]] void fail(const std::string& why) const {
        torch_fail(path_, "record '" + member_ + "', byte " + std::to_string(op_at_) + ": " + why);
    }

    std::string_view take(std::uint64_t n) {
        if (n > data_.size() - pos_) fail("the record ends inside an opcode's argument");
        const auto out = data_.substr(pos_, static_cast<std::size_t>(n));
        pos_ += static_cast<std::size_t>(n);
        return out;
    }
    unsigned byte() { return static_cast<unsigned char>(take(1)[0]); }
    template <class T>
    T le() {
        return get_le<T>(reinterpret_cast<const std::byte*>(take(sizeof(T)).data()));
    }
    std::string_view line() {
        const auto end = data_.find('\n', pos_);
        if (end == std::string_view::npos || end - pos_ > 256) fail("GLOBAL without a name ending in a newline");
        const std::size_t n = end - pos_;
        return take(n + 1).substr(0, n);
    }

    /// The stack above the innermost MARK is what opcodes take from.
    std::size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
    void push(PyRef v) { stack_.push_back(v); }
    PyRef pop() {
        if (stack_.size() <= fence()) fail("an opcode takes from an empty stack");
        const PyRef v = stack_.back();
        stack_.pop_back();
        return v;
    }
    PyRef top() const {
        if (stack_.size() <= fence()) fail("an opcode uses the top of an empty stack");
        return stack_.back();
    }
    std::vector<PyRef> pop_mark() {
        if (marks_.empty()) fail("an opcode takes the items after a MARK, and there is none");
        const std::size_t at = marks_.back();
        marks_.pop_back();
        std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
        stack_.resize(at);
        return items;
    }
    PyRef memo(std::uint32_t at) const {
        const auto it = memo_.find(at);
        if (it == memo_.end()) fail("memo entry " + std::to_string(at) + " is read before it is written");
        return it->second;
    }

    static PyRef integer(std::int64_t v) { return PyRef{PyRef::integer, v}; }
    PyRef text(PyRef::Kind kind, std::uint64_t n) {
        const std::string_view bytes = take(n);
        budget_.take(bytes.size(), [&] { return "the strings of its pickle (record '" + member_ + "', byte " + std::to_string(op_at_) + ")"; });
        strings.emplace_back(bytes);
        return PyRef{kind, static_cast<std::int64_t>(strings.size() - 1)};
    }
    PyRef container(PyRef::Kind kind, std::vector<PyRef> items) {
        containers.push_back(std::move(items));
        return PyRef{kind, static_cast<std::int64_t>(containers.size() - 1)};
    }
    std::vector<PyRef> items_of(const PyRef& v) const { return containers[static_cast<std::size_t>(v.i)]; }
    void add_to(PyRef::Kind kind, std::vector<PyRef> items) {
        const PyRef target = top();
        if (target.kind != kind)
            fail((kind == PyRef::dict ? "SETITEM on a " : "APPEND to a ") + py_kind_name(target.kind));
        auto& to = containers[static_cast<std::size_t>(target.i)];
        to.insert(to.end(), items.begin(), items.end());
    }

    PyRef global(std::string_view module, std::string_view name) const {
        for (std::size_t g = 0; g < std::size(torch_globals); ++g)
            if (torch_globals[g].module == module && torch_globals[g].name == name)
                return PyRef{PyRef::global, static_cast<std::int64_t>(g)};
        throw FormatError("PyTorch file '" + path_ + "' refers to the Python global '" + std::string(module) + "." +
                              std::string(name) +
                              "', which ckpt does not load: it reads tensors, dicts, lists, tuples and plain values, "
                              "and never constructs an object or calls a function that a file names",
                          path_);
    }

    /// A storage's persistent id: ("storage", storage type, key, location, numel).
    PyRef persistent(const PyRef& id) {
        const auto items = id.kind == PyRef::tuple ? items_of(id) : std::vector<PyRef>{};
        const auto is = [&](std::size_t k, PyRef::Kind kind) { return items.size() > k && items[k].kind == kind; };
        if (items.size() != 5 || !is(0, PyRef::string) || strings[static_cast<std::size_t>(items[0].i)] != "storage" ||
            !is(1, PyRef::global) || torch_globals[items[1].i].role != TorchGlobal::storage || !is(2, PyRef::string) ||
            !is(3, PyRef::string) || !is(4, PyRef::integer) || items[4].i < 0)
            fail("a persistent id that is not ('storage', storage type, key, location, numel)");
        const std::string& key = strings[static_cast<std::size_t>(items[2].i)];
        if (key.empty() || key.size() > 64 ||
            !std::all_of(key.begin(), key.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
            fail("a storage key that is not a plain name");
        // A key seen before is that storage, whatever type and size this reference gives: so
        // torch.load reads it (its first reference makes the storage, later ones reuse it), and
        // so a tensor over it has the first reference's dtype.
        if (const auto seen = storage_by_key_.find(key); seen != storage_by_key_.end())
            return PyRef{PyRef::storage, static_cast<std::int64_t>(seen->second)};
        storage_by_key_.emplace(key, storages.size());
        storages.push_back({key, static_cast<std::size_t>(items[1].i), static_cast<std::uint64_t>(items[4].i)});
        return PyRef{PyRef::storage, static_cast<std::int64_t>(storages.size() - 1)};
    }

    /// Sizes and strides: tuples of non-negative ints, at most max_tensor_rank of them.
    std::vector<std::uint64_t> dims(const PyRef& v, const char* what) const {
        if (v.kind != PyRef::tuple) fail(std::string("_rebuild_tensor_v2 with a ") + py_kind_name(v.kind) + " for " + what);
        const auto& items = containers[static_cast<std::size_t>(v.i)];
        if (items.size() > max_tensor_rank)
            fail(std::string("a tensor ") + what + " of more than " + std::to_string(max_tensor_rank) + " dimensions");
        std::vector<std::uint64_t> out;
        for (const auto& d : items) {
            if (d.kind != PyRef::integer || d.i < 0) fail(std::string("a tensor ") + what + " that is not all non-negative ints");
            out.push_back(static_cast<std::uint64_t>(d.i));
        }
        return out;
    }

    PyRef reduce(const TorchGlobal& g, const std::vector<PyRef>& args) {
        const std::string call = std::string(g.module) + "." + std::string(g.name) + "() ";
        switch (g.role) {
            case TorchGlobal::ordered_dict:
                if (!args.empty()) fail(call + "with arguments");
                return container(PyRef::dict, {});
            case TorchGlobal::rebuild_parameter:  // (data, requires_grad, backward_hooks)
                if (args.size() != 3 || args[0].kind != PyRef::tensor) fail(call + "with other arguments than a tensor's");
                return args[0];
            case TorchGlobal::device: {  // ("cuda", 0) -> "cuda:0"
                if (args.empty() || args.size() > 2 || args[0].kind != PyRef::string ||
                    (args.size() == 2 && args[1].kind != PyRef::integer && args[1].kind != PyRef::none))
                    fail(call + "with other arguments than a device type and index");
                std::string text = strings[static_cast<std::size_t>(args[0].i)];
                if (args.size() == 2 && args[1].kind == PyRef::integer) text += ":" + std::to_string(args[1].i);
                strings.push_back(std::move(text));
                return PyRef{PyRef::string, static_cast<std::int64_t>(strings.size() - 1)};
            }
            case TorchGlobal::rebuild_tensor: {
                // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
                if ((args.size() != 6 && args.size() != 7) || args[0].kind != PyRef::storage ||
                    args[1].kind != PyRef::integer || args[1].i < 0 || args[4].kind != PyRef::boolean ||
                    args[5].kind != PyRef::dict ||
                    (args.size() == 7 && args[6].kind != PyRef::none &&
                     (args[6].kind != PyRef::dict || !containers[static_cast<std::size_t>(args[6].i)].empty())))
                    fail(call + "with other arguments than (storage, offset, size, stride, requires_grad, hooks)");
                TorchTensorRef t;
                t.storage = static_cast<std::size_t>(args[0].i);
                t.offset = static_cast<std::uint64_t>(args[1].i);
                for (const auto d : dims(args[2], "size")) {
                    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) fail("an impossible size");
                    t.size.push_back(static_cast<std::int64_t>(d));
                }
                t.stride = dims(args[3], "stride");
                if (t.stride.size() != t.size.size()) fail(call + "with " + std::to_string(t.size.size()) + " sizes and " +
                                                           std::to_string(t.stride.size()) + " strides");
                tensors.push_back(std::move(t));
                return PyRef{PyRef::tensor, static_cast<std::int64_t>(tensors.size() - 1)};
            }
            case TorchGlobal::storage: break;
        }
        fail(call + "is not a call torch.save's pickles make");
    }

    std::string_view data_;
    std::string path_, member_;
    std::size_t pos_ = 0, op_at_ = 0;
    std::vector<PyRef> stack_;
    std::vector<std::size_t> marks_;
    std::unordered_map<std::uint32_t, PyRef> memo_;
    std::unordered_map<std::string, std::size_t> storage_by_key_;
    DecodeBudget& budget_;
};

}  // namespace ckpt::detail
