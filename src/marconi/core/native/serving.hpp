// The serving replay's step loop in the compiled core (docs/architecture.md, "Replay
// protocols"): `marconi.core.serving._Server` and the simulator's served bounds
// (`sim.replay._ServedBounds`, `sim.bounds.SeenTree`), event for event and float for float,
// for a cache the compiled core runs; what lives in Python (a record, a tuner, a commit
// callback, a structured admission's positions per request) is told or asked through the
// caller's hook (`Notify`) at the Python loop's places.
// The Python loop stays the reference: tests/test_serving_native.py replays both.

#pragma once

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "tree_core.hpp"

namespace marconi {

// `sim.bounds.SeenTree`: every committed sequence in a radix tree, each node with the
// longest input of the sequences through it. Edges are spans of one token arena; a split
// cuts a span in two, copying nothing.
class SeenTree {
    struct Node {
        i64 start, len;  // edge: arena_[start, start + len)
        int parent;
        i64 input_depth;
    };
    std::vector<i32> arena_;
    std::vector<Node> nodes_{Node{0, 0, -1, 0}};  // 0: the root
    std::unordered_map<uint64_t, int> children_;  // (parent, first token) -> child
    std::vector<int> path_;
    int partial_ = -1;
    i64 offset_ = 0, length_ = 0;

    static uint64_t key(int parent, i32 first) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) |
               static_cast<uint32_t>(first);
    }

    // `RadixTree.match`: `path_` the fully matched nodes, `partial_` the node whose edge
    // the tokens leave or end inside (after `offset_` of its tokens), `length_` matched
    void match(const i32* t, i64 n) {
        path_.clear();
        partial_ = -1;
        offset_ = 0;
        int node = 0;
        i64 pos = 0;
        while (pos < n) {
            auto it = children_.find(key(node, t[pos]));
            if (it == children_.end()) break;
            int child = it->second;
            const Node& c = nodes_[child];
            i64 m = std::min(c.len, n - pos), k = 0;
            const i32* edge = arena_.data() + c.start;
            while (k < m && edge[k] == t[pos + k]) ++k;
            if (k == c.len) {
                path_.push_back(child);
                node = child;
                pos += c.len;
                continue;
            }
            partial_ = child;
            offset_ = k;
            length_ = pos + k;
            return;
        }
        length_ = pos;
    }

  public:
    i64 tokens = 0;  // distinct tokens held

    // (longest prefix seen, of it the part seen within an earlier input)
    std::pair<i64, i64> lookup(const i32* t, i64 n) {
        match(t, n);
        int last = partial_ >= 0 ? partial_ : (path_.empty() ? -1 : path_.back());
        if (last < 0) return {0, 0};
        return {length_, std::min(length_, nodes_[last].input_depth)};
    }

    void commit(const i32* t, i64 n, i64 n_input) {
        match(t, n);
        int matched = path_.empty() ? -1 : path_.back();
        int parent = matched >= 0 ? matched : 0;
        if (partial_ >= 0 && length_ < n) {  // `RadixTree.split(partial, offset)`
            Node& tail = nodes_[partial_];
            int head = static_cast<int>(nodes_.size());
            Node h{tail.start, offset_, tail.parent, tail.input_depth};
            children_[key(tail.parent, arena_[tail.start])] = head;
            tail.start += offset_;
            tail.len -= offset_;
            tail.parent = head;
            children_[key(head, arena_[tail.start])] = partial_;
            nodes_.push_back(h);
            parent = head;
        }
        if (parent != matched) path_.push_back(parent);
        if (partial_ >= 0 && length_ == n) path_.push_back(partial_);
        if (length_ < n) {  // `RadixTree.insert(parent, rest)`
            int leaf = static_cast<int>(nodes_.size());
            nodes_.push_back(Node{static_cast<i64>(arena_.size()), n - length_, parent, 0});
            arena_.insert(arena_.end(), t + length_, t + n);
            children_[key(parent, t[length_])] = leaf;
            tokens += n - length_;
            path_.push_back(leaf);
        }
        for (int v : path_) nodes_[v].input_depth = std::max(nodes_[v].input_depth, n_input);
    }
};

