// ckpt::TorchState: a libtorch module, optimizer, scheduler and generator saved and resumed
// bit-exact by another set of objects, as a new process would; strict and non-strict loads;
// misuse refused with names.
#include <ckpt/types/torch.hpp>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/schedulers/step_lr.h>

#include <doctest/doctest.h>

#include "python_scripts.hpp"
#include "support.hpp"

namespace {

namespace fs = boost::filesystem;

// A small CNN with every kind of state a module has: weights, biases, BatchNorm's running
// statistics and its int64 counter.
struct NetImpl : torch::nn::Module {
    NetImpl() {
        features = register_module("features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)),
                                                                     torch::nn::BatchNorm2d(3)));
        fc = register_module("fc", torch::nn::Linear(3 * 4 * 4, 5));
    }
    torch::Tensor forward(torch::Tensor x) {
        x = torch::relu(features->forward(x));
        return fc->forward(x.flatten(1));
    }
    torch::nn::Sequential features{nullptr};
    torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, Net& net) {
    namespace o = torch::optim;
    if (kind == "SGD") return std::make_unique<o::SGD>(net->parameters(), o::SGDOptions(0.05).momentum(0.9).dampening(0.1));
    if (kind == "Adam") return std::make_unique<o::Adam>(net->parameters(), o::AdamOptions(1e-2).amsgrad(true));
    if (kind == "AdamW") return std::make_unique<o::AdamW>(net->parameters(), o::AdamWOptions(1e-2));
    if (kind == "RMSprop")
        return std::make_unique<o::RMSprop>(net->parameters(), o::RMSpropOptions(1e-2).momentum(0.5).centered(true));
    return std::make_unique<o::Adagrad>(net->parameters(), o::AdagradOptions(0.1));
}

// One training step on random data drawn from the default generator.
void train_step(Net& net, torch::optim::Optimizer& opt) {
    const auto x = torch::randn({4, 1, 6, 6});
    const auto y = torch::randint(0, 5, {4});
    opt.zero_grad();
    torch::nll_loss(torch::log_softmax(net->forward(x), 1), y).backward();
    opt.step();
}

std::vector<torch::Tensor> params_of(Net& net) {
    std::vector<torch::Tensor> out;
    for (const auto& t : net->parameters()) out.push_back(t.detach().clone());
    for (const auto& t : net->buffers()) out.push_back(t.detach().clone());
    return out;
}

bool bit_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!a[i].sizes().equals(b[i].sizes()) ||
            std::memcmp(a[i].data_ptr(), b[i].data_ptr(), a[i].numel() * a[i].element_size()) != 0)
            return false;
    return true;
}

/// The message of the E that `f` throws (fails the test if it throws nothing or another type).
template <class E, class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("expected an exception");
    return {};
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

/// The notices and infos logged that contain `part`.
std::vector<std::string> logged(const test::LogCapture& log, std::string_view part) {
    std::vector<std::string> out;
    for (const auto& m : log.infos)
        if (contains(m, part)) out.push_back(m);
    return out;
}

// A scheduler of a program's own: the learning rate grows to the optimizer's over 4 steps,
// from its step count alone.
struct Warmup : torch::optim::LRScheduler {
    explicit Warmup(torch::optim::Optimizer& o) : LRScheduler(o) {}
    std::vector<double> get_lrs() override {
        auto lrs = get_current_lrs();
        if (step_count_ < 4)
            for (auto& lr : lrs) lr = lr * (step_count_ + 2) / (step_count_ + 1);
        return lrs;
    }
};

double lr_of(torch::optim::Optimizer& o) { return o.param_groups()[0].options().get_lr(); }

}  // namespace

