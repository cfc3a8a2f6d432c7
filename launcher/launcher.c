/*
 * wsp-launcher: stands in for CANN's launch flow so that the AICPU shared
 * object (libwsp_aicpu.so) runs without hardware, as an aarch64 Linux
 * program under qemu-user.
 *
 * It does what CANN's trampoline does: dlopen the .so with
 * RTLD_LAZY | RTLD_DEEPBIND, fill a 144-byte KernelArgs (runtime_args @48
 * pointing to the runtime's WspAicpuArgs, regs @56 to the per-core register
 * bases), call DynTileFwkBackendKernelServerInit once and
 * DynTileFwkBackendKernelServer on N threads, for each launch (--repeat:
 * several launches in one dlopen, as CANN makes them). It also does what the AICores
 * do: one thread per core serves that core's handshake over a malloc'd
 * register file and runs the project's C++ kernels (linked in, compiled
 * with the host shim's flags, so results are bit-identical).
 *
 * Usage: wsp-launcher SO TABLE ARENA OUT [options]; see usage() below.
 * Exit status: 0 success, 1 the run failed (the runtime's error text is
 * printed), 2 bad usage or input, 3 the launcher timed out.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsp_kernel_abi.h"
#include "wsp_aicpu.h"

#ifndef WSP_KERNEL_FAILED_BASE
/* The result word of a kernel that fails with an error code (see
 * wsp_kernel_abi.h): WSP_KERNEL_FAILED_BASE | code. */
#define WSP_KERNEL_FAILED_BASE 0xFFFFFFFE00000000ULL
#endif

/* ---- CANN's KernelArgs (144 B), as CANN.md lays it out ---------------- */

typedef struct KernelArgs {
    uint64_t unused[5];             /* @0 */
    uint64_t device_args;           /* @40 -> DeviceArgs */
    uint64_t runtime_args;          /* @48 -> WspAicpuArgs */
    uint64_t regs;                  /* @56 -> uint64_t[cores] register bases */
    uint64_t ffts_base_addr;        /* @64 */
    uint64_t profiling[6];          /* @72 .. @112: profiling / dump pointers */
    uint32_t log_level;             /* @120 */
    uint32_t reserved;              /* @124 */
    uint32_t enable_profiling_flag; /* @128 */
    uint32_t pad;                   /* @132 */
    uint64_t device_wall_data_base; /* @136 */
} KernelArgs;

_Static_assert(sizeof(KernelArgs) == 144, "KernelArgs is 144 bytes");
_Static_assert(offsetof(KernelArgs, device_args) == 40, "device_args @40");
_Static_assert(offsetof(KernelArgs, runtime_args) == 48, "runtime_args @48");
_Static_assert(offsetof(KernelArgs, regs) == 56, "regs @56");
_Static_assert(offsetof(KernelArgs, ffts_base_addr) == 64, "ffts @64");
_Static_assert(offsetof(KernelArgs, log_level) == 120, "log_level @120");
_Static_assert(offsetof(KernelArgs, enable_profiling_flag) == 128, "profiling flag @128");
_Static_assert(offsetof(KernelArgs, device_wall_data_base) == 136, "wall data @136");
/* The runtime's view of the same 144 bytes (wsp_aicpu.h) agrees. */
_Static_assert(sizeof(WspCannKernelArgs) == sizeof(KernelArgs), "the runtime's KernelArgs is 144 bytes");
_Static_assert(offsetof(WspCannKernelArgs, runtime_args) == offsetof(KernelArgs, runtime_args),
               "the runtime reads runtime_args @48");
_Static_assert(offsetof(WspCannKernelArgs, regs) == offsetof(KernelArgs, regs), "the runtime reads regs @56");

/* What device_args points to: the .so's bytes, as the host copied them. */
typedef struct DeviceArgs {
    uint64_t unused[12];
    uint64_t so_bin; /* @96 */
    uint64_t so_len; /* @104 */
} DeviceArgs;

_Static_assert(offsetof(DeviceArgs, so_bin) == 96, "so_bin @96");
_Static_assert(offsetof(DeviceArgs, so_len) == 104, "so_len @104");

/* The launch block CANN receives with the KernelArgs. */
typedef struct LaunchBlock {
    KernelArgs args;
    char kernel_name[32];
    char so_name[32];
    char op_name[32];
} LaunchBlock;

