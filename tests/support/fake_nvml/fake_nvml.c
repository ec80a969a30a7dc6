/* A stand-in libnvidia-ml.so.1 for the NVML sampler's contract tests.
 *
 * It implements exactly the NVML entry points pynvml calls for tasks/window/sampling/nvml.py, with
 * the C layouts pynvml's ctypes declares, so pynvml's binding code runs for real against it.
 * Values and errors come from the scenario file named by FAKE_NVML_SCENARIO, one directive a
 * line ('#' starts a comment; <g> is the NVML ordinal):
 *
 *   init_error <code>                 nvmlInitWithFlags returns <code>
 *   gpus <n>
 *   gpu <g> <uuid> <minor>
 *   mem <g> <total_bytes> <used_bytes>
 *   power <g> <mW>  |  clock <g> <MHz>  |  temp <g> <C>  |  util <g> <gpu%> <mem%>
 *   batch <g> <samplingType> <valueType> <ts>:<value> ...
 *        the k-th batch line of (g, samplingType) enters the driver buffer at the k-th
 *        size query of nvmlDeviceGetSamples: time passing between two reads
 *   proc <g> <pid> <used_bytes>       a compute process on the GPU
 *   pbatch <g> <pid>:<ts>:<smUtil> ...  likewise for nvmlDeviceGetProcessUtilization
 *   gpm <g> <0|1>                     nvmlGpmQueryDeviceSupport's isSupportedDevice
 *   gpmval <g> <metricId> <v1> <v2> ...  value between GPM samples k and k+1 is v_k (last
 *                                     repeats)
 *   error <g> <function> <code>       that entry point returns <code> for that GPU
 *   lost <g> <n>                      from the n-th entry-point call on that GPU (1-based,
 *                                     every call counts), everything returns GPU_IS_LOST
 *   driver <version>  |  cuda <int>   nvmlSystemGetDriverVersion, …GetCudaDriverVersion(_v2)
 *   name <g> <words…>                 nvmlDeviceGetName (the rest of the line)
 *   persistence <g> <0|1>  |  mig <g> <0|1>   nvmlDeviceGetPersistenceMode, …GetMigMode
 *
 * Like the driver (and unlike NVIDIA's mocknvml): timestamps are honoured (only samples
 * newer than lastSeenTimeStamp come back) and "nothing new" is NVML_ERROR_NOT_FOUND.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0,
    E_UNINITIALIZED = 1,
    E_INVALID_ARGUMENT = 2,
    E_NOT_SUPPORTED = 3,
    E_NOT_FOUND = 6,
    E_INSUFFICIENT_SIZE = 7,
    E_GPU_IS_LOST = 15,
    E_ARGUMENT_VERSION_MISMATCH = 25,
    E_UNKNOWN = 999,
};

#define MAX_GPUS 8
#define MAX_TYPES 10
#define MAX_BATCHES 16
#define MAX_PER_BATCH 64
#define MAX_PROCS 16
#define MAX_ERRORS 16
#define MAX_GPM_METRICS 8
#define MAX_GPM_VALUES 16
#define GPM_METRIC_MAX 477 /* pynvml's NVML_GPM_METRIC_MAX */

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct { /* pynvml's c_nvmlProcessInfo_v2_t, used for the _v3 call too */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int version, isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    const char *shortName, *longName, *unit;
} nvmlGpmMetricInfo_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;

typedef struct fake_gpm_sample {
    int gpu; /* -1 until nvmlGpmSampleGet filled it */
    int seq; /* 1-based order of the fill on that GPU */
} *nvmlGpmSample_t;

typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned long long ts;
    double value;
} point_t;

typedef struct {
    int value_type;
    int nbatches, revealed;
    int count[MAX_BATCHES];
    point_t pts[MAX_BATCHES][MAX_PER_BATCH];
} buffer_t;

typedef struct {
    unsigned int pid;
    unsigned long long ts;
    unsigned int sm;
} psample_t;

typedef struct {
    char fn[64];
    int code;
} injected_t;

