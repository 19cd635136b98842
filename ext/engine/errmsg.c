/*
 * errmsg.c - the per-thread message of the last failed engine call.
 * A thread-local buffer keeps the API free of error-out parameters while
 * staying safe when several threads fail at once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

/* Room for a message that names two long paths with its advice. */
static _Thread_local char errbuf[4096] = "no error";

int embkv__err(int rc, const char *fmt, ...)
{
    /* Formatted apart first: an argument may be embkv_errmsg() itself (a
     * message that wraps the one before it). */
    char msg[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    msg[len] = 0;
    memcpy(errbuf, msg, len + 1);
    return rc;
}

int embkv__null_arg(const char *fn, ...)
{
    const char *bad = NULL;
    va_list ap;
    va_start(ap, fn);
    for (const char *name; !bad && (name = va_arg(ap, const char *));)
        if (!va_arg(ap, const void *))
            bad = name;
    va_end(ap);
    return bad ? embkv__err(EMBKV_INVALID, "%s: argument %s is NULL (embkv.h says which arguments may be)", fn, bad)
               : embkv__err(EMBKV_INVALID, "%s: a NULL argument (embkv.h says which arguments may be)", fn);
}

const char *embkv_errmsg(void)
{
    return errbuf;
}
