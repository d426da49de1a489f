// Reading PyTorch's torch.save files (ckpt::load_torch in ckpt/interop.hpp): files written by
// Debian's python3-torch at test time (tests/python/write_torch_files.py), compared with what
// the same script wrote of them in formats ckpt already reads; and files it must refuse.
#include <ckpt/interop.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../fuzz/reader_input.hpp"
#include "alloc_tracker.hpp"
#include "python_scripts.hpp"
#include "support.hpp"

namespace torch_files {

/// The files of write_torch_files.py, written once per test process.
const test::fs::path& dir() {
    static test::TempDir made;
    static const bool written = [] {
        test::run_python("write_torch_files.py", made.path());
        return true;
    }();
    (void)written;
    return made.path();
}

/// load_torch(STEM.pt) gives what STEM.expected.npz and STEM.expected.json say: the same
/// names in the same order, tensors of the same dtype, shape and bytes, values of the same kind.
ckpt::ParamDict require_as_written(const std::string& stem) {
    CAPTURE(stem);
    const auto got = ckpt::load_torch(dir() / (stem + ".pt"));
    const auto tensors = ckpt::load_npz(dir() / (stem + ".expected.npz"));
    std::ifstream in((dir() / (stem + ".expected.json")).string());
    const auto expected = nlohmann::json::parse(in);
    std::vector<std::string> order;
    for (const auto& entry : got) order.push_back(entry.name);
    CHECK(order == expected.at("order").get<std::vector<std::string>>());
    for (const auto& entry : tensors) {
        const std::string& name = entry.name;
        CAPTURE(name);
        const ckpt::Value* v = got.find(name);
        REQUIRE(v != nullptr);
        REQUIRE(v->is_tensor());
        CHECK(v->get_if<ckpt::Tensor>()->describe() == entry.value.get_if<ckpt::Tensor>()->describe());
        CHECK(*v == entry.value);
    }
    for (const auto& item : expected.at("values").items()) {
        const std::string name = item.key();  // not a structured binding: CAPTURE's lambda takes it
        const auto& value = item.value();
        CAPTURE(name);
        const ckpt::Value* v = got.find(name);
        REQUIRE(v != nullptr);
        if (value.is_boolean()) CHECK(*v == ckpt::Value(value.get<bool>()));
        else if (value.is_number_integer()) CHECK(*v == ckpt::Value(value.get<std::int64_t>()));
        else if (value.is_number_float()) CHECK(*v == ckpt::Value(value.get<double>()));
        else CHECK(*v == ckpt::Value(value.get<std::string>()));
    }
    CHECK(got.size() == tensors.size() + expected.at("values").size());
    return got;
}

/// load_torch(FILE) is a FormatError naming the file, whose message holds `fragment`.
void require_refusal(const std::string& file, const std::string& fragment) {
    CAPTURE(file);
    const std::string path = (dir() / file).string();
    try {
        ckpt::load_torch(path);
        FAIL("no error for " << file << "; expected one mentioning: " << fragment);
    } catch (const ckpt::FormatError& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("'" + path + "'") != std::string::npos);
        CHECK(what.find(fragment) != std::string::npos);
        CHECK(e.path() == path);
    }
}

}  // namespace torch_files