typedef struct fake_gpu {
    int index;
    char uuid[96];
    unsigned int minor;
    unsigned long long mem_total, mem_used;
    unsigned int power_mw, clock_mhz, temp_c, util_gpu, util_mem;
    buffer_t buffers[MAX_TYPES];
    int nprocs;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mem[MAX_PROCS];
    int npbatches, prevealed;
    int pcount[MAX_BATCHES];
    psample_t psamples[MAX_BATCHES][MAX_PER_BATCH];
    int gpm_supported, gpm_seq;
    int ngpm;
    unsigned int gpm_id[MAX_GPM_METRICS];
    int gpm_nvals[MAX_GPM_METRICS];
    double gpm_vals[MAX_GPM_METRICS][MAX_GPM_VALUES];
    int nerrors;
    injected_t errors[MAX_ERRORS];
    long lost_at; /* 0: never */
    long calls;
    char name[96];
    int persistence, mig;
} fake_gpu_t;

typedef fake_gpu_t *nvmlDevice_t;

static fake_gpu_t gpus[MAX_GPUS];
static int ngpus = 0;
static int init_error = 0;
static int initialized = 0;
static char driver_version[80] = "580.159.03";
static int cuda_version = 13000;

static void die(const char *what, const char *line) {
    fprintf(stderr, "fake_nvml: bad scenario line (%s): %s\n", what, line);
    exit(97);
}

#define WS " \t\r\n"

/* The next token of a directive; a missing one is a scenario error, not a crash. */
static char *need(char **save, const char *line) {
    char *tok = strtok_r(NULL, WS, save);
    if (!tok) die("missing field", line);
    return tok;
}

static fake_gpu_t *gpu_arg(const char *tok, const char *line) {
    int g = tok ? atoi(tok) : -1;
    if (g < 0 || g >= MAX_GPUS) die("gpu index", line);
    return &gpus[g];
}

