/*
 * errors.c - how the binding reports a failure: a table's error message,
 * the SQLite result code of an engine result, and the refusal of a table
 * connected without its store.
 *
 * Why a file of its own, at the bottom: the module, the cursors, the value
 * readers and the write buffers all report through these, and each message
 * must name the table the same way ("embkv table <name>: ..."); kept in the
 * module, they made every lower file call up into it.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdarg.h>

void ekerr_table(ekvtab *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *m = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    sqlite3_free(v->base.zErrMsg);
    v->base.zErrMsg = sqlite3_mprintf("embkv table %s: %s", v->zName, m ? m : "out of memory");
    sqlite3_free(m);
}

int ekerr_rc(int erc)
{
    switch (erc) {
    case EMBKV_OK: return SQLITE_OK;
    case EMBKV_NOMEM: return SQLITE_NOMEM;
    case EMBKV_FULL: return SQLITE_FULL;
    case EMBKV_IO: return SQLITE_IOERR;
    case EMBKV_LOCKED: return SQLITE_BUSY;
    case EMBKV_BUSY: return SQLITE_BUSY;
    case EMBKV_CORRUPT: return SQLITE_CORRUPT;
    case EMBKV_EXISTS: return SQLITE_CONSTRAINT_PRIMARYKEY;
    case EMBKV_NOTSTORE:
    case EMBKV_VERSION: return SQLITE_CANTOPEN;
    default: return SQLITE_ERROR;
    }
}

/* A table connected without its store (see vt_init) can only be dropped. */
int ekerr_unusable(ekvtab *v)
{
    if (v->store) return 0;
    ekerr_table(v, "%s", v->broken);
    return 1;
}
