-- The embkv virtual table: create, write, read by every plan, conflicts,
-- hidden columns, embkv_stats / embkv_checkpoint, registration and the
-- DIRECTONLY flags.  Scans are ORDER BY id: a scan's own order is the
-- index's.
.headers off
.mode list
.nullvalue NULL

CREATE VIRTUAL TABLE item USING embkv(dim=4, pool_size='16M');
SELECT 'schema', name, type, hidden FROM pragma_table_xinfo('item');
SELECT 'shadow', name FROM sqlite_schema WHERE name LIKE 'item%' ORDER BY name;

-- JSON text and float32 little-endian BLOBs are both accepted; ids may be
-- given as the id column or the rowid, as integral REAL or integer TEXT.
INSERT INTO item(id, vec) VALUES (1, '[1, 2, 3, 4]');
INSERT INTO item(id, vec) VALUES (2, x'0000803f000000400000404000008040');
INSERT INTO item VALUES (3, ' [0.5, -0.25, 0, 1e-3] ');
INSERT INTO item(rowid, vec) VALUES (4, '[4,4,4,4]');
INSERT INTO item(id, vec) VALUES ('5', '[5,5,5,5]'), (6.0, '[6,6,6,6]'),
    (-9223372036854775808, '[7,7,7,7]'), (9223372036854775807, '[8,8,8,8]');
SELECT 'rows', id, typeof(vec), length(vec), embkv_json(vec), clock, tier FROM item ORDER BY id;
SELECT 'blob', hex(vec) FROM item WHERE id = 1;
SELECT 'same', a.vec = b.vec FROM item a, item b WHERE a.id = 1 AND b.id = 2;

-- Point lookups (id = ?), IN lists (one batched lookup), scans.
SELECT 'point', id, embkv_json(vec) FROM item WHERE id = 3;
SELECT 'point-rowid', id FROM item WHERE rowid = 4;
SELECT 'point-text', id FROM item WHERE id = '3';
SELECT 'point-real', id FROM item WHERE id = 3.0;
SELECT 'point-miss', count(*) FROM item WHERE id = 99;
SELECT 'point-nonint', count(*) FROM item WHERE id = 3.5;
SELECT 'point-null', count(*) FROM item WHERE id = NULL;
SELECT 'in', id, embkv_json(vec) FROM item WHERE id IN (4, 1, 99, 1, '2') ORDER BY id;
SELECT 'in-select', id FROM item WHERE id IN (SELECT value FROM json_each('[2, 3, 100]')) ORDER BY id;
SELECT 'in-empty', count(*) FROM item WHERE id IN (SELECT value FROM json_each('[]'));
SELECT 'count', count(*) FROM item;
SELECT 'range', group_concat(id) FROM (SELECT id FROM item WHERE id BETWEEN 2 AND 5 ORDER BY id);
SELECT 'exists', EXISTS (SELECT 1 FROM item WHERE id = 6), EXISTS (SELECT 1 FROM item WHERE id = 60);

-- Plans.  "ids-only": the query does not use vec, so no vector is read.
EXPLAIN QUERY PLAN SELECT id, vec FROM item WHERE id = 3;
EXPLAIN QUERY PLAN SELECT id FROM item WHERE id = 3;
EXPLAIN QUERY PLAN SELECT vec FROM item WHERE rowid = ?1;
EXPLAIN QUERY PLAN SELECT id, vec FROM item WHERE id IN (1, 2, 3);
EXPLAIN QUERY PLAN SELECT id FROM item WHERE id IN (SELECT value FROM json_each(?1));
EXPLAIN QUERY PLAN SELECT id, vec FROM item WHERE id IN (SELECT value FROM json_each(?1));
EXPLAIN QUERY PLAN SELECT * FROM item;
EXPLAIN QUERY PLAN SELECT count(*) FROM item;
EXPLAIN QUERY PLAN SELECT id, clock, tier FROM item WHERE id > 2;
EXPLAIN QUERY PLAN SELECT embkv_avg(vec) FROM item WHERE id BETWEEN 1 AND 3;
-- Joins with an ordinary table: a point lookup per row, or one batch.
CREATE TABLE clicks(user INTEGER, item INTEGER, label INTEGER);
INSERT INTO clicks VALUES (10, 1, 1), (10, 3, 0), (11, 2, 1), (11, 99, 0);
EXPLAIN QUERY PLAN SELECT c.user, embkv_dot(i.vec, i.vec) FROM clicks c JOIN item i ON i.id = c.item;
SELECT 'join', c.user, c.item, embkv_dot(i.vec, '[1,1,1,1]') FROM clicks c JOIN item i ON i.id = c.item
    ORDER BY c.user, c.item;
EXPLAIN QUERY PLAN SELECT count(*) FROM item WHERE id IN (SELECT item FROM clicks);
SELECT 'in-table', count(*) FROM item WHERE id IN (SELECT item FROM clicks);

-- UPDATE of vec (the clock advances), UPDATE of id (the row moves: a new
-- row, clock 0), DELETE.
UPDATE item SET vec = '[9,9,9,9]' WHERE id = 1;
SELECT 'update', id, embkv_json(vec), clock FROM item WHERE id = 1;
UPDATE item SET vec = embkv_scale(vec, 2) WHERE id IN (2, 3);
SELECT 'update-in', id, embkv_json(vec), clock FROM item WHERE id IN (2, 3) ORDER BY id;
UPDATE item SET vec = '[9,9,9,9]' WHERE id = 1;
UPDATE item SET vec = '[9,9,9,9]' WHERE id = 1;
SELECT 'update-twice', id, clock FROM item WHERE id = 1;
UPDATE item SET id = 40 WHERE id = 4;
SELECT 'move', id, embkv_json(vec), clock FROM item WHERE id IN (4, 40);
UPDATE item SET rowid = 41 WHERE id = 40;
SELECT 'move-rowid', id, embkv_json(vec) FROM item WHERE id IN (40, 41);
DELETE FROM item WHERE id = 5;
SELECT 'changes', changes();
DELETE FROM item WHERE id IN (6, 99);
SELECT 'changes', changes();
SELECT 'after-delete', group_concat(id) FROM (SELECT id FROM item ORDER BY id);
UPDATE item SET vec = '[0,0,0,0]' WHERE id = 12345;
SELECT 'changes', changes();

