/*
 * pmemsim.h - the files tests/powercut/pmemsim.c keeps beside a pool, as
 * tests/test_powercut.c reads them back.
 */
#ifndef EMBKV_PMEMSIM_H
#define EMBKV_PMEMSIM_H

#include <stdbool.h>
#include <stdint.h>

/* Beside the pool, in its directory ("app-" files: the store leaves them be). */
#define PMEMSIM_DURABLE "app-pmemsim.durable"
#define PMEMSIM_PENDING "app-pmemsim.pending"

/* PMEMSIM_PENDING: a header and entries (pmemsim_entry, then len bytes). */
typedef struct pmemsim_pending {
    uint64_t used;   /* bytes of data[] in use */
    uint64_t cap;    /* bytes data[] may use (set by the library) */
    unsigned char data[];
} pmemsim_pending;

typedef struct pmemsim_entry {
    uint64_t off, len;  /* file offset and length, whole 64-byte lines */
} pmemsim_entry;

#endif
