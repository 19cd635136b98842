-- Persistence and the table's directory.  Committed writes survive closing
-- and reopening the database ("-- @reopen": a new sqlite3 process);
-- ALTER TABLE RENAME keeps the data (the directory is named after a stable
-- id, not the name); DROP TABLE removes the directory once the DROP
-- commits, and a rolled-back DROP leaves the table usable; a rolled-back
-- CREATE removes the directory it made.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE item USING embkv(dim=3, pool_size='16M');
CREATE VIRTUAL TABLE other USING embkv(dim=2, path='other.embkv', pool_size='16M');
INSERT INTO item(id, vec) SELECT value, json_array(value, value * 0.5, -value) FROM generate_series(1, 100);
UPDATE item SET vec = '[0,0,0]' WHERE id = 7;
DELETE FROM item WHERE id = 9;
INSERT INTO other VALUES (1, '[1,2]');
.shell ls -d *.embkv | sed 's/-[0-9a-f]*\.embkv/-ID.embkv/' | sort
-- this process ends inside a transaction: it is rolled back
BEGIN;
INSERT INTO item VALUES (1000, '[1,1,1]');
DELETE FROM item WHERE id = 8;
-- @reopen
SELECT 'reopened', count(*), sum(id), embkv_json(embkv_sum(vec)) FROM item;
SELECT 'rows', id, embkv_json(vec), clock FROM item WHERE id IN (7, 8, 9, 100, 1000) ORDER BY id;
SELECT 'other', id, embkv_json(vec) FROM other;
-- (commit-<k>: the token of the last COMMIT through journal slot k, journal.c)
SELECT 'config', k, typeof(v), CASE WHEN k LIKE 'commit-%' THEN 'token' ELSE length(v) END FROM item_config ORDER BY k;
ALTER TABLE item RENAME TO thing;
SELECT 'renamed', count(*) FROM thing;
SELECT 'schema', name FROM sqlite_schema WHERE name NOT GLOB 'sqlite_*' ORDER BY name;
SELECT 'stats', json_extract(embkv_stats('thing'), '$.table'), json_extract(embkv_stats('thing'), '$.rows');
SELECT embkv_stats('item');
.shell ls -d *.embkv | wc -l
-- @reopen
SELECT 'renamed-reopened', count(*), sum(id) FROM thing;
-- RENAME inside a rolled-back transaction
BEGIN;
ALTER TABLE thing RENAME TO thing2;
SELECT 'renamed-in-txn', count(*) FROM thing2;
ROLLBACK;
SELECT 'rename-rolled-back', count(*) FROM thing;
SELECT 'schema', name FROM sqlite_schema WHERE name NOT GLOB 'sqlite_*' ORDER BY name;
-- DROP inside a rolled-back transaction: the table and its directory stay
BEGIN;
INSERT INTO thing VALUES (500, '[5,0,0]');
DROP TABLE thing;
SELECT 'pending', action FROM embkv_pending;
SELECT count(*) FROM thing;
ROLLBACK;
SELECT 'drop-rolled-back', count(*), sum(id) FROM thing;
INSERT INTO thing VALUES (200, '[2,0,0]');
SELECT 'usable', count(*) FROM thing;
.shell ls -d *.embkv | wc -l
-- DROP undone by ROLLBACK TO
BEGIN;
SAVEPOINT s;
DROP TABLE thing;
ROLLBACK TO s;
COMMIT;
SELECT 'drop-rolled-back-to', count(*) FROM thing;
.shell ls -d *.embkv | wc -l
-- @reopen
SELECT 'still-there', count(*) FROM thing;
-- a committed DROP: the directory goes at COMMIT, not before
BEGIN;
DROP TABLE thing;
.shell ls -d *.embkv | wc -l
COMMIT;
.shell ls -d *.embkv | wc -l
DROP TABLE other;
.shell ls -d *.embkv 2>/dev/null | wc -l
SELECT 'schema-after-drop', count(*) FROM sqlite_schema;
-- a rolled-back CREATE removes the directory it made ...
BEGIN;
CREATE VIRTUAL TABLE t3 USING embkv(dim=2, pool_size='16M');
INSERT INTO t3 VALUES (1, '[1,1]');
.shell ls -d *.embkv | wc -l
ROLLBACK;
.shell ls -d *.embkv 2>/dev/null | wc -l
-- ... and one undone by ROLLBACK TO, at the end of the transaction
BEGIN;
SAVEPOINT s;
CREATE VIRTUAL TABLE t4 USING embkv(dim=2, pool_size='16M');
ROLLBACK TO s;
SELECT 'pending', action FROM embkv_pending;
COMMIT;
.shell ls -d *.embkv 2>/dev/null | wc -l
-- ... but not a store that was there before: CREATE on an existing store
-- directory opens it
CREATE VIRTUAL TABLE a USING embkv(dim=2, path='shared.embkv', pool_size='16M');
INSERT INTO a VALUES (1, '[1,1]'), (2, '[2,2]');
-- @reopen
BEGIN;
CREATE VIRTUAL TABLE b USING embkv(dim=2, path='shared.embkv');
SELECT 'shared', count(*) FROM b;
ROLLBACK;
SELECT 'kept', count(*) FROM a;
.shell ls -d *.embkv
-- a table created and committed in one process is there in the next
CREATE VIRTUAL TABLE late USING embkv(dim=2, pool_size='16M');
INSERT INTO late VALUES (3, '[3,3]');
-- @reopen
SELECT 'late', id, embkv_json(vec) FROM late;
SELECT 'final', name FROM sqlite_schema WHERE name NOT GLOB 'sqlite_*' ORDER BY name;
-- a table whose path names an existing store attaches to it (same rows);
-- the store directory lists the tables using it and goes with the last
CREATE VIRTUAL TABLE owner USING embkv(dim=2, path='owned.embkv', pool_size='16M');
INSERT INTO owner VALUES (1, '[1,1]');
CREATE VIRTUAL TABLE guest USING embkv(dim=2, path='owned.embkv');
SELECT 'guest-sees', id, embkv_json(vec) FROM guest;
DROP TABLE guest;
.shell ls -d owned.embkv
-- @reopen
SELECT 'owner-kept', id, embkv_json(vec) FROM owner;
DROP TABLE owner;
.shell ls -d owned.embkv 2>/dev/null | wc -l
-- dropping the table that made the store leaves it to the others, in this
-- process or after a reopen, and the last DROP removes it
CREATE VIRTUAL TABLE maker USING embkv(dim=2, path='kept.embkv', pool_size='16M');
INSERT INTO maker VALUES (7, '[7,7]');
CREATE VIRTUAL TABLE user1 USING embkv(dim=2, path='kept.embkv');
CREATE VIRTUAL TABLE user2 USING embkv(dim=2, path='kept.embkv');
.shell wc -l < kept.embkv/app-sqlite-tables
DROP TABLE maker;
SELECT 'user1-after-maker-dropped', id, embkv_json(vec) FROM user1;
-- @reopen
.shell wc -l < kept.embkv/app-sqlite-tables
DROP TABLE user1;
-- @reopen
INSERT INTO user2 VALUES (8, '[8,8]');
SELECT 'user2-still', group_concat(id, ' ') FROM (SELECT id FROM user2 ORDER BY id);
-- an attach rolled back takes its table off the list again
BEGIN;
CREATE VIRTUAL TABLE user3 USING embkv(dim=2, path='kept.embkv');
SELECT 'listed-in-txn', count(*) FROM embkv_pending;
.shell wc -l < kept.embkv/app-sqlite-tables
ROLLBACK;
.shell wc -l < kept.embkv/app-sqlite-tables
DROP TABLE user2;
.shell ls -d kept.embkv 2>/dev/null | wc -l
-- a CREATE rolled back (to a savepoint) after another table attached to the
-- directory it made leaves the directory to that table
BEGIN;
SAVEPOINT s;
CREATE VIRTUAL TABLE undone USING embkv(dim=2, path='made.embkv');
ROLLBACK TO s;
CREATE VIRTUAL TABLE keeper USING embkv(dim=2, path='made.embkv');
INSERT INTO keeper VALUES (1, '[1,1]');
COMMIT;
-- @reopen
SELECT 'keeper', id, embkv_json(vec) FROM keeper;
.shell wc -l < made.embkv/app-sqlite-tables
-- a damaged list says nothing: no DROP removes the store, and no table may
-- open it until an explicit CREATE attaches again (the advice it gives)
CREATE VIRTUAL TABLE dm1 USING embkv(dim=2, path='damaged.embkv');
CREATE VIRTUAL TABLE dm2 USING embkv(dim=2, path='damaged.embkv');
.shell echo garbage > damaged.embkv/app-sqlite-tables
INSERT INTO dm1 VALUES (4, '[4,4]');
DROP TABLE dm2;
-- @reopen
.shell ls -d damaged.embkv 2>/dev/null | wc -l
SELECT 'dm1-after-dm2-dropped', id FROM dm1;
DROP TABLE dm1;
.shell ls -d damaged.embkv 2>/dev/null | wc -l
CREATE VIRTUAL TABLE dm1 USING embkv(dim=2, path='damaged.embkv');
SELECT 'dm1-attached-again', id FROM dm1;
.shell sed 's/^[0-9a-f]\{16\} [0-9a-f]* [0-9a-f]*$/<table id> <device> <inode>/' damaged.embkv/app-sqlite-tables
DROP TABLE dm1;
.shell ls -d damaged.embkv 2>/dev/null | wc -l
