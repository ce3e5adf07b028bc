// The host execution of CUDA C kernels: the library every kernel's library is linked to (the
// scheduler, the race records, the time limit's watch, the faults in words, the signal handlers),
// compiled once for each compiler and header (minitfm/cudahost/build.py). cuda_host.h is the
// model's first half and explains it; one launch runs at a time in a process, so the state of the
// launch under way is this library's, shared by every kernel.

#include "cuda_host.h"

namespace minitfm {

// ---- fibers: a stack each, switched by saving and restoring the callee-saved registers ----------

#ifdef MINITFM_OWN_SWITCH
extern "C" void minitfm_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
asm(".text\n.p2align 4\n.hidden minitfm_switch\n.globl minitfm_switch\n"
    ".type minitfm_switch, @function\nminitfm_switch:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size minitfm_switch, .-minitfm_switch\n");
static const int SAVED = 7;          // six registers and the return address
static const int RETURN_SLOT = 6;
#else
asm(".text\n.p2align 4\n.hidden minitfm_switch\n.globl minitfm_switch\n"
    ".type minitfm_switch, %function\nminitfm_switch:\n"
    "sub sp, sp, #176\n"
    "stp x19, x20, [sp, #0]\nstp x21, x22, [sp, #16]\nstp x23, x24, [sp, #32]\n"
    "stp x25, x26, [sp, #48]\nstp x27, x28, [sp, #64]\nstp x29, x30, [sp, #80]\n"
    "stp d8, d9, [sp, #96]\nstp d10, d11, [sp, #112]\nstp d12, d13, [sp, #128]\n"
    "stp d14, d15, [sp, #144]\n"
    "mov x2, sp\nstr x2, [x0]\nmov sp, x1\n"
    "ldp x19, x20, [sp, #0]\nldp x21, x22, [sp, #16]\nldp x23, x24, [sp, #32]\n"
    "ldp x25, x26, [sp, #48]\nldp x27, x28, [sp, #64]\nldp x29, x30, [sp, #80]\n"
    "ldp d8, d9, [sp, #96]\nldp d10, d11, [sp, #112]\nldp d12, d13, [sp, #128]\n"
    "ldp d14, d15, [sp, #144]\n"
    "add sp, sp, #176\nret\n"
    ".size minitfm_switch, .-minitfm_switch\n");
static const int SAVED = 22;         // 176 bytes: x19-x30, d8-d15, and padding
static const int RETURN_SLOT = 11;   // x30
#endif
static inline void switch_to(Context& from, Context& to) { minitfm_switch(&from.sp, to.sp); }
static void start_context(Context& c, char* stack, size_t size, void (*entry)()) {
    uintptr_t top = (uintptr_t)(stack + size) & ~(uintptr_t)15;
#if defined(__x86_64__)
    void** sp = (void**)(top - 8) - SAVED;     // `ret` enters with rsp = top - 8, as a call does
    sp[SAVED] = nullptr;                       // the entry's own return address: it never returns
#else
    void** sp = (void**)top - SAVED;
#endif
    for (int i = 0; i < SAVED; ++i) sp[i] = nullptr;
    sp[RETURN_SLOT] = (void*)entry;
    c.sp = sp;
}
#else
static inline void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
static void start_context(Context& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

// ---- the state of the launch under way ---------------------------------------------------------

static const size_t LOCAL_MEMORY = 512 * 1024;         // a device thread's local memory, at most
// per thread, the model's frames too: a 512 KiB local array overflows, as on a device, where the
// locals (and spills) of a thread may take LOCAL_MEMORY in all
static const size_t STACK = LOCAL_MEMORY;
static const size_t GUARD = 1024 * 1024;               // below each stack: an overflow faults
static const int MAX_THREADS = 1024;
static const int MAX_SHARED = 64;

static Thread threads[MAX_THREADS];
static int n_threads = 0;
Thread* current = nullptr;
static Context scheduler;
uint3 block_index;
dim3 block_dim, grid_dim;
static long long block_number = 0;           // linear index of the block under way, + 1
static unsigned int epoch = 0;               // moves on at each block and at each barrier
static unsigned int warp_epochs[MAX_THREADS / 32];
static Fault* fault = nullptr;
static bool failed = false, fiber_mode = false;
static char* direct_stack = nullptr;         // without fibers: the stack every thread runs on
static Context direct;                       // ... and its context
static const int* direct_order = nullptr;    // ... the threads of the block, in their order
static void (*body)(void**) = nullptr;
static void** body_args = nullptr;
static SharedBase* shared_objects[MAX_SHARED];
static int n_shared = 0;
static int body_first = 0, body_last = 0;    // the lines of the kernel's own body

// `out` (a string in `room` bytes) with the words of `fmt` added, as many as fit.
static void append(char* out, size_t room, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char* out, size_t room, const char* fmt, ...) {
    size_t used = strlen(out);
    if (used + 1 >= room) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, room - used, fmt, ap);
    va_end(ap);
}

static int kept_calls(const Thread* t) { return t->depth < MAX_CALLS ? t->depth : MAX_CALLS; }

// The line a fault of thread `t` at `line` is named by: the outermost call under way that lies
// in the kernel's own body (the line a learner wrote), else `line` itself.
static int kernel_line(const Thread* t, int line) {
    for (int i = 0; i < kept_calls(t); ++i)
        if (t->call_line[i] >= body_first && t->call_line[i] <= body_last) return t->call_line[i];
    return line;
}

// "in block_sum, called at line 41": the calls under way of `t`, innermost first.
static void calls_words(char* out, size_t room, const Thread* t) {
    out[0] = 0;
    if (t->depth > MAX_CALLS) append(out, room, "%d calls deep, ", t->depth);
    for (int i = kept_calls(t) - 1; i >= 0; --i)
        append(out, room, "%sin %s, called at line %d", i == kept_calls(t) - 1 ? "" : ", ",
               t->callee[i], t->call_line[i]);
}

// "on line 9 (in block_sum, called at line 41)": where thread `t` is, at `line`.
static void place(char* out, size_t room, const Thread* t, int line) {
    out[0] = 0;
    append(out, room, "on line %d", line);
    if (!t->depth) return;
    char calls[512];
    calls_words(calls, sizeof calls, t);
    append(out, room, " (%s)", calls);
}

// The fault: the message, with the block and the thread under way (the whole block where the
// scheduler itself finds the fault), and the line: `line` of thread `t`, or where `t` is inside
// a function of the source, the kernel's line that called it (and with `say_calls` the calls in
// the words).
static void record(const Thread* t, int line, bool say_calls, const char* fmt, va_list ap) {
    vsnprintf(fault->message, sizeof fault->message, fmt, ap);
    fault->block[0] = block_index.x, fault->block[1] = block_index.y;
    fault->block[2] = block_index.z;
    fault->thread[0] = fault->thread[1] = fault->thread[2] = -1;
    if (current) {
        fault->thread[0] = current->idx.x, fault->thread[1] = current->idx.y;
        fault->thread[2] = current->idx.z;
    }
    fault->line = line;
    if (t && t->depth) {
        fault->line = kernel_line(t, line);
        if (say_calls) {
            char calls[512];
            calls_words(calls, sizeof calls, t);
            if (line) append(fault->message, sizeof fault->message, "; at line %d (%s)", line,
                             calls);
            else append(fault->message, sizeof fault->message, " (%s)", calls);
        }
    }
    failed = true;
}

// Stop the launch with the fault `record` writes; never returns to the thread.
static void vfail(const Thread* t, int line, bool say_calls, const char* fmt, va_list ap) {
    record(t, line, say_calls, fmt, ap);
    if (!current) return;                    // the scheduler's own finding: it stops the block
    switch_to(fiber_mode ? current->context : direct, scheduler);
    abort();                                 // a failed thread is never resumed
}

void fail_at(int line, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(current, line, true, fmt, ap);
    va_end(ap);
}

// A fault the scheduler finds, of thread `t` at `line` (`say_calls`: see vfail).
static void fail_for(const Thread* t, int line, bool say_calls, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_for(const Thread* t, int line, bool say_calls, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(t, line, say_calls, fmt, ap);
    va_end(ap);
}

call_guard::call_guard(call_site call, const char* name) : t(current) {
    if (t->depth < MAX_CALLS) t->call_line[t->depth] = call.line, t->callee[t->depth] = name;
    ++t->depth;
}


static const unsigned int TICKS_BETWEEN_LOOKS = 1u << 16;
static const double WATCH_SECONDS = 0.1;
static const int MAX_LOOPS = 16;

struct Loop {                                // a loop turned during the watch, and where
    int line, depth, call_line[MAX_CALLS];
    const char* callee[MAX_CALLS];
    unsigned int turns;
    bool ended;                              // its condition was false at least once
};

unsigned int ticks_left = TICKS_BETWEEN_LOOKS;
static double time_limit = 0, time_spent = 0, started = 0, deadline = 0;
static bool watching = false;
static double watch_ends = 0;
static unsigned int watch_ticks = 0;
static Loop loops[MAX_LOOPS];
static int n_loops = 0;

static double now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void start_clock(const Config* c) {
    time_limit = c->time_limit > 0 ? c->time_limit : 0, time_spent = c->time_spent;
    started = now();
    deadline = started + time_limit - time_spent;
    ticks_left = TICKS_BETWEEN_LOOKS, watching = false, n_loops = 0;
}

static double run_time() { return time_spent + (now() - started); }

static void remember(int line, bool go) {
    Loop* l = nullptr;
    for (int i = 0; i < n_loops && !l; ++i)
        if (loops[i].line == line) l = &loops[i];
    if (!l) {
        if (n_loops == MAX_LOOPS) return;
        l = &loops[n_loops++];
        l->line = line, l->depth = current->depth, l->turns = 0, l->ended = false;
        memcpy(l->call_line, current->call_line, sizeof l->call_line);
        memcpy(l->callee, current->callee, sizeof l->callee);
    }
    ++l->turns;
    if (!go) l->ended = true;
}

// The watch is over: the loop that turned least often (the outermost) of those whose condition
// never turned false, in any thread, else the launch is only slow. The fault names the thread
// under way.
static void name_the_loop(int line) {
    const Loop* going = nullptr;
    for (int i = 0; i < n_loops; ++i)
        if (!loops[i].ended && (!going || loops[i].turns < going->turns)) going = &loops[i];
    fault->timed_out = 1;
    if (!going) {
        fail_at(line, "has run %.1f s, past its time limit of %g s, without ending; each loop it "
                "ran in its last moments ended (a launch too long for the host in that time?)",
                run_time(), time_limit);
        return;
    }
    current->depth = going->depth;           // where the loop was (the thread never resumes)
    memcpy(current->call_line, going->call_line, sizeof going->call_line);
    memcpy(current->callee, going->callee, sizeof going->callee);
    char calls[512] = "", words[480];
    if (current->depth) {
        calls_words(words, sizeof words, current);
        snprintf(calls, sizeof calls, " (%s)", words);
    }
    fail_for(current, going->line, false, "has run %.1f s without ending: the loop at line %d%s "
             "is still going (a loop whose condition never turns false?)", run_time(),
             going->line, calls);
}

void look_at_clock(int line, bool go) {
    if (!watching) {
        ticks_left = TICKS_BETWEEN_LOOKS;
        if (!time_limit || now() < deadline) return;
        watching = true, watch_ends = now() + WATCH_SECONDS, watch_ticks = 0;
    }
    ticks_left = 1;                          // every tick comes here while the watch lasts
    remember(line, go);
    if ((++watch_ticks & 1023) || now() < watch_ends) return;
    name_the_loop(line);
}


// ---- memory: the race records -----------------------------------------------------------------

static inline int warp_of(int linear) { return linear >> 5; }

// Whether an earlier access by `thread` of this block, in `at` / warp epoch `wat`, is ordered
// before the current thread's: a barrier between them, a __syncwarp between two lanes of one
// warp, or the same thread.
static inline bool ordered(int thread, unsigned int at, unsigned int wat) {
    if (at != epoch || thread == current->linear) return true;
    return warp_of(thread) == warp_of(current->linear) && wat != warp_epochs[warp_of(thread)];
}

void on_read(const Region* r, long long i, int line) {
    Shadow* s = r->shadow ? r->shadow + i : nullptr;
    if (!s) return;
    int me = current->linear;
    if (s->w_block) {
        if (s->w_block != block_number)
            fail_at(line, "reads %s[%lld], which block %lld wrote in this launch: blocks are not "
                    "ordered, so the value read depends on which runs first (a race between "
                    "blocks)", r->name, i, s->w_block - 1);
        if (!ordered(s->w_thread, s->w_epoch, s->w_wepoch))
            fail_at(line, "reads %s%s[%lld], which thread %d of this block wrote since the last "
                    "__syncthreads(): a race (a barrier missing between the write and the read?)",
                    space(r), r->name, i, s->w_thread);
    } else if (r->shared) {
        fail_at(line, "reads __shared__ %s[%lld] before any thread of this block wrote it: "
                "shared memory starts as garbage in every block (a barrier missing before the "
                "read?)", r->name, i);
    }
    if (s->r_block == 0 || (s->r_block == block_number && s->r_epoch != epoch)) {
        s->r_block = block_number, s->r_thread = me, s->r_epoch = epoch;
        s->r_wepoch = warp_epochs[warp_of(me)];
    } else if (s->r_block != block_number) {
        s->r_block = -1;
    } else if (s->r_thread != me) {
        s->r_thread = -1;
    }
}

void on_write(const Region* r, long long i, int line) {
    Shadow* s = r->shadow ? r->shadow + i : nullptr;
    if (!s) return;
    int me = current->linear;
    if (s->w_block && s->w_block != block_number)
        fail_at(line, "writes %s[%lld], which block %lld wrote too in this launch: a race between "
                "blocks", r->name, i, s->w_block - 1);
    if (s->w_block && !ordered(s->w_thread, s->w_epoch, s->w_wepoch))
        fail_at(line, "writes %s%s[%lld], which thread %d of this block wrote since the last "
                "__syncthreads(): a race", space(r), r->name, i, s->w_thread);
    if (s->r_block == -1 || (s->r_block && s->r_block != block_number))
        fail_at(line, "writes %s[%lld], which another block read in this launch: a race between "
                "blocks", r->name, i);
    if (s->r_block == block_number && s->r_epoch == epoch && s->r_thread != me
            && (s->r_thread == -1 || !ordered(s->r_thread, s->r_epoch, s->r_wepoch))) {
        if (s->r_thread == -1)
            fail_at(line, "writes %s%s[%lld], which other threads of this block read since the "
                    "last __syncthreads(): a race (a barrier missing between the reads and the "
                    "write?)", space(r), r->name, i);
        fail_at(line, "writes %s%s[%lld], which thread %d of this block read since the last "
                "__syncthreads(): a race (a barrier missing between the read and the write?)",
                space(r), r->name, i, s->r_thread);
    }
    s->w_block = block_number, s->w_thread = me, s->w_epoch = epoch;
    s->w_wepoch = warp_epochs[warp_of(me)];
}

// ---- __shared__ arrays and barriers -----------------------------------------------------------

void register_shared(SharedBase* s) {
    if (n_shared == MAX_SHARED)
        fail_at(0, "more than %d __shared__ arrays: the host execution keeps at most %d",
                MAX_SHARED, MAX_SHARED);
    shared_objects[n_shared++] = s;
}


void wait_here(int state, int line) {
    if (!fiber_mode)
        fail_at(line, "internal: a barrier or warp operation in a kernel run without fibers");
    current->state = state;
    current->line = line;
    switch_to(current->context, scheduler);
}

// ---- the scheduler ------------------------------------------------------------------------------

static unsigned long long splitmix(unsigned long long& state) {
    unsigned long long z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <class I> static void shuffle(I* items, long long n, unsigned long long& state) {
    for (long long i = n - 1; i > 0; --i) {
        long long j = (long long)(splitmix(state) % (unsigned long long)(i + 1));
        I t = items[i];
        items[i] = items[j];
        items[j] = t;
    }
}

// Whether two threads are in the same calls (the same call lines, outermost first).
static bool same_calls(const Thread& a, const Thread& b) {
    if (a.depth != b.depth) return false;
    for (int i = 0; i < kept_calls(&a); ++i)
        if (a.call_line[i] != b.call_line[i]) return false;
    return true;
}

static bool same_place(const Thread& a, const Thread& b) {
    return a.line == b.line && same_calls(a, b);
}

static bool in_group(const Thread& t, int state, const Thread* like) {
    return t.state == state && (!like || same_place(t, *like));
}

// "0-31, 64, 96-127": the threads (linear indices) whose state is `state` [where `like` is].
static void describe(char* out, size_t room, int state, const Thread* like) {
    out[0] = 0;
    for (int i = 0; i < n_threads && strlen(out) + 24 < room; ++i) {
        if (!in_group(threads[i], state, like)) continue;
        int j = i;
        while (j + 1 < n_threads && in_group(threads[j + 1], state, like)) ++j;
        append(out, room, out[0] ? ", %d" : "%d", i);
        if (j > i) append(out, room, "-%d", j);
        i = j;
    }
}

static void thread_entry() {
    body(body_args);
    current->state = EXITED;
    switch_to(current->context, scheduler);
}

// Without fibers: each thread of the block runs to its end in turn, on one stack of their own.
static void direct_entry() {
    for (int k = 0; k < n_threads; ++k) {
        current = &threads[direct_order[k]];
        current->depth = 0;
        body(body_args);
    }
    current = nullptr;
    switch_to(direct, scheduler);
}

// A thread's stack: STACK bytes above a GUARD region that faults at any touch, mapped without
// reserving memory (a page is committed once touched): the address of its lowest byte, or null.
static char* new_stack() {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
    flags |= MAP_NORESERVE;
#endif
    void* p = mmap(nullptr, GUARD + STACK, PROT_NONE, flags, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    char* stack = static_cast<char*>(p) + GUARD;
    if (mprotect(stack, STACK, PROT_READ | PROT_WRITE) != 0) {
        munmap(p, GUARD + STACK);
        return nullptr;
    }
    return stack;
}

static bool prepare_fibers() {
    for (int i = 0; i < n_threads; ++i) {
        Thread& t = threads[i];
        if (!t.stack && !(t.stack = new_stack())) return false;
        start_context(t.context, t.stack, STACK, thread_entry);
        t.state = READY;
        t.depth = 0;
    }
    return true;
}

// Release the warp operations whose lanes have all arrived; a fault where they cannot all arrive.
static bool release_warps() {
    bool released = false;
    current = nullptr;
    for (int base = 0; base < n_threads; base += 32) {
        int lanes = n_threads - base < 32 ? n_threads - base : 32;
        unsigned int waiting = 0;
        for (int l = 0; l < lanes; ++l)
            if (threads[base + l].state == AT_WARP) waiting |= 1u << l;
        if (!waiting) continue;
        // the usual case, checked at once: every waiting lane at one operation with one mask,
        // which names only waiting lanes
        const Thread& first = threads[base + __builtin_ctz(waiting)];
        bool same = (first.mask & ~waiting) == 0;
        for (int l = 0; l < lanes && same; ++l) {
            const Thread& t = threads[base + l];
            same = t.state != AT_WARP || (t.op == first.op && t.mask == first.mask);
        }
        for (int l = 0; l < lanes && !same; ++l) {             // else find the fault and name it
            Thread& t = threads[base + l];
            if (t.state != AT_WARP) continue;
            const char* op = OP_NAMES[t.op];
            if (!((t.mask >> l) & 1u))
                return fail_for(&t, t.line, true, "thread %d calls %s with mask 0x%08x, which "
                                "leaves out its own lane %d", base + l, op, t.mask, l), false;
            for (int j = 0; j < 32; ++j) {
                if (!((t.mask >> j) & 1u)) continue;
                if (j >= lanes)
                    return fail_for(&t, t.line, true, "thread %d calls %s with mask 0x%08x, which "
                                    "names lane %d: warp %d has lanes 0-%d", base + l, op, t.mask,
                                    j, base / 32, lanes - 1), false;
                Thread& o = threads[base + j];
                char there[512];
                place(there, sizeof there, &o, o.line);
                if (o.state == EXITED)
                    return fail_for(&t, t.line, true, "thread %d waits at %s (mask 0x%08x) for "
                                    "lane %d (thread %d), which has exited: it never arrives",
                                    base + l, op, t.mask, j, base + j), false;
                if (o.state == AT_BARRIER)
                    return fail_for(&t, t.line, true, "deadlock: thread %d waits at %s (mask "
                                    "0x%08x) for thread %d, which waits at __syncthreads() %s",
                                    base + l, op, t.mask, base + j, there), false;
                if (o.op != t.op || o.mask != t.mask)
                    return fail_for(&t, t.line, true, "threads %d and %d of one warp wait at "
                                    "different warp operations: %s (mask 0x%08x) and %s %s (mask "
                                    "0x%08x)", base + l, base + j, op, t.mask, OP_NAMES[o.op],
                                    there, o.mask), false;
            }
        }
        bool syncwarp = false;
        for (int l = 0; l < lanes; ++l) {
            Thread& t = threads[base + l];
            if (t.state != AT_WARP) continue;
            int width = t.width, start = l / width * width, src = l;
            switch (t.op) {
            case OP_SHFL: src = start + ((t.arg % width) + width) % width; break;
            case OP_SHFL_UP: src = l - t.arg >= start ? l - t.arg : l; break;
            case OP_SHFL_DOWN: src = l + t.arg < start + width ? l + t.arg : l; break;
            case OP_SHFL_XOR: src = l ^ t.arg; if (src >= start + width) src = l; break;
            default: break;
            }
            if (t.op <= OP_SHFL_XOR) {
                if (src < 0 || src >= 32 || !((t.mask >> src) & 1u))
                    return fail_for(&t, t.line, true, "thread %d's %s reads lane %d, which is not "
                                    "in the mask 0x%08x: its value is undefined", base + l,
                                    OP_NAMES[t.op], src, t.mask), false;
                t.result = threads[base + src].value;
            } else if (t.op != OP_SYNCWARP) {
                unsigned int votes = 0;
                for (int j = 0; j < 32; ++j)
                    if (((t.mask >> j) & 1u) && threads[base + j].value) votes |= 1u << j;
                t.result = t.op == OP_BALLOT ? votes
                         : t.op == OP_ANY ? (votes != 0) : (votes == t.mask);
            } else {
                syncwarp = true;
            }
        }
        for (int l = 0; l < lanes; ++l)
            if (threads[base + l].state == AT_WARP) threads[base + l].state = READY;
        if (syncwarp) ++warp_epochs[base / 32];
        released = true;
    }
    return released;
}

// Release a barrier that every live thread waits at; a fault where they cannot all arrive.
static bool release_barrier() {
    int exited = 0, waiting = 0;
    const Thread* first = nullptr;
    for (int i = 0; i < n_threads; ++i) {
        const Thread& t = threads[i];
        if (t.state == EXITED) { ++exited; continue; }
        if (t.state != AT_BARRIER) continue;
        ++waiting;
        if (!first) first = &t;
        if (!same_place(t, *first)) {
            char a[512], b[512], here[512], there[512];
            describe(a, sizeof a, AT_BARRIER, first);
            describe(b, sizeof b, AT_BARRIER, &t);
            if (first->depth && same_calls(t, *first)) {     // two barriers of one call
                calls_words(here, sizeof here, first);
                fail_for(first, first->line, false, "deadlock: the threads of the block wait at "
                         "different barriers: threads %s at __syncthreads() on line %d, threads "
                         "%s at __syncthreads() on line %d, both %s (a __syncthreads() in a "
                         "branch that not every thread takes?)", a, first->line, b, t.line, here);
            } else {
                place(here, sizeof here, first, first->line);
                place(there, sizeof there, &t, t.line);
                fail_for(first, first->line, false, "deadlock: the threads of the block wait at "
                         "different barriers: threads %s at __syncthreads() %s, threads %s at "
                         "__syncthreads() %s (a __syncthreads() in a branch that not every "
                         "thread takes?)", a, here, b, there);
            }
            return false;
        }
    }
    if (!waiting) return false;
    if (exited) {
        char a[512], here[512];
        describe(a, sizeof a, EXITED, nullptr);
        place(here, sizeof here, first, first->line);
        fail_for(first, first->line, false, "deadlock: %d threads wait at __syncthreads() %s, "
                 "which threads %s never reach: they have returned from the kernel (a barrier "
                 "inside a branch that not every thread of the block takes, or after an early "
                 "return?)", waiting, here, a);
        return false;
    }
    ++epoch;
    for (int i = 0; i < n_threads; ++i) threads[i].state = READY;
    return true;
}

static void run_block(const Config* c, unsigned long long& state) {
    ++epoch;
    memset(warp_epochs, 0, sizeof warp_epochs);
    for (int k = 0; k < n_shared; ++k) shared_objects[k]->reset();
    int order[MAX_THREADS];
    for (int i = 0; i < n_threads; ++i) order[i] = i;
    if (!fiber_mode) {                       // no barriers: each thread runs to its end in turn
        if (c->seed) shuffle(order, n_threads, state);
        if (!direct_stack && !(direct_stack = new_stack())) {
            fail_at(0, "could not allocate a thread's stack");
            return;
        }
        direct_order = order;
        start_context(direct, direct_stack, STACK, direct_entry);
        switch_to(scheduler, direct);
        current = nullptr;
        return;
    }
    if (!prepare_fibers()) {
        fail_at(0, "could not allocate the stacks of %d threads", n_threads);
        return;
    }
    for (;;) {
        int n = 0;
        for (int i = 0; i < n_threads; ++i)
            if (threads[i].state == READY) order[n++] = i;
        if (c->seed) shuffle(order, n, state);
        for (int k = 0; k < n; ++k) {
            current = &threads[order[k]];
            switch_to(scheduler, current->context);
            if (failed) return;
        }
        current = nullptr;
        if (release_warps()) continue;
        if (failed) return;
        bool all_exited = true;
        for (int i = 0; i < n_threads; ++i) all_exited &= threads[i].state == EXITED;
        if (all_exited) return;
        if (release_barrier()) continue;
        if (failed) return;
        fail_at(0, "deadlock: no thread of the block can go on");
        return;
    }
}

// ---- hardware faults of the kernel's code: caught for the launch's duration -------------------
// A handler of SIGSEGV, SIGBUS, SIGFPE and SIGILL, on a stack of its own, is set while a launch
// runs (the handlers and the signal stack before it are set back after). A fault of the thread
// under way, in the thread that launched, stops the launch: the handler names the fault and
// jumps back to the launch (siglongjmp: allowed from a handler on its own stack, and it sets the
// signal mask back); the launch's state is made anew by the next launch, so the library can
// launch again. Any other signal of these goes on to the handler before (Python's faulthandler).

static const int CAUGHT[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
static const int N_CAUGHT = sizeof CAUGHT / sizeof CAUGHT[0];
static struct sigaction caught_before[N_CAUGHT];
static stack_t signal_stack_before;
alignas(16) static char signal_stack[64 * 1024];
static sigjmp_buf signal_exit;
static pthread_t launcher;
static volatile sig_atomic_t launching = 0;

// The stack pointer of the code a signal interrupted (0 where not known).
static uintptr_t stack_pointer(void* context) {
#if defined(__linux__) && defined(__x86_64__)
    return (uintptr_t) static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RSP];
#elif defined(__linux__) && defined(__aarch64__)
    return (uintptr_t) static_cast<ucontext_t*>(context)->uc_mcontext.sp;
#else
    (void)context;
    return 0;
#endif
}

static void fault_of_thread(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fault_of_thread(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(current, 0, true, fmt, ap);
    va_end(ap);
}

// The fault `signum` of the thread under way, in words: a stack that overflowed where the
// address lies in its guard region (or the thread's stack pointer left its stack).
static void name_signal(int signum, const siginfo_t* info, void* context) {
    uintptr_t low = (uintptr_t)(fiber_mode ? current->stack : direct_stack);
    uintptr_t at = (uintptr_t)info->si_addr, sp = stack_pointer(context);
    bool memory = signum == SIGSEGV || signum == SIGBUS;
    if (memory && ((at < low && at >= low - GUARD) || (sp && sp < low)))
        fault_of_thread("the thread's stack overflowed: its local arrays (or a recursion) need "
                        "more than %zu KiB; a device thread has at most %zu KiB of local memory",
                        LOCAL_MEMORY / 1024, LOCAL_MEMORY / 1024);
    else if (signum == SIGSEGV)
        fault_of_thread("a segmentation fault: it read or wrote memory at address 0x%llx, which "
                        "is no array's of the launch (a pointer that points nowhere, or a local "
                        "array indexed outside itself?)", (unsigned long long)at);
    else if (signum == SIGBUS)
        fault_of_thread("a bus error: it read or wrote memory at address 0x%llx that cannot be "
                        "reached that way (a misaligned pointer?)", (unsigned long long)at);
    else if (signum == SIGFPE && info->si_code == FPE_INTDIV)
        fault_of_thread("an integer division (or remainder) by zero: its result is undefined "
                        "(a device gives some value, without an error)");
    else if (signum == SIGFPE && info->si_code == FPE_INTOVF)
        fault_of_thread("an integer division that overflows (the most negative value by -1): "
                        "its result is undefined");
    else if (signum == SIGFPE)
        fault_of_thread("an arithmetic fault (SIGFPE, code %d)", info->si_code);
    else
        fault_of_thread("an illegal instruction: the compiler put a trap where the code's "
                        "behaviour is undefined (the end of a function that returns a value, "
                        "reached without a return?)");
}

static void on_signal(int signum, siginfo_t* info, void* context) {
    int k = 0;
    while (k < N_CAUGHT - 1 && CAUGHT[k] != signum) ++k;
    if (!launching || !current || info->si_code <= 0 || !pthread_equal(pthread_self(), launcher)) {
        sigaction(signum, &caught_before[k], nullptr);   // not the kernel's: the handler before
        if (info->si_code <= 0) raise(signum);           // a signal sent is sent again; a fault
        return;                                          // happens again, to that handler
    }
    name_signal(signum, info, context);
    siglongjmp(signal_exit, 1);
}

static void catch_signals() {
    launcher = pthread_self();
    stack_t ours;
    memset(&ours, 0, sizeof ours);
    ours.ss_sp = signal_stack, ours.ss_size = sizeof signal_stack;
    sigaltstack(&ours, &signal_stack_before);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_signal;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    for (int k = 0; k < N_CAUGHT; ++k) sigaction(CAUGHT[k], &action, &caught_before[k]);
}

static void release_signals() {
    launching = 0;
    for (int k = 0; k < N_CAUGHT; ++k) sigaction(CAUGHT[k], &caught_before[k], nullptr);
    sigaltstack(&signal_stack_before, nullptr);
}

// One launch: every block of the grid, each thread running `kernel_body` on `args`; the kernel's
// own body spans lines `first_line` to `last_line` of its source.
int launch(const Config* c, void** args, Fault* f, void (*kernel_body)(void**),
                  int first_line, int last_line) {
    fault = f, failed = false, current = nullptr;
    fault->timed_out = 0;
    body_first = first_line, body_last = last_line;
    start_clock(c);
    fiber_mode = c->fibers != 0;
    body = kernel_body, body_args = args;
    block_dim = dim3{c->block[0], c->block[1], c->block[2]};
    grid_dim = dim3{c->grid[0], c->grid[1], c->grid[2]};
    n_threads = (int)(c->block[0] * c->block[1] * c->block[2]);
    for (int i = 0; i < n_threads; ++i) {
        Thread& t = threads[i];
        t.linear = i;
        t.idx = uint3{(unsigned)(i % c->block[0]), (unsigned)(i / c->block[0] % c->block[1]),
                      (unsigned)(i / (c->block[0] * c->block[1]))};
        t.state = READY;
        t.line = 0;
        t.depth = 0;
    }
    long long blocks = (long long)c->grid[0] * c->grid[1] * c->grid[2];
    long long* order = nullptr;
    unsigned long long state = c->seed;
    if (c->seed) {
        order = static_cast<long long*>(malloc(sizeof(long long) * blocks));
        for (long long b = 0; b < blocks; ++b) order[b] = b;
        shuffle(order, blocks, state);
    }
    catch_signals();
    if (sigsetjmp(signal_exit, 1) == 0) {
        launching = 1;
        for (long long k = 0; k < blocks && !failed; ++k) {
            long long b = order ? order[k] : k;
            block_index = uint3{(unsigned)(b % c->grid[0]),
                                (unsigned)(b / c->grid[0] % c->grid[1]),
                                (unsigned)(b / ((long long)c->grid[0] * c->grid[1]))};
            block_number = b + 1;
            if (time_limit && now() >= deadline) {
                fault->timed_out = 1;
                fail_at(0, "has run %.1f s, past its time limit of %g s, with %lld of its %lld "
                        "blocks still to run (a launch too large for the host in that time?)",
                        run_time(), time_limit, blocks - k, blocks);
                break;
            }
            run_block(c, state);
        }
    }
    release_signals();
    free(order);
    current = nullptr;
    return failed ? 1 : 0;
}

}  // namespace minitfm
