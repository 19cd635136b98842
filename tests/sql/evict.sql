-- Eviction: ttl (wall clock), ttl_steps (pushes to the table) and
-- max_rows (lfu, lru) as table options; embkv_evict runs a pass now and
-- says what it did; embkv_stats counts; kept with the store (a new
-- process, an export's create options); the options' errors.
.headers off
.mode list
.nullvalue NULL
.bail off

-- ttl_steps: a row not pushed for 2 pushes of the table expires
CREATE VIRTUAL TABLE s USING embkv(dim=2, path='s.embkv', init='zeros', ttl_steps=2);
SELECT 'step1', embkv_push('s', '[1,2]', '[1,1,1,1]');
SELECT 'ckpt', embkv_checkpoint('s') > 0;
SELECT 'step2', embkv_push('s', '[1]', '[1,1]');
SELECT 'ckpt', embkv_checkpoint('s') > 0;
SELECT 'evict', embkv_evict('s');
SELECT 'step3', embkv_push('s', '[1]', '[1,1]');
SELECT 'ckpt', embkv_checkpoint('s') > 0;
SELECT 'evict', embkv_evict('s');
SELECT 'rows', group_concat(id) FROM s;
-- a row pulled and not pushed is held: kept, then evicted after its push
SELECT 'pull', length(embkv_pull('s', '[1]'));
SELECT 'step4', embkv_push('s', '[3]', '[1,1]');
SELECT 'step5', embkv_push('s', '[3]', '[1,1]');
SELECT 'ckpt', embkv_checkpoint('s') > 0;
SELECT 'evict-held', embkv_evict('s');
SELECT 'stats', json_extract(embkv_stats('s'), '$.training.eviction');

-- max_rows, lru: the oldest writes go, ties by id
CREATE VIRTUAL TABLE m USING embkv(dim=2, path='m.embkv', max_rows=3, evict='lru');
INSERT INTO m(id, vec) VALUES (1, '[1,1]');
SELECT 'ckpt', embkv_checkpoint('m') > 0;
INSERT INTO m(id, vec) VALUES (2, '[2,2]');
SELECT 'ckpt', embkv_checkpoint('m') > 0;
INSERT INTO m(id, vec) VALUES (5, '[5,5]'), (4, '[4,4]'), (3, '[3,3]');
SELECT 'ckpt', embkv_checkpoint('m') > 0;
SELECT 'evict', embkv_evict('m');
SELECT 'rows', group_concat(id) FROM m;

-- ttl by wall clock: the rows of a checkpoint 1.5 s old, not the row after it
CREATE VIRTUAL TABLE w USING embkv(dim=2, path='w.embkv', ttl='1s');
INSERT INTO w(id, vec) VALUES (1, '[1,1]'), (2, '[2,2]');
SELECT 'ckpt', embkv_checkpoint('w') > 0;
.shell sleep 1.5
INSERT INTO w(id, vec) VALUES (3, '[3,3]');
-- (the store's own thread may have expired them first: the rows decide)
SELECT 'evict', json_type(embkv_evict('w'), '$.expired');
SELECT 'rows', group_concat(id) FROM w;
SELECT 'export', embkv_export('m', 'm.export');
.shell sqlite3 m.export "SELECT value FROM embkv_meta WHERE key = 'create_options'"
-- @reopen
.headers off
.mode list
-- A new process: the options stay with the store, and so does its step
SELECT 'reopen', json_extract(embkv_stats('s'), '$.training.eviction.step'),
       json_extract(embkv_stats('m'), '$.training.eviction.max_rows'),
       json_extract(embkv_stats('w'), '$.training.eviction.ttl');
CREATE VIRTUAL TABLE m2 USING embkv(dim=2, path='m.embkv');
SELECT 'shared', json_extract(embkv_stats('m2'), '$.training.eviction.evict');
CREATE VIRTUAL TABLE m3 USING embkv(dim=2, path='m.embkv', max_rows=4);
-- errors
CREATE VIRTUAL TABLE e1 USING embkv(dim=2, ttl='30x');
CREATE VIRTUAL TABLE e2 USING embkv(dim=2, ttl='3651d');
CREATE VIRTUAL TABLE e3 USING embkv(dim=2, evict='fifo');
CREATE VIRTUAL TABLE e4 USING embkv(dim=2, max_rows=-1);
CREATE VIRTUAL TABLE e5 USING embkv(dim=2, ttl='90m', ttl_steps=10);
SELECT 'canon', json_extract(embkv_stats('e5'), '$.training.eviction.ttl');
SELECT embkv_evict('nosuch');
SELECT 'plain', embkv_evict('m2') IS NOT NULL;
-- 0 in any unit is none; blanks around a ttl; lru needs max_rows; a
-- ttl_steps no double holds, exact
CREATE VIRTUAL TABLE z1 USING embkv(dim=2, ttl='0s', max_rows=5);
SELECT 'ttl0', json_extract(embkv_stats('z1'), '$.training.eviction.ttl');
CREATE VIRTUAL TABLE z2 USING embkv(dim=2, ttl=' 90 m ');
SELECT 'ttl-blanks', json_extract(embkv_stats('z2'), '$.training.eviction.ttl');
CREATE VIRTUAL TABLE z3 USING embkv(dim=2, evict='lru');
CREATE VIRTUAL TABLE z4 USING embkv(dim=2, ttl_steps=4611686018427387903);
SELECT 'big', json_extract(embkv_stats('z4'), '$.training.eviction.ttl_steps');
-- a connection with uncommitted writes may not evict
BEGIN;
INSERT INTO m(id, vec) VALUES (7, '[7,7]');
SELECT embkv_evict('m');
ROLLBACK;
