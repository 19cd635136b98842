-- Access statistics and the hot set from SQL: embkv_heat counts lookups by
-- id (not scans) from its first use on a table, ranks rows in SQL, and
-- embkv_hotset moves the ids given, or the n hottest, up the hierarchy
-- (log rows into the pool), returning what it moved; bad arguments get
-- errors naming the table and the argument.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE small USING embkv(dim=4);
INSERT INTO small(id, vec) SELECT value, json_array(value, 1, 2, 3) FROM generate_series(1, 100);
-- the first use starts the statistics: nothing counted yet
SELECT 'first', count(*), sum(hits), min(tier), max(tier) FROM embkv_heat('small');
SELECT 'hotset-none', embkv_hotset('small', 5);
SELECT 'point', embkv_json(vec) FROM small WHERE id = 5;
SELECT 'point', embkv_json(vec) FROM small WHERE id = 5;
SELECT 'point', embkv_json(vec) FROM small WHERE id = 5;
SELECT 'in', count(*) FROM small WHERE id IN (6, 7, 1000);
SELECT 'in', count(*) FROM small WHERE id IN (6, 7);
-- scans and counts do not count
SELECT 'scan', count(*), sum(json_extract(embkv_json(vec), '$[0]')) FROM small;
SELECT 'scan', count(*) FROM small WHERE tier = 'pm';
-- an UPDATE by id counts its lookup and its write (the COMMIT's reading of
-- the row's previous version, its own bookkeeping, does not); two in one
-- transaction, the store's lookup (the second finds the row in the
-- transaction) and the one write
UPDATE small SET vec = '[8, 1, 2, 3]' WHERE id = 8;
BEGIN;
UPDATE small SET vec = '[9, 1, 2, 3]' WHERE id = 9;
UPDATE small SET vec = '[9, 1, 2, 4]' WHERE id = 9;
COMMIT;
SELECT 'heat', id, hits, tier FROM embkv_heat('small') WHERE hits > 0 ORDER BY hits DESC, id;
SELECT 'heat-join', s.id, h.hits FROM small s JOIN embkv_heat('small') h ON h.id = s.id WHERE h.hits >= 3;
SELECT 'hotset-n', embkv_hotset('small', 2);
SELECT 'hotset-ids', embkv_hotset('small', '[5, 6, 5, 123456]');
SELECT 'hotset-blob', embkv_hotset('small', x'0500000000000000');
SELECT 'hotset-zero', embkv_hotset('small', 0);
SELECT 'hotset-real', embkv_hotset('small', 2.0);  -- (a REAL with no fraction is n)
SELECT 'stats', json_extract(embkv_stats('small'), '$.heat.counting'), json_extract(embkv_stats('small'), '$.heat.touches'),
       json_extract(embkv_stats('small'), '$.ops.hotset_to_pm');
