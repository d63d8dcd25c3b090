/* LD_PRELOAD shim for tests: refuses the AMX tile permission request (arch_prctl ARCH_REQ_XCOMP_PERM),
   so that llama.cpp on an AMX CPU falls back to its CPU_REPACK buffer, as on other x86 CPUs. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
long syscall(long number, ...) {
    va_list ap; va_start(ap, number);
    long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long), a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_arch_prctl && a1 == 0x1023) { errno = EPERM; return -1; }  /* ARCH_REQ_XCOMP_PERM */
    static long (*real)(long, ...) = 0;
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(number, a1, a2, a3, a4, a5, a6);
}
