-- The DRAM cache from SQL: pulls and pushes go through it (tier 'dram'),
-- reads see the newest version, UPDATE/DELETE of cached rows, ROLLBACK
-- leaves no trace, a checkpoint writes the dirty rows back, a reopen reads
-- every row as last written; lookups by id bring rows in, scans do not;
-- option errors name cache_size.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE item USING embkv(dim=4, cache_size='1M', optimizer='adagrad', lr=0.5);
INSERT INTO item(id, vec) SELECT value, json_array(value, 1, 2, 3) FROM generate_series(1, 1000);
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;
SELECT 'pull', length(embkv_pull('item', '[1,2,3,4,5]'));
SELECT 'push', embkv_push('item', '[1,2,3,4,5]', '[1,1,1,1, 1,1,1,1, 1,1,1,1, 1,1,1,1, 1,1,1,1]');
SELECT 'push', embkv_push('item', '[1,2,3]', '[1,1,1,1, 1,1,1,1, 1,1,1,1]');
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;
SELECT 'rows', id, embkv_json(vec), clock, tier FROM item WHERE id IN (1, 4, 6) ORDER BY id;
SELECT 'stats', json_extract(embkv_stats('item'), '$.tiers.dram.rows'), json_extract(embkv_stats('item'), '$.tiers.dram.dirty_rows'),
       json_extract(embkv_stats('item'), '$.tiers.dram.capacity_rows') > 1000;
-- a transaction over cached rows: rolled back, then committed
BEGIN;
UPDATE item SET vec = '[7,7,7,7]' WHERE id = 2;
DELETE FROM item WHERE id = 3;
SELECT 'in-txn', id, embkv_json(vec) FROM item WHERE id IN (2, 3) ORDER BY id;
ROLLBACK;
SELECT 'rolled-back', id, embkv_json(vec), clock, tier FROM item WHERE id IN (2, 3) ORDER BY id;
UPDATE item SET vec = '[7,7,7,7]' WHERE id = 2;
DELETE FROM item WHERE id = 3;
SELECT 'committed', id, embkv_json(vec), clock, tier FROM item WHERE id IN (2, 3) ORDER BY id;
SELECT 'count', count(*), sum(id) FROM item;
-- pushes after the last COMMIT are written back by the checkpoint
SELECT 'push', embkv_push('item', '[4,5]', '[1,1,1,1, 1,1,1,1]');
SELECT 'checkpoint', embkv_checkpoint('item') > 0, json_extract(embkv_stats('item'), '$.tiers.dram.dirty_rows');
SELECT 'hotset', embkv_hotset('item', '[10, 11, 12, 4]');
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;
SELECT 'push', embkv_push('item', '[1]', '[1,1,1,1]');
-- @reopen
SELECT 'reopened', count(*), sum(id) FROM item;
SELECT 'rows', id, embkv_json(vec), clock, tier FROM item WHERE id IN (1, 2, 4, 5, 6) ORDER BY id;
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;
-- lookups by id bring pool rows in (the row reads as it was found, then
-- from the cache); scans do not
SELECT 'scan', count(*), sum(length(vec)) FROM item;
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;
SELECT 'point', id, embkv_json(vec), tier FROM item WHERE id = 700;
SELECT 'point', id, embkv_json(vec), tier FROM item WHERE id = 700;
SELECT 'in', id, tier FROM item WHERE id IN (701, 702) ORDER BY id;
SELECT 'in', id, tier FROM item WHERE id IN (701, 702) ORDER BY id;
-- option errors
CREATE VIRTUAL TABLE neg USING embkv(dim=4, cache_size='-1');
CREATE VIRTUAL TABLE bad USING embkv(dim=4, cache_size='lots');
-- two tables of one store asking for different caches: a CREATE while the
-- store is open with another size is refused; after a reopen the first to
-- open sizes the cache and the other shares it, whichever opens first
CREATE VIRTUAL TABLE c1 USING embkv(dim=4, path='shared.embkv', cache_size='1M');
CREATE VIRTUAL TABLE c2 USING embkv(dim=4, path='shared.embkv', cache_size='2M');
-- @reopen
CREATE VIRTUAL TABLE c2 USING embkv(dim=4, path='shared.embkv', cache_size='2M');
SELECT 'c2-first', json_extract(embkv_stats('c2'), '$.tiers.dram.capacity_rows'),
       json_extract(embkv_stats('c1'), '$.tiers.dram.capacity_rows');
INSERT INTO c1(id, vec) VALUES (1, '[1,2,3,4]');
-- @reopen
SELECT 'c1-first', json_extract(embkv_stats('c1'), '$.tiers.dram.capacity_rows'),
       json_extract(embkv_stats('c2'), '$.tiers.dram.capacity_rows');
SELECT 'c2-reads', id, embkv_json(vec) FROM c2;
