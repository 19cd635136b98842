-- Transactions: writes to an embkv table follow SQLite's transactions.
-- ROLLBACK, ROLLBACK TO and a failed statement leave no trace; reads inside
-- a transaction see its own writes (the store and embkv_stats do not, until
-- COMMIT); uncommitted rows have no tier yet and the clock COMMIT will give.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE t USING embkv(dim=2, pool_size='16M');
INSERT INTO t VALUES (1, '[1,1]'), (2, '[2,2]');

-- ROLLBACK.
BEGIN;
INSERT INTO t VALUES (3, '[3,3]');
UPDATE t SET vec = '[20,20]' WHERE id = 2;
DELETE FROM t WHERE id = 1;
SELECT 'in-txn', id, embkv_json(vec), clock, tier FROM t ORDER BY id;
SELECT 'in-txn-in', id, embkv_json(vec) FROM t WHERE id IN (1, 2, 3) ORDER BY id;
SELECT 'in-txn-point', count(*) FROM t WHERE id = 1;
SELECT 'in-txn-count', count(*) FROM t;
SELECT 'in-txn-stats', json_extract(embkv_stats('t'), '$.rows'), json_extract(embkv_stats('t'), '$.pending_writes');
ROLLBACK;
SELECT 'after-rollback', id, embkv_json(vec), clock, tier FROM t ORDER BY id;
SELECT 'stats', json_extract(embkv_stats('t'), '$.rows'), json_extract(embkv_stats('t'), '$.pending_writes');

-- COMMIT.
BEGIN;
INSERT INTO t VALUES (3, '[3,3]');
UPDATE t SET vec = '[20,20]' WHERE id = 2;
UPDATE t SET vec = '[21,21]' WHERE id = 2;
DELETE FROM t WHERE id = 1;
INSERT INTO t VALUES (1, '[-1,-1]');
SELECT 'before-commit', id, embkv_json(vec), clock, tier FROM t ORDER BY id;
COMMIT;
SELECT 'after-commit', id, embkv_json(vec), clock, tier FROM t ORDER BY id;

-- Savepoints, nested; ROLLBACK TO keeps the savepoint open.
BEGIN;
INSERT INTO t VALUES (10, '[10,10]');
SAVEPOINT a;
INSERT INTO t VALUES (11, '[11,11]');
UPDATE t SET vec = '[0,0]' WHERE id = 10;
SAVEPOINT b;
DELETE FROM t WHERE id = 10;
INSERT INTO t VALUES (12, '[12,12]');
SELECT 'in-b', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id);
ROLLBACK TO b;
SELECT 'rolled-back-to-b', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id);
INSERT INTO t VALUES (13, '[13,13]');
RELEASE b;
SELECT 'released-b', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id);
ROLLBACK TO a;
SELECT 'rolled-back-to-a', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id);
INSERT INTO t VALUES (14, '[14,14]');
RELEASE a;
COMMIT;
SELECT 'committed', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id);

-- A SAVEPOINT that begins the transaction.
SAVEPOINT outer_;
INSERT INTO t VALUES (20, '[20,20]');
DELETE FROM t WHERE id = 14;
ROLLBACK TO outer_;
SELECT 'rolled-back-to-outer', group_concat(id) FROM (SELECT id FROM t ORDER BY id);
INSERT INTO t VALUES (21, '[21,21]');
RELEASE outer_;
SELECT 'released-outer', group_concat(id) FROM (SELECT id FROM t ORDER BY id);

-- A statement failing midway (INSERT ... SELECT whose 3rd row is bad),
-- in autocommit mode and inside a transaction, which goes on.
INSERT INTO t(id, vec) SELECT value + 100, CASE value WHEN 3 THEN '[bad]' ELSE '[1,1]' END
  FROM generate_series(1, 5);
SELECT 'failed-autocommit', count(*) FROM t WHERE id > 100;
BEGIN;
INSERT INTO t VALUES (30, '[30,30]');
INSERT INTO t(id, vec) SELECT value + 100, CASE value WHEN 3 THEN '[bad]' ELSE '[1,1]' END
  FROM generate_series(1, 5);
SELECT 'failed-in-txn', group_concat(id) FROM (SELECT id FROM t WHERE id >= 30 ORDER BY id);
-- a multi-row UPDATE failing on one row
UPDATE t SET vec = CASE id WHEN 10 THEN x'00' ELSE '[5,5]' END;
-- a multi-row id change that conflicts (21 cannot become 121)
INSERT INTO t VALUES (121, '[0,0]');
UPDATE t SET id = id + 100 WHERE id IN (10, 14, 21);
DELETE FROM t WHERE id = 121;
SELECT 'still', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id);
-- OR FAIL keeps the rows before the failing one, even in a transaction
INSERT OR FAIL INTO t VALUES (31, '[31,31]'), (30, '[0,0]'), (32, '[32,32]');
COMMIT;
SELECT 'after-fail', group_concat(id) FROM (SELECT id FROM t ORDER BY id);
-- OR ROLLBACK ends the whole transaction
BEGIN;
INSERT INTO t VALUES (40, '[40,40]');
INSERT OR ROLLBACK INTO t VALUES (41, '[41,41]'), (1, '[0,0]');
SELECT 'after-or-rollback', count(*) FROM t WHERE id IN (40, 41);
COMMIT;

