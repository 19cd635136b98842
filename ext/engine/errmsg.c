/*
 * errmsg.c - the per-thread message of the last failed engine call.
 * A thread-local buffer keeps the API free of error-out parameters while
 * staying safe when several threads fail at once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

static _Thread_local char errbuf[512] = "no error";

int embkv__err(int rc, const char *fmt, ...)
{
    /* Formatted apart first: an argument may be embkv_errmsg() itself (a
     * message that wraps the one before it). */
    char msg[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(errbuf, msg, sizeof msg);
    return rc;
}

const char *embkv_errmsg(void)
{
    return errbuf;
}