TEST_SUITE("torch") {

TEST_CASE("load_torch reads a CNN's state_dict as PyTorch wrote it, in pickle protocols 2 and 4") {
    const auto sd = torch_files::require_as_written("cnn");
    CHECK(sd.size() == 9);
    CHECK(sd.tensor("conv.weight").describe() == "float32[4, 3, 3, 3]");
    CHECK(sd.tensor("bn.num_batches_tracked") == ckpt::Tensor::from(std::vector<std::int64_t>{2}, ckpt::Shape{}));
    CHECK(sd.tensor("fc.weight").describe() == "float32[5, 16]");
    CHECK(torch_files::require_as_written("cnn_protocol4") == sd);
}

TEST_CASE("load_torch flattens a training checkpoint: the model, Adam's state after a step, and counters") {
    const auto got = torch_files::require_as_written("training");
    CHECK(got.get<std::int64_t>("epoch") == 3);
    CHECK(got.get<double>("best_loss") == 0.25);
    CHECK(got.get<std::string>("note") == "größe ünïcode");
    CHECK_FALSE(got.get<bool>("done"));
    CHECK_FALSE(got.contains("scheduler"));  // None
    CHECK(got.tensor("model.bn.num_batches_tracked").dtype() == ckpt::DType::int64);
    // the optimizer's state is keyed by parameter index; its param_groups are a list of dicts
    CHECK(got.tensor("optimizer.state.0.exp_avg").shape() == got.tensor("model.conv.weight").shape());
    CHECK(got.tensor("optimizer.state.5.exp_avg_sq").shape() == got.tensor("model.fc.bias").shape());
    CHECK(got.get<double>("optimizer.param_groups.0.lr") == 0.01);
    CHECK(got.get<double>("optimizer.param_groups.0.betas.1") == 0.999);
    CHECK(got.get<std::int64_t>("optimizer.param_groups.0.params.5") == 5);
    CHECK_FALSE(got.get<bool>("optimizer.param_groups.0.amsgrad"));
    // what load_torch reads is a checkpoint like any other
    test::TempDir tmp;
    ckpt::save_checkpoint(got, tmp / "training.ckpt");
    CHECK(ckpt::load_checkpoint(tmp / "training.ckpt") == got);
}

TEST_CASE("load_torch reads every dtype ckpt holds, 0-d, empty, strided and storage-sharing tensors") {
    const auto got = torch_files::require_as_written("kinds");
    CHECK(got.tensor("f16").dtype() == ckpt::DType::float16);
    CHECK(got.tensor("u8") == ckpt::Tensor::from(std::vector<std::uint8_t>{0, 1, 255}));
    CHECK(got.tensor("scalar_f32") == ckpt::Tensor::from(std::vector<float>{2.5f}, ckpt::Shape{}));
    CHECK(got.tensor("empty").describe() == "float32[2, 0]");
    CHECK(got.tensor("empty_i64").describe() == "int64[0]");
    // matrix = arange(12).reshape(3, 4): its transpose and slices, from the one storage
    CHECK(got.tensor("transposed") ==
          ckpt::Tensor::from(std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, {4, 3}));
    CHECK(got.tensor("row") == ckpt::Tensor::from(std::vector<float>{4, 5, 6, 7}, {4}));
    CHECK(got.tensor("every_other") == ckpt::Tensor::from(std::vector<float>{0, 2, 4, 6, 8, 10}, {3, 2}));
    CHECK(got.tensor("column") == ckpt::Tensor::from(std::vector<float>{2, 6, 10}, {3, 1}));
    // contiguous views share the storage's memory, as they did in PyTorch; the same tensor
    // under two names is one tensor
    CHECK(got.tensor("row").data() == got.tensor("matrix").data() + 4 * sizeof(float));
    CHECK(got.tensor("tied.a").data() == got.tensor("tied.b").data());
    CHECK(got.tensor("param") == ckpt::Tensor::from(std::vector<float>{1, 1, 1, 1}, {2, 2}));
    CHECK(got.get<std::string>("device") == "cuda:1");
    CHECK(got.get<std::int64_t>("nested.list.0") == 1);
    CHECK_FALSE(got.contains("nested.list.3"));  // None
    CHECK(got.get<bool>("nested.list.4"));
    CHECK(got.get<std::string>("nested.5") == "int key");
    CHECK(got.tensor("nested.größe.w").describe() == "float16[1, 1, 1, 1]");
    CHECK(got.tensor("i8") == ckpt::Tensor::from(std::vector<std::int8_t>{-128, 0, 127}));
    CHECK(got.tensor("c64") == ckpt::Tensor::from(std::vector<std::complex<float>>{{1, 2}, {0.5f, -3.5f}}));
    CHECK(got.tensor("c128").describe() == "complex128[1, 1]");
    // bfloat16 (which NumPy, and so the expectations' npz, has no dtype for), by its bits
    const auto bf = ckpt::load_torch(torch_files::dir() / "bfloat16.pt");
    CHECK(bf.tensor("half_brain") == ckpt::Tensor::from(std::vector<ckpt::bfloat16>(3, ckpt::bfloat16(1.0f))));
    CHECK(ckpt::load_torch(torch_files::dir() / "int8.pt").tensor("small") ==
          ckpt::Tensor::from(std::vector<std::int8_t>{1, 1, 1}));
}

TEST_CASE("load_torch refuses other globals, dtypes and files it must not read, naming the file and what") {
    using torch_files::require_refusal;
    // never an object or a function the file names
    require_refusal("user_class.pt", "refers to the Python global '__main__.Model', which ckpt does not load");
    require_refusal("os_system.pt", "refers to the Python global 'posix.system', which ckpt does not load");
    require_refusal("legacy.pt",
                    "is a legacy torch.save file (before PyTorch 1.6); re-save it with torch.save(..., "
                    "_use_new_zipfile_serialization=True)");
    require_refusal("torchscript.pt", "is a TorchScript archive (torch.jit.save)");
    require_refusal("bare_tensor.pt", "it holds a single tensor, not a dict");
    require_refusal("expanded.pt", "tensor 'wide' (float32[100]) has more elements than its storage '0' of 1 elements");
    require_refusal("out_of_range.pt",
                    "tensor 'w' (float32[3], offset 4, strides [1]) reaches past the end of its storage '0' of 6 elements");
    require_refusal("short_storage.pt",
                    "storage '0' (record 'cnn/data/0') holds 428 bytes where its 108 elements of 4 bytes need 432");
    require_refusal("set.pt", "record 'set/data.pkl', byte 17: opcode 0x8f, which torch.save's pickles do not use");

    // a zip cut short, and a file that is no zip at all
    const auto whole = test::read_bytes(torch_files::dir() / "cnn.pt");
    for (const std::size_t keep : {whole.size() - 10, whole.size() / 2, std::size_t{3}}) {
        CAPTURE(keep);
        test::write_bytes(torch_files::dir() / "cut.pt", std::vector<char>(whole.begin(), whole.begin() + static_cast<long>(keep)));
        require_refusal("cut.pt", "it is not a readable zip archive");
    }
    CHECK_THROWS_WITH_AS(ckpt::load_torch(torch_files::dir() / "absent.pt"), doctest::Contains("absent.pt"), ckpt::IoError);

    // a deflated storage record of 4 KiB claiming the 4 MB its persistent id needs: no block of
    // the claimed size before the bytes arrive, and they do not
    test::AllocationWatch watch;
    require_refusal("claims_too_much.pt", "member 'big/data/0' ends 3995904 bytes early");
    watch.stop();
    CHECK(watch.largest_new() < 1'000'000);
    CHECK(watch.largest_mapping() < 1'000'000);
}

TEST_CASE("load_torch refuses damaged and crafted pickles, each a FormatError naming the file") {
    // The pickle of cnn.pt, edited, in a zip of sound records (the fuzzer's torch_pickle mode).
    const auto records = fuzz::torch_records((torch_files::dir() / "cnn.pt").string());
    REQUIRE(records.size() == 10);
    const std::string& pickle = records[0];
    REQUIRE(pickle.size() > 100);
    test::TempDir tmp;
    const std::string path = (tmp / "edited.pt").string();
    auto load_edited = [&](const std::string& edited_pickle) {
        std::vector<std::string> parts = records;
        parts[0] = edited_pickle;
        const std::string input = char(fuzz::torch_pickle) + fuzz::join_torch_records(parts);
        std::ofstream(path, std::ios::binary) << fuzz::file_bytes(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
        return ckpt::load_torch(path);
    };
    // unedited: the harness's file reads as the original
    CHECK(load_edited(pickle) == ckpt::load_torch(torch_files::dir() / "cnn.pt"));
    auto refused = [&](const std::string& edited_pickle, const std::string& fragment) {
        try {
            load_edited(edited_pickle);
            FAIL("no error; expected one mentioning: " << fragment);
        } catch (const ckpt::FormatError& e) {
            INFO(e.what());
            CHECK(std::string(e.what()).find(fragment) != std::string::npos);
            CHECK(e.path() == path);
        }
    };
    refused(pickle.substr(0, pickle.size() / 2), "record 'archive/data.pkl', byte ");
    refused(pickle.substr(0, pickle.size() - 1), "ends without a STOP opcode");
    std::string renamed = pickle;
    renamed.replace(renamed.find("OrderedDict"), 11, "OrderedDixx");
    refused(renamed, "the Python global 'collections.OrderedDixx'");
    std::string no_storage = pickle;
    no_storage.replace(no_storage.find("storage"), 7, "storagf");
    refused(no_storage, "a persistent id that is not ('storage', storage type, key, location, numel)");

    // Python's pickle of containers that hold each other: bounded by depth and by the bytes of
    // names, at once
    using torch_files::require_refusal;
    require_refusal("shared.pt", "its dicts and lists expand to more than");
    require_refusal("looped.pt", "its dicts and lists nest more than 64 deep at 'l.0.0.0.");
    require_refusal("deep.pt", "its dicts and lists nest more than 64 deep at 'k.k.k.");
}

}  // TEST_SUITE