static void load_scenario(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    char line[4096], copy[4096];
    FILE *f;
    memset(gpus, 0, sizeof gpus);
    for (int g = 0; g < MAX_GPUS; g++) {
        gpus[g].index = g;
        snprintf(gpus[g].uuid, sizeof gpus[g].uuid, "GPU-fake-%d", g);
        snprintf(gpus[g].name, sizeof gpus[g].name, "NVIDIA Fake GPU");
        gpus[g].minor = (unsigned)g;
    }
    ngpus = 0;
    init_error = 0;
    if (!path || !(f = fopen(path, "r"))) {
        fprintf(stderr, "fake_nvml: FAKE_NVML_SCENARIO unset or unreadable\n");
        exit(98);
    }
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#'), *save = NULL, *kw, *tok;
        if (hash) *hash = 0;
        strncpy(copy, line, sizeof copy - 1);
        copy[sizeof copy - 1] = 0;
        kw = strtok_r(line, WS, &save);
        if (!kw) continue;
        if (!strcmp(kw, "init_error")) {
            init_error = atoi(need(&save, copy));
        } else if (!strcmp(kw, "driver")) {
            snprintf(driver_version, sizeof driver_version, "%s", need(&save, copy));
        } else if (!strcmp(kw, "cuda")) {
            cuda_version = atoi(need(&save, copy));
        } else if (!strcmp(kw, "gpus")) {
            ngpus = atoi(need(&save, copy));
            if (ngpus < 0 || ngpus > MAX_GPUS) die("gpus", copy);
        } else {
            fake_gpu_t *d = gpu_arg(need(&save, copy), copy);
            if (!strcmp(kw, "gpu")) {
                tok = need(&save, copy);
                if (!tok) die("uuid", copy);
                snprintf(d->uuid, sizeof d->uuid, "%s", tok);
                d->minor = (unsigned)strtoul(need(&save, copy), NULL, 10);
            } else if (!strcmp(kw, "mem")) {
                d->mem_total = strtoull(need(&save, copy), NULL, 10);
                d->mem_used = strtoull(need(&save, copy), NULL, 10);
            } else if (!strcmp(kw, "power")) {
                d->power_mw = (unsigned)atoi(need(&save, copy));
            } else if (!strcmp(kw, "clock")) {
                d->clock_mhz = (unsigned)atoi(need(&save, copy));
            } else if (!strcmp(kw, "temp")) {
                d->temp_c = (unsigned)atoi(need(&save, copy));
            } else if (!strcmp(kw, "util")) {
                d->util_gpu = (unsigned)atoi(need(&save, copy));
                d->util_mem = (unsigned)atoi(need(&save, copy));
            } else if (!strcmp(kw, "batch")) {
                int type = atoi(need(&save, copy));
                buffer_t *b;
                if (type < 0 || type >= MAX_TYPES) die("sampling type", copy);
                b = &d->buffers[type];
                b->value_type = atoi(need(&save, copy));
                if (b->nbatches >= MAX_BATCHES) die("too many batches", copy);
                while ((tok = strtok_r(NULL, WS, &save))) {
                    int n = b->count[b->nbatches];
                    if (n >= MAX_PER_BATCH) die("batch too long", copy);
                    if (sscanf(tok, "%llu:%lf", &b->pts[b->nbatches][n].ts,
                               &b->pts[b->nbatches][n].value) != 2)
                        die("ts:value", copy);
                    b->count[b->nbatches]++;
                }
                b->nbatches++;
            } else if (!strcmp(kw, "proc")) {
                if (d->nprocs >= MAX_PROCS) die("too many procs", copy);
                d->proc_pid[d->nprocs] = (unsigned)atoi(need(&save, copy));
                d->proc_mem[d->nprocs] = strtoull(need(&save, copy), NULL, 10);
                d->nprocs++;
            } else if (!strcmp(kw, "pbatch")) {
                if (d->npbatches >= MAX_BATCHES) die("too many pbatches", copy);
                while ((tok = strtok_r(NULL, WS, &save))) {
                    int n = d->pcount[d->npbatches];
                    psample_t *p = &d->psamples[d->npbatches][n];
                    if (n >= MAX_PER_BATCH) die("pbatch too long", copy);
                    if (sscanf(tok, "%u:%llu:%u", &p->pid, &p->ts, &p->sm) != 3)
                        die("pid:ts:sm", copy);
                    d->pcount[d->npbatches]++;
                }
                d->npbatches++;
            } else if (!strcmp(kw, "gpm")) {
                d->gpm_supported = atoi(need(&save, copy));
            } else if (!strcmp(kw, "gpmval")) {
                int m = d->ngpm;
                if (m >= MAX_GPM_METRICS) die("too many gpm metrics", copy);
                d->ngpm++;
                d->gpm_id[m] = (unsigned)atoi(need(&save, copy));
                while ((tok = strtok_r(NULL, WS, &save)) && d->gpm_nvals[m] < MAX_GPM_VALUES)
                    d->gpm_vals[m][d->gpm_nvals[m]++] = atof(tok);
            } else if (!strcmp(kw, "error")) {
                injected_t *e;
                if (d->nerrors >= MAX_ERRORS) die("too many errors", copy);
                e = &d->errors[d->nerrors++];
                snprintf(e->fn, sizeof e->fn, "%s", need(&save, copy));
                e->code = atoi(need(&save, copy));
            } else if (!strcmp(kw, "lost")) {
                d->lost_at = atol(need(&save, copy));
            } else if (!strcmp(kw, "name")) {
                char *rest = strtok_r(NULL, "\r\n", &save);
                if (!rest) die("name", copy);
                while (*rest == ' ' || *rest == '\t') rest++;
                snprintf(d->name, sizeof d->name, "%s", rest);
            } else if (!strcmp(kw, "persistence")) {
                d->persistence = atoi(need(&save, copy));
            } else if (!strcmp(kw, "mig")) {
                d->mig = atoi(need(&save, copy));
            } else {
                die("unknown directive", copy);
            }
        }
    }
    fclose(f);
}