TEST_CASE("TorchState names a module's parameters and buffers as PyTorch does, and loads into them in place") {
    test::TempDir dir;
    torch::manual_seed(1);
    Net a;
    ckpt::TorchState sa(a, {.generator = false});
    const auto dict = sa.state_dict();
    std::vector<std::string> names;
    for (const auto& [name, value] : dict) names.push_back(name);
    CHECK(names == std::vector<std::string>{"model.features.0.weight", "model.features.0.bias", "model.features.1.weight",
                                            "model.features.1.bias", "model.fc.weight", "model.fc.bias",
                                            "model.features.1.running_mean", "model.features.1.running_var",
                                            "model.features.1.num_batches_tracked"});
    CHECK(dict.at("model.features.1.num_batches_tracked").type_name() == "int64[]");
    // views: the dict's bytes are the module's
    CHECK(dict.at("model.fc.weight").get_if<ckpt::Tensor>()->data() ==
          static_cast<std::byte*>(a->fc->weight.data_ptr()));
    const auto file = dir / "m.ckpt";
    ckpt::save_checkpoint(dict, file);

    torch::manual_seed(2);
    Net b;
    const auto b_weight = b->fc->weight.data_ptr();
    ckpt::TorchState sb(b, {.generator = false});
    const auto report = ckpt::load_checkpoint_into(file, sb, /*strict=*/true);
    CHECK(report.complete());
    CHECK(bit_equal(params_of(a), params_of(b)));
    CHECK(b->fc->weight.data_ptr() == b_weight);  // loaded into the module's own tensor
}

TEST_CASE("TorchState saves and loads modules of every floating dtype libtorch trains in, bit-exact") {
    test::TempDir dir;
    for (const auto dtype : {torch::kFloat64, torch::kFloat16}) {
        CAPTURE(c10::toString(dtype));
        torch::manual_seed(4);
        Net a;
        a->to(dtype);
        ckpt::TorchState sa(a, {.generator = false});
        const auto file = dir / "typed.ckpt";
        ckpt::save_checkpoint(sa.state_dict(), file);
        CHECK(ckpt::read_contents(file).entries.front().dtype ==
              (dtype == torch::kFloat64 ? ckpt::DType::float64 : ckpt::DType::float16));
        torch::manual_seed(5);
        Net b;
        b->to(dtype);
        ckpt::TorchState sb(b, {.generator = false});
        CHECK(ckpt::load_checkpoint_into(file, sb, true).complete());
        CHECK(bit_equal(params_of(a), params_of(b)));
        Net wrong;  // float32: each tensor is named as a mismatch
        ckpt::TorchState sw(wrong, {.generator = false});
        CHECK(contains(message_of<ckpt::LoadMismatch>([&] { ckpt::load_checkpoint_into(file, sw, true); }),
                       "'model.fc.weight': checkpoint has " +
                           std::string(dtype == torch::kFloat64 ? "float64" : "float16") +
                           "[5, 48], target has float32[5, 48]"));
    }
}

