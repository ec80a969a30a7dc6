/* A stand-in libcuda for the contract tests of tasks/engine/gpu/driver.py (no GPU runs
 * here): the checkpoint API's five calls, cuInit, cuDriverGetVersion and the error strings,
 * with the driver's state machine per pid (running -> locked -> checkpointed -> locked ->
 * running) and CUDA_ERROR_ILLEGAL_STATE out of order. Every call is appended to the file
 * named by FAKE_LIBCUDA_LOG, one line each, so a test can assert the exact call order and
 * arguments. A pid listed in FAKE_LIBCUDA_UNSUPPORTED (comma-separated) answers
 * CUDA_ERROR_NOT_SUPPORTED at checkpoint, as the driver does for managed (UVM) memory; so does
 * a process whose command line names cuMemAllocManaged (the GPU check's UVM program, which
 * runs against this library too: cuCtxCreate_v2 and cuMemAllocManaged answer success). A pid
 * first seen while FAKE_LIBCUDA_NEW=checkpointed starts checkpointed; so does one first seen
 * while a checkpointed pid has gone (CRIU restored, under a new host pid, a process dumped in
 * that state): it takes the gone one's place. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, ILLEGAL_STATE = 401, NOT_SUPPORTED = 801 };
enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2, FAILED = 3 };

typedef struct { unsigned int timeoutMs; unsigned int reserved0; uint64_t reserved1[7]; } LockArgs;
typedef struct { uint64_t reserved[8]; } Reserved64;
typedef struct { void *gpuPairs; unsigned int gpuPairsCount; char reserved[52 - sizeof(void *)]; uint64_t reserved1; } RestoreArgs;

static int initialised = 0;
static int pids[64], states[64], npids = 0;

static void logline(const char *fmt, ...) {
    const char *path = getenv("FAKE_LIBCUDA_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static int gone(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d", pid);
    return access(path, F_OK) != 0;
}

static int *state_of(int pid) {
    for (int i = 0; i < npids; i++) if (pids[i] == pid) return &states[i];
    for (int i = 0; i < npids; i++)
        if (states[i] == CHECKPOINTED && gone(pids[i])) { pids[i] = pid; return &states[i]; }
    if (npids == 64) return NULL;
    const char *fresh = getenv("FAKE_LIBCUDA_NEW");
    pids[npids] = pid;
    states[npids] = fresh && !strcmp(fresh, "checkpointed") ? CHECKPOINTED : RUNNING;
    return &states[npids++];
}

static int names_managed_memory(int pid) {
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++) if (!buf[i]) buf[i] = ' ';
    buf[n] = 0;
    return strstr(buf, "cuMemAllocManaged") != NULL;
}

static int unsupported(int pid) {
    const char *list = getenv("FAKE_LIBCUDA_UNSUPPORTED");
    char buf[256];
    if (names_managed_memory(pid)) return 1;
    if (!list) return 0;
    strncpy(buf, list, sizeof(buf) - 1); buf[sizeof(buf) - 1] = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        if (atoi(tok) == pid) return 1;
    return 0;
}

static int zero(const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) if (c[i]) return 0;
    return 1;
}

CUresult cuInit(unsigned int flags) { logline("cuInit flags=%u", flags); initialised = 1; return OK; }

CUresult cuDriverGetVersion(int *v) {
    logline("cuDriverGetVersion");
    if (!v) return INVALID_VALUE;
    *v = 13000; return OK;
}

CUresult cuGetErrorName(CUresult e, const char **s) {
    *s = e == ILLEGAL_STATE ? "CUDA_ERROR_ILLEGAL_STATE" : e == NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED"
       : e == NOT_INITIALIZED ? "CUDA_ERROR_NOT_INITIALIZED" : "CUDA_ERROR_INVALID_VALUE";
    return OK;
}

CUresult cuGetErrorString(CUresult e, const char **s) {
    *s = e == ILLEGAL_STATE ? "the operation is not permitted in the process's current state"
       : e == NOT_SUPPORTED ? "operation not supported" : "invalid argument";
    return OK;
}

CUresult cuCheckpointProcessGetState(int pid, int *state) {
    logline("cuCheckpointProcessGetState pid=%d", pid);
    if (!initialised) return NOT_INITIALIZED;
    int *s = state_of(pid);
    if (!s || !state) return INVALID_VALUE;
    *state = *s; return OK;
}

CUresult cuCheckpointProcessLock(int pid, LockArgs *args) {
    logline("cuCheckpointProcessLock pid=%d timeoutMs=%ld", pid, args ? (long)args->timeoutMs : -1L);
    if (!initialised) return NOT_INITIALIZED;
    if (args && (args->reserved0 || !zero(args->reserved1, sizeof(args->reserved1)))) return INVALID_VALUE;
    int *s = state_of(pid);
    if (!s) return INVALID_VALUE;
    if (*s != RUNNING) return ILLEGAL_STATE;
    *s = LOCKED; return OK;
}

CUresult cuCheckpointProcessCheckpoint(int pid, Reserved64 *args) {
    logline("cuCheckpointProcessCheckpoint pid=%d", pid);
    if (args && !zero(args, sizeof(*args))) return INVALID_VALUE;
    int *s = state_of(pid);
    if (!s) return INVALID_VALUE;
    if (*s != LOCKED) return ILLEGAL_STATE;
    if (unsupported(pid)) return NOT_SUPPORTED;
    *s = CHECKPOINTED; return OK;
}

CUresult cuCheckpointProcessRestore(int pid, RestoreArgs *args) {
    logline("cuCheckpointProcessRestore pid=%d gpuPairsCount=%ld", pid, args ? (long)args->gpuPairsCount : -1L);
    if (args && !zero(args->reserved, sizeof(args->reserved))) return INVALID_VALUE;
    int *s = state_of(pid);
    if (!s) return INVALID_VALUE;
    if (*s != CHECKPOINTED) return ILLEGAL_STATE;
    *s = LOCKED; return OK;
}

CUresult cuCheckpointProcessUnlock(int pid, Reserved64 *args) {
    logline("cuCheckpointProcessUnlock pid=%d", pid);
    if (args && !zero(args, sizeof(*args))) return INVALID_VALUE;
    int *s = state_of(pid);
    if (!s) return INVALID_VALUE;
    if (*s != LOCKED) return ILLEGAL_STATE;
    *s = RUNNING; return OK;
}

CUresult cuCtxCreate_v2(void **ctx, unsigned int flags, int dev) {
    logline("cuCtxCreate_v2 flags=%u dev=%d", flags, dev);
    static int token;
    if (!ctx) return INVALID_VALUE;
    *ctx = &token; return OK;
}

CUresult cuMemAllocManaged(uint64_t *ptr, size_t bytes, unsigned int flags) {
    logline("cuMemAllocManaged bytes=%zu flags=%u", bytes, flags);
    if (!ptr) return INVALID_VALUE;
    void *p = malloc(bytes);
    if (!p) return INVALID_VALUE;
    *ptr = (uint64_t)(uintptr_t)p; return OK;
}
