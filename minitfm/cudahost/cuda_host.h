// The host execution of CUDA C kernels: a small model of CUDA's execution, for a kernel's own
// source compiled by the host's C++ compiler (minitfm/cudahost/__init__.py explains the model).
//
// - a grid of blocks, run one after another (in a seeded order when the launch asks for one);
// - each thread of a block a fiber (ucontext) with a stack of its own; a thread runs until it
//   reaches a barrier, a warp operation, or its end, and the block's threads are resumed in turn
//   (the order of each turn seeded too: one fixed order hides races);
// - __syncthreads() releases when every thread of the block waits at the same one; threads that
//   wait at different barriers, or a barrier that exited threads never reach, are a deadlock
//   fault, not a hang;
// - the warp operations (shuffles, votes, __syncwarp) release when every lane named in the mask
//   waits at the same operation with the same mask;
// - every element a kernel reads or writes through an array parameter or a __shared__ array is
//   checked: inside the array (its own extent, not the allocation around it); not written by one
//   thread and touched by another of the same block without a barrier between them, nor by
//   threads of two blocks in one launch (a race); a __shared__ element written before it is read
//   (it starts as garbage in every block);
// - each loop's condition ticks: with a time limit, a loop that never ends is stopped and named;
// - a failing assert() and __trap() stop the launch, as on a device (cudaErrorAssert, an error);
// - each thread's stack holds 512 KiB of locals, as a device thread's local memory at most, with
//   a large guard region below it (and the compiler probing each page of a large frame): a stack
//   that overflows, and every other hardware fault of the kernel's code (a segmentation fault,
//   a bus error, an integer division by zero, an illegal instruction), is caught by a signal
//   handler set for the launch's duration, on a stack of its own, which stops the launch;
// - a fault stops the launch and names the block, the thread and the line; inside a function of
//   the source, the line of the kernel's body that called it (the calls in the words).
//
// The source is rewritten before it gets here (cudahost/rewrite.py): pointer types become
// minitfm::gptr<T>, __shared__ arrays minitfm::shared<T, dims...> (a scalar's uses `name()`),
// loop conditions minitfm::tick(line, cond), __device__ functions take their call's line and
// keep a minitfm::call_guard, the two PTX half conversions become calls of minitfm::cvt_*;
// everything else is the kernel's text.

//
// This header is what a kernel's library compiles: the types, the state the kernel's code reads,
// the checks of each element it touches and CUDA's names. The rest of the model (the scheduler,
// the race records, the time limit's watch, the faults in words and the signal handlers) is
// cuda_host.cpp, compiled once into a library of its own that every kernel's library is linked
// to (cudahost/build.py): a kernel's compilation is then its own code alone.
#ifndef MINITFM_CUDA_HOST_H
#define MINITFM_CUDA_HOST_H

#include <cmath>
#include <setjmp.h>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <type_traits>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };

