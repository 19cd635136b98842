-- dtype: rows kept as f16, bf16 or i8, read as float32 everywhere; writes
-- rounded (to nearest; pushes stochastically with rounding='stochastic');
-- values beyond a type's range refused naming the id; kept with the store
-- (a new process, another table on it, an export's create options, an
-- import into a table of another dtype); the options' errors.
.headers off
.mode list
.nullvalue NULL
.bail off

CREATE VIRTUAL TABLE h USING embkv(dim=3, dtype='f16', path='h.embkv');
CREATE VIRTUAL TABLE b USING embkv(dim=3, dtype=bf16, path='b.embkv');
CREATE VIRTUAL TABLE q USING embkv(dim=3, dtype='i8', path='q.embkv');
INSERT INTO h(id, vec) VALUES (1, '[0.1, 1000.3, -2.5]'), (2, '[65504, 1e-8, 3]');
INSERT INTO b(id, vec) VALUES (1, '[0.1, 1000.3, -2.5]'), (2, '[3e38, 1e-30, 3]');
INSERT INTO q(id, vec) VALUES (1, '[0.1, 1000.3, -2.5]'), (2, '[7, 7, 7]');
SELECT 'f16', id, embkv_json(vec) FROM h ORDER BY id;
SELECT 'bf16', id, embkv_json(vec) FROM b ORDER BY id;
SELECT 'i8', id, embkv_json(vec) FROM q ORDER BY id;
-- every read path gives the same values
SELECT 'paths', (SELECT embkv_json(vec) FROM h WHERE id = 1) = (SELECT embkv_json(vec) FROM h WHERE id IN (1, 5)),
       (SELECT embkv_json(embkv_pull('h', '[1]'))) = (SELECT embkv_json(vec) FROM h WHERE id = 1);
SELECT 'knn', id, distance FROM embkv_knn('h', (SELECT vec FROM h WHERE id = 2), 1);
SELECT 'stats', json_extract(embkv_stats('h'), '$.dtype'), json_extract(embkv_stats('h'), '$.record_bytes'),
       json_extract(embkv_stats('q'), '$.record_bytes');
-- beyond the range: refused by the statement, nothing written
INSERT INTO h(id, vec) VALUES (3, '[70000, 0, 0]');
UPDATE b SET vec = '[1, 3.4e38, 0]' WHERE id = 1;
SELECT 'after', count(*) FROM h;
-- a transaction reads its writes as the table will keep them
BEGIN;
INSERT INTO h(id, vec) VALUES (4, '[0.1, 0.2, 0.3]');
SELECT 'in-txn', embkv_json(vec) FROM h WHERE id = 4;
ROLLBACK;
-- i8: a range of a few denormals keeps its values
INSERT INTO q(id, vec) VALUES (3, '[1e-45, -1e-45, 1e-45]');
SELECT 'tiny', embkv_json(vec) FROM q WHERE id = 3;
-- training: a push rounds its result (sgd, lr 1: 1 - 0.0001 is 1 in f16)
CREATE VIRTUAL TABLE t USING embkv(dim=2, dtype='f16', init='zeros', optimizer='sgd', lr=1, path='t.embkv');
INSERT INTO t(id, vec) VALUES (1, '[1, 1]');
SELECT 'push', embkv_push('t', '[1]', '[0.0001, 1]');
SELECT 'pushed', embkv_json(vec) FROM t;
CREATE VIRTUAL TABLE sr USING embkv(dim=2, dtype='f16', init='zeros', lr=1, rounding='stochastic', path='sr.embkv');
SELECT 'sr-stats', json_extract(embkv_stats('sr'), '$.dtype');
-- export says its dtype; an import into a float32 table converts
SELECT 'export', embkv_export('h', 'h.export');
.shell sqlite3 h.export "SELECT key, value FROM embkv_meta WHERE key IN ('dtype', 'create_options') ORDER BY key"
CREATE VIRTUAL TABLE f USING embkv(dim=3);
SELECT 'import', embkv_import('f', 'h.export');
-- an f32 export with a row beyond f16's range: refused before any row
INSERT INTO f(id, vec) VALUES (9, '[70000, 1, 1]');
SELECT 'export-f', embkv_export('f', 'f.export');
CREATE VIRTUAL TABLE h4 USING embkv(dim=3, dtype='f16');
SELECT embkv_import('h4', 'f.export');
SELECT 'h4-rows', count(*) FROM h4;
-- beyond bf16's range: the advice names the dtypes that hold it
INSERT INTO f(id, vec) VALUES (10, '[3.4e38, 1, 1]');
SELECT 'export-f2', embkv_export('f', 'f2.export');
CREATE VIRTUAL TABLE b4 USING embkv(dim=3, dtype='bf16');
SELECT embkv_import('b4', 'f2.export');
CREATE VIRTUAL TABLE i4 USING embkv(dim=3, dtype='i8');
SELECT 'i4-import', embkv_import('i4', 'f2.export');
DELETE FROM f WHERE id = 10;
SELECT 'imported', id, embkv_json(vec) FROM f ORDER BY id;
-- @reopen
.headers off
.mode list
SELECT 'reopen', id, embkv_json(vec) FROM h ORDER BY id;
CREATE VIRTUAL TABLE h2 USING embkv(dim=3, path='h.embkv');
SELECT 'shared', json_extract(embkv_stats('h2'), '$.dtype');
CREATE VIRTUAL TABLE h3 USING embkv(dim=3, dtype='bf16', path='h.embkv');
CREATE VIRTUAL TABLE e1 USING embkv(dim=3, dtype='f8');
CREATE VIRTUAL TABLE e2 USING embkv(dim=3, rounding='stochastic');
CREATE VIRTUAL TABLE e3 USING embkv(dim=3, dtype='f16', rounding='up');
CREATE VIRTUAL TABLE e4 USING embkv(dim=3, dtype='f16', init='uniform(-1e5,1e5)');