/* Every device entry point starts here: count the call, then lost / injected errors. */
static nvmlReturn_t enter(nvmlDevice_t d, const char *fn) {
    if (!initialized) return E_UNINITIALIZED;
    if (!d || d < gpus || d >= gpus + ngpus) return E_INVALID_ARGUMENT;
    d->calls++;
    if (d->lost_at > 0 && d->calls >= d->lost_at) return E_GPU_IS_LOST;
    for (int i = 0; i < d->nerrors; i++)
        if (!strcmp(d->errors[i].fn, fn)) return d->errors[i].code;
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load_scenario();
    if (init_error) return init_error;
    initialized = 1;
    return OK;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return E_UNINITIALIZED;
    initialized = 0;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINITIALIZED: return "Uninitialized";
    case E_INVALID_ARGUMENT: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NOT_FOUND: return "Not Found";
    case E_INSUFFICIENT_SIZE: return "Insufficient Size";
    case E_GPU_IS_LOST: return "GPU is lost";
    case E_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return E_UNINITIALIZED;
    if (!count) return E_INVALID_ARGUMENT;
    *count = (unsigned)ngpus;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return E_UNINITIALIZED;
    if (index >= (unsigned)ngpus || !device) return E_INVALID_ARGUMENT;
    *device = &gpus[index];
    return OK;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetUUID");
    if (r) return r;
    if (!uuid) return E_INVALID_ARGUMENT;
    if (strlen(d->uuid) + 1 > length) return E_INSUFFICIENT_SIZE;
    strcpy(uuid, d->uuid);
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetName");
    if (r) return r;
    if (!name) return E_INVALID_ARGUMENT;
    if (strlen(d->name) + 1 > length) return E_INSUFFICIENT_SIZE;
    strcpy(name, d->name);
    return OK;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetPersistenceMode");
    if (r) return r;
    *mode = d->persistence;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetMigMode");
    if (r) return r;
    *current = (unsigned)d->mig;
    *pending = (unsigned)d->mig;
    return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return E_UNINITIALIZED;
    if (strlen(driver_version) + 1 > length) return E_INSUFFICIENT_SIZE;
    strcpy(version, driver_version);
    return OK;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialized) return E_UNINITIALIZED;
    *version = cuda_version;
    return OK;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetMinorNumber");
    if (r) return r;
    *minor = d->minor;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetMemoryInfo");
    if (r) return r;
    m->total = d->mem_total;
    m->used = d->mem_used;
    m->free = d->mem_total - d->mem_used;
    return OK;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetPowerUsage");
    if (r) return r;
    *mw = d->power_mw;
    return OK;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetClockInfo");
    if (r) return r;
    if (type != 1) return E_NOT_SUPPORTED; /* only NVML_CLOCK_SM is scripted */
    *mhz = d->clock_mhz;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetTemperature");
    if (r) return r;
    if (sensor != 0) return E_INVALID_ARGUMENT;
    *c = d->temp_c;
    return OK;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetUtilizationRates");
    if (r) return r;
    u->gpu = d->util_gpu;
    u->memory = d->util_mem;
    return OK;
}