-- Conflicts: a plain INSERT of a present id fails naming it; OR REPLACE
-- replaces (a new row: clock 0); OR IGNORE skips; OR FAIL keeps the rows
-- before the failing one.  SQLite 3.40 has no UPSERT for virtual tables.
INSERT INTO item(id, vec) VALUES (1, '[0,0,0,0]');
INSERT OR REPLACE INTO item(id, vec) VALUES (1, '[3,3,3,3]');
SELECT 'replace', id, embkv_json(vec), clock FROM item WHERE id = 1;
REPLACE INTO item(id, vec) VALUES (42, '[4,2,4,2]');
INSERT OR IGNORE INTO item(id, vec) VALUES (1, '[0,0,0,0]'), (43, '[4,3,4,3]');
SELECT 'ignore-changes', changes();
SELECT 'ignore', id, embkv_json(vec) FROM item WHERE id IN (1, 42, 43) ORDER BY id;
INSERT INTO item(id, vec) VALUES (1, '[0,0,0,0]') ON CONFLICT DO NOTHING;
INSERT OR FAIL INTO item(id, vec) VALUES (50, '[5,0,0,0]'), (1, '[0,0,0,0]'), (51, '[5,1,0,0]');
SELECT 'fail', group_concat(id) FROM item WHERE id IN (50, 51);
INSERT OR ROLLBACK INTO item(id, vec) VALUES (52, '[5,2,0,0]'), (1, '[0,0,0,0]');
SELECT 'rollback', count(*) FROM item WHERE id = 52;
UPDATE item SET id = 2 WHERE id = 1;
UPDATE OR IGNORE item SET id = 2 WHERE id = 1;
SELECT 'update-ignore', id, embkv_json(vec) FROM item WHERE id IN (1, 2) ORDER BY id;
UPDATE OR REPLACE item SET id = 2 WHERE id = 1;
SELECT 'update-replace', id, embkv_json(vec) FROM item WHERE id IN (1, 2) ORDER BY id;

-- Hidden columns: clock (updates since insert) and tier; read-only.
SELECT 'hidden', id, clock, tier, typeof(clock), typeof(tier) FROM item WHERE id = 3;
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;

-- embkv_stats and embkv_checkpoint.
SELECT 'stats', json_extract(s, '$.table'), json_extract(s, '$.schema'), json_extract(s, '$.dim'),
       json_extract(s, '$.rows') = (SELECT count(*) FROM item), json_extract(s, '$.tiers.pm.rows'),
       json_extract(s, '$.pending_writes'), json_extract(s, '$.index.load_factor') > 0,
       json_extract(s, '$.index.probes_per_lookup') >= 1, json_extract(s, '$.tiers.pm.bytes') > 0,
       json_extract(s, '$.path') GLOB '*/test.db-????????????????.embkv'
  FROM (SELECT embkv_stats('item') AS s);
SELECT 'stats-keys', group_concat(key, ' ') FROM json_each(embkv_stats('item'));
SELECT 'stats-index', group_concat(key, ' ') FROM json_each(embkv_stats('item'), '$.index');
SELECT 'stats-ops', group_concat(key, ' ') FROM json_each(embkv_stats('item'), '$.ops');
SELECT 'stats-durability', group_concat(key, ' ') FROM json_each(embkv_stats('item'), '$.durability');
SELECT 'stats-training', group_concat(key, ' ') FROM json_each(embkv_stats('item'), '$.training');
SELECT 'stats-qualified', json_extract(embkv_stats('main.item'), '$.table'), json_extract(embkv_stats('ITEM'), '$.table');
SELECT 'checkpoint', typeof(embkv_checkpoint('item')),
       embkv_checkpoint('item') <= json_extract(embkv_stats('item'), '$.durability.durable_epoch');

-- Registration and safety flags: the table works from views and triggers
-- (trusted schema, SQLite's default; tests/sql/views.sql), functions with
-- side effects never do.
SELECT 'module', name FROM pragma_module_list WHERE name LIKE 'embkv%' ORDER BY name;
SELECT 'function', name, narg, (flags & 0x80000) != 0 AS directonly, (flags & 0x800) != 0 AS deterministic
  FROM pragma_function_list WHERE name IN ('embkv_stats', 'embkv_checkpoint') ORDER BY name;
CREATE VIEW v_item AS SELECT id FROM item;
SELECT * FROM v_item;
CREATE VIEW v_stats AS SELECT embkv_stats('item');
SELECT * FROM v_stats;
CREATE TABLE log(x);
CREATE TRIGGER tr AFTER INSERT ON log BEGIN INSERT INTO item(id, vec) VALUES (new.x, '[0,0,0,0]'); END;
INSERT INTO log VALUES (77);
SELECT 'trigger', count(*) FROM item WHERE id = 77;
DROP TRIGGER tr;
DROP VIEW v_item;
DROP VIEW v_stats;
SELECT 'pending', count(*) FROM embkv_pending;
