-- admit='count(N)': an id is stored from its N-th pull; before, a pull
-- returns its initial values and a push drops its gradient.  Counted in
-- embkv_stats; kept with the store (a new process, another table on the
-- store, an export's create options); the option's errors.
.headers off
.mode list
.nullvalue NULL
.bail off

CREATE VIRTUAL TABLE t USING embkv(dim=2, path='t.embkv', init='uniform(-1,1)', admit='count(3)', optimizer='sgd', lr=1);
-- pulls 1 and 2: initial values, no row; the push's gradients dropped (0 rows updated)
SELECT 'pull1', embkv_json(embkv_pull('t', '[1,2]'));
SELECT 'rows', count(*) FROM t;
SELECT 'push-dropped', embkv_push('t', '[1,2]', '[1,1,1,1]');
SELECT 'pull2', embkv_json(embkv_pull('t', '[1]'));
SELECT 'rows', count(*) FROM t;
-- pull 3 of id 1: stored with those same values, clock 0
SELECT 'pull3', embkv_json(embkv_pull('t', '[1]'));
SELECT 'rows', id, embkv_json(vec), clock FROM t;
-- a push of both: 1 updated, 2 dropped
SELECT 'push', embkv_push('t', '[1,2]', '[1,1,1,1]');
SELECT 'rows', id, embkv_json(vec), clock FROM t;
SELECT 'stats', json_extract(embkv_stats('t'), '$.training.admission');
-- INSERT is not admission's business: rows written by SQL are stored.
INSERT INTO t(id, vec) VALUES (9, '[0,0]');
SELECT 'insert', count(*) FROM t;
-- The option as an export records it.
SELECT 'export', embkv_export('t', 't.export');
.shell sqlite3 t.export "SELECT value FROM embkv_meta WHERE key = 'create_options'"
-- @reopen
.headers off
.mode list
-- A new process: the store keeps admit (counts start over: DRAM only).
SELECT 'reopen-pull', length(embkv_pull('t', '[2]'));
SELECT 'reopen-rows', count(*) FROM t;
-- another table on the store takes its admission; a different one is refused
CREATE VIRTUAL TABLE t2 USING embkv(dim=2, path='t.embkv');
SELECT 'shared', json_extract(embkv_stats('t2'), '$.training.admission.count');
CREATE VIRTUAL TABLE t3 USING embkv(dim=2, path='t.embkv', admit='count(2)');
CREATE VIRTUAL TABLE t4 USING embkv(dim=2, path='t.embkv', admit='none');
-- Without admission the stats have no admission object, and files made
-- before the option look the same.
CREATE VIRTUAL TABLE plain USING embkv(dim=2, path='plain.embkv', init='zeros');
SELECT 'plain', json_extract(embkv_stats('plain'), '$.training.admission');
.shell grep -c admit plain.embkv/app-sqlite-options t.embkv/app-sqlite-options
-- count(1) is none: every id at its first pull (no admission object, no option kept)
CREATE VIRTUAL TABLE one USING embkv(dim=2, path='one.embkv', admit='count(1)');
CREATE VIRTUAL TABLE one2 USING embkv(dim=2, path='one.embkv', admit='none');
SELECT 'count1', json_extract(embkv_stats('one'), '$.training.admission');
-- Errors
CREATE VIRTUAL TABLE e1 USING embkv(dim=2, admit='count(3)');
CREATE VIRTUAL TABLE e2 USING embkv(dim=2, init='zeros', admit='count(0)');
CREATE VIRTUAL TABLE e3 USING embkv(dim=2, init='zeros', admit='count(256)');
CREATE VIRTUAL TABLE e4 USING embkv(dim=2, init='zeros', admit='often');
CREATE VIRTUAL TABLE e5 USING embkv(dim=2, init='zeros', admit='count(2');
