/*
 * backends.c — the backend registry: which table serves each device type.
 * The one file that names every backend, so that the core reaches them only
 * through fi_backend_for (dependencies: core -> this table -> backends).
 */
#include "cpu/cpu.h"
#include "cuda/cuda_backend.h"

const fi_backend *fi_backend_for(fi_device_type device) {
    switch (device) {
    case FI_DEVICE_CPU: return &fi_cpu_backend;
    case FI_DEVICE_CUDA: return &fi_cuda_backend;
    }
    return NULL;
}
