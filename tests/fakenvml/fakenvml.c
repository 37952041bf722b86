/*
 * A fake libnvidia-ml.so.1 for hwprofile's tests.
 *
 * It is compiled against NVIDIA's own nvml.h (PyPI package nvidia-nvml-dev), so every
 * prototype and struct layout here is checked by the compiler against the real API.
 * pynvml (nvidia-ml-py) loads it through CDLL("libnvidia-ml.so.1") and runs its real
 * ctypes code on it; real NVML clients (gpustat) run unchanged against it too.
 *
 * State is read at nvmlInitWithFlags time (not at load time: pynvml keeps the library
 * loaded) from the file named by $FAKE_NVML_STATE, and read again by any later call once the
 * file's size or modification time changed (a test can heat a GPU under a running daemon that
 * keeps its handles). One "key=value" per line, '#' comments:
 *
 *   init_error=9                      nvmlInit fails with this code (9: driver not loaded)
 *   driver_version=550.54.15
 *   cuda_version=12040
 *   device_count=2
 *   err.<function>=<code>             every call of <function> fails with <code>
 *   dev<i>.err.<function>=<code>      only for device i
 *   dev<i>.lost=1                     every call on device i fails with GPU_IS_LOST (15)
 *   dev<i>.<field>=<value>            fields: see set_field() below
 *   dev<i>.nvlink_remote.<l>=<bus id> link l is active and ends at that PCI bus id
 *   dev<i>.nvlink_switch=1            every active link ends at an NVSwitch (HGX/DGX boards)
 *   topo.<i>.<j>=<level>              nvmlGpuTopologyLevel between i and j (0,10,20,30,40,50)
 *   p2p.<i>.<j>=<status>              nvmlGpuP2PStatus for i,j (0 = OK), any caps index
 *   p2p.<i>.<j>.<cap>=<status>        the same for one caps index only (0 READ .. 4 PCI)
 *
 * Hardware faults (nvmlDeviceGetTotalEccErrors, GetRetiredPagesPendingStatus, GetRemappedRows,
 * the event set's XID events):
 *   dev<i>.ecc_uncorrected=<n>        volatile uncorrectable ECC count (aggregate: the same + ..._aggregate)
 *   dev<i>.ecc_corrected=<n>          volatile correctable ECC count
 *   dev<i>.ecc_supported=0            ECC calls answer NOT_SUPPORTED (GeForce boards)
 *   dev<i>.retired_pending=1          retired pages wait for a reset
 *   dev<i>.remap_pending=1            remapped rows wait for a reset (Ampere and later)
 *   dev<i>.remap_failure=1            a row remapping failed
 *   dev<i>.remap_uncorrectable=<n>    rows remapped for uncorrectable errors
 *   dev<i>.xid=<x>[,<x>...]           XID critical errors; each is delivered once by nvmlEventSetWait_v2
 *                                     to an event set registered for nvmlEventTypeXidCriticalError
 *                                     (also those written before it registered: a real driver
 *                                     delivers only the XIDs that happen after)
 * Power limit (nvmlDeviceSetPowerManagementLimit and its constraints):
 *   dev<i>.power_limit_min_mw / power_limit_max_mw / power_limit_default_mw
 *   dev<i>.err.nvmlDeviceSetPowerManagementLimit=4   (NO_PERMISSION: not root)
 *   A limit set through the library is kept across re-reads of the state file (as on a card),
 *   as are the XIDs already delivered; another state file at nvmlInit (another host) clears both.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DEV 64
#define MAX_ERR 256
#define MAX_LINKS 18

struct nvmlDevice_st {
    int present;
    int lost;
    char name[96];
    char uuid[96];
    char bus_id[32];
    unsigned int pci_device_id;
    unsigned int pci_subsystem_id;
    unsigned long long mem_total, mem_used, mem_reserved;
    int cc_major, cc_minor;
    int numa_node;          /* -1: not supported */
    char cpu_affinity[256]; /* cpulist like "0-31,64-95" */
    unsigned int pcie_gen, pcie_width, pcie_max_gen, pcie_max_width;
    unsigned int nvlink_links;            /* links that exist (others: NOT_SUPPORTED) */
    int nvlink_active[MAX_LINKS];
    char nvlink_remote[MAX_LINKS][32];    /* remote bus id per link */
    int nvlink_switch;                    /* 1: every link ends at an NVSwitch */
    unsigned int power_limit_mw, power_usage_mw;
    unsigned int temp, temp_slowdown, temp_shutdown, temp_gpu_max;
    int margin_temp, has_margin;          /* NVML's headroom to the slowdown threshold */
    int minor, has_minor;                 /* /dev/nvidia<minor>; default: the index */
    unsigned int sm_clock, sm_clock_max;
    unsigned long long clocks_event_reasons;
    unsigned int fan, util_gpu, util_mem;
    unsigned long long ecc_unc, ecc_corr, ecc_unc_aggr;
    int ecc_unsupported;
    int retired_pending, remap_pending, remap_failure;
    unsigned int remap_unc;
    unsigned long long xids[16];
    int n_xids;
    unsigned int power_min_mw, power_max_mw, power_default_mw;
};