/* ---- Capacities of this launcher --------------------------------------- */

/* AICores it emulates at most (the runtime checks its own bound). */
#define MAX_CORES 32
/* AICPU threads it starts at most. */
#define MAX_THREADS 16
/* Entries of the kernel address table: every kernel id of
 * wsp_kernel_abi.h is below it. */
#define KERNEL_SLOTS 32

/* ---- The AICore registers, handshake and payload ------------------------ */

/* One dispatch payload buffer as the runtime writes it (WspPayload: 512 B,
 * 64-aligned; `task` in the handshake record points at the first of a
 * core's two): CANN's `function_bin_addr` @0 and the kernel's arguments
 * after it, then this project's kernel id and the result word the AICore
 * writes before FIN. Checked here against CANN.md's contract. */
typedef WspPayload Payload;

_Static_assert(sizeof(Payload) == 512, "a payload buffer is 512 bytes");
_Static_assert(offsetof(Payload, function_bin_addr) == 0, "function_bin_addr @0");
_Static_assert(offsetof(Payload, args) == 8, "args @8");
_Static_assert(offsetof(Payload, kernel_id) == 144, "kernel_id @144");
_Static_assert(offsetof(Payload, result) == 152, "result @152");

/* The handshake record (CANN.md): 64 B, 64-aligned. */
typedef WspHandshake Handshake;

_Static_assert(sizeof(Handshake) == 64 && _Alignof(Handshake) == 64, "a handshake record is 64 bytes");
_Static_assert(offsetof(Handshake, aicore_done) == 4, "aicore_done @4");
_Static_assert(offsetof(Handshake, task) == 8, "task @8");
_Static_assert(offsetof(Handshake, core_type) == 16, "core_type @16");
_Static_assert(offsetof(Handshake, physical_core_id) == 20, "physical_core_id @20");
_Static_assert(offsetof(Handshake, aicpu_regs_ready) == 24, "aicpu_regs_ready @24");
_Static_assert(offsetof(Handshake, aicore_regs_ready) == 28, "aicore_regs_ready @28");

enum {
    REG_FAST_PATH_ENABLE = 0x18,
    REG_DATA_MAIN_BASE = 0xA0,
    REG_COND = 0x4C8,
    /* One core's register file: past COND, a multiple of 64. */
    REG_FILE_BYTES = 0x500,
};

#define FIN 0x80000000u
#define ID_EXIT 0x7FFFFFF0u
#define ID_AICPU_IDLE 0x7FFFFFFDu
#define COND_IDLE 0xFFFFFFFFu
#define COND_EXITED 0xFFFFFFFEu

/* Cores are threads of this process sharing memory with the AICPU threads,
 * so the shared words (registers, handshake fields, the result word) are C11
 * atomics: acquire/release orders the payload and the arena data around
 * them, and the compiler may neither cache nor tear them. On the real device
 * the registers are MMIO, where the runtime uses volatile 32-bit accesses
 * with explicit `dmb ish` barriers and cache maintenance instead: atomics on
 * Device memory are not allowed there, and ordinary memory ordering does
 * not reach the device. A lock-free 32/64-bit atomic has the same size and
 * representation as the plain integer, so the runtime's accesses and ours
 * meet on the same words. */
static _Atomic uint32_t *reg(uint8_t *base, size_t offset) {
    return (_Atomic uint32_t *)(void *)(base + offset);
}

static _Atomic uint32_t *u32_field(volatile void *p) {
    return (_Atomic uint32_t *)(uintptr_t)p;
}

static _Atomic uint64_t *u64_field(volatile void *p) {
    return (_Atomic uint64_t *)(uintptr_t)p;
}

_Static_assert(sizeof(_Atomic uint32_t) == 4, "atomic u32 is a u32");
_Static_assert(sizeof(_Atomic uint64_t) == 8, "atomic u64 is a u64");

/* ---- Options ----------------------------------------------------------- */

enum FaultKind { FAULT_NONE, FAULT_NEVER_ACK, FAULT_NEVER_FIN };

