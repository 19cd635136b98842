-- Who may touch a store (docs/sql.md, "Who may touch a store").
-- 1. A connection that may not write (PRAGMA query_only, a database opened
--    read-only) reads existing rows, pulls included, and every function
--    that would change the store is refused naming itself and the reason.
-- 2. A copy of the database file is a user of the store of its own: a DROP
--    in the copy leaves the store to the original.
-- 3. A database file that only names a store in its schema is refused.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE item USING embkv(dim=2, path='item.embkv', init='zeros', optimizer='sgd', lr=0.5);
INSERT INTO item(id, vec) VALUES (1, '[1,1]'), (2, '[2,2]');
-- 1. query_only
PRAGMA query_only = 1;
SELECT 'pull-existing', embkv_json(embkv_pull('item', '[1,2]'));
SELECT embkv_pull('item', '[1,7]');
SELECT embkv_push('item', '[1]', '[1,1]');
SELECT embkv_checkpoint('item');
SELECT embkv_hotset('item', 1);
SELECT 'export', embkv_export('item', 'item.ekx');
SELECT embkv_import('item', 'item.ekx');
SELECT 'release', embkv_release('item', '[1,2]');
INSERT INTO item(id, vec) VALUES (3, '[3,3]');
SELECT 'unchanged', id, embkv_json(vec) FROM item ORDER BY id;
PRAGMA query_only = 0;
SELECT 'writable-pull-creates', embkv_json(embkv_pull('item', '[7]'));
SELECT 'writable-push', embkv_push('item', '[7]', '[1,1]');
SELECT 'rows', count(*) FROM item;
.shell cp test.db copy.db
.shell cp test.db readonly-copy.db
.shell cp test.db untrusted-copy.db
.shell cp test.db query-only-copy.db
.shell cp test.db untrusted-ro-copy.db
-- @reopen
-- 1. a database opened read-only
.open --readonly test.db
.load build/embkv
SELECT 'ro-pull', embkv_json(embkv_pull('item', '[1,7]'));
SELECT embkv_pull('item', '[8]');
SELECT embkv_push('item', '[1]', '[1,1]');
SELECT embkv_checkpoint('item');
DELETE FROM item;
SELECT 'ro-rows', count(*) FROM item;
-- a read-only copy opens the store and does not list itself
.open --readonly readonly-copy.db
.load build/embkv
SELECT 'ro-copy-rows', count(*) FROM item;
.shell wc -l < item.embkv/app-sqlite-tables
-- @reopen
-- 2. the copy opens the store, is listed beside the original, and its DROP
--    takes only itself off the list
.open copy.db
.load build/embkv
SELECT 'copy-rows', count(*) FROM item;
.shell wc -l < item.embkv/app-sqlite-tables
DROP TABLE item;
.shell wc -l < item.embkv/app-sqlite-tables
.open test.db
.load build/embkv
SELECT 'original-after-copy-dropped', id, embkv_json(vec) FROM item ORDER BY id;
-- a copy opened with query_only on is listed all the same (query_only can
-- be turned off again, and the copy then writes)
.open query-only-copy.db
.load build/embkv
PRAGMA query_only = 1;
SELECT 'query-only-copy', count(*) FROM item;
.shell wc -l < item.embkv/app-sqlite-tables
PRAGMA query_only = 0;
-- with trusted_schema off (files from elsewhere) a copy is refused until it
-- attaches: a file that only knows a table's id cannot pass for a copy;
-- read-only, the advice says where to attach and how to read meanwhile
.open --readonly untrusted-ro-copy.db
.load build/embkv
PRAGMA trusted_schema = OFF;
SELECT count(*) FROM item;
.open --readonly untrusted-ro-copy.db
.load build/embkv
PRAGMA trusted_schema = ON;
SELECT 'untrusted-ro-copy-trusted', count(*) FROM item;
.open untrusted-copy.db
.load build/embkv
PRAGMA trusted_schema = OFF;
SELECT count(*) FROM item;
DROP TABLE item;
CREATE VIRTUAL TABLE item USING embkv(dim=2, path='item.embkv');
SELECT 'untrusted-copy-attached', count(*) FROM item;
.shell wc -l < item.embkv/app-sqlite-tables
-- 3. a database file whose schema names the store without a CREATE that
--    attached: made here by editing a schema (as a crafted file would be)
.open evil.db
.load build/embkv
CREATE VIRTUAL TABLE x USING embkv(dim=2, path='elsewhere.embkv');
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql, 'elsewhere.embkv', 'item.embkv') WHERE name = 'x';
PRAGMA writable_schema = OFF;
-- @reopen
.open evil.db
.load build/embkv
SELECT * FROM x;
INSERT INTO x(id, vec) VALUES (9, '[9,9]');
SELECT embkv_stats('x');
-- its DROP leaves the store alone; an explicit CREATE attaches (the advice)
DROP TABLE x;
.shell ls -d item.embkv | wc -l
CREATE VIRTUAL TABLE x USING embkv(dim=2, path='item.embkv');
SELECT 'attached', count(*) FROM x;
.open test.db
.load build/embkv
SELECT 'original-rows', count(*) FROM item;
