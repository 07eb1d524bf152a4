// The compiled twin of marconi's token-only prefix cache (docs/architecture.md, "The
// compiled core"). It replays what `marconi.core.cache.PrefixCache` does for the systems
// it supports, step for step, so that every hit, victim and byte count is the Python
// core's: the radix tree (nodes are integer slots into one array, children found through
// one hash map and kept in a list in the order a Python dict keeps them), the paper's
// judicious admission (or none), and the evictions: a declared priority's keys over leaves
// and a declared score over candidates in slots. One byte budget, KV per token, the default
// namespace, pins (a pinned node and its ancestors leave no book a victim is taken from,
// as `PrefixCache.pin`), no engine handles: what a trace replay and a running request need.
//
// Exactness: FLOPs are summed in 128-bit integers; a FLOP efficiency is a correctly
// rounded quotient as Python's int / int is, computed in doubles where both operands are
// below 2^53 and handed to `exact_div` (the binding's Python division) otherwise.
// Scores are computed operation for operation as numpy does, with no fused multiply-add.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace marconi {

using i64 = long long;
using i128 = __int128;
using i32 = int32_t;

// KEYED: a declared priority (`core.ranked.Ranked`, its keys by `set_keys`) over the
// leaves, lowest keys first, ties by creation
// SCORED: a declared score over the candidates (`core.candidates.Declared`, its terms by
// `set_score_terms`; a leveled one stamps the level at a touch, each victim raising it; one
// reading the learned density learns it from the books `set_density` hands it)
// KEEP: an unbounded cache's, never asked
// MULTI: marconi+'s live cache (`plus.switchable.Switchable`): a declared score (its FLOP
// expert's, by `set_score_terms`), a declared priority (its LRU expert's, by `set_keys`,
// recency its own stamp) and up to two declared scores over learned densities (its hit
// density experts', by `set_learned_terms`, their stamps the clock's) all kept current,
// `Run` choosing the victims
// LISTS: an engine's two LRU lists over one tree, KV leaves and states, declared
// (`core.priority.Lists`, by `set_lists`): which list gives the victim (the older head, or
// the state list while states are short of room), the tie at equal stamps, and whether
// stateless leaves are garbage (collected at once, a leaf's state leaving with its leaf);
// the state leaving chosen by a declared score over the state list where one is handed
// (`set_state_score`)
enum class Evict { KEYED = 0, SCORED = 1, KEEP = 2, MULTI = 3, LISTS = 4 };
// the expert choosing: the declared score, the declared priority, a learned score (k 0, 1)
enum class Run { SCORED = 0, KEYED = 1, LEARNED_0 = 2, LEARNED_1 = 3 };
// PLACED: a declared placement (`core.placement.Placed`, by `set_placement`: the branch
// point, every `every` tokens, the end; none of them: nothing cached), with the positions
// a Python side works out per request beside it or in its place (`set_positions`);
// ALIGN: vLLM's align mode (`peers.mamba_align.Align`); RADIX: SGLang's
// (`peers.mamba_radix.MambaRadix`), no-buffer or extra-buffer
enum class Admit { PLACED = 0, ALIGN = 1, RADIX = 2 };
enum class Act { REMOVE = 0, MERGE = 1, DROP = 2 };  // DROP: the state only, the node stays

struct Spec {
    i64 kv_per_token = 0, ssm_bytes = 0;
    i64 attention = 0, mlp = 0, ssm = 0, d_model = 0, d_state = 0;

    // `ModelSpec.flops`: prefill FLOPs of `n` tokens, exact.
    i128 flops(i64 n) const {
        i128 L = n, D = d_model, N = d_state;
        i128 att = 8 * L * D * D + 4 * L * L * D;
        i128 mlp_f = 16 * L * D * D;
        i128 ssm_f = 12 * L * D * D + 16 * L * D * N + 10 * L * D;
        return attention * att + mlp * mlp_f + ssm * ssm_f;
    }
};

// `CacheStats`, field for field.
struct Stats {
    i64 lookups = 0, commits = 0, input_tokens = 0, hit_tokens = 0, hit_requests = 0;
    i64 states_admitted = 0, states_evicted = 0, states_not_captured = 0,
        states_replaced = 0, evictions = 0, refused_commits = 0, evicted_then_refused = 0;
    i64 kv_bytes = 0, ssm_bytes = 0, states = 0, peak_bytes = 0;
};

struct PlanOut {
    i64 hit = 0, matched = 0;
    int node = -1;  // slot of the node resumed from
};

struct CommitOut {
    bool refused = false;
    int end = -1;
};

// One eviction as `Freed` reports it: what was done, at which depth, bytes freed.
struct Freed {
    int action;
    i64 depth, bytes;
};

// Hit density's books (`plus.density.HitDensity`), its tables row-major by class: `start`
// the first age of each bucket; `age_vec` / `age_one` the first integer age of each bucket
// as its array (scores) / one-age (counts) path computes it; `depth_from` the first depth
// of each depth class past the first. `now`: the clock it last saw, as the Python policy's.
struct Density {
    std::vector<double> start, age_vec, age_one, hits, events, table;
    std::vector<i64> depth_from;
    int depth_classes = 0;
    i64 counted = 0, every = 1;
    double decay = 1, prior_hits = 0, prior_events = 0, now = 0;
    bool on = false;

    // the last bucket whose first age `age` reaches
    static int bucket_of(const std::vector<double>& first, double age) {
        age = std::max(age, 0.0);
        auto it = std::upper_bound(first.begin(), first.end(), age);
        return static_cast<int>(it - first.begin()) - 1;
    }

    // `HitDensity.classify`: interior, or a leaf (in its depth class)
    int classify(int nchild, i64 depth) const {
        if (nchild > 0) return 1;
        if (depth_classes == 0) return 0;
        auto it = std::upper_bound(depth_from.begin(), depth_from.end(), depth);
        return 2 + static_cast<int>(it - depth_from.begin());
    }

    // `HitDensity._count`: a candidate of class `cls`, last touched at `stamp`, hit (or
    // leaving) now
    void count(int cls, double stamp, bool hit) {
        size_t nb = start.size();
        int b = bucket_of(age_one, now - stamp);
        size_t at = static_cast<size_t>(cls) * nb + static_cast<size_t>(b);
        events[at] += 1;
        if (hit) hits[at] += 1;
        counted += 1;
        if (counted % every == 0) learn();
    }

    // `HitDensity.learn`: the tables from the counts (numpy's reversed cumulative sums,
    // operation for operation), then the counts aged
    void learn() {
        size_t nb = start.size(), classes = hits.size() / nb;
        for (size_t c = 0; c < classes; ++c) {
            const size_t row = c * nb;
            double above = 0, n_above = 0, nt_above = 0;
            for (size_t k = nb; k-- > 0;) {
                double h = hits[row + k] + prior_hits;
                double e = events[row + k] + prior_events;
                double et = e * start[k];
                if (k == nb - 1) { above = h; n_above = e; nt_above = et; }
                else { above = above + h; n_above = n_above + e; nt_above = nt_above + et; }
                double nt = n_above * start[k];
                double remaining = (nt_above - nt) + n_above;
                table[row + k] = above / remaining;
            }
        }
        for (double& h : hits) h *= decay;
        for (double& e : events) e *= decay;
    }

    // the density of a candidate of class `cls` last touched at `rec`, at clock `t`
    // (`HitDensity.values`: the table at its class and the bucket of its idle age)
    double at(int cls, double t, double rec) const {
        int b = bucket_of(age_vec, t - rec);
        return table[static_cast<size_t>(cls) * start.size() + static_cast<size_t>(b)];
    }
};

// `saved / held` correctly rounded, `saved` given as hi * 2^64 + lo (Python's int / int)
typedef double (*ExactDiv)(i64 hi, unsigned long long lo, i64 held);

class Core {
  public:
    Core(const Spec& spec, i64 capacity, int admit, int evict, double alpha)
        : spec_(spec), capacity_(capacity), admit_(static_cast<Admit>(admit)),
          evict_(static_cast<Evict>(evict)), alpha_(alpha), block_(0),
          kv_capacity_(capacity) {
        nodes_.emplace_back();  // the default namespace's root, id 0
        nodes_[0].alive = true;
    }

    Stats stats;
    i64 clock = 0;
    bool log_evictions = false;
    std::vector<Freed> freed;  // filled when `log_evictions`
    std::vector<i64> checkpoints;  // the last lookup's or peek's, ascending
    std::vector<i64> admitted;     // the last commit's positions that gained a state
    ExactDiv exact_div = nullptr;

    double alpha() const { return alpha_; }
    void set_alpha(double a) { alpha_ = a; }
    i64 capacity() const { return capacity_; }
    size_t size() const { return size_; }

    // A declared placement (`core.priority.Placement`): the branch point, every `every`
    // tokens (0: not; a final partial block grows in place), the end. Before any request.
    void set_placement(bool branch, i64 every, bool end) {
        if (admit_ != Admit::PLACED || every < 0)
            throw std::invalid_argument("set_placement: a placed admission, every >= 0");
        branch_ = branch;
        every_ = every;
        end_ = end;
    }

    // vLLM's align-mode admission (`Align`): its block, longest prefill step (`chunk`),
    // retention interval (-1: None, a state every step end and block of the output; 0:
    // only what a later request can reuse; R: one per R tokens) and whether shared-prefix
    // junctions hold a state. Called before any request.
    void set_align(i64 block, i64 chunk, i64 retention, bool junctions) {
        if (block < 1 || chunk < 1 || retention < -1 || (retention > 0 && retention % block))
            throw std::invalid_argument("set_align: a block and chunk >= 1, a retention of "
                                        "-1, 0 or a multiple of the block");
        block_ = block;
        chunk_ = chunk;
        retention_ = retention;
        junctions_ = junctions;
    }

    // SGLang's admission (`MambaRadix`): extra-buffer mode or not, the longest prefill
    // chunk, the tracking alignment and the decode interval. Before any request.
    void set_radix(bool extra, i64 chunk, i64 track, i64 decode_interval) {
        if (chunk < 1 || track < 1 || decode_interval < 1)
            throw std::invalid_argument("set_radix: chunk, track and interval >= 1");
        extra_buffer_ = extra;
        chunk_ = chunk;
        track_ = track;
        decode_interval_ = decode_interval;
    }

    // A pool of `slots` states beside `kv_capacity` bytes of KV (`Layout.state_slots`);
    // `state_share`: the states' share of one byte budget (`SGLangConfig.state_share`,
    // read by SGLang's lists without a pool). Before any request.
    void set_pool(i64 slots, i64 kv_capacity, double state_share) {
        if (slots < 0 || kv_capacity < 0 || kv_capacity > capacity_)
            throw std::invalid_argument("set_pool: slots >= 0, KV capacity within the capacity");
        slots_ = slots;
        kv_capacity_ = kv_capacity;
        state_share_ = state_share;
    }

    // KV in pages of `page` tokens (`layout.PageBooks`); 1: per token. Before any request.
    void set_pages(i64 page) {
        if (page < 1) throw std::invalid_argument("set_pages: a page of >= 1 tokens");
        page_ = page;
    }
    i64 page() const { return page_; }

    // A declared priority (`marconi.core.priority`, evaluated as `Ranked` does): the leaf
    // order's two keys, each the sum of its terms `weight x feature` (a step where
    // `at_least` is not NaN: 1 when the feature reaches it, else 0), ties by creation.
    // Features: 0 the stamp, 1 hits, 2 creation clock, 3 depth, 4 holds a state. Before
    // any request; the keyed eviction, or marconi+'s (its LRU expert's keys).
    void set_keys(const std::vector<int>& key, const std::vector<int>& feature,
                  const std::vector<double>& weight, const std::vector<double>& at_least) {
        size_t n = key.size();
        if ((evict_ != Evict::KEYED && evict_ != Evict::MULTI) || feature.size() != n ||
            weight.size() != n || at_least.size() != n)
            throw std::invalid_argument("set_keys: a keyed eviction or marconi+'s, one key, "
                                        "feature, weight and threshold per term");
        for (size_t i = 0; i < n; ++i) {
            if (key[i] < 0 || key[i] > 1 || feature[i] < 0 || feature[i] > 4)
                throw std::invalid_argument("set_keys: keys 0-1, features 0-4");
            terms_[key[i]].push_back(Term{feature[i], weight[i], at_least[i]});
            keys_count_ = keys_count_ || feature[i] == 1 || feature[i] == 2;
        }
        if (evict_ == Evict::MULTI && keys_count_)
            throw std::invalid_argument("set_keys: marconi+'s keyed expert reads recency, "
                                        "depth and states only");
        declared_ = true;
    }