/* Kept across re-reads of the state file: what the library's caller changed or was told. */
static unsigned int set_limit_mw[MAX_DEV];  /* 0: never set */
static int xids_delivered[MAX_DEV];
struct nvmlEventSet_st { unsigned long long mask[MAX_DEV]; int used; };
static struct nvmlEventSet_st event_sets[8];

struct injected { int dev; char fn[80]; nvmlReturn_t code; };

static struct nvmlDevice_st devs[MAX_DEV];
static unsigned int dev_count;
static struct injected errs[MAX_ERR];
static int n_errs;
static int topo[MAX_DEV][MAX_DEV];
static int p2p[MAX_DEV][MAX_DEV];
#define MAX_P2P_CAP 6
static int p2pcap[MAX_DEV][MAX_DEV][MAX_P2P_CAP]; /* -1: as p2p[i][j] */
static char driver_version[80] = "550.54.15";
static int cuda_version = 12040;
static int initialized;

static void reset(void) {
    memset(devs, 0, sizeof devs);
    dev_count = 0;
    n_errs = 0;
    for (int i = 0; i < MAX_DEV; i++)
        for (int j = 0; j < MAX_DEV; j++) {
            topo[i][j] = -1;
            p2p[i][j] = NVML_P2P_STATUS_OK;
            for (int c = 0; c < MAX_P2P_CAP; c++) p2pcap[i][j][c] = -1;
        }
    for (int i = 0; i < MAX_DEV; i++) devs[i].numa_node = -2; /* -2: not given */
    strcpy(driver_version, "550.54.15");
    cuda_version = 12040;
}

static void copy(char *dst, size_t n, const char *src) {
    snprintf(dst, n, "%s", src);
}

