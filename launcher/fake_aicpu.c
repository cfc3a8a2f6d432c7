/*
 * A minimal AICPU program, for testing the launcher on its own: the same
 * entry points and WspAicpuArgs as libwsp_aicpu.so, but instead of a
 * runtime it follows CANN.md's handshake by the letter and issues two ADD
 * tasks to every core (ids 1 and 2: both payload buffers):
 *
 *     task 1: C = A + B        task 2: C = C + B
 *
 * on 1 x 8 f32 tensors at arena offset 96 * core (A, B, C of 32 bytes), so
 * that C = A + 2B. It reports in WspAicpuArgs.result like the runtime: the
 * tasks run, or an error naming the task, kernel and core. Every wait is
 * bounded (2 s). Only the launcher's tests load it.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "wsp_aicpu.h"

#ifndef WSP_KERNEL_FAILED_BASE
#define WSP_KERNEL_FAILED_BASE 0xFFFFFFFE00000000ULL
#endif

enum { DATA_MAIN_BASE = 0xA0, COND = 0x4C8, FAST_PATH_ENABLE = 0x18 };
#define MAX_CORES 32
#define FIN 0x80000000u
#define WAIT_NS 2000000000LL

static WspPayload payloads[MAX_CORES][2];
static atomic_int server_threads;

typedef struct KernelArgs {
    uint64_t unused[6];
    WspAicpuArgs *runtime_args; /* @48 */
    const uint64_t *regs;       /* @56 */
} KernelArgs;