    // An engine's two lists (`LISTS`, before any request; `core.priority.Lists`): the
    // state list gives the victim while states are short of room (`by_pool`, else the
    // older head), `shallow_first` at equal stamps, stateless leaves `garbage`; with
    // `tail_safe` (`TailSafe`, by pool only) the KV list gives its first TEL-safe leaf
    // first, a conversation's next prefill kept within `threshold` tokens when its next
    // prompt adds `next_prompt`
    void set_lists(bool by_pool, bool shallow_first, bool garbage, bool tail_safe,
                   i64 threshold, i64 next_prompt) {
        if (!two()) throw std::invalid_argument("set_lists: an engine's lists only");
        if (tail_safe && (!by_pool || threshold < 0 || next_prompt < 0))
            throw std::invalid_argument("set_lists: a TEL-safe KV order by pool only, its "
                                        "threshold and estimate >= 0");
        lists_set_ = true;
        lists_by_pool_ = by_pool;
        lists_shallow_ = shallow_first;
        lists_garbage_ = garbage;
        tail_safe_ = tail_safe;
        threshold_ = threshold;
        next_prompt_ = next_prompt;
    }

    // An engine's state list ordered by a declared score (`peers.two_lists.FlopStates`;
    // `LISTS`, after `set_lists`, before any request): its terms as `set_score_terms` takes them,
    // over recency (the rank in the list's LRU order) and efficiency only, the efficiencies
    // from `spec` (the policy's own model, unpadded) over the parent (`from_parent`) or the
    // nearest state above; `branches_last`: states at a branch after every other
    void set_state_score(const Spec& spec, const std::vector<int>& feature,
                         const std::vector<double>& weight, const std::vector<bool>& tuned,
                         bool normalized, bool product, bool from_parent, bool branches_last) {
        if (!two()) throw std::invalid_argument("set_state_score: an engine's lists only");
        state_score_.terms = parse_terms(feature, weight, tuned, normalized, product,
                                         "set_state_score");
        for (const ScoreTerm& t : state_score_.terms)
            if (t.feature != ScoreFeature::RECENCY && t.feature != ScoreFeature::EFFICIENCY)
                throw std::invalid_argument("set_state_score: a state list's score reads "
                                            "recency and efficiency only");
        state_score_.normalized = normalized;
        state_score_.product = product;
        state_score_.set = true;
        state_from_parent_ = from_parent;
        state_branches_last_ = branches_last;
        flop_spec_ = spec;
    }

    // A declared score's terms (`core.priority.Score`; `Evict::SCORED`, or `MULTI`'s FLOP
    // expert; before any request), in order: per term its feature (`ScoreFeature`), weight and whether alpha
    // multiplies it; whether each term is min-max normalized over the candidates.
    // Default: Marconi's, recency + alpha x efficiency, normalized. A score reading
    // `LEVEL` (unnormalized, not with the clock's features) stamps the level at a touch
    void set_score_terms(const std::vector<int>& feature, const std::vector<double>& weight,
                         const std::vector<bool>& tuned, bool normalized, bool product) {
        if (evict_ != Evict::SCORED && evict_ != Evict::MULTI)
            throw std::invalid_argument("set_score_terms: a scored eviction or marconi+'s only");
        score_terms_ = parse_terms(feature, weight, tuned, normalized, product, "set_score_terms");
        for (const ScoreTerm& t : score_terms_)
            if (t.feature == ScoreFeature::DENSITY && multi())
                throw std::invalid_argument("set_score_terms: marconi+'s live cache reads the "
                                            "learned densities in its learned experts' scores "
                                            "(`set_learned_terms`), not its FLOP expert's");
        score_normalized_ = normalized;
        score_product_ = product;
        score_leveled_ = false;
        bool density_read = false;
        bool clock = false;
        for (const ScoreTerm& t : score_terms_) {
            score_leveled_ = score_leveled_ || t.feature == ScoreFeature::LEVEL;
            density_read = density_read || t.feature == ScoreFeature::DENSITY;
            clock = clock || t.feature == ScoreFeature::RECENCY || t.feature == ScoreFeature::INVERSE_AGE;
        }
        if (score_leveled_ && (normalized || clock || density_read))
            throw std::invalid_argument("set_score_terms: the level reads in an unnormalized "
                                        "score, without recency or density");
    }

    // marconi+'s live cache: learned expert `k`'s declared score (its hit density's, over
    // the density `set_density(k, ...)` hands; before any request), as `set_score_terms`
    // takes one, its stamps the clock's: no level, no alpha
    void set_learned_terms(int k, const std::vector<int>& feature, const std::vector<double>& weight,
                           const std::vector<bool>& tuned, bool normalized, bool product) {
        if (!multi()) throw std::invalid_argument("set_learned_terms: marconi+'s live cache only");
        if (k < 0 || k > 1) throw std::invalid_argument("set_learned_terms: k is 0 or 1");
        ScoreDecl& d = learned_[k];
        d.terms = parse_terms(feature, weight, tuned, normalized, product, "set_learned_terms");
        for (const ScoreTerm& t : d.terms)
            if (t.feature == ScoreFeature::LEVEL || t.tuned)
                throw std::invalid_argument("set_learned_terms: a learned expert's score reads "
                                            "no level and has no alpha");
        d.normalized = normalized;
        d.product = product;
        d.set = true;
    }

    // --- the request's life ------------------------------------------------------------

    PlanOut lookup(const i32* key, i64 n, bool plan_checkpoints = true) {
        match(key, n);
        return looked_up(n, plan_checkpoints);
    }

    // `lookup` after its walk (`match(key, n)`, the tree unchanged since)
    PlanOut looked_up(i64 n, bool plan_checkpoints) {
        clock += 1;
        PlanOut plan = plan_of(n);
        if (plan_checkpoints) checkpoints_of(plan, n);
        on_lookup(plan.node);
        stats.lookups += 1;
        stats.input_tokens += n;
        stats.hit_tokens += plan.hit;
        stats.hit_requests += plan.hit > 0;
        return plan;
    }

    PlanOut peek(const i32* key, i64 n) {
        match(key, n);
        PlanOut plan = plan_of(n);
        checkpoints_of(plan, n);
        return plan;
    }

    // The positions in (hit, n] prefill must capture, into `checkpoints`.
    void checkpoints_of(const PlanOut& plan, i64 n) {
        checkpoints.clear();
        if (admit_ == Admit::PLACED && given_) {  // the planner's points past the hit
            for (i64 p : extra_)
                if (p > plan.hit) checkpoints.push_back(p);
        } else if (admit_ == Admit::PLACED) {  // `Placed.checkpoints`
            if (branch_) {
                i64 p = branch_point(n);
                if (p >= 0 && p > plan.hit) checkpoints.push_back(p);
            }
            if (every_ > 0)
                for (i64 p = (plan.hit / every_ + 1) * every_; p <= n; p += every_)
                    checkpoints.push_back(p);
            // (structured admission's boundaries past the hit, inside the input, not held)
            for (i64 b : extra_)
                if (plan.hit < b && b < n && !held(b)) checkpoints.push_back(b);
            sort_unique(checkpoints);
        } else if (admit_ == Admit::ALIGN) {  // `Align.checkpoints`
            align_prefill(n, plan.hit, checkpoints);
            sort_unique(checkpoints);
        } else if (admit_ == Admit::RADIX) {  // `MambaRadix.checkpoints`
            radix_prefill(n, plan.hit, checkpoints);
            checkpoints.erase(std::remove_if(checkpoints.begin(), checkpoints.end(),
                                             [&](i64 p) { return p <= plan.hit; }),
                              checkpoints.end());
        }
    }

    // `resume`: the last walk was a lookup of a prefix of `key` and the tree has not
    // changed since (`serve`): the walk goes on from its deepest full node, as the Python
    // core's `match(after=...)` does
    CommitOut commit(const i32* key, i64 n, i64 n_input, bool resume = false) {
        clock += 1;
        stats.commits += 1;
        admitted.clear();
        CommitOut out;
        if (admit_ == Admit::PLACED && !given_ && !branch_ && every_ == 0 && !end_) {
            match(key, 0);  // nothing placed: nothing cached
            return out;
        }
        positions_.clear();
        i64 room = 0;     // tokens room is made for: what the running request held
        int working = 0;  // ... and its working states (`Admission.running`)
        if (admit_ == Admit::ALIGN) {
            // `Align.positions` over the whole sequence, then kept up to its last full block
            match(key, n, resume);
            align_positions(n, n_input);
            i64 kept = floor_div(n - 1, block_) * block_;
            if (kept <= 0) return out;  // no full block: nothing kept
            match(key, kept);
            while (!positions_.empty() && positions_.back() > kept) positions_.pop_back();
            room = std::max(kept, n - 1);
            working = 2;
            n = kept;
        } else if (admit_ == Admit::RADIX) {
            // `MambaRadix.positions`, the sequence kept up to the last of them
            match(key, n, resume);
            radix_positions(n, n_input);
            i64 kept = positions_.empty() ? 0 : positions_.back();
            if (kept <= 0) return out;  // no state to end on: nothing kept
            if (kept < n) match(key, kept);
            room = kept;
            working = extra_buffer_ ? 2 : 0;  // extra-buffer's two ping-pong tracking slots
            n = kept;
        } else if (given_) {
            // the planner's points only; the sequence kept up to the last (`truncates`)
            i64 kept = 0;
            for (i64 p : extra_)
                if (p > 0) { positions_.push_back(p); kept = std::max(kept, p); }
            if (kept == 0) return out;  // no state to end on: nothing kept
            n = std::min(n, kept);
            match(key, n);
            std::sort(positions_.begin(), positions_.end());
            positions_.erase(std::unique(positions_.begin(), positions_.end()), positions_.end());
        } else {
            match(key, n, resume);  // `Placed.positions`
            if (branch_) {
                i64 bp = branch_point(n);
                if (bp >= 0) positions_.push_back(bp);
            }
            if (every_ > 0)
                for (i64 p = every_; p <= n; p += every_) positions_.push_back(p);
            if (end_) positions_.push_back(n);
            if (!extra_.empty()) {  // boundaries past the deepest state held in the input
                i64 hit = 0;
                for (int v : path_)
                    if (nodes_[v].has_state && nodes_[v].depth <= n_input)
                        hit = std::max(hit, nodes_[v].depth);
                for (i64 b : extra_)
                    if (hit < b && b < n_input && !held(b)) positions_.push_back(b);
            }
            sort_unique(positions_);
        }
        if (admit_ != Admit::ALIGN && admit_ != Admit::RADIX) room = n;  // (n: what is kept)
        // the wanted ones: not held by a matched node (both lists ascend)
        admitted.clear();
        size_t k = 0;
        for (i64 p : positions_) {
            while (k < path_.size() && nodes_[path_[k]].depth < p) ++k;
            bool held = k < path_.size() && nodes_[path_[k]].depth == p &&
                        nodes_[path_[k]].has_state;
            if (!held) admitted.push_back(p);
        }
        i64 nw = static_cast<i64>(admitted.size());
        if (!make_room(room, nw + working)) {
            stats.refused_commits += 1;
            // `on_commit(path, (), now)`: LRU touches the path; hit density sees the clock
            if (tail_safe_) high_water(path_, {}, {});
            if (declared_) declared_commit(path_, {}, {});
            if (evict_ == Evict::KEYED || multi() || two()) touch_path(path_);
            see_clock();
            now_ = static_cast<double>(clock);
            admitted.clear();
            out.refused = true;
            return out;
        }
        out.end = insert(key, n, admitted);
        if (admit_ == Admit::PLACED && every_ > 0) grow_in_place(out.end, n);
        if (lists_garbage_) {  // `_collect_garbage(set())`: nothing protected
            protect_round_ += 1;
            collect_garbage();
        }
        return out;
    }