TEST_CASE("TorchState resumes every supported optimizer bit-exact in fresh objects") {
    for (const std::string kind : {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad"}) {
        CAPTURE(kind);
        test::TempDir dir;
        torch::manual_seed(7);
        Net a;
        auto opt_a = make_optimizer(kind, a);
        torch::optim::StepLR sched_a(*opt_a, 2, 0.5);
        for (int i = 0; i < 3; ++i) {
            train_step(a, *opt_a);
            sched_a.step();
        }
        ckpt::TorchState sa(a, *opt_a);
        sa.scheduler(sched_a);
        const auto file = dir / "s.ckpt";
        ckpt::save_checkpoint(sa.state_dict(), file);
        for (int i = 0; i < 3; ++i) {  // the uninterrupted run
            train_step(a, *opt_a);
            sched_a.step();
        }

        torch::manual_seed(99);  // another process: other weights, other generator, no optimizer state
        Net b;
        auto opt_b = make_optimizer(kind, b);
        torch::optim::StepLR sched_b(*opt_b, 2, 0.5);
        ckpt::TorchState sb(b, *opt_b);
        sb.scheduler(sched_b);
        const auto report = ckpt::load_checkpoint_into(file, sb, /*strict=*/true);
        CHECK(report.complete());
        CHECK(opt_b->state().size() == opt_a->state().size());
        for (int i = 0; i < 3; ++i) {
            train_step(b, *opt_b);
            sched_b.step();
        }
        CHECK(bit_equal(params_of(a), params_of(b)));
        CHECK(opt_b->param_groups()[0].options().get_lr() == opt_a->param_groups()[0].options().get_lr());
    }
}

TEST_CASE("TorchState restores through a CheckpointManager with async saves, falling back past a damaged file") {
    test::TempDir dir;
    torch::manual_seed(3);
    Net a;
    torch::optim::Adam opt_a(a->parameters(), torch::optim::AdamOptions(1e-2));
    std::int64_t epoch = 0;
    ckpt::TorchState sa(a, opt_a);
    sa.add("epoch", ckpt::view_of(epoch));
    std::vector<torch::Tensor> at_step_2;
    {
        ckpt::ManagerOptions mo;
        mo.async_save = true;
        ckpt::CheckpointManager<ckpt::EverySteps> mgr(dir.path(), "torch", ckpt::EverySteps{1}, ckpt::KeepLast{5},
                                                      ckpt::MindSporeNaming{}, mo);
        for (std::int64_t s = 1; s <= 3; ++s) {
            epoch = s * 10;
            train_step(a, opt_a);
            ckpt::Progress p;
            p.epoch = 1;
            p.step = s;
            p.global_step = s;
            mgr.on_step(p, sa);
            if (s == 2) at_step_2 = params_of(a);
        }
        mgr.wait();
    }
    // the newest file is damaged: the load falls back to step 2, shaping the optimizer again
    const auto files = ckpt::list_checkpoints(dir.path(), "torch");
    REQUIRE(files.size() == 3);
    test::flip_bit(files.back().path, fs::file_size(files.back().path) - 10);

    Net b;
    torch::optim::Adam opt_b(b->parameters(), torch::optim::AdamOptions(1e-2));
    std::int64_t epoch_b = -1;
    ckpt::TorchState sb(b, opt_b);
    sb.add("epoch", ckpt::view_of(epoch_b));
    ckpt::CheckpointManager<ckpt::EverySteps> mgr(dir.path(), "torch", ckpt::EverySteps{1});
    std::vector<ckpt::SkippedCheckpoint> skipped;
    const auto restored = mgr.restore(sb, true, &skipped);
    REQUIRE(restored);
    CHECK(restored->file.path == files[1].path);
    CHECK(skipped.size() == 1);
    CHECK(epoch_b == 20);
    CHECK(bit_equal(params_of(b), at_step_2));
    const auto* st = dynamic_cast<torch::optim::AdamParamState*>(opt_b.state().begin()->second.get());
    REQUIRE(st);
    CHECK(st->step() == 2);
}

TEST_CASE("TorchState restores the CPU generator, so a resumed run draws the same numbers") {
    test::TempDir dir;
    Net net;
    ckpt::TorchState s(net);
    torch::manual_seed(11);
    (void)torch::rand({5});
    const auto file = dir / "g.ckpt";
    ckpt::save_checkpoint(s.state_dict(), file);
    const auto expected = torch::rand({8});
    torch::manual_seed(12345);
    ckpt::load_checkpoint_into(file, s, true);
    CHECK(torch::equal(torch::rand({8}), expected));
}

TEST_CASE("TorchState loads: strict names what does not fit, non-strict reports it, another optimizer kind is refused") {
    test::TempDir dir;
    Net a;
    torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    train_step(a, opt_a);
    const auto file = dir / "s.ckpt";
    ckpt::TorchState sa(a, opt_a, {.generator = false});
    ckpt::save_checkpoint(sa.state_dict(), file);

    // a module with one more layer
    struct Wider : torch::nn::Module {
        Wider() {
            register_module("features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)),
                                                              torch::nn::BatchNorm2d(3)));
            register_module("fc", torch::nn::Linear(3 * 4 * 4, 5));
            register_module("head", torch::nn::Linear(5, 2));
        }
    } wider;
    ckpt::TorchState sw(wider, {.generator = false});
    const auto e = message_of<ckpt::LoadMismatch>([&] { ckpt::load_checkpoint_into(file, sw, true); });
    CHECK(contains(e, "'model.head.weight'"));
    CHECK(contains(e, "'model.head.bias'"));
    const auto report = ckpt::load_checkpoint_into(file, sw, false);
    CHECK(report.param_not_load == std::vector<std::string>{"model.head.weight", "model.head.bias"});
    CHECK(report.rest.contains("optimizer.kind"));

    Net b;
    torch::optim::Adam opt_b(b->parameters());
    ckpt::TorchState sb(b, opt_b, {.generator = false});
    const auto other = message_of<ckpt::LoadMismatch>([&] { ckpt::load_checkpoint_into(file, sb, true); });
    CHECK(contains(other, "holds the state of optimizer SGD; this one is Adam"));
    CHECK(contains(other, "loading '" + file.string() + "': "));  // TorchState does not know the file; the load names it
}