namespace minitfm {

// ---- fibers: a stack each (cuda_host.cpp switches them) -----------------------------------------
// (x86-64 and AArch64 on Linux: the callee-saved registers saved and restored; elsewhere, or
// compiled with -DMINITFM_UCONTEXT, ucontext, whose swapcontext also makes a system call for the
// signal mask on every switch: several times slower)

#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__)) && !defined(MINITFM_UCONTEXT)
#define MINITFM_OWN_SWITCH 1
struct Context { void* sp; };
#else
struct Context { ucontext_t uc; };
#endif

// ---- what the loader passes in and gets back ---------------------------------------------------

struct Shadow;

struct Region {                 // an array the kernel reaches: a parameter, or a __shared__ array
    void* data;
    long long count;            // elements
    long long size;             // bytes per element
    const char* name;
    long long shared;           // 1: __shared__ (one per block), 0: a parameter (global memory)
    Shadow* shadow;             // one record per element (null: no race checks)
    const char* mismatch;       // not null: the array's type is not the parameter's (says how)
};

struct Config {
    unsigned int grid[3], block[3];
    unsigned long long seed;    // 0: blocks and threads in their natural order; else shuffled
    long long fibers;           // 1: threads are fibers (the kernel has barriers or warp operations)
    double time_limit;          // seconds (0: none), for this launch and those before it together
    double time_spent;          // seconds those launches before it took
};

struct Fault {
    char message[4096];
    long long block[3];
    long long thread[3];        // -1: the whole block
    long long line;             // 0: unknown
    long long timed_out;        // 1: the time limit stopped the launch
};

// Who touched an element last, for the race checks. Blocks are stored as index + 1 (0: none);
// r_block -1: read by several blocks; r_thread -1: read by several threads in r_epoch.
struct Shadow {
    long long w_block, r_block;
    int w_thread;
    unsigned int w_epoch, w_wepoch;
    int r_thread;
    unsigned int r_epoch, r_wepoch;
};

// ---- the state of the launch under way --------------------------------------------------------

enum { READY, AT_BARRIER, AT_WARP, EXITED };
enum { OP_SHFL, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR, OP_BALLOT, OP_ANY, OP_ALL, OP_SYNCWARP };
static const char* const OP_NAMES[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                       "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                       "__all_sync", "__syncwarp"};

static const int MAX_CALLS = 8;              // calls under way a thread keeps (the outermost)

struct Thread {
    Context context;
    char* stack;
    uint3 idx;
    int linear, state, line;
    int op, arg, width;                      // the warp operation it waits at
    unsigned int mask;
    unsigned long long value, result;
    int depth;                               // calls of the source's functions under way
    int call_line[MAX_CALLS];                // the line of each, outermost first
    const char* callee[MAX_CALLS];           // the function each called
};

struct SharedBase;
// The state of the launch that the kernel's own code reads (cuda_host.cpp keeps the rest)
extern Thread* current;
extern uint3 block_index;
extern dim3 block_dim, grid_dim;
extern unsigned int ticks_left;              // the time limit's countdown (tick)

// A fault of the thread under way at `line`: the launch stops (it never returns to the thread).
void fail_at(int line, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// ---- calls: a fault inside a function of the source is named where the kernel called it ------
// The rewrite gives each __device__ function a last parameter, the line of its call (a default
// argument's __builtin_LINE() is the caller's), and a guard that keeps the call on the thread's
// record for the function's duration.

struct call_site {                           // the line of a call
    int line;
    explicit call_site(int where) : line(where) {}
};

struct call_guard {
    Thread* t;
    call_guard(call_site call, const char* name);
    ~call_guard() { --t->depth; }
    call_guard(const call_guard&) = delete;
};


// ---- the time limit: each turn of a loop ticks ------------------------------------------------
// The rewrite makes each loop's condition `tick(line, condition)`. A tick counts down, and every
// TICKS_BETWEEN_LOOKS ticks looks at the clock (without a time limit, at nothing). Past the
// deadline it watches every tick a little longer (WATCH_SECONDS), for a loop that turns without
// its condition ever turning false, and stops the launch naming it, as at any fault.
// (A tick also makes a loop with an empty body well defined: it has an effect.)

// Past every TICKS_BETWEEN_LOOKS ticks (cuda_host.cpp): the clock, the watch, the fault.
__attribute__((noinline)) void look_at_clock(int line, bool go);

static inline bool tick(int line, bool go) {
    if (__builtin_expect(--ticks_left == 0, 0)) look_at_clock(line, go);
    return go;
}

// ---- memory: bounds, races, uninitialised __shared__ memory -----------------------------------

static const char* space(const Region* r) { return r->shared ? "__shared__ " : ""; }

static void check_bounds(const Region* r, long long i, long long lo, long long hi, int line,
                         const char* what) {
    if (r->mismatch)        // a placeholder is fine until it is touched, as on a device
        fail_at(line, "%s %s[%lld]: %s", what, r->name, i, r->mismatch);
    if (i >= lo && i < hi) return;
    if (lo == 0 && hi == r->count)
        fail_at(line, "%s %s%s[%lld], outside its %lld elements", what, space(r), r->name, i,
                r->count);
    fail_at(line, "%s %s%s[%lld], outside the row [%lld, %lld) it indexes", what, space(r),
            r->name, i, lo, hi);
}

// The race records of element i of `r` for a read and a write by the thread under way (and a
// __shared__ element read before it was written): a fault names what went wrong.
void on_read(const Region* r, long long i, int line);
void on_write(const Region* r, long long i, int line);


template <class T> struct gptr;

// One element of an array, read (converted to T) or written (assigned) with the checks above.
// It cannot be copied: `auto v = x[i]` would keep a reference where CUDA keeps a value.
template <class T> struct ref {
    using V = typename std::remove_const<T>::type;
    const Region* r;
    long long i, lo, hi;
    int line;
    ref(const Region* region, long long index, long long low, long long high, int where)
        : r(region), i(index), lo(low), hi(high), line(where) {}
    ref(const ref&) = delete;   // so `auto v = x[i]` does not compile: write `float v = x[i]`
    V get() const {
        check_bounds(r, i, lo, hi, line, "reads");
        on_read(r, i, line);
        return static_cast<V*>(r->data)[i];
    }
    void set(V v) const {
        static_assert(!std::is_const<T>::value, "writes through a pointer to const");
        check_bounds(r, i, lo, hi, line, "writes");
        on_write(r, i, line);
        static_cast<V*>(r->data)[i] = v;
    }
    operator V() const { return get(); }
    template <class U> const ref& operator=(const U& v) const { set(static_cast<V>(v)); return *this; }
    const ref& operator=(const ref& o) const { set(o.get()); return *this; }
    template <class U> const ref& operator+=(const U& v) const { set(get() + v); return *this; }
    template <class U> const ref& operator-=(const U& v) const { set(get() - v); return *this; }
    template <class U> const ref& operator*=(const U& v) const { set(get() * v); return *this; }
    template <class U> const ref& operator/=(const U& v) const { set(get() / v); return *this; }
    template <class U> const ref& operator%=(const U& v) const { set(get() % v); return *this; }
    template <class U> const ref& operator&=(const U& v) const { set(get() & v); return *this; }
    template <class U> const ref& operator|=(const U& v) const { set(get() | v); return *this; }
    template <class U> const ref& operator^=(const U& v) const { set(get() ^ v); return *this; }
    template <class U> const ref& operator<<=(const U& v) const { set(get() << v); return *this; }
    template <class U> const ref& operator>>=(const U& v) const { set(get() >> v); return *this; }
    const ref& operator++() const { set(get() + 1); return *this; }
    const ref& operator--() const { set(get() - 1); return *this; }
    V operator++(int) const { V v = get(); set(v + 1); return v; }
    V operator--(int) const { V v = get(); set(v - 1); return v; }
    gptr<T> operator&() const { return gptr<T>(r, i, lo, hi); }
};

// An index with the line it was written on (the caller's, through the default argument).
struct at {
    long long i;
    int line;
    at(long long index, int where = __builtin_LINE()) : i(index), line(where) {}
    template <class T> at(const ref<T>& index, int where = __builtin_LINE())
        : i((long long)index.get()), line(where) {}
};

// A pointer into an array: the array's record, an element offset, and the elements it may reach.
template <class T> struct gptr {
    const Region* r;
    long long off, lo, hi;
    gptr() : r(nullptr), off(0), lo(0), hi(0) {}
    explicit gptr(const Region* region)
        : r(region), off(0), lo(0), hi(region ? region->count : 0) {}
    gptr(const Region* region, long long offset, long long low, long long high)
        : r(region), off(offset), lo(low), hi(high) {}
    template <class U, class = typename std::enable_if<
                           std::is_same<const U, T>::value && !std::is_same<U, T>::value>::type>
    gptr(const gptr<U>& o) : r(o.r), off(o.off), lo(o.lo), hi(o.hi) {}
    ref<T> operator[](at k) const { return {r, off + k.i, lo, hi, k.line}; }
    ref<T> operator*() const { return {r, off, lo, hi, 0}; }
    gptr operator+(long long k) const { return gptr(r, off + k, lo, hi); }
    gptr operator-(long long k) const { return gptr(r, off - k, lo, hi); }
    long long operator-(const gptr& o) const { return off - o.off; }
    gptr& operator+=(long long k) { off += k; return *this; }
    gptr& operator-=(long long k) { off -= k; return *this; }
    gptr& operator++() { ++off; return *this; }
    gptr& operator--() { --off; return *this; }
    gptr operator++(int) { gptr p = *this; ++off; return p; }
    gptr operator--(int) { gptr p = *this; --off; return p; }
    bool operator==(const gptr& o) const { return r == o.r && off == o.off; }
    bool operator!=(const gptr& o) const { return !(*this == o); }
    explicit operator bool() const { return r != nullptr; }
};

template <class T> gptr<T> operator+(long long k, const gptr<T>& p) { return p + k; }

// ---- __shared__ arrays: one copy per block, garbage at its start -----------------------------

struct SharedBase {
    Region region;
    void reset() {
        memset(region.data, 0xFF, region.count * region.size);     // NaN floats, -1 integers
        memset(region.shadow, 0, region.count * sizeof(Shadow));
    }
};

template <long long... D> struct product;
template <> struct product<> { static const long long value = 1; };
template <long long D, long long... R> struct product<D, R...> {
    static const long long value = D * product<R...>::value;
};

static void check_dimension(const Region* r, const at& k, long long size) {
    if (k.i < 0 || k.i >= size)
        fail_at(k.line, "indexes __shared__ %s with %lld, outside a dimension of %lld", r->name,
                k.i, size);
}

// A row of an N-dimensional __shared__ array: indexing the first dimension gives the next.
template <class T, long long... D> struct view;
template <class T, long long D> struct view<T, D> {
    const Region* r;
    long long base;
    ref<T> operator[](at k) const {
        check_dimension(r, k, D);
        return {r, base + k.i, base, base + D, k.line};
    }
    operator gptr<T>() const { return gptr<T>(r, base, base, base + D); }
    operator gptr<const T>() const { return gptr<const T>(r, base, base, base + D); }
};
template <class T, long long D, long long E, long long... R> struct view<T, D, E, R...> {
    const Region* r;
    long long base;
    view<T, E, R...> operator[](at k) const {
        check_dimension(r, k, D);
        return {r, base + k.i * product<E, R...>::value};
    }
};

void register_shared(SharedBase* s);        // each __shared__ array, as it is made
// the memory of a __shared__ array of N elements, with its record, reset at each block's start
template <class T, long long N> struct storage : SharedBase {
    alignas(16) unsigned char bytes[sizeof(T) * N];
    Shadow shadows[N];
    explicit storage(const char* name) {
        region = Region{bytes, N, (long long)sizeof(T), name, 1, shadows, nullptr};
        reset();
        register_shared(this);
    }
};

template <class T, long long... D> struct shared;

template <class T, long long D> struct shared<T, D> : storage<T, D> {    // one dimension
    using storage<T, D>::storage;
    ref<T> operator[](at k) const { return {&this->region, k.i, 0, D, k.line}; }
    operator gptr<T>() const { return gptr<T>(&this->region); }
    operator gptr<const T>() const { return gptr<const T>(&this->region); }
};

template <class T, long long D, long long E, long long... R>
struct shared<T, D, E, R...> : storage<T, product<D, E, R...>::value> {    // more dimensions
    using storage<T, product<D, E, R...>::value>::storage;
    view<T, E, R...> operator[](at k) const {
        check_dimension(&this->region, k, D);
        return {&this->region, k.i * product<E, R...>::value};
    }
};

// a __shared__ scalar: one element. The rewrite makes each use of it `name()`: the element, with
// the line of the use (a conversion or an operator of the scalar itself would have no line).
template <class T> struct shared<T> : storage<T, 1> {
    using storage<T, 1>::storage;
    ref<T> operator()(int line = __builtin_LINE()) const { return {&this->region, 0, 0, 1, line}; }
};

// ---- barriers and warp operations --------------------------------------------------------------

// A barrier or warp operation: the thread waits in `state` at `line` until the scheduler
// releases it.
void wait_here(int state, int line);


template <class T> static unsigned long long bits_of(T v) {
    static_assert(sizeof(T) <= 8 && std::is_arithmetic<T>::value,
                  "a warp operation exchanges an arithmetic value of at most 8 bytes");
    unsigned long long b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}

template <class T> static T warp_op(int op, unsigned int mask, T value, int arg, int width,
                                    int line) {
    if (width <= 0 || width > 32 || (width & (width - 1)))
        fail_at(line, "%s with width %d: it must be a power of 2 up to 32", OP_NAMES[op], width);
    current->op = op, current->mask = mask, current->value = bits_of(value);
    current->arg = arg, current->width = width;
    wait_here(AT_WARP, line);
    T out;
    memcpy(&out, &current->result, sizeof(T));
    return out;
}


// One launch: every block of the grid, each thread running `kernel_body` on `args`; the kernel's
// own body spans lines `first_line` to `last_line` of its source (cuda_host.cpp).
int launch(const Config* c, void** args, Fault* f, void (*kernel_body)(void**), int first_line,
           int last_line);

}  // namespace minitfm

// ---- what a kernel sees: CUDA's names --------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__
#define __launch_bounds__(...)
#define threadIdx (minitfm::current->idx)
#define blockIdx (minitfm::block_index)
#define blockDim (minitfm::block_dim)
#define gridDim (minitfm::grid_dim)
#define warpSize 32

inline void __syncthreads(int line = __builtin_LINE()) {
    minitfm::wait_here(minitfm::AT_BARRIER, line);
}
inline void __syncwarp(unsigned int mask = 0xffffffffu, int line = __builtin_LINE()) {
    minitfm::warp_op<int>(minitfm::OP_SYNCWARP, mask, 0, 0, 32, line);
}
inline void __threadfence_block() {}

template <class T> T __shfl_sync(unsigned int mask, T v, int lane, int width = 32,
                                 int line = __builtin_LINE()) {
    return minitfm::warp_op<T>(minitfm::OP_SHFL, mask, v, lane, width, line);
}
template <class T> T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = 32,
                                    int line = __builtin_LINE()) {
    return minitfm::warp_op<T>(minitfm::OP_SHFL_UP, mask, v, (int)delta, width, line);
}
template <class T> T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32,
                                      int line = __builtin_LINE()) {
    return minitfm::warp_op<T>(minitfm::OP_SHFL_DOWN, mask, v, (int)delta, width, line);
}
template <class T> T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32,
                                     int line = __builtin_LINE()) {
    return minitfm::warp_op<T>(minitfm::OP_SHFL_XOR, mask, v, lane_mask, width, line);
}
inline unsigned int __ballot_sync(unsigned int mask, int predicate, int line = __builtin_LINE()) {
    return (unsigned int)minitfm::warp_op<int>(minitfm::OP_BALLOT, mask, predicate != 0, 0, 32,
                                               line);
}
inline int __any_sync(unsigned int mask, int predicate, int line = __builtin_LINE()) {
    return minitfm::warp_op<int>(minitfm::OP_ANY, mask, predicate != 0, 0, 32, line);
}
inline int __all_sync(unsigned int mask, int predicate, int line = __builtin_LINE()) {
    return minitfm::warp_op<int>(minitfm::OP_ALL, mask, predicate != 0, 0, 32, line);
}