    // Whether any token id is negative (a caller that has not checked its tokens asks
    // first: no side effect may come before the refusal).
    static bool any_negative(const i32* key, i64 n) {
        uint32_t bits = 0;  // the sign bits or-ed: a loop the compiler vectorizes
        for (i64 i = 0; i < n; ++i) bits |= static_cast<uint32_t>(key[i]);
        return (bits >> 31) != 0;
    }

    i64 serve(const i32* key, i64 n, i64 n_input) {
        i64 hit = lookup(key, n_input, false).hit;
        commit(key, n, n_input, true);
        return hit;
    }

    // `serve` of ids not yet checked: -1, the cache untouched, when one is negative. The
    // walk comes first (it changes nothing): the ids it matched equal ids the tree holds,
    // all checked when they came in, so only the rest are read for their signs (the ids
    // are read once, not twice, on the replay's hot path).
    i64 serve_checking(const i32* key, i64 n, i64 n_input) {
        match(key, n_input);
        if (any_negative(key + length_, n - length_)) return -1;
        i64 hit = looked_up(n_input, false).hit;
        commit(key, n, n_input, true);
        return hit;
    }

    // --- pins (`PrefixCache.pin`, `unpin`) ------------------------------------------------

    // Whether slot `v` holds the node whose uid is `uid` (a node a caller was handed is
    // still in the tree): a pinned node never leaves, so its slot stays its own.
    bool holds(int v, i64 uid) const {
        return v > 0 && v < static_cast<int>(nodes_.size()) && nodes_[v].alive &&
               nodes_[v].uid == uid;
    }

    // Protect `v` and its ancestors from eviction until `unpin(v)`: each gains a pin; one
    // gaining its first leaves the books victims are taken from (root first, as the
    // Python core's path).
    void pin(int v) {
        std::vector<int>& path = pin_path(v);
        for (int u : path) {
            if (++nodes_[u].pins == 1) {
                pinned_.insert(u);
                changed(u);
            }
        }
    }

    // Undo one `pin(v)`; nothing changes when a node on the path is not pinned.
    void unpin(int v) {
        std::vector<int>& path = pin_path(v);
        for (int u : path)
            if (nodes_[u].pins <= 0) throw std::invalid_argument("unpin of a node that is not pinned");
        for (int u : path) {
            if (--nodes_[u].pins == 0) {
                pinned_.erase(u);
                changed(u);
            }
        }
    }

    i64 pins(int v) const { return nodes_[v].pins; }

    // --- walks, snapshots ----------------------------------------------------------------

    // `RadixTree.nodes()`: every node but the root, parents before children, in the order
    // the Python walk takes (a stack; children in their dict's order).
    std::vector<int> walk() const {
        std::vector<int> out, stack;
        for (int c = nodes_[0].first; c >= 0; c = nodes_[c].next) stack.push_back(c);
        while (!stack.empty()) {
            int v = stack.back();
            stack.pop_back();
            out.push_back(v);
            for (int c = nodes_[v].first; c >= 0; c = nodes_[c].next) stack.push_back(c);
        }
        return out;
    }

    int parent(int v) const { return nodes_[v].parent; }
    i64 depth(int v) const { return nodes_[v].depth; }
    i64 uid(int v) const { return nodes_[v].uid; }
    bool has_state(int v) const { return nodes_[v].has_state; }
    bool copy_of(int v) const { return nodes_[v].copy; }
    double stamp(int v) const { return nodes_[v].stamp; }
    const std::vector<i32>& key_of(int v) const { return nodes_[v].key; }
    int children(int v) const { return nodes_[v].nchild; }

    // `snapshot.rebuild` into this empty cache: nodes in the snapshot's order, then the
    // stamps restored in that order (the order a policy's books are filled in).
    void load_node(int parent_index, const i32* key, i64 n, bool state, bool copy = false) {
        int parent = parent_index < 0 ? 0 : loaded_[parent_index];
        int v = new_leaf(parent, key, n);
        nodes_[v].has_state = state;
        nodes_[v].copy = copy;
        loaded_.push_back(v);
    }

    void load_done(const double* stamps, i64 clock_now) {
        if (multi()) throw std::invalid_argument("marconi+'s live cache loads no snapshot");
        clock = clock_now;
        i64 kv = 0, states = 0;
        for (int v : loaded_) {
            kv += kv_bytes_of(v);
            states += nodes_[v].has_state;
        }
        add_bytes(kv, states * spec_.ssm_bytes, states);
        for (size_t i = 0; i < loaded_.size(); ++i) {
            set_stamp(loaded_[i], stamps[i]);
            if (two() && nodes_[loaded_[i]].has_state) {  // `TwoListLRU.restore`
                nodes_[loaded_[i]].sstamp = stamps[i];
                nodes_[loaded_[i]].sstamped = true;
            }
            changed(loaded_[i]);
        }
        loaded_.clear();
    }

    // Structured admission (`plus.admission.Structured`): the positions its Python side
    // worked out for the next calls. Not `given`: message boundaries, each admitted beside
    // the judicious ones where it lies past the hit, inside the input and not held. `given`
    // (the overlap planner's points): the only positions, and a commit keeps the sequence
    // up to the last of them (nothing when there is none).
    void set_positions(const i64* p, i64 n, bool given) {
        extra_.assign(p, p + n);
        given_ = given;
    }

    // Hit density's tables and constants (`HitDensity`), row-major by class: `start` the
    // first age of each bucket; `age_vec` / `age_one` the first integer age of each bucket
    // as its array / scalar path computes it; `depth_from` the first depth of each depth
    // class past the first (none: leaves in one class).
    // (`k`: 0 the hit density, 1 the one by depth of marconi+'s live cache)
    void set_density(int k, const std::vector<double>& start, const std::vector<double>& age_vec,
                     const std::vector<double>& age_one, const std::vector<i64>& depth_from,
                     const std::vector<double>& hits, const std::vector<double>& events,
                     const std::vector<double>& density, i64 counted, i64 every,
                     double decay, double prior_hits, double prior_events, int depth_classes) {
        size_t b = start.size();
        if (k < 0 || k > 1) throw std::invalid_argument("set_density: k is 0 or 1");
        if (b < 2 || age_vec.size() != b || age_one.size() != b || every < 1 ||
            depth_classes < 0 ||
            depth_from.size() != static_cast<size_t>(depth_classes > 0 ? depth_classes - 1 : 0) ||
            hits.size() != events.size() || hits.size() != density.size() ||
            hits.size() != (2 + static_cast<size_t>(depth_classes)) * b)
            throw std::invalid_argument("set_density: tables of inconsistent sizes");
        Density& d = dens_[k];
        d.depth_classes = depth_classes;
        d.start = start; d.age_vec = age_vec; d.age_one = age_one; d.depth_from = depth_from;
        d.hits = hits; d.events = events; d.table = density;
        d.counted = counted; d.every = every; d.decay = decay;
        d.prior_hits = prior_hits; d.prior_events = prior_events;
        d.on = true;
    }

    double level() const { return level_; }
    void set_level(double level) { level_ = level; }
    // marconi+'s live cache: the expert choosing the victims (`Run`)
    void set_run(int run) {
        if (run < 0 || run > 3 || (run >= 2 && (!learned_[run - 2].set || !dens_[run - 2].on)))
            throw std::invalid_argument("set_run: no such expert here");
        run_ = static_cast<Run>(run);
    }
    int run() const { return static_cast<int>(run_); }
    i64 counted(int k) const { return dens_[k].counted; }
    const std::vector<double>& density_hits(int k) const { return dens_[k].hits; }
    const std::vector<double>& density_events(int k) const { return dens_[k].events; }
    const std::vector<double>& density_table(int k) const { return dens_[k].table; }
    std::vector<int> classes(int k) const {
        std::vector<int> out;
        for (size_t i = 0; i < cand_.size(); ++i) out.push_back(k == 0 ? cls_[i] : cls2_[i]);
        return out;
    }
    // marconi+'s live cache: each candidate's touch as hit density knows it, in slot order
    std::vector<double> clock_stamps() const {
        return std::vector<double>(rec2_.begin(), rec2_.end());
    }

    // FLOP-aware candidates in slot order: (depth, last touch, efficiency) (tests).
    std::vector<std::tuple<i64, double, double>> candidates() const {
        std::vector<std::tuple<i64, double, double>> out;
        for (size_t i = 0; i < cand_.size(); ++i)
            out.emplace_back(nodes_[cand_[i]].depth, rec_[i], eff_[i]);
        return out;
    }

    // Assert the books: bytes, leaf order, candidates (tests). Returns "" or the fault.
    std::string check() const {
        i64 kv = 0, states = 0, free_states = 0;
        size_t count = 0;
        for (int v : walk()) {
            ++count;
            kv += kv_bytes_of(v);
            states += nodes_[v].has_state;
            free_states += nodes_[v].has_state && nodes_[v].pins == 0;
            const Node& x = nodes_[v];
            if (x.key.empty()) return "a node with an empty edge";
            if (x.depth != nodes_[x.parent].depth + edge_len(v)) return "a wrong depth";
            const bool free = x.pins == 0;  // (a pinned node is in no book)
            if (!free && (x.in_order || x.in_states || x.slot >= 0)) return "a pinned node in a book";
            if (x.pins > nodes_[x.parent].pins && x.parent != 0) return "a node pinned more than its parent";
            if ((x.pins > 0) != (pinned_.count(v) > 0)) return "the pinned set differs";
            if (evict_ == Evict::KEYED && free && x.nchild == 0 && !x.in_order) return "a leaf out of the keyed order";
            if ((scored() || multi()) && (free && x.nchild <= 1) != (x.slot >= 0)) return "candidates differ";
            if ((learns() || multi()) && x.slot >= 0 &&
                cls_[x.slot] != dens_[0].classify(x.nchild, x.depth))
                return "a stale class";
            if (multi() && free && x.nchild == 0 && !x.in_order) return "a leaf out of the LRU order";
            if (two() && (free && x.nchild == 0) != x.in_order) return "the KV list differs";
            if (two() && ((free && x.has_state) != x.in_states || x.has_state != x.sstamped))
                return "the state list differs";
            if (lists_garbage_ && free && x.nchild == 0 && !x.has_state && !x.in_tomb)
                return "a stateless leaf not queued";
            if (x.copy && (page_ == 1 || (x.depth - edge_len(v)) % page_ == 0))
                return "a page copy where no page is shared";
        }
        if (count != size_) return "node count differs";
        for (int v : pinned_)
            if (!nodes_[v].alive || nodes_[v].pins <= 0) return "a pinned node gone";
        if (two() && states_order_.size() != static_cast<size_t>(free_states))
            return "the state list holds a state no more";
        if (kv != stats.kv_bytes) return "KV bytes differ";
        if (states != stats.states || states * spec_.ssm_bytes != stats.ssm_bytes) return "states differ";
        if (stats.kv_bytes + stats.ssm_bytes + reserved_kv_ + reserved_states_ * spec_.ssm_bytes
            > capacity_) return "over capacity";
        if (slots_ > 0 && (stats.kv_bytes + reserved_kv_ > kv_capacity_ ||
                           stats.states + reserved_states_ > slots_))
            return "over the pools";
        return "";
    }

  private:
    struct Node {
        int parent = -1, first = -1, last = -1, next = -1, prev = -1, nchild = 0;
        i64 depth = 0, uid = 0;
        i64 pins = 0;  // running requests using it (`Node.pins`)
        i64 high = 0;  // the high-water depth below it, if `has_high` (`TwoListLRU.high`)
        bool has_high = false;
        std::vector<i32> key;
        bool alive = false, has_state = false, in_order = false;
        double stamp = 0;
        double stamp_lru = 0, stamp_clock = 0;  // marconi+'s live cache: LRU's, hit density's
        std::tuple<double, double, i64> order_key;  // its entry in the LRU order, if in_order
        // a declared priority's features beyond the stamp (`set_keys`): the commits through
        // it, the clock when it entered the tree (`Ranked.hits`, `Ranked.created`)
        i64 hits = 0;
        double created = 0;
        int slot = -1;                            // its candidate slot (FLOP), or -1
        bool copy = false;  // holds its own copy of the page it starts in (`PageBooks`)
        // an engine's state list (LISTS): the state's stamp, its entry if in_states
        bool sstamped = false, in_states = false, in_tomb = false;
        double sstamp = 0;
        std::tuple<double, double, i64> states_key;
    };