-- A statement that reads the table it writes.
INSERT INTO t(id, vec) SELECT id + 1000, embkv_scale(vec, 10) FROM t WHERE id < 12;
SELECT 'self-insert', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t WHERE id > 1000 ORDER BY id);
BEGIN;
DELETE FROM t;
SELECT 'deleted-all', count(*) FROM t;
INSERT INTO t SELECT id - 1000, vec FROM t;
SELECT 'empty-copy', count(*) FROM t;
UPDATE t SET vec = embkv_add(vec, vec);
ROLLBACK;
SELECT 'restored', count(*), embkv_json(embkv_sum(vec)) FROM t;

-- Checkpoints make committed state durable; a pending transaction is not
-- part of it.
BEGIN;
INSERT INTO t VALUES (50, '[50,50]');
SELECT 'checkpoint-in-txn', embkv_checkpoint('t') > 0, json_extract(embkv_stats('t'), '$.rows');
ROLLBACK;
SELECT 'pending', count(*) FROM embkv_pending;

-- ROLLBACK TO a savepoint holding a schema change makes SQLite connect the
-- table anew while the old instance still takes part in the transaction:
-- both share the connection's writes, so earlier writes stay visible and
-- COMMIT applies exactly what the transaction saw.
CREATE VIRTUAL TABLE r USING embkv(dim=1);
BEGIN;
INSERT INTO r VALUES (10, '[10]'), (11, '[11]');
SAVEPOINT z;
CREATE TABLE plain_in_savepoint(a);
INSERT INTO r VALUES (12, '[12]');
ROLLBACK TO z;
SELECT 'after-schema-rollback', group_concat(id, ' ') FROM (SELECT id FROM r ORDER BY id);
INSERT INTO r VALUES (10, '[100]');
DELETE FROM r WHERE id = 11;
COMMIT;
SELECT 'committed', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM r ORDER BY id);
SELECT 'no-table', count(*) FROM sqlite_schema WHERE name = 'plain_in_savepoint';

-- Two tables on one store: one connection's writes through either are one
-- transaction, seen through both.
CREATE VIRTUAL TABLE s1 USING embkv(dim=1, path='shared.embkv');
CREATE VIRTUAL TABLE s2 USING embkv(dim=1, path='shared.embkv');
INSERT INTO s1 VALUES (1, '[1]');
BEGIN;
INSERT INTO s1 VALUES (3, '[3]');
SELECT 's2-sees', group_concat(id, ' ') FROM (SELECT id FROM s2 ORDER BY id);
DELETE FROM s2 WHERE id = 3;
SAVEPOINT a;
INSERT INTO s2 VALUES (4, '[4]');
SELECT 's1-sees', group_concat(id, ' ') FROM (SELECT id FROM s1 ORDER BY id);
ROLLBACK TO a;
INSERT INTO s1 VALUES (5, '[5]');
COMMIT;
SELECT 'shared-committed', group_concat(id, ' ') FROM (SELECT id FROM s2 ORDER BY id);
BEGIN;
INSERT INTO s2 VALUES (6, '[6]');
UPDATE s1 SET vec = '[50]' WHERE id = 5;
ROLLBACK;
SELECT 'shared-rolled-back', group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM s1 ORDER BY id);

-- Updating every row adds no index entry: COMMIT grows the index only for
-- ids new to the store.
CREATE VIRTUAL TABLE g USING embkv(dim=2, capacity=1000);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000)
INSERT INTO g SELECT i, json_array(i, i) FROM c;
SELECT 'before-update', json_extract(embkv_stats('g'), '$.index.buckets'), json_extract(embkv_stats('g'), '$.index.resizes');
UPDATE g SET vec = '[0,0]';
SELECT 'after-update', json_extract(embkv_stats('g'), '$.index.buckets'), json_extract(embkv_stats('g'), '$.index.resizes');

-- A second table on the store joining inside a savepoint: ROLLBACK TO
-- still goes back to where the savepoint began.
CREATE VIRTUAL TABLE j1 USING embkv(dim=2, path='joined.embkv');
CREATE VIRTUAL TABLE j2 USING embkv(dim=2, path='joined.embkv');
BEGIN;
INSERT INTO j1 VALUES (1, '[1,1]');
SAVEPOINT s1;
INSERT INTO j1 VALUES (2, '[2,2]');
INSERT INTO j2 VALUES (3, '[3,3]');
ROLLBACK TO s1;
COMMIT;
SELECT 'joined-in-savepoint', group_concat(id, ' ') FROM (SELECT id FROM j2 ORDER BY id);