// A caller's hook, told of each event in the Python loop's places (`Event`): 0 when it
// went well; else the loop stops (`Told`), the hook having kept its error.
using Notify = int (*)(void* ctx, int kind, i64 i, i64 x);
// bits of `ServeIn::events`. PLACE / PLACE_BOUND: the cache's / the bound's admission is
// handed its positions (`CompiledCache._place`) right before the loop's next lookup or
// commit of request i in it: x is AT_LOOKUP, AT_FINISH (its whole sequence) or the n input
// tokens a show commits.
enum Event { SCHEDULED = 1, SHOWN = 2, FINISHED = 4, PLACE = 8, PLACE_BOUND = 16 };
constexpr i64 AT_LOOKUP = -1, AT_FINISH = -2;
struct Told : std::exception {
    const char* what() const noexcept override { return "the serving loop's hook failed"; }
};

// What the loop reads of the trace and the server (`Serving`, `FlopsLatency`).
struct ServeIn {
    i64 n = 0;  // requests
    std::vector<const i32*> tokens;  // input then output, request by request
    const i64* n_input = nullptr;
    const i64* n_output = nullptr;
    const double* arrival = nullptr;
    const i64* after = nullptr;  // the request each waits for (`dependents`), or -1
    i64 max_running = 1, chunk_tokens = 1;
    double decode_s = 0.0;
    int visibility = 0;  // `Visibility`: 0 finish, 1 chunk, 2 block
    bool hold = true;
    i64 page = 1, kv_per_token = 0;  // the cache's pages (`_page_bytes`)
    Spec latency_spec;  // `FlopsLatency.chunk_seconds`
    double rate = 1.0, overhead_s = 0.0;
    i64 bound_limit = 0;  // `BOUND_TOKENS`: past it the bounds are dropped
    Notify notify = nullptr;  // told of the events `events` names: (i, hit) when request i
    void* ctx = nullptr;      // is scheduled, (i, n) when it made n tokens visible, (i, 0)
    int events = 0;           // when it finished
    Notify interrupted = nullptr;  // asked every `CHECK_EVERY` rounds (kind 0): nonzero
                                   // stops the loop (`Told`), as a Ctrl-C does
};
constexpr i64 CHECK_EVERY = 4096;

// What it writes: per request (`ServingStats`' arrays, the simulator's records), the
// order of the lookups, and the totals.
struct ServeOut {
    i64* hit;
    i64* kv_bytes;
    i64* ssm_bytes;
    i64* bound;
    i64* seen;
    i64* from_inputs;
    double* issued;
    double* scheduled;
    double* first_token;
    double* finished;
    i64* order;  // request index of each lookup kept, in turn
    i64 waited = 0, max_running = 0, unreserved = 0, dropped = -1;
    double makespan = 0.0;
};

// `core.serving.dependents`: the request each waits for (its session's previous turn,
// when its input extends that turn's input and output), or -1; `session` a code per session
inline void dependents(const ServeIn& in, const i64* session, i64* after) {
    std::unordered_map<i64, i64> last;
    for (i64 i = 0; i < in.n; ++i) {
        after[i] = -1;
        auto it = last.find(session[i]);
        if (it != last.end()) {
            i64 j = it->second, n = in.n_input[j] + in.n_output[j];
            if (in.n_input[i] > n &&
                std::memcmp(in.tokens[i], in.tokens[j], static_cast<size_t>(n) * sizeof(i32)) == 0)
                after[i] = j;
        }
        last[session[i]] = i;
    }
}

class Server {
    struct Running {
        i64 i, seq;
        int node;
        i64 hit, done, kv, states, shown;
    };
    struct End {
        i64 step, seq;
        int r;
        bool operator>(const End& o) const {
            return step != o.step ? step > o.step : seq > o.seq;
        }
    };
    using Pending = std::pair<double, i64>;  // (issue time, request)

    const ServeIn& in_;
    ServeOut& out_;
    Core& cache_;
    Core* bound_;
    SeenTree* seen_;
    std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> pending_;
    std::deque<i64> waiting_;
    std::vector<i64> queued_at_, next_of_;
    std::vector<Running> runs_;
    std::vector<int> prefilling_;
    std::priority_queue<End, std::vector<End>, std::greater<End>> ends_;
    std::vector<std::pair<int, i64>> chunks_;
    i64 rounds_ = 0, running_ = 0, steps_ = 0, seq_ = 0, finished_count_ = 0, looked_ = 0;
    bool blocked_ = false;
    double now_ = 0.0;

    void tell(Event kind, i64 i, i64 x) {
        if ((in_.events & kind) && in_.notify(in_.ctx, kind, i, x) != 0) throw Told();
    }