    Spec spec_;
    i64 capacity_;
    Admit admit_;
    Evict evict_;
    double alpha_;
    i64 block_;
    i64 chunk_ = 1, retention_ = 0;  // `Align`'s (`set_align`), `MambaRadix`'s chunk
    bool extra_buffer_ = false;      // `MambaRadix` (`set_radix`)
    i64 track_ = 1, decode_interval_ = 1;
    i64 slots_ = 0;                  // a state pool (`set_pool`); 0: one byte budget
    i64 kv_capacity_;                // KV's bytes: the capacity less the pool
    i64 reserved_kv_ = 0, reserved_states_ = 0;  // held beside the tree (`reserve`)
    double state_share_ = 0;
    i64 need_states_ = 0;  // the states the pending insert needs (SGLang's `Pressure`)
    // SGLang's stateless leaves, an insertion-ordered set popped from its end (a Python
    // dict's `popitem`): (slot, id), stale once that node left
    std::vector<std::pair<int, i64>> tombs_;
    bool junctions_ = true;
    i64 page_ = 1;                   // tokens per KV page (`set_pages`)
    struct Term {
        int feature;
        double weight, at_least;
    };
    bool declared_ = false;          // a declared priority's keys (`set_keys`)
    bool keys_count_ = false;        // one of them reads hits or the creation clock
    std::vector<Term> terms_[2];
    bool tail_safe_ = false;         // `Lists.tail_safe` (`set_lists`): its threshold and estimate
    i64 threshold_ = 0, next_prompt_ = 0;
    // a declared score's terms (`set_score_terms`): the feature, its weight, x alpha or not
    // (`LEVEL`: the stamp, where a touch stamps the level)
    enum class ScoreFeature { RECENCY = 0, INVERSE_AGE = 1, EFFICIENCY = 2, REPLAY = 3, LEVEL = 4,
                              DENSITY = 5 };
    struct ScoreTerm {
        ScoreFeature feature;
        double weight;
        bool tuned;
    };
    std::vector<ScoreTerm> score_terms_{{ScoreFeature::RECENCY, 1.0, false},
                                        {ScoreFeature::EFFICIENCY, 1.0, true}};
    // a declared score's terms as its setter `who` is handed them
    static std::vector<ScoreTerm> parse_terms(const std::vector<int>& feature,
                                              const std::vector<double>& weight,
                                              const std::vector<bool>& tuned, bool normalized,
                                              bool product, const std::string& who) {
        if (feature.empty() || weight.size() != feature.size() || tuned.size() != feature.size())
            throw std::invalid_argument(who + ": one feature, weight and flag per term");
        if (product && normalized)
            throw std::invalid_argument(who + ": a product is unnormalized only");
        std::vector<ScoreTerm> out;
        for (size_t k = 0; k < feature.size(); ++k) {
            if (feature[k] < 0 || feature[k] > static_cast<int>(ScoreFeature::DENSITY))
                throw std::invalid_argument(who + ": a feature out of range");
            out.push_back({static_cast<ScoreFeature>(feature[k]), weight[k], tuned[k]});
        }
        return out;
    }

    // marconi+'s learned experts' scores (`set_learned_terms`)
    struct ScoreDecl {
        std::vector<ScoreTerm> terms;
        bool normalized = true, product = false, set = false;
    };
    ScoreDecl learned_[2];
    // an engine's lists (`set_lists`)
    bool lists_set_ = false, lists_by_pool_ = false, lists_shallow_ = false, lists_garbage_ = false;
    // an engine's state list's declared score (`set_state_score`; unset: its LRU order)
    ScoreDecl state_score_;
    bool state_from_parent_ = false, state_branches_last_ = false;
    bool score_normalized_ = true, score_leveled_ = false, score_product_ = false;
    std::vector<double> term_rec_, term_eff_, term_den_, learned_score_;
    Spec flop_spec_;
    double now_ = 0;                 // the lists' clock: the last lookup's or commit's
    // an entry of an LRU order: (stamp, tie-break, id) -> slot
    using Entry = std::tuple<double, double, i64, int>;
    // an engine's state list: every live unpinned state
    std::set<Entry> states_order_;

    std::vector<Node> nodes_;
    std::vector<int> free_;
    std::unordered_map<uint64_t, int> child_;  // (parent slot, first token) -> child
    i64 last_id_ = 0;
    size_t size_ = 0;

    // the last walk: fully matched nodes, the node left mid-edge, tokens matched
    std::vector<int> path_;
    int partial_ = -1;
    i64 length_ = 0;

    // LRU over leaves: (stamp, tie-break, id) -> slot, the live unpinned leaves only
    std::set<Entry> order_;
    // FLOP-aware candidates: dense columns in slot order (as `Columns`); `cls_`: hit
    // density's class of each
    std::vector<int> cand_;
    std::vector<double> rec_, eff_, score_;
    std::vector<int> cls_;
    // marconi+'s live cache: hit density's touches, the depth-classed one's classes
    std::vector<double> rec2_;
    std::vector<int> cls2_;
    Run run_ = Run::SCORED;

    // structured admission's positions for the next calls (`set_positions`)
    std::vector<i64> extra_;
    bool given_ = false;
    // a declared placement's (`set_placement`)
    bool branch_ = false, end_ = false;
    i64 every_ = 0;

    double level_ = 0;  // a leveled score's inflation level (`Declared.level`)
    Density dens_[2];   // hit density (`set_density`); [1]: by depth (marconi+'s live cache)

    std::vector<int> loaded_;
    std::unordered_set<int> pinned_;  // nodes with pins > 0 (`PrefixCache.pinned`)
    std::vector<int> protect_mark_;
    int protect_round_ = 0;

