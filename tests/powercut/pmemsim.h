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

/* The files of one directory (tests/powercut/filesim.c): the library
 * journals what changes them, to PMEMSIM_JOURNAL (which must exist). */
#define PMEMSIM_FILES_ENV "PMEMSIM_FILES"
#define PMEMSIM_JOURNAL_ENV "PMEMSIM_JOURNAL"
#define PMEMSIM_KILL_AT_WRITE_ENV "PMEMSIM_KILL_AT_WRITE"
#define FILESIM_MAGIC 0x464a4e4cu
enum {
    FILESIM_CREATE = 1, /* name made (open with O_CREAT) */
    FILESIM_WRITE,      /* len bytes at off, the bytes follow */
    FILESIM_SIZE,       /* size set to off: len 0 only grows it (fallocate), 1 sets it */
    FILESIM_SYNC,       /* fdatasync or fsync of the file returned */
    FILESIM_DIRSYNC,    /* fsync of the directory returned */
    FILESIM_UNLINK      /* name removed */
};
/* An entry: this header, name_len bytes of name, then a write's bytes. */
typedef struct filesim_op {
    uint32_t magic;
    uint16_t kind, name_len;
    uint64_t off, len;
} filesim_op;

#endif
