/* Stand-in libcuda.so.1 of the testbed's driver packages: the few driver API calls of
 * tritonfleet.gpu.cuda_check's program (cuInit ... cuLaunchKernel), answered for the stand-in
 * GPU(s) of /etc/nvidia-standin/gpu.env, which the stand-in runtime hook copies into a --gpus
 * container beside this library.  "Device memory" is host memory; the one kernel it knows,
 * vectorAdd, is recognised in the PTX by its entry name and run on the CPU over the launch's
 * grid (what a real driver does on the GPU after compiling the PTX).  It does not compile PTX.
 *
 * Faults: /etc/nvidia-standin/cuda-fault (copied in by the hook), one word a line: a driver
 * branch ("590") or "all".  A launch under a listed branch returns CUDA_ERROR_LAUNCH_FAILED (719),
 * as a kernel that faults on the GPU does; "wrong" instead makes the sums wrong.
 * Error codes and names: CUDA Driver API, cudaError_enum (docs.nvidia.com/cuda/cuda-driver-api,
 * group__CUDA__TYPES).
 * Built by tritonfleet_testbed/standin_repo.py with -DSTANDIN_DRIVER_VERSION="<version>". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef STANDIN_DRIVER_VERSION
#define STANDIN_DRIVER_VERSION "580.82.07"
#endif

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_PTX = 218, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_LAUNCH_FAILED = 719,
};

static int initialised;
static int device_count = -1;
static char gpu_name[128] = "";
static int fault_launch, fault_wrong;
static char kernel_entry[64];

/* NVIDIA_STANDIN_ROOT: a directory the files are read below (tests on the control machine), as
 * the stand-in nvidia-smi and hook read it */
static FILE *open_standin(const char *path) {
    char full[1024];
    const char *root = getenv("NVIDIA_STANDIN_ROOT");
    snprintf(full, sizeof full, "%s%s", root ? root : "", path);
    return fopen(full, "r");
}

static void read_line_value(const char *line, const char *key, char *out, size_t size) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) == 0 && line[n] == '=') {
        const char *v = line + n + 1;
        if (*v == '\'' || *v == '"') v++;
        snprintf(out, size, "%s", v);
        out[strcspn(out, "'\"\n")] = 0;
    }
}

static const char *driver_version(void) {
    static char loaded[64];
    FILE *f = open_standin("/run/nvidia-standin/module-version");
    if (f) {
        if (fgets(loaded, sizeof loaded, f)) {
            loaded[strcspn(loaded, " \n")] = 0;
            fclose(f);
            if (loaded[0]) return loaded;
        } else {
            fclose(f);
        }
    }
    return STANDIN_DRIVER_VERSION;
}

static void load(void) {
    char line[512], count[16] = "1";
    FILE *f = open_standin("/etc/nvidia-standin/gpu.env");
    device_count = 0;
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        read_line_value(line, "GPU_NAME", gpu_name, sizeof gpu_name);
        read_line_value(line, "GPU_COUNT", count, sizeof count);
    }
    fclose(f);
    device_count = gpu_name[0] ? atoi(count) : 0;
    char branch[16];
    snprintf(branch, sizeof branch, "%s", driver_version());
    branch[strcspn(branch, ".")] = 0;
    f = open_standin("/etc/nvidia-standin/cuda-fault");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, " \n")] = 0;
            if (strcmp(line, "all") == 0 || strcmp(line, branch) == 0) fault_launch = 1;
            if (strcmp(line, "wrong") == 0) fault_wrong = 1;
        }
        fclose(f);
    }
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    load();
    if (device_count <= 0) return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    /* the CUDA version the branch supports (nvidia-smi's "CUDA Version"), as 1000*major + 10*minor */
    int branch = atoi(driver_version());
    *version = branch >= 580 ? 13000 : branch >= 575 ? 12090 : branch >= 570 ? 12080 : branch >= 560 ? 12060
             : branch >= 550 ? 12040 : 12020;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(int *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, int device) {
    if (device < 0 || device >= device_count || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", gpu_name);
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(void **ctx, unsigned int flags, int device) {
    (void)flags;
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *ctx = malloc(1);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(void *ctx) {
    free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

CUresult cuModuleLoadData(void **module, const void *image) {
    const char *ptx = image;
    const char *entry = strstr(ptx, ".entry ");
    if (!strstr(ptx, ".version") || !strstr(ptx, ".target") || !entry) return CUDA_ERROR_INVALID_PTX;
    entry += strlen(".entry ");
    size_t n = strcspn(entry, "( \n");
    if (n >= sizeof kernel_entry) return CUDA_ERROR_INVALID_PTX;
    memcpy(kernel_entry, entry, n);
    kernel_entry[n] = 0;
    *module = kernel_entry;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void **function, void *module, const char *name) {
    if (!module || strcmp(name, (const char *)module) != 0 || strcmp(name, "vectorAdd") != 0)
        return CUDA_ERROR_NOT_FOUND;
    *function = module;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(uint64_t *dptr, size_t size) {
    void *p = malloc(size ? size : 1);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (uint64_t)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(uint64_t dptr) {
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t size) {
    memcpy((void *)(uintptr_t)dst, src, size);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t size) {
    memcpy(dst, (const void *)(uintptr_t)src, size);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, void *stream,
                        void **params, void **extra) {
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream; (void)extra;
    if (!f || !params) return CUDA_ERROR_INVALID_VALUE;
    if (fault_launch) return CUDA_ERROR_LAUNCH_FAILED;
    float *a = (float *)(uintptr_t)*(uint64_t *)params[0];
    float *b = (float *)(uintptr_t)*(uint64_t *)params[1];
    float *c = (float *)(uintptr_t)*(uint64_t *)params[2];
    unsigned int n = *(unsigned int *)params[3];
    unsigned long threads = (unsigned long)gx * bx;
    for (unsigned long i = 0; i < threads && i < n; i++) c[i] = a[i] + b[i] + (fault_wrong ? 1.0f : 0.0f);
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_PTX: *name = "CUDA_ERROR_INVALID_PTX"; break;
    case CUDA_ERROR_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; break;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