    static uint64_t child_key(int parent, i32 token) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) |
               static_cast<uint32_t>(token);
    }
    i64 edge_len(int v) const { return static_cast<i64>(nodes_[v].key.size()); }

    // --- the layout (`layout.PageBooks`) ----------------------------------------------------

    // pages whose first position lies in [start, stop) (`Layout.starts`; positions >= 0)
    i64 starts(i64 start, i64 stop) const {
        return (stop + page_ - 1) / page_ - (start + page_ - 1) / page_;
    }

    // KV bytes `v`'s edge holds: the pages starting in it, and its copy
    i64 kv_bytes_of(int v) const {
        if (page_ == 1) return edge_len(v) * spec_.kv_per_token;
        const Node& x = nodes_[v];
        return (starts(x.depth - edge_len(v), x.depth) + x.copy) * page_ * spec_.kv_per_token;
    }

    // KV bytes a commit of `n` tokens adds when `m` of them are in the tree: the pages
    // starting in the new tail, and a copy of the page where it branches off
    i64 need(i64 m, i64 n) const {
        if (m >= n) return 0;
        return (starts(m, n) + (m % page_ != 0)) * page_ * spec_.kv_per_token;
    }

    static i64 floor_div(i64 a, i64 b) {  // Python's a // b (b > 0)
        i64 q = a / b;
        return (a % b != 0 && a < 0) ? q - 1 : q;
    }

    static void sort_unique(std::vector<i64>& v) {
        std::sort(v.begin(), v.end());
        v.erase(std::unique(v.begin(), v.end()), v.end());
    }

    // --- vLLM's align mode (`peers.mamba_align.Align`) ---------------------------------------

    // `Align.prefill`, those past `hit` appended to `out`: the replay boundary, the
    // shared-prefix junction (the last walk's match), and what the retention keeps
    void align_prefill(i64 n_input, i64 hit, std::vector<i64>& out) const {
        const i64 b = block_;
        auto add = [&](i64 p) { if (p > hit) out.push_back(p); };
        add(floor_div(n_input - 1, b) * b);
        if (junctions_) add(floor_div(std::min(length_, n_input - 1), b) * b);
        if (retention_ < 0) {  // dense: every step's end (steps cut at block boundaries)
            i64 step = std::max(b, chunk_ / b * b);
            for (i64 p = hit + step; p < n_input; p += step) add(p);
            add(floor_div(n_input, b) * b);
        } else if (retention_ > 0) {
            for (i64 p = retention_; p < n_input; p += retention_) add(p);
        }
    }

    // `deepest_state(match, limit)`: the depth of the deepest state the last walk matched
    // within `limit` tokens (0: none)
    i64 deepest_state(i64 limit) const {
        i64 out = 0;
        for (int v : path_)
            if (nodes_[v].has_state && nodes_[v].depth <= limit)
                out = std::max(out, nodes_[v].depth);
        return out;
    }

    // `Align.positions` of the last walk (the whole sequence of `n` tokens) into
    // `positions_`, ascending
    void align_positions(i64 n, i64 n_input) {
        i64 hit = deepest_state(n_input - 1);
        align_prefill(n_input, hit, positions_);
        if (retention_ != 0) {  // `Align.decode`
            i64 step = retention_ < 0 ? block_ : retention_;
            for (i64 p = (floor_div(n_input, step) + 1) * step; p < n; p += step)
                positions_.push_back(p);
        }
        i64 replay = floor_div(n_input - 1, block_) * block_;
        if (replay > 0) positions_.push_back(replay);
        sort_unique(positions_);
    }

    // --- SGLang's admission (`peers.mamba_radix.MambaRadix`) --------------------------------

    // `MambaRadix.prefill` appended to `out`: no-buffer, every chunk's end and the input's;
    // extra-buffer, one tracked state per chunk (its last multiple of T past its start, or
    // in the chunk holding it the branch point: the last walk's match rounded down to T)
    void radix_prefill(i64 n_input, i64 hit, std::vector<i64>& out) const {
        const i64 C = chunk_, T = track_;
        if (!extra_buffer_) {
            for (i64 s = hit; s < n_input; s += C)
                if (s + C < n_input) out.push_back(s + C);
            out.push_back(n_input);
            return;
        }
        i64 matched = std::min(length_, n_input);
        i64 aligned = floor_div(matched, T) * T;
        bool branch = matched > hit && aligned > 0;
        for (i64 s = hit; s < n_input; s += C) {
            i64 e = std::min(s + C, n_input);
            if (branch && s < aligned && aligned <= e) out.push_back(aligned);
            else if (e - s >= T) out.push_back(s + (e - s) / T * T);
        }
    }

    // `MambaRadix.positions` of the last walk (the whole sequence of `n` tokens) into
    // `positions_`, ascending, past 0
    void radix_positions(i64 n, i64 n_input) {
        i64 hit = deepest_state(n_input - 1);
        radix_prefill(n_input, hit, positions_);
        if (!extra_buffer_) {
            positions_.push_back(std::max(n - 1, n_input));  // the last sampled token unfed
        } else {
            i64 last = floor_div(n, decode_interval_) * decode_interval_;
            if (last > n_input) positions_.push_back(last);  // the last decode state
        }
        positions_.erase(std::remove_if(positions_.begin(), positions_.end(),
                                        [](i64 p) { return p <= 0; }),
                         positions_.end());
        sort_unique(positions_);
    }

    // --- the tree ------------------------------------------------------------------------

    void match(const i32* key, i64 n, bool resume = false) {
        int node = 0;
        i64 pos = 0;
        if (resume && !path_.empty()) {
            node = path_.back();
            pos = nodes_[node].depth;
        } else {
            path_.clear();
        }
        partial_ = -1;
        while (pos < n) {
            auto it = child_.find(child_key(node, key[pos]));
            if (it == child_.end()) break;
            int c = it->second;
            const std::vector<i32>& edge = nodes_[c].key;
            i64 len = static_cast<i64>(edge.size());
            i64 avail = std::min(len, n - pos);
            if (avail == len && std::memcmp(edge.data(), key + pos, len * sizeof(i32)) == 0) {
                path_.push_back(c);
                node = c;
                pos += len;
                continue;
            }
            i64 off = 0;
            while (off < avail && edge[off] == key[pos + off]) ++off;
            partial_ = c;
            length_ = pos + off;
            return;
        }
        length_ = pos;
    }

    int alloc() {
        int v;
        if (!free_.empty()) {
            v = free_.back();
            free_.pop_back();
            nodes_[v] = Node();
        } else {
            v = static_cast<int>(nodes_.size());
            nodes_.emplace_back();
        }
        nodes_[v].alive = true;
        nodes_[v].uid = ++last_id_;
        return v;
    }

    void release(int v) {
        Node& x = nodes_[v];
        x.alive = false;
        x.parent = x.first = x.last = x.next = x.prev = -1;
        std::vector<i32>().swap(x.key);
        free_.push_back(v);
    }

    void link_last(int parent, int c) {
        Node& p = nodes_[parent];
        nodes_[c].prev = p.last;
        nodes_[c].next = -1;
        if (p.last >= 0) nodes_[p.last].next = c; else p.first = c;
        p.last = c;
        p.nchild += 1;
    }

    void unlink(int parent, int c) {
        Node& p = nodes_[parent];
        Node& x = nodes_[c];
        if (x.prev >= 0) nodes_[x.prev].next = x.next; else p.first = x.next;
        if (x.next >= 0) nodes_[x.next].prev = x.prev; else p.last = x.prev;
        x.prev = x.next = -1;
        p.nchild -= 1;
    }

    // `new_` takes `old_`'s place among `parent`'s children (a dict entry overwritten).
    void replace_child(int parent, int old_, int new_) {
        Node& p = nodes_[parent];
        Node& o = nodes_[old_];
        Node& x = nodes_[new_];
        x.prev = o.prev;
        x.next = o.next;
        if (o.prev >= 0) nodes_[o.prev].next = new_; else p.first = new_;
        if (o.next >= 0) nodes_[o.next].prev = new_; else p.last = new_;
        o.prev = o.next = -1;
        child_[child_key(parent, x.key[0])] = new_;
    }

    int new_leaf(int parent, const i32* key, i64 n) {
        int v = alloc();
        Node& x = nodes_[v];
        x.key.assign(key, key + n);
        x.parent = parent;
        x.depth = nodes_[parent].depth + n;
        link_last(parent, v);
        child_[child_key(parent, key[0])] = v;
        size_ += 1;
        return v;
    }

    int split(int v, i64 at) {
        int parent = nodes_[v].parent;
        int head = alloc();
        Node& h = nodes_[head];
        Node& x = nodes_[v];
        h.key.assign(x.key.begin(), x.key.begin() + at);
        h.parent = parent;
        h.depth = nodes_[parent].depth + at;
        h.pins = x.pins;  // every pin through `v` runs through its new parent
        if (h.pins > 0) pinned_.insert(head);
        replace_child(parent, v, head);
        std::vector<i32>(x.key.begin() + at, x.key.end()).swap(x.key);  // no spare capacity
        x.parent = head;
        link_last(head, v);
        child_[child_key(head, x.key[0])] = v;
        size_ += 1;
        return head;
    }

    void remove_leaf(int v) {
        int parent = nodes_[v].parent;
        child_.erase(child_key(parent, nodes_[v].key[0]));
        unlink(parent, v);
        size_ -= 1;
    }

    int merge_into_child(int v) {
        int c = nodes_[v].first;
        int parent = nodes_[v].parent;
        child_.erase(child_key(v, nodes_[c].key[0]));
        Node& x = nodes_[c];
        std::vector<i32> joined;
        joined.reserve(nodes_[v].key.size() + x.key.size());
        joined.insert(joined.end(), nodes_[v].key.begin(), nodes_[v].key.end());
        joined.insert(joined.end(), x.key.begin(), x.key.end());
        x.key.swap(joined);
        x.parent = parent;
        nodes_[v].first = nodes_[v].last = -1;
        nodes_[v].nchild = 0;
        replace_child(parent, v, c);
        size_ -= 1;
        return c;
    }

    // --- admission (`Judicious`) and the plan ------------------------------------------

    // whether a fully matched node of the last walk ends at `depth` with a state
    bool held(i64 depth) const {
        for (int v : path_)
            if (nodes_[v].depth == depth) return nodes_[v].has_state;
        return false;
    }

    i64 branch_point(i64 n) const {
        if (length_ >= n) return -1;
        if (partial_ >= 0) return length_;
        if (path_.empty()) return -1;
        const Node& x = nodes_[path_.back()];
        if (!x.has_state && x.nchild > 0) return length_;
        return -1;
    }

    PlanOut plan_of(i64 n) const {
        PlanOut plan;
        plan.matched = length_;
        // `Admission.max_hit`: vLLM and SGLang leave one input token to compute
        i64 limit = admit_ == Admit::ALIGN || admit_ == Admit::RADIX ? n - 1 : n;
        if (spec_.ssm == 0) {
            plan.node = path_.empty() ? -1 : path_.back();
            plan.hit = std::min(length_, limit);
        } else {
            for (auto it = path_.rbegin(); it != path_.rend(); ++it) {
                if (nodes_[*it].has_state && nodes_[*it].depth <= limit) {
                    plan.node = *it;
                    break;
                }
            }
            plan.hit = plan.node >= 0 ? nodes_[plan.node].depth : 0;
        }
        return plan;
    }

    // --- room ------------------------------------------------------------------------------

    bool fits(i64 kv_need, i64 states_need) const {
        kv_need += reserved_kv_;  // what running requests hold beside the tree (`reserve`)
        states_need += reserved_states_;
        if (slots_ > 0)  // `Evicting._short_of` with a state pool
            return !(stats.kv_bytes > kv_capacity_ - kv_need ||
                     stats.states > slots_ - states_need);
        i64 limit = capacity_ - kv_need - states_need * spec_.ssm_bytes;
        return !(stats.kv_bytes + stats.ssm_bytes > limit);
    }

  public:
    // Memory held beside the tree (`Evicting.reserve`): a running request's KV and working
    // states in the same capacity. Evicts until the tree fits beside every reservation;
    // false, with nothing reserved or evicted, if the pinned entries and the reservations
    // leave no room even with every unpinned entry gone.
    bool reserve(i64 kv, i64 states) {
        if (kv < 0 || states < 0) throw std::invalid_argument("reserve: kv and states >= 0");
        i64 fkv = reserved_kv_ + kv, fst = reserved_states_ + states;
        for (int v : pinned_) {
            fkv += kv_bytes_of(v);
            fst += nodes_[v].has_state;
        }
        if (slots_ > 0 ? (fkv > kv_capacity_ || fst > slots_)
                       : fkv + fst * spec_.ssm_bytes > capacity_)
            return false;
        reserved_kv_ += kv;
        reserved_states_ += states;
        protect_round_ += 1;  // nothing protected
        need_states_ = 0;
        while (!fits(0, 0)) {
            int v;
            Act act;
            if (!victim(&v, &act)) {  // the policy cannot reach the floor: give it back
                reserved_kv_ -= kv;
                reserved_states_ -= states;
                stats.evicted_then_refused += 1;
                return false;
            }
            evict(v, act);
            if (lists_garbage_) collect_garbage();
        }
        return true;
    }

    void release(i64 kv, i64 states) {
        if (kv < 0 || states < 0 || kv > reserved_kv_ || states > reserved_states_)
            throw std::invalid_argument("release: more than was reserved");
        reserved_kv_ -= kv;
        reserved_states_ -= states;
    }

    i64 reserved_kv() const { return reserved_kv_; }
    i64 reserved_states() const { return reserved_states_; }

  private:

    bool protected_(int v) const {
        return v < static_cast<int>(protect_mark_.size()) && protect_mark_[v] == protect_round_;
    }

    bool make_room(i64 n, int states_need) {
        i64 kv_need = need(length_, n);
        if (fits(kv_need, states_need)) return true;
        protect_round_ += 1;
        if (protect_mark_.size() < nodes_.size()) protect_mark_.resize(nodes_.size(), 0);
        i64 kv = kv_need + reserved_kv_, states = states_need + reserved_states_;
        for (int v : path_) {
            protect_mark_[v] = protect_round_;
            kv += kv_bytes_of(v);
            states += nodes_[v].has_state;
        }
        if (partial_ >= 0) {
            protect_mark_[partial_] = protect_round_;
            kv += kv_bytes_of(partial_);
            states += nodes_[partial_].has_state;
        }
        for (int v : pinned_) {  // `Evicting._feasible`: the pinned and the protected
            if (protected_(v)) continue;
            kv += kv_bytes_of(v);
            states += nodes_[v].has_state;
        }
        if (slots_ > 0 ? (kv > kv_capacity_ || states > slots_)
                       : kv + states * spec_.ssm_bytes > capacity_)
            return false;
        need_states_ = states_need;  // (what SGLang's lists read as the pressure)
        while (!fits(kv_need, states_need)) {
            int v;
            Act act;
            if (!victim(&v, &act)) {
                stats.evicted_then_refused += 1;
                return false;
            }
            evict(v, act);
            if (lists_garbage_) collect_garbage();
        }
        return true;
    }

    void evict(int v, Act act, bool replaced = false) {
        Node& x = nodes_[v];
        bool had = x.has_state;
        i64 state_bytes = had ? spec_.ssm_bytes : 0;
        x.has_state = false;
        i64 kv_bytes = 0;
        i64 depth = x.depth;
        if (act == Act::REMOVE) {
            kv_bytes = kv_bytes_of(v);
            int parent = x.parent;
            remove_leaf(v);
            removed(v);
            if (parent != 0) changed(parent);
            release(v);
        } else if (act == Act::MERGE) {
            if (page_ > 1) throw std::logic_error("a merge under KV pages (not compiled)");
            int c = merge_into_child(v);
            removed(v);
            changed(c);
            release(v);
        } else {  // the state alone: the node stays with its KV
            changed(v);
        }
        if (replaced) {  // `CacheStats.record_replacement`
            stats.states_replaced += 1;
            stats.states -= 1;
        } else {
            stats.evictions += 1;
            stats.states_evicted += state_bytes > 0;
            stats.states -= had;
        }
        stats.kv_bytes -= kv_bytes;
        stats.ssm_bytes -= state_bytes;
        if (log_evictions) freed.push_back({static_cast<int>(act), depth, kv_bytes + state_bytes});
    }

    void add_bytes(i64 kv, i64 ssm, i64 states) {
        stats.kv_bytes += kv;
        stats.ssm_bytes += ssm;
        stats.states += states;
        stats.peak_bytes = std::max(stats.peak_bytes, stats.kv_bytes + stats.ssm_bytes);
    }

    // --- insert (`Inserting._insert`) ---------------------------------------------------

    int insert(const i32* key, i64 n, const std::vector<i64>& wanted) {
        std::vector<i64>& cuts = cuts_;
        cuts.assign(wanted.begin(), wanted.end());
        cuts.push_back(n);
        if (partial_ >= 0 && length_ < n) cuts.push_back(length_);
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        // `at`: the node ending at each depth on the sequence's path (depth -> node)
        std::unordered_map<i64, int>& at = at_;
        at.clear();
        at[0] = 0;
        for (int v : path_) at[nodes_[v].depth] = v;
        // cut the matched part where nodes must end
        std::vector<int> segs(path_);
        if (partial_ >= 0) segs.push_back(partial_);
        std::vector<int> created;
        size_t i = 0;
        for (i64 cut : cuts) {
            if (cut > length_) break;
            if (at.count(cut)) continue;
            while (nodes_[segs[i]].depth < cut) ++i;
            int v = segs[i];
            i64 offset = cut - (nodes_[v].depth - edge_len(v));
            int head = split(v, offset);
            if (nodes_[v].copy) {  // `PageBooks.split`: the copy moves to the head
                nodes_[v].copy = false;
                nodes_[head].copy = true;
            }
            at[cut] = head;
            created.push_back(head);
        }
        // `changed`: the created nodes and their children
        std::vector<int> touched;
        for (int h : created) {
            touched.push_back(h);
            for (int c = nodes_[h].first; c >= 0; c = nodes_[c].next) touched.push_back(c);
        }
        int base = at.at(length_);
        std::vector<int> fresh;
        i64 kv_new = need(length_, n);  // (before the tree changes: `PageBooks.need`)
        if (length_ < n) {
            int parent = base;
            i64 start = length_;
            for (i64 stop : cuts) {
                if (stop <= length_) continue;
                int leaf = new_leaf(parent, key + start, stop - start);
                if (fresh.empty() && start % page_) nodes_[leaf].copy = true;  // `branched`
                fresh.push_back(leaf);
                at[stop] = leaf;
                parent = leaf;
                start = stop;
            }
        }
        if (!fresh.empty() && base != 0) touched.push_back(base);
        for (i64 p : wanted) {
            int v = at.at(p);
            nodes_[v].has_state = true;
            touched.push_back(v);
        }
        int end = at.at(n);
        i64 nw = static_cast<i64>(wanted.size());
        add_bytes(kv_new, nw * spec_.ssm_bytes, nw);
        stats.states_admitted += nw;
        // eviction.on_commit(path to the end, created + new)
        if (evict_ == Evict::KEEP) {
        } else if (multi()) {  // Switchable's experts in its order: scored, LRU, densities
            for (int v : created) { nodes_[v].stamp = touch_value(); candidate_update(v); }
            for (int v : fresh) { nodes_[v].stamp = touch_value(); candidate_update(v); }
            std::vector<int> up;
            for (int v = end; v != 0; v = nodes_[v].parent) up.push_back(v);
            double now = static_cast<double>(clock);
            for (auto it = up.rbegin(); it != up.rend(); ++it) {
                nodes_[*it].stamp_lru = now;
                if (nodes_[*it].nchild == 0) lru_update(*it);
            }
            see_clock();
            for (int v : created) { nodes_[v].stamp_clock = now; candidate_update(v); }
            for (int v : fresh) { nodes_[v].stamp_clock = now; candidate_update(v); }
        } else if (evict_ == Evict::KEYED) {
            std::vector<int> up;
            for (int v = end; v != 0; v = nodes_[v].parent) up.push_back(v);
            if (declared_) declared_commit(up, created, fresh);
            for (auto it = up.rbegin(); it != up.rend(); ++it) {
                set_stamp(*it, static_cast<double>(clock));
                if (nodes_[*it].nchild == 0) changed(*it);
            }
        } else if (two()) {  // the KV of the path touched; new states stamped now
            now_ = static_cast<double>(clock);
            std::vector<int> up;
            for (int v = end; v != 0; v = nodes_[v].parent) up.push_back(v);
            if (tail_safe_) high_water(std::vector<int>(up.rbegin(), up.rend()), created, fresh);
            for (auto it = up.rbegin(); it != up.rend(); ++it) {
                set_stamp(*it, now_);
                lru_update(*it);
            }
            if (lists_garbage_) {  // `TwoListLRU.on_commit`: then the new nodes changed
                for (int v : created) changed(v);
                for (int v : fresh) changed(v);
            }
        } else {
            double now = touch_value();
            see_clock();
            for (int v : created) { set_stamp(v, now); changed(v); }
            for (int v : fresh) { set_stamp(v, now); changed(v); }
        }
        for (int v : touched) changed(v);
        return end;
    }

    // `Placed.superseded`, carried out as `Inserting._grow_in_place`: an earlier final
    // partial block on the committed path, now extended, is merged into its one child
    // (its state replaced, not evicted).
    void grow_in_place(int end, i64 n) {
        std::vector<int> up;
        for (int v = end; v != 0; v = nodes_[v].parent) up.push_back(v);
        std::vector<int> superseded;
        for (auto it = up.rbegin(); it != up.rend(); ++it) {
            const Node& x = nodes_[*it];
            if (x.has_state && x.depth % every_ && x.depth < n) superseded.push_back(*it);
        }
        for (int v : superseded) {
            const Node& x = nodes_[v];
            if (x.alive && x.has_state && x.nchild == 1 && x.pins == 0) evict(v, Act::MERGE, true);
        }
    }

    std::vector<i64> positions_, cuts_;
    std::unordered_map<i64, int> at_;
    std::vector<int> pin_path_;

    // the nodes from the root (excluded) down to `v`, root first
    std::vector<int>& pin_path(int v) {
        if (v <= 0 || v >= static_cast<int>(nodes_.size()) || !nodes_[v].alive)
            throw std::invalid_argument("pin: no such node in the tree");
        pin_path_.clear();
        for (int u = v; u != 0; u = nodes_[u].parent) pin_path_.push_back(u);
        std::reverse(pin_path_.begin(), pin_path_.end());
        return pin_path_;
    }

    // --- the eviction policies -------------------------------------------------------------

    void set_stamp(int v, double t) { nodes_[v].stamp = t; }

    bool scored() const {
        return evict_ == Evict::SCORED;
    }
    bool multi() const { return evict_ == Evict::MULTI; }
    // a scored eviction handed a density's books learns it (`HitDensity`: whatever its score)
    bool learns() const { return scored() && dens_[0].on; }
    // an engine's two LRU lists, KV leaves and states (`Lists`)
    bool two() const { return evict_ == Evict::LISTS; }

    // hit density's `now` at a lookup or a commit (`on_lookup`, `on_commit` set it)
    void see_clock() {
        double now = static_cast<double>(clock);
        if (learns() || multi()) {
            dens_[0].now = now;
            if (dens_[1].on) dens_[1].now = now;
        }
    }

    // what a touch stamps (`Scored.touched`): a leveled score's level, else the clock
    double touch_value() const {
        return score_leveled_ ? level_ : static_cast<double>(clock);
    }

    // LRU's touch of a path (the live cache's LRU stamps its own)
    void touch_path(const std::vector<int>& path) {
        if (evict_ == Evict::KEEP) return;
        double now = static_cast<double>(clock);
        for (int v : path) {
            if (multi()) nodes_[v].stamp_lru = now; else set_stamp(v, now);
            if (nodes_[v].nchild == 0) lru_update(v);
        }
    }

    void on_lookup(int hit) {
        if (evict_ == Evict::KEEP) return;
        if (two()) {  // `TwoListLRU.on_lookup`: the KV up to the hit, and the hit's state
            now_ = static_cast<double>(clock);
            if (hit < 0) return;
            for (int v : path_) {
                set_stamp(v, now_);
                lru_update(v);
                if (v == hit) break;
            }
            nodes_[hit].sstamp = now_;
            nodes_[hit].sstamped = true;
            state_update(hit);
        } else if (evict_ == Evict::KEYED) {
            touch_path(path_);
        } else if (multi()) {  // Switchable's experts in its order: scored, LRU, densities
            if (hit >= 0) { nodes_[hit].stamp = touch_value(); candidate_update(hit); }
            touch_path(path_);
            see_clock();
            if (hit >= 0) {
                Node& x = nodes_[hit];
                if (x.slot >= 0) {
                    dens_[0].count(cls_[x.slot], x.stamp_clock, true);
                    if (dens_[1].on) dens_[1].count(cls2_[x.slot], x.stamp_clock, true);
                }
                x.stamp_clock = static_cast<double>(clock);
                candidate_update(hit);
            }
        } else {
            see_clock();
            if (hit >= 0) {
                if (learns() && nodes_[hit].slot >= 0)
                    dens_[0].count(cls_[nodes_[hit].slot], nodes_[hit].stamp, true);
                set_stamp(hit, touch_value());
                changed(hit);
            }
        }
    }

    void changed(int v) {
        if (two()) {  // `TwoListLRU.changed`: a state gained now is stamped now
            Node& x = nodes_[v];
            if (!x.has_state) x.sstamped = false;
            else if (!x.sstamped) { x.sstamp = now_; x.sstamped = true; }
            lru_update(v);
            state_update(v);
            // garbage: a stateless leaf queued (once) for collection
            if (lists_garbage_ && x.alive && v != 0 && x.nchild == 0 && !x.has_state && !x.in_tomb) {
                tombs_.emplace_back(v, x.uid);
                x.in_tomb = true;
            }
        } else if (evict_ == Evict::KEYED) lru_update(v);
        else if (multi()) { lru_update(v); candidate_update(v); }
        else if (scored()) candidate_update(v);
    }

    void removed(int v) {
        Node& x = nodes_[v];
        if (learns() && x.slot >= 0) dens_[0].count(cls_[x.slot], x.stamp, false);
        if (multi() && x.slot >= 0) {  // each policy counts with its own clock
            dens_[0].count(cls_[x.slot], x.stamp_clock, false);
            if (dens_[1].on) dens_[1].count(cls2_[x.slot], x.stamp_clock, false);
        }
        x.stamp = 0;
        x.stamp_lru = 0;
        x.stamp_clock = 0;
        x.hits = 0;
        x.created = 0;
        if (x.in_order) {
            order_.erase(std::tuple_cat(x.order_key, std::make_tuple(v)));
            x.in_order = false;
        }
        if (x.in_states) {
            states_order_.erase(std::tuple_cat(x.states_key, std::make_tuple(v)));
            x.in_states = false;
        }
        x.sstamped = false;
        x.copy = false;
        x.has_high = false;
        x.in_tomb = false;  // (its entry, if any, stale: the id no longer matches)
        if (x.slot >= 0) drop_slot(v);
    }

    double feature(int f, const Node& x) const {
        switch (f) {
            case 0: return multi() ? x.stamp_lru : x.stamp;  // (marconi+'s keyed expert's own)
            case 1: return static_cast<double>(x.hits);
            case 2: return x.created;
            case 3: return static_cast<double>(x.depth);
            default: return x.has_state ? 1.0 : 0.0;
        }
    }

    // `priority.key_value`: key `k` of node `x`, its terms summed in order
    double key_value(int k, const Node& x) const {
        double total = 0.0;
        for (const Term& t : terms_[k]) {
            double f = feature(t.feature, x);
            if (!std::isnan(t.at_least)) f = f >= t.at_least ? 1.0 : 0.0;
            total += t.weight * f;
        }
        return total;
    }

    // `Ranked.on_commit`'s books: the new nodes deepest first, each split's upper half
    // keeping its first child's count and creation (a fresh node: none, now), then one
    // more commit through every node of the path (`up`, in any order)
    void declared_commit(const std::vector<int>& up, const std::vector<int>& created,
                         const std::vector<int>& fresh) {
        if (!keys_count_) return;  // (kept only where a key reads them)
        double now = static_cast<double>(clock);
        std::vector<int> fresh_nodes(created);
        fresh_nodes.insert(fresh_nodes.end(), fresh.begin(), fresh.end());
        std::sort(fresh_nodes.begin(), fresh_nodes.end(), [this](int a, int b) {
            return nodes_[a].depth > nodes_[b].depth;
        });
        for (int v : fresh_nodes) {
            Node& x = nodes_[v];
            int c = x.first;
            x.hits = c >= 0 ? nodes_[c].hits : 0;
            x.created = c >= 0 ? nodes_[c].created : now;
        }
        for (int v : up) nodes_[v].hits += 1;
    }

    // The leaf order: each live unpinned leaf once, at its declared keys (`Ranked`'s lazy
    // heap, whose valid entries are exactly these), or in the engines' KV lists at its
    // stamp, at equal stamps the shallower first or the deeper (`Lists.shallow_first`).
    void lru_update(int v) {
        Node& x = nodes_[v];
        bool leaf = x.alive && x.nchild == 0 && v != 0 && x.pins == 0;
        if (x.in_order) {
            order_.erase(std::tuple_cat(x.order_key, std::make_tuple(v)));
            x.in_order = false;
        }
        if (leaf) {
            if (!declared_ && !lists_set_)
                throw std::logic_error("a keyed leaf order without its keys (set_keys) or "
                                       "an engine's lists without theirs (set_lists)");
            x.order_key = declared_
                ? std::make_tuple(key_value(0, x), key_value(1, x), x.uid)
                : std::make_tuple(x.stamp, static_cast<double>(lists_shallow_ ? x.depth : -x.depth),
                                  x.uid);
            order_.insert(std::tuple_cat(x.order_key, std::make_tuple(v)));
            x.in_order = true;
        }
    }

    // An engine's state list: each live state once, at its stamp (the Python list's
    // lazy heap, whose valid entries are exactly these); at equal stamps as the KV list.
    void state_update(int v) {
        Node& x = nodes_[v];
        if (x.in_states) {
            states_order_.erase(std::tuple_cat(x.states_key, std::make_tuple(v)));
            x.in_states = false;
        }
        if (x.alive && x.has_state && v != 0 && x.pins == 0) {
            x.states_key = std::make_tuple(x.sstamped ? x.sstamp : 0.0,
                                           lists_shallow_ ? x.depth : -x.depth, x.uid);
            states_order_.insert(std::tuple_cat(x.states_key, std::make_tuple(v)));
            x.in_states = true;
        }
    }

    // `TwoListLRU.victim`, the older head (`ListVictim.OLDER_HEAD`): the older of the two
    // lists' heads (a state on a tie)
    bool head_victim(int* v, Act* act) {
        const Entry* kv = first_free(order_);
        const Entry* st = first_free(states_order_);
        auto head = [](const Entry* e) {
            return std::make_tuple(std::get<0>(*e), std::get<1>(*e), std::get<2>(*e));
        };
        if (st != nullptr && (kv == nullptr || head(st) <= head(kv))) return state_victim(*st, v, act);
        if (kv == nullptr) return false;
        *v = std::get<3>(*kv);
        *act = Act::REMOVE;
        return true;
    }

    // `TwoListLRU.victim` by pool (`ListVictim.SHORT_POOL`): the state list first when
    // states are short of room (the pool's, or their share of one budget, counting the
    // pending insert's), else the KV list; either falls back to the other
    bool pool_victim(int* v, Act* act) {
        i128 ssm = static_cast<i128>(stats.ssm_bytes) +
                   static_cast<i128>(need_states_) * spec_.ssm_bytes;
        bool states_first;
        if (slots_ > 0) {
            states_first = ssm > static_cast<i128>(slots_) * spec_.ssm_bytes;
        } else {  // an integer against a float, exactly (as Python compares them)
            double budget = state_share_ * static_cast<double>(kv_capacity_);
            states_first = budget < 0x1p126 && ssm > static_cast<i128>(std::floor(budget));
        }
        for (int k = 0; k < 2; ++k) {
            if ((k == 0) == states_first) {
                if (const Entry* e = first_free(states_order_)) return state_victim(*e, v, act);
            } else if (const Entry* e = tail_safe_ ? first_tel_safe() : first_free(order_)) {
                *v = std::get<3>(*e);
                *act = Act::REMOVE;
                return true;
            }
        }
        return false;
    }

    // `TwoListLRU._state_victim`, the state list's head `head` given: the state leaving (the
    // head, or the first in the declared score's order), alone, or with its leaf where
    // stateless leaves are garbage
    bool state_victim(const Entry& head, int* v, Act* act) {
        *v = states_by_recency() ? std::get<3>(head) : state_pick();
        *act = lists_garbage_ && nodes_[*v].nchild == 0 ? Act::REMOVE : Act::DROP;
        return true;
    }

    // `TwoListLRU.garbage`, carried out until none is left (`_collect_garbage`): the
    // stateless leaves queued, the last queued first, a protected one queued again
    void collect_garbage() {
        while (true) {
            std::vector<std::pair<int, i64>> kept;
            int found = -1;
            while (!tombs_.empty() && found < 0) {
                auto [u, id] = tombs_.back();
                tombs_.pop_back();
                Node& x = nodes_[u];
                if (x.uid != id || !x.alive) continue;  // gone (the slot may be reused)
                x.in_tomb = false;
                if (x.nchild != 0 || x.has_state || x.pins) continue;  // unpinning queues it again
                if (protected_(u)) kept.emplace_back(u, id); else found = u;
            }
            for (const auto& entry : kept) {
                tombs_.push_back(entry);
                nodes_[entry.first].in_tomb = true;
            }
            if (found < 0) return;
            evict(found, Act::REMOVE);
        }
    }

    // `Score.by_recency` of the state list's score at the alpha now: unset, or every other
    // term weighing 0 and recency more (the list's own LRU order, exactly)
    bool states_by_recency() const {
        if (!state_score_.set) return true;
        if (state_score_.product) return false;
        bool recency = false;
        for (const ScoreTerm& t : state_score_.terms) {
            const double w = t.tuned ? t.weight * alpha_ : t.weight;
            if (t.feature == ScoreFeature::RECENCY) recency = recency || w > 0;
            else if (w != 0) return false;
        }
        return recency;
    }

    // `FlopStates.pick`: among the unprotected states (`rank_states`), the first lowest
    // declared score (`core.scores.order`), recency their rank in the LRU order; with
    // `branches_last`, states at a branch (two or more children) after every other
    int state_pick() {
        rank_states(true);
        const std::vector<int>& nodes = pick_nodes_;
        const size_t n = nodes.size();
        if (n == 0) throw std::logic_error("a state list's pick with no unprotected state");
        state_rank_.resize(n);
        for (size_t i = 0; i < n; ++i) state_rank_[i] = static_cast<double>(i);
        const std::vector<double>& score =
            evaluate(state_score_.terms, state_score_.normalized, state_score_.product, n,
                     [&](ScoreFeature f) -> const std::vector<double>& {
                         return f == ScoreFeature::RECENCY ? state_rank_ : pick_eff_;
                     }, state_out_);
        double best = std::numeric_limits<double>::infinity();
        bool best_last = true;
        size_t found = n;
        for (size_t i = 0; i < n; ++i) {
            bool last = state_branches_last_ && nodes_[nodes[i]].nchild >= 2;
            if (found == n || (!last && best_last) || (last == best_last && score[i] < best)) {
                best = score[i];
                best_last = last;
                found = i;
            }
        }
        return nodes[found];
    }

    // `FlopStates.ranked`: the states (unprotected ones with `skip_protected`) least
    // recently used first into `pick_nodes_`, and into `pick_eff_` each one's efficiency
    // over its parent (`from_parent`) or the nearest state above it, in floats as Python
    // computes it:
    // `(float(F(depth)) - float(F(top))) / (kv x (depth - top) + state)`
    void rank_states(bool skip_protected) {
        pick_nodes_.clear();
        pick_eff_.clear();
        for (const auto& e : states_order_) {
            int u = std::get<3>(e);
            if (skip_protected && protected_(u)) continue;
            pick_nodes_.push_back(u);
            i64 depth = nodes_[u].depth, top = 0;
            if (state_from_parent_) top = nodes_[nodes_[u].parent].depth;  // `parent_node_depth`
            else
                for (int a = nodes_[u].parent; a != 0; a = nodes_[a].parent)
                    if (nodes_[a].has_state) { top = nodes_[a].depth; break; }
            double saved = static_cast<double>(flop_spec_.flops(depth)) -
                           static_cast<double>(flop_spec_.flops(top));
            i64 held = flop_spec_.kv_per_token * (depth - top) + flop_spec_.ssm_bytes;
            pick_eff_.push_back(saved / static_cast<double>(held));
        }
    }

  public:
    // A state list's states in LRU order: (depth, stamp, efficiency) (tests).
    std::vector<std::tuple<i64, double, double>> state_ranks() {
        rank_states(false);
        std::vector<std::tuple<i64, double, double>> out;
        for (size_t i = 0; i < pick_nodes_.size(); ++i)
            out.emplace_back(nodes_[pick_nodes_[i]].depth, nodes_[pick_nodes_[i]].sstamp,
                             pick_eff_[i]);
        return out;
    }

  private:
    std::vector<int> pick_nodes_;
    std::vector<double> pick_eff_, state_rank_, state_out_;

    // FLOP-aware: `Candidates.update` (unpinned, at most one child), rows as `Columns`.
    void candidate_update(int v) {
        Node& x = nodes_[v];
        if (x.alive && v != 0 && x.nchild <= 1 && x.pins == 0) {
            if (x.slot < 0) {
                x.slot = static_cast<int>(cand_.size());
                cand_.push_back(v);
                rec_.push_back(0);
                eff_.push_back(0);
                cls_.push_back(0);
                rec2_.push_back(0);
                cls2_.push_back(0);
            }
            rec_[x.slot] = x.stamp;
            eff_[x.slot] = efficiency(v);
            if (learns() || multi()) cls_[x.slot] = dens_[0].classify(x.nchild, x.depth);
            if (multi()) {
                rec2_[x.slot] = x.stamp_clock;
                if (dens_[1].on) cls2_[x.slot] = dens_[1].classify(x.nchild, x.depth);
            }
        } else if (x.slot >= 0) {
            drop_slot(v);
        }
    }

    void drop_slot(int v) {
        int slot = nodes_[v].slot;
        int last = cand_.back();
        nodes_[v].slot = -1;
        if (last != v) {
            cand_[slot] = last;
            rec_[slot] = rec_.back();
            eff_[slot] = eff_.back();
            cls_[slot] = cls_.back();
            rec2_[slot] = rec2_.back();
            cls2_[slot] = cls2_.back();
            nodes_[last].slot = slot;
        }
        cand_.pop_back();
        rec_.pop_back();
        eff_.pop_back();
        cls_.pop_back();
        rec2_.pop_back();
        cls2_.pop_back();
    }

    double efficiency(int v) const {
        const Node& x = nodes_[v];
        i64 parent_depth = x.parent >= 0 ? nodes_[x.parent].depth : 0;
        i64 held = spec_.kv_per_token * edge_len(v) + (x.has_state ? spec_.ssm_bytes : 0);
        if (held == 0) return 0.0;
        i128 saved = spec_.flops(x.depth) - spec_.flops(parent_depth);
        const i128 exact = static_cast<i128>(1) << 53;
        if (saved < exact && saved > -exact && held < exact)
            return static_cast<double>(saved) / static_cast<double>(held);
        if (exact_div == nullptr) throw std::overflow_error("a FLOP efficiency beyond 2^53 with no exact division");
        return exact_div(static_cast<i64>(saved >> 64), static_cast<unsigned long long>(saved), held);
    }

    // `TwoListLRU._high_water`: a new node (a split's head, a new leaf) takes the deepest mark
    // below it, then every node on the committed path is raised to the path's end
    void high_water(const std::vector<int>& path, const std::vector<int>& created,
                     const std::vector<int>& fresh) {
        for (const std::vector<int>* group : {&created, &fresh}) {
            for (int v : *group) {
                i64 high = nodes_[v].depth;
                for (int c = nodes_[v].first; c >= 0; c = nodes_[c].next)
                    high = std::max(high, nodes_[c].has_high ? nodes_[c].high : nodes_[c].depth);
                nodes_[v].high = high;
                nodes_[v].has_high = true;
            }
        }
        i64 end = path.empty() ? 0 : nodes_[path.back()].depth;
        for (int v : path) {
            Node& x = nodes_[v];
            if ((x.has_high ? x.high : 0) < end) {
                x.high = end;
                x.has_high = true;
            }
        }
    }

    // `TwoListLRU._kv_victim`: the KV list's first unprotected TEL-safe leaf (its edge starts
    // at or past `high + next_prompt - threshold`), else its first unprotected one
    const Entry* first_tel_safe() const {
        for (const Entry& e : order_) {
            int u = std::get<3>(e);
            const Node& x = nodes_[u];
            i64 high = x.has_high ? x.high : x.depth;
            if (!protected_(u) &&
                x.depth - edge_len(u) >= std::max<i64>(high + next_prompt_ - threshold_, 0))
                return &e;
        }
        return first_free(order_);
    }

    // the first entry of an LRU order outside the protected (nullptr: none)
    const Entry* first_free(const std::set<Entry>& order) const {
        for (const Entry& e : order)
            if (!protected_(std::get<3>(e))) return &e;
        return nullptr;
    }

    bool lru_victim(int* v, Act* act) {
        const Entry* e = first_free(order_);
        if (e == nullptr) return false;
        *v = std::get<3>(*e);
        *act = Act::REMOVE;
        return true;
    }

    bool victim(int* v, Act* act) {
        if (evict_ == Evict::KEEP) throw std::logic_error("a cache that keeps everything was asked for a victim");
        if (evict_ == Evict::KEYED) return lru_victim(v, act);
        if (two()) {
            if (!lists_set_) throw std::logic_error("an engine's lists without theirs (set_lists)");
            return lists_by_pool_ ? pool_victim(v, act) : head_victim(v, act);
        }
        size_t n = cand_.size();
        if (multi()) {
            // `Switchable.victim`: a leveled score, when another expert chooses, follows:
            // its level rises to its own lowest score (`Declared.follow`)
            if (run_ != Run::SCORED && score_leveled_ && n > 0) {
                const std::vector<double>& score = flop_scores();
                level_ = std::max(level_, *std::min_element(score.begin(), score.end()));
            }
            if (run_ == Run::KEYED) return lru_victim(v, act);
            if (n == 0) return false;
            if (run_ == Run::SCORED) return scored_victim(v, act);
            return learned_victim(v, act, run_ == Run::LEARNED_0 ? 0 : 1);
        }
        if (n == 0) return false;
        return scored_victim(v, act);
    }

    // `Declared.victim`: the first lowest declared score outside the protected; a leveled
    // score's victim raises the level to its score (`Declared.chose`)
    bool scored_victim(int* v, Act* act) { return first_lowest(flop_scores(), score_leveled_, v, act); }

    // the first lowest of `score` outside the protected; a `leveled` score's victim raises
    // the level to its score
    bool first_lowest(const std::vector<double>& score, bool leveled, int* v, Act* act) {
        size_t n = cand_.size();
        double best = std::numeric_limits<double>::infinity();
        size_t found = n;
        for (size_t i = 0; i < n; ++i) {  // the first lowest outside the protected
            if (protected_(cand_[i])) continue;
            if (score[i] < best) { best = score[i]; found = i; }
        }
        if (found == n) return false;
        if (leveled) level_ = std::max(level_, best);
        *v = cand_[found];
        *act = nodes_[*v].nchild == 0 ? Act::REMOVE : Act::MERGE;
        return true;
    }

  public:
    // The declared score of every candidate now, in slot order (`Declared.scores`, as
    // `core.scores.evaluate` computes it): term by term, the feature min-max normalized
    // over the candidates (all equal: 1; unnormalized: as it is), times its weight unless
    // that is 1 (x alpha where tuned), summed in the declaration's order
    const std::vector<double>& flop_scores() {
        if (learns()) dens_[0].now = static_cast<double>(clock);  // (`HitDensity.scores`)
        return evaluate(score_terms_, score_normalized_, score_product_, cand_.size(),
                        [&](ScoreFeature f) -> const std::vector<double>& {
                            return column(f, rec_, 0);
                        }, score_);
    }

    // marconi+'s live cache: learned expert `k`'s declared score of every candidate now,
    // in slot order, its stamps the clock's (`HitDensity.scores` of that expert)
    const std::vector<double>& learned_scores(int k) {
        const ScoreDecl& d = learned_[k];
        dens_[k].now = static_cast<double>(clock);
        return evaluate(d.terms, d.normalized, d.product, cand_.size(),
                        [&](ScoreFeature f) -> const std::vector<double>& {
                            return column(f, rec2_, k);
                        }, learned_score_);
    }

  private:
    // A candidate's feature `f`, every candidate's (`Declared.values`): `rec` the stamps
    // they read, `table` the learned density (`dens_[table]`, its classes) `DENSITY` reads
    const std::vector<double>& column(ScoreFeature f, const std::vector<double>& rec, int table) {
        return f == ScoreFeature::RECENCY || f == ScoreFeature::LEVEL ? rec
            : f == ScoreFeature::INVERSE_AGE ? inverse_ages(rec)
            : f == ScoreFeature::EFFICIENCY ? eff_
            : f == ScoreFeature::DENSITY ? densities(table, rec) : replay_lengths();
    }

    // `terms` over `n` candidates (`core.scores.evaluate`), into `out`, `column(f)` each
    // one's feature `f`
    template <class Column>
    const std::vector<double>& evaluate(const std::vector<ScoreTerm>& terms, bool normalized,
                                        bool product, size_t n, Column column,
                                        std::vector<double>& out) {
        out.resize(n);
        if (n == 0) return out;
        for (size_t k = 0; k < terms.size(); ++k) {
            const ScoreTerm& term = terms[k];
            const std::vector<double>& x = column(term.feature);
            double lo = x[0], hi = x[0];
            for (size_t i = 1; i < n; ++i) { lo = std::min(lo, x[i]); hi = std::max(hi, x[i]); }
            // built with -ffp-contract=off: no fused multiply-add
            const double weight = term.tuned ? term.weight * alpha_ : term.weight;
            const double span = hi - lo;
            for (size_t i = 0; i < n; ++i) {
                double t = !normalized ? x[i] : hi > lo ? (x[i] - lo) / span : 1.0;
                if (weight != 1.0) t = weight * t;
                out[i] = k == 0 ? t : product ? out[i] * t : out[i] + t;
            }
        }
        return out;
    }

    // `DENSITY` (`HitDensity.values`): learned table `k` at each candidate's class and the
    // bucket of its idle age since `rec`
    const std::vector<double>& densities(int k, const std::vector<double>& rec) {
        if (!dens_[k].on) throw std::logic_error("a score reads a density, and no books were handed");
        const double now = static_cast<double>(clock);
        const std::vector<int>& cls = k == 0 ? cls_ : cls2_;
        term_den_.resize(cand_.size());
        for (size_t i = 0; i < cand_.size(); ++i) term_den_[i] = dens_[k].at(cls[i], now, rec[i]);
        return term_den_;
    }

    // `INVERSE_AGE` (`Declared.values`): `1.0 / (now - t + 1.0)` per
    // candidate, as numpy computes it (the clock a double: exact below 2^53)
    const std::vector<double>& inverse_ages(const std::vector<double>& rec) {
        const double now = static_cast<double>(clock);
        term_rec_.resize(cand_.size());
        for (size_t i = 0; i < cand_.size(); ++i) term_rec_[i] = 1.0 / ((now - rec[i]) + 1.0);
        return term_rec_;
    }

    // `seglen.replay_length` per candidate: tokens from the nearest ancestor holding a
    // state (the root: none), read at each victim (a state above changes it)
    const std::vector<double>& replay_lengths() {
        term_eff_.resize(cand_.size());
        for (size_t i = 0; i < cand_.size(); ++i) {
            int u = nodes_[cand_[i]].parent;
            while (u != 0 && !nodes_[u].has_state) u = nodes_[u].parent;
            term_eff_[i] = static_cast<double>(nodes_[cand_[i]].depth - nodes_[u].depth);
        }
        return term_eff_;
    }

    // marconi+'s learned expert `k` choosing (`Scored.victim`): its first lowest score
    // outside the protected
    bool learned_victim(int* v, Act* act, int k) {
        return first_lowest(learned_scores(k), false, v, act);
    }
};