static void set_field(struct nvmlDevice_st *d, const char *k, const char *v) {
    unsigned long long u = strtoull(v, NULL, 0);
    if (!strcmp(k, "name")) copy(d->name, sizeof d->name, v);
    else if (!strcmp(k, "uuid")) copy(d->uuid, sizeof d->uuid, v);
    else if (!strcmp(k, "pci_bus_id")) copy(d->bus_id, sizeof d->bus_id, v);
    else if (!strcmp(k, "pci_device_id")) d->pci_device_id = (unsigned int)u;
    else if (!strcmp(k, "pci_subsystem_id")) d->pci_subsystem_id = (unsigned int)u;
    else if (!strcmp(k, "memory_total")) d->mem_total = u;
    else if (!strcmp(k, "memory_used")) d->mem_used = u;
    else if (!strcmp(k, "memory_reserved")) d->mem_reserved = u;
    else if (!strcmp(k, "cc_major")) d->cc_major = (int)u;
    else if (!strcmp(k, "cc_minor")) d->cc_minor = (int)u;
    else if (!strcmp(k, "numa_node")) d->numa_node = atoi(v);
    else if (!strcmp(k, "cpu_affinity")) copy(d->cpu_affinity, sizeof d->cpu_affinity, v);
    else if (!strcmp(k, "pcie_gen")) d->pcie_gen = (unsigned int)u;
    else if (!strcmp(k, "pcie_width")) d->pcie_width = (unsigned int)u;
    else if (!strcmp(k, "pcie_max_gen")) d->pcie_max_gen = (unsigned int)u;
    else if (!strcmp(k, "pcie_max_width")) d->pcie_max_width = (unsigned int)u;
    else if (!strcmp(k, "nvlink_links")) d->nvlink_links = (unsigned int)u > MAX_LINKS ? MAX_LINKS : (unsigned int)u;
    else if (!strncmp(k, "nvlink_remote.", 14)) {
        int l = atoi(k + 14);
        if (l >= 0 && l < MAX_LINKS) {
            copy(d->nvlink_remote[l], sizeof d->nvlink_remote[l], v);
            d->nvlink_active[l] = 1;
        }
    }
    else if (!strncmp(k, "nvlink_active.", 14)) {
        int l = atoi(k + 14);
        if (l >= 0 && l < MAX_LINKS) d->nvlink_active[l] = (int)u;
    }
    else if (!strcmp(k, "nvlink_switch")) d->nvlink_switch = (int)u;
    else if (!strcmp(k, "power_limit_mw")) d->power_limit_mw = (unsigned int)u;
    else if (!strcmp(k, "power_usage_mw")) d->power_usage_mw = (unsigned int)u;
    else if (!strcmp(k, "temperature")) d->temp = (unsigned int)u;
    else if (!strcmp(k, "temperature_slowdown")) d->temp_slowdown = (unsigned int)u;
    else if (!strcmp(k, "temperature_shutdown")) d->temp_shutdown = (unsigned int)u;
    else if (!strcmp(k, "temperature_gpu_max")) d->temp_gpu_max = (unsigned int)u;
    else if (!strcmp(k, "sm_clock")) d->sm_clock = (unsigned int)u;
    else if (!strcmp(k, "sm_clock_max")) d->sm_clock_max = (unsigned int)u;
    else if (!strcmp(k, "clocks_event_reasons")) d->clocks_event_reasons = u;
    else if (!strcmp(k, "fan")) d->fan = (unsigned int)u;
    else if (!strcmp(k, "util_gpu")) d->util_gpu = (unsigned int)u;
    else if (!strcmp(k, "util_mem")) d->util_mem = (unsigned int)u;
    else if (!strcmp(k, "lost")) d->lost = (int)u;
    else if (!strcmp(k, "margin_temperature")) { d->margin_temp = atoi(v); d->has_margin = 1; }
    else if (!strcmp(k, "minor")) { d->minor = atoi(v); d->has_minor = 1; }
    else if (!strcmp(k, "ecc_uncorrected")) d->ecc_unc = u;
    else if (!strcmp(k, "ecc_uncorrected_aggregate")) d->ecc_unc_aggr = u;
    else if (!strcmp(k, "ecc_corrected")) d->ecc_corr = u;
    else if (!strcmp(k, "ecc_supported")) d->ecc_unsupported = !u;
    else if (!strcmp(k, "retired_pending")) d->retired_pending = (int)u;
    else if (!strcmp(k, "remap_pending")) d->remap_pending = (int)u;
    else if (!strcmp(k, "remap_failure")) d->remap_failure = (int)u;
    else if (!strcmp(k, "remap_uncorrectable")) d->remap_unc = (unsigned int)u;
    else if (!strcmp(k, "power_limit_min_mw")) d->power_min_mw = (unsigned int)u;
    else if (!strcmp(k, "power_limit_max_mw")) d->power_max_mw = (unsigned int)u;
    else if (!strcmp(k, "power_limit_default_mw")) d->power_default_mw = (unsigned int)u;
    else if (!strcmp(k, "xid")) {
        const char *p = v;
        d->n_xids = 0;
        while (*p && d->n_xids < 16) {
            char *end;
            unsigned long long x = strtoull(p, &end, 0);
            if (end == p) break;
            d->xids[d->n_xids++] = x;
            p = (*end == ',') ? end + 1 : end;
        }
    }
}

static void add_err(int dev, const char *fn, const char *code) {
    if (n_errs >= MAX_ERR) return;
    errs[n_errs].dev = dev;
    copy(errs[n_errs].fn, sizeof errs[n_errs].fn, fn);
    errs[n_errs].code = (nvmlReturn_t)atoi(code);
    n_errs++;
}