typedef struct Options {
    const char *so, *table, *arena, *out;
    /* A launch block file (symbols, scheduler threads, policy); NULL: none. */
    const char *launch;
    unsigned threads, cube, vector, timeout_secs;
    /* A core that never acknowledges / never finishes (-1: none). */
    int never_ack_core, never_fin_core;
    /* A kernel that fails with `error_code` instead of running (0: none). */
    uint32_t error_kernel, error_code;
    /* Kernels left out of the address table (not built in). */
    uint8_t omit[KERNEL_SLOTS];
    /* Launches in one dlopen, and how many of the first carry the faults
     * (--fault, --omit-kernel; default: all). */
    unsigned repeat, faulty_launches;
    int faulty_given;
} Options;

static void usage(void) {
    fprintf(stderr,
            "usage: wsp-launcher SO TABLE ARENA OUT [--threads N] [--cube N] [--vector N]\n"
            "         [--timeout-secs S] [--fault never-ack=CORE] [--fault never-fin=CORE]\n"
            "         [--fault error=KERNEL_ID:CODE] [--omit-kernel ID]... [--launch FILE]\n"
            "         [--repeat N] [--faulty-launches K]\n"
            "  Runs descriptor table TABLE on arena ARENA through the AICPU runtime SO\n"
            "  (scheduler threads N, default 2) and emulated AICores (cube cores first,\n"
            "  default 2 + 2); writes the arena to OUT on success. FILE: a launch block\n"
            "  (symbols, scheduler threads, policy) handed to the runtime as it is.\n"
            "  --repeat N: N launches (Init + server) in one dlopen, each on a fresh copy\n"
            "  of ARENA; the faults apply to the first K (--faulty-launches, default N),\n"
            "  which must fail but the last; the others must succeed with equal arenas.\n");
}

/* Parses a decimal number in [0, max]; false on anything else. */
static int parse_u32(const char *s, uint32_t max, uint32_t *out) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) return 0;
    *out = (uint32_t)v;
    return 1;
}

static int parse_fault(Options *o, const char *f) {
    uint32_t v;
    if (strncmp(f, "never-ack=", 10) == 0 && parse_u32(f + 10, 1023, &v)) {
        o->never_ack_core = (int)v;
        return 1;
    }
    if (strncmp(f, "never-fin=", 10) == 0 && parse_u32(f + 10, 1023, &v)) {
        o->never_fin_core = (int)v;
        return 1;
    }
    if (strncmp(f, "error=", 6) == 0) {
        char kernel[16];
        const char *colon = strchr(f + 6, ':');
        size_t n = colon ? (size_t)(colon - (f + 6)) : 0;
        if (!colon || n == 0 || n >= sizeof kernel) return 0;
        memcpy(kernel, f + 6, n);
        kernel[n] = 0;
        return parse_u32(kernel, KERNEL_SLOTS - 1, &o->error_kernel) && o->error_kernel != 0 &&
               parse_u32(colon + 1, UINT32_MAX, &o->error_code);
    }
    return 0;
}

static int parse_options(int argc, char **argv, Options *o) {
    const char *pos[4];
    int npos = 0;
    memset(o, 0, sizeof *o);
    o->threads = 2;
    o->cube = 2;
    o->vector = 2;
    o->timeout_secs = 120;
    o->never_ack_core = -1;
    o->never_fin_core = -1;
    o->repeat = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint32_t v;
        if (strncmp(a, "--", 2) != 0) {
            if (npos == 4) {
                fprintf(stderr, "wsp-launcher: unexpected argument `%s`\n", a);
                return 0;
            }
            pos[npos++] = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "wsp-launcher: %s needs a value\n", a);
            return 0;
        }
        const char *val = argv[++i];
        if (strcmp(a, "--threads") == 0 && parse_u32(val, MAX_THREADS, &v) && v > 0) {
            o->threads = v;
        } else if (strcmp(a, "--cube") == 0 && parse_u32(val, MAX_CORES, &v)) {
            o->cube = v;
        } else if (strcmp(a, "--vector") == 0 && parse_u32(val, MAX_CORES, &v)) {
            o->vector = v;
        } else if (strcmp(a, "--timeout-secs") == 0 && parse_u32(val, 86400, &v) && v > 0) {
            o->timeout_secs = v;
        } else if (strcmp(a, "--launch") == 0) {
            o->launch = val;
        } else if (strcmp(a, "--fault") == 0 && parse_fault(o, val)) {
        } else if (strcmp(a, "--omit-kernel") == 0 && parse_u32(val, KERNEL_SLOTS - 1, &v) && v > 0) {
            o->omit[v] = 1;
        } else if (strcmp(a, "--repeat") == 0 && parse_u32(val, 1000, &v) && v > 0) {
            o->repeat = v;
        } else if (strcmp(a, "--faulty-launches") == 0 && parse_u32(val, 1000, &v)) {
            o->faulty_launches = v;
            o->faulty_given = 1;
        } else {
            fprintf(stderr, "wsp-launcher: bad option %s %s\n", a, val);
            return 0;
        }
    }
    if (npos != 4) {
        fprintf(stderr, "wsp-launcher: expected SO TABLE ARENA OUT, got %d paths\n", npos);
        return 0;
    }
    unsigned cores = o->cube + o->vector;
    if (cores == 0 || cores > MAX_CORES) {
        fprintf(stderr, "wsp-launcher: %u cores; 1 to %u\n", cores, (unsigned)MAX_CORES);
        return 0;
    }
    if ((o->never_ack_core >= 0 && (unsigned)o->never_ack_core >= cores) ||
        (o->never_fin_core >= 0 && (unsigned)o->never_fin_core >= cores)) {
        fprintf(stderr, "wsp-launcher: a --fault names a core past the last (%u)\n", cores - 1);
        return 0;
    }
    if (!o->faulty_given) o->faulty_launches = o->repeat;
    if (o->faulty_launches > o->repeat) {
        fprintf(stderr, "wsp-launcher: --faulty-launches %u of %u launches\n", o->faulty_launches, o->repeat);
        return 0;
    }
    o->so = pos[0];
    o->table = pos[1];
    o->arena = pos[2];
    o->out = pos[3];
    return 1;
}