// `peers.sparse_prefix.place`, operation for operation: the checkpoints (at most `budget`,
// among `depths`, ascending) that maximize `sum (c_i - c_(i-1)) S(c_i)`, into `out`, and
// that sum. Depths are below 2^53 (a Python int times a float is then this product).
inline double place(const std::vector<i64>& depths, const std::vector<double>& survival,
                    int budget, std::vector<i64>& out) {
    out.clear();
    size_t n = depths.size();
    if (budget < 1 || n == 0) return 0.0;
    const double NEG = -std::numeric_limits<double>::infinity();
    std::vector<double> x(n + 1), s(n + 1);
    x[0] = 0; s[0] = 1.0;
    for (size_t j = 0; j < n; ++j) { x[j + 1] = static_cast<double>(depths[j]); s[j + 1] = survival[j]; }
    std::vector<double> prev(n + 1, NEG), cur(n + 1);
    prev[0] = 0.0;
    std::vector<std::vector<size_t>> choice;
    std::vector<size_t> hull;
    double best = 0.0;
    size_t best_m = 0, best_j = 0;
    // `_at`: line i at q; `_useless`: b nowhere above both a and c (x exact: below 2^53)
    auto at = [&](size_t i, double q) { double p = x[i] * q; return prev[i] - p; };
    auto useless = [&](size_t a, size_t b, size_t c) {
        double l = (prev[c] - prev[a]) * (x[b] - x[a]);
        double r = (prev[b] - prev[a]) * (x[c] - x[a]);
        return l >= r;
    };
    for (int m = 1; m <= budget; ++m) {
        std::fill(cur.begin(), cur.end(), NEG);
        std::vector<size_t> back(n + 1, 0);
        hull.clear();
        size_t head = 0;
        for (size_t j = 1; j <= n; ++j) {
            size_t i = j - 1;
            if (prev[i] != NEG) {
                while (hull.size() - head >= 2 && useless(hull[hull.size() - 2], hull.back(), i))
                    hull.pop_back();
                hull.push_back(i);
                head = std::min(head, hull.size() - 1);
            }
            if (hull.size() == head) continue;
            double q = s[j];
            while (hull.size() - head >= 2 && at(hull[head + 1], q) >= at(hull[head], q)) ++head;
            i = hull[head];
            double xq = x[j] * q;
            cur[j] = at(i, q) + xq;
            back[j] = i;
            if (cur[j] > best) { best = cur[j]; best_m = static_cast<size_t>(m); best_j = j; }
        }
        choice.push_back(std::move(back));
        std::swap(prev, cur);
    }
    size_t m = best_m, j = best_j;
    while (m > 0 && j > 0) {
        out.push_back(depths[j - 1]);
        j = choice[m - 1][j];
        m -= 1;
    }
    std::reverse(out.begin(), out.end());
    return best;
}