-- bad arguments
SELECT 'err', embkv_hotset('small', -1);
SELECT 'err', embkv_hotset('small', 2.5);
SELECT 'err', embkv_hotset('small', -2.0);
SELECT 'err', embkv_hotset('small', 1e300);
SELECT 'err', embkv_hotset('small', NULL);
SELECT 'err', embkv_hotset('small', '[1, "a"]');
SELECT 'err', embkv_hotset('small', x'0102');
SELECT 'err', embkv_hotset('small', '7');
SELECT 'err', embkv_hotset('small', '[]');
SELECT 'err', embkv_hotset('nosuch', 1);
SELECT 'err', embkv_hotset(42, 1);
CREATE TABLE plain(x);
SELECT 'err', embkv_hotset('plain', 1);
SELECT 'err', count(*) FROM embkv_heat('plain');
SELECT 'err', count(*) FROM embkv_heat('nosuch');
SELECT 'err', count(*) FROM embkv_heat(NULL);
SELECT 'err', count(*) FROM embkv_heat;
SELECT 'err', count(*) FROM embkv_heat WHERE tbl > 'a';
SELECT 'err', embkv_hotset('small', '["5"]');
SELECT 'tbl', id, tbl FROM embkv_heat('small') WHERE id = 5;
SELECT 'tbl', count(*) FROM embkv_heat WHERE tbl = 'small';
-- A table larger than its pool: log rows move up, counted exactly.
CREATE VIRTUAL TABLE big USING embkv(dim=8, pool_size='16M', capacity=300000, ssd_size='64M');
INSERT INTO big(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(1, 37500);
INSERT INTO big(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(37501, 75000);
INSERT INTO big(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(75001, 112500);
INSERT INTO big(id, vec) SELECT value, json_array(value, value + 1, value + 2, value + 3, -value, 0.5, 0.25, value % 7)
  FROM generate_series(112501, 150000);
SELECT 'big-tiers', count(*) > 10000 FROM big WHERE tier = 'ssd';
CREATE TABLE cold AS SELECT id FROM big WHERE tier = 'ssd' ORDER BY id LIMIT 20;
SELECT 'cold', count(*) FROM cold;
SELECT 'to-pm', json_extract(m, '$.to_pm'), json_extract(m, '$.to_dram'), json_extract(m, '$.home_bucket') >= 0
  FROM (SELECT embkv_hotset('big', (SELECT json_group_array(id) FROM cold)) AS m);
SELECT 'moved', count(*) FROM big WHERE tier = 'pm' AND id IN (SELECT id FROM cold);
SELECT 'moved-heat', count(*) FROM embkv_heat('big') WHERE tier = 'pm' AND id IN (SELECT id FROM cold);
SELECT 'moved-values', sum(json_extract(embkv_json(vec), '$[1]')) = (SELECT sum(id + 1) FROM cold) FROM big WHERE id IN (SELECT id FROM cold);
-- again: nothing left to bring into the pool
SELECT 'to-pm-again', json_extract(embkv_hotset('big', (SELECT json_group_array(id) FROM cold)), '$.to_pm');
-- the n hottest: ten log rows read five times stand out (beside the 20
-- just moved: a move ranks its rows at the top, 15)
CREATE TABLE hot AS SELECT id FROM big WHERE tier = 'ssd' ORDER BY id DESC LIMIT 10;
SELECT 'read-hot', count(*) FROM big WHERE id IN (SELECT id FROM hot);
SELECT 'read-hot', count(*) FROM big WHERE id IN (SELECT id FROM hot);
SELECT 'read-hot', count(*) FROM big WHERE id IN (SELECT id FROM hot);
SELECT 'read-hot', count(*) FROM big WHERE id IN (SELECT id FROM hot);
SELECT 'read-hot', count(*) FROM big WHERE id IN (SELECT id FROM hot);
SELECT 'moved-hits', min(hits) FROM embkv_heat('big') WHERE id IN (SELECT id FROM cold);
SELECT 'top30', count(*) FROM (SELECT id FROM embkv_heat('big') ORDER BY hits DESC LIMIT 30) WHERE id IN (SELECT id FROM hot);
SELECT 'hotset-30', json_extract(embkv_hotset('big', 30), '$.to_pm');
SELECT 'hot-in-pm', count(*) FROM big WHERE tier = 'pm' AND id IN (SELECT id FROM hot);
SELECT 'big-count', count(*), sum(id) FROM big;
SELECT 'big-stats', json_extract(embkv_stats('big'), '$.ops.hotset_to_pm') >= 20;
-- @reopen
-- statistics live in DRAM: a new process starts them from zero
SELECT 'reopened', count(*), sum(id) FROM big;
SELECT 'heat-reopen', count(*), sum(hits) FROM embkv_heat('big');
SELECT 'moved-kept', sum(json_extract(embkv_json(vec), '$[1]')) = (SELECT sum(id + 1) FROM cold) FROM big WHERE id IN (SELECT id FROM cold);
