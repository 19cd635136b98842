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
    int rc = embkv_vtab_register(db);
    if (rc == SQLITE_OK) rc = embkv_vecfn_register(db);
    if (rc == SQLITE_OK) rc = embkv_train_register(db);
    if (rc == SQLITE_OK) rc = embkv_heat_register(db);
    if (rc == SQLITE_OK) rc = embkv_export_register(db);
    if (rc == SQLITE_OK) rc = embkv_knn_register(db);
    if (rc != SQLITE_OK && pzErrMsg)
        *pzErrMsg = sqlite3_mprintf("embkv: registration failed: %s", sqlite3_errstr(rc));
    return rc;
}