static void put_value(nvmlValue_t *v, int type, double x) {
    switch (type) {
    case 0: v->dVal = x; break;
    case 1: v->uiVal = (unsigned int)x; break;
    case 2: v->ulVal = (unsigned long)x; break;
    case 3: v->ullVal = (unsigned long long)x; break;
    case 4: v->sllVal = (long long)x; break;
    case 5: v->siVal = (int)x; break;
    default: v->usVal = (unsigned short)x; break;
    }
}

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long lastSeen,
                                  int *valType, unsigned int *count, nvmlSample_t *samples) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetSamples");
    buffer_t *b;
    unsigned int n = 0;
    if (r) return r;
    if (type < 0 || type >= MAX_TYPES || !count || !valType) return E_INVALID_ARGUMENT;
    b = &d->buffers[type];
    if (b->nbatches == 0) return E_NOT_SUPPORTED; /* nothing scripted: not on this GPU */
    if (!samples && b->revealed < b->nbatches) b->revealed++; /* a size query: time passed */
    *valType = b->value_type;
    for (int k = 0; k < b->revealed; k++)
        for (int i = 0; i < b->count[k]; i++) {
            if (b->pts[k][i].ts <= lastSeen) continue; /* the driver honours lastSeen */
            if (samples) {
                if (n >= *count) return E_INSUFFICIENT_SIZE;
                samples[n].timeStamp = b->pts[k][i].ts;
                put_value(&samples[n].sampleValue, b->value_type, b->pts[k][i].value);
            }
            n++;
        }
    if (n == 0) return E_NOT_FOUND;
    *count = n;
    return OK;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned int room;
    if (r) return r;
    if (!count) return E_INVALID_ARGUMENT;
    room = *count;
    *count = (unsigned)d->nprocs;
    if (d->nprocs == 0) return OK;
    if (!infos || room < (unsigned)d->nprocs) return E_INSUFFICIENT_SIZE;
    for (int i = 0; i < d->nprocs; i++) {
        infos[i].pid = d->proc_pid[i];
        infos[i].usedGpuMemory = d->proc_mem[i];
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return OK;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                             nvmlProcessUtilizationSample_t *out,
                                             unsigned int *count,
                                             unsigned long long lastSeen) {
    nvmlReturn_t r = enter(d, "nvmlDeviceGetProcessUtilization");
    unsigned int n = 0, room;
    if (r) return r;
    if (!count) return E_INVALID_ARGUMENT;
    if (!out && d->prevealed < d->npbatches) d->prevealed++;
    room = *count;
    for (int k = 0; k < d->prevealed; k++)
        for (int i = 0; i < d->pcount[k]; i++) {
            psample_t *p = &d->psamples[k][i];
            if (p->ts <= lastSeen) continue;
            if (out && n < room) {
                memset(&out[n], 0, sizeof out[n]);
                out[n].pid = p->pid;
                out[n].timeStamp = p->ts;
                out[n].smUtil = p->sm;
            }
            n++;
        }
    if (n == 0) return E_NOT_FOUND; /* nothing newer than lastSeen */
    *count = n;
    if (!out || room < n) return E_INSUFFICIENT_SIZE;
    return OK;
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    nvmlReturn_t r = enter(d, "nvmlGpmQueryDeviceSupport");
    if (r) return r;
    if (!s) return E_INVALID_ARGUMENT;
    if (s->version != 1) return E_ARGUMENT_VERSION_MISMATCH;
    s->isSupportedDevice = (unsigned)d->gpm_supported;
    return OK;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out) {
    if (!initialized) return E_UNINITIALIZED;
    if (!out) return E_INVALID_ARGUMENT;
    *out = calloc(1, sizeof **out);
    (*out)->gpu = -1;
    return OK;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) {
    if (!s) return E_INVALID_ARGUMENT;
    free(s);
    return OK;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) {
    nvmlReturn_t r = enter(d, "nvmlGpmSampleGet");
    if (r) return r;
    if (!s) return E_INVALID_ARGUMENT;
    if (!d->gpm_supported) return E_NOT_SUPPORTED;
    s->gpu = d->index;
    s->seq = ++d->gpm_seq;
    return OK;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    fake_gpu_t *d;
    nvmlReturn_t r;
    if (!initialized) return E_UNINITIALIZED;
    if (!m) return E_INVALID_ARGUMENT;
    if (m->version != 1) return E_ARGUMENT_VERSION_MISMATCH;
    if (!m->sample1 || !m->sample2 || m->sample1->gpu < 0 || m->sample1->gpu != m->sample2->gpu ||
        m->sample2->seq <= m->sample1->seq || m->numMetrics > GPM_METRIC_MAX)
        return E_INVALID_ARGUMENT;
    d = &gpus[m->sample1->gpu];
    if ((r = enter(d, "nvmlGpmMetricsGet"))) return r;
    for (unsigned i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        x->nvmlReturn = E_NOT_SUPPORTED;
        x->value = 0;
        x->metricInfo.shortName = x->metricInfo.longName = x->metricInfo.unit = NULL;
        for (int k = 0; k < d->ngpm; k++)
            if (d->gpm_id[k] == x->metricId && d->gpm_nvals[k] > 0) {
                int at = m->sample2->seq - 2; /* samples 1→2 are the first interval */
                if (at >= d->gpm_nvals[k]) at = d->gpm_nvals[k] - 1;
                if (at < 0) at = 0;
                x->value = d->gpm_vals[k][at];
                x->nvmlReturn = OK;
                x->metricInfo.unit = "%";
            }
    }
    return OK;
}
