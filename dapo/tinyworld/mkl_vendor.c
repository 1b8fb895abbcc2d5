/* Preloaded (LD_PRELOAD), this library makes MKL answer its CPU-vendor questions as one vendor would, on any x86-64
 * host: compiled with -DAS_INTEL=1 MKL takes its Intel code paths, with -DAS_INTEL=0 the paths it takes on other
 * vendors' CPUs (AMD's). `tiny.kernels: portable` preloads the Intel one into the tiny world's build and runs, so
 * that Intel and AMD CPUs build the same world (dapo/tinyworld/kernels.py); the tests preload either one to stand
 * in for a CPU of that vendor.
 *
 * PyTorch's wheel links MKL statically into libtorch_cpu.so and exports MKL's service functions; its own calls to
 * them go through the PLT, so a preloaded definition wins. MKL asks two questions:
 *   mkl_serv_intel_cpu_true: is the CPU vendor GenuineIntel (cpuid leaf 0)?
 *   mkl_serv_intel_cpu:      should it take the Intel paths? That depends on the reproducibility branch
 *                            (MKL_CBWR, read back with mkl_serv_cbwr_get(1)): 3 = COMPATIBLE answers no whatever the
 *                            vendor; every other branch answers the vendor check.
 * Checked against real Intel Xeons: the default world (and a 60-step build) made on an AMD EPYC with AS_INTEL=1 has
 * the SHA-256 that a real Xeon builds (docs/evidence.md). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef AS_INTEL
#error "compile with -DAS_INTEL=1 (Intel) or -DAS_INTEL=0 (another vendor)"
#endif

int mkl_serv_intel_cpu_true(void) { return AS_INTEL; }

int mkl_serv_intel_cpu(void) {
    static int (*cbwr_get)(int);
    if (!cbwr_get) {
        void *torch = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD); /* loaded by now, often RTLD_LOCAL */
        cbwr_get = torch ? (int (*)(int))dlsym(torch, "mkl_serv_cbwr_get") : NULL;
        if (!cbwr_get) cbwr_get = (int (*)(int))dlsym(RTLD_NEXT, "mkl_serv_cbwr_get");
        if (!cbwr_get) {
            fprintf(stderr, "mkl_vendor: mkl_serv_cbwr_get not found (is MKL linked into this torch?)\n");
            abort();
        }
    }
    return cbwr_get(1) == 3 ? 0 : AS_INTEL;
}
