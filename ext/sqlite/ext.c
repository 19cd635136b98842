/*
 * ext.c - the SQLite extension's entry point: registers the embkv
 * virtual-table module, its table-level functions and the vector functions.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT1

#ifdef _WIN32
__declspec(dllexport)
#endif
int sqlite3_embkv_init(sqlite3 *db, char **pzErrMsg, const sqlite3_api_routines *pApi)
{
    SQLITE_EXTENSION_INIT2(pApi);
    /* The batched IN plan reads its values with sqlite3_vtab_in (3.38):
     * an older library has no such entry in its table of routines. */
    if (sqlite3_libversion_number() < 3038000) {
        if (pzErrMsg)
            *pzErrMsg = sqlite3_mprintf("embkv needs SQLite 3.38.0 or later; this process runs SQLite %s (use a "
                                        "Python or a sqlite3 shell linked with a newer one)", sqlite3_libversion());
        return SQLITE_ERROR;
    }
    int rc = embkv_vtab_register(db);
    if (rc == SQLITE_OK) rc = embkv_vecfn_register(db);
    if (rc == SQLITE_OK) rc = embkv_train_register(db);
    if (rc == SQLITE_OK) rc = embkv_direct_register(db);
    if (rc == SQLITE_OK) rc = embkv_heat_register(db);
    if (rc == SQLITE_OK) rc = embkv_export_register(db);
    if (rc == SQLITE_OK) rc = embkv_knn_register(db);
    if (rc != SQLITE_OK && pzErrMsg)
        *pzErrMsg = sqlite3_mprintf("embkv: registration failed: %s", sqlite3_errstr(rc));
    return rc;
}