    i64 page_bytes(i64 tokens) const {
        tokens = std::max<i64>(tokens, 0);
        return (tokens + in_.page - 1) / in_.page * in_.page * in_.kv_per_token;
    }

    double chunk_seconds(i64 done, i64 size) const {
        const Spec& s = in_.latency_spec;
        return in_.overhead_s + static_cast<double>(s.flops(done + size) - s.flops(done)) / in_.rate;
    }

  public:
    Server(const ServeIn& in, ServeOut& out, Core& cache, Core* bound, SeenTree* seen)
        : in_(in), out_(out), cache_(cache), bound_(bound), seen_(seen),
          queued_at_(in.n, 0), next_of_(in.n, -1) {
        for (i64 i = 0; i < in.n; ++i) {
            if (in.after[i] >= 0) next_of_[in.after[i]] = i;
            else pending_.push({in.arrival[i], i});
        }
    }

    void run() {
        while (!pending_.empty() || !waiting_.empty() || running_) {
            if (in_.interrupted && rounds_ % CHECK_EVERY == 0 &&
                in_.interrupted(in_.ctx, 0, 0, 0) != 0)
                throw Told();
            issue();
            if (!running_ && waiting_.empty()) {
                now_ = std::max(now_, pending_.top().first);
                continue;
            }
            bool held = schedule();
            out_.max_running = std::max(out_.max_running, running_);
            if (!chunks_.empty()) step();
            else if (!ends_.empty()) decode_until_event(held);
            else throw std::logic_error("serving replay: a request could not be scheduled");
        }
        out_.makespan = now_;
    }

  private:
    void issue() {
        while (!pending_.empty() && pending_.top().first <= now_) {
            auto [t, i] = pending_.top();
            pending_.pop();
            out_.issued[i] = t;
            queued_at_[i] = rounds_;
            waiting_.push_back(i);
        }
    }

    // `_Server._schedule`: this step's chunks into `chunks_`; whether requests wait
    bool schedule() {
        chunks_.clear();
        i64 budget = in_.chunk_tokens - (running_ - static_cast<i64>(prefilling_.size()));
        for (int r : prefilling_) {
            if (budget <= 0) break;
            i64 c = std::min(in_.n_input[runs_[r].i] - runs_[r].done, budget);
            chunks_.push_back({r, c});
            budget -= c;
        }
        while (!waiting_.empty() && budget > 0 && running_ < in_.max_running && !blocked_) {
            int r = start(waiting_.front());
            if (r < 0) {
                blocked_ = true;
                break;
            }
            waiting_.pop_front();
            i64 c = std::min(in_.n_input[runs_[r].i] - runs_[r].done, budget);
            chunks_.push_back({r, c});
            budget -= c;
        }
        rounds_ += 1;
        return !waiting_.empty();
    }

    // `_Server._start`: the run's index in `runs_`, or -1 when it does not fit yet
    int start(i64 i) {
        const i32* t = in_.tokens[i];
        i64 n_in = in_.n_input[i];
        tell(PLACE, i, AT_LOOKUP);
        PlanOut plan = cache_.lookup(t, n_in, false);
        if (plan.node >= 0) cache_.pin(plan.node);
        i64 kv = page_bytes(n_in + in_.n_output[i] - plan.hit), states = 1;
        if (!in_.hold) {
            kv = 0;
            states = 0;
        } else if (!cache_.reserve(kv, states)) {
            if (running_) {
                if (plan.node >= 0) cache_.unpin(plan.node);
                return -1;
            }
            kv = 0;
            states = 0;
            out_.unreserved += 1;
        }
        out_.hit[i] = plan.hit;
        out_.kv_bytes[i] = cache_.stats.kv_bytes;
        out_.ssm_bytes[i] = cache_.stats.ssm_bytes;
        out_.order[looked_++] = i;
        if (bound_ != nullptr) {  // `_ServedBounds.lookup`
            tell(PLACE_BOUND, i, AT_LOOKUP);
            out_.bound[i] = bound_->lookup(t, n_in, false).hit;
            auto [seen, from_inputs] = seen_->lookup(t, n_in);
            out_.seen[i] = seen;
            out_.from_inputs[i] = from_inputs;
        }
        tell(SCHEDULED, i, plan.hit);
        out_.scheduled[i] = now_;
        out_.waited += rounds_ > queued_at_[i];
        int r = static_cast<int>(runs_.size());
        runs_.push_back(Running{i, seq_, plan.node, plan.hit, std::min(plan.hit, n_in - 1), kv,
                                states, plan.hit});
        seq_ += 1;
        running_ += 1;
        prefilling_.push_back(r);
        return r;
    }

