-- The SSD tier from SQL: a table about three times larger than its pool
-- keeps every row (the coldest go to the log under <store>/log), counts
-- rows by tier, reads them by id, IN and scan, brings an updated row back
-- to the pool, deletes log rows, and reopens the same; its options are
-- the store's.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE item USING embkv(dim=8, pool_size='16M', capacity=300000, ssd_size='64M');
-- A COMMIT writes at most what the pool can take after demotion: in rounds.
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(1, 37500);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(37501, 75000);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(75001, 112500);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(112501, 150000);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(150001, 187500);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(187501, 225000);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(225001, 262500);
INSERT INTO item(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(262501, 300000);
-- one COMMIT larger than the whole pool fails, naming the table, and writes nothing
INSERT INTO item(id, vec) SELECT value, '[1,1,1,1,1,1,1,1]' FROM generate_series(300001, 600000);
SELECT 'count', count(*), sum(id) FROM item;
SELECT 'tiers', count(*) > 100000 FROM item WHERE tier = 'ssd';
SELECT 'tiers', count(*) > 40000 FROM item WHERE tier = 'pm';
SELECT 'sum', embkv_json(embkv_sum(vec)) FROM item;
SELECT 'point', id, embkv_json(vec) FROM item WHERE id = 17;
SELECT 'in', count(*), sum(json_extract(embkv_json(vec), '$[1]')) FROM item WHERE id IN (SELECT value * 997 FROM generate_series(1, 300));
SELECT 'ssd-stats', json_extract(embkv_stats('item'), '$.tiers.ssd.rows') > 100000,
       json_extract(embkv_stats('item'), '$.tiers.ssd.capacity_bytes'),
       json_extract(embkv_stats('item'), '$.tiers.pm.rows') + json_extract(embkv_stats('item'), '$.tiers.ssd.rows');
CREATE TEMP TABLE cold AS SELECT id FROM item WHERE tier = 'ssd' ORDER BY id LIMIT 3;
UPDATE item SET vec = '[9,9,9,9,9,9,9,9]' WHERE id = (SELECT min(id) FROM cold);
SELECT 'updated', tier, embkv_json(vec) FROM item WHERE id = (SELECT min(id) FROM cold);
DELETE FROM item WHERE id = (SELECT max(id) FROM cold);
SELECT 'deleted', count(*) FROM item WHERE id = (SELECT max(id) FROM cold);
SELECT 'count', count(*), sum(id) FROM item;
-- @reopen
SELECT 'reopened', count(*), sum(id) FROM item;
SELECT 'sum', embkv_json(embkv_sum(vec)) FROM item;
SELECT 'tiers', count(*) > 100000 FROM item WHERE tier = 'ssd';
SELECT 'point', id, embkv_json(vec) FROM item WHERE id = 299999;
-- look-ahead: queues each SSD row once, the read that follows takes them
-- from the stage (hits or late), rows in the pool or absent queue nothing
CREATE TEMP TABLE ahead AS SELECT id FROM item WHERE tier = 'ssd' ORDER BY id LIMIT 100;
SELECT 'lookahead', embkv_lookahead('item', (SELECT json_group_array(id) FROM ahead));
SELECT 'lookahead-again', embkv_lookahead('item', (SELECT json_group_array(id) FROM ahead));
SELECT 'lookahead-none', embkv_lookahead('item', json_array(-5, 900000)), embkv_lookahead('item', (SELECT id FROM item WHERE tier = 'pm' LIMIT 1));
SELECT 'ahead-read', count(*), sum(json_extract(embkv_json(vec), '$[1]')) = (SELECT sum(id + 1) FROM ahead) FROM item WHERE id IN (SELECT id FROM ahead);
SELECT 'lookahead-stats', json_extract(embkv_stats('item'), '$.tiers.ssd.lookahead.queued'),
       json_extract(embkv_stats('item'), '$.tiers.ssd.lookahead.hits') + json_extract(embkv_stats('item'), '$.tiers.ssd.lookahead.late'),
       json_extract(embkv_stats('item'), '$.tiers.ssd.lookahead.staged');
SELECT 'lookahead-err', embkv_lookahead('nosuch', 1);
SELECT 'lookahead-err', embkv_lookahead('item', 'x');
SELECT 'lookahead-err', embkv_lookahead('item', 1.5);
-- options: a table on the same store may not shrink it or move its log
CREATE VIRTUAL TABLE again USING embkv(dim=8, path='x.embkv', pool_size='16M', ssd_path='elsewhere');
CREATE VIRTUAL TABLE tiny USING embkv(dim=8, path='t.embkv', pool_size='16M', ssd_size=1000);
CREATE VIRTUAL TABLE neg USING embkv(dim=8, path='n.embkv', pool_size='16M', ssd_size='-1');
.shell ls -d *.embkv/log | sed 's/-[0-9a-f]*\.embkv/-ID.embkv/'
DROP TABLE item;
.shell ls -d *.embkv 2>/dev/null | wc -l
-- Two tables on one store: a second CREATE may raise ssd_size only while
-- the store is not open in the process, never lower it; a table that
-- reconnects takes the store's size, however raised since its CREATE.
CREATE VIRTUAL TABLE a USING embkv(dim=4, path='s.embkv', pool_size='16M', ssd_size='8M');
INSERT INTO a(id, vec) VALUES (1, '[1,2,3,4]');
CREATE VIRTUAL TABLE b USING embkv(dim=4, path='s.embkv', ssd_size='16M');
CREATE VIRTUAL TABLE b USING embkv(dim=4, path='s.embkv', ssd_size='4M');
CREATE VIRTUAL TABLE b USING embkv(dim=4, path='s.embkv', ssd_path='s.embkv/log');
SELECT 'b-same-path', json_extract(embkv_stats('b'), '$.tiers.ssd.capacity_bytes');
DROP TABLE b;
-- @reopen
CREATE VIRTUAL TABLE b USING embkv(dim=4, path='s.embkv', ssd_size='16M');
SELECT 'raised', json_extract(embkv_stats('b'), '$.tiers.ssd.capacity_bytes');
SELECT 'a-after-raise', id, embkv_json(vec), json_extract(embkv_stats('a'), '$.tiers.ssd.capacity_bytes') FROM a;
-- @reopen
SELECT 'a-first', id, json_extract(embkv_stats('a'), '$.tiers.ssd.capacity_bytes') FROM a;
SELECT 'b-then', json_extract(embkv_stats('b'), '$.tiers.ssd.capacity_bytes');
-- DROP TABLE removes an ssd_path outside the store directory, in the
-- process that made it or in a later one.
CREATE VIRTUAL TABLE e USING embkv(dim=4, pool_size='16M', ssd_size='8M', ssd_path='ext-log');
INSERT INTO e(id, vec) VALUES (1, '[1,1,1,1]');
.shell test -d ext-log && echo ext-log present
DROP TABLE e;
.shell test -d ext-log && echo ext-log present || echo ext-log gone
CREATE VIRTUAL TABLE f USING embkv(dim=4, pool_size='16M', ssd_size='8M', ssd_path='ext-log2');
INSERT INTO f(id, vec) VALUES (1, '[1,1,1,1]');
-- @reopen
DROP TABLE f;
.shell test -d ext-log2 && echo ext-log2 present || echo ext-log2 gone
.shell ls -d *.embkv 2>/dev/null | sed 's/-[0-9a-f]*\.embkv/-ID.embkv/'
-- A file that is not a segment in the log directory: the table does not
-- open, naming the file (not the path option); removed, it opens again.
CREATE VIRTUAL TABLE g USING embkv(dim=4, path='g.embkv', pool_size='16M', ssd_size='8M');
INSERT INTO g(id, vec) VALUES (1, '[1,1,1,1]');
-- @reopen
.shell echo x > g.embkv/log/notes.txt
SELECT 'g', count(*) FROM g;
.shell rm g.embkv/log/notes.txt
-- @reopen
SELECT 'g', count(*) FROM g;
