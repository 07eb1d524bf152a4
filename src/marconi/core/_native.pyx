# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The binding of the compiled core (`native/tree_core.hpp`); used through
`marconi.core.compiled`, which is what the rest of marconi imports."""

from cpython.exc cimport PyErr_CheckSignals
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release,
                             PyObject_GetBuffer)
from libc.stdint cimport int32_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref


cdef extern from "<tuple>" namespace "std" nogil:
    cdef cppclass cpp_tuple3 "std::tuple<long long, double, double>":
        pass
    long long get0 "std::get<0>"(cpp_tuple3&)
    double get1 "std::get<1>"(cpp_tuple3&)
    double get2 "std::get<2>"(cpp_tuple3&)

from marconi.core.stats import CacheStats

cdef extern from "native/tree_core.hpp" namespace "marconi":
    ctypedef long long i64
    ctypedef double (*ExactDiv)(i64, unsigned long long, i64)

    cdef struct Spec:
        i64 kv_per_token, ssm_bytes, attention, mlp, ssm, d_model, d_state

    cdef struct Stats:
        i64 lookups, commits, input_tokens, hit_tokens, hit_requests
        i64 states_admitted, states_evicted, states_not_captured, states_replaced
        i64 evictions, refused_commits, evicted_then_refused
        i64 kv_bytes, ssm_bytes, states, peak_bytes

    cdef struct PlanOut:
        i64 hit, matched
        int node

    cdef struct CommitOut:
        cbool refused
        int end

    cdef struct Freed:
        int action
        i64 depth, bytes

    cdef cppclass Core:
        Core(const Spec&, i64, int, int, double) except +
        Core(const Core&) except +
        Stats stats
        i64 clock
        cbool log_evictions
        vector[Freed] freed
        vector[i64] checkpoints
        vector[i64] admitted
        ExactDiv exact_div
        double alpha()
        void set_alpha(double)
        size_t size()
        PlanOut lookup(const int32_t*, i64) except +
        PlanOut peek(const int32_t*, i64) except +
        CommitOut commit(const int32_t*, i64, i64) except +
        i64 serve(const int32_t*, i64, i64) except +
        i64 serve_checking(const int32_t*, i64, i64) except +
        @staticmethod
        cbool any_negative(const int32_t*, i64)
        vector[int] walk()
        cbool holds(int, i64)
        void pin(int) except +
        void unpin(int) except +
        i64 pins(int)
        int parent(int)
        i64 depth(int)
        i64 uid(int)
        cbool has_state(int)
        cbool copy_of(int)
        double stamp(int)
        const vector[int32_t]& key_of(int)
        void load_node(int, const int32_t*, i64, cbool, cbool) except +
        void set_placement(cbool, i64, cbool) except +
        void set_align(i64, i64, i64, cbool) except +
        void set_pages(i64) except +
        void set_radix(cbool, i64, i64, i64) except +
        void set_pool(i64, i64, double) except +
        cbool reserve(i64, i64) except +
        void release(i64, i64) except +
        i64 reserved_kv()
        i64 reserved_states()
        void set_lists(cbool, cbool, cbool, cbool, i64, i64) except +
        void set_state_score(const Spec&, const vector[int]&, const vector[double]&,
                             const vector[cbool]&, cbool, cbool, cbool, cbool) except +
        void set_score_terms(const vector[int]&, const vector[double]&,
                             const vector[cbool]&, cbool, cbool) except +
        void set_learned_terms(int, const vector[int]&, const vector[double]&,
                               const vector[cbool]&, cbool, cbool) except +
        const vector[double]& learned_scores(int) except +
        void set_keys(const vector[int]&, const vector[int]&, const vector[double]&,
                      const vector[double]&) except +
        void load_done(const double*, i64) except +
        string check()
        vector[cpp_tuple3] candidates()
        const vector[double]& flop_scores() except +
        vector[cpp_tuple3] state_ranks()
        void set_positions(const i64*, i64, cbool)
        void set_density(int, const vector[double]&, const vector[double]&,
                         const vector[double]&, const vector[i64]&, const vector[double]&,
                         const vector[double]&, const vector[double]&, i64, i64, double,
                         double, double, int) except +
        double level()
        void set_level(double)
        void set_run(int) except +
        int run()
        i64 counted(int)
        const vector[double]& density_hits(int)
        const vector[double]& density_events(int)
        const vector[double]& density_table(int)
        vector[int] classes(int)
        vector[double] clock_stamps()


cdef extern from "native/tree_core.hpp" namespace "marconi":
    double place_cpp "marconi::place"(const vector[i64]&, const vector[double]&, int,
                                      vector[i64]&) except +


cdef extern from "native/tree_core.hpp" namespace "marconi":
    cdef cppclass DepthBooksCpp "marconi::DepthBooks":
        vector[i64] depths
        vector[i64] tally
        i64 overlapped
        i64 zeros
        void add(i64)
        i64 end(i64)
        i64 count(i64)
        void distribution(i64, cbool, i64, vector[i64]&, vector[double]&)
        void thinned(i64, double, vector[i64]&, vector[double]&)


cdef class DepthBooks:
    """The overlap depths learnt (`marconi.core.compiled.DepthBooks` wraps it)."""

    cdef DepthBooksCpp books

    def add(self, i64 depth):
        self.books.add(depth)

    def end(self, i64 n):
        return self.books.end(n)

    def count(self, i64 depth):
        return self.books.count(depth)

    @property
    def overlapped(self):
        return self.books.overlapped

    @property
    def zeros(self):
        return self.books.zeros

    def depths(self):
        return list(self.books.depths)

    def distribution(self, i64 n, pending):
        cdef vector[i64] out
        cdef vector[double] survival
        self.books.distribution(n, pending is not None, 0 if pending is None else pending,
                                out, survival)
        return list(out), list(survival)

    def thinned(self, i64 end, double step):
        cdef vector[i64] kept
        cdef vector[double] share
        if end < 0 or <size_t>end > self.books.depths.size():
            raise ValueError(f"thinned: end {end} outside [0, {self.books.depths.size()}]")
        self.books.thinned(end, step, kept, share)
        return list(kept), list(share)

    def take(self):
        return (list(self.books.depths), list(self.books.tally), self.books.overlapped,
                self.books.zeros)

    def load(self, depths, tally, i64 overlapped, i64 zeros):
        self.books.depths = depths
        self.books.tally = tally
        self.books.overlapped = overlapped
        self.books.zeros = zeros


def place(depths, survival, int budget):
    """`peers.sparse_prefix.place` (the Python one is its oracle): the best checkpoints
    (ascending) and their expected reuse. Depths must be below 2^53 (the caller checks)."""
    cdef vector[i64] d = depths
    cdef vector[double] s = survival
    cdef vector[i64] out
    if d.size() != s.size():
        raise ValueError("place: depths and survival differ in length")
    cdef double best = place_cpp(d, s, budget, out)
    return best, tuple(out)


cdef double _exact_div(i64 hi, unsigned long long lo, i64 held) noexcept with gil:
    """Python's correctly rounded int / int, for a quotient beyond doubles' exact range."""
    return ((<object>hi << 64) | <object>lo) / <object>held


ADMISSIONS = {"placed": 0, "align": 1, "radix": 2}
EVICTIONS = {"ranked": 0, "scored": 1, "keep": 2, "switchable": 3,
             "blocklru": 4, "blockflop": 4, "radixlru": 4, "radixflop": 4,
             "radixtlru": 4}
ACTIONS = ("remove", "merge", "drop-state")


cdef Spec _spec(dict spec):
    cdef Spec s
    s.kv_per_token = spec["kv_per_token"]
    s.ssm_bytes = spec["ssm_bytes"]
    s.attention = spec["attention"]
    s.mlp = spec["mlp"]
    s.ssm = spec["ssm"]
    s.d_model = spec["d_model"]
    s.d_state = spec["d_state"]
    return s


cdef class NativeCore:
    """One compiled cache: token keys in, hits, plans and counters out."""

    cdef Core* core

    def __cinit__(self, dict spec=None, i64 capacity=0, str admission="placed",
                  str eviction="keep", double alpha=0.0):
        cdef Spec s
        self.core = NULL
        if spec is None:  # `copy` fills it
            return
        s = _spec(spec)
        self.core = new Core(s, capacity, ADMISSIONS[admission], EVICTIONS[eviction], alpha)
        self.core.exact_div = _exact_div

    def __dealloc__(self):
        if self.core != NULL:
            del self.core

    def copy(self):
        """An independent copy: the same tree, books, clock and counters."""
        cdef NativeCore out = NativeCore()
        out.core = new Core(deref(self.core))
        return out

    # --- vLLM's align mode and block queue, KV pages ----------------------------------------

    def set_placement(self, cbool branch, i64 every, cbool end):
        """A declared placement (`Core::set_placement`; none set: nothing cached)."""
        self.core.set_placement(branch, every, end)

    def set_align(self, i64 block, i64 chunk, retention, cbool junctions):
        """vLLM's align-mode admission (`Core::set_align`; `retention` None: every block)."""
        self.core.set_align(block, chunk, -1 if retention is None else retention, junctions)

    def set_radix(self, cbool extra, i64 chunk, i64 track, i64 decode_interval):
        """SGLang's admission (`Core::set_radix`)."""
        self.core.set_radix(extra, chunk, track, decode_interval)

    def set_pool(self, i64 slots, i64 kv_capacity, double state_share):
        """A state pool beside the KV (`Core::set_pool`; 0 slots: one byte budget)."""
        self.core.set_pool(slots, kv_capacity, state_share)

    def reserve(self, i64 kv, i64 states):
        """Hold `kv` bytes and `states` states beside the tree (`Core::reserve`)."""
        return self.core.reserve(kv, states)

    def release(self, i64 kv, i64 states):
        """Give back what `reserve` held (`Core::release`)."""
        self.core.release(kv, states)

    @property
    def reserved(self):
        """(KV bytes, states) held beside the tree."""
        return self.core.reserved_kv(), self.core.reserved_states()

    def set_pages(self, i64 page):
        """KV in pages of `page` tokens (`Core::set_pages`)."""
        self.core.set_pages(page)

    def set_lists(self, cbool by_pool, cbool shallow_first, cbool garbage,
                  cbool tail_safe=False, i64 threshold=0, i64 next_prompt=0):
        """An engine's two lists, declared (`Core::set_lists`)."""
        self.core.set_lists(by_pool, shallow_first, garbage, tail_safe, threshold, next_prompt)

    def set_state_score(self, dict spec, feature, weight, tuned, cbool normalized,
                        cbool product, cbool from_parent, cbool branches_last):
        """An engine's state list ordered by a declared score (`Core::set_state_score`),
        efficiencies from `spec`."""
        self.core.set_state_score(_spec(spec), feature, weight, tuned, normalized, product,
                                  from_parent, branches_last)

    def set_keys(self, key, feature, weight, at_least):
        """A declared priority's leaf order (`Core::set_keys`): per term its key (0, 1),
        feature (0-4), weight and step threshold (NaN: none)."""
        self.core.set_keys(key, feature, weight, at_least)

    def set_score_terms(self, feature, weight, tuned, cbool normalized=True,
                        cbool product=False):
        """A declared score's terms (`Core::set_score_terms`): per term its feature (0
        recency, 1 inverse age, 2 efficiency, 3 replay length, 4 level, 5 the learned
        density), weight and whether alpha multiplies it; whether the terms are min-max
        normalized; whether multiplied."""
        self.core.set_score_terms(feature, weight, tuned, normalized, product)

    def set_learned_terms(self, int k, feature, weight, tuned, cbool normalized=True,
                          cbool product=False):
        """marconi+'s live cache: learned expert `k`'s declared score
        (`Core::set_learned_terms`), as `set_score_terms` takes one."""
        self.core.set_learned_terms(k, feature, weight, tuned, normalized, product)

    # --- structured admission, GreedyDual-FLOP, hit density --------------------------------

    def set_positions(self, positions, cbool given):
        """Structured admission's positions for the next calls (`Core::set_positions`)."""
        cdef vector[i64] p
        for x in positions:
            p.push_back(x)
        self.core.set_positions(p.data(), p.size(), given)

    def set_density(self, int k, start, age_vec, age_one, depth_from, hits, events, density,
                    i64 counted, i64 every, double decay, double prior_hits,
                    double prior_events, int depth_classes):
        """Learned density `k`'s books (0; 1: marconi+'s live cache's second)."""
        self.core.set_density(k, start, age_vec, age_one, depth_from, hits, events, density,
                              counted, every, decay, prior_hits, prior_events, depth_classes)

    def set_run(self, int run):
        """marconi+'s live cache: the expert choosing victims (0 its declared score, 1 its
        declared priority, 2 + k its learned expert k)."""
        self.core.set_run(run)

    @property
    def run(self):
        return self.core.run()

    def clock_stamps(self):
        """marconi+'s live cache: each candidate's touch as hit density knows it."""
        return list(self.core.clock_stamps())

    @property
    def level(self):
        return self.core.level()

    def set_level(self, double level):
        self.core.set_level(level)

    def density_state(self, int k=0):
        """Hit density `k`'s books: (hits, events, density) row-major by class, and the
        events counted."""
        return (list(self.core.density_hits(k)), list(self.core.density_events(k)),
                list(self.core.density_table(k)), self.core.counted(k))

    def classes(self, int k=0):
        """Hit density `k`'s class of each candidate, in slot order."""
        return list(self.core.classes(k))

    # --- requests: `key` is int32 token bytes (checked by the caller) ---------------------

    def lookup(self, bytes key not None):
        cdef PlanOut p = self.core.lookup(<const int32_t*><const char*>key, len(key) // 4)
        return p.hit, p.matched, tuple(self.core.checkpoints), p.node

    def peek(self, bytes key not None):
        cdef PlanOut p = self.core.peek(<const int32_t*><const char*>key, len(key) // 4)
        return p.hit, p.matched, tuple(self.core.checkpoints), p.node

    def commit(self, bytes key not None, i64 n_input):
        cdef CommitOut c = self.core.commit(<const int32_t*><const char*>key, len(key) // 4,
                                            n_input)
        return c.refused, tuple(self.core.admitted), c.end

    def serve(self, bytes key not None, i64 n_input):
        return self.core.serve(<const int32_t*><const char*>key, len(key) // 4, n_input)

    def serve_array(self, object tokens, i64 n_input):
        """`serve` from a contiguous int32 array (the caller checked its type), its ids
        checked here: None when one is negative (the caller words the refusal), else the
        hit. Read through the buffer protocol: no copy, no view object."""
        cdef Py_buffer view
        PyObject_GetBuffer(tokens, &view, PyBUF_C_CONTIGUOUS)
        cdef i64 n = view.len // 4
        cdef const int32_t* data = <const int32_t*>view.buf
        cdef i64 hit
        try:
            if view.itemsize != 4:
                raise ValueError("serve: tokens must be int32")
            if not 0 < n_input <= n:
                raise ValueError(f"serve: n_input={n_input!r} outside [1, {n}]")
            hit = self.core.serve_checking(data, n, n_input)
            return None if hit < 0 else hit
        finally:
            PyBuffer_Release(&view)

    def serve_arrays(self, list arrays not None, const i64[::1] n_input,
                     i64[::1] hits, i64[::1] kv, i64[::1] ssm, Py_ssize_t start):
        """`serve_array` over `arrays[start:]` in turn, request j's hit and the cache's KV
        and state bytes after it written to `hits[j]`, `kv[j]`, `ssm[j]`. Stops at the
        first request it cannot take as it is (not a C-contiguous native int32 array, an
        `n_input` out of range, a negative id) and returns its index, before touching the
        cache for it (the caller serves that one its own way, with its error); else
        `len(arrays)`."""
        cdef Py_buffer view
        cdef Py_ssize_t j, m = len(arrays)
        cdef i64 n, k, hit
        cdef const int32_t* data
        cdef bytes fmt
        for j in range(start, m):
            try:
                PyObject_GetBuffer(arrays[j], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            except (BufferError, TypeError):
                return j
            try:
                fmt = view.format if view.format != NULL else b"B"
                if view.itemsize != 4 or view.ndim != 1 or fmt not in (b"i", b"=i", b"<i"):
                    return j
                n, k = view.len // 4, n_input[j]
                data = <const int32_t*>view.buf
                if not 0 < k <= n:
                    return j
                hit = self.core.serve_checking(data, n, k)
                if hit < 0:
                    return j
                hits[j] = hit
                kv[j] = self.core.stats.kv_bytes
                ssm[j] = self.core.stats.ssm_bytes
            finally:
                PyBuffer_Release(&view)
        return m

    # --- knobs and counters --------------------------------------------------------------

    @property
    def alpha(self):
        return self.core.alpha()

    def set_alpha(self, double alpha):
        self.core.set_alpha(alpha)

    @property
    def clock(self):
        return self.core.clock

    @property
    def size(self):
        return self.core.size()

    def depth(self, int node):
        return self.core.depth(node)

    def stats(self):
        """The counters as a `CacheStats` (a copy)."""
        return CacheStats(**(<object>self.core.stats))

    @property
    def kv_bytes(self):
        return self.core.stats.kv_bytes

    @property
    def ssm_bytes(self):
        return self.core.stats.ssm_bytes


    # --- evictions log, snapshots, checks -------------------------------------------------

    def log_evictions(self, cbool on=True):
        self.core.log_evictions = on

    # --- pins: a node is named by its slot and uid (`uid`), checked before use -----------

    def uid(self, int slot):
        """The uid of the node in `slot` (a node handed out is named by both)."""
        return self.core.uid(slot)

    def holds(self, int slot, i64 uid):
        """Whether `slot` still holds the node `uid`."""
        return self.core.holds(slot, uid)

    def pin(self, int slot):
        """`PrefixCache.pin` of the node in `slot` (the caller checked it with `holds`)."""
        self.core.pin(slot)

    def unpin(self, int slot):
        """`PrefixCache.unpin`; ValueError, nothing changed, if it is not pinned."""
        self.core.unpin(slot)

    def pins(self, int slot):
        return self.core.pins(slot)

    def drain_freed(self):
        """Evictions since the last drain: (action, depth, bytes freed)."""
        out = [(ACTIONS[f.action], f.depth, f.bytes) for f in self.core.freed]
        self.core.freed.clear()
        return out

    def take(self):
        """The tree in `RadixTree.nodes()` order: parents (index, -1 for the root), edges
        (int32 bytes), states, stamps."""
        cdef vector[int] order = self.core.walk()
        cdef dict index = {}
        cdef list parents = [], keys = [], states = [], stamps = []
        cdef int i, v
        cdef const vector[int32_t]* key
        for i in range(<int>order.size()):
            v = order[i]
            index[v] = i
        for i in range(<int>order.size()):
            v = order[i]
            parents.append(index.get(self.core.parent(v), -1))
            key = &self.core.key_of(v)
            keys.append((<const char*>key.data())[:key.size() * 4])
            states.append(bool(self.core.has_state(v)))
            stamps.append(self.core.stamp(v))
        return parents, keys, states, stamps

    def copies(self):
        """Whether each node (in `take`'s order) holds its own copy of its first page."""
        return [bool(self.core.copy_of(v)) for v in self.core.walk()]

    def load(self, parents, keys, states, stamps, i64 clock, copies=None):
        """Fill this empty cache as `snapshot.rebuild` fills a `PrefixCache` (`copies`:
        the page copies, none by default)."""
        cdef bytes key
        cdef vector[double] times
        if copies is None or not len(copies):
            copies = [False] * len(keys)
        for parent, key, state, copy in zip(parents, keys, states, copies):
            self.core.load_node(parent, <const int32_t*><const char*>key, len(key) // 4, state,
                                copy)
        for t in stamps:
            times.push_back(t)
        self.core.load_done(times.data(), clock)

    def candidates(self):
        """FLOP-aware candidates in row order: (depth, last touch, efficiency)."""
        cdef vector[cpp_tuple3] out = self.core.candidates()
        return [(get0(out[i]), get1(out[i]), get2(out[i])) for i in range(<int>out.size())]

    def learned_scores(self, int k):
        """marconi+'s live cache: learned expert `k`'s score of every candidate now, in
        slot order."""
        return list(self.core.learned_scores(k))

    def flop_scores(self):
        """FLOP-aware eviction's score of each candidate now, in row order."""
        return list(self.core.flop_scores())

    def state_ranks(self):
        """The block queue's states least recently used first: (depth, stamp, efficiency)
        as `BlockFlop` ranks them."""
        cdef vector[cpp_tuple3] out = self.core.state_ranks()
        return [(get0(out[i]), get1(out[i]), get2(out[i])) for i in range(<int>out.size())]

    def check(self):
        cdef string fault = self.core.check()
        if fault.size():
            raise AssertionError(f"compiled core: {fault.decode()}")


# --- the serving replay's loop (`native/serving.hpp`) ---------------------------------------

cdef extern from "native/serving.hpp" namespace "marconi":
    cdef cppclass SeenTreeCpp "marconi::SeenTree":
        SeenTreeCpp() except +
        i64 tokens
        pair[i64, i64] lookup(const int32_t*, i64) except +
        void commit(const int32_t*, i64, i64) except +

    ctypedef int (*Notify)(void*, int, i64, i64)

    cdef cppclass ServeIn:
        i64 n
        vector[int32_t*] tokens
        const i64* n_input
        const i64* n_output
        const double* arrival
        const i64* after
        i64 max_running, chunk_tokens
        double decode_s
        int visibility
        cbool hold
        i64 page, kv_per_token
        Spec latency_spec
        double rate, overhead_s
        i64 bound_limit
        Notify notify
        void* ctx
        int events
        Notify interrupted

    cdef cppclass ServeOut:
        i64* hit
        i64* kv_bytes
        i64* ssm_bytes
        i64* bound
        i64* seen
        i64* from_inputs
        double* issued
        double* scheduled
        double* first_token
        double* finished
        i64* order
        i64 waited, max_running, unreserved, dropped
        double makespan

    cdef cppclass Server:
        Server(const ServeIn&, ServeOut&, Core&, Core*, SeenTreeCpp*) except +
        void run() except + nogil

    void dependents_cpp "marconi::dependents"(const ServeIn&, const i64*, i64*)


cdef int _interrupted(void* ctx, int kind, i64 i, i64 x) noexcept with gil:
    """Whether a signal's handler raised (Ctrl-C): its error kept on `ctx` (`error`)."""
    hook = <object>ctx
    try:
        PyErr_CheckSignals()
        return 0
    except BaseException as err:
        hook.error = err
        return -1


cdef class _Quiet:
    """The hook of a loop nobody follows: no events, a place for a signal's error."""

    cdef public object error
    cdef public int events


cdef int _tell(void* ctx, int kind, i64 i, i64 x) noexcept with gil:
    """The loop's hook: `ctx`'s `tell(kind, i, x)`; an error is kept on it (`error`)."""
    hook = <object>ctx
    try:
        hook.tell(kind, i, x)
        return 0
    except BaseException as err:
        hook.error = err
        return -1


def serve_loop(NativeCore cache not None, NativeCore bound, list tokens not None,
               const i64[::1] n_input, const i64[::1] n_output, const double[::1] arrival,
               const i64[::1] session, dict server not None, dict out not None,
               object hook=None):
    """The serving replay (`marconi.core.serving._Server`) of requests whose whole tokens
    (input then output) are `tokens[i]`, in the compiled core; with `bound` (the unbounded
    cache), the served bounds too (`sim.replay._ServedBounds`). `server`: the loop's
    settings (`ServeIn`'s fields, `session` None: every request open loop); `out`: arrays
    of length n it fills (`ServeOut`'s), and its totals are written back into it. False,
    nothing touched, when a request's tokens are not a C-contiguous native int32 array of
    its length with no negative id (the caller serves them its own way, with its error).
    `hook`: told of the events its `events` bits name (`tell(kind, i, x)`, the Python
    loop's places: 1 scheduled with its hit, 2 shown with its length, 4 finished; 8 and
    16 right before a lookup (x -1) or commit (x -2: the whole; else the input length
    shown) in the cache and in `bound`, for an admission's positions); an error it raises
    stops the loop and is raised here."""
    cdef ServeIn sin
    cdef ServeOut sout
    cdef SeenTreeCpp seen
    cdef vector[Py_buffer] views
    cdef Py_buffer view
    cdef Py_ssize_t j, m = len(tokens)
    cdef bytes fmt
    cdef i64[::1] after = _i64(out, "after", m)
    cdef i64[::1] hit = _i64(out, "hit", m), kv = _i64(out, "kv_bytes", m)
    cdef i64[::1] ssm = _i64(out, "ssm_bytes", m), bnd = _i64(out, "bound", m)
    cdef i64[::1] sn = _i64(out, "seen", m), fin = _i64(out, "from_inputs", m)
    cdef i64[::1] order = _i64(out, "order", m)
    cdef double[::1] issued = _f64(out, "issued", m), scheduled = _f64(out, "scheduled", m)
    cdef double[::1] first = _f64(out, "first_token", m), finished = _f64(out, "finished", m)
    if not (n_input.shape[0] == n_output.shape[0] == arrival.shape[0] == m) or m == 0:
        raise ValueError(f"serve_loop: {m} requests, per-request arrays of other lengths")
    if session is not None and session.shape[0] != m:
        raise ValueError(f"serve_loop: {m} requests, {session.shape[0]} session codes")
    try:
        for j in range(m):
            try:
                PyObject_GetBuffer(tokens[j], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            except (BufferError, TypeError):
                return False
            views.push_back(view)
            fmt = view.format if view.format != NULL else b"B"
            if (view.itemsize != 4 or view.ndim != 1 or fmt not in (b"i", b"=i", b"<i")
                    or view.len // 4 != n_input[j] + n_output[j] or n_input[j] < 1
                    or n_output[j] < 0
                    or cache.core.any_negative(<const int32_t*>view.buf, view.len // 4)):
                return False
            sin.tokens.push_back(<int32_t*>view.buf)
        sin.n = m
        sin.n_input = &n_input[0]
        sin.n_output = &n_output[0]
        sin.arrival = &arrival[0]
        if session is None:
            after[:] = -1
        else:
            dependents_cpp(sin, &session[0], &after[0])
        sin.after = &after[0]
        sin.max_running = server["max_running"]
        sin.chunk_tokens = server["chunk_tokens"]
        sin.decode_s = server["decode_s"]
        sin.visibility = server["visibility"]
        sin.hold = server["hold"]
        sin.page = server["page"]
        sin.kv_per_token = server["kv_per_token"]
        sin.latency_spec = _spec(server["latency_spec"])
        sin.rate = server["rate"]
        sin.overhead_s = server["overhead_s"]
        sin.bound_limit = server["bound_limit"]
        if hook is None:
            hook = _Quiet()
        hook.error = None
        sin.notify, sin.ctx, sin.events = _tell, <void*>hook, hook.events
        sin.interrupted = _interrupted
        sout.hit, sout.kv_bytes, sout.ssm_bytes = &hit[0], &kv[0], &ssm[0]
        sout.bound, sout.seen, sout.from_inputs = &bnd[0], &sn[0], &fin[0]
        sout.issued, sout.scheduled = &issued[0], &scheduled[0]
        sout.first_token, sout.finished, sout.order = &first[0], &finished[0], &order[0]
        sout.waited = sout.max_running = sout.unreserved = 0
        sout.dropped = -1
        sout.makespan = 0.0
        try:
            _run_server(sin, sout, cache, bound, seen)
        except Exception as err:
            if hook.error is not None:  # the hook's own error, or a signal's
                raise hook.error
            if isinstance(err, RuntimeError):  # std::logic_error: the Python loop's
                raise AssertionError(str(err)) from None  # AssertionError
            raise
        out.update(waited=sout.waited, max_running=sout.max_running,
                   unreserved=sout.unreserved, makespan=sout.makespan,
                   dropped=None if sout.dropped < 0 else sout.dropped)
        return True
    finally:
        for j in range(<Py_ssize_t>views.size()):
            PyBuffer_Release(&views[j])


cdef void _run_server(ServeIn& sin, ServeOut& sout, NativeCore cache, NativeCore bound,
                      SeenTreeCpp& seen) except *:
    cdef Core* bound_core = NULL
    cdef SeenTreeCpp* seen_tree = NULL
    if bound is not None:
        bound_core, seen_tree = bound.core, &seen
    cdef Server* s = new Server(sin, sout, deref(cache.core), bound_core, seen_tree)
    try:
        with nogil:  # other threads run beside it (the tuner's replays); hooks take the GIL
            s.run()
    finally:
        del s


cdef i64[::1] _i64(dict out, str name, Py_ssize_t m):
    cdef i64[::1] a = out[name]
    if a.shape[0] != m:
        raise ValueError(f"serve_loop: out[{name!r}] holds {a.shape[0]}, not {m}")
    return a


cdef double[::1] _f64(dict out, str name, Py_ssize_t m):
    cdef double[::1] a = out[name]
    if a.shape[0] != m:
        raise ValueError(f"serve_loop: out[{name!r}] holds {a.shape[0]}, not {m}")
    return a


cdef class SeenTree:
    """`marconi.sim.bounds.SeenTree` in the compiled core: every committed sequence, the
    longest prefix of an input seen before and how much of it was seen within an input."""

    cdef SeenTreeCpp* tree

    def __cinit__(self):
        self.tree = new SeenTreeCpp()

    def __dealloc__(self):
        del self.tree

    @property
    def tokens(self):
        """Distinct tokens held."""
        return self.tree.tokens

    def lookup(self, const int32_t[::1] tokens not None):
        """(seen, from_inputs) for an input."""
        if tokens.shape[0] == 0:
            return 0, 0
        cdef pair[i64, i64] out = self.tree.lookup(&tokens[0], tokens.shape[0])
        return out.first, out.second

    def commit(self, const int32_t[::1] tokens not None, i64 n_input):
        """Hold a sequence whose first `n_input` tokens were its input."""
        if tokens.shape[0]:
            self.tree.commit(&tokens[0], tokens.shape[0], n_input)