/* ---- Files ------------------------------------------------------------- */

/* Reads `path` into a 64-aligned buffer (at least 64 bytes, zero-padded). */
static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "wsp-launcher: opening %s: %s\n", path, strerror(errno));
        return NULL;
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "wsp-launcher: reading %s: %s\n", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    size_t cap = ((size_t)size + 64 + 63) & ~(size_t)63;
    uint8_t *buf = aligned_alloc(64, cap);
    if (!buf) {
        fprintf(stderr, "wsp-launcher: %s: out of memory\n", path);
        fclose(f);
        return NULL;
    }
    memset(buf, 0, cap);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "wsp-launcher: reading %s: short read\n", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)size;
    return buf;
}

/* The descriptor table header's fields this launcher reads (ABI v3,
 * device_runtime::abi::layout; xtask's tests check these against it). */
#define TABLE_MAGIC "PTOWSP\r\n"
#define TABLE_ABI_VERSION 3u
#define TABLE_HEADER_SIZE 80u
#define TABLE_VERSION_AT 8u
#define TABLE_HEADER_SIZE_AT 12u
#define TABLE_TOTAL_LEN_AT 16u

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A table file is one table: refuses one with bytes after its header's
 * total_len (something appended to it), as `wsp run` does; the runtime
 * reads total_len bytes of the window it is handed and would silently
 * ignore the rest. Every other fault (not a table, another version, a
 * file cut short) is left to the runtime, which names it. */
static int check_table_file(const char *path, const uint8_t *bytes, size_t len) {
    if (len < TABLE_HEADER_SIZE || memcmp(bytes, TABLE_MAGIC, 8) != 0 ||
        le32(bytes + TABLE_VERSION_AT) != TABLE_ABI_VERSION ||
        le32(bytes + TABLE_HEADER_SIZE_AT) != TABLE_HEADER_SIZE)
        return 1;
    uint32_t total = le32(bytes + TABLE_TOTAL_LEN_AT);
    if (total < TABLE_HEADER_SIZE || len <= total) return 1;
    fprintf(stderr,
            "wsp-launcher: %s: invalid descriptor table: section `header`, entry 0, field `total_len`: "
            "the table is %" PRIu32 " bytes long, but %zu bytes were given: %zu bytes follow it "
            "(a table file holds one table and nothing after it)\n",
            path, total, len, len - (size_t)total);
    return 0;
}

static int write_file(const char *path, const uint8_t *bytes, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "wsp-launcher: writing %s: %s\n", path, strerror(errno));
        return 0;
    }
    return 1;
}

/* ---- Kernels ----------------------------------------------------------- */

/* Every kernel of wsp_kernel_abi.h by id: the address table the AICPU
 * dispatches through (function_bin_addr). */
