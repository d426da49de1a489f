#pragma once
// RedisStore: the Store interface over a Redis server (Debian redis-server), for ranks on
// several hosts. Needs hiredis (Debian libhiredis-dev; link -lhiredis, or ckpt::gloo).
//
//   fault::RedisStore store("10.0.0.5", 6379);
//
// A server that goes away (restarted, with or without persistence) is not the end: every
// call reconnects and retries until its timeout, then throws StoreError naming the server.
// What a server without persistence lost, the callers set again (membership re-registers).

#include <sys/time.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "store.hpp"

namespace fault {

/// A Store on a Redis server, for ranks on several hosts: every call reconnects and retries until
/// its timeout, so a restarted server is not the end.
class RedisStore final : public Store {
public:
    /// Connects (retrying until `timeout`): StoreError if the server cannot be reached.
    RedisStore(std::string host, int port, std::chrono::milliseconds timeout = std::chrono::seconds(30))
        : host_(std::move(host)), port_(port), timeout_(timeout) {
        if (port < 1 || port > 65535) throw ckpt::ConfigError("redis store: port " + std::to_string(port) + " is not a TCP port");
        std::lock_guard lock(m_);
        const char* argv[] = {"PING"};
        const std::size_t len[] = {4};
        run("connect", [](redisReply*) {}, "", 1, argv, len);
    }

    void set(const std::string& key, std::string_view value) override {
        std::lock_guard lock(m_);
        const char* argv[] = {"SET", key.data(), value.data()};
        const std::size_t len[] = {3, key.size(), value.size()};
        run("set", [](redisReply*) {}, key, 3, argv, len);
    }
    std::optional<std::string> get(const std::string& key) override {
        std::lock_guard lock(m_);
        std::optional<std::string> out;
        const char* argv[] = {"GET", key.data()};
        const std::size_t len[] = {3, key.size()};
        run("get", [&](redisReply* r) {
            if (r->type == REDIS_REPLY_STRING) out = std::string(r->str, r->len);
        }, key, 2, argv, len);
        return out;
    }
    bool create(const std::string& key, std::string_view value) override {
        std::lock_guard lock(m_);
        bool created = false;
        const char* argv[] = {"SET", key.data(), value.data(), "NX"};
        const std::size_t len[] = {3, key.size(), value.size(), 2};
        run("create", [&](redisReply* r) { created = r->type == REDIS_REPLY_STATUS; }, key, 4, argv, len);
        return created;
    }
    std::int64_t add(const std::string& key, std::int64_t delta) override {
        std::lock_guard lock(m_);
        std::int64_t value = 0;
        const std::string d = std::to_string(delta);
        const char* argv[] = {"INCRBY", key.data(), d.data()};
        const std::size_t len[] = {6, key.size(), d.size()};
        run("add", [&](redisReply* r) { value = r->integer; }, key, 3, argv, len);
        return value;
    }
    void erase(const std::string& key) override {
        std::lock_guard lock(m_);
        const char* argv[] = {"DEL", key.data()};
        const std::size_t len[] = {3, key.size()};
        run("erase", [](redisReply*) {}, key, 2, argv, len);
    }
    std::string url() const override { return "redis://" + host_ + ":" + std::to_string(port_); }

private:
    struct FreeContext {
        void operator()(redisContext* c) const { redisFree(c); }
    };
    struct FreeReply {
        void operator()(redisReply* r) const { freeReplyObject(r); }
    };

    // Runs one command, reconnecting and retrying on connection errors until the timeout; a
    // reply that is an error (a wrong type, say) is not retried.
    template <class OnReply>
    void run(const char* op, OnReply&& on_reply, const std::string& key, int argc, const char** argv, const std::size_t* len) {
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        auto pause = std::chrono::milliseconds(10);
        std::string last_error;
        for (;;) {
            if (!ctx_) connect(deadline);
            if (ctx_) {
                std::unique_ptr<redisReply, FreeReply> reply(
                    static_cast<redisReply*>(redisCommandArgv(ctx_.get(), argc, argv, len)));
                if (reply) {
                    if (reply->type == REDIS_REPLY_ERROR)
                        throw StoreError(url() + ": " + op + " of key '" + key + "': " + std::string(reply->str, reply->len));
                    on_reply(reply.get());
                    return;
                }
                last_error = ctx_->errstr;
                ctx_.reset();  // the connection is unusable after an I/O error
            } else {
                last_error = connect_error_;
            }
            if (std::chrono::steady_clock::now() + pause >= deadline)
                throw StoreError(url() + ": " + op + " of key '" + key + "' failed for " + std::to_string(timeout_.count()) +
                                 " ms: " + last_error);
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::milliseconds(500));
        }
    }
    void connect(std::chrono::steady_clock::time_point deadline) {
        const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
        const auto wait = std::max(std::min(left, std::chrono::microseconds(std::chrono::seconds(2))), std::chrono::microseconds(1000));
        timeval tv{static_cast<time_t>(wait.count() / 1000000), static_cast<suseconds_t>(wait.count() % 1000000)};
        std::unique_ptr<redisContext, FreeContext> c(redisConnectWithTimeout(host_.c_str(), port_, tv));
        if (!c || c->err) {
            connect_error_ = c ? c->errstr : "cannot allocate a connection";
            return;
        }
        // each command waits at most this long for its reply, then counts as a lost connection
        const auto per_call = std::chrono::duration_cast<std::chrono::microseconds>(timeout_);
        timeval call_tv{static_cast<time_t>(per_call.count() / 1000000), static_cast<suseconds_t>(per_call.count() % 1000000)};
        redisSetTimeout(c.get(), call_tv);
        redisEnableKeepAlive(c.get());
        ctx_ = std::move(c);
    }

    std::string host_;
    int port_;
    std::chrono::milliseconds timeout_;
    std::mutex m_;  // one connection, one command at a time
    std::unique_ptr<redisContext, FreeContext> ctx_;
    std::string connect_error_;
};

}  // namespace fault