static long long state_stamp = -1; /* mtime in ns + size of the state file last read */

static long long stamp_of(const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return -1;
    return (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec + (long long)st.st_size * 7;
}

static nvmlReturn_t load_state(void) {
    reset();
    const char *path = getenv("FAKE_NVML_STATE");
    if (!path) return NVML_ERROR_DRIVER_NOT_LOADED;
    state_stamp = stamp_of(path);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    char line[1024];
    nvmlReturn_t init_error = NVML_SUCCESS;
    while (fgets(line, sizeof line, f)) {
        char *nl = strpbrk(line, "\r\n");
        if (nl) *nl = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = 0;
        const char *k = line, *v = eq + 1;
        if (!strcmp(k, "init_error")) init_error = (nvmlReturn_t)atoi(v);
        else if (!strcmp(k, "driver_version")) copy(driver_version, sizeof driver_version, v);
        else if (!strcmp(k, "cuda_version")) cuda_version = atoi(v);
        else if (!strcmp(k, "device_count")) dev_count = (unsigned int)atoi(v) > MAX_DEV ? MAX_DEV : (unsigned int)atoi(v);
        else if (!strncmp(k, "err.", 4)) add_err(-1, k + 4, v);
        else if (!strncmp(k, "topo.", 5) || !strncmp(k, "p2p.", 4)) {
            int is_topo = k[0] == 't';
            int i, j, c = -1;
            int got = sscanf(k + (is_topo ? 5 : 4), "%d.%d.%d", &i, &j, &c);
            if (got >= 2 && i >= 0 && j >= 0 && i < MAX_DEV && j < MAX_DEV) {
                if (is_topo) topo[i][j] = topo[j][i] = atoi(v);
                else if (got == 3 && c >= 0 && c < MAX_P2P_CAP) p2pcap[i][j][c] = p2pcap[j][i][c] = atoi(v);
                else if (got == 2) p2p[i][j] = p2p[j][i] = atoi(v);
            }
        }
        else if (!strncmp(k, "dev", 3)) {
            char *dot;
            int i = (int)strtol(k + 3, &dot, 10);
            if (*dot != '.' || i < 0 || i >= MAX_DEV) continue;
            devs[i].present = 1;
            if (!strncmp(dot + 1, "err.", 4)) add_err(i, dot + 5, v);
            else set_field(&devs[i], dot + 1, v);
        }
    }
    fclose(f);
    return init_error;
}

static nvmlReturn_t injected(int dev, const char *fn) {
    for (int i = 0; i < n_errs; i++)
        if ((errs[i].dev == -1 || errs[i].dev == dev) && !strcmp(errs[i].fn, fn)) return errs[i].code;
    return NVML_SUCCESS;
}

/* Re-read the state when its file changed since it was read (handles stay valid: they point
 * into the static device table). */
static void maybe_reload(void) {
    const char *path = getenv("FAKE_NVML_STATE");
    long long now = stamp_of(path);
    if (now != state_stamp) load_state();
}

static int dev_index(nvmlDevice_t d) {
    if (!d) return -1;
    long i = d - devs;
    return (i >= 0 && i < (long)dev_count) ? (int)i : -1;
}

/* Common prologue of every device call: checks init, handle, lost state, injected errors. */
#define DEV_CALL(device, fn)                                     \
    if (!initialized) return NVML_ERROR_UNINITIALIZED;            \
    maybe_reload();                                               \
    int idx = dev_index(device);                                  \
    if (idx < 0) return NVML_ERROR_INVALID_ARGUMENT;              \
    struct nvmlDevice_st *d = &devs[idx];                         \
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;                   \
    { nvmlReturn_t r_ = injected(idx, fn); if (r_) return r_; }

#define SYS_CALL(fn)                                              \
    if (!initialized) return NVML_ERROR_UNINITIALIZED;            \
    { nvmlReturn_t r_ = injected(-1, fn); if (r_) return r_; }

static nvmlReturn_t put_string(char *buf, unsigned int length, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

/* ---- init / system ---- */

static char session_path[1024];

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    /* another state file is another host: what the last one's caller set or was told goes */
    const char *path = getenv("FAKE_NVML_STATE");
    if (path && strcmp(path, session_path)) {
        copy(session_path, sizeof session_path, path);
        memset(set_limit_mw, 0, sizeof set_limit_mw);
        memset(xids_delivered, 0, sizeof xids_delivered);
    }
    nvmlReturn_t r = load_state();
    if (r) { initialized = 0; return r; }
    initialized++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    SYS_CALL("nvmlSystemGetDriverVersion");
    return put_string(version, length, driver_version);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    SYS_CALL("nvmlSystemGetCudaDriverVersion");
    *v = cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    SYS_CALL("nvmlSystemGetCudaDriverVersion_v2");
    *v = cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    SYS_CALL("nvmlSystemGetNVMLVersion");
    char buf[96];
    snprintf(buf, sizeof buf, "12.%s", driver_version);
    return put_string(version, length, buf);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    SYS_CALL("nvmlDeviceGetCount_v2");
    *count = dev_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= dev_count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = injected((int)index, "nvmlDeviceGetHandleByIndex_v2");
    if (r) return r;
    *device = &devs[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* ---- identity ---- */

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_CALL(device, "nvmlDeviceGetIndex");
    *index = (unsigned int)idx;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_CALL(device, "nvmlDeviceGetName");
    return put_string(name, length, d->name);
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_CALL(device, "nvmlDeviceGetUUID");
    return put_string(uuid, length, d->uuid);
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus_id, unsigned int dev_id, unsigned int subsys) {
    memset(pci, 0, sizeof *pci);
    unsigned int dom = 0, bus = 0, slot = 0, fn = 0;
    sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = dev_id;
    pci->pciSubSystemId = subsys;
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", dom & 0xffff, bus, slot, fn);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_CALL(device, "nvmlDeviceGetPciInfo_v3");
    fill_pci(pci, d->bus_id, d->pci_device_id, d->pci_subsystem_id);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV_CALL(device, "nvmlDeviceGetCudaComputeCapability");
    *major = d->cc_major;
    *minor = d->cc_minor;
    return NVML_SUCCESS;
}

/* ---- memory ---- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    DEV_CALL(device, "nvmlDeviceGetMemoryInfo");
    m->total = d->mem_total;
    m->used = d->mem_used + d->mem_reserved;
    m->free = d->mem_total - m->used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m) {
    DEV_CALL(device, "nvmlDeviceGetMemoryInfo_v2");
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = d->mem_total;
    m->reserved = d->mem_reserved;
    m->used = d->mem_used;
    m->free = d->mem_total - d->mem_used - d->mem_reserved;
    return NVML_SUCCESS;
}

/* ---- NUMA and CPU affinity ---- */

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    DEV_CALL(device, "nvmlDeviceGetNumaNodeId");
    if (d->numa_node < 0) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)d->numa_node;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) {
    DEV_CALL(device, "nvmlDeviceGetCpuAffinity");
    if (!d->cpu_affinity[0]) return NVML_ERROR_NOT_SUPPORTED;
    memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
    const char *p = d->cpu_affinity;
    const unsigned int bits = 8 * sizeof(unsigned long);
    while (*p) {
        char *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;
        if (*end == '-') hi = strtoul(end + 1, &end, 10);
        for (unsigned long c = lo; c <= hi; c++)
            if (c / bits < cpuSetSize) cpuSet[c / bits] |= 1UL << (c % bits);
        p = (*end == ',') ? end + 1 : end;
        if (end == p && *p) break;
    }
    return NVML_SUCCESS;
}