/* Shared words: see the launcher's comment on atomics vs MMIO. */
static _Atomic uint32_t *word(uint64_t addr) { return (_Atomic uint32_t *)(uintptr_t)addr; }
static _Atomic uint32_t *reg(const uint64_t *regs, unsigned core, unsigned off) {
    return word(regs[core] + off);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Waits until *w == v; false after WAIT_NS. */
static int wait_eq(_Atomic uint32_t *w, uint32_t v) {
    long long end = now_ns() + WAIT_NS;
    while (atomic_load_explicit(w, memory_order_acquire) != v)
        if (now_ns() > end) return 0;
    return 1;
}

static int fail(WspAicpuArgs *a, const char *text) {
    size_t n = strlen(text);
    if (n >= sizeof a->result.error) n = sizeof a->result.error - 1;
    memcpy(a->result.error, text, n);
    a->result.error[n] = 0;
    a->result.error_len = (uint32_t)n;
    a->result.status = WSP_AICPU_RUN;
    return 1;
}

int DynTileFwkBackendKernelServerInit(void *p) {
    WspAicpuArgs *a = ((KernelArgs *)p)->runtime_args;
    if (a->magic != WSP_AICPU_MAGIC || a->version != WSP_AICPU_VERSION || a->size != sizeof *a ||
        a->num_cores == 0 || a->num_cores > MAX_CORES || a->arena_len < 96u * a->num_cores) {
        a->result.status = WSP_AICPU_BAD_ARGS;
        return 1;
    }
    a->result.status = WSP_AICPU_NOT_INITIALIZED;
    return 0;
}

static WspTensorView view(WspAicpuArgs *a, unsigned core, unsigned which) {
    WspTensorView v = {(uint64_t)(uintptr_t)(a->arena + 96u * core + 32u * which), 1, 8, 8,
                       WSP_DTYPE_F32};
    return v;
}

static int run(WspAicpuArgs *a, const uint64_t *regs) {
    char text[200];
    unsigned cores = a->num_cores;
    for (unsigned c = 0; c < cores; c++) {
        WspHandshake *h = &a->handshakes[c];
        atomic_store_explicit((_Atomic uint64_t *)&h->task, (uint64_t)(uintptr_t)&payloads[c][0],
                              memory_order_relaxed);
        atomic_store_explicit(word((uintptr_t)&h->aicpu_ready), 1, memory_order_release);
    }
    for (unsigned c = 0; c < cores; c++) {
        WspHandshake *h = &a->handshakes[c];
        if (!wait_eq(word((uintptr_t)&h->aicore_regs_ready), 1) ||
            atomic_load(word((uintptr_t)&h->physical_core_id)) != c)
            return snprintf(text, sizeof text, "core %u did not come up", c), fail(a, text);
        atomic_store(reg(regs, c, FAST_PATH_ENABLE), 0xE);
        atomic_store(reg(regs, c, DATA_MAIN_BASE), 0x7FFFFFFD);
        atomic_store_explicit(word((uintptr_t)&h->aicpu_regs_ready), 1, memory_order_release);
        if (!wait_eq(word((uintptr_t)&h->aicore_done), c + 1) ||
            atomic_load(reg(regs, c, COND)) != 0xFFFFFFFFu ||
            (uint32_t)h->core_type != a->core_kinds[c])
            return snprintf(text, sizeof text, "core %u did not finish bring-up", c), fail(a, text);
    }
    uint64_t add = WSP_KERNEL_ADD < a->num_kernels ? a->kernel_addrs[WSP_KERNEL_ADD] : 0;
    if (add == 0) return fail(a, "kernel add is not built in; the table declares it");
    for (unsigned c = 0; c < cores; c++) {
        for (uint32_t id = 1; id <= 2; id++) {
            WspPayload *p = &payloads[c][id & 1];
            memset(p, 0, sizeof *p);
            p->function_bin_addr = add;
            p->kernel_id = WSP_KERNEL_ADD;
            p->args.num_tensors = 3;
            p->args.tensors[0] = view(a, c, id == 1 ? 0 : 2);
            p->args.tensors[1] = view(a, c, 1);
            p->args.tensors[2] = view(a, c, 2);
            atomic_store_explicit(reg(regs, c, DATA_MAIN_BASE), id, memory_order_release);
            _Atomic uint32_t *cond = reg(regs, c, COND);
            long long end = now_ns() + WAIT_NS;
            while (atomic_load_explicit(cond, memory_order_acquire) == 0xFFFFFFFFu ||
                   (atomic_load(cond) & ~FIN) != id)
                if (now_ns() > end)
                    return snprintf(text, sizeof text,
                                    "core %u did not acknowledge task %u (kernel add)", c, id),
                           fail(a, text);
            if (!wait_eq(cond, id | FIN))
                return snprintf(text, sizeof text,
                                "task %u (kernel add) on core %u did not finish", id, c),
                       fail(a, text);
            uint64_t r = atomic_load_explicit((_Atomic uint64_t *)&p->result, memory_order_relaxed);
            if (r == WSP_KERNEL_REJECTED)
                return snprintf(text, sizeof text,
                                "kernel add rejected the arguments of task %u on core %u", id, c),
                       fail(a, text);
            if ((r >> 32) == (WSP_KERNEL_FAILED_BASE >> 32))
                return snprintf(text, sizeof text,
                                "task %u (kernel add) failed on core %u with error code %u", id, c,
                                (unsigned)(uint32_t)r),
                       fail(a, text);
            a->result.tasks++;
        }
    }
    for (unsigned c = 0; c < cores; c++) {
        atomic_store_explicit(reg(regs, c, DATA_MAIN_BASE), 0x7FFFFFF0, memory_order_release);
        if (!wait_eq(reg(regs, c, COND), 0xFFFFFFFEu))
            return snprintf(text, sizeof text, "core %u did not exit", c), fail(a, text);
        atomic_store(reg(regs, c, DATA_MAIN_BASE), 0x7FFFFFFD);
        atomic_store(reg(regs, c, FAST_PATH_ENABLE), 0xF);
    }
    a->result.status = WSP_AICPU_OK;
    return 0;
}

int DynTileFwkBackendKernelServer(void *p) {
    KernelArgs *k = p;
    /* One thread drives everything; the others return at once. */
    if (atomic_fetch_add(&server_threads, 1) != 0) return 0;
    return run(k->runtime_args, k->regs);
}
