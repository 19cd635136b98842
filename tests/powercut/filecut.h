/*
 * filecut.h - what a power cut leaves of a directory's files, rebuilt from
 * the journal tests/powercut/filesim.c keeps (for tests/test_powercut.c).
 *
 * The model is a file system's promise and nothing more:
 *   - a file's bytes and size are durable as of its last fdatasync/fsync;
 *     each write since then reaches the medium or not per 4 KiB block, and
 *     each size change since then or not, independently, in their order;
 *   - the directory's names are durable as of its last fsync; each create
 *     and unlink since then is kept or not, independently (an unlink not
 *     kept brings the file back with its content; a create not kept loses
 *     the file, synced or not);
 *   - what was in the directory when the journal began is durable.
 */
#ifndef EMBKV_FILECUT_H
#define EMBKV_FILECUT_H

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "powercut/pmemsim.h"

#define FC_BLOCK 4096u
#define FC_MAX 512 /* files and pending directory changes */

typedef struct fc_file {
    unsigned char *dur;         /* durable bytes */
    size_t dur_size;
    const filesim_op **ops;     /* writes and size changes since its last sync */
    size_t nops, capops;
} fc_file;

typedef struct fc_name {
    char name[256];
    int file;                   /* index into files */
} fc_name;

typedef struct filecut {
    fc_file files[FC_MAX];
    int nfiles;
    fc_name durable[FC_MAX];    /* the directory as of its last fsync */
    int ndurable;
    size_t blocks_kept, blocks_lost, creates_lost, unlinks_undone;
    size_t writes, syncs;            /* journaled */
} filecut;

/* A whole file, malloc'ed (NULL if it cannot be read whole). */
static unsigned char *fc_read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t n = (size_t)st.st_size, got = 0;
    unsigned char *b = malloc(n + 1);
    while (b && got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (b && got != n) {
        free(b);
        b = NULL;
    }
    *len = n;
    return b;
}

static bool fc_write_file(const char *path, const void *p, size_t n)
{
    const unsigned char *b = p;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t put = 0;
    while (fd >= 0 && put < n) {
        ssize_t w = write(fd, b + put, n - put);
        if (w <= 0)
            break;
        put += (size_t)w;
    }
    return fd >= 0 && put == n && close(fd) == 0;
}

static int fc_new_file(filecut *c)
{
    if (c->nfiles >= FC_MAX) {
        fprintf(stderr, "filecut: more than %d files\n", FC_MAX);
        exit(2);
    }
    memset(&c->files[c->nfiles], 0, sizeof c->files[0]);
    return c->nfiles++;
}

static void fc_reset(filecut *c)
{
    for (int i = 0; i < c->nfiles; i++) {
        free(c->files[i].dur);
        free(c->files[i].ops);
    }
    c->nfiles = c->ndurable = 0;
}

/* The directory as it is now is the durable state; the journal starts empty. */
static bool filecut_begin(filecut *c, const char *dir, const char *journal)
{
    fc_reset(c);
    DIR *d = opendir(dir);
    if (!d)
        return false;
    struct dirent *e;
    bool ok = true;
    while (ok && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t n = 0;
        unsigned char *b = c->ndurable < FC_MAX ? fc_read_file(path, &n) : NULL;
        if (!(ok = b != NULL))
            break;
        int f = fc_new_file(c);
        c->files[f].dur = b;
        c->files[f].dur_size = n;
        snprintf(c->durable[c->ndurable].name, sizeof c->durable[0].name, "%s", e->d_name);
        c->durable[c->ndurable++].file = f;
    }
    closedir(d);
    int jfd = open(journal, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ok = ok && jfd >= 0;
    if (jfd >= 0)
        close(jfd);
    return ok;
}

static int fc_find(const fc_name *ns, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(ns[i].name, name))
            return i;
    return -1;
}

static void fc_push_op(fc_file *F, const filesim_op *op)
{
    if (F->nops == F->capops) {
        F->capops = F->capops ? 2 * F->capops : 16;
        F->ops = realloc(F->ops, F->capops * sizeof *F->ops);
        if (!F->ops)
            exit(2);
    }
    F->ops[F->nops++] = op;
}

static void fc_set_size(unsigned char **b, size_t *size, size_t *cap, size_t want)
{
    if (want > *cap) {
        size_t nc = want + (want >> 1) + FC_BLOCK;
        unsigned char *nb = realloc(*b, nc);
        if (!nb)
            exit(2);
        *b = nb;
        *cap = nc;
    }
    if (want > *size)
        memset(*b + *size, 0, want - *size);
    *size = want;
}

/* Applies op to (b, size): every block of a write (keep NULL) or the blocks
 * keep says (rng r). */