/* ---- PCIe ---- */

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *v) {
    DEV_CALL(device, "nvmlDeviceGetCurrPcieLinkGeneration");
    *v = d->pcie_gen;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *v) {
    DEV_CALL(device, "nvmlDeviceGetCurrPcieLinkWidth");
    *v = d->pcie_width;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *v) {
    DEV_CALL(device, "nvmlDeviceGetMaxPcieLinkGeneration");
    *v = d->pcie_max_gen;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *v) {
    DEV_CALL(device, "nvmlDeviceGetMaxPcieLinkWidth");
    *v = d->pcie_max_width;
    return NVML_SUCCESS;
}

/* ---- NVLink and topology ---- */

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    DEV_CALL(device, "nvmlDeviceGetNvLinkState");
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= d->nvlink_links) return NVML_ERROR_NOT_SUPPORTED;
    *isActive = d->nvlink_active[link] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    DEV_CALL(device, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= d->nvlink_links || !d->nvlink_remote[link][0]) return NVML_ERROR_NOT_SUPPORTED;
    fill_pci(pci, d->nvlink_remote[link], 0, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, nvmlIntNvLinkDeviceType_t *type) {
    DEV_CALL(device, "nvmlDeviceGetNvLinkRemoteDeviceType");
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= d->nvlink_links || !d->nvlink_active[link]) return NVML_ERROR_NOT_SUPPORTED;
    *type = d->nvlink_switch ? NVML_NVLINK_DEVICE_TYPE_SWITCH : NVML_NVLINK_DEVICE_TYPE_GPU;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuTopologyLevel_t *pathInfo) {
    DEV_CALL(device1, "nvmlDeviceGetTopologyCommonAncestor");
    int j = dev_index(device2);
    if (j < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (devs[j].lost) return NVML_ERROR_GPU_IS_LOST;
    if (topo[idx][j] < 0) return NVML_ERROR_NOT_SUPPORTED;
    *pathInfo = (nvmlGpuTopologyLevel_t)topo[idx][j];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t p2pIndex, nvmlGpuP2PStatus_t *p2pStatus) {
    DEV_CALL(device1, "nvmlDeviceGetP2PStatus");
    int j = dev_index(device2);
    if (j < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (devs[j].lost) return NVML_ERROR_GPU_IS_LOST;
    int c = (int)p2pIndex;
    int cap = c >= 0 && c < MAX_P2P_CAP ? p2pcap[idx][j][c] : -1;
    *p2pStatus = (nvmlGpuP2PStatus_t)(cap >= 0 ? cap : p2p[idx][j]);
    return NVML_SUCCESS;
}

/* ---- power, thermals, clocks ---- */

static unsigned int limit_of(int idx) {
    return set_limit_mw[idx] ? set_limit_mw[idx] : devs[idx].power_limit_mw;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_CALL(device, "nvmlDeviceGetPowerManagementLimit");
    (void)d;
    *limit = limit_of(idx);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_CALL(device, "nvmlDeviceGetEnforcedPowerLimit");
    (void)d;
    *limit = limit_of(idx);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit, unsigned int *maxLimit) {
    DEV_CALL(device, "nvmlDeviceGetPowerManagementLimitConstraints");
    if (!d->power_min_mw || !d->power_max_mw) return NVML_ERROR_NOT_SUPPORTED;
    *minLimit = d->power_min_mw;
    *maxLimit = d->power_max_mw;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_CALL(device, "nvmlDeviceGetPowerManagementDefaultLimit");
    *limit = d->power_default_mw ? d->power_default_mw : d->power_limit_mw;
    return NVML_SUCCESS;
}
/* As the driver: NO_PERMISSION unless root (inject it with dev<i>.err...), INVALID_ARGUMENT
 * outside the card's constraints. */
nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit) {
    DEV_CALL(device, "nvmlDeviceSetPowerManagementLimit");
    if (!d->power_min_mw || !d->power_max_mw) return NVML_ERROR_NOT_SUPPORTED;
    if (limit < d->power_min_mw || limit > d->power_max_mw) return NVML_ERROR_INVALID_ARGUMENT;
    set_limit_mw[idx] = limit;
    return NVML_SUCCESS;
}

/* ---- hardware faults ---- */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType, nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEV_CALL(device, "nvmlDeviceGetTotalEccErrors");
    if (d->ecc_unsupported) return NVML_ERROR_NOT_SUPPORTED;
    if (!eccCounts) return NVML_ERROR_INVALID_ARGUMENT;
    if (errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        *eccCounts = counterType == NVML_AGGREGATE_ECC ? d->ecc_unc + d->ecc_unc_aggr : d->ecc_unc;
    else if (errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *eccCounts = d->ecc_corr;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    DEV_CALL(device, "nvmlDeviceGetRetiredPagesPendingStatus");
    if (d->ecc_unsupported) return NVML_ERROR_NOT_SUPPORTED;
    *isPending = d->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows, unsigned int *isPending, unsigned int *failureOccurred) {
    DEV_CALL(device, "nvmlDeviceGetRemappedRows");
    if (d->ecc_unsupported) return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = 0;
    *uncRows = d->remap_unc;
    *isPending = (unsigned int)d->remap_pending;
    *failureOccurred = (unsigned int)d->remap_failure;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    SYS_CALL("nvmlEventSetCreate");
    for (int i = 0; i < 8; i++)
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    SYS_CALL("nvmlEventSetFree");
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    DEV_CALL(device, "nvmlDeviceGetSupportedEventTypes");
    (void)d;
    *eventTypes = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    DEV_CALL(device, "nvmlDeviceRegisterEvents");
    (void)d;
    if (!set || !set->used) return NVML_ERROR_INVALID_ARGUMENT;
    set->mask[idx] |= eventTypes;
    return NVML_SUCCESS;
}

/* The next XID not yet delivered on a device registered for it; TIMEOUT at once when none (the
 * fake never waits: the caller's clock is the test's). */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)timeoutms;
    SYS_CALL("nvmlEventSetWait_v2");
    maybe_reload();
    if (!set || !set->used || !data) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < dev_count; i++) {
        if (!(set->mask[i] & nvmlEventTypeXidCriticalError)) continue;
        if (xids_delivered[i] < devs[i].n_xids) {
            memset(data, 0, sizeof *data);
            data->device = &devs[i];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = devs[i].xids[xids_delivered[i]++];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_TIMEOUT;
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEV_CALL(device, "nvmlDeviceGetPowerUsage");
    *power = d->power_usage_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    DEV_CALL(device, "nvmlDeviceGetTemperature");
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t t, unsigned int *temp) {
    DEV_CALL(device, "nvmlDeviceGetTemperatureThreshold");
    unsigned int v = 0;
    switch (t) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: v = d->temp_shutdown; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: v = d->temp_slowdown; break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: v = d->temp_gpu_max; break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    *temp = v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t device, nvmlMarginTemperature_t *info) {
    DEV_CALL(device, "nvmlDeviceGetMarginTemperature");
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->has_margin) return NVML_ERROR_NOT_SUPPORTED;
    info->marginTemperature = d->margin_temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEV_CALL(device, "nvmlDeviceGetMinorNumber");
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = d->has_minor ? (unsigned int)d->minor : (unsigned int)idx;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_CALL(device, "nvmlDeviceGetClockInfo");
    if (type != NVML_CLOCK_SM && type != NVML_CLOCK_GRAPHICS) return NVML_ERROR_NOT_SUPPORTED;
    *clock = d->sm_clock;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_CALL(device, "nvmlDeviceGetMaxClockInfo");
    if (type != NVML_CLOCK_SM && type != NVML_CLOCK_GRAPHICS) return NVML_ERROR_NOT_SUPPORTED;
    *clock = d->sm_clock_max;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEV_CALL(device, "nvmlDeviceGetCurrentClocksEventReasons");
    *reasons = d->clocks_event_reasons;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEV_CALL(device, "nvmlDeviceGetCurrentClocksThrottleReasons");
    *reasons = d->clocks_event_reasons;
    return NVML_SUCCESS;
}

/* ---- what other NVML clients (gpustat) ask for ---- */

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    DEV_CALL(device, "nvmlDeviceGetFanSpeed");
    *speed = d->fan;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEV_CALL(device, "nvmlDeviceGetUtilizationRates");
    u->gpu = d->util_gpu;
    u->memory = d->util_mem;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *u, unsigned int *period) {
    DEV_CALL(device, "nvmlDeviceGetEncoderUtilization");
    *u = 0;
    *period = 1000000;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *u, unsigned int *period) {
    DEV_CALL(device, "nvmlDeviceGetDecoderUtilization");
    *u = 0;
    *period = 1000000;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos) {
    (void)infos;
    DEV_CALL(device, "nvmlDeviceGetComputeRunningProcesses_v3");
    *infoCount = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos) {
    (void)infos;
    DEV_CALL(device, "nvmlDeviceGetGraphicsRunningProcesses_v3");
    *infoCount = 0;
    return NVML_SUCCESS;
}