// The overlap depths learnt (`peers.sparse_prefix.PyDepthBooks` is the oracle): each
// distinct depth (ascending) with the requests learnt at it, and the requests that
// overlapped something (`overlapped`) or nothing (`zeros`). Shares are int / int quotients
// of counts below 2^53, so a double division rounds them as Python's does.
class DepthBooks {
  public:
    std::vector<i64> depths, tally;
    i64 overlapped = 0, zeros = 0;

    void add(i64 depth) {
        if (!depth) { zeros += 1; return; }
        auto it = std::lower_bound(depths.begin(), depths.end(), depth);
        size_t i = static_cast<size_t>(it - depths.begin());
        if (it == depths.end() || *it != depth) {
            depths.insert(it, depth);
            tally.insert(tally.begin() + static_cast<std::ptrdiff_t>(i), 0);
        }
        tally[i] += 1;
        overlapped += 1;
    }

    // distinct depths <= n
    i64 end(i64 n) const {
        return std::upper_bound(depths.begin(), depths.end(), n) - depths.begin();
    }

    i64 count(i64 depth) const {
        auto it = std::lower_bound(depths.begin(), depths.end(), depth);
        return it != depths.end() && *it == depth ? tally[static_cast<size_t>(it - depths.begin())] : 0;
    }