// assert() and __trap(): a failing device assert ends the launch (cudaErrorAssert), as __trap()
// does (an error); here each stops the launch at its line. (The rewrite blanks a kernel's
// #include of assert.h or cassert: no header after this one defines assert again.)
namespace minitfm {
inline void assert_failed(const char* condition, int line) {
    fail_at(line, "assertion `%s` failed (on a device the launch ends with cudaErrorAssert)",
            condition);
}
}  // namespace minitfm
#undef assert
#define assert(condition) ((condition) ? (void)0 : minitfm::assert_failed(#condition, __LINE__))
inline void __trap(int line = __builtin_LINE()) {
    minitfm::fail_at(line, "__trap() called: on a device the launch ends with an error");
}

// Atomics: threads never interleave inside one here, so each is its read and its write. They
// are checked for bounds (and a __shared__ element for having been written), not for races:
// atomics on one element from many threads are what atomics are for.
namespace minitfm {
template <class T> T* atomic_at(const gptr<T>& p, int line) {
    check_bounds(p.r, p.off, p.lo, p.hi, line, "updates atomically");
    const Shadow* s = p.r->shadow ? p.r->shadow + p.off : nullptr;
    if (p.r->shared && s && !s->w_block)
        fail_at(line, "updates __shared__ %s[%lld] atomically before any thread of this block "
                "wrote it: shared memory starts as garbage in every block", p.r->name, p.off);
    return static_cast<T*>(p.r->data) + p.off;
}
}  // namespace minitfm
#define MINITFM_ATOMIC(name, expr)                                                               \
    template <class T, class U> T name(minitfm::gptr<T> p, U operand,                            \
                                       int line = __builtin_LINE()) {                            \
        T* at = minitfm::atomic_at(p, line);                                                     \
        T old = *at, v = static_cast<T>(operand);                                                \
        *at = (expr);                                                                            \
        return old;                                                                              \
    }