-- A table dropped in a transaction after writing, its store shared with
-- another table: its writes commit (or roll back) with the transaction.
CREATE VIRTUAL TABLE d1 USING embkv(dim=2, path='dropped.embkv');
CREATE VIRTUAL TABLE d2 USING embkv(dim=2, path='dropped.embkv');
SELECT 'd2-empty', count(*) FROM d2;
BEGIN;
INSERT INTO d1 VALUES (1, '[1,1]');
DROP TABLE d1;
COMMIT;
CREATE VIRTUAL TABLE d3 USING embkv(dim=2, path='dropped.embkv');
BEGIN;
INSERT INTO d3 VALUES (2, '[2,2]');
DROP TABLE d3;
ROLLBACK;
BEGIN;
INSERT INTO d3 VALUES (3, '[3,3]');
SAVEPOINT s;
DROP TABLE d3;
ROLLBACK TO s;
COMMIT;
SELECT 'dropped-writes', group_concat(id, ' ') FROM (SELECT id FROM d2 ORDER BY id);
-- @reopen
SELECT 'dropped-writes-reopened', group_concat(id, ' ') FROM (SELECT id FROM d2 ORDER BY id);
BEGIN;
INSERT INTO d3 VALUES (4, '[4,4]');
DROP TABLE d3;
DROP TABLE d2;
COMMIT;
.shell ls -d dropped.embkv 2>/dev/null | wc -l

-- ROLLBACK TO past a DROP undoes the writes made after the savepoint, and
-- the buffer of the dropped table ends with the transaction (the next one
-- starts clean).
CREATE VIRTUAL TABLE rd USING embkv(dim=2);
BEGIN;
SAVEPOINT a;
INSERT INTO rd VALUES (5, '[5,5]');
DROP TABLE rd;
ROLLBACK TO a;
COMMIT;
SELECT 'rd-after-first', count(*) FROM rd;
BEGIN;
INSERT INTO rd VALUES (6, '[6,6]');
SAVEPOINT b;
INSERT INTO rd VALUES (7, '[7,7]');
DROP TABLE rd;
ROLLBACK TO b;
INSERT INTO rd VALUES (8, '[8,8]');
COMMIT;
SELECT 'rd-after-second', group_concat(id, ' ') FROM (SELECT id FROM rd ORDER BY id);

-- A table created inside a transaction takes part in it from its CREATE
-- (SQLite enlists it without xBegin): savepoints, DROP and a second table
-- on its store keep its writes.
BEGIN;
CREATE VIRTUAL TABLE c1 USING embkv(dim=2, path='c1.embkv');
INSERT INTO c1 VALUES (1, '[1,1]');
SAVEPOINT a;
INSERT INTO c1 VALUES (2, '[2,2]');
ROLLBACK TO a;
INSERT INTO c1 VALUES (3, '[3,3]');
COMMIT;
SELECT 'created-in-txn', group_concat(id, ' ') FROM (SELECT id FROM c1 ORDER BY id);
BEGIN;
CREATE VIRTUAL TABLE c2 USING embkv(dim=2, path='c2.embkv');
INSERT INTO c2 VALUES (1, '[1,1]');
SAVEPOINT a;
DROP TABLE c2;
ROLLBACK TO a;
COMMIT;
SELECT 'created-dropped-rolled-back', group_concat(id, ' ') FROM c2;
CREATE VIRTUAL TABLE c3 USING embkv(dim=2, path='c3.embkv');
INSERT INTO c3 VALUES (17, '[17,17]');
BEGIN;
CREATE VIRTUAL TABLE c4 USING embkv(dim=2, path='c3.embkv');
DELETE FROM c4 WHERE id = 17;
UPDATE c3 SET id = 21 WHERE id = 6;
COMMIT;
SELECT 'attached-in-txn', count(*) FROM c3;
BEGIN;
SAVEPOINT a;
CREATE VIRTUAL TABLE c5 USING embkv(dim=2, path='c5.embkv');
INSERT INTO c5 VALUES (1, '[1,1]');
ROLLBACK TO a;
COMMIT;
SELECT 'create-rolled-back', count(*) FROM sqlite_schema WHERE name = 'c5';
.shell ls -d c5.embkv 2>/dev/null | wc -l
-- A CREATE that ROLLBACK TO took back leaves its directory until the
-- transaction ends: a CREATE of another dim there says so, and the advice
-- (end the transaction, CREATE again) works.
BEGIN;
SAVEPOINT b;
CREATE VIRTUAL TABLE c6 USING embkv(dim=2, path='c6.embkv');
ROLLBACK TO b;
CREATE VIRTUAL TABLE c6 USING embkv(dim=3, path='c6.embkv');
COMMIT;
CREATE VIRTUAL TABLE c6 USING embkv(dim=3, path='c6.embkv');
INSERT INTO c6 VALUES (1, '[1,2,3]');
SELECT 'recreated', id, embkv_json(vec) FROM c6;
