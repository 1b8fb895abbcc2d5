/* Test plumbing: an LD_PRELOAD library that makes MKL answer "this is an Intel CPU" on any x86 host, so that a test
 * on an AMD machine builds the tiny world down the code paths MKL takes on Intel (tests/test_tinyworld_build.py).
 *
 * PyTorch's wheel links MKL statically into libtorch_cpu.so and exports MKL's service functions; its own calls to
 * them go through the PLT, so a preloaded definition wins. MKL asks two questions:
 *   mkl_serv_intel_cpu_true: is the CPU vendor GenuineIntel (cpuid leaf 0)?
 *   mkl_serv_intel_cpu:      should it take the Intel paths? That depends on the reproducibility branch
 *                            (MKL_CBWR, read back with mkl_serv_cbwr_get(1)): 1 = off and 2 = auto answer the vendor
 *                            check, 3 = COMPATIBLE answers no whatever the vendor, any other branch answers yes on an
 *                            Intel CPU only.
 * Checked against a real Intel Xeon: the default world built with this library preloaded here has the SHA-256 a
 * fresh clone's CI built on that Xeon (docs/evidence.md). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int mkl_serv_intel_cpu_true(void) { return 1; }

int mkl_serv_intel_cpu(void) {
    static int (*cbwr_get)(int);
    if (!cbwr_get) {
        void *torch = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD); /* loaded by now, often RTLD_LOCAL */
        cbwr_get = torch ? (int (*)(int))dlsym(torch, "mkl_serv_cbwr_get") : NULL;
        if (!cbwr_get) cbwr_get = (int (*)(int))dlsym(RTLD_NEXT, "mkl_serv_cbwr_get");
        if (!cbwr_get) {
            fprintf(stderr, "mkl_as_intel: mkl_serv_cbwr_get not found (is MKL linked into this torch?)\n");
            abort();
        }
    }
    int branch = cbwr_get(1);
    return (branch == 1 || branch == 2) ? 1 : branch != 3;
}