static void fc_apply(filecut *c, unsigned char **b, size_t *size, size_t *cap, const filesim_op *op, rng_t *r)
{
    const unsigned char *data = (const unsigned char *)(op + 1) + op->name_len;
    if (op->kind == FILESIM_SIZE) {
        if (r && rnd_below(r, 2))
            return;
        if (op->len || op->off > *size)
            fc_set_size(b, size, cap, op->off);
        return;
    }
    uint64_t at = op->off, end = op->off + op->len;
    while (at < end) {
        uint64_t next = (at / FC_BLOCK + 1) * FC_BLOCK;
        if (next > end)
            next = end;
        bool keep = !r || rnd_below(r, 2);
        if (r)
            keep ? c->blocks_kept++ : c->blocks_lost++;
        if (keep) {
            if (next > *size)
                fc_set_size(b, size, cap, next);
            memcpy(*b + at, data + (at - op->off), next - at);
        }
        at = next;
    }
}

static void fc_sync(filecut *c, fc_file *F)
{
    size_t cap = F->dur_size;
    for (size_t i = 0; i < F->nops; i++)
        fc_apply(c, &F->dur, &F->dur_size, &cap, F->ops[i], NULL);
    F->nops = 0;
}

/* Replaces dir's files with what a power cut at the end of the journal may
 * leave (rng r picks).  The journal must have been started by
 * filecut_begin on this dir. */
static bool filecut_cut(filecut *c, const char *dir, const char *journal, rng_t *r)
{
    size_t jlen = 0;
    unsigned char *j = fc_read_file(journal, &jlen);
    if (!j)
        return false;

    /* Replay: the names now (cur) and the directory changes since its fsync. */
    fc_name cur[FC_MAX];
    int ncur = c->ndurable;
    memcpy(cur, c->durable, sizeof cur[0] * (size_t)ncur);
    struct { int kind; fc_name n; } pend[FC_MAX];
    int npend = 0;
    size_t at = 0;
    while (at + sizeof(filesim_op) <= jlen) {
        const filesim_op *op = (const filesim_op *)(j + at);
        size_t total = sizeof *op + op->name_len + (op->kind == FILESIM_WRITE ? op->len : 0);
        if (op->magic != FILESIM_MAGIC || at + total > jlen)
            break; /* a torn last entry: its operation had not been made */
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)op->name_len, (const char *)(op + 1));
        at += total;
        int k = fc_find(cur, ncur, name);
        switch (op->kind) {
        case FILESIM_CREATE:
            if (k >= 0)
                break; /* it was there: opened, not made */
            if (ncur >= FC_MAX || npend >= FC_MAX)
                exit(2);
            snprintf(cur[ncur].name, sizeof cur[0].name, "%s", name);
            cur[ncur].file = fc_new_file(c);
            pend[npend].kind = FILESIM_CREATE;
            pend[npend++].n = cur[ncur++];
            break;
        case FILESIM_UNLINK:
            if (k < 0 || npend >= FC_MAX)
                break;
            pend[npend].kind = FILESIM_UNLINK;
            pend[npend++].n = cur[k];
            cur[k] = cur[--ncur];
            break;
        case FILESIM_WRITE:
            c->writes++;
            /* fall through */
        case FILESIM_SIZE:
            if (k >= 0)
                fc_push_op(&c->files[cur[k].file], op);
            break;
        case FILESIM_SYNC:
            c->syncs++;
            if (k >= 0)
                fc_sync(c, &c->files[cur[k].file]);
            break;
        case FILESIM_DIRSYNC:
            memcpy(c->durable, cur, sizeof cur[0] * (size_t)ncur);
            c->ndurable = ncur;
            npend = 0;
            break;
        }
    }

    /* The cut: the durable names, each later change kept or not. */
    fc_name out[FC_MAX];
    int nout = c->ndurable;
    memcpy(out, c->durable, sizeof out[0] * (size_t)nout);
    for (int i = 0; i < npend; i++) {
        bool keep = rnd_below(r, 2);
        int k = fc_find(out, nout, pend[i].n.name);
        if (pend[i].kind == FILESIM_CREATE) {
            if (!keep) {
                c->creates_lost++;
                continue;
            }
            if (k >= 0)
                out[k] = pend[i].n;
            else if (nout < FC_MAX)
                out[nout++] = pend[i].n;
        } else {
            if (!keep) {
                c->unlinks_undone++;
                continue;
            }
            if (k >= 0 && out[k].file == pend[i].n.file)
                out[k] = out[--nout];
        }
    }

    /* Empty the directory, then write each file as the cut leaves it. */
    bool ok = true;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ok &= unlink(path) == 0;
    }
    if (d)
        closedir(d);
    for (int i = 0; i < nout && ok; i++) {
        fc_file *F = &c->files[out[i].file];
        size_t size = F->dur_size, cap = F->dur_size;
        unsigned char *b = malloc(cap + 1);
        if (!b)
            exit(2);
        memcpy(b, F->dur, size);
        for (size_t k = 0; k < F->nops; k++)
            fc_apply(c, &b, &size, &cap, F->ops[k], r);
        char path[4352];
        snprintf(path, sizeof path, "%s/%.255s", dir, out[i].name);
        ok = fc_write_file(path, b, size);
        free(b);
    }
    free(j);
    return ok && d;
}

#endif