static WspKernelEntry kernel_entry(uint32_t id) {
    switch (id) {
    case WSP_KERNEL_ADD: return wsp_kernel_add;
    case WSP_KERNEL_GEMM_TILE: return wsp_kernel_gemm_tile;
    case WSP_KERNEL_RMSNORM: return wsp_kernel_rmsnorm;
    case WSP_KERNEL_SOFTMAX: return wsp_kernel_softmax;
    case WSP_KERNEL_ROUTE_TOPK: return wsp_kernel_route_topk;
    case WSP_KERNEL_EXPERT_ROWS: return wsp_kernel_expert_rows;
    case WSP_KERNEL_ATTN_DECODE_PARTIAL: return wsp_kernel_attn_decode_partial;
    case WSP_KERNEL_ATTN_MERGE: return wsp_kernel_attn_merge;
    case WSP_KERNEL_INDEXER_SCORES: return wsp_kernel_indexer_scores;
    case WSP_KERNEL_TOPK: return wsp_kernel_topk;
    case WSP_KERNEL_ATTN_SPARSE_PARTIAL: return wsp_kernel_attn_sparse_partial;
    case WSP_KERNEL_DECODE_PLAN: return wsp_kernel_decode_plan;
    case WSP_KERNEL_SILU_MUL: return wsp_kernel_silu_mul;
    case WSP_KERNEL_MOE_ROUTE: return wsp_kernel_moe_route;
    case WSP_KERNEL_MOE_ALIGN: return wsp_kernel_moe_align;
    case WSP_KERNEL_GATHER_ROWS: return wsp_kernel_gather_rows;
    case WSP_KERNEL_MATMUL: return wsp_kernel_matmul;
    case WSP_KERNEL_SQUARE: return wsp_kernel_square;
    case WSP_KERNEL_COPY: return wsp_kernel_copy;
    case WSP_KERNEL_ROPE: return wsp_kernel_rope;
    default: return NULL;
    }
}

/* ---- AICore threads ---------------------------------------------------- */

typedef struct Core {
    pthread_t thread;
    unsigned index;
    int is_cube;
    uint8_t *regs;        /* its register file */
    Handshake *hs; /* its handshake record */
    const Options *opts;
    WspKernelEntry error_entry; /* the kernel of --fault error, if any */
} Core;

static void spin(void) {
    /* qemu-user runs each thread on a host thread; yielding lets the
     * AICPU threads run when there are fewer host CPUs than threads. */
    sched_yield();
}

/* Waits until *word == want. Unbounded: a runtime that gives up on a core
 * during bring-up returns, and main() then releases the core (and the alarm
 * bounds the whole run). */
static void wait_u32(_Atomic uint32_t *word, uint32_t want) {
    while (atomic_load_explicit(word, memory_order_acquire) != want) spin();
}

static void *core_main(void *arg) {
    Core *c = arg;
    _Atomic uint32_t *data = reg(c->regs, REG_DATA_MAIN_BASE);
    _Atomic uint32_t *cond = reg(c->regs, REG_COND);

    /* Bring-up (CANN.md): the AICPU publishes the payload address and
     * aicpu_ready; the core answers with its id; the AICPU opens the fast
     * path; the core reports idle, its type and that it is done. */
    wait_u32(u32_field(&c->hs->aicpu_ready), 1);
    uint64_t task_addr = atomic_load_explicit(u64_field(&c->hs->task), memory_order_acquire);
    atomic_store_explicit(u32_field(&c->hs->physical_core_id), c->index, memory_order_relaxed);
    atomic_store_explicit(u32_field(&c->hs->aicore_regs_ready), 1, memory_order_release);
    wait_u32(u32_field(&c->hs->aicpu_regs_ready), 1);
    atomic_store_explicit(cond, COND_IDLE, memory_order_relaxed);
    atomic_store_explicit(u32_field(&c->hs->core_type),
                          c->is_cube ? WSP_CORE_CUBE : WSP_CORE_VECTOR,
                          memory_order_relaxed);
    atomic_store_explicit(u32_field(&c->hs->aicore_done), c->index + 1, memory_order_release);

    int never_ack = c->opts->never_ack_core == (int)c->index;
    int never_fin = c->opts->never_fin_core == (int)c->index;
    uint32_t last = 0;
    for (;;) {
        uint32_t id = atomic_load_explicit(data, memory_order_acquire);
        if (id == ID_EXIT) break;
        if (id == last || id == 0 || id == ID_AICPU_IDLE || id > ID_EXIT) {
            spin();
            continue;
        }
        if (never_ack) {
            /* The faulty core sees the task and never takes it. */
            spin();
            continue;
        }
        atomic_store_explicit(cond, id, memory_order_release); /* ACK */
        last = id;
        if (never_fin) continue; /* takes it, never finishes it */
        Payload *p = (Payload *)(uintptr_t)(task_addr + (uint64_t)(id & 1) * sizeof(Payload));
        uint64_t fn = p->function_bin_addr;
        uint64_t result;
        if (fn == 0) {
            fprintf(stderr, "wsp-launcher: core %u: task %u has no kernel address\n", c->index, id);
            result = WSP_KERNEL_REJECTED;
        } else if (c->error_entry && fn == (uint64_t)(uintptr_t)c->error_entry) {
            result = WSP_KERNEL_FAILED_BASE | c->opts->error_code;
        } else {
            WspKernelEntry entry = (WspKernelEntry)(uintptr_t)fn;
            result = entry(&p->args);
        }
        atomic_store_explicit(u64_field(&p->result), result, memory_order_relaxed);
        atomic_store_explicit(cond, id | FIN, memory_order_release); /* FIN */
    }
    atomic_store_explicit(cond, COND_EXITED, memory_order_release);
    return NULL;
}

