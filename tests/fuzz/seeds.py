#!/usr/bin/python3
"""tests/fuzz/seeds.py - writes the seed corpus of the fuzz targets,
tests/fuzz/corpus/<name>/, from the hand-made inputs listed here.

Owns the seeds; why a script: the store targets' inputs are binary patch
lists (common.c describes the format), easier to read and change as the
code below than as files, and the seeds of the other targets sit beside
them.  Each seed is small and either valid or one step from valid (a byte
off, a field out of range, a file cut short).  Run it after changing the
template or the patch format: `python3 tests/fuzz/seeds.py`; it replaces
the seed files it owns (named seed-*) and leaves other files alone.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# --------------------------------------------------------------- store
# Patch targets of the template (common.c numbers them; the files sorted by
# name): whole files, then the pool's regions, then the log segment's.
LOCK, OPTIONS, TABLES, SEG, POOL, SEAL = 0, 1, 2, 3, 4, 5
P_HEADER, P_ROOT, P_ROOT256, P_INDEX, P_TABLE, P_CHUNK, P_CHUNK4K = 6, 7, 8, 9, 10, 11, 12
P_ROOT_HDR, P_INDEX_HDR, P_TABLE_HDR, P_CHUNK_HDR, P_PAGES = 13, 14, 15, 16, 17
S_HEADER, S_RECORDS = 18, 19

# store_root field offsets (ext/engine/format.h)
R_MAGIC, R_FORMAT, R_DIM, R_RECSIZE, R_EPOCH, R_CLEAN, R_CHUNK_BYTES = 0, 16, 20, 28, 32, 40, 44
R_MAX_LOAD, R_NBUCKETS, R_INDEX, R_INDEX_NEXT, R_CHUNK_TABLE = 48, 56, 72, 88, 120
R_CLOSED_ROWS, R_CLOSED_CHECK, R_SSD_SIZE, R_LOG_TAG, R_LOG_TAIL, R_SSD_PATH = 136, 144, 152, 160, 168, 200


def write(t, off, data):
    return struct.pack('<BBIB', 0, t, off, len(data)) + data


def xor(t, off, data):
    return struct.pack('<BBIB', 1, t, off, len(data)) + data


def truncate(t, size):
    return struct.pack('<BBI', 2, t, size)


def delete(t):
    return struct.pack('<BBI', 3, t, 0)


def replace(t, data):
    return struct.pack('<BBIH', 4, t, 0, len(data)) + data


def set64(t, off, v):
    return struct.pack('<BBIQ', 5, t, off, v)


STORE = {
    'valid': b'',
    'root-magic': xor(P_ROOT, R_MAGIC, b'\x01'),
    'root-format': write(P_ROOT, R_FORMAT, struct.pack('<I', 2)),
    'root-dim': write(P_ROOT, R_DIM, struct.pack('<I', 9000)),
    'root-recsize': write(P_ROOT, R_RECSIZE, struct.pack('<I', 64)),
    'root-nbuckets': set64(P_ROOT, R_NBUCKETS, 3),
    'root-nbuckets-big': set64(P_ROOT, R_NBUCKETS, 1 << 40),
    'root-chunk-bytes': write(P_ROOT, R_CHUNK_BYTES, b'\xff\xff\xff\xff'),
    'root-max-load': set64(P_ROOT, R_MAX_LOAD, struct.unpack('<Q', struct.pack('<d', 1e300))[0]),
    'root-unclean': write(P_ROOT, R_CLEAN, b'\0\0\0\0'),
    'root-epoch': set64(P_ROOT, R_EPOCH, 0xffffffffffffffff),
    'root-index-off': xor(P_ROOT, R_INDEX + 8, b'\x40'),
    'root-index-next': set64(P_ROOT, R_INDEX_NEXT + 8, 4096),
    'root-chunk-table': xor(P_ROOT, R_CHUNK_TABLE + 8, b'\x10'),
    'root-closed-rows': set64(P_ROOT, R_CLOSED_ROWS, 5),
    'root-ssd-size': set64(P_ROOT, R_SSD_SIZE, 0),
    'root-ssd-size-small': set64(P_ROOT, R_SSD_SIZE, 4096),
    'root-log-tag': xor(P_ROOT, R_LOG_TAG, b'\x80'),
    'root-log-tail': set64(P_ROOT, R_LOG_TAIL, 0x8000000100001000),
    'root-ssd-path-relative': write(P_ROOT, R_SSD_PATH, b'x\0'),
    'root-ssd-path-unterminated': write(P_ROOT, R_SSD_PATH + 1016, b'abcdefgh'),
    'pool-short': truncate(POOL, 4096),
    'pool-half': truncate(POOL, 8 << 20),
    'pool-gone': delete(POOL),
    'pool-header': xor(P_HEADER, 100, b'\xff'),
    'pool-header-layout': write(P_HEADER, 4096, b'other\0'),
    'pool-heap-meta': xor(P_PAGES, 0x3123, b'\x55\xaa'),
    'pool-alloc-size': set64(P_ROOT_HDR, 48, 0),
    'pool-chunk-type': set64(P_CHUNK_HDR, 56, 99),
    'pool-index-hdr': set64(P_INDEX_HDR, 48, 1 << 20),
    'index-bucket': xor(P_INDEX, 300, b'\x5a' * 16),
    'index-loc-ssd': set64(P_INDEX, 40, 0x8000000100001000),
    'index-loc-far': set64(P_INDEX, 40, 0x0000100000000005),
    'index-used': write(P_INDEX, 6, b'\xff\xff'),
    'index-overflow': write(P_INDEX, 4, b'\xff\xff'),
    'chunk-table-zero': set64(P_TABLE, 8, 0),
    'chunk-table-dup': set64(P_TABLE, 24, 0),
    'record-vec': xor(P_CHUNK4K, 40, b'\x01\x02\x03\x04'),
    'record-id': xor(P_CHUNK4K, 0, b'\x01'),
    'record-prev': set64(P_CHUNK4K, 8, 0x0000000200000001),
    'seg-gone': delete(SEG),
    'seg-short': truncate(SEG, 100),
    'seg-cut': truncate(SEG, 6000),
    'seg-header': xor(S_HEADER, 0, b'\x20'),
    'seg-header-recbytes': write(S_HEADER, 20, struct.pack('<I', 64)),
    'seg-record': xor(S_RECORDS, 40, b'\xff\xff\xff\xff'),
    'seg-record-id': xor(S_RECORDS, 0, b'\x01'),
    'options-empty': replace(OPTIONS, b'{}'),
    'options-other': replace(OPTIONS, b'{"lr":"0.5","check":"0"}'),
    'options-text': replace(OPTIONS, b'not json'),
    'tables-garbage': replace(TABLES, b'zzzz\n0123456789abcdef0\n'),
    'tables-empty': replace(TABLES, b''),
    'seal': replace(SEAL, b'1 2 3 4.5 6.7\n'),
    'lock': write(LOCK, 0, b'x'),
    'crash-like': write(P_ROOT, R_CLEAN, b'\0\0\0\0') + set64(P_ROOT, R_LOG_TAIL, 0) + xor(P_INDEX, 1000, b'\x01'),
}

# fuzz_store's flags: 1 write, 2 sync, 4 cache, 8 train, 16 hot, 32 snapshot, 64 reopen
STORE_FLAGS = {'valid': [0x00, 0x7f, 0x23, 0x4c], 'root-unclean': [0x43], 'crash-like': [0x41],
               'record-vec': [0x21], 'seg-record': [0x18], 'seg-cut': [0x5b]}
# fuzz_store_sql's: 1 write, 2 train, 4 attach, 8 checkpoint, 16 drop, 32 heat, 64 rollback
SQL_FLAGS = {'valid': [0x00, 0x7f, 0x15, 0x62], 'options-other': [0x04], 'tables-garbage': [0x14],
             'tables-empty': [0x10], 'seg-record': [0x22], 'root-unclean': [0x09]}

# --------------------------------------------------------------- vec
def vec(mode, dimsel, value, k=2.0):
    return struct.pack('<BHd', mode, dimsel, k) + value


VEC = {
    'json': vec(0, 0, b'[1, 2.5, -3e-2, 0]'),
    'json-dim4': vec(0, 3, b'[1,2,3,4]'),
    'json-two': vec(0, 0, b'[1,2]\xff[3,4]'),
    'knn-batch': vec(0, 0, b'[[1,2],[3,4],[0,-1]]\xff[1,2,2]'),
    'json-same': vec(2, 0, b'[0.1, 0.2, 0.3]', 0.5),
    'blob': vec(1, 3, struct.pack('<4f', 1, -2, 0.5, 1e-40)),
    'blob-two': vec(1, 0, struct.pack('<2f', 1, 2) + b'\xff' + struct.pack('<3f', 1, 2, 3)),
    'blob-nan': vec(1, 0, struct.pack('<2f', float('nan'), 1)),
    'blob-short': vec(1, 0, b'\x01\x02\x03'),
    'json-trailing-comma': vec(0, 0, b'[1, 2,]'),
    'json-leading-zero': vec(0, 0, b'[01]'),
    'json-hex': vec(0, 0, b'[0x10]'),
    'json-dot': vec(0, 0, b'[1.]'),
    'json-huge': vec(0, 0, b'[1e39]'),
    'json-inf': vec(0, 0, b'[1e999]'),
    'json-tiny': vec(0, 0, b'[1e-46, -0]'),
    'json-string': vec(0, 0, b'[1, "a"]'),
    'json-object': vec(0, 0, b'{"a": 1}'),
    'json-nested': vec(0, 0, b'[[1]]'),
    'json-blank': vec(0, 0, b' \t[ 1 ]\n'),
    'json-nul': vec(0, 0, b'[1]\x00'),
    'json-empty': vec(0, 0, b'[]'),
    'text-id': vec(0, 0, b' 42 '),
    'text-id-min': vec(0, 0, b'-9223372036854775808'),
    'text-id-real': vec(0, 0, b'1e3'),
    'text-id-frac': vec(0, 0, b'4.5'),
    'json-long': vec(0, 0, b'[' + b','.join(b'%d' % i for i in range(300)) + b']'),
}

# --------------------------------------------------------------- ids
# type % 5: 0 INTEGER, 1 REAL, 2 TEXT, 3 BLOB, 4 NULL; bit 4: grads as TEXT
def ids(t, value, grads=None):
    return bytes([t]) + value + (b'\xff' + grads if grads is not None else b'')


IDS = {
    'json': ids(2, b'[1, 2, 3]', b'\0' * 48),
    'json-grads-text': ids(0x12, b'[1,2,3]', b'[0,0,0,0, 0,0,0,0, 0.5,0,0,-1]'),
    'blob': ids(3, struct.pack('<2q', 1, 63), b'\0' * 32),
    'integer': ids(0, struct.pack('<q', 5), b'\0' * 16),
    'real': ids(1, struct.pack('<d', 7.0)),
    'null': ids(4, b''),
    'json-empty': ids(2, b'[]'),
    'json-frac': ids(2, b'[1.5]'),
    'json-2p53': ids(2, b'[9007199254740993]'),
    'json-string': ids(2, b'["1"]'),
    'json-comma': ids(2, b'[1,]'),
    'json-bool': ids(2, b'[true, null]'),
    'json-huge': ids(2, b'[1e300]'),
    'json-neg': ids(2, b'[-1, -0]'),
    'json-dups': ids(2, b'[1, 2, 2, 2, 1]', b'\0' * 80),
    'json-missing': ids(2, b'[1, 1000000]', b'\0' * 32),
    'text-int': ids(2, b'-1'),
    'blob-odd': ids(3, b'\x01' * 7),
    'grads-nan': ids(2, b'[1]', struct.pack('<4f', float('nan'), 0, 0, 0)),
    'grads-short': ids(2, b'[1, 2]', b'\0' * 12),
}

# --------------------------------------------------------------- options
OPTIONS_SEEDS = {
    'dim': b'dim=4',
    'path': b"dim=4, path='x', pool_size='16M'",
    'adam': b"dim=8, optimizer=adam, lr=0.001, eps=1e-8, beta1=0.9, beta2=0.999, init='normal(0,0.01)', seed=42",
    'adagrad': b'dim=8, optimizer=adagrad, initial_accumulator=0.1, init=zeros, staleness=2, wait_ms=100',
    'ssd': b"dim=16, capacity=1000, ssd_size='4M', ssd_path='log2', cache_size='1M'",
    'uniform': b"dim=4, init='uniform(-0.5, 0.5)', staleness=unlimited",
    'quoted': b'dim="4", pool_size="16mb", lr=\'1e-3\'',
    'dim-zero': b'dim=0',
    'dim-big': b'dim=8193',
    'dim-twice': b'dim=4, dim=4',
    'pool-small': b"dim=4, pool_size='15M'",
    'pool-huge': b"dim=4, pool_size='1T'",
    'lr-negative': b'dim=4, lr=-1',
    'uniform-empty': b"dim=4, init='uniform(1,1)'",
    'unknown': b'dim=4, foo=1',
    'no-value': b'dim',
    'path-empty': b"dim=4, path=''",
    'lr-inf': b"dim=4, lr='1e400'",
    'beta-one': b'dim=4, beta1=1',
    'seed-big': b'dim=4, seed=18446744073709551616',
    'capacity-zero': b'dim=4, capacity=0',
    'quote-unbalanced': b"dim=4, path='x",
    'ssd-no-size': b"dim=4, ssd_path='y'",
    'cache-huge': b"dim=4, cache_size='1T'",
    'admit': b"dim=3, init='zeros', admit='count(2)', path='x'",
    'admit-no-init': b"dim=3, admit='count(2)'",
    'evict': b"dim=3, init='zeros', ttl='30d', ttl_steps=100, max_rows=1000, evict='lru', path='x'",
    'ttl-units': b"dim=3, ttl='1500ms'",
    'ttl-big': b"dim=3, ttl='3651d'",
    'evict-bad': b"dim=3, evict='fifo', max_rows=-1",
    'dtype': b"dim=5, dtype='f16', init='normal(0,0.01)', rounding='stochastic', path='x'",
    'dtype-i8': b"dim=3, dtype=i8, optimizer=adagrad",
    'dtype-bad': b"dim=3, dtype='f8', rounding='up'",
}


def put(name, files):
    d = os.path.join(HERE, 'corpus', name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith('seed-'):
            os.unlink(os.path.join(d, f))
    for label, data in files.items():
        with open(os.path.join(d, 'seed-' + label), 'wb') as fp:
            fp.write(data)


def main():
    store, sql = {}, {}
    for label, patches in STORE.items():
        for f in STORE_FLAGS.get(label, [0x01]):
            store['%s-%02x' % (label, f)] = bytes([f]) + patches
        for f in SQL_FLAGS.get(label, [0x01]):
            sql['%s-%02x' % (label, f)] = bytes([f]) + patches
    put('store', store)
    put('store_sql', sql)
    put('vec', VEC)
    put('ids', IDS)
    put('options', OPTIONS_SEEDS)


if __name__ == '__main__':
    main()