    void step() {
        i64 decoding = running_ - static_cast<i64>(prefilling_.size());
        double seconds = 0.0;
        for (auto [r, c] : chunks_) seconds += chunk_seconds(runs_[r].done, c);
        now_ += seconds + (decoding ? in_.decode_s : 0.0);
        steps_ += 1;
        bool prefilled = false;
        for (auto [r, c] : chunks_) {
            Running& run = runs_[r];
            run.done += c;
            if (run.done >= in_.n_input[run.i]) {
                prefilled = true;
                out_.first_token[run.i] = now_;
                ends_.push(End{steps_ + std::max<i64>(in_.n_output[run.i] - 1, 0), run.seq, r});
                if (in_.visibility == 2) show(r);
            } else if (in_.visibility != 0) {
                show(r);
            }
        }
        if (prefilled) {
            std::vector<int> left;
            for (int r : prefilling_)
                if (runs_[r].done < in_.n_input[runs_[r].i]) left.push_back(r);
            prefilling_.swap(left);
        }
        finish_done();
    }

    void decode_until_event(bool held) {
        i64 k = ends_.top().step - steps_;
        if (!held && !pending_.empty() && in_.decode_s > 0)
            k = std::min(k, std::max<i64>(1, static_cast<i64>(std::ceil(
                                                 (pending_.top().first - now_) / in_.decode_s))));
        k = std::max<i64>(k, 1);
        now_ += static_cast<double>(k) * in_.decode_s;
        steps_ += k;
        finish_done();
    }

    // `_Server._show`: the input computed so far made visible
    void show(int r) {
        Running& run = runs_[r];
        i64 n = run.done;
        if (n <= run.shown) return;
        const i32* t = in_.tokens[run.i];
        // the tokens shown and its working state leave the reservation first (`_show`)
        i64 k = std::min(page_bytes(n - run.shown), run.kv), states = run.states;
        cache_.release(k, states);
        tell(PLACE, run.i, n);
        CommitOut c = cache_.commit(t, n, n);
        bool kept = c.end >= 0;
        if (kept) {
            cache_.pin(c.end);
            if (run.node >= 0) cache_.unpin(run.node);
            run.node = c.end;
            run.kv -= k;
            run.shown = n;
            k = 0;
        }
        if ((k || states) && !cache_.reserve(k, states)) {  // held again, or run unheld
            run.kv -= k;
            run.states = 0;
            if (states) out_.unreserved += 1;
        }
        tell(SHOWN, run.i, n);
        bounds_commit(run.i, t, n, n, false);
        if (kept) blocked_ = false;
    }

    void finish_done() {
        while (!ends_.empty() && ends_.top().step <= steps_) {
            int r = ends_.top().r;
            ends_.pop();
            finish(r);
        }
    }

    void finish(int r) {
        Running& run = runs_[r];
        i64 i = run.i;
        running_ -= 1;
        blocked_ = false;
        cache_.release(run.kv, run.states);
        if (run.node >= 0) cache_.unpin(run.node);
        i64 n = in_.n_input[i] + in_.n_output[i];
        tell(PLACE, i, AT_FINISH);
        cache_.commit(in_.tokens[i], n, in_.n_input[i]);
        tell(FINISHED, i, 0);
        bounds_commit(i, in_.tokens[i], n, in_.n_input[i], true);
        out_.finished[i] = now_;
        i64 nxt = next_of_[i];
        if (nxt >= 0) {
            double think = in_.arrival[nxt] - in_.arrival[i];
            pending_.push({now_ + std::max(think, 0.0), nxt});
        }
    }

    // `_ServedBounds.commit`
    void bounds_commit(i64 i, const i32* t, i64 n, i64 n_input, bool whole) {
        finished_count_ += whole;
        if (bound_ == nullptr) return;
        tell(PLACE_BOUND, i, whole ? AT_FINISH : n);
        bound_->commit(t, n, n_input);
        seen_->commit(t, n, n_input);
        if (seen_->tokens > in_.bound_limit) {
            bound_ = nullptr;
            seen_ = nullptr;
            out_.dropped = finished_count_;
        }
    }
};

}  // namespace marconi