/* ---- AICPU threads ----------------------------------------------------- */

typedef int (*ServerEntry)(void *kernel_args);

typedef struct Server {
    pthread_t thread;
    ServerEntry entry;
    KernelArgs *args;
    int status;
} Server;

static void *server_main(void *arg) {
    Server *s = arg;
    s->status = s->entry(s->args);
    return NULL;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "wsp-launcher: timed out (a thread does not return)\n";
    ssize_t n = write(2, msg, sizeof msg - 1);
    (void)n;
    _exit(3);
}

int main(int argc, char **argv) {
    Options o;
    if (!parse_options(argc, argv, &o)) {
        usage();
        return 2;
    }
    signal(SIGALRM, on_alarm);
    alarm(o.timeout_secs);

    size_t table_len, arena_len, so_len;
    uint8_t *table = read_file(o.table, &table_len);
    uint8_t *arena = read_file(o.arena, &arena_len);
    uint8_t *so_bytes = read_file(o.so, &so_len);
    size_t launch_len = 0;
    uint8_t *launch_bytes = o.launch ? read_file(o.launch, &launch_len) : NULL;
    if (!table || !arena || !so_bytes || (o.launch && !launch_bytes)) return 2;
    if (!check_table_file(o.table, table, table_len)) return 2;

    /* RTLD_DEEPBIND as CANN loads it: the .so binds to its own symbols first. */
    void *so = dlopen(o.so, RTLD_LAZY | RTLD_DEEPBIND);
    if (!so) {
        fprintf(stderr, "wsp-launcher: dlopen %s: %s\n", o.so, dlerror());
        return 2;
    }
    ServerEntry init = (ServerEntry)dlsym(so, "DynTileFwkBackendKernelServerInit");
    ServerEntry server = (ServerEntry)dlsym(so, "DynTileFwkBackendKernelServer");
    if (!init || !server) {
        fprintf(stderr, "wsp-launcher: %s lacks the DynTileFwkBackendKernelServer entry points\n", o.so);
        return 2;
    }

    unsigned cores = o.cube + o.vector;
    static Core core[MAX_CORES];
    static uint64_t reg_bases[MAX_CORES];
    static uint32_t core_kinds[MAX_CORES];
    static uint64_t kernel_addrs[KERNEL_SLOTS];
    Handshake *hs = aligned_alloc(64, sizeof(Handshake) * MAX_CORES);
    if (!hs) return 2;
    memset(hs, 0, sizeof(Handshake) * MAX_CORES);

    for (uint32_t id = 1; id < KERNEL_SLOTS; id++) {
        WspKernelEntry e = kernel_entry(id);
        if (e && !o.omit[id]) kernel_addrs[id] = (uint64_t)(uintptr_t)e;
    }
    WspKernelEntry error_entry = NULL;
    if (o.error_kernel) {
        error_entry = kernel_entry(o.error_kernel);
        if (!error_entry) {
            fprintf(stderr, "wsp-launcher: --fault error=%u: no such kernel\n", o.error_kernel);
            return 2;
        }
    }

    for (unsigned i = 0; i < cores; i++) {
        uint8_t *regs = aligned_alloc(64, REG_FILE_BYTES);
        if (!regs) return 2;
        memset(regs, 0, REG_FILE_BYTES);
        atomic_store_explicit(reg(regs, REG_COND), COND_IDLE & ~FIN, memory_order_relaxed);
        reg_bases[i] = (uint64_t)(uintptr_t)regs;
        core_kinds[i] = i < o.cube ? WSP_CORE_CUBE : WSP_CORE_VECTOR;
        core[i] = (Core){.index = i, .is_cube = i < o.cube, .regs = regs, .hs = &hs[i],
                         .opts = &o, .error_entry = error_entry};
    }

    WspAicpuArgs *rt = aligned_alloc(64, (sizeof(WspAicpuArgs) + 63) & ~(size_t)63);
    if (!rt) return 2;
    memset(rt, 0, sizeof *rt);
    rt->magic = WSP_AICPU_MAGIC;
    rt->version = WSP_AICPU_VERSION;
    rt->size = sizeof *rt;
    rt->aicpu_threads = o.threads;
    rt->table = table;
    rt->table_len = table_len;
    rt->arena = arena;
    rt->arena_len = arena_len;
    rt->launch = launch_bytes; /* NULL: no launch block, the runtime's defaults */
    rt->launch_len = launch_len;
    rt->kernel_addrs = kernel_addrs;
    rt->num_kernels = KERNEL_SLOTS;
    rt->num_cores = cores;
    rt->core_kinds = core_kinds;
    rt->handshakes = hs;
    rt->num_regs = cores;
    rt->timeout_us = 0; /* the runtime's default bound */

    static DeviceArgs device;
    memset(&device, 0, sizeof device);
    device.so_bin = (uint64_t)(uintptr_t)so_bytes;
    device.so_len = so_len;
    static LaunchBlock launch;
    memset(&launch, 0, sizeof launch);
    launch.args.device_args = (uint64_t)(uintptr_t)&device;
    launch.args.runtime_args = (uint64_t)(uintptr_t)rt;
    launch.args.regs = (uint64_t)(uintptr_t)reg_bases;
    snprintf(launch.kernel_name, sizeof launch.kernel_name, "DynTileFwkBackendKernelServer");
    snprintf(launch.so_name, sizeof launch.so_name, "libwsp_aicpu.so");
    snprintf(launch.op_name, sizeof launch.op_name, "AST_DYN_AICPU");
    /* CANN copies KernelArgs into AICPU-private memory: so do we. */
    KernelArgs *kargs = aligned_alloc(64, 192);
    if (!kargs) return 2;
    memcpy(kargs, &launch.args, sizeof *kargs);

    /* The launches. A launch without the faults sees none of them. */
    Options clean = o;
    clean.never_ack_core = -1;
    clean.never_fin_core = -1;
    clean.error_kernel = 0;
    static uint64_t clean_addrs[KERNEL_SLOTS];
    for (uint32_t id = 1; id < KERNEL_SLOTS; id++)
        clean_addrs[id] = (uint64_t)(uintptr_t)kernel_entry(id);
    uint8_t *input = malloc(arena_len ? arena_len : 1);
    uint8_t *first_out = malloc(arena_len ? arena_len : 1);
    if (!input || !first_out) return 2;
    memcpy(input, arena, arena_len);
    unsigned first_ok = 0; /* the first launch that succeeded (1-based), 0: none yet */
    int outcome = 0;       /* 0 OK, 1 the run failed */
    char reason[WSP_AICPU_ERROR_LEN + 96] = "";
    int has_faults = o.never_ack_core >= 0 || o.never_fin_core >= 0 || o.error_kernel != 0;
    for (uint32_t id = 1; id < KERNEL_SLOTS; id++) has_faults |= o.omit[id];
    for (unsigned l = 1; l <= o.repeat; l++) {
        int faulty = has_faults && l <= o.faulty_launches;
        const Options *lo = faulty ? &o : &clean;
        /* The host's part of a fresh launch: the input arena, zeroed
         * handshake records and register files, a fresh result. */
        memcpy(arena, input, arena_len);
        memset(hs, 0, sizeof(Handshake) * cores);
        memset(&rt->result, 0, sizeof rt->result);
        rt->kernel_addrs = faulty ? kernel_addrs : clean_addrs;
        for (unsigned i = 0; i < cores; i++) {
            uint8_t *regs = (uint8_t *)(uintptr_t)reg_bases[i];
            memset(regs, 0, REG_FILE_BYTES);
            atomic_store_explicit(reg(regs, REG_COND), COND_IDLE & ~FIN, memory_order_relaxed);
            core[i].opts = lo;
            core[i].error_entry = faulty ? error_entry : NULL;
        }

        for (unsigned i = 0; i < cores; i++) {
            if (pthread_create(&core[i].thread, NULL, core_main, &core[i]) != 0) {
                fprintf(stderr, "wsp-launcher: starting core thread %u failed\n", i);
                return 2;
            }
        }
        int init_status = init(kargs);
        Server servers[MAX_THREADS];
        if (init_status == 0) {
            for (unsigned t = 0; t < o.threads; t++) {
                servers[t] = (Server){.entry = server, .args = kargs, .status = 0};
                if (pthread_create(&servers[t].thread, NULL, server_main, &servers[t]) != 0) {
                    fprintf(stderr, "wsp-launcher: starting AICPU thread %u failed\n", t);
                    return 2;
                }
            }
            for (unsigned t = 0; t < o.threads; t++) pthread_join(servers[t].thread, NULL);
        }
        /* The runtime tells every core to exit when it ends; a runtime that
         * failed before bring-up never did, so tell them here (harmless after). */
        for (unsigned i = 0; i < cores; i++)
            atomic_store_explicit(reg((uint8_t *)(uintptr_t)reg_bases[i], REG_DATA_MAIN_BASE), ID_EXIT,
                                  memory_order_release);
        for (unsigned i = 0; i < cores; i++) {
            /* A core still waiting for bring-up: release it so it can exit. */
            atomic_store_explicit(u32_field(&hs[i].aicpu_ready), 1, memory_order_release);
            atomic_store_explicit(u32_field(&hs[i].aicpu_regs_ready), 1, memory_order_release);
        }
        for (unsigned i = 0; i < cores; i++) pthread_join(core[i].thread, NULL);

        int failed_thread = 0;
        for (unsigned t = 0; init_status == 0 && t < o.threads; t++) failed_thread |= servers[t].status != 0;
        const WspAicpuResult *res = &rt->result;
        int failed = init_status != 0 || failed_thread || res->status != WSP_AICPU_OK;
        int last = l == o.repeat;
        if (failed) {
            /* The runtime NUL-terminates its text; bound it anyway. */
            const char *text = (const char *)res->error;
            int len = (int)strnlen(text, sizeof res->error);
            if (len == 0) text = "(the runtime gave no error text)", len = (int)strlen(text);
            if (o.repeat > 1) printf("LAUNCH %u ERROR %.*s\n", l, len, text);
            fprintf(stderr, "wsp-launcher: launch %u failed (status %d, init %d): %.*s\n", l,
                    (int)res->status, init_status, len, text);
            if (!outcome && (last || !faulty)) {
                outcome = 1;
                if (last && o.repeat == 1)
                    snprintf(reason, sizeof reason, "%.*s", len, text);
                else
                    snprintf(reason, sizeof reason, "launch %u: %.*s", l, len, text);
            }
            continue;
        }
        if (o.repeat > 1)
            printf("LAUNCH %u OK tasks=%" PRIu64 "\n", l, res->tasks);
        if (!outcome && faulty && !last) {
            outcome = 1;
            snprintf(reason, sizeof reason, "launch %u: the run succeeded despite its faults", l);
        }
        if (!first_ok) {
            first_ok = l;
            memcpy(first_out, arena, arena_len);
        } else if (!outcome && memcmp(first_out, arena, arena_len) != 0) {
            outcome = 1;
            snprintf(reason, sizeof reason, "launch %u: the arena differs from launch %u's", l, first_ok);
        }
        if (last && !outcome) {
            if (!write_file(o.out, arena, arena_len)) return 2;
            printf("tasks=%" PRIu64 " wall_ticks=%" PRIu64 " ticks_per_second=%" PRIu64 "\n", res->tasks,
                   res->wall_ticks, res->ticks_per_second);
        }
    }
    if (outcome) {
        printf("RESULT ERROR %s\n", reason);
        return 1;
    }
    printf("RESULT OK\n");
    return 0;
}