TEST_CASE("TorchState refuses tensors it cannot view and parameters it cannot name, naming them") {
    Net net;
    {
        torch::NoGradGuard no_grad;
        net->fc->weight.set_data(net->fc->weight.t().contiguous().t());  // same values, transposed strides
    }
    ckpt::TorchState s(net);
    CHECK(contains(message_of<ckpt::ConfigError>([&] { (void)s.state_dict(); }),
                         "'model.fc.weight' is not contiguous"));

    // bfloat16 parameters are held as they are (so are float16 and int8 ones)
    Net half, other_half;
    half->to(torch::kBFloat16);
    other_half->to(torch::kBFloat16);
    test::TempDir dir;
    ckpt::save_checkpoint(ckpt::TorchState(half).state_dict(), dir / "bf16.ckpt");
    ckpt::TorchState into(other_half);
    CHECK(ckpt::load_checkpoint_into(dir / "bf16.ckpt", into, true).complete());
    CHECK(torch::equal(half->fc->weight, other_half->fc->weight));
    CHECK(ckpt::load_checkpoint(dir / "bf16.ckpt").tensor("model.fc.weight").dtype() == ckpt::DType::bfloat16);

    Net lbfgs_net;
    torch::optim::LBFGS lbfgs(lbfgs_net->parameters());
    CHECK(contains(message_of<ckpt::ConfigError>([&] { ckpt::TorchState bad(lbfgs_net, lbfgs); }),
                   "saves the state of SGD, Adam, AdamW, RMSprop and Adagrad; this optimizer is another kind"));

    Net other;
    auto stray = torch::zeros({2, 2}, torch::requires_grad());
    torch::optim::SGD opt({stray}, torch::optim::SGDOptions(0.1));
    CHECK(contains(message_of<ckpt::ConfigError>([&] { ckpt::TorchState bad(other, opt); }),
                         "parameter 0 of the optimizer's param group 0 (shape [2, 2]) is not a parameter of the module"));
}

TEST_CASE("TorchState takes a module by shared_ptr and keeps it alive, and torch tensors of your own by add()") {
    test::TempDir dir;
    const auto file = dir / "s.ckpt";
    auto permutation = torch::randperm(10);
    {
        auto net = std::make_shared<NetImpl>();
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        ckpt::TorchState state(net, opt);
        net.reset();  // the state holds the module now
        state.add("sampler.permutation", permutation);
        ckpt::save_checkpoint(state.state_dict(), file);
    }
    auto other = std::make_shared<NetImpl>();
    auto restored = torch::zeros({10}, torch::kLong);
    ckpt::TorchState into(other);
    into.add("sampler.permutation", restored);
    CHECK(ckpt::load_checkpoint_into(file, into, false).complete() == false);  // the file also holds SGD's state
    CHECK(torch::equal(restored, permutation));
    // a tensor it cannot view is refused when it is added, naming it
    CHECK(contains(message_of<ckpt::ConfigError>([&] { into.add("t", torch::zeros({3, 3}).t()); }),
                   "'t' is not contiguous"));
    // and a module holding a dtype ckpt does not store, when the state is built
    auto quantized = std::make_shared<torch::nn::Module>();
    quantized->register_buffer("q", torch::quantize_per_tensor(torch::zeros({2}), 0.1, 0, torch::kQUInt8));
    CHECK(contains(message_of<ckpt::ConfigError>([&] { ckpt::TorchState bad(quantized); }),
                   "torch tensor 'model.q' has dtype QUInt8, which ckpt does not store"));
}

