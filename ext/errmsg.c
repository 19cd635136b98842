/*
 * errmsg.c - the per-thread message of the last failed engine call.
 * A thread-local buffer keeps the API free of error-out parameters while
 * staying safe when several threads fail at once.
 */
#include <stdarg.h>
#include <stdio.h>

#include "store_internal.h"

static _Thread_local char errbuf[512] = "no error";

int embkv__err(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return rc;
}

const char *embkv_errmsg(void)
{
    return errbuf;
}