    // `distribution(n, pending)`: the distinct depths up to n and at each the share of the
    // requests overlapping at least that deep, `pending` counted as if learnt
    void distribution(i64 n, bool has_pending, i64 pending, std::vector<i64>& out,
                      std::vector<double>& survival) const {
        out.assign(depths.begin(), depths.begin() + end(n));
        i64 total = overlapped + zeros, over = overlapped;
        if (has_pending) {
            total += 1;
            over += pending > 0;
            if (0 < pending && pending <= n && !count(pending))
                out.insert(std::lower_bound(out.begin(), out.end(), pending), pending);
        }
        survival.clear();
        i64 below = 0;
        size_t j = 0;  // into `depths`, beside `out`
        for (i64 d : out) {
            survival.push_back(static_cast<double>(over - below) / static_cast<double>(total));
            while (j < depths.size() && depths[j] < d) ++j;
            below += (j < depths.size() && depths[j] == d ? tally[j] : 0) +
                     (has_pending && d == pending);
        }
    }

    // `thinned(end, step)`: from the first `end` distinct depths, each kept one the first at
    // least `step` times the last, with its share of the requests overlapping at least it
    void thinned(i64 end, double step, std::vector<i64>& kept, std::vector<double>& share) const {
        kept.clear();
        share.clear();
        double total = static_cast<double>(overlapped + zeros);
        i64 below = 0;
        size_t i = 0, j = 0, stop = static_cast<size_t>(end);
        while (i < stop) {
            while (j < i) below += tally[j++];
            i64 depth = depths[i];
            kept.push_back(depth);
            share.push_back(static_cast<double>(overlapped - below) / total);
            double target = static_cast<double>(depth) * step;
            i = static_cast<size_t>(std::lower_bound(
                    depths.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                    depths.begin() + static_cast<std::ptrdiff_t>(stop), target,
                    [](i64 a, double t) { return static_cast<double>(a) < t; }) -
                depths.begin());
        }
    }
};

}  // namespace marconi