TEST_CASE("TorchState saves a StepLR whole, and a scheduler it does not know only when told its state is its step count") {
    test::TempDir dir;
    test::LogCapture log;
    torch::manual_seed(1);
    Net a;
    torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::StepLR step_lr(opt_a, 3, 0.5);
    for (int i = 0; i < 4; ++i) step_lr.step();
    ckpt::TorchState sa(a, opt_a, {.generator = false});
    sa.scheduler(step_lr);
    const auto d = sa.state_dict();
    CHECK(d.get<std::string>("scheduler.kind") == "StepLR");
    CHECK(d.get<std::string>("scheduler.convention") == "libtorch");
    CHECK(d.get<std::int64_t>("scheduler.last_epoch") == 4);
    CHECK(d.get<std::int64_t>("scheduler.step_size") == 3);
    CHECK(d.get<double>("scheduler.gamma") == 0.5);
    const auto step_file = dir / "step.ckpt";
    ckpt::save_checkpoint(d, step_file);

    // a StepLR of other settings takes the position; what it cannot take is said
    Net b;
    torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::StepLR other(opt_b, 5, 0.1);
    ckpt::TorchState sb(b, opt_b, {.generator = false});
    sb.scheduler(other);
    CHECK(ckpt::load_checkpoint_into(step_file, sb, true).complete());
    CHECK(ckpt::detail::torch_glue::SchedulerAccess::step_count(other) == 4);
    CHECK(logged(log, "the checkpoint's StepLR had step_size 3 and gamma 0.5; this one's, step_size 5 and gamma 0.1, "
                      "stay").size() == 1);

    Warmup warmup(opt_b);
    ckpt::TorchState sw(b, opt_b, {.generator = false});
    const auto refused = message_of<ckpt::ConfigError>([&] { sw.scheduler(warmup); });
    CHECK(contains(refused, "this scheduler is a (anonymous namespace)::Warmup"));
    CHECK(contains(refused, "ckpt::SchedulerState::step_count_only"));
    for (int i = 0; i < 2; ++i) warmup.step();
    sw.scheduler(warmup, ckpt::SchedulerState::step_count_only);
    const auto warmup_file = dir / "warmup.ckpt";
    ckpt::save_checkpoint(sw.state_dict(), warmup_file);
    CHECK(ckpt::read_contents(warmup_file).entries.size() > 0);

    Net c;
    torch::optim::SGD opt_c(c->parameters(), torch::optim::SGDOptions(0.1));
    Warmup warmup_c(opt_c);
    ckpt::TorchState sc(c, opt_c, {.generator = false});
    sc.scheduler(warmup_c, ckpt::SchedulerState::step_count_only);
    CHECK(ckpt::load_checkpoint_into(warmup_file, sc, true).complete());
    for (int i = 0; i < 3; ++i) {  // the same schedule from here on
        warmup.step();
        warmup_c.step();
        CHECK(lr_of(opt_c) == lr_of(opt_b));
    }
    // another kind of scheduler is refused, both named
    CHECK(contains(message_of<ckpt::LoadMismatch>([&] { ckpt::load_checkpoint_into(warmup_file, sa, true); }),
                   "holds the state of a (anonymous namespace)::Warmup scheduler; this one is StepLR"));

    // a file from before schedulers were saved whole: its position, with a notice
    ckpt::ParamDict old = ckpt::torch_state_dict(*a, "model.");
    old.set("scheduler.step_count", std::int64_t{7});
    const auto old_file = dir / "old.ckpt";
    ckpt::save_checkpoint(old, old_file);
    Net e;
    torch::optim::SGD opt_e(e->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::StepLR step_e(opt_e, 3, 0.5);
    ckpt::TorchState se(e, {.generator = false});
    se.scheduler(step_e);
    CHECK(ckpt::load_checkpoint_into(old_file, se, true).complete());
    CHECK(ckpt::detail::torch_glue::SchedulerAccess::step_count(step_e) == 7);
    CHECK(logged(log, "records only the scheduler's position (scheduler.step_count").size() == 1);
}

TEST_CASE("A StepLR schedule carried between libtorch and PyTorch at a boundary goes on as the continuing side's own") {
    // libtorch's StepLR lowers the rate at calls 4, 7, 10 (step_size 3), PyTorch's at 3, 6, 9:
    // after 6 calls the two differ by gamma
    test::TempDir dir;
    struct Run {
        torch::nn::Linear net{2, 2};
        torch::optim::SGD opt{net->parameters(), torch::optim::SGDOptions(0.1)};
        torch::optim::StepLR sched{opt, 3, 0.5};
        ckpt::TorchState state{net, opt, {.generator = false}};
        Run() { state.scheduler(sched); }
        std::vector<double> schedule(int calls) {
            std::vector<double> lrs;
            for (int i = 0; i < calls; ++i) {
                opt.step();
                sched.step();
                lrs.push_back(lr_of(opt));
            }
            return lrs;
        }
    };
    const auto unbroken = Run().schedule(12);
    CHECK(unbroken[5] == 0.05);
    Run first;
    first.schedule(6);
    ckpt::save_checkpoint(first.state.state_dict(), dir / "cpp.ckpt");
    // PyTorch goes on from it as an unbroken PyTorch run, and writes its own state after 6 calls
    test::run_python("torch_step_lr.py", dir.path());

    test::LogCapture log;
    Run second;
    CHECK(ckpt::load_checkpoint_into(dir / "py.ckpt", second.state, true).complete());
    CHECK(lr_of(second.opt) == unbroken[5]);  // PyTorch's 0.025, taken back to libtorch's 0.05
    CHECK(second.schedule(6) == std::vector<double>(unbroken.begin() + 6, unbroken.end()));
    CHECK(logged(log, "the checkpoint's StepLR was stepped by PyTorch").size() == 1);
}

TEST_CASE("A restore says once which optimizer options it replaced, with their old and new values") {
    test::TempDir dir;
    torch::manual_seed(5);
    auto make = [](Net& net, double lr, double momentum) {
        return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
    };
    Net a;
    auto opt_a = make(a, 0.1, 0.9);
    torch::optim::StepLR sched_a(opt_a, 2, 0.5);
    for (int i = 0; i < 5; ++i) {
        train_step(a, opt_a);
        sched_a.step();
    }
    CHECK(lr_of(opt_a) == 0.025);
    ckpt::TorchState sa(a, opt_a, {.generator = false});
    sa.scheduler(sched_a);
    const auto file = dir / "s.ckpt";
    ckpt::save_checkpoint(sa.state_dict(), file);

    {  // the same settings: the learning rate the schedule reached is no news
        test::LogCapture log;
        Net b;
        auto opt_b = make(b, 0.1, 0.9);
        torch::optim::StepLR sched_b(opt_b, 2, 0.5);
        ckpt::TorchState sb(b, opt_b, {.generator = false});
        sb.scheduler(sched_b);
        ckpt::load_checkpoint_into(file, sb, true);
        CHECK(lr_of(opt_b) == 0.025);
        CHECK(logged(log, "optimizer options").empty());
    }
    {  // a new learning rate and momentum: both named, once
        test::LogCapture log;
        Net b;
        auto opt_b = make(b, 0.2, 0.8);
        torch::optim::StepLR sched_b(opt_b, 2, 0.5);
        ckpt::TorchState sb(b, opt_b, {.generator = false});
        sb.scheduler(sched_b);
        ckpt::load_checkpoint_into(file, sb, true);
        const auto said = logged(log, "optimizer options");
        REQUIRE(said.size() == 1);
        CHECK(contains(said[0], "param group 0's lr 0.2 -> 0.025"));
        CHECK(contains(said[0], "param group 0's momentum 0.8 -> 0.9"));
        CHECK(contains(said[0], "set them after restore()"));
        CHECK(lr_of(opt_b) == 0.025);
        opt_b.param_groups()[0].options().set_lr(0.2);  // set after the restore, it stays
        train_step(b, opt_b);
        CHECK(lr_of(opt_b) == 0.2);
    }
}

TEST_CASE("TorchState records the data position: epoch and step come back, another batch size or seed is refused") {
    test::TempDir dir;
    torch::manual_seed(6);
    Net a;
    ckpt::DataPosition at{.seed = 7, .batch_size = 32, .epoch = 3, .step = 11};
    ckpt::TorchState sa(a, {.generator = false});
    sa.data_position(at);
    const auto file = dir / "d.ckpt";
    ckpt::save_checkpoint(sa.state_dict(), file);

    Net b;
    ckpt::DataPosition here{.seed = 7, .batch_size = 32};
    ckpt::TorchState sb(b, {.generator = false});
    sb.data_position(here);
    CHECK(ckpt::load_checkpoint_into(file, sb, true).complete());
    CHECK(here.epoch == 3);
    CHECK(here.step == 11);

    for (const auto& [other, expected] :
         {std::pair{ckpt::DataPosition{.seed = 7, .batch_size = 64}, "batch size 32 when saved, 64 now"},
          std::pair{ckpt::DataPosition{.seed = 8, .batch_size = 32}, "seed 7 when saved, 8 now"}}) {
        const std::string said = expected;  // clang 14 captures no binding
        CAPTURE(said);
        Net c;
        const auto before = params_of(c);
        auto position = other;
        ckpt::TorchState sc(c, {.generator = false});
        sc.data_position(position);
        const auto e = message_of<ckpt::LoadMismatch>([&] { ckpt::load_checkpoint_into(file, sc, false); });
        CHECK(contains(e, expected));
        CHECK(contains(e, "would train on other samples"));
        CHECK(bit_equal(params_of(c), before));  // refused before anything was read into the model
        CHECK(position.epoch == 0);
    }
}

TEST_CASE("A model that gained and lost layers warm-starts with its optimizer in a non-strict load, and a strict load names the tensors") {
    test::TempDir dir;
    torch::manual_seed(8);
    Net a;
    torch::optim::Adam opt_a(a->parameters(), torch::optim::AdamOptions(1e-2));
    train_step(a, opt_a);
    train_step(a, opt_a);
    ckpt::TorchState sa(a, opt_a, {.generator = false});
    const auto file = dir / "a.ckpt";
    ckpt::save_checkpoint(sa.state_dict(), file);

    // the BatchNorm gone, a layer on top
    struct Grown : torch::nn::Module {
        Grown() {
            features = register_module("features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3))));
            fc = register_module("fc", torch::nn::Linear(3 * 4 * 4, 5));
            head = register_module("head", torch::nn::Linear(5, 2));
        }
        torch::Tensor forward(torch::Tensor x) {
            return head->forward(fc->forward(torch::relu(features->forward(x)).flatten(1)));
        }
        torch::nn::Sequential features{nullptr};
        torch::nn::Linear fc{nullptr}, head{nullptr};
    } grown;
    torch::optim::Adam opt_g(grown.parameters(), torch::optim::AdamOptions(1e-2));
    ckpt::TorchState sg(grown, opt_g, {.generator = false});

    const auto strict = message_of<ckpt::LoadMismatch>([&] { ckpt::load_checkpoint_into(file, sg, true); });
    for (const char* name : {"'model.head.weight'", "'optimizer.state.head.weight'", "'model.features.1.weight'",
                             "'optimizer.state.features.1.weight.exp_avg'"})
        CHECK(contains(strict, name));
    CHECK(!contains(strict, "param group"));
    CHECK(opt_g.state().empty());

    test::LogCapture log;
    const auto report = ckpt::load_checkpoint_into(file, sg, false);
    for (const char* name : {"model.head.weight", "optimizer.state.head.weight", "optimizer.state.head.bias"})
        CHECK(std::find(report.param_not_load.begin(), report.param_not_load.end(), name) != report.param_not_load.end());
    CHECK(std::find(report.ckpt_not_load.begin(), report.ckpt_not_load.end(),
                    "optimizer.state.features.1.weight.exp_avg") != report.ckpt_not_load.end());
    const auto said = logged(log, "the optimizer's state was loaded for the parameters");
    REQUIRE(said.size() == 1);
    CHECK(contains(said[0], "none for 'head.weight', 'head.bias' (not in the checkpoint's optimizer)"));
    CHECK(contains(said[0], "the checkpoint's state of 'features.1.bias', 'features.1.weight' was left out"));

    // the shared parameters have their state, bit for bit; the new ones none
    CHECK(opt_g.state().size() == 4);
    for (const auto& [from, to] : {std::pair{a->fc->weight, grown.fc->weight}, std::pair{a->fc->bias, grown.fc->bias}}) {
        const auto& s_a = static_cast<torch::optim::AdamParamState&>(*opt_a.state().at(ckpt::detail::torch_glue::state_key(from)));
        const auto& s_g = static_cast<torch::optim::AdamParamState&>(*opt_g.state().at(ckpt::detail::torch_glue::state_key(to)));
        CHECK(s_g.step() == 2);
        CHECK(torch::equal(s_g.exp_avg(), s_a.exp_avg()));
        CHECK(torch::equal(to, from));
    }
    CHECK(opt_g.state().count(ckpt::detail::torch_glue::state_key(grown.head->weight)) == 0);
    opt_g.zero_grad();  // and it trains on, the new layer's state made at its first step
    grown.forward(torch::randn({4, 1, 6, 6})).pow(2).mean().backward();
    opt_g.step();
    CHECK(opt_g.state().size() == 6);
}