MINITFM_ATOMIC(atomicAdd, old + v)
MINITFM_ATOMIC(atomicSub, old - v)
MINITFM_ATOMIC(atomicExch, v)
MINITFM_ATOMIC(atomicMax, old > v ? old : v)
MINITFM_ATOMIC(atomicMin, old < v ? old : v)
MINITFM_ATOMIC(atomicAnd, old & v)
MINITFM_ATOMIC(atomicOr, old | v)
MINITFM_ATOMIC(atomicXor, old ^ v)
#undef MINITFM_ATOMIC
template <class T, class U> T atomicCAS(minitfm::gptr<T> p, U compare, U value,
                                        int line = __builtin_LINE()) {
    T* at = minitfm::atomic_at(p, line);
    T old = *at;
    if (old == static_cast<T>(compare)) *at = static_cast<T>(value);
    return old;
}

// Math: the C library's functions (the device's differ by an ulp or two), and CUDA's own.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float v) { int i; memcpy(&i, &v, 4); return i; }
inline float __uint_as_float(unsigned int v) { float f; memcpy(&f, &v, 4); return f; }
inline unsigned int __float_as_uint(float v) { unsigned int i; memcpy(&i, &v, 4); return i; }
inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
inline long long __double_as_longlong(double v) { long long i; memcpy(&i, &v, 8); return i; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned int)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
template <class T> T __ldg(minitfm::gptr<const T> p) { return *p; }

namespace minitfm {

// PTX cvt.f32.f16 and cvt.rn.f16.f32 (round to nearest even; a NaN becomes the canonical 0x7fff).
inline float cvt_f32_f16(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    unsigned int bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else if (m) {                                     // subnormal: normalise
        int shift = 0;
        while (!(m & 0x400u)) m <<= 1, ++shift;
        bits = sign | ((unsigned int)(113 - shift) << 23) | ((m & 0x3ffu) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

inline unsigned short cvt_rn_f16_f32(float f) {
    unsigned int x;
    memcpy(&x, &f, 4);
    unsigned int sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;                        // NaN
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);   // rounds past 65504: Inf
    if (a >= 0x38800000u) {                                      // a normal half
        unsigned int h = (a >> 13) - (112u << 10), rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
        return (unsigned short)(sign | h);
    }
    if (a <= 0x33000000u) return (unsigned short)sign;          // at most half the least: 0
    unsigned int e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    unsigned int h = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return (unsigned short)(sign | h);
}
}  // namespace minitfm

extern "C" long long minitfm_shadow_bytes() { return sizeof(minitfm::Shadow); }

#endif
